"""Finding and reading a DFlash drafter checkpoint: its config and its tensors, in either layout.

Two layouts exist (architecture.md §10.2):
- **HF** (`muse_glimmer_assistant`): `config.json` plus safetensors with the reference's parameter names.
- **native** (the vendor export): one torch file, `head.pt` (`pytorch_weights/dflash/head.pt` in a vendor
  checkout), with fused qkv and gate/up tensors and q/k in the interleaved RoPE layout. It is read with
  `torch.load(weights_only=True)` only. A `config.json` beside it (HF keys) describes its geometry; without
  one, the converter's constants (the released drafter, §1.4) are used and the tensor shapes must match them.

The mapping of native names onto canonical ones is a table in `weight_layouts.py`, like the target's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from glimmer.checkpoint.broken_links import refuse_not_a_file
from glimmer.checkpoint.config import ABSENT_FIELDS_TOOK_DEFAULTS, DrafterConfig, TextConfig, too_many_layers
from glimmer.checkpoint.config_common_fields import read_rope_parameters
from glimmer.checkpoint.config_fields import Notes, Section, dtype_field_warnings
from glimmer.checkpoint.gguf_file import is_gguf_path
from glimmer.checkpoint.json_files import read_json_object
from glimmer.checkpoint.mapped_tensors import MappedTensors
from glimmer.checkpoint.pickle_files import DTYPE_NAMES, load_weights_only, torch_load_failure
from glimmer.checkpoint.quantized_weights import describe_quantized_weights, find_quantized_weights
from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint, TensorInfo
from glimmer.checkpoint.weight_layouts import DRAFTER_CANONICAL, DRAFTER_NATIVE
from glimmer.errors import CheckpointError, ConfigError

ASSISTANT_MODEL_TYPE = "muse_glimmer_assistant"
NATIVE_FILE = "head.pt"
NATIVE_FILE_IN_VENDOR_CHECKOUT = Path("pytorch_weights") / "dflash" / NATIVE_FILE
# the drafter's mask token in the release (architecture.md §1.4); its id comes from the target's tokenizer
RELEASED_MASK_TOKEN = "<|reserved_special_token_1818|>"

# HF config key → the value transformers uses when the key is absent (the class defaults, which are the
# released values, architecture.md §1.4). mask_token_id and the rope theta are handled apart.
_DEFAULTS: dict[str, Any] = {
    "hidden_size": 6656,
    "intermediate_size": 19968,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "sliding_window": 2048,
    "max_position_embeddings": 131072,
    "block_size": 16,
    "target_layer_ids": [1, 13, 25, 37, 49],
}
_RELEASED_ROPE_THETA = 500000.0  # the assistant class's default_theta (§1.4)
# the config_layout of a native file read without a config.json: the released drafter's sizes, assumed
CONVERTER_CONSTANTS_LAYOUT = "native (converter constants)"
# the q/k row pairing of each layout's weights, as the `rope_is_neox_style` a config beside them may state it
# (true = rotate-half); the tensor names decide it, and a flag that says otherwise is refused (§14.6)
_ROPE_IS_NEOX_STYLE = {DRAFTER_CANONICAL: True, DRAFTER_NATIVE: False}
# keys that change nothing a drafter computes at inference
_IGNORED = frozenset(
    """model_type transformers_version architectures auto_map dtype torch_dtype _name_or_path attention_dropout
    bos_token_id eos_token_id pad_token_id use_cache initializer_range tie_word_embeddings output_attentions
    output_hidden_states return_dict quantization_config""".split()
)



def read_drafter_config(
    raw: Mapping[str, Any], *, source: str, mask_token_id: Callable[[], int]
) -> DrafterConfig:
    """Validate a `muse_glimmer_assistant` config.json. Absent fields take transformers' defaults, said in the
    config's `warnings` (not logged here: the engine reads a drafter's config twice, and `load_drafter` logs them
    once); an absent mask_token_id is the target tokenizer's id of the released mask token (`mask_token_id()`).
    Raises ConfigError naming the key and the fix."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("model_type") != ASSISTANT_MODEL_TYPE:
        raise ConfigError(f"{source}: model_type={raw.get('model_type')!r} is not a DFlash drafter config; expected "
                          f"{ASSISTANT_MODEL_TYPE!r} (speculative_config.model must name the drafter, not a target)")
    if raw.get("quantization_config") is not None:  # null means none, as for the target (config_layouts.py)
        raise ConfigError(f"{source}: quantization_config is present: quantized drafters are not supported yet; use "
                          "the unquantized (bf16) drafter")
    # target_layer_ids is the one such field transformers types `list | None`: null is its default, as absent is
    defaulted = [key for key in _DEFAULTS if key not in raw or (key == "target_layer_ids" and raw[key] is None)]
    values = {key: _DEFAULTS[key] if key in defaulted else raw[key] for key in _DEFAULTS}
    theta, rope_unknown = _rope_theta(raw, source)
    if theta is None:
        theta, defaulted = _RELEASED_ROPE_THETA, [*defaulted, "rope_parameters.rope_theta"]
    if "mask_token_id" in raw:
        mask = raw["mask_token_id"]
    else:
        mask, defaulted = mask_token_id(), [*defaulted, "mask_token_id"]
    layer_types = raw.get("layer_types")
    # checked before a list is made per layer
    num_layers = _as_count(values["num_hidden_layers"])
    if problem := too_many_layers("num_hidden_layers", num_layers, "the release's drafter has 5"):
        raise ConfigError(f"{source}: {problem}: the config is damaged; use the drafter's published config.json")
    if layer_types is None:  # an empty list is refused by DrafterConfig, as transformers refuses it
        layer_types = ["sliding_attention"] * num_layers
    for key in ("layer_types", "target_layer_ids"):
        value = layer_types if key == "layer_types" else values[key]
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key}={value!r} is invalid; expected a JSON list")
    vocab = raw.get("vocab_size")
    neox = raw.get("rope_is_neox_style")
    if neox is not None and not isinstance(neox, bool):
        raise ConfigError(f"{source}: rope_is_neox_style={neox!r} is invalid; expected true or false")
    unknown = sorted(set(raw) - set(_DEFAULTS) - _IGNORED - {"rope_parameters", "rope_theta", "rope_scaling",
                                                               "mask_token_id", "layer_types", "vocab_size",
                                                               "rope_is_neox_style"}) + rope_unknown
    warnings = []
    if defaulted:
        warnings.append(f"{source}: {ABSENT_FIELDS_TOOK_DEFAULTS}: {', '.join(defaulted)}")
    if unknown:
        warnings.append(f"{source}: ignoring unknown keys: {', '.join(unknown)}")
    warnings.extend(f"{source}: {warning}" for warning in dtype_field_warnings(raw))
    try:
        return DrafterConfig(
            **{key: values[key] for key in _DEFAULTS if key != "target_layer_ids"},
            rope_theta=theta,
            layer_types=tuple(layer_types),
            mask_token_id=mask,
            target_layer_ids=tuple(values["target_layer_ids"]),
            vocab_size=vocab,
            config_layout="hf",
            warnings=tuple(warnings),
        )
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}".replace("drafter config.", "")) from None


def _rope_theta(raw: Mapping[str, Any], source: str) -> tuple[Any, list[str]]:
    """(theta, unknown keys of its objects) as transformers reads the theta: rope_parameters.rope_theta, a bare
    rope_theta or the legacy rope_scaling (read in rope_parameters' place, `type` as `rope_type`), the target's rule
    (config_common_fields.read_rope_parameters); rope_type 'default' only. The theta is None when none gives it."""
    notes = Notes(source, "drafter")
    _, theta, _, _ = read_rope_parameters(Section(raw, "", notes), ("rope_parameters", "rope_theta", "rope_scaling"),
                                          "default", required=True)
    return theta, notes.unknown  # read_rope_parameters gives None where none is found (required)


def _as_count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def released_drafter_config(mask_token_id: int) -> DrafterConfig:
    """The converter's constants: what a native file with no config.json beside it is (§1.4, §10.2)."""
    values = dict(_DEFAULTS)
    return DrafterConfig(
        **{key: values[key] for key in _DEFAULTS if key != "target_layer_ids"},
        rope_theta=_RELEASED_ROPE_THETA,
        layer_types=("sliding_attention",) * values["num_hidden_layers"],
        mask_token_id=mask_token_id,
        target_layer_ids=tuple(values["target_layer_ids"]),
        config_layout=CONVERTER_CONSTANTS_LAYOUT,
    )


def drafter_config_to_dict(config: DrafterConfig) -> dict[str, Any]:
    """config.json content in the HF layout (what `save_pretrained` writes, minus bookkeeping)."""
    out: dict[str, Any] = {"model_type": ASSISTANT_MODEL_TYPE}
    out.update({key: getattr(config, key) for key in _DEFAULTS})
    out["target_layer_ids"] = list(config.target_layer_ids)
    out["layer_types"] = list(config.layer_types)
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": config.rope_theta}
    out["mask_token_id"] = config.mask_token_id
    if config.vocab_size is not None:
        out["vocab_size"] = config.vocab_size
    return out


class TorchFileTensors:
    """The tensors of a native drafter file, with the interface of `SafetensorsCheckpoint`.

    Loaded with `torch.load(weights_only=True)` (never arbitrary unpickling), memory-mapped when the file
    format allows it.
    """

    def __init__(self, file: Path):
        self.directory = file.parent
        self.file = file
        try:
            loaded = load_weights_only(file)
        except CheckpointError:  # an LFS pointer, or an object the restricted unpickler refuses: worded already
            raise
        except Exception as exc:  # truncated file, not a torch file: many types
            raise CheckpointError(f"cannot read the native drafter file {file} with torch.load(weights_only=True): "
                                  f"{torch_load_failure(exc)}") from None
        if not isinstance(loaded, Mapping):
            raise CheckpointError(f"{file} holds a {type(loaded).__name__}, not a mapping of tensor names to tensors")
        stray = sorted(str(k) for k, v in loaded.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor))
        if stray:
            raise CheckpointError(f"{file} holds entries that are not named tensors: {', '.join(stray[:8])}")
        self._tensors: dict[str, torch.Tensor] = dict(loaded)
        self.tensors = {
            name: TensorInfo(name, tuple(t.shape), DTYPE_NAMES.get(t.dtype, str(t.dtype)), file)
            for name, t in self._tensors.items()
        }

    def names(self) -> list[str]:
        return list(self.tensors)

    def read(self, name: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """As loaded, whatever `device` the caller puts it on: a stored tensor needs no computing there."""
        return self._tensors[name]


@dataclass
class DrafterCheckpoint:
    """A drafter's config and tensors, and the weight layout they are in."""

    config: DrafterConfig
    files: SafetensorsCheckpoint | TorchFileTensors | MappedTensors | None  # None: config only
    weight_layout: str
    location: Path

    def check_fits(self, target: TextConfig) -> None:
        """`DrafterConfig.check_fits`, its ConfigError naming this drafter (and a GGUF's keys, as the file has them)."""
        try:
            self.config.check_fits(target)
        except ConfigError as exc:
            message = f"{self.location}: {exc}"
            if is_gguf_path(self.location):
                from glimmer.checkpoint.gguf_drafter import name_gguf_keys

                message = name_gguf_keys(message)
            if self.config.config_layout == CONVERTER_CONSTANTS_LAYOUT:  # the sizes above are none of the file's
                message += (f" (no config.json beside {self.location}: the released drafter's sizes were assumed; put "
                            "the drafter's config.json beside it)")
            raise ConfigError(message) from None


def open_drafter_checkpoint(
    path: str | os.PathLike, *, mask_token_id: Callable[[], int], weights: bool = True
) -> DrafterCheckpoint:
    """Find a drafter's config and weights at `path`: an HF directory (config.json + safetensors), a native
    directory (head.pt, or pytorch_weights/dflash/head.pt, with or without config.json), a native .pt file,
    or a llama.cpp DFlash GGUF. A directory holding both head.pt and safetensors is refused (which one is the
    drafter is not known). With `weights=False` (dummy weights) a directory needs only its config.json.

    `mask_token_id()` gives the target tokenizer's id of the released mask token, for configs that omit it.
    Raises CheckpointError / ConfigError saying what was looked for.
    """
    location = Path(path).expanduser()
    if is_gguf_path(location):
        # a llama.cpp DFlash drafter GGUF, handed over under the HF names (gguf_drafter.py)
        from glimmer.checkpoint.gguf_drafter import name_gguf_keys, read_gguf_drafter

        drafter = read_gguf_drafter(location)
        try:
            config = read_drafter_config(drafter.config, source=str(location), mask_token_id=mask_token_id)
        except ConfigError as exc:  # it names config.json's fields, which the file does not hold
            raise ConfigError(name_gguf_keys(str(exc))) from None
        config = replace(config, warnings=(*map(name_gguf_keys, config.warnings), *drafter.warnings))
        return DrafterCheckpoint(config, drafter.tensors, DRAFTER_CANONICAL, location)
    if location.is_file():
        if location.suffix != ".pt":
            raise CheckpointError(f"speculative_config.model={str(path)!r} is a file but not a drafter's native .pt or "
                                  "GGUF file; pass the drafter's directory (config.json and safetensors), its head.pt "
                                  "or its .gguf file")
        native, directory = location, location.parent
    elif location.is_dir():
        directory = location
        candidates = (directory / NATIVE_FILE, directory / NATIVE_FILE_IN_VENDOR_CHECKOUT)
        for candidate in candidates:
            refuse_not_a_file(candidate)  # else passed over for the HF layout, and "no weights found"
        native = next((candidate for candidate in candidates if candidate.is_file()), None)
    else:
        raise CheckpointError(f"drafter path {location} does not exist; speculative_config.model must be a local "
                              "drafter directory or a native head.pt file")
    config_path = directory / "config.json"
    # a folder or broken link so named is refused, not passed over ("holds no DFlash drafter", or the released sizes)
    raw = read_json_object(config_path, error=ConfigError)
    if raw is not None:
        config = read_drafter_config(raw, source=str(config_path), mask_token_id=mask_token_id)
    elif native is not None:  # said by load_drafter (config_layout CONVERTER_CONSTANTS_LAYOUT), once
        config = released_drafter_config(mask_token_id())
    else:
        raise CheckpointError(f"speculative_config.model={str(path)!r}: {directory} holds no DFlash drafter: "
                              "expected config.json with safetensors (HF layout), or "
                              f"{NATIVE_FILE} / {NATIVE_FILE_IN_VENDOR_CHECKOUT} (native layout)")
    if native is not None:
        if location.is_dir():
            _refuse_two_weight_sets(directory, native)
        _check_rope_flag(raw or {}, config_path, DRAFTER_NATIVE)
        return DrafterCheckpoint(config, TorchFileTensors(native) if weights else None, DRAFTER_NATIVE, native)
    _check_rope_flag(raw or {}, config_path, DRAFTER_CANONICAL)
    files = SafetensorsCheckpoint(directory) if weights else None
    if files is not None:
        _refuse_quantized_weights(config_path, files)
    return DrafterCheckpoint(config, files, DRAFTER_CANONICAL, directory)


def _refuse_quantized_weights(config_path: Path, files: SafetensorsCheckpoint) -> None:
    """Refuse a drafter whose weights a quantizer wrote (compressed-tensors' `weight_packed`, GPTQ's or AWQ's
    `qweight`, FP8 or INT8 `weight`s beside their scale) though its config.json has no quantization_config: read as
    it is, every Linear would be missing (or of an unsupported dtype) and its quantizer's tensors blamed on another
    model's names."""
    found = find_quantized_weights(files)
    if found is not None:
        raise CheckpointError(f"{files.directory} holds quantized weights ({describe_quantized_weights(found, files)}) "
                              f"though its {config_path.name} has no quantization_config: quantized drafters are not "
                              "supported yet; use the unquantized (bf16) drafter")


def _refuse_two_weight_sets(directory: Path, native: Path) -> None:
    """Refuse a drafter directory holding both a native `head.pt` and safetensors: the two are in different layouts
    (fused and interleaved against split and rotate-half, §10.2), so telling whether they hold the same drafter
    means reading both in full; taking either silently may serve the other's weights."""
    safetensors = sorted(p.name for p in directory.glob("*.safetensors"))
    if not safetensors:
        return
    shown = ", ".join(safetensors[:3]) + (f" (and {len(safetensors) - 3} more)" if len(safetensors) > 3 else "")
    raise CheckpointError(
        f"drafter directory {directory} holds two weight sets, the native {native.relative_to(directory)} and "
        f"safetensors ({shown}), which may differ; remove the set that is not the drafter (or pass {native} itself "
        "to load the native one)"
    )


def _check_rope_flag(raw: Mapping[str, Any], config_path: Path, layout: str) -> None:
    """Refuse a `rope_is_neox_style` that contradicts the q/k pairing of the `layout` the weights are in, as the
    target's is refused (`formats.py`): loading either way may be a silently wrong drafter."""
    flag = raw.get("rope_is_neox_style")
    if flag is None or flag == _ROPE_IS_NEOX_STYLE[layout]:
        return
    said = "rotate-half (NEOX)" if flag else "interleaved (GPT-J)"
    pairing = "rotate-half" if _ROPE_IS_NEOX_STYLE[layout] else "interleaved (permuted to rotate-half on load)"
    raise CheckpointError(
        f"{config_path}: rope_is_neox_style={str(flag).lower()} says the drafter's q/k rows are {said}, but its "
        f"weights are in the {layout} layout, whose q/k rows are {pairing}; the two disagree and either reading may "
        f"be a wrong drafter. Set rope_is_neox_style to {str(not flag).lower()} if the weights are a true {layout} "
        "export, or re-export the weights in the layout their pairing belongs to (interleaved rows: the native "
        f"{NATIVE_FILE})"
    )
