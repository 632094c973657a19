"""Lazy, memory-mapped access to a checkpoint's safetensors files, single or sharded.

Only headers are read up front (names, shapes, dtypes). Tensors are read one at a time when the loader
asks for them, so peak memory while loading stays near the size of the model being filled. Every lookup
goes through the index's `weight_map` when there is one: published checkpoints put tensors that belong
together into different shards (architecture.md §15.2). A `model.safetensors` beside an index that does not
name it is refused: one of the two is another checkpoint's, and reading either could be the wrong model. Any other
`*.safetensors` file the index does not name is left out with a warning (Mistral-style repositories ship a
`consolidated.safetensors` beside the indexed shards). A tensor a named shard holds that the index does not list (a
stale index) is read too, with a warning, as transformers reads every tensor of the shards an index names; left out,
a stale index that omits the vision tensors would load a text-only model. One the index maps to another shard as
well is refused (two copies).

Without an index, `model.safetensors` is the checkpoint (other `*.safetensors` files are left out with a warning);
without either, every `*.safetensors` file is read as one checkpoint: a tensor in two of them, or a numbered series
(`model-00002-of-00003.safetensors`) with a member absent, is refused.

A `*.safetensors` symbolic link whose target is gone (a Hugging Face cache whose blob was deleted or never finished
downloading) is refused where the file would be read, since loading without it could be a smaller model (a text-only
one); where it would be left out anyway (the index does not name it, or `model.safetensors` is the checkpoint), it is
left out with the same warning as any other file, saying that it is broken.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from itertools import islice
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch
from safetensors import safe_open

from glimmer.checkpoint.broken_links import (
    broken_link_problem,
    is_broken_link,
    is_link_loop,
    lfs_pointer_problem,
    refuse_broken_link,
    refuse_lfs_pointer,
)
from glimmer.errors import CheckpointError, option_and_keyword

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Hugging Face's shard names: model-00001-of-00003.safetensors
_NUMBERED_SHARD = re.compile(r"(?P<stem>.+)-(?P<number>\d+)-of-(?P<total>\d+)\.safetensors")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str
    file: Path
    stored_name: str | None = None  # the file's own name, where a reader renamed it (GGUF's blk.2.ffn_up.weight)
    stored_bytes: int | None = None  # its length in the file, where the header gives it (safetensors' data_offsets)

    @property
    def num_bytes(self) -> int:
        """The tensor's size in its file: its header's length where known, else its shape times its dtype's size.
        Raises CheckpointError naming the dtype where neither is known."""
        if self.stored_bytes is not None:
            return self.stored_bytes
        if self.dtype not in _DTYPE_BYTES:  # F8_E8M0, F4, or a pickle's torch dtype: sizes this table does not hold
            raise CheckpointError(f"cannot tell the size of tensor {self.name!r} in {self.file}: its dtype "
                                  f"{self.dtype} has no known size in bytes and its file gives no length")
        return math.prod(self.shape) * _DTYPE_BYTES[self.dtype]


# the safetensors dtypes' sizes in bytes
_DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
                "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}


# buffers older Hugging Face exports saved with the weights; transformers ignores them on load, and Glimmer
# computes the RoPE frequencies from the config (rope_theta, head_dim) as the reference does
_IGNORED_BUFFER = re.compile(r"(.*\.)?rotary_emb\.inv_freq")


def _stored_lengths(file: Path) -> dict[str, int]:
    """Each tensor's length in bytes by its `data_offsets` in the safetensors header (an 8-byte little-endian
    length, then that much JSON), which safe_open reads but does not expose. Call it after safe_open accepted the
    file: a damaged header raises there first."""
    with file.open("rb") as handle:
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    return {name: entry["data_offsets"][1] - entry["data_offsets"][0]
            for name, entry in header.items() if name != "__metadata__"}


def is_ignored_buffer(name: str) -> bool:
    """A saved buffer that is not a weight (`…rotary_emb.inv_freq`), skipped with a debug log."""
    return _IGNORED_BUFFER.fullmatch(name) is not None


def read_weight_map(index_path: Path) -> dict[str, object]:
    """The `weight_map` (tensor name → shard file) of a sharded checkpoint's index. Raises CheckpointError naming the
    file when it is unreadable, a Git LFS pointer, not JSON, or holds no such object or an empty one."""
    refuse_lfs_pointer(index_path)  # else "not a valid index: Expecting value: line 1 column 1"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{index_path} is not a valid index: {exc}") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f'{index_path} is not a valid index: it needs a "weight_map" object that maps each '
                              "tensor name to its shard file")
    if not weight_map:  # else every shard is left out as unnamed, and the error blames the tensor names
        raise CheckpointError(f'{index_path} is not a valid index: its "weight_map" is empty, so it names no shard; '
                              "download the index again, or regenerate it from the shards")
    return weight_map


def read_weight_map_if_present(index_path: Path) -> dict[str, object] | None:
    """`read_weight_map` of the index at `index_path`, or None where there is none. A broken link there is not
    taken as absent (without the map every weight file beside it would be read): it raises CheckpointError."""
    refuse_broken_link(index_path)
    return read_weight_map(index_path) if index_path.is_file() else None


def refuse_weight_folders(directory: Path, patterns: tuple[str, ...]) -> None:
    """Where a directory has no weight file, raise CheckpointError naming the directories whose names are a weight
    file's (`model.safetensors/`): not a config alone, for which random weights (--load-format dummy) would stand in
    for the model's."""
    folders = sorted({p.name for pattern in patterns for p in directory.glob(pattern) if p.is_dir()})
    if folders:
        raise CheckpointError(
            f"no weights found in {directory}: {', '.join(folders)} "
            f"{'is a directory' if len(folders) == 1 else 'are directories'}, not a weights file; put the file in "
            "its place (download it again)")


def shard_path(directory: Path, index_path: Path, shard: object) -> Path:
    """The file an index's weight_map names, which must lie inside the checkpoint directory: an index that
    points elsewhere ("../../x.safetensors", "/abs/x") would load another checkpoint's weights unnoticed.
    Checked on the name, not the resolved path, so symlinked shards (the Hugging Face cache's blobs) still load.
    Raises CheckpointError."""
    if not isinstance(shard, str) or not shard:
        raise CheckpointError(f"{index_path} names shard {shard!r}; expected a file name")
    relative = PurePosixPath(shard.replace("\\", "/"))
    if relative.is_absolute() or PureWindowsPath(shard).is_absolute() or ".." in relative.parts:
        raise CheckpointError(f"{index_path} names shard {shard!r}, outside the checkpoint directory {directory}; "
                              "an index may only name files inside its directory")
    return directory / relative


def safetensors_files_in(directory: Path) -> list[Path]:
    """The `*.safetensors` files of `directory` (a folder so named is no file), sorted."""
    return sorted(p for p in directory.glob("*.safetensors") if p.is_file())


def broken_safetensors_links_in(directory: Path) -> list[Path]:
    """The `*.safetensors` entries of `directory` that are broken links (a download cut short), sorted."""
    return sorted(p for p in directory.glob("*.safetensors") if is_broken_link(p))


class SafetensorsCheckpoint:
    """The tensors of one checkpoint directory, by name."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.tensors: dict[str, TensorInfo] = {}
        self.warnings: list[str] = []  # files left out, for `glimmer inspect` (each logged as well)
        files = self._files_and_names()
        indexed = {name for names in files.values() if names is not None for name in names}
        unlisted: dict[Path, list[str]] = {}
        for file, names in files.items():
            try:
                with safe_open(file, framework="pt") as handle:
                    present = set(handle.keys())
                    lengths = _stored_lengths(file)
                    if names is not None:  # read as transformers does: every tensor of every shard the index names
                        unlisted[file] = sorted(n for n in present - set(names) if not is_ignored_buffer(n))
                        self._refuse_copies(file, unlisted[file], indexed, files)
                    for name in [*names, *unlisted[file]] if names is not None else sorted(present):
                        if is_ignored_buffer(name):
                            logger.debug("%s: ignoring %s, a buffer the model recomputes", file, name)
                            continue
                        if name not in present:
                            raise CheckpointError(
                                f"{self.directory / INDEX_FILE} maps {name!r} to {file.name}, "
                                "but that shard does not contain it; the index and the shards disagree"
                            )
                        sliced = handle.get_slice(name)
                        self._add(TensorInfo(name, tuple(sliced.get_shape()), sliced.get_dtype(), file,
                                             stored_bytes=lengths.get(name)))
            except CheckpointError:
                raise
            except Exception as exc:  # safetensors raises several unrelated types for a damaged file
                try:
                    with file.open("rb") as head:
                        pointer = lfs_pointer_problem(head.read(1024))
                except OSError:
                    pointer = None
                if pointer is not None:
                    raise CheckpointError(f"cannot read safetensors file {file}: it {pointer}") from None
                raise CheckpointError(f"cannot read safetensors file {file}: {exc}") from exc
        stale = {file: names for file, names in unlisted.items() if names}
        if stale:
            count = sum(len(names) for names in stale.values())
            shown = ", ".join(f"{name} ({file.name})" for file, names in stale.items() for name in names[:3])
            self._warn(f"{self.directory / INDEX_FILE} does not list {count} tensor(s) its shards hold: {shown}"
                       f"{', …' if count > 3 * len(stale) else ''}; they are read, as transformers reads every tensor "
                       "of the shards an index names (a stale index: regenerate it)")

    def _refuse_copies(self, file: Path, unlisted: list[str], indexed: set[str],
                       files: dict[Path, list[str] | None]) -> None:
        """A tensor a shard holds but the index maps to another shard: two copies, and which one loads would be
        a guess (transformers takes the last file read)."""
        for name in unlisted:
            if name in indexed:
                mapped = next(other for other, names in files.items() if names is not None and name in names)
                try:
                    with safe_open(mapped, framework="pt") as handle:
                        misplaced = name not in handle.keys()
                except Exception:  # a damaged shard: reported when it is read
                    misplaced = False
                if misplaced:  # one copy, in a shard the index does not map it to
                    raise CheckpointError(
                        f"{self.directory / INDEX_FILE} maps {name!r} to {mapped.name}, but that shard does not "
                        f"contain it (it is in {file.name}); the index and the shards disagree: regenerate the index")
                raise CheckpointError(
                    f"tensor {name!r} is in both {file.name} and {mapped.name}, and {self.directory / INDEX_FILE} "
                    f"maps it to {mapped.name}: two copies of a weight (or two checkpoints' shards); regenerate the "
                    "index, or remove the shard that does not belong")

    def _add(self, info: TensorInfo) -> None:
        if info.name in self.tensors:  # only without an index, which maps each name to one file
            raise CheckpointError(
                f"tensor {info.name!r} appears in both {self.tensors[info.name].file.name} and {info.file.name}: "
                f"{self.directory} has neither {INDEX_FILE} nor {SINGLE_FILE}, so all its *.safetensors files are read "
                "as one checkpoint, and these two hold copies of the same weights (or two checkpoints' weights); "
                f"remove the file that does not belong, or add the {INDEX_FILE} that names the shards"
            )
        self.tensors[info.name] = info

    def _leave_out(self, files: list[Path], reason: str) -> None:
        """Files of the directory that are not read: logged, and kept for `glimmer inspect`. `reason` says why
        ({them}, {their}: the files)."""
        if not files:
            return
        them, their = ("it", "its") if len(files) == 1 else ("them", "their")
        self._warn(f"{self.directory}: ignoring {', '.join(p.name for p in files)}: "
                   + reason.format(them=them, their=their))

    def _warn(self, warning: str) -> None:
        logger.warning("%s", warning)
        self.warnings.append(warning)

    def _files_and_names(self) -> dict[Path, list[str] | None]:
        """Shard path → the names the index assigns to it (None: every tensor in the file)."""
        index_path = self.directory / INDEX_FILE
        weight_map = read_weight_map_if_present(index_path)  # a broken link refused: not a stale file beside shards
        if weight_map is not None:
            by_file: dict[Path, list[str]] = {}
            for name, shard in weight_map.items():
                path = shard_path(self.directory, index_path, shard)
                if is_broken_link(path):
                    raise CheckpointError(f"{index_path} names shard {shard!r}, which {broken_link_problem(path)}")
                if not path.is_file():
                    problem = "is a directory, not a file" if path.is_dir() else "does not exist"
                    if (self.directory / SINGLE_FILE).is_file():  # the shards merged into one file, the index left
                        problem += (f"; {SINGLE_FILE} is here: if it holds the shards' tensors, remove the stale "
                                    f"{INDEX_FILE}")
                    raise CheckpointError(f"{index_path} names shard {shard!r}, which {problem}")
                by_file.setdefault(path, []).append(name)
            single = self.directory / SINGLE_FILE
            if single.is_file() and single not in by_file:
                # two checkpoints' weights in one directory (one written over the other): reading either could
                # silently be the wrong model
                shards = ", ".join(sorted(p.name for p in by_file))
                raise CheckpointError(
                    f"{self.directory} holds both {SINGLE_FILE} and {INDEX_FILE}, whose shards ({shards}) do not "
                    f"include it: the weights of two checkpoints; remove the stale ones ({SINGLE_FILE}, or the "
                    "index and its shards)"
                )
            self._leave_out([p for p in self._safetensors_files() if p not in by_file],
                            f"{INDEX_FILE} does not name {{them}} (a consolidated copy of the shards, as "
                            "Mistral-style repositories ship, or a stray file); name {them} in the index if the model "
                            "needs {their} tensors, else remove {them}")
            self._leave_out_broken_links([p for p in self._broken_links() if p not in by_file],
                                         f"{INDEX_FILE} does not name it")
            return dict(by_file)
        files = self._safetensors_files()
        single = self.directory / SINGLE_FILE
        if single in files:
            self._leave_out([p for p in files if p != single],
                            f"without {INDEX_FILE}, {SINGLE_FILE} alone is the checkpoint; add the index naming "
                            "every file if the model needs {their} tensors, else remove {them}")
            self._leave_out_broken_links(self._broken_links(), f"without {INDEX_FILE}, {SINGLE_FILE} alone is "
                                                               "the checkpoint")
            return {single: None}
        broken = self._broken_links()
        if broken:  # each would be read: without it the checkpoint is short of its tensors
            others = f" (and {len(broken) - 1} more: {', '.join(p.name for p in broken[1:4])})" if broken[1:] else ""
            raise CheckpointError(f"{broken[0]}{others}, a file of the checkpoint, {broken_link_problem(broken[0])}")
        if not files:
            refuse_weight_folders(self.directory, ("*.safetensors",))
            raise CheckpointError(
                f"no weights found in {self.directory}: expected {SINGLE_FILE}, {INDEX_FILE} with its shards, "
                f"or *.safetensors files{self._config_only_hint()}"
            )
        self._check_numbered_shards(files)
        if len(files) > 1:
            logger.info("%s has neither %s nor %s: reading its %d *.safetensors files as one checkpoint (%s)",
                        self.directory, INDEX_FILE, SINGLE_FILE, len(files), ", ".join(p.name for p in files))
        return dict.fromkeys(files)

    def _safetensors_files(self) -> list[Path]:
        return safetensors_files_in(self.directory)

    def _broken_links(self) -> list[Path]:
        return broken_safetensors_links_in(self.directory)

    def _leave_out_broken_links(self, links: list[Path], why_unread: str) -> None:
        """Broken links that would not be read anyway: a warning each, naming the missing target."""
        for link in links:
            end = "leads into a loop of symbolic links" if is_link_loop(link) else "does not exist"
            self._warn(f"{self.directory}: ignoring {link.name}: {why_unread}, and it is a broken symbolic link (to "
                       f"{os.readlink(link)}, which {end}); remove it")

    def _check_numbered_shards(self, files: list[Path]) -> None:
        """Without an index, a numbered series must be whole: a shard left out would load as a smaller model (a
        missing vision shard as a text-only one). Raises CheckpointError naming the missing files."""
        series: dict[tuple[str, str], set[int]] = {}
        for file in files:
            match = _NUMBERED_SHARD.fullmatch(file.name)
            if match is not None:
                series.setdefault((match["stem"], match["total"]), set()).add(int(match["number"]))
        for (stem, total), numbers in sorted(series.items()):
            count = int(total)
            absent = count - len({n for n in numbers if 1 <= n <= count})
            if absent:  # the names of the first few only: `total` is the file's word, as large as it likes
                first = islice((n for n in range(1, count + 1) if n not in numbers), 10)
                names = ", ".join(f"{stem}-{n:0{len(total)}d}-of-{total}.safetensors" for n in first)
                raise CheckpointError(
                    f"{self.directory} holds {count - absent} of the {count} shards {stem}-*-of-{total}.safetensors "
                    f"and no {INDEX_FILE}; missing: {names}{f' and {absent - 10} more' if absent > 10 else ''}; "
                    f"download the missing shards (and {INDEX_FILE}) again"
                )

    def _config_only_hint(self) -> str:
        """A directory with a config but no weights (`glimmer make-tiny --config-only`) runs with random weights."""
        if not (self.directory / "config.json").is_file():
            return ""
        dummy_weights = option_and_keyword("--load-format", "dummy", '"dummy"')
        return f"; to run this config with random weights, pass {dummy_weights}"

    def names(self) -> list[str]:
        return list(self.tensors)

    def read(self, name: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """Read one tensor from its shard (memory-mapped; the returned tensor owns a copy), on the host whatever
        `device` the caller puts it on: a stored tensor needs no computing there (`MappedTensors.read`)."""
        info = self.tensors[name]
        with safe_open(info.file, framework="pt") as handle:
            return handle.get_tensor(name)

    def read_many(self, names: list[str]) -> dict[str, torch.Tensor]:
        """Read several tensors, opening each shard once."""
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.tensors[name].file, []).append(name)
        out: dict[str, torch.Tensor] = {}
        for file, file_names in by_file.items():
            with safe_open(file, framework="pt") as handle:
                for name in file_names:
                    out[name] = handle.get_tensor(name)
        return out

    @property
    def total_bytes(self) -> int:
        return sum(f.stat().st_size for f in {t.file for t in self.tensors.values()})
