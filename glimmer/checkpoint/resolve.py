"""Turn what a user typed as the model (a directory, a GGUF file or a Hugging Face Hub id) into a local path."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from glimmer.checkpoint.broken_links import broken_link_problem, is_broken_link
from glimmer.checkpoint.gguf_file import is_gguf_path
from glimmer.checkpoint.pickle_files import PICKLE_PATTERNS, TRAINING_STATE_PATTERNS
from glimmer.default_model import DEFAULT_MODEL_NAME, model_location
from glimmer.errors import CheckpointError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
_HUB_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
_HUB_WEIGHTS = ["*.safetensors"]
_HUB_DRAFTER_WEIGHTS = ["*.safetensors", "head.pt"]  # the HF export, or the vendor's native head.pt
# every file below the top level (a Trainer's checkpoint-N/ and last-checkpoint/ folders: weights, trainer_state.json;
# a repository's original/tokenizer.model), which the loaders never read (they take the top level alone) and the Hub
# client's patterns, matched against the whole path, would otherwise fetch; every download leaves them out (`_download`)
_HUB_BELOW_TOP_LEVEL = ["*/*"]
_DOWNLOAD_THREAD_NAME = "glimmer-hub-download"
_T = TypeVar("_T")


def resolve_checkpoint(model: str | os.PathLike, *, revision: str | None = None, weights: bool = True,
                       allow_pickle: bool = False) -> Path:
    """A local checkpoint directory (or GGUF file) for `model`.

    A directory or a GGUF file that exists is used as it is. The names of the embedded models (`glimmer-nano`,
    `glimmer-nano-dflash`, the names the server reports) are those models. Otherwise a Hub id (`owner/name`) is
    downloaded (or found in the local Hugging Face cache); with `weights=False` only its config, tokenizer and
    template files are. Only its top-level files are downloaded (those below, a Trainer's `checkpoint-N/` folders,
    an `original/` folder, are not: the loaders never read them); its weights are its safetensors files; with
    `allow_pickle`, a repository that has none gives its pickle weights instead (not the training state a Trainer
    uploads beside them), as vLLM falls back to `*.bin`. Raises CheckpointError saying what was tried and how
    to fix it.
    """
    local = _local_checkpoint(model)
    if local is not None:
        return local
    snapshot = _download(str(model), revision, _HUB_FILES + (_HUB_WEIGHTS if weights else []))
    if weights and allow_pickle and not any(snapshot.glob("*.safetensors")):
        snapshot = _download(str(model), revision, _HUB_FILES + list(PICKLE_PATTERNS), TRAINING_STATE_PATTERNS)
    return snapshot


@contextmanager
def inspected_checkpoint(model: str | os.PathLike, *, revision: str | None = None) -> Iterator[tuple[Path, Path]]:
    """`resolve_checkpoint` for `glimmer inspect`, which reads no weight data: of a Hub id only the config,
    tokenizer, template and index files at its top level are downloaded, and each top-level `*.safetensors` file's
    header is read from the Hub (a range read) into a temporary copy of that snapshot, as a sparse file of the
    shard's size with zeros where the tensors are; every check then runs as on a local directory. A Hub id whose
    weights are already in the local cache is inspected there. Yields the directory to inspect and the one to name
    in the report (the snapshot, for that temporary copy). Raises CheckpointError."""
    local = _local_checkpoint(model)
    if local is not None:
        yield local, local
        return
    text = str(model)
    snapshot = _download(text, revision, _HUB_FILES)
    if any(snapshot.glob("*.safetensors")):
        yield snapshot, snapshot
        return
    with tempfile.TemporaryDirectory(prefix="glimmer-inspect-") as scratch:
        yield _with_remote_headers(text, revision, snapshot, Path(scratch) / text.split("/")[-1]), snapshot


def _local_checkpoint(model: str | os.PathLike) -> Path | None:
    """The local directory or GGUF file `model` names (None: a Hub id, to download). Raises CheckpointError."""
    path = model_location(model)
    if path.is_dir():
        return path
    if path.exists():
        if is_gguf_path(path):
            return path
        raise CheckpointError(f"model path {path} is a file but not a GGUF file; pass the checkpoint directory "
                              "that holds config.json, or a .gguf file")
    if is_broken_link(path):
        raise CheckpointError(f"model path {path} {broken_link_problem(path)}")
    text = str(model)
    if not is_hub_id(text):
        raise CheckpointError(f"model {text!r} is neither an existing directory nor a Hugging Face Hub id "
                              f"(owner/name), nor {DEFAULT_MODEL_NAME!r} (the embedded model)")
    return None


def is_hub_id(text: str) -> bool:
    """Whether `text` has the shape of a Hugging Face Hub model id (owner/name)."""
    return bool(_HUB_ID.match(text))


def download_drafter(hub_id: str, *, weights: bool = True) -> Path:
    """The local directory of the DFlash drafter `hub_id` (owner/name): its config and weights (safetensors, or
    the vendor's native head.pt; with `weights=False` the config alone) downloaded, or found in the local Hugging
    Face cache; files below its top level are not, as for a model. Raises CheckpointError."""
    return _download(hub_id, None, _HUB_FILES + (_HUB_DRAFTER_WEIGHTS if weights else []))


def _download(text: str, revision: str | None, patterns: list[str], also_ignored: Iterable[str] = ()) -> Path:
    """The snapshot of `text` holding its top-level files that match `patterns`, but for `also_ignored`."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError(f"cannot resolve Hub id {text!r}: huggingface_hub is not installed") from exc
    abandoned = threading.Event()
    try:
        return Path(_waited_for_in_a_daemon_thread(
            lambda: snapshot_download(text, revision=revision, allow_patterns=patterns,
                                      ignore_patterns=[*also_ignored, *_HUB_BELOW_TOP_LEVEL],
                                      tqdm_class=_bar_stopping_once(abandoned)),
            abandoned))
    except LocalEntryNotFoundError as exc:
        raise CheckpointError(
            f"model {text!r} is not a local directory and could not be downloaded from the Hugging Face Hub "
            "(offline, or HF_HUB_OFFLINE is set, and it is not in the local cache); download it first, "
            "e.g. `hf download " + text + "`, and pass the directory"
        ) from exc
    except Exception as exc:  # network, auth, missing repo: the hub client raises many types
        raise CheckpointError(f"could not download {text!r} from the Hugging Face Hub: {exc}") from exc


class DownloadAbandoned(Exception):
    """Raised in a Hub download whose caller has stopped waiting for it (`_bar_stopping_once`)."""


def _bar_stopping_once(abandoned: threading.Event) -> type:
    """A progress-bar class for snapshot_download whose `update` raises DownloadAbandoned once `abandoned` is set. The
    Hub client updates its bar of files as each file ends, and on an exception there cancels the files not yet
    started: a download its caller left (Ctrl-C in a script loading `LLM("owner/name")`) stops after the files in
    progress, as it did when the caller's own thread ran it, instead of fetching the whole snapshot behind its back."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class StoppingBar(hub_tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            if abandoned.is_set():
                raise DownloadAbandoned("the download's caller stopped waiting for it")
            return super().update(n)

    return StoppingBar


def _waited_for_in_a_daemon_thread(call: Callable[[], _T], abandoned: threading.Event) -> _T:
    """`call()` run in a daemon thread that the calling thread waits for: an exception a signal raises as it waits
    (Ctrl-C's KeyboardInterrupt, `glimmer serve`'s SIGTERM) leaves at once, setting `abandoned`, which stops the
    download as its files in progress end (`_bar_stopping_once`). Run in the calling thread, snapshot_download took it
    inside its `with ThreadPoolExecutor`, which then waited for the files being fetched (a shard can take minutes),
    and the interpreter's exit waits for them still: the glimmer command ends the process without it
    (`abandoned_download`)."""
    outcome: Future[_T] = Future()

    def run() -> None:
        try:
            outcome.set_result(call())
        except BaseException as exc:  # handed to the caller, as if raised there
            outcome.set_exception(exc)

    threading.Thread(target=run, name=_DOWNLOAD_THREAD_NAME, daemon=True).start()
    try:
        return outcome.result()
    except BaseException:
        abandoned.set()  # the caller leaves (a signal's exception) or the download failed: either way it is over
        raise


def abandoned_download() -> bool:
    """Whether a Hub download left behind by its caller (`_waited_for_in_a_daemon_thread`) still runs: its file
    threads, which the interpreter waits for at exit, keep the process up until the whole snapshot is in."""
    return any(thread.name == _DOWNLOAD_THREAD_NAME and thread.is_alive() for thread in threading.enumerate())


def _with_remote_headers(hub_id: str, revision: str | None, snapshot: Path, out: Path) -> Path:
    """`out`: a copy of `snapshot` (small files only) plus, for each `*.safetensors` file of the repository at the
    snapshot's commit, its header read from the Hub, written as a sparse file of the shard's size."""
    try:
        from huggingface_hub import list_repo_tree, parse_safetensors_file_metadata
        from huggingface_hub.hf_api import RepoFile
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError(f"cannot inspect Hub id {hub_id!r}: huggingface_hub is not installed") from exc
    commit = snapshot.name if re.fullmatch(r"[0-9a-f]{40}", snapshot.name) else revision  # the files' commit
    try:
        sizes = {entry.path: entry.size for entry in list_repo_tree(hub_id, revision=commit)
                 if isinstance(entry, RepoFile) and entry.path.endswith(".safetensors")}
        headers = {name: parse_safetensors_file_metadata(hub_id, name, revision=commit) for name in sizes}
    except Exception as exc:  # network, auth, offline: the hub client raises many types
        raise CheckpointError(f"could not read the safetensors headers of {hub_id!r} from the Hugging Face Hub: "
                              f"{exc}") from exc
    shutil.copytree(snapshot, out)
    for name, metadata in headers.items():
        header: dict[str, object] = {"__metadata__": metadata.metadata} if metadata.metadata else {}
        header.update({tensor: {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
                       for tensor, info in metadata.tensors.items()})
        data = max((info.data_offsets[1] for info in metadata.tensors.values()), default=0)
        encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        encoded = encoded.ljust(max(len(encoded), sizes[name] - 8 - data), b" ")  # the file's own header length
        with (out / name).open("wb") as file:
            file.write(struct.pack("<Q", len(encoded)) + encoded)
            file.truncate(8 + len(encoded) + data)  # a hole, not written: no disk space for the tensors
    return out
