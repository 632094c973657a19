"""Packaged MLX artifacts of Muse Glimmer (`"muse_glimmer_mlx_format": 1` in config.json), read into canonical
tensors (architecture.md §15.2 "Packaged MLX artifact"; the vendor MLX loader's `sanitize()`, seed 001).

The packaging, version 1, as the packager writes it and this reader undoes it:

* config.json: the flat/vendor schema (or the canonical nested one) plus `muse_glimmer_mlx_format: 1` and,
  when quantized, mlx-lm's `quantization` (`{"group_size": G, "bits": B}`, optionally per-module
  overrides `"<module>": {"group_size", "bits"}` or `false`, and `"mode": "affine"`). Any other format
  version is refused: the packing is not self-describing, so only a regenerated artifact is safe.
* Tensor names are the MLX model's, i.e. the vendor/legacy names (§15.2): `model.embed_tokens`,
  `model.norm`, `lm_head`, `model.layers.N.self_attn.{q,k,v,o}_proj`, `model.layers.N.mlp.{gate,up,down}_proj`
  and the positional sandwich-norm names `input_layernorm`, `post_attn_norm` (post-attention),
  `post_attention_layernorm` (really the PRE-feedforward norm) and `post_ffn_norm`.
* The +1 of the four per-layer centered norms is folded into their weights (w + 1); the final norm is
  plain (§2.1, §14.1). Loading subtracts the 1.
* The attention gate is fused into q_proj per head: rows [q_head; gate_head] for each head, so q_proj has
  2·heads·head_dim rows. Loading splits them.
* q/k rows follow `rope_is_neox_style`: true = rotate-half (the HF pairing), false = the native
  interleaved pairing, permuted on load (§5.4). The flat schemas must state it (the vendor loader's two
  generations of exports are byte-identical otherwise, seed 001); the nested schema is rotate-half.
* Quantized modules (any Linear or the embedding) hold `weight` (uint32 words packing B-bit codes as a
  little-endian bit stream along each row), `scales` and `biases` (one per group of G inputs):
  w = scale · q + bias — MLX's affine quantization, dequantized here with exactly that formula.
* A tied model (`tie_word_embeddings: true`) has no `lm_head`: its embedding, quantized or not, is the head.
* Text only: the artifact carries no vision tower.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glimmer.checkpoint.config import ModelConfig, TextConfig
from glimmer.checkpoint.config_fields import is_int
from glimmer.checkpoint.config_layouts import normalize_config
from glimmer.checkpoint.mapped_tensors import MappedTensor, MappedTensors, non_finite_part
from glimmer.checkpoint.quantized_weights import QuantizedStorage
from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint, TensorInfo
from glimmer.checkpoint.weight_layouts import interleaved_to_rotate_half
from glimmer.checkpoint.weight_mismatch import MismatchAdvice, WeightMismatch
from glimmer.errors import CheckpointError

MLX_FORMAT_VERSION = 1
_PACKAGING_KEYS = ("muse_glimmer_mlx_format", "quantization", "quantization_config")
_SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)
# codes unpacked at a time by `dequantize_affine`: its scratch memory is a few dozen bytes per code
DEQUANTIZE_CHUNK_VALUES = 1 << 18


@dataclass(frozen=True)
class MlxArtifact:
    config: ModelConfig
    tensors: MappedTensors
    rope_layout: str
    tensor_types: dict[str, int]
    # the quantized modules' codes, scales and biases, dequantized on load: their bits ("MLX affine 4-bit") and bytes on
    # disk (None: none is quantized)
    quantized: QuantizedStorage | None = None


@dataclass(frozen=True)
class _Quantization:
    group_size: int
    bits: int


def open_mlx_artifact(path: Path, raw: dict[str, Any]) -> MlxArtifact:
    """Read a packaged MLX artifact directory; ConfigError / CheckpointError name the field or tensor."""
    source = path / "config.json"
    version = raw["muse_glimmer_mlx_format"]
    if version != MLX_FORMAT_VERSION or isinstance(version, bool):
        raise CheckpointError(f"{source}: muse_glimmer_mlx_format={version!r} is not supported (Glimmer reads version "
                              f"{MLX_FORMAT_VERSION}); regenerate the artifact with a packager that writes version "
                              f"{MLX_FORMAT_VERSION}, or load the original Hugging Face export")
    default, overrides, spec_key = _quantization(raw, source)
    described = {k: v for k, v in raw.items() if k not in _PACKAGING_KEYS}
    if isinstance(raw.get("text_config"), dict):  # its pairing flag is read here (_interleaved_rope), not by the config
        described["text_config"] = {k: v for k, v in raw["text_config"].items() if k != "rope_is_neox_style"}
    config = normalize_config(described, source=str(source))
    interleaved = _interleaved_rope(raw, config, source)
    files = SafetensorsCheckpoint(path)
    config = dataclasses.replace(config, warnings=(*config.warnings, *files.warnings))  # files left out
    entries, types, quantized = _entries(files, config.text, default, overrides, interleaved, spec_key)
    rope = "interleaved (permuted to rotate-half on load)" if interleaved else "rotate-half"
    bits = "/".join(f"{b}-bit" for b in sorted({scheme.bits for scheme in quantized.values()}))
    return MlxArtifact(config, MappedTensors(path, entries, files.total_bytes), rope, types,
                       QuantizedStorage(f"MLX affine {bits}",
                                        sum(files.tensors[f"{module}.{part}"].num_bytes for module in quantized
                                            for part in ("weight", "scales", "biases"))) if quantized else None)


def refuse_unmarked_artifact(path: Path, raw: dict[str, Any], files: SafetensorsCheckpoint, text: TextConfig) -> None:
    """Refuse a directory whose weights are a packaged MLX artifact's but whose config.json lacks
    `muse_glimmer_mlx_format` (a tool that rewrote the config dropped it): read as the legacy export its names
    resemble, every q_proj, norm and quantized module would be a mismatch. Raises one CheckpointError naming what
    gives the artifact away and the missing key; returns where nothing does."""
    signs = []
    quantized = sorted(name.removesuffix(".scales") for name in files.tensors
                       if name.endswith(".scales") and name.removesuffix(".scales") + ".biases" in files.tensors)
    if quantized:
        more = f" and {len(quantized) - 1} more modules" if len(quantized) > 1 else ""
        signs.append(f"MLX affine quantization tensors {quantized[0]}.scales / .biases{more}")
    q_proj = files.tensors.get("model.layers.0.self_attn.q_proj.weight")
    if (q_proj is not None and "model.layers.0.self_attn.gate_proj.weight" not in files.tensors
            and q_proj.shape[0] == 2 * text.q_size):
        signs.append(f"model.layers.0.self_attn.q_proj.weight with {q_proj.shape[0]} rows (2 × "
                     "num_attention_heads × head_dim) and no gate_proj: the attention gate fused into q_proj")
    if signs:  # mlx-lm's "quantization" key only confirms: alone, beside weights that fit, it is an ignored key
        if isinstance(raw.get("quantization"), dict):
            signs.append("mlx-lm's \"quantization\" in config.json")
        raise CheckpointError(
            f"{path / 'config.json'} has no muse_glimmer_mlx_format, but the weights are a packaged MLX artifact's "
            f"({'; '.join(signs)}), which cannot be read as the Hugging Face export their names resemble. Restore "
            f"the artifact's config.json as packaged, or add \"muse_glimmer_mlx_format\": {MLX_FORMAT_VERSION} to it "
            "(with its \"quantization\" and \"rope_is_neox_style\") if the packager wrote version "
            f"{MLX_FORMAT_VERSION}; else regenerate the artifact"
        )


def _quantization(
    raw: dict[str, Any], source: Path
) -> tuple[_Quantization | None, dict[str, _Quantization | None], str]:
    """(the default scheme, the per-module overrides, the config.json key they were read from: mlx-lm's
    "quantization", or "quantization_config", which it writes beside it and a tool may keep alone)."""
    spec_key = "quantization_config" if "quantization" not in raw and "quantization_config" in raw else "quantization"
    spec = raw.get(spec_key)
    if spec is None:
        return None, {}, spec_key
    if not isinstance(spec, dict):
        raise CheckpointError(f"{source}: {spec_key} must be an object with group_size and bits")
    default = _parse_quantization(spec, spec_key, source)
    overrides: dict[str, _Quantization | None] = {}
    for key, value in spec.items():
        if isinstance(value, dict):
            overrides[key] = _parse_quantization(value, f"{spec_key}.{key}", source)
        elif value is False:
            overrides[key] = None
        elif "." in key:  # a module's path: mlx-lm writes its override as an object, or false to leave it whole
            raise CheckpointError(f"{source}: {spec_key}.{key}={value!r} is invalid; a module's override is an "
                                  "object with group_size and bits, or false for a module left unquantized")
    return default, overrides, spec_key


def _parse_quantization(spec: dict[str, Any], name: str, source: Path) -> _Quantization:
    # a module's own mode (mlx-lm writes one beside group_size and bits) counts as the default's does: its mxfp4 or
    # nvfp4 codes have no biases and other scales, and read as affine they would be another model
    mode = spec.get("mode", "affine")
    if mode != "affine":
        raise CheckpointError(f"{source}: {name}.mode={mode!r} is not supported; Glimmer reads MLX's affine "
                              "quantization (scales and biases per group): regenerate the artifact with mode affine")
    group, bits = spec.get("group_size"), spec.get("bits")
    if not is_int(group) or group <= 0:
        raise CheckpointError(f"{source}: {name}.group_size={group!r} is invalid; expected a positive integer")
    # 4.0 is "in" the tuple but no bit count: the unpacking's shifts need an integer
    if not is_int(bits) or bits not in _SUPPORTED_BITS:
        raise CheckpointError(f"{source}: {name}.bits={bits!r} is invalid; MLX affine quantization uses "
                              f"{list(_SUPPORTED_BITS)}")
    return _Quantization(group, bits)


def _interleaved_rope(raw: dict[str, Any], config: ModelConfig, source: Path) -> bool:
    """Whether q/k rows are interleaved, from `rope_is_neox_style`: at the top level, or in the nested schema's
    text_config (where a weights directory's flag is read too, formats.py); two that disagree are refused."""
    stated = {f"{where}rope_is_neox_style": section["rope_is_neox_style"]
              for where, section in (("", raw), ("text_config.", raw.get("text_config")))
              if isinstance(section, dict) and section.get("rope_is_neox_style") is not None}
    if len(set(map(repr, stated.values()))) > 1:
        raise CheckpointError(f"{source}: {' and '.join(f'{k}={v!r}' for k, v in stated.items())} disagree on the q/k "
                              "RoPE pairing; keep the one the weights have, or regenerate the artifact")
    neox = next(iter(stated.values()), None)
    if neox is not None and not isinstance(neox, bool):
        raise CheckpointError(f"{source}: {next(iter(stated))}={neox!r} is invalid; expected true or false")
    if config.config_layout in ("flat", "vendor"):
        if not isinstance(neox, bool):
            raise CheckpointError(f"{source}: rope_is_neox_style is {'absent' if neox is None else repr(neox)}; a flat "
                                  "MLX artifact must state its q/k RoPE pairing (true or false); regenerate the "
                                  "artifact")
        return not neox
    return neox is False


# canonical suffix under model.language_model.layers.N. ← MLX module under model.layers.N., norm folded?
_NORMS = {
    "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "post_attention_layernorm",
    "post_feedforward_layernorm": "post_ffn_norm",
}


# the dtypes a packaged artifact stores: floats for weights, norms, scales and biases; 32-bit words of packed codes
_FLOAT_DTYPES = ("F32", "F16", "BF16")
_PACKED_DTYPES = ("U32", "I32")
_MLX_ADVICE = MismatchAdvice(
    unmapped_title="tensors with no MLX name",
    unsupported_title=("unsupported dtypes (a packaged MLX artifact stores weights, norms, scales and biases as F32, "
                       "F16 or BF16 and quantized codes as U32 words)"),
    other_model_fix=("the tensor names are not a packaged Muse Glimmer MLX artifact's: regenerate the artifact, or "
                     "load the original Hugging Face export"),
    other_size_fix=("config.json describes another size of model than the weights hold: restore the artifact's "
                    "config.json as packaged, or regenerate the artifact"),
    incomplete_fix="the artifact is incomplete (a file left out or cut short): copy it again, or regenerate it",
    extra_fix=("a packaged MLX artifact holds the text model only: remove the other tensors, or regenerate the "
               "artifact"),
    unsupported_fix=("regenerate the artifact: unquantized modules are float weights, quantized ones uint32 codes "
                     "with float scales and biases (mlx's quantize)"),
    unmapped_fix="regenerate the artifact",
)


def _entries(
    files: SafetensorsCheckpoint,
    text: TextConfig,
    default: _Quantization | None,
    overrides: dict[str, _Quantization | None],
    interleaved: bool,
    spec_key: str,
) -> tuple[dict[str, MappedTensor], dict[str, int], dict[str, _Quantization]]:
    """Canonical tensors of the artifact, its storage types' counts and its quantized modules' schemes; every tensor
    missing, stray, misshapen or of a dtype the packing does not use is listed in one CheckpointError
    (weight_mismatch.py), as the safetensors loader's."""
    used: set[str] = set()
    types: dict[str, int] = {}
    quantized: dict[str, _Quantization] = {}  # quantized module → its scheme
    found = WeightMismatch()
    h, heads, kv_heads, d = text.hidden_size, text.num_attention_heads, text.num_key_value_heads, text.head_dim

    def check(name: str, shape: tuple[int, ...], dtypes: tuple[str, ...]) -> bool:
        """Whether tensor `name` is there with this shape and one of `dtypes`; what is not is noted in `found`."""
        info = files.tensors.get(name)
        if info is None:
            found.missing.append(f"{name} (shape {list(shape)})")
            return False
        used.add(name)
        if info.shape != shape:
            found.mismatched.append(f"{name}: expected shape {list(shape)}, found {list(info.shape)}")
            return False
        if info.dtype not in dtypes:
            found.unsupported.append(f"{name}: dtype {info.dtype}")
            return False
        return True

    def matrix(module: str, shape: tuple[int, int]) -> Callable[[], torch.Tensor]:
        """A Linear/Embedding weight of `shape` (out, in), quantized or not."""
        weight = f"{module}.weight"
        scheme = overrides.get(module, default)
        # packed codes quantized by the config, scales or biases: a quantized module, whose missing parts are named
        # (without its scales, a weight of codes read as a float one of the wrong shape, blaming the config)
        packed = weight in files.tensors and files.tensors[weight].dtype in _PACKED_DTYPES and scheme is not None
        if not packed and not any(f"{module}.{part}" in files.tensors for part in ("scales", "biases")):
            if check(weight, shape, _FLOAT_DTYPES):
                types[files.tensors[weight].dtype] = types.get(files.tensors[weight].dtype, 0) + 1
            return lambda: files.read(weight).float()
        if scheme is None:
            raise CheckpointError(f"{files.directory}: {module} has quantization scales or biases but config.json's "
                                  f"{spec_key} does not quantize it")
        out, columns = shape
        stored = _stored_packing(files, module, out, columns)
        if stored is not None and stored != (scheme.bits, scheme.group_size):
            key = f"{spec_key}.{module}" if module in overrides else spec_key
            raise CheckpointError(
                f"{files.directory}: {module} holds {stored[0]}-bit codes in groups of {stored[1]}, but config.json's "
                f"{key} says bits={scheme.bits}, group_size={scheme.group_size}; restore the artifact's config.json "
                f"as packaged (its \"{spec_key}\"), or regenerate the artifact")
        if columns % scheme.group_size or (columns * scheme.bits) % 32:
            raise CheckpointError(f"{files.directory}: {module} has {columns} inputs, not a whole number of groups of "
                                  f"{scheme.group_size} {scheme.bits}-bit codes")
        whole = check(weight, (out, columns * scheme.bits // 32), _PACKED_DTYPES)
        for part in ("scales", "biases"):
            whole &= check(f"{module}.{part}", (out, columns // scheme.group_size), _FLOAT_DTYPES)
        if whole:
            label = f"affine {scheme.bits}-bit g{scheme.group_size}"
            types[label] = types.get(label, 0) + 1
            quantized[module] = scheme
        return lambda: dequantize_affine(files.read(weight), files.read(f"{module}.scales"),
                                         files.read(f"{module}.biases"), scheme.group_size, scheme.bits)

    def vector(name: str, unfold: bool) -> Callable[[], torch.Tensor]:
        if check(name, (h,), _FLOAT_DTYPES):
            types[files.tensors[name].dtype] = types.get(files.tensors[name].dtype, 0) + 1
        return lambda: files.read(name).float() - (1.0 if unfold else 0.0)

    # canonical name → (shape, the artifact's tensor it is read from, read)
    readers: dict[str, tuple[tuple[int, ...], str, Callable[[], torch.Tensor]]] = {
        "model.language_model.embed_tokens.weight": ((text.vocab_size, h), "model.embed_tokens.weight",
                                                     matrix("model.embed_tokens", (text.vocab_size, h))),
        "model.language_model.norm.weight": ((h,), "model.norm.weight", vector("model.norm.weight", unfold=False)),
    }
    if not text.tie_word_embeddings:  # a tied model's lm_head is its embedding; mlx-lm saves no lm_head for it
        readers["lm_head.weight"] = ((text.vocab_size, h), "lm_head.weight", matrix("lm_head", (text.vocab_size, h)))
    for i in range(text.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"model.language_model.layers.{i}."
        q = src + "self_attn.q_proj"
        fused = matrix(q, (2 * heads * d, h))
        readers[dst + "self_attn.q_proj.weight"] = ((heads * d, h), f"{q}.weight",
                                                    _gate_split(fused, heads, d, 0, interleaved))
        readers[dst + "self_attn.gate_proj.weight"] = ((heads * d, h), f"{q}.weight",
                                                       _gate_split(fused, heads, d, 1, False))
        k = matrix(src + "self_attn.k_proj", (kv_heads * d, h))
        readers[dst + "self_attn.k_proj.weight"] = ((kv_heads * d, h), src + "self_attn.k_proj.weight",
                                                    _permuted(k, kv_heads) if interleaved else k)
        for name, shape in (("v_proj", (kv_heads * d, h)), ("o_proj", (h, heads * d))):
            readers[dst + f"self_attn.{name}.weight"] = (shape, src + f"self_attn.{name}.weight",
                                                         matrix(src + f"self_attn.{name}", shape))
        for name, shape in (("gate_proj", (text.intermediate_size, h)), ("up_proj", (text.intermediate_size, h)),
                            ("down_proj", (h, text.intermediate_size))):
            readers[dst + f"mlp.{name}.weight"] = (shape, src + f"mlp.{name}.weight",
                                                   matrix(src + f"mlp.{name}", shape))
        for canonical, stored in _NORMS.items():
            readers[dst + f"{canonical}.weight"] = ((h,), src + f"{stored}.weight",
                                                    vector(src + f"{stored}.weight", unfold=True))
    found.unexpected = [f"{name} {list(files.tensors[name].shape)}" for name in sorted(set(files.names()) - used)]
    if found:
        raise CheckpointError(found.message(
            f"the weights in {files.directory} (packaged MLX artifact) do not match the config", _MLX_ADVICE))
    entries = {name: MappedTensor(TensorInfo(name, shape, "F32", files.tensors[stored].file, stored_name=stored), read,
                                  trace=_scales_trace(files, stored.removesuffix(".weight")))
               for name, (shape, stored, read) in readers.items()}
    return entries, types, quantized


def _scales_trace(files: SafetensorsCheckpoint, module: str) -> Callable[[], str | None] | None:
    """For a quantized module: which of its scales and biases holds the NaN or infinity its weight got (its codes are
    integers); None for a float tensor, named by itself."""
    if f"{module}.scales" not in files.tensors:
        return None
    return lambda: non_finite_part(files, (f"{module}.scales", f"{module}.biases"))


def _stored_packing(files: SafetensorsCheckpoint, module: str, out: int, columns: int) -> tuple[int, int] | None:
    """(bits, group_size) a quantized module of `out` × `columns` weights was packed with, as the shapes of its codes
    and scales tell it; None where they tell nothing (a tensor missing or of another size: listed by `_entries`)."""
    weight, scales = files.tensors.get(f"{module}.weight"), files.tensors.get(f"{module}.scales")
    if weight is None or scales is None or len(weight.shape) != 2 or len(scales.shape) != 2:
        return None
    if weight.shape[0] != out or scales.shape[0] != out or not scales.shape[1] or columns % scales.shape[1]:
        return None
    bits = weight.shape[1] * 32 // columns
    if bits not in _SUPPORTED_BITS or bits * columns != weight.shape[1] * 32:
        return None
    return bits, columns // scales.shape[1]


def _gate_split(
    fused: Callable[[], torch.Tensor], heads: int, head_dim: int, part: int, interleaved: bool
) -> Callable[[], torch.Tensor]:
    """q (part 0) or gate (part 1) from q_proj's per-head [q_head; gate_head] rows."""

    def read() -> torch.Tensor:
        rows = fused().reshape(heads, 2, head_dim, -1)[:, part].reshape(heads * head_dim, -1)
        return interleaved_to_rotate_half(rows, heads) if interleaved else rows

    return read


def _permuted(read: Callable[[], torch.Tensor], heads: int) -> Callable[[], torch.Tensor]:
    return lambda: interleaved_to_rotate_half(read(), heads)


def dequantize_affine(
    packed: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, group_size: int, bits: int
) -> torch.Tensor:
    """MLX affine dequantization: codes are `bits`-wide fields of a little-endian bit stream over each row's
    uint32 words; w = scale · q + bias per group of `group_size` inputs. Returns float32 (out, in).

    Rows are unpacked a block at a time (DEQUANTIZE_CHUNK_VALUES codes), so the scratch memory beside the output
    stays a few megabytes whatever the tensor's size: the 30B's embedding holds 1.3 billion codes."""
    rows = packed.shape[0]
    raw = packed.contiguous().view(torch.uint8).reshape(rows, -1)
    columns = raw.shape[1] * 8 // bits
    # code i is bits [i·bits, (i+1)·bits) of its row's stream: within two bytes, as bits ≤ 8
    offsets = torch.arange(columns) * bits
    first_byte, shift = offsets // 8, (offsets % 8).to(torch.int32)
    mask = (1 << bits) - 1
    out = torch.empty(rows, columns, dtype=torch.float32)
    step = max(1, DEQUANTIZE_CHUNK_VALUES // max(columns, 1))
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        stream = raw[start:stop].to(torch.int32)
        stream = torch.cat([stream, torch.zeros(stop - start, 1, dtype=torch.int32)], dim=1)  # a last code's 2nd byte
        codes = ((stream[:, first_byte] | (stream[:, first_byte + 1] << 8)) >> shift) & mask
        q = codes.to(torch.float32).reshape(stop - start, -1, group_size)
        scale, bias = scales[start:stop].float()[:, :, None], biases[start:stop].float()[:, :, None]
        out[start:stop] = (q * scale + bias).reshape(stop - start, columns)
    return out
