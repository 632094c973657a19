"""Compressed-tensors NVFP4 W4A16 checkpoints (llm-compressor's `nvfp4-pack-quantized` format: the RedHatAI NVFP4
release of Muse Glimmer), read into float tensors under the checkpoint's own names (architecture.md §15.2).

What the format is, as compressed-tensors writes and reads it (`compressors/nvfp4`, `quantization/lifecycle`):

* config.json carries `quantization_config` with `quant_method: "compressed-tensors"`, `format:
  "nvfp4-pack-quantized"` and `config_groups` whose `weights` are 4-bit floats (`type: float`, `num_bits: 4`) in
  groups of 16 inputs with a per-tensor global scale (`strategy: tensor_group`), symmetric. Any other method,
  format, bit width, group size (MXFP4's 32), strategy, an asymmetric or dynamic weight scheme, quantized outputs, a
  KV-cache scheme, sparsity (but for the `dense` sparsity format, weights stored as they are) or transforms are
  refused naming the field; so are config groups of mixed schemes.
  NVFP4 activations (W4A4) are not applied: the model runs W4A16, with a warning (as vLLM does on GPUs without FP4).
* A quantized Linear `M` stores `M.weight_packed` (uint8 [out, in/2]: two E2M1 codes a byte, the LOW nibble
  first; a code is a sign bit over an index into 0, 0.5, 1, 1.5, 2, 3, 4, 6), `M.weight_scale` (float8_e4m3fn
  [out, in/16]) and `M.weight_global_scale` (float32, one value). The weight is
  `e2m1(code) · (weight_scale / weight_global_scale)`: the stored global scale is the divisor (448·6 / amax, so
  in the thousands), never its reciprocal. `M.input_global_scale` / `M.input_scale` (activation scales) are not
  weights of a W4A16 model: they are dropped, not loaded.
* Which modules are quantized is read from the tensors: a `weight_packed` with its scales. Only the text decoder's
  Linear layers (attention q/k/v/o and gate projections, the MLP) may be; lm_head, the embeddings, norms and the
  vision path are unquantized (the config's `ignore` list) and read as they are stored.
* A packed weight and its scales may sit in different shards (the published checkpoint's layer 49 down_proj): each
  tensor is read through the index's weight_map (`safetensors_files.py`), never from a sibling's file.

Weights are dequantized when loaded (into the model's dtype): memory is that of the unquantized model. Each is
dequantized on the device its parameter lives on (`MappedTensor.read_on`): on CUDA the packed codes go to the GPU,
where the same float32 arithmetic takes a fraction of a second that takes minutes on the host for the 30B.
`quantize_text_linears` writes the format (`glimmer make-tiny --quantize nvfp4`), rounding as compressed-tensors does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from glimmer.checkpoint.config import ModelConfig
from glimmer.checkpoint.config_layouts import normalize_config
from glimmer.checkpoint.mapped_tensors import MappedTensor, MappedTensors, non_finite_part
from glimmer.checkpoint.quantized_weights import (
    EIGHT_BIT,
    GPTQ_OR_AWQ,
    WEIGHT_PACKED,
    QuantizedStorage,
    describe_quantized_weights,
    find_quantized_weights,
)
from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint, TensorInfo
from glimmer.checkpoint.weight_layouts import detect_weight_layout, locate
from glimmer.checkpoint.weight_mismatch import MismatchAdvice, WeightMismatch
from glimmer.errors import CheckpointError

logger = logging.getLogger(__name__)

QUANT_METHOD = "compressed-tensors"
NVFP4_FORMAT = "nvfp4-pack-quantized"
GROUP_SIZE = 16
SCHEME = "NVFP4 W4A16"
# the magnitudes of the 3-bit E2M1 index (compressed-tensors' kE2M1ToFloat); bit 3 of a code is the sign
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_CODES = torch.tensor([*E2M1_VALUES, *(-v for v in E2M1_VALUES)])
# each byte's two weights, the low nibble's first: one lookup unpacks a byte
_BYTE_VALUES = torch.stack((_E2M1_CODES.repeat(16), _E2M1_CODES.repeat_interleave(16)), dim=1)
# codes dequantized at a time: the scratch memory beside the output stays a few dozen megabytes
DEQUANTIZE_CHUNK_VALUES = 1 << 22

_PACKED, _SCALE, _GLOBAL = WEIGHT_PACKED, "weight_scale", "weight_global_scale"
_DROPPED_SUFFIXES = (".input_global_scale", ".input_scale")
_FLOAT_GLOBAL_DTYPES = ("F32", "F16", "BF16")
# the text decoder's Linear layers, the only modules that may be quantized
_TEXT_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "self_attn.gate_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# what a refusal of weights Glimmer does not read advises instead
_LOAD_INSTEAD = "load the unquantized (bf16) checkpoint, the compressed-tensors NVFP4 release or a GGUF"
_NVFP4_ARGS = {"type": "float", "num_bits": 4, "group_size": GROUP_SIZE, "strategy": "tensor_group"}
_SCHEME_TEXT = (f"{SCHEME}: FP4 E2M1 weights, an FP8 E4M3 scale per {GROUP_SIZE} inputs and an FP32 global scale "
                "per tensor; activations unquantized")


@dataclass(frozen=True)
class CompressedTensorsCheckpoint:
    config: ModelConfig
    tensors: MappedTensors | None  # None: the config alone was read
    weight_layout: str
    tensor_types: dict[str, int]
    quantization: dict[str, Any]  # for `glimmer inspect`
    quantized: QuantizedStorage | None = None  # the quantized modules' tensors on disk; None: the config alone was read


def quantization_config_of(raw: Mapping[str, Any]) -> Any:
    """A config.json's `quantization_config` (at the top level, or in text_config), or None."""
    text_config = raw.get("text_config")
    found = raw.get("quantization_config")
    if found is None and isinstance(text_config, Mapping):
        found = text_config.get("quantization_config")
    return found


def is_compressed_tensors_config(raw: Mapping[str, Any]) -> bool:
    spec = quantization_config_of(raw)
    return isinstance(spec, Mapping) and spec.get("quant_method") == QUANT_METHOD


def open_compressed_tensors(path: Path, raw: dict[str, Any], *, weights: bool = True) -> CompressedTensorsCheckpoint:
    """Read a compressed-tensors checkpoint directory; CheckpointError names the field or tensor at fault.
    weights=False: the config alone (its quantization checked too)."""
    source = path / "config.json"
    warnings = read_quantization_config(quantization_config_of(raw), str(source))
    for warning in warnings:
        logger.warning("%s", warning)
    described = {k: v for k, v in raw.items() if k != "quantization_config"}
    if isinstance(raw.get("text_config"), Mapping):
        described["text_config"] = {k: v for k, v in raw["text_config"].items() if k != "quantization_config"}
    config = normalize_config(described, source=str(source))
    config = dataclasses.replace(config, warnings=(*config.warnings, *warnings))
    summary = {"method": QUANT_METHOD, "format": NVFP4_FORMAT, "scheme": _SCHEME_TEXT}
    if not weights:
        return CompressedTensorsCheckpoint(config, None, "canonical", {}, summary)
    files = SafetensorsCheckpoint(path)
    config = dataclasses.replace(config, warnings=(*config.warnings, *files.warnings))
    layout = detect_weight_layout(files.names())
    entries, types, quantized = _entries(files, config, layout)
    storage = QuantizedStorage(SCHEME, sum(files.tensors[f"{module}.{part}"].num_bytes for module in quantized
                                           for part in (_PACKED, _SCALE, _GLOBAL)))
    summary |= {
        "quantized_modules": len(quantized),
        "quantized_module_kinds": sorted({_module_kind(module) for module in quantized}),
        "quantized_bytes": storage.bytes_on_disk,
        "dequantized_to": "the model dtype, when loaded",
    }
    return CompressedTensorsCheckpoint(config, MappedTensors(path, entries, files.total_bytes), layout, types, summary,
                                       storage)


def refuse_unmarked_packed_weights(path: Path, files: SafetensorsCheckpoint) -> None:
    """Refuse a directory whose weights are compressed-tensors packed ones but whose config.json has no
    `quantization_config` (a tool that rewrote the config dropped it): read as a plain checkpoint, every quantized
    Linear would be missing and its packed tensors unexpected, blaming the layout; GPTQ or AWQ packed weights, whose
    scheme lies in a file of their own (AutoGPTQ's quantize_config.json, AutoAWQ's quant_config.json), and FP8 or
    INT8 weights beside their scales are refused too. Returns where none is quantized."""
    found = find_quantized_weights(files)
    if found is None:
        return
    shown = describe_quantized_weights(found, files)
    if found.kind == GPTQ_OR_AWQ:
        module = found.first.removesuffix(".qweight")
        companions = [part for part in ("qzeros", "scales") if f"{module}.{part}" in files.tensors]
        shown += f", with their {' and '.join(companions)}" if companions else ""
        settings = [name for name in ("quantize_config.json", "quant_config.json") if (path / name).is_file()]
        shown += f"; {settings[0]} describes them" if settings else ""
        raise CheckpointError(
            f"{path} holds GPTQ or AWQ packed weights ({shown}), which Glimmer does not read: {_LOAD_INSTEAD}")
    if found.kind == EIGHT_BIT:
        raise CheckpointError(
            f"{path / 'config.json'} has no quantization_config, but the weights are 8-bit quantized ones ({shown}), "
            f"which Glimmer does not read: {_LOAD_INSTEAD}")
    differs = _not_nvfp4(files, found.first.removesuffix(f".{_PACKED}"))
    if differs:  # pack-quantized int4, MXFP4 or another packing: no config would make them read
        raise CheckpointError(
            f"{path / 'config.json'} has no quantization_config, but the weights are compressed-tensors packed "
            f"ones of another scheme than NVFP4 ({shown}, {differs}), which Glimmer does not read: {_LOAD_INSTEAD}")
    raise CheckpointError(
        f"{path / 'config.json'} has no quantization_config, but the weights are compressed-tensors packed ones "
        f"({shown}, with their {_SCALE} and {_GLOBAL}); restore the config.json published with the "
        "checkpoint (its quantization_config says how they are packed), or load the unquantized checkpoint")


def _not_nvfp4(files: SafetensorsCheckpoint, module: str) -> str:
    """How `module`'s packed tensors differ from NVFP4's (U8 codes, an F8_E4M3 weight_scale and a
    weight_global_scale), or "" where they are NVFP4's: MXFP4 packs U8 codes too, under a U8 exponent scale and no
    global scale."""
    packed, scale = files.tensors[f"{module}.{_PACKED}"], files.tensors.get(f"{module}.{_SCALE}")
    if packed.dtype != "U8":
        return f"of dtype {packed.dtype} where NVFP4 packs U8"
    differs = []
    if scale is None:
        differs.append(f"without the {_SCALE} NVFP4 has")
    elif scale.dtype != "F8_E4M3":
        differs.append(f"its {_SCALE} of dtype {scale.dtype} where NVFP4's is F8_E4M3")
    if f"{module}.{_GLOBAL}" not in files.tensors:
        differs.append(f"without the {_GLOBAL} NVFP4 has")
    return ", ".join(differs)


def read_quantization_config(spec: Any, source: str) -> tuple[str, ...]:
    """Check that `quantization_config` describes compressed-tensors NVFP4 weights (W4A16); the warnings it gives.
    Raises CheckpointError naming the field, its value and what Glimmer reads."""
    name = "quantization_config"
    if not isinstance(spec, Mapping):
        raise CheckpointError(f"{source}: {name} must be a JSON object, got {type(spec).__name__}")
    method = spec.get("quant_method")
    if method is None and "bits" in spec and "group_size" in spec:  # mlx-lm writes its quantization here too
        raise CheckpointError(
            f"{source}: {name} is mlx-lm's (bits {spec['bits']!r}, group_size {spec['group_size']!r}, no "
            "quant_method): a packaged MLX artifact is read only with \"muse_glimmer_mlx_format\" in config.json; "
            "restore the artifact's config.json as packaged, or regenerate the artifact")
    if method != QUANT_METHOD:
        raise CheckpointError(
            f"{source}: {name}.quant_method={method!r} is not supported; Glimmer reads quantized safetensors "
            f"checkpoints only as compressed-tensors NVFP4 (quant_method {QUANT_METHOD!r}, format {NVFP4_FORMAT!r}): "
            "use that release, the unquantized (bf16) checkpoint, or a GGUF")
    top_format = spec.get("format")  # absent: each config group names its own (as vLLM reads it)
    if top_format not in (NVFP4_FORMAT, "mixed-precision", None):
        raise _unsupported(source, f"{name}.format", top_format)
    status = spec.get("quantization_status", "compressed")
    if status != "compressed":
        raise CheckpointError(f"{source}: {name}.quantization_status={status!r} is not supported; Glimmer reads "
                              "checkpoints saved compressed (quantization_status 'compressed'): save the model "
                              "compressed (llm-compressor's save_compressed=True)")
    for key, what in (("kv_cache_scheme", "a quantized KV cache"), ("sparsity_config", "sparse weights"),
                      ("transform_config", "weight transforms")):
        value = spec.get(key)
        if key == "sparsity_config" and isinstance(value, Mapping) and value.get("format") == "dense":
            continue  # compressed-tensors' identity sparsity format: a pruned model's weights stored as they are
        if value:
            raise CheckpointError(f"{source}: {name}.{key} is set ({what}), which Glimmer does not read; use a "
                                  f"checkpoint quantized to {SCHEME} alone")
    ignore = spec.get("ignore")  # which modules are quantized is read from the tensors; the list is only checked
    if ignore is not None and not (isinstance(ignore, list) and all(isinstance(item, str) for item in ignore)):
        raise CheckpointError(f"{source}: {name}.ignore={json.dumps(ignore)} is invalid; expected a list of module "
                              'names or "re:" patterns (such as ["lm_head", "re:.*vision.*"]), or null')
    groups = spec.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise CheckpointError(f"{source}: {name}.config_groups must be a non-empty JSON object of quantization "
                              f"schemes; found {groups!r}")
    verdicts = {group: _group_problem(scheme, f"{name}.config_groups.{group}", top_format)
                for group, scheme in groups.items()}
    problems = [problem for problem in verdicts.values() if problem is not None]
    if problems and len(problems) < len(verdicts):
        ok = ", ".join(group for group, problem in verdicts.items() if problem is None)
        raise CheckpointError(f"{source}: {name}.config_groups mix quantization schemes ({ok}: {SCHEME}); Glimmer "
                              f"reads one scheme, {SCHEME}, in every group, and {problems[0]}")
    if problems:
        raise CheckpointError(f"{source}: {problems[0]}")
    activations = [group for group, scheme in groups.items() if scheme.get("input_activations")]
    if not activations:
        return ()
    return (f"{name}.config_groups.{activations[0]}.input_activations quantizes activations to NVFP4 (W4A4); Glimmer "
            "does not: the weights are dequantized and the model runs W4A16 (activations in the model dtype), so its "
            "outputs differ slightly from an FP4 GEMM's",)


def _group_problem(scheme: Any, name: str, top_format: Any) -> str | None:
    """What in one config group is not NVFP4 W4A16 (a sentence naming the field), or None."""
    if not isinstance(scheme, Mapping):
        return f"{name} must be a JSON object, got {type(scheme).__name__}"
    group_format = scheme.get("format") or top_format
    if group_format != NVFP4_FORMAT:
        return _unsupported_text(f"{name}.format", group_format)
    weights = scheme.get("weights")
    if not isinstance(weights, Mapping):
        return f"{name}.weights is {weights!r}; Glimmer reads {SCHEME}, whose weights are quantized"
    for key, expected in _NVFP4_ARGS.items():
        if weights.get(key) != expected:
            return (f"{name}.weights.{key}={weights.get(key)!r} is not supported ({_describe(weights)}); Glimmer "
                    f"reads {SCHEME}: {', '.join(f'{k} {v!r}' for k, v in _NVFP4_ARGS.items())}")
    for key, expected in (("symmetric", True), ("dynamic", False), ("actorder", None), ("block_structure", None)):
        if key in weights and weights[key] != expected:
            return f"{name}.weights.{key}={weights[key]!r} is not supported; {SCHEME} weights have {key} {expected!r}"
    activations = scheme.get("input_activations")
    if activations and (not isinstance(activations, Mapping)
                        or any(activations.get(k) != v for k, v in _NVFP4_ARGS.items())):
        return (f"{name}.input_activations: {_describe(activations)} is not supported; Glimmer reads {SCHEME} "
                "(no input_activations; NVFP4 ones are run as W4A16)")
    if scheme.get("output_activations"):
        return f"{name}.output_activations is set; Glimmer reads {SCHEME}, whose outputs are not quantized"
    return None


def _describe(args: Any) -> str:
    """The scheme a QuantizationArgs object describes, in words: 'MXFP4 (4-bit float, groups of 32)'."""
    if not isinstance(args, Mapping):
        return repr(args)
    kind, bits, group = args.get("type"), args.get("num_bits"), args.get("group_size")
    label = {("float", 4, 16): "NVFP4", ("float", 4, 32): "MXFP4", ("float", 8, None): "FP8"}.get((kind, bits, group))
    words = f"{bits}-bit {kind}" + (f", groups of {group}" if group else "") + f", strategy {args.get('strategy')!r}"
    return f"{label} ({words})" if label else words


def _unsupported_text(field: str, value: Any) -> str:
    return (f"{field}={value!r} is not supported; Glimmer reads compressed-tensors {SCHEME} (format "
            f"{NVFP4_FORMAT!r}); use that release or the unquantized (bf16) checkpoint")


def _unsupported(source: str, field: str, value: Any) -> CheckpointError:
    return CheckpointError(f"{source}: {_unsupported_text(field, value)}")


_ADVICE = MismatchAdvice(
    unmapped_title="tensors with no module",
    unsupported_title=(f"unsupported dtypes ({SCHEME} stores weight_packed as U8, weight_scale as F8_E4M3 and "
                       "weight_global_scale as F32)"),
    other_model_fix=("the quantized tensors do not belong to this model's Linear layers: load the checkpoint with the "
                     "config.json published beside it"),
    other_size_fix=(f"a packed weight [out, in/2] needs its weight_scale as [out, in/{GROUP_SIZE}] and one global "
                    "scale: the checkpoint is damaged or not NVFP4; download or quantize it again"),
    incomplete_fix=("each quantized module needs weight_packed, weight_scale and weight_global_scale: download every "
                    "shard the index names again"),
    extra_fix=("only the text decoder's Linear layers (attention q/k/v/o and gate, the MLP) may be quantized: keep "
               "lm_head, the embeddings, norms and the vision tower unquantized (the quantization recipe's ignore "
               "list), or load the unquantized checkpoint"),
    unsupported_fix="quantize the checkpoint again with compressed-tensors' NVFP4A16 scheme",
    unmapped_fix="quantize the checkpoint again with compressed-tensors' NVFP4A16 scheme",
)


def _entries(files: SafetensorsCheckpoint, config: ModelConfig, layout: str
             ) -> tuple[dict[str, MappedTensor], dict[str, int], list[str]]:
    """The checkpoint's tensors under its own names, each quantized module's three tensors as one float `M.weight`;
    every quantized module that is misshapen, incomplete, of the wrong dtypes or not a text Linear is listed in one
    CheckpointError."""
    found = WeightMismatch()
    quantized_parts = (_PACKED, _SCALE, _GLOBAL)
    modules = sorted({name.rsplit(".", 1)[0] for name in files.names() if name.rsplit(".", 1)[-1] in quantized_parts})
    allowed = _quantizable_modules(config, layout)
    entries: dict[str, MappedTensor] = {}
    types: dict[str, int] = {}
    for module in modules:
        present = [f"{module}.{part}" for part in quantized_parts if f"{module}.{part}" in files.tensors]
        if module not in allowed:
            found.unexpected.extend(f"{name} {list(files.tensors[name].shape)}" for name in present)
            continue
        if f"{module}.weight" in files.tensors:
            found.unexpected.append(f"{module}.weight (beside {module}.{_PACKED}: two copies of the weight)")
        missing = [f"{module}.{part}" for part in quantized_parts if f"{module}.{part}" not in files.tensors]
        if missing:
            found.missing.extend(f"{name} (for {module}, quantized)" for name in missing)
            continue
        shape = _checked_shapes(files, module, found)
        if shape is None:
            continue
        entries[f"{module}.weight"] = MappedTensor(
            TensorInfo(f"{module}.weight", shape, "F32", files.tensors[f"{module}.{_PACKED}"].file,
                       stored_name=f"{module}.{_PACKED}"),
            read_on=_dequantizing_reader(files, module),
            # its codes are no floats: a NaN or infinity comes from a scale (FP8 E4M3's NaN, 0x7f)
            trace=lambda module=module: non_finite_part(files, (f"{module}.{_SCALE}", f"{module}.{_GLOBAL}")))
        types[f"NVFP4 g{GROUP_SIZE}"] = types.get(f"NVFP4 g{GROUP_SIZE}", 0) + 1
    if found:
        raise CheckpointError(found.message(
            f"the quantized weights in {files.directory} ({SCHEME}, {layout} layout) do not match the format",
            _ADVICE))
    quantized = {name.rsplit(".", 1)[0] for name in entries}
    for name, info in files.tensors.items():
        if name.rsplit(".", 1)[0] in quantized and name.rsplit(".", 1)[-1] in quantized_parts:
            continue
        if name.endswith(_DROPPED_SUFFIXES):  # activation scales: not weights of a W4A16 model
            logger.debug("%s: dropping %s, an activation scale (the model runs W4A16)", files.directory, name)
            continue
        entries[name] = MappedTensor(info, _plain_reader(files, name))
        types[info.dtype] = types.get(info.dtype, 0) + 1
    return entries, types, sorted(quantized)


def _quantizable_modules(config: ModelConfig, layout: str) -> set[str]:
    """The modules of `layout` that hold the text decoder's Linear weights (a fused one once)."""
    modules = set()
    for i in range(config.text.num_hidden_layers):
        for linear in _TEXT_LINEARS:
            where = locate(layout, f"model.language_model.layers.{i}.{linear}.weight", config)
            if where is not None and where.source.endswith(".weight"):
                modules.add(where.source.removesuffix(".weight"))
    return modules


def _checked_shapes(files: SafetensorsCheckpoint, module: str, found: WeightMismatch) -> tuple[int, int] | None:
    """The (out, in) weight `module`'s packed tensors hold, or None with what is wrong noted in `found`."""
    packed, scale, global_scale = (files.tensors[f"{module}.{part}"] for part in (_PACKED, _SCALE, _GLOBAL))
    ok = True
    for info, dtypes in ((packed, ("U8",)), (scale, ("F8_E4M3",)), (global_scale, _FLOAT_GLOBAL_DTYPES)):
        if info.dtype not in dtypes:
            found.unsupported.append(f"{info.name}: dtype {info.dtype} (expected {' or '.join(dtypes)})")
            ok = False
    if len(packed.shape) != 2:
        found.mismatched.append(f"{packed.name}: expected a matrix [out, in/2], found shape {list(packed.shape)}")
        return None
    out, columns = packed.shape[0], packed.shape[1] * 2
    if columns % GROUP_SIZE:
        found.mismatched.append(f"{packed.name}: {columns} inputs (2 × {packed.shape[1]}) are not a whole number of "
                                f"groups of {GROUP_SIZE}")
        return None
    if scale.shape != (out, columns // GROUP_SIZE):
        found.mismatched.append(f"{scale.name}: expected shape {[out, columns // GROUP_SIZE]} (one scale per "
                                f"{GROUP_SIZE} of {packed.name}'s {columns} inputs), found {list(scale.shape)}")
        ok = False
    if global_scale.shape not in ((), (1,)):
        found.mismatched.append(f"{global_scale.name}: expected one value (shape [1]), found "
                                f"{list(global_scale.shape)}")
        ok = False
    return (out, columns) if ok else None


def _dequantizing_reader(files: SafetensorsCheckpoint, module: str) -> Callable[[torch.device | str], torch.Tensor]:
    """The module's float32 weight dequantized on `device` (where the loader puts it: the packed codes and scales
    travel, 0.56 bytes a weight against bf16's 2, and the arithmetic runs there). Each tensor read by its own name: the
    index may put a module's scales in another shard than its codes."""

    def read(device: torch.device | str) -> torch.Tensor:
        global_scale = files.read(f"{module}.{_GLOBAL}")
        value = global_scale.float().reshape(()).item()
        if not (math.isfinite(value) and value > 0):  # it divides every scale: the weights would be inf or NaN
            info = files.tensors[f"{module}.{_GLOBAL}"]
            raise CheckpointError(f"{info.name} (in {info.file}) is {value}, but a global scale divides the module's "
                                  "weight scales and must be a positive finite number; the checkpoint is damaged: "
                                  "download or quantize it again")
        packed, scale = (files.read(f"{module}.{part}").to(device) for part in (_PACKED, _SCALE))
        return dequantize_nvfp4(packed, scale, global_scale)

    return read


def _plain_reader(files: SafetensorsCheckpoint, name: str) -> Callable[[], torch.Tensor]:
    return lambda: files.read(name)


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' NVFP4 dequantization: codes two a byte, low nibble first; w = e2m1(code) ·
    (scale / global_scale) per group of 16 inputs, the divide first as compressed-tensors does it (so the float32
    result is its own, bit for bit). Returns float32 (out, in) on the device of `packed`, a block of rows at a time
    (the scratch beside the output stays a few dozen megabytes). Every step is exact or one correctly rounded
    IEEE float32 operation (the fp8 → float32 widening and the E2M1 lookup are exact, the divide and the multiply
    round to nearest even), so any device gives the same bits."""
    rows, columns = packed.shape[0], packed.shape[1] * 2
    # the divisor on the scales' device: CUDA turns a divide by a host scalar into a multiply by its reciprocal,
    # which can round differently
    group_scale = scale.float() / global_scale.to(scale.device).float().reshape(())
    byte_values = _BYTE_VALUES.to(packed.device)
    out = torch.empty(rows, columns, dtype=torch.float32, device=packed.device)
    step = max(1, DEQUANTIZE_CHUNK_VALUES // max(columns, 1))
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        values = byte_values.index_select(0, packed[start:stop].reshape(-1).int())  # (bytes, 2): int32 ids are faster
        shape = (stop - start, columns // GROUP_SIZE, GROUP_SIZE)
        torch.mul(values.reshape(shape), group_scale[start:stop, :, None], out=out[start:stop].view(shape))
    return out


def _module_kind(module: str) -> str:
    """'self_attn.q_proj' for 'model.language_model.layers.3.self_attn.q_proj'."""
    parts = module.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[i + 1:])
    return module


# Writing (`glimmer make-tiny --quantize nvfp4`): what llm-compressor's NVFP4A16 recipe writes, for test artifacts

# the midpoints between neighbouring E2M1 magnitudes: rounding to nearest picks the bucket, a tie the even index
_E2M1_MIDPOINTS = torch.tensor([(a + b) / 2 for a, b in pairwise(E2M1_VALUES)])


def nvfp4_quantization_config() -> dict[str, Any]:
    """The `quantization_config` of an NVFP4A16 checkpoint whose text Linear layers are quantized."""
    weights = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": GROUP_SIZE, "strategy": "tensor_group",
               "dynamic": False, "actorder": None, "block_structure": None, "observer": "static_minmax"}
    return {"quant_method": QUANT_METHOD, "format": NVFP4_FORMAT, "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": NVFP4_FORMAT}},
            "ignore": ["lm_head", "re:.*vision.*"], "kv_cache_scheme": None}


def quantize_nvfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight_packed, weight_scale, weight_global_scale) of a float weight [out, in] (in a multiple of 16): the
    global scale maps the tensor's largest magnitude to FP8's largest times FP4's (448 · 6), each group's FP8
    scale its largest to 6, and each weight rounds to the nearest E2M1 value (ties to the even code). A weight all
    zero, or too small for that ratio to be a float32 (448 · 6 / 1e-37 overflows), takes the global scale 1.0 as
    compressed-tensors gives it: its FP8 scales are then 0 and it dequantizes to zeros."""
    weight = weight.float()
    out, columns = weight.shape
    global_scale = (448.0 * 6.0 / weight.abs().max().clamp(min=torch.finfo(torch.float32).tiny)).reshape(1)
    global_scale = global_scale.masked_fill(global_scale.isinf(), 1.0)  # the loader refuses an infinite one
    groups = weight.reshape(out, columns // GROUP_SIZE, GROUP_SIZE)
    scale = (groups.abs().amax(-1) / 6.0 * global_scale).clamp(max=448.0).to(torch.float8_e4m3fn)
    step = (scale.float() / global_scale).clamp(min=torch.finfo(torch.float32).tiny)
    scaled = (groups / step[..., None]).reshape(out, columns)
    magnitude = scaled.abs().clamp(max=6.0)
    index = torch.bucketize(magnitude, _E2M1_MIDPOINTS)  # a value on a midpoint takes the lower index here
    on_midpoint = magnitude == _E2M1_MIDPOINTS[index.clamp(max=len(_E2M1_MIDPOINTS) - 1)]
    index = torch.where(on_midpoint & (index % 2 == 1), index + 1, index)
    codes = (index | ((scaled < 0).long() << 3)).to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale, global_scale


def quantize_text_linears(weights: dict[str, torch.Tensor], config: ModelConfig, layout: str
                          ) -> dict[str, torch.Tensor]:
    """`weights` (named in `layout`) with each text decoder Linear's `weight` replaced by its NVFP4 tensors."""
    modules = _quantizable_modules(config, layout)
    out = {}
    for name, tensor in weights.items():
        module = name.removesuffix(".weight")
        if module in modules and name.endswith(".weight"):
            out[f"{module}.{_PACKED}"], out[f"{module}.{_SCALE}"], out[f"{module}.{_GLOBAL}"] = quantize_nvfp4(tensor)
        else:
            out[name] = tensor
    return out
