"""Open any checkpoint Glimmer reads — a safetensors directory, a GGUF file, an MLX artifact or, when the
user allows it, pickle weights — as one validated config plus a source of tensors.

Which reader runs is decided by what is on disk, never guessed from names alone:

* a file → GGUF (by suffix or magic), with an optional `--mmproj` vision GGUF;
* a directory whose config.json carries `muse_glimmer_mlx_format` → a packaged MLX artifact (`mlx.py`); one
  whose weights are an artifact's without that key is refused, naming the key;
* a directory whose config.json carries a `quantization_config` → compressed-tensors NVFP4 W4A16
  (`compressed_tensors.py`), dequantized on load; any other quantization is refused, naming the field;
* a directory with `*.safetensors` → the safetensors layouts (`config_layouts.py`, `weight_layouts.py`);
* a directory with only `*.bin` / `*.pt` → refused unless `allow_pickle`, then `pickle_files.py`.

Safety rules (README "Checkpoints"): safetensors and GGUF only by default; pickle only on request and
only through `torch.load(weights_only=True)`; checkpoint code (`auto_map`, `model_file`, `*.py` files,
remote code) is never imported or executed — a warning says it was ignored; every size read from a file
is bounded before anything is allocated for it (`gguf_file.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glimmer.checkpoint.compressed_tensors import (
    open_compressed_tensors,
    quantization_config_of,
    refuse_unmarked_packed_weights,
)
from glimmer.checkpoint.config import MMPROJ_OPTION, ModelConfig
from glimmer.checkpoint.config_layouts import load_config
from glimmer.checkpoint.gguf_file import DRAFTER_ARCH, MMPROJ_ARCH, header_architecture, is_gguf_path
from glimmer.checkpoint.json_files import read_json_object
from glimmer.checkpoint.pickle_files import (
    PICKLE_INDEX_FILE,
    PICKLE_PATTERNS,
    PickleCheckpoint,
    is_training_state,
    pickle_files,
)
from glimmer.checkpoint.quantized_weights import QuantizedStorage
from glimmer.checkpoint.safetensors_files import (
    INDEX_FILE,
    SafetensorsCheckpoint,
    broken_safetensors_links_in,
    refuse_weight_folders,
    safetensors_files_in,
)
from glimmer.checkpoint.weight_layouts import (
    CANONICAL,
    LEGACY,
    ROPE_IS_NEOX_STYLE,
    ROPE_LAYOUT,
    detect_weight_layout,
)
from glimmer.errors import CheckpointError, ConfigError, option_and_keyword

logger = logging.getLogger(__name__)

SAFETENSORS, GGUF, MLX, PICKLE = "safetensors", "gguf", "mlx", "pickle"
COMPRESSED_TENSORS = "compressed-tensors"  # safetensors files of NVFP4-packed weights (`compressed_tensors.py`)


@dataclass
class OpenedCheckpoint:
    """What a reader found. Tensors are named in `weight_layout` (foreign formats hand canonical names)."""

    path: Path
    format: str
    config: ModelConfig
    tensors: Any  # SafetensorsCheckpoint, PickleCheckpoint or MappedTensors: names(), tensors, read(name)
    weight_layout: str
    rope_layout: str
    # the layout of the names in the file where the reader renamed them to `weight_layout` (GGUF's llama.cpp
    # names, an MLX artifact's); None: the file's own names are `weight_layout`
    stored_layout: str | None = None
    # GGML / MLX storage type → tensor count, for `glimmer inspect` (None: the tensors' own dtypes)
    tensor_types: dict[str, int] | None = None
    # compressed-tensors: the quantization scheme, its modules and their bytes on disk, for `glimmer inspect`
    quantization: dict[str, Any] | None = None
    # quantized weights, dequantized on load: their scheme and their bytes on disk (None: none, or none read)
    quantized: QuantizedStorage | None = None
    # GGUF: the embedded tokenizer (a GGUFTokenizer); None: tokenizer.json etc. in the directory
    tokenizer: Any = None
    # GGUF with --mmproj: the preprocessing settings as a preprocessor_config.json dict
    preprocessor_config: dict[str, Any] | None = None


def open_checkpoint(
    path: str | os.PathLike,
    *,
    mmproj: str | os.PathLike | None = None,
    allow_pickle: bool = False,
    weights: bool = True,
) -> OpenedCheckpoint:
    """Open `path` with the reader its contents call for. Raises ConfigError / CheckpointError.

    weights=False (dummy weights): a directory's config alone is read; `tensors` is then None.
    """
    path = Path(path)
    # Path("") is Path("."), the current directory: a path object of it is the empty path, no projector file
    if mmproj is not None and (not os.fspath(mmproj).strip()
                               or not isinstance(mmproj, str) and os.fspath(mmproj) == "."):
        raise ConfigError(f"{MMPROJ_OPTION} is empty; pass the vision projector GGUF's path, or leave it out for "
                          "text only")
    if mmproj is not None:  # `~/mmproj.gguf` is the user's, as the model path is (resolve.py)
        mmproj = os.path.expanduser(mmproj)
    if path.is_file():
        if not is_gguf_path(path):
            raise CheckpointError(f"model path {path} is a file but not a GGUF file; pass a checkpoint directory "
                                  "(config.json + weights) or a .gguf file")
        return _open_gguf(path, mmproj)
    if mmproj is not None:
        raise CheckpointError(f"{MMPROJ_OPTION} applies to GGUF models only; this checkpoint is a directory, "
                              "whose vision weights live beside its text weights")
    if not path.is_dir():
        raise CheckpointError(f"model path {path} does not exist")
    _refuse_gguf_directory(path)
    raw = read_json_object(path / "config.json")
    if raw is not None and "muse_glimmer_mlx_format" in raw:
        from glimmer.checkpoint.mlx import open_mlx_artifact

        artifact = open_mlx_artifact(path, raw)
        opened = OpenedCheckpoint(path, MLX, artifact.config, artifact.tensors, CANONICAL, artifact.rope_layout,
                                  stored_layout=MLX, tensor_types=artifact.tensor_types,
                                  quantized=artifact.quantized)
    elif raw is not None and quantization_config_of(raw) is not None:
        opened = _open_compressed_tensors(path, raw, weights)
    elif not weights:
        opened = OpenedCheckpoint(path, SAFETENSORS, load_config(path), None, CANONICAL, ROPE_LAYOUT[CANONICAL])
    else:
        opened = _open_directory(path, allow_pickle)
    return _with_code_warning(opened)


def is_config_only(path: str | os.PathLike) -> bool:
    """A directory with a config.json and no weight file at all, as `glimmer make-tiny --config-only` writes it:
    `--load-format dummy` runs it with random weights, and `glimmer inspect` checks all but the weights."""
    path = Path(path)
    if not (path.is_dir() and (path / "config.json").is_file()):
        return False
    weight_files = ("*.safetensors", INDEX_FILE, PICKLE_INDEX_FILE, *PICKLE_PATTERNS, "*.gguf")
    return all(is_training_state(p) for pattern in weight_files for p in path.glob(pattern))


def _refuse_gguf_directory(path: Path, lacking: str = "config.json") -> None:
    """A directory with GGUF files but no config.json (or, `lacking`, no other weights): the GGUF file itself is the
    model."""
    if lacking == "config.json" and (path / "config.json").exists():
        return
    ggufs = sorted(p.name for p in path.glob("*.gguf") if p.is_file())
    if ggufs:
        # a multimodal GGUF repository holds the model (in each quantization) beside its mmproj, which may come first
        # by name: the example is a model's file, and the mmproj is named for --mmproj
        kinds = {name: header_architecture(path / name) for name in ggufs}
        models = [name for name in ggufs if kinds[name] not in (MMPROJ_ARCH, DRAFTER_ARCH)]
        projectors = [name for name in ggufs if kinds[name] == MMPROJ_ARCH]
        drafters = [name for name in ggufs if kinds[name] == DRAFTER_ARCH]
        projector = (f"with {path / projectors[0]} as {MMPROJ_OPTION} for images" if projectors
                     else f"and a vision projector with {MMPROJ_OPTION}")
        if not models:  # the projector or drafter is no model to suggest
            holds = " and ".join(f"{kind} ({', '.join(names)})" for kind, names in (
                ("a vision projector", projectors), ("a DFlash drafter", drafters)) if names)
            hint = projector if projectors else (
                f"with the drafter as the model of {option_and_keyword('--speculative-config')}")
            raise CheckpointError(f"{path} has no {lacking} and holds only {holds}, no model's GGUF file: pass the "
                                  f"model's GGUF file, {hint}")
        raise CheckpointError(
            f"{path} has no {lacking} but holds the GGUF file{'s' * (len(ggufs) > 1)} {', '.join(ggufs)}; a GGUF "
            f"is a whole model: pass the file itself (e.g. {path / models[0]}), {projector}"
        )


def _open_directory(path: Path, allow_pickle: bool) -> OpenedCheckpoint:
    config = load_config(path)
    if safetensors_files_in(path) or broken_safetensors_links_in(path):  # as SafetensorsCheckpoint reads them
        files: Any = SafetensorsCheckpoint(path)
        kind = SAFETENSORS
        config = dataclasses.replace(config, warnings=(*config.warnings, *files.warnings))  # files left out
    elif pickle_files(path):
        names = ", ".join(p.name for p in pickle_files(path)[:3])
        if not allow_pickle:
            raise CheckpointError(
                f"{path} holds pickle weights only ({names}); unpickling can execute code, so Glimmer reads them "
                f"only with {option_and_keyword('--allow-pickle', keyword_value='True')}, and then through "
                "torch.load(weights_only=True). Prefer a safetensors or GGUF copy of the checkpoint"
            )
        logger.warning("reading pickle weights %s with torch.load(weights_only=True) (--allow-pickle)", names)
        files = PickleCheckpoint(path)
        kind = PICKLE
    else:
        _refuse_gguf_directory(path, lacking="safetensors or pickle weights")
        refuse_weight_folders(path, PICKLE_PATTERNS)
        files = SafetensorsCheckpoint(path)  # raises, listing what it looked for
        kind = SAFETENSORS
    if kind == SAFETENSORS:
        refuse_unmarked_packed_weights(path, files)
    layout = detect_weight_layout(files.names())
    if layout == LEGACY and kind == SAFETENSORS:  # an MLX artifact's names are the legacy ones
        from glimmer.checkpoint.mlx import refuse_unmarked_artifact

        refuse_unmarked_artifact(path, read_json_object(path / "config.json") or {}, files, config.text)
    _check_rope_flag(path, layout)
    return OpenedCheckpoint(path, kind, config, files, layout, ROPE_LAYOUT[layout])


def _check_rope_flag(path: Path, layout: str) -> None:
    """Refuse a `rope_is_neox_style` that contradicts the RoPE layout the tensor names imply.

    In a weights directory the names decide the pairing (architecture.md §5.4, §15.2: HF exports are
    rotate-half, the native vendor layout interleaved); the flag is authoritative only in a packaged MLX
    artifact, whose names say nothing (`mlx.py`). Two disagreeing descriptions of the same q/k rows leave no
    safe choice: loading either way may be a silently wrong model (§14.6).
    """
    raw = read_json_object(path / "config.json") or {}
    text_config = raw.get("text_config")
    for where, section in (("", raw), ("text_config.", text_config)):
        flag = section.get("rope_is_neox_style") if isinstance(section, dict) else None
        if isinstance(flag, bool) and flag != ROPE_IS_NEOX_STYLE[layout]:
            said = "rotate-half (NEOX)" if flag else "interleaved (GPT-J)"
            raise CheckpointError(
                f"{path / 'config.json'}: {where}rope_is_neox_style={str(flag).lower()} says the q/k rows are "
                f"{said}, but the tensor names are the {layout} weight layout, whose RoPE layout is "
                f"{ROPE_LAYOUT[layout]}; the two disagree and either reading may be a wrong model. Set "
                f"rope_is_neox_style to {str(not flag).lower()} if the weights are a true {layout} export, or "
                "re-export the weights in the layout their pairing belongs to (interleaved rows: the native "
                "vendor layout)"
            )


def _open_compressed_tensors(path: Path, raw: dict[str, Any], weights: bool) -> OpenedCheckpoint:
    found = open_compressed_tensors(path, raw, weights=weights)
    if weights:
        _check_rope_flag(path, found.weight_layout)
    return OpenedCheckpoint(path, COMPRESSED_TENSORS, found.config, found.tensors, found.weight_layout,
                            ROPE_LAYOUT[found.weight_layout], tensor_types=found.tensor_types or None,
                            quantization=found.quantization, quantized=found.quantized)


def _open_gguf(path: Path, mmproj: str | os.PathLike | None) -> OpenedCheckpoint:
    from glimmer.checkpoint.gguf_file import GGUFFile
    from glimmer.checkpoint.gguf_model import GGUF_ROPE_LAYOUT, read_gguf_model
    from glimmer.checkpoint.gguf_tokenizer import read_gguf_tokenizer

    file = GGUFFile(path)
    model = read_gguf_model(file, mmproj)
    tokenizer = read_gguf_tokenizer(file)
    return OpenedCheckpoint(path, GGUF, model.config, model.tensors, CANONICAL, GGUF_ROPE_LAYOUT, stored_layout=GGUF,
                            tensor_types=model.tensor_types, tokenizer=tokenizer,
                            preprocessor_config=model.preprocessor_config,
                            quantized=model.quantized)


def _with_code_warning(opened: OpenedCheckpoint) -> OpenedCheckpoint:
    """Checkpoint code is never executed; say so when the checkpoint ships some (README, safety rules)."""
    code = sorted(p.name for p in opened.path.glob("*.py"))
    if not code:
        return opened
    warning = (f"{opened.path}: ignoring checkpoint code {', '.join(code)}: Glimmer never imports or executes code "
               "shipped with a checkpoint")
    logger.warning("%s", warning)
    config = dataclasses.replace(opened.config, warnings=(*opened.config.warnings, warning))
    return dataclasses.replace(opened, config=config)
