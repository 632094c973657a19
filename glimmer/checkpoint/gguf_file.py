"""A GGUF file, opened safely: every count, length, shape and offset is bounded before anything is read.

The `gguf` package's `GGUFReader` memory-maps the file and trusts its header: an array that claims 10^18
items makes it loop (appending an empty numpy view per item) until memory runs out, and a string length
past the end of the file yields a short read it does not notice. So `scan_header` first walks the whole
header with `struct` against the file size — magic, version, tensor and key counts, every string and array
length, nesting, tensor ranks, dimensions, types and data ranges — and refuses anything out of bounds with
one line naming the problem. Only then is `GGUFReader` handed the file, and every loop it runs is bounded
by what was checked. Tensor data stays memory-mapped; a tensor is dequantized (with `gguf.quants`, the
format's own dequantizers) only when it is read.

A split GGUF (`llama-gguf-split`, as Hugging Face repositories ship files over 50 GB: `<prefix>-00001-of-00003.gguf`
and its siblings) opens from any of its parts: the metadata is the first part's, the tensors those of every part,
each read from its own file. Every part must sit beside the one given, under gguf-split's names, and say it is
that part of that many (`split.no`, `split.count`); a tensor may live in one part only.
"""

from __future__ import annotations

import itertools
import logging
import math
import mmap
import re
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glimmer.checkpoint.broken_links import broken_link_problem, is_broken_link, lfs_pointer_problem
from glimmer.checkpoint.config import ABSENT_FIELDS_TOOK_DEFAULTS, DAMAGED_CONFIG_FIX
from glimmer.checkpoint.safetensors_files import TensorInfo
from glimmer.checkpoint.weight_mismatch import MismatchAdvice, WeightMismatch
from glimmer.errors import CheckpointError

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Bounds on what a header may declare. A released Muse Glimmer GGUF has about 900 tensors, 50 keys and
# arrays of 202,048 tokens and about 200k merges; these leave an order of magnitude of room and keep the
# reader's per-item bookkeeping (a few hundred bytes each) well under a gigabyte for any file.
MAX_TENSORS = 65_536
MAX_KEYS = 65_536
MAX_KEY_BYTES = 65_535
MAX_STRING_BYTES = 64 << 20
MAX_ARRAY_ITEMS = 4_194_304
MAX_TOTAL_ARRAY_ITEMS = 8_388_608
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_TENSOR_ELEMENTS = 1 << 40
MAX_ALIGNMENT = 1 << 20

# GGUF value types (gguf.GGUFValueType) → struct format of one scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING = 8
_ARRAY = 9
_TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32", 7: "BOOL",
               8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64"}
_UNSIGNED = {0, 2, 4, 10}
_SIGNED = {1, 3, 5, 11}
_FLOATS = {6, 12}

# Tensor types Glimmer reads: the float types exactly, the classic and K quants dequantized on load with
# gguf.quants. Each is exercised by a round trip in tests/checkpoint/test_gguf.py.
FLOAT_TYPES = ("F32", "F16", "BF16")
QUANTIZED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
READABLE_TYPES = FLOAT_TYPES + QUANTIZED_TYPES

# gguf-split's keys (gguf.Keys.Split) and file names: <prefix>-00001-of-00003.gguf
SPLIT_COUNT = "split.count"
SPLIT_NO = "split.no"
SPLIT_TENSORS = "split.tensors.count"
# general.architecture of each GGUF Glimmer reads: the model, its vision projector (mmproj), its DFlash drafter
ARCHITECTURE_KEY = "general.architecture"
MODEL_ARCH = "muse-glimmer"
MMPROJ_ARCH = "clip"
DRAFTER_ARCH = "dflash"
_SPLIT_NAME = re.compile(r"(.*)-(\d{5})(-of-)(\d{5})(\.gguf)", re.IGNORECASE)
MOST_LISTED = 3  # an error about a split lists at most this many missing parts or misplaced tensors

# the warning's words for the keys a GGUF lacks that took the reference's values (model and drafter alike)
ABSENT_KEYS_TOOK_DEFAULTS = "metadata keys absent from the GGUF took the reference defaults"
CONVERT_AGAIN = "convert the Hugging Face checkpoint again with llama.cpp's convert_hf_to_gguf.py"
# the fixes a GGUF's tensor mismatch names (weight_mismatch.py); the metadata sits in the same file as the tensors
GGUF_ADVICE = MismatchAdvice(
    unmapped_title="tensors with no GGUF name",
    unsupported_title=f"tensor types Glimmer does not read (it reads {', '.join(READABLE_TYPES)})",
    other_model_fix=("the tensor names are not the ones llama.cpp's converter writes for this architecture (another "
                     f"model's, or another writer's): {CONVERT_AGAIN}"),
    other_size_fix=("the metadata (embedding_length, feed_forward_length, head counts, key_length) describes another "
                    "size of model than the tensors hold: the metadata was edited or the file was written by another "
                    f"tool; {CONVERT_AGAIN}"),
    incomplete_fix=("the file lacks tensors its metadata's model has: the writer left them out or the file is "
                    f"damaged; {CONVERT_AGAIN}"),
    extra_fix=("the file holds tensors this model does not have (another model's, or a larger variant's): load the "
               f"GGUF published for this model, or {CONVERT_AGAIN}"),
    unsupported_fix="quantize the original model to one of them (e.g. llama-quantize … Q4_K_M or Q8_0)",
    unmapped_fix=CONVERT_AGAIN,
)


def fields_as_gguf_keys(message: str, keys: dict[str, str], owner: str | None = None) -> str:
    """`message`, an error or warning about a config read from a GGUF, with each config field `keys` maps named by the
    metadata key the file holds it under, with or without its `owner.` prefix, wherever the message names it: given a
    value, listed or in a formula (`text_config.rms_norm_eps=0.0` → `muse-glimmer.attention.layer_norm_rms_epsilon=0.0`;
    `intermediate_size × hidden_size` → `muse-glimmer.feed_forward_length × muse-glimmer.embedding_length`), and the
    fix for a damaged config.json, and the words for defaulted fields, given as the GGUF's: the file has no field of
    the config's name, nor a config.json."""
    prefix = rf"(?:{re.escape(owner)}\.)?" if owner else ""
    fields = "|".join(map(re.escape, keys))
    # a whole name, not part of a longer one or of a key already named (`dflash.block_size`)
    named = re.sub(rf"(?<![\w.-]){prefix}({fields})(?![\w.])", lambda m: keys[m.group(1)], message)
    return named.replace(DAMAGED_CONFIG_FIX, f"load the GGUF published for this model, or {CONVERT_AGAIN}").replace(
        ABSENT_FIELDS_TOOK_DEFAULTS, ABSENT_KEYS_TOOK_DEFAULTS)


def unread_keys(file: GGUFFile, prefix: str, read: Collection[str]) -> list[str]:
    """The keys under `prefix` (`muse-glimmer.`, `clip.`, `general.sampling.`) that are not in `read` (whole keys, as
    the file names them), sorted: what the file asks that Glimmer does not read."""
    return sorted(key for key in file.metadata if key.startswith(prefix) and key not in read)


def unread_keys_warning(file: GGUFFile, prefix: str, read: Collection[str]) -> list[str]:
    """The warning naming `unread_keys` (`muse-glimmer.expert_count`, ...), as config.json's unknown keys are named;
    none where there is none."""
    unread = unread_keys(file, prefix, read)
    return [f"{file.path}: ignoring metadata keys Glimmer does not read: {', '.join(unread)}"] if unread else []


def _lexists(path: Path) -> bool:
    """Something (a file, a directory, a link even to nothing) is at `path`."""
    return path.exists() or path.is_symlink()


def is_gguf_path(path: Path) -> bool:
    """A file named *.gguf, or any file that starts with the GGUF magic."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's header entry. `shape` is in torch order (GGUF stores the dimensions reversed)."""

    name: str
    shape: tuple[int, ...]
    type_name: str
    offset: int  # absolute position of the data in the file
    num_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    byte_order: str  # "<" or ">"
    metadata: dict[str, Any]
    metadata_types: dict[str, str]
    tensors: dict[str, TensorEntry]
    alignment: int


class _Cursor:
    """Reads the header of one mapped file, refusing to run past its end."""

    def __init__(self, data: mmap.mmap | bytes, path: Path, order: str):
        self.data = data
        self.size = len(data)
        self.pos = 0
        self.path = path
        self.order = order

    def fail(self, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {problem}")

    def take(self, fmt: str, what: str) -> Any:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise self.fail(f"truncated GGUF file: it ends inside {what} (at byte {self.pos} of {self.size})")
        (value,) = struct.unpack_from(self.order + fmt, self.data, self.pos)
        self.pos += width
        return value

    def string(self, what: str, limit: int) -> str:
        length = self.take("Q", f"the length of {what}")
        if length > limit:
            raise self.fail(f"{what} claims {length:,} bytes, more than the {limit:,} allowed")
        if self.pos + length > self.size:
            raise self.fail(f"truncated GGUF file: {what} claims {length:,} bytes but only "
                            f"{self.size - self.pos:,} remain")
        raw = bytes(self.data[self.pos : self.pos + length])
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None


def header_architecture(path: Path) -> str | None:
    """A GGUF file's general.architecture (MODEL_ARCH, MMPROJ_ARCH, ...), read from its header alone; None where the
    header cannot tell (it is damaged: opening the file says why)."""
    try:
        architecture = scan_header(path).metadata.get(ARCHITECTURE_KEY)
    except CheckpointError:
        return None
    return architecture if isinstance(architecture, str) else None


def scan_header(path: Path) -> GGUFHeader:
    """Validate the whole header of `path` against its size and return its metadata and tensor table.

    Raises CheckpointError (one line, naming the file and the problem) for anything malformed or out of
    bounds; nothing is allocated in proportion to a size the file declares before that size is checked.
    """
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size < 24:
                raise CheckpointError(f"{path}: not a GGUF file ({size} bytes is shorter than a GGUF header)")
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        if is_broken_link(path):
            raise CheckpointError(f"{path} {broken_link_problem(path)}") from None
        raise CheckpointError(f"{path}: cannot be read: {exc}") from None
    try:
        return _scan(data, path)
    finally:
        data.close()


def _scan(data: mmap.mmap, path: Path) -> GGUFHeader:
    pointer = lfs_pointer_problem(bytes(data[:1024]))
    if pointer is not None:
        raise CheckpointError(f"{path}: not a GGUF file: it {pointer}")
    if bytes(data[:4]) != GGUF_MAGIC:
        raise CheckpointError(f"{path}: not a GGUF file (wrong magic {bytes(data[:4])!r}, expected b'GGUF')")
    (version,) = struct.unpack_from("<I", data, 4)
    order = "<"
    if version & 0xFFFF == 0:  # written on a big-endian host, as GGUFReader detects it
        order = ">"
        (version,) = struct.unpack_from(">I", data, 4)
    if order == ">":
        raise CheckpointError(f"{path}: big-endian GGUF files are not supported; convert it on a little-endian host")
    if version not in SUPPORTED_VERSIONS:
        raise CheckpointError(f"{path}: GGUF version {version} is not supported (supported: {SUPPORTED_VERSIONS})")
    cursor = _Cursor(data, path, order)
    cursor.pos = 8
    tensor_count = cursor.take("Q", "the tensor count")
    key_count = cursor.take("Q", "the metadata key count")
    if tensor_count > MAX_TENSORS:
        raise cursor.fail(f"the header claims {tensor_count:,} tensors, more than the {MAX_TENSORS:,} allowed")
    if key_count > MAX_KEYS:
        raise cursor.fail(f"the header claims {key_count:,} metadata keys, more than the {MAX_KEYS:,} allowed")

    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    budget = [MAX_TOTAL_ARRAY_ITEMS]
    for index in range(key_count):
        key = cursor.string(f"metadata key #{index}", MAX_KEY_BYTES)
        if key in metadata:
            raise cursor.fail(f"metadata key {key!r} appears twice")
        value_type = cursor.take("I", f"the type of metadata key {key!r}")
        metadata[key], types[key] = _value(cursor, key, value_type, budget)

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and (
        types["general.alignment"] != "UINT32" or alignment == 0 or alignment & (alignment - 1)
        or alignment > MAX_ALIGNMENT
    ):
        raise cursor.fail(f"general.alignment={alignment!r} is invalid; expected a power of two (UINT32)")

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    entries = []
    for index in range(tensor_count):
        name = cursor.string(f"the name of tensor #{index}", MAX_KEY_BYTES)
        n_dims = cursor.take("I", f"the rank of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cursor.fail(f"tensor {name!r} has rank {n_dims}; GGUF allows 1 to {MAX_DIMS}")
        dims = [cursor.take("Q", f"the dimensions of tensor {name!r}") for _ in range(n_dims)]
        raw_type = cursor.take("I", f"the type of tensor {name!r}")
        offset = cursor.take("Q", f"the data offset of tensor {name!r}")
        if any(d == 0 for d in dims) or math.prod(dims) > MAX_TENSOR_ELEMENTS:
            raise cursor.fail(f"tensor {name!r} has absurd dimensions {dims}")
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise cursor.fail(f"tensor {name!r} has unknown type {raw_type}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        if dims[0] % block:
            raise cursor.fail(f"tensor {name!r} ({qtype.name}) has a row of {dims[0]} values, not a multiple "
                              f"of its block size {block}")
        entries.append((name, dims, qtype.name, offset, math.prod(dims) // block * type_size))

    data_start = -(-cursor.pos // alignment) * alignment
    tensors: dict[str, TensorEntry] = {}
    for name, dims, type_name, offset, num_bytes in entries:
        if name in tensors:
            raise cursor.fail(f"tensor {name!r} appears twice")
        start = data_start + offset
        if offset % alignment:
            raise cursor.fail(f"tensor {name!r} starts at offset {offset}, not a multiple of the alignment "
                              f"{alignment}")
        if start + num_bytes > cursor.size:
            raise cursor.fail(f"truncated GGUF file: tensor {name!r} needs bytes {start:,}..{start + num_bytes:,} "
                              f"but the file has {cursor.size:,}")
        tensors[name] = TensorEntry(name, tuple(reversed(dims)), type_name, start, num_bytes)
    # ggml refuses data that is not laid out tensor after tensor; two tensors sharing bytes would load one's data as
    # the other's (an offset edited, or a type changed to a wider one), a wrong model without an error
    by_start = sorted(tensors.values(), key=lambda entry: entry.offset)
    for before, after in itertools.pairwise(by_start):
        if before.offset + before.num_bytes > after.offset:
            raise cursor.fail(f"tensor {before.name!r} ({before.type_name}, bytes {before.offset:,}.."
                              f"{before.offset + before.num_bytes:,}) overlaps tensor {after.name!r} (from byte "
                              f"{after.offset:,}); the file is corrupt: {CONVERT_AGAIN}")
    return GGUFHeader(version, order, metadata, types, tensors, alignment)


def _value(cursor: _Cursor, key: str, value_type: int, budget: list[int]) -> tuple[Any, str]:
    if value_type in _SCALARS:
        return cursor.take(_SCALARS[value_type], f"the value of {key!r}"), _TYPE_NAMES[value_type]
    if value_type == _STRING:
        return cursor.string(f"the value of {key!r}", MAX_STRING_BYTES), "STRING"
    if value_type != _ARRAY:
        raise cursor.fail(f"metadata key {key!r} has unknown value type {value_type}")
    item_type = cursor.take("I", f"the item type of {key!r}")
    count = cursor.take("Q", f"the length of {key!r}")
    if item_type == _ARRAY:
        raise cursor.fail(f"metadata key {key!r} is an array of arrays, which Glimmer does not read")
    if item_type not in _SCALARS and item_type != _STRING:
        raise cursor.fail(f"metadata key {key!r} is an array of unknown type {item_type}")
    if count > MAX_ARRAY_ITEMS or count > budget[0]:
        raise cursor.fail(f"metadata key {key!r} claims {count:,} items, more than the "
                          f"{min(MAX_ARRAY_ITEMS, budget[0]):,} allowed")
    budget[0] -= count
    if item_type == _STRING:
        if count * 8 > cursor.size - cursor.pos:
            raise cursor.fail(f"truncated GGUF file: {key!r} claims {count:,} strings but the file ends first")
        items = [cursor.string(f"item {i} of {key!r}", MAX_STRING_BYTES) for i in range(count)]
        return items, "ARRAY[STRING]"
    fmt = _SCALARS[item_type]
    width = struct.calcsize(fmt)
    if cursor.pos + count * width > cursor.size:
        raise cursor.fail(f"truncated GGUF file: {key!r} claims {count:,} items but the file ends first")
    dtype = np.dtype(cursor.order + ("?" if fmt == "?" else np.dtype(fmt).str[1:]))
    items = np.frombuffer(cursor.data, dtype=dtype, count=count, offset=cursor.pos).tolist()
    cursor.pos += count * width
    return items, f"ARRAY[{_TYPE_NAMES[item_type]}]"


class GGUFFile:
    """A validated GGUF file: typed metadata access and tensors read on demand.

    Metadata comes from the bounded scan; tensor data is read through `gguf.GGUFReader` (memory-mapped)
    and dequantized with `gguf.quants`. `path` may be any part of a split GGUF; `path` then becomes the first
    part's and `parts` lists them all. Raises CheckpointError, on opening, for anything malformed, for a split
    GGUF whose parts are missing or do not match, and for a tensor type Glimmer cannot decode (READABLE_TYPES).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.header = scan_header(self.path)
        self.parts: tuple[Path, ...] = (self.path,)
        self._part_of: dict[str, int] = {}  # tensor name → its part, for the parts past the first
        self._readers: dict[int, Any] = {}
        self._by_name: dict[str, Any] = {}
        self._join_split()
        self._refuse_unreadable_types()

    @property
    def total_bytes(self) -> int:
        """The size of the file, or of every part of a split one."""
        return sum(part.stat().st_size for part in self.parts)

    def _join_split(self) -> None:
        """A part of a split GGUF: find its siblings, take the first part's metadata and every part's tensors."""
        count = self.metadata.get(SPLIT_COUNT, 1)
        if not isinstance(count, int) or count <= 1:
            return
        number = self.metadata.get(SPLIT_NO)
        numbered = isinstance(number, int) and not isinstance(number, bool) and 0 <= number < count
        which = f"part {number + 1} of {count}" if numbered else f"one of {count} parts"
        match = _SPLIT_NAME.fullmatch(self.path.name)
        if match is None or int(match.group(4)) != count:
            raise self.error(
                f"this is {which} of a split GGUF ({SPLIT_COUNT}={count}), but its name is not gguf-split's "
                f"<prefix>-{number + 1 if numbered else 1:05d}-of-{count:05d}.gguf, by which its other parts are "
                f"found: restore the parts' names, or merge them with `llama-gguf-split --merge FIRST_PART merged.gguf`"
            )
        prefix, of, total, suffix = match.group(1, 3, 4, 5)  # the spelling given (.GGUF stays)
        parts = tuple(self.path.with_name(f"{prefix}-{i:05d}{of}{total}{suffix}") for i in range(1, count + 1))
        # a name that is there but no file (a link to a blob never downloaded, a directory) is no missing part
        present_but_broken = next((part for part in parts if not part.is_file() and _lexists(part)), None)
        if present_but_broken is not None:
            problem = (broken_link_problem(present_but_broken) if is_broken_link(present_but_broken)
                       else "is not a regular file (a directory or a special file): put the part's file there")
            raise self.error(f"this is {which} of a split GGUF, and its part {present_but_broken.name} is unreadable: "
                             f"it {problem}")
        missing = [part.name for part in parts if not part.is_file()]
        if missing:
            named = ", ".join(missing[:MOST_LISTED])
            if len(missing) > MOST_LISTED:
                named += f" and {len(missing) - MOST_LISTED:,} more"
            raise self.error(
                f"this is {which} of a split GGUF, and {named} {'is' if len(missing) == 1 else 'are'} not beside "
                f"it: every part must sit in {self.path.parent}"
            )
        headers = [self.header if part == self.path else self._scan_part(part, which) for part in parts]
        tensors: dict[str, TensorEntry] = {}
        for index, (part, header) in enumerate(zip(parts, headers, strict=True)):
            said = (header.metadata.get(SPLIT_NO), header.metadata.get(SPLIT_COUNT))
            if said != (index, count):
                raise CheckpointError(
                    f"{part}: is named part {index + 1} of {count} of a split GGUF but its metadata says "
                    f"{SPLIT_NO}={said[0]!r}, {SPLIT_COUNT}={said[1]!r}: the parts come from different splits"
                )
            for name, entry in header.tensors.items():
                if name in tensors:
                    raise CheckpointError(f"{part}: tensor {name} is also in {parts[self._part_of.get(name, 0)]}")
                tensors[name] = entry
                if index:
                    self._part_of[name] = index
        first = headers[0]
        declared = first.metadata.get(SPLIT_TENSORS)
        if isinstance(declared, int) and declared != len(tensors):
            raise CheckpointError(f"{parts[0]}: {SPLIT_TENSORS}={declared} but its {count} parts hold "
                                  f"{len(tensors)} tensors")
        self.path, self.parts = parts[0], parts
        self.header = GGUFHeader(first.version, first.byte_order, first.metadata, first.metadata_types, tensors,
                                 first.alignment)

    def _scan_part(self, part: Path, which: str) -> GGUFHeader:
        """The header of another part of the split. Raises CheckpointError naming the part as unreadable or corrupt
        (truncated, not a GGUF, unreadable), with scan_header's reason, from the file given."""
        try:
            return scan_header(part)
        except CheckpointError as exc:
            reason = str(exc).removeprefix(str(part)).removeprefix(":").strip()
            raise self.error(f"this is {which} of a split GGUF, and its part {part.name} is unreadable or corrupt: "
                             f"{reason}; download or copy that part again (every part must be whole), then retry"
                             ) from None

    def _refuse_unreadable_types(self) -> None:
        """Every tensor must be of a type `read` can decode; checked from the header, before anything is loaded."""
        unreadable = [entry for entry in self.tensors.values() if entry.type_name not in READABLE_TYPES]
        if not unreadable:
            return
        by_type: dict[str, int] = {}
        for entry in unreadable:
            by_type[entry.type_name] = by_type.get(entry.type_name, 0) + 1
        kinds = ", ".join(f"{kind} ×{count}" for kind, count in sorted(by_type.items()))
        found = WeightMismatch(unsupported=[f"{entry.name}: {entry.type_name}" for entry in unreadable])
        raise self.error(found.message(f"tensor types Glimmer does not read ({kinds})", GGUF_ADVICE))

    def tensor_mismatch(self, expected: dict[str, tuple[int, ...]]) -> WeightMismatch:
        """The tensors `expected` (stored name → shape, torch order) misses in this file, those of another shape,
        and the file's tensors it does not name."""
        found = WeightMismatch()
        for name, shape in expected.items():
            entry = self.tensors.get(name)
            if entry is None:
                found.missing.append(f"{name} (shape {list(shape)})")
            elif entry.shape != shape:
                found.mismatched.append(f"{name}: expected shape {list(shape)}, found {list(entry.shape)}")
        stray = sorted(set(self.tensors) - set(expected))
        found.unexpected = [f"{name} {list(self.tensors[name].shape)}" for name in stray]
        return found

    def refuse_mismatch(self, found: WeightMismatch, advice: MismatchAdvice = GGUF_ADVICE,
                        fix: str | None = None) -> None:
        """Raise CheckpointError listing every problem in `found` (weight_mismatch.py's form), if there is any."""
        if found:
            raise self.error(found.message("the tensors do not match the metadata", advice, fix))

    @property
    def metadata(self) -> dict[str, Any]:
        return self.header.metadata

    @property
    def tensors(self) -> dict[str, TensorEntry]:
        return self.header.tensors

    def error(self, problem: str) -> CheckpointError:
        """A CheckpointError naming the file; in a split one, also the part of each later part's tensor it names."""
        located = [f"{name} is in {self.parts[index].name}" for name, index in self._part_of.items()
                   if re.search(re.escape(name) + r"(?![\w.])", problem)][:MOST_LISTED]
        return CheckpointError(f"{self.path}: {problem}" + (f" ({'; '.join(located)})" if located else ""))

    def has(self, key: str) -> bool:
        return key in self.header.metadata

    def type_of(self, key: str) -> str:
        return self.header.metadata_types[key]

    def string(self, key: str) -> str:
        self._require(key)
        if self.type_of(key) != "STRING":
            raise self.error(f"metadata {key} is {self.type_of(key)}, expected a string")
        return self.metadata[key]

    def integer(self, key: str) -> int:
        """An integer-typed value (any width or signedness); refuses floats, booleans and arrays."""
        self._require(key)
        kind = self.type_of(key)
        if kind not in {_TYPE_NAMES[t] for t in _UNSIGNED | _SIGNED}:
            raise self.error(f"metadata {key} is {kind}, expected an integer")
        return int(self.metadata[key])

    def boolean(self, key: str) -> bool:
        """A BOOL-typed value; refuses the string "true", integers and the rest, which are no GGUF flag."""
        self._require(key)
        if self.type_of(key) != "BOOL":
            raise self.error(f"metadata {key} is {self.type_of(key)}, expected a bool")
        return self.metadata[key]

    def number(self, key: str) -> float:
        self._require(key)
        kind = self.type_of(key)
        if kind not in {_TYPE_NAMES[t] for t in _UNSIGNED | _SIGNED | _FLOATS}:
            raise self.error(f"metadata {key} is {kind}, expected a number")
        value = self.metadata[key]
        if kind == "FLOAT32":
            # the shortest decimal that round-trips float32: 3.87 and 1e-05, not 3.869999885559082
            return float(str(np.float32(value)))
        return float(value)

    def array(self, key: str, item_kind: str) -> list[Any]:
        """An array whose items are `item_kind`: "STRING", "INTEGER", "NUMBER" or "BOOL"."""
        self._require(key)
        kind = self.type_of(key)
        item = kind[len("ARRAY[") : -1] if kind.startswith("ARRAY[") else None
        allowed = {
            "STRING": {"STRING"},
            "INTEGER": {_TYPE_NAMES[t] for t in _UNSIGNED | _SIGNED},
            "NUMBER": {_TYPE_NAMES[t] for t in _UNSIGNED | _SIGNED | _FLOATS},
            "BOOL": {"BOOL"},
        }[item_kind]
        if item not in allowed:
            raise self.error(f"metadata {key} is {kind}, expected an array of {item_kind.lower()}s")
        return self.metadata[key]

    def _require(self, key: str) -> None:
        if key not in self.metadata:
            raise self.error(f"required metadata key {key} is missing")

    def tensor_info(self, canonical: str, shape: tuple[int, ...], stored: str) -> TensorInfo:
        """What a reader of stored tensor `stored` gives as `canonical` (float32, `read` widens or dequantizes), named
        in the file that holds it: its own part of a split GGUF (the first part's metadata is no guide)."""
        return TensorInfo(canonical, shape, "F32", self.parts[self._part_of.get(stored, 0)], stored_name=stored)

    def read(self, name: str) -> torch.Tensor:
        """Tensor `name` as float32 (F16/BF16 widened exactly, quantized types dequantized), torch order."""
        entry = self.tensors[name]
        from gguf.quants import dequantize

        raw = self._reader_tensor(name)
        values = dequantize(raw.data, raw.tensor_type)
        return torch.from_numpy(np.array(values, dtype=np.float32)).reshape(entry.shape)  # a copy: data is mapped

    def _reader_tensor(self, name: str) -> Any:
        index = self._part_of.get(name, 0)
        if index not in self._readers:
            from gguf import GGUFReader

            part = self.parts[index]
            try:
                self._readers[index] = GGUFReader(part, "r")
            except (ValueError, KeyError) as exc:  # the scan should have caught it first
                raise CheckpointError(f"{part}: gguf could not read the file: {exc}") from None
            self._by_name.update({t.name: t for t in self._readers[index].tensors})
        return self._by_name[name]
