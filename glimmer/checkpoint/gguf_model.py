"""A Muse Glimmer GGUF (llama.cpp's `muse-glimmer` architecture) as a validated config and canonical tensors.

Everything here follows llama.cpp's converter (`conversion/muse_glimmer.py`, class `MuseGlimmerModel`) and
its loader (`src/models/muse-glimmer.cpp`), as summarized in architecture.md §15.2:

* Metadata: the llama.cpp keys under `muse-glimmer.` (block_count, embedding_length, feed_forward_length,
  attention.head_count / head_count_kv / key_length / layer_norm_rms_epsilon, rope.freq_base,
  context_length, logit_scale = output_multiplier, final_logit_softcapping, attention.sliding_window and
  attention.sliding_window_pattern, one bool per layer, true = sliding window + RoPE, or, as llama.cpp also
  reads it, a period: the last layer of every `period` is full attention).
* The four per-layer sandwich norms are stored with the reference's +1 folded in (w + 1); the final norm
  is stored as is (§2.1, §14.1). Loading subtracts the 1 again.
* q and k are stored in ggml's interleaved (NORM) RoPE layout: the converter inverts transformers'
  `_permute_for_rope`, so loading applies it again (§5.4, §14.6).
* The QK-norm weights are synthetic (§15.2): attn_q_norm is filled with qk_scale_factor (3.87) and
  attn_k_norm with ones, so that llama.cpp's weighted RMSNorm reproduces weightless norm + q·3.87.
  Loading reads qk_scale_factor back from them and refuses anything that is not that shape.
* The attention gate is its own tensor (attn_gate), applied as sigmoid before attn_output (§2.5.8).
* The post-attention and post-FFN norm eps (1e-8) is not stored: llama.cpp hard-codes it, so it is a
  constant of the format here too (§2.1). So are the activation (SiLU) and the absence of biases.

Keys the converter always writes but an older or foreign writer may omit take the reference defaults
(architecture.md §1.1) and are reported in one warning; keys without a safe default are required and a
missing one is refused by name. The rope theta is never defaulted (10000 is not the release's 500000).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glimmer.checkpoint.config import (
    MMPROJ_OPTION,
    ModelConfig,
    TextConfig,
    reference_text_layer_types,
    too_many_layers,
)
from glimmer.checkpoint.config_common_fields import NEVER_FEATURES
from glimmer.checkpoint.gguf_file import (
    ABSENT_KEYS_TOOK_DEFAULTS,
    ARCHITECTURE_KEY,
    CONVERT_AGAIN,
    DRAFTER_ARCH,
    FLOAT_TYPES,
    MMPROJ_ARCH,
    MODEL_ARCH,
    GGUFFile,
    fields_as_gguf_keys,
    unread_keys_warning,
)
from glimmer.checkpoint.mapped_tensors import MappedTensor, MappedTensors
from glimmer.checkpoint.quantized_weights import QuantizedStorage
from glimmer.checkpoint.weight_layouts import interleaved_to_rotate_half
from glimmer.errors import ConfigError

logger = logging.getLogger(__name__)

ARCH = MODEL_ARCH
GGUF_LAYOUT = "gguf"
GGUF_ROPE_LAYOUT = "interleaved (ggml NORM; permuted to rotate-half on load)"
# llama.cpp's muse-glimmer graph hard-codes the post-attention / post-FFN norm eps (muse-glimmer.cpp)
POST_NORM_EPS = 1e-8

# optional keys → the reference default (architecture.md §1.1) taken, with one warning, when absent
_OPTIONAL_DEFAULTS = {
    "final_logit_softcapping": 20.0,
    "attention.sliding_window": 2048,
}


@dataclass(frozen=True)
class _Rule:
    """canonical parameter ← GGUF tensor. shape(config) is the canonical (torch) shape it must have.

    unfold: the stored weight is w + 1 (a folded centered norm); rope_heads: the config field giving the
    head count of an interleaved-RoPE projection.
    """

    target: str
    source: str
    shape: Callable[[TextConfig], tuple[int, ...]]
    unfold: bool = False
    rope_heads: str | None = None


_L = "model.language_model.layers.{i}."
_TEXT_RULES = (
    _Rule("model.language_model.embed_tokens.weight", "token_embd.weight", lambda t: (t.vocab_size, t.hidden_size)),
    _Rule("model.language_model.norm.weight", "output_norm.weight", lambda t: (t.hidden_size,)),
    _Rule("lm_head.weight", "output.weight", lambda t: (t.vocab_size, t.hidden_size)),
)
_LAYER_RULES = (
    _Rule(_L + "self_attn.q_proj.weight", "blk.{i}.attn_q.weight", lambda t: (t.q_size, t.hidden_size),
          rope_heads="num_attention_heads"),
    _Rule(_L + "self_attn.k_proj.weight", "blk.{i}.attn_k.weight", lambda t: (t.kv_size, t.hidden_size),
          rope_heads="num_key_value_heads"),
    _Rule(_L + "self_attn.v_proj.weight", "blk.{i}.attn_v.weight", lambda t: (t.kv_size, t.hidden_size)),
    _Rule(_L + "self_attn.o_proj.weight", "blk.{i}.attn_output.weight", lambda t: (t.hidden_size, t.q_size)),
    _Rule(_L + "self_attn.gate_proj.weight", "blk.{i}.attn_gate.weight", lambda t: (t.q_size, t.hidden_size)),
    _Rule(_L + "mlp.gate_proj.weight", "blk.{i}.ffn_gate.weight", lambda t: (t.intermediate_size, t.hidden_size)),
    _Rule(_L + "mlp.up_proj.weight", "blk.{i}.ffn_up.weight", lambda t: (t.intermediate_size, t.hidden_size)),
    _Rule(_L + "mlp.down_proj.weight", "blk.{i}.ffn_down.weight", lambda t: (t.hidden_size, t.intermediate_size)),
    _Rule(_L + "input_layernorm.weight", "blk.{i}.attn_norm.weight", lambda t: (t.hidden_size,), unfold=True),
    _Rule(_L + "post_attention_layernorm.weight", "blk.{i}.post_attention_norm.weight", lambda t: (t.hidden_size,),
          unfold=True),
    _Rule(_L + "pre_feedforward_layernorm.weight", "blk.{i}.ffn_norm.weight", lambda t: (t.hidden_size,),
          unfold=True),
    _Rule(_L + "post_feedforward_layernorm.weight", "blk.{i}.post_ffw_norm.weight", lambda t: (t.hidden_size,),
          unfold=True),
)
# read to recover qk_scale_factor and checked, never loaded as parameters (§15.2)
_QK_NORMS = ("blk.{i}.attn_q_norm.weight", "blk.{i}.attn_k_norm.weight")


@dataclass(frozen=True)
class GGUFModel:
    config: ModelConfig
    tensors: MappedTensors
    # GGML type name → number of tensors of that type, for `glimmer inspect`
    tensor_types: dict[str, int]
    # the mmproj's preprocessing settings, as a preprocessor_config.json dict (None without --mmproj)
    preprocessor_config: dict[str, Any] | None
    # the model file's quantized tensors (Q8_0, Q4_K, …), dequantized on load (None: all are float)
    quantized: QuantizedStorage | None


def describe_gguf_kind(file: GGUFFile) -> str:
    """general.architecture, refusing a file that is not a GGUF at all or has none."""
    if not file.has(ARCHITECTURE_KEY):
        raise file.error(f"required metadata key {ARCHITECTURE_KEY} is missing")
    return file.string(ARCHITECTURE_KEY)


def read_gguf_model(path: str | Path | GGUFFile, mmproj: str | Path | None = None) -> GGUFModel:
    """Open a Muse Glimmer GGUF (and an optional mmproj vision GGUF) as a config and canonical tensors.

    Raises CheckpointError / ConfigError, one line naming the key or value at fault; tensors that are missing,
    stray, misshapen or of a type Glimmer does not read are all listed in one error with the fix
    (weight_mismatch.py, as the safetensors loader's).
    """
    file = path if isinstance(path, GGUFFile) else GGUFFile(path)
    arch = describe_gguf_kind(file)
    if arch == MMPROJ_ARCH:
        raise file.error("this is a vision projector (mmproj) file; pass the model GGUF as the model and this "
                         f"file with {MMPROJ_OPTION}")
    if arch == DRAFTER_ARCH:
        raise file.error(f"this is a DFlash drafter GGUF (architecture {DRAFTER_ARCH!r}), not a Muse Glimmer model; "
                         "pass the model GGUF")
    if arch != ARCH:
        raise file.error(f"general.architecture={arch!r} is not Muse Glimmer (llama.cpp architecture {ARCH!r})")
    text, warnings = _text_config(file)
    entries, types = _text_tensors(file, text)
    vision = None
    if mmproj is not None:
        from glimmer.checkpoint.gguf_vision import IMAGE_TOKEN, VIDEO_TOKEN, read_mmproj

        vision = read_mmproj(mmproj, text)
        entries |= vision.entries
        for name, count in vision.tensor_types.items():
            types[name] = types.get(name, 0) + count
        warnings += vision.warnings
        # placeholder ids come from the vocabulary, by name (P-TOK-1; image_token_id is <|patch|>, §1.3)
        image_id, video_id = (_vocabulary_id(file, token) for token in (IMAGE_TOKEN, VIDEO_TOKEN))
    for warning in warnings:
        logger.warning("%s", warning)
    config = ModelConfig(
        text=text,
        vision=vision.config if vision else None,
        image_token_id=image_id if vision else None,
        video_token_id=video_id if vision else None,
        out_hidden_size=vision.out_hidden_size if vision else None,
        projector_hidden_size=vision.projector_hidden_size if vision else None,
        projector_hidden_act="gelu" if vision else None,
        config_layout=GGUF_LAYOUT,
        warnings=tuple(warnings),
        video_unsupported_reason=vision.video_unsupported_reason if vision else None,
    )
    size = file.total_bytes + (vision.total_bytes if vision is not None else 0)
    return GGUFModel(config, MappedTensors(file.path, entries, size), types,
                     vision.preprocessor_config if vision else None, _quantized_storage(file))


def _quantized_storage(file: GGUFFile) -> QuantizedStorage | None:
    """The model file's quantized tensors: their GGML types ("GGUF Q4_K/Q6_K") and bytes on disk."""
    quantized = [entry for entry in file.tensors.values() if entry.type_name not in FLOAT_TYPES]
    if not quantized:
        return None
    return QuantizedStorage(f"GGUF {'/'.join(sorted({entry.type_name for entry in quantized}))}",
                            sum(entry.num_bytes for entry in quantized))


def _vocabulary_id(file: GGUFFile, token: str) -> int:
    tokens = file.array("tokenizer.ggml.tokens", "STRING")
    try:
        return tokens.index(token)
    except ValueError:
        raise file.error(f"the vocabulary (tokenizer.ggml.tokens) has no {token}, which images need") from None


def _key(name: str) -> str:
    return f"{ARCH}.{name}"


def _text_config(file: GGUFFile) -> tuple[TextConfig, list[str]]:
    defaulted: list[str] = []
    notes: list[str] = _check_unread_keys(file)

    def optional(name: str) -> float | int:
        if file.has(_key(name)):
            # an integer key (the window, a UINT32 in llama.cpp) is read as one, not truncated from a float
            return file.integer(_key(name)) if isinstance(_OPTIONAL_DEFAULTS[name], int) else file.number(_key(name))
        defaulted.append(f"{_key(name)}={_OPTIONAL_DEFAULTS[name]!r}")
        return _OPTIONAL_DEFAULTS[name]

    n = refuse_too_many_layers(file, _key("block_count"), _positive(file, "block_count"), "the 30B has 52")
    hidden = _positive(file, "embedding_length")
    heads = _per_layer_constant(file, "attention.head_count", n)
    kv_heads = _per_layer_constant(file, "attention.head_count_kv", n)
    head_dim = _positive(file, "attention.key_length")
    refuse_other_head_sizes(file, ARCH, head_dim)
    theta = file.number(_key("rope.freq_base"))
    refuse_rope_scaling(file, ARCH)
    if file.has(_key("rope.freq_base_swa")):
        # llama.cpp rotates the sliding-window layers (the only RoPE layers) with freq_base_swa
        swa_theta = file.number(_key("rope.freq_base_swa"))
        if swa_theta != theta:
            notes.append(f"{file.path}: rope.freq_base_swa={swa_theta!r} is used for the RoPE layers "
                         f"(rope.freq_base={theta!r} only applies to NoPE layers)")
            theta = swa_theta
    if file.has(_key("attention.sliding_window_pattern")) and \
            not file.type_of(_key("attention.sliding_window_pattern")).startswith("ARRAY"):
        layer_types = _periodic_layer_types(file, n)
    elif file.has(_key("attention.sliding_window_pattern")):
        pattern = file.array(_key("attention.sliding_window_pattern"), "BOOL")
        if len(pattern) != n:
            raise file.error(f"{_key('attention.sliding_window_pattern')} has {len(pattern)} entries but "
                             f"block_count={n}")
        layer_types = tuple("sliding_attention" if swa else "full_attention" for swa in pattern)
    else:
        layer_types = reference_text_layer_types(n)
        defaulted.append(f"{_key('attention.sliding_window_pattern')}=<reference: full attention every 4th "
                         "layer counted back from the last>")
    embed = file.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise file.error("tensor token_embd.weight is missing or not a matrix")
    vocab = embed.shape[0]
    if file.has(_key("vocab_size")) and file.integer(_key("vocab_size")) != vocab:
        raise file.error(f"{_key('vocab_size')}={file.integer(_key('vocab_size'))} disagrees with "
                         f"token_embd.weight ({vocab} rows)")
    eos = _token_id(file, "tokenizer.ggml.eos_token_id", vocab, required=True)
    try:
        text = TextConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=_positive(file, "feed_forward_length"),
            num_hidden_layers=n,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            hidden_activation="silu",
            rms_norm_eps=file.number(_key("attention.layer_norm_rms_epsilon")),
            post_norm_eps=POST_NORM_EPS,
            rope_theta=theta,
            rope_scaling=None,  # a GGUF asking for scaled RoPE is refused (refuse_rope_scaling)
            sliding_window=optional("attention.sliding_window"),
            layer_types=layer_types,
            # llama.cpp applies RoPE exactly on the sliding-window layers (muse-glimmer.cpp: use_rope = is_swa)
            rope_layers=tuple(t == "sliding_attention" for t in layer_types),
            qk_scale_factor=_qk_scale_factor(file, n, head_dim),
            output_multiplier=file.number(_key("logit_scale")),
            final_logit_softcapping=optional("final_logit_softcapping"),
            attention_bias=False,
            tie_word_embeddings=False,
            max_position_embeddings=_positive(file, "context_length"),
            bos_token_id=_token_id(file, "tokenizer.ggml.bos_token_id", vocab, required=False),
            eos_token_id=(eos,),
            pad_token_id=_token_id(file, "tokenizer.ggml.padding_token_id", vocab, required=False),
        )
    except ConfigError as exc:
        keys = _FIELD_KEYS | {"rope_theta": _key("rope.freq_base_swa" if file.has(_key("rope.freq_base_swa"))
                                                 else "rope.freq_base")}
        raise file.error("the metadata describes an invalid model: "
                         f"{fields_as_gguf_keys(str(exc), keys, 'text_config')}") from None
    warnings = list(notes)
    if defaulted:
        warnings.insert(0, f"{file.path}: {ABSENT_KEYS_TOOK_DEFAULTS}: "
                           + ", ".join(defaulted))
    return text, warnings


# text config field → the GGUF key it is read from, for errors about a value of the file (rope_theta's is freq_base or
# freq_base_swa, whichever was read; vocab_size is token_embd.weight's rows, qk_scale_factor attn_q_norm's entries)
_FIELD_KEYS = {field: _key(name) for field, name in (
    ("hidden_size", "embedding_length"), ("intermediate_size", "feed_forward_length"),
    ("num_hidden_layers", "block_count"), ("num_attention_heads", "attention.head_count"),
    ("num_key_value_heads", "attention.head_count_kv"), ("head_dim", "attention.key_length"),
    ("rms_norm_eps", "attention.layer_norm_rms_epsilon"), ("sliding_window", "attention.sliding_window"),
    ("output_multiplier", "logit_scale"), ("final_logit_softcapping", "final_logit_softcapping"),
    ("max_position_embeddings", "context_length"),
)} | {"bos_token_id": "tokenizer.ggml.bos_token_id", "pad_token_id": "tokenizer.ggml.padding_token_id"}


# llama.cpp scales RoPE positions by 1/factor when a file carries one of these (llama_model::load_hparams reads them
# for every architecture; absent or 0 means 1), or by YaRN / LongRoPE when its scaling type says so
_ROPE_SCALING_FACTORS = ("rope.scaling.factor", "rope.scale_linear")
_UNSCALED_ROPE_TYPES = ("none", "linear")  # linear by a factor of 1 scales nothing
# the keys refuse_rope_scaling reads, under an architecture's prefix
ROPE_SCALING_KEYS = ("rope.scaling.type", *_ROPE_SCALING_FACTORS)


# llama.cpp's keys (under the architecture's prefix) for features Muse Glimmer lacks → config.json's flag of the same
# meaning (config_common_fields.NEVER_FEATURES), how the value is read, and the value that leaves the feature off;
# any other value is refused as that flag's is
_NEVER_KEYS: dict[str, tuple[str, Callable[[GGUFFile, str], Any], Any]] = {
    "attn_logit_softcapping": ("attn_logit_softcapping", GGUFFile.number, 0.0),
    "attention.causal": ("use_bidirectional_attention", GGUFFile.boolean, True),
}
# every key under `muse-glimmer.` that _text_config reads; any other is ignored with a warning, as config.json's
# unknown keys are
_READ_KEYS = frozenset(_key(name) for name in (
    "block_count", "embedding_length", "feed_forward_length", "context_length", "vocab_size", "logit_scale",
    "final_logit_softcapping", "attention.head_count", "attention.head_count_kv", "attention.key_length",
    "attention.value_length", "attention.layer_norm_rms_epsilon", "attention.sliding_window",
    "attention.sliding_window_pattern", "rope.dimension_count", "rope.freq_base", "rope.freq_base_swa",
    *ROPE_SCALING_KEYS, *_NEVER_KEYS,
))


def _check_unread_keys(file: GGUFFile) -> list[str]:
    """Refuse a key asking for a feature Muse Glimmer lacks, naming it; return the warning listing the keys under
    `muse-glimmer.` that Glimmer does not read (`expert_count`, ...), or none."""
    for name, (flag, read, off) in _NEVER_KEYS.items():
        if file.has(_key(name)) and (value := read(file, _key(name))) != off:
            raise file.error(f"{_key(name)}={value!r} is not supported; Muse Glimmer has no {NEVER_FEATURES[flag]}: "
                             f"remove the key or {CONVERT_AGAIN}")
    return unread_keys_warning(file, f"{ARCH}.", _READ_KEYS)


def refuse_too_many_layers(file: GGUFFile, key: str, n: int, largest: str) -> int:
    """n, the layer count read from `key`, refused naming the key when over config.MAX_LAYERS, as config.json's is:
    checked before anything is built per layer (10**9 layers without a pattern to go by took gigabytes). `largest`
    names the release's count for the error."""
    if problem := too_many_layers(key, n, largest):
        raise file.error(f"{problem}: the metadata is damaged; download the file again or {CONVERT_AGAIN}")
    return n


def refuse_other_head_sizes(file: GGUFFile, arch: str, head_dim: int) -> None:
    """Refuse a value_length or rope.dimension_count (under `arch`) other than key_length, `head_dim`: Muse Glimmer's
    values and rotary embedding span the whole head. Raises CheckpointError naming the key."""
    for same in ("attention.value_length", "rope.dimension_count"):
        key = f"{arch}.{same}"
        if file.has(key) and file.integer(key) != head_dim:
            raise file.error(f"{key}={file.integer(key)} differs from attention.key_length={head_dim}; "
                             "Muse Glimmer rotates and attends over the whole head")


def refuse_rope_scaling(file: GGUFFile, arch: str) -> None:
    """Refuse a file whose metadata asks for scaled RoPE: the released RoPE is plain ('default', architecture.md
    §1.1), and run unscaled such a file would answer otherwise than llama.cpp runs it, without a word. (A config.json's
    scalings run, `config_rope.py`; llama.cpp's keys do not map onto them exactly: its llama3 and longrope tables come
    as tensors, its yarn reads other defaults.) Raises CheckpointError naming the key."""
    fix = "Muse Glimmer's RoPE is unscaled ('default'): use a GGUF converted without RoPE scaling"
    for name in _ROPE_SCALING_FACTORS:
        key = f"{arch}.{name}"
        if file.has(key) and file.number(key) not in (0.0, 1.0):
            raise file.error(f"{key}={file.number(key)!r} asks for RoPE positions scaled by 1/{file.number(key)!r}, "
                             f"which Glimmer does not run; {fix}")
    key = f"{arch}.rope.scaling.type"
    if file.has(key) and file.string(key) not in _UNSCALED_ROPE_TYPES:
        raise file.error(f"{key}={file.string(key)!r} is not supported; {fix}")


def _periodic_layer_types(file: GGUFFile, n: int) -> tuple[str, ...]:
    """The layer types of a sliding_window_pattern given as a period, which llama.cpp's muse-glimmer loader reads
    before the bool array (set_swa_pattern): of every `period` layers the last is full attention; 0: none is."""
    key = _key("attention.sliding_window_pattern")
    period = file.integer(key)
    if period < 0:
        raise file.error(f"{key}={period} is invalid; expected a period ≥ 0 or one bool per layer")
    return tuple("sliding_attention" if period == 0 or i % period < period - 1 else "full_attention"
                 for i in range(n))


def _positive(file: GGUFFile, name: str) -> int:
    value = file.integer(_key(name))
    if value <= 0:
        raise file.error(f"{_key(name)}={value} is invalid; expected a positive integer")
    return value


def _per_layer_constant(file: GGUFFile, name: str, n: int) -> int:
    """A head count, stored as one integer or (llama.cpp's get_key_or_arr) one per layer, all equal."""
    if file.has(_key(name)) and file.type_of(_key(name)).startswith("ARRAY"):
        values = file.array(_key(name), "INTEGER")
        if len(values) != n or len(set(values)) != 1 or values[0] <= 0:
            raise file.error(f"{_key(name)}={values[:8]}… must give the same positive count for all {n} layers")
        return values[0]
    return _positive(file, name)


def _token_id(file: GGUFFile, key: str, vocab: int, *, required: bool) -> int | None:
    if not file.has(key):
        if required:
            raise file.error(f"required metadata key {key} is missing")
        return None
    value = file.integer(key)
    if not 0 <= value < vocab:
        raise file.error(f"{key}={value} is outside the vocabulary (0..{vocab - 1})")
    return value


def _qk_scale_factor(file: GGUFFile, n: int, head_dim: int) -> float:
    """Recover qk_scale_factor from the synthetic QK-norm weights and check their shape (§15.2)."""
    scale = None
    for i in range(n):
        q_name, k_name = (t.format(i=i) for t in _QK_NORMS)
        for name in (q_name, k_name):
            entry = file.tensors.get(name)
            if entry is None:
                raise file.error(f"tensor {name} is missing")
            if entry.shape != (head_dim,):
                raise file.error(f"tensor {name} has shape {list(entry.shape)}, expected [{head_dim}] "
                                 "(attention.key_length)")
        q, k = file.read(q_name), file.read(k_name)
        if not torch.equal(k, torch.ones_like(k)):
            raise file.error(f"tensor {k_name} is not all ones: Muse Glimmer's K norm is weightless, so this file "
                             "was not written by the llama.cpp converter's convention")
        if not torch.equal(q, q[:1].expand_as(q)) or not q[0] > 0:
            raise file.error(f"tensor {q_name} is not one positive constant: it must carry qk_scale_factor "
                             "(3.87) in every entry")
        if scale is None:
            scale = q[0]
        elif q[0] != scale:
            raise file.error(f"tensor {q_name} holds {float(q[0])!r} but layer 0 holds {float(scale)!r}; "
                             "qk_scale_factor is one value for all layers")
    assert scale is not None
    # stored as float32; the shortest decimal that round-trips it (3.87) is the configured value
    return float(str(np.float32(scale.item())))


def _text_tensors(file: GGUFFile, text: TextConfig) -> tuple[dict[str, MappedTensor], dict[str, int]]:
    """Canonical tensors of the text model; every GGUF tensor must be used, every shape must match."""
    rules = list(_TEXT_RULES) + [
        _Rule(r.target.format(i=i), r.source.format(i=i), r.shape, r.unfold, r.rope_heads)
        for i in range(text.num_hidden_layers)
        for r in _LAYER_RULES
    ]
    # the QK norms were read and checked with the metadata (_qk_scale_factor); here they only count as expected
    expected = {rule.source: rule.shape(text) for rule in rules}
    expected |= {t.format(i=i): (text.head_dim,) for i in range(text.num_hidden_layers) for t in _QK_NORMS}
    found = file.tensor_mismatch(expected)
    layers_beyond = sorted({int(m.group(1)) for s in set(file.tensors) - set(expected)
                            if (m := re.match(r"blk\.(\d+)\.", s)) and int(m.group(1)) >= text.num_hidden_layers})
    fix = None
    if layers_beyond:
        fix = (f"tensors for layers {layers_beyond[0]} to {layers_beyond[-1]} exist but "
               f"{_key('block_count')}={text.num_hidden_layers}: the metadata was edited or belongs to another "
               f"model; {CONVERT_AGAIN}")
    file.refuse_mismatch(found, fix=fix)
    entries = {
        # F16/BF16 are widened exactly and quantized types dequantized: the reader always returns float32
        rule.target: MappedTensor(
            file.tensor_info(rule.target, rule.shape(text), rule.source),
            _reader(file, rule.source, rule.unfold, getattr(text, rule.rope_heads) if rule.rope_heads else None),
        )
        for rule in rules
    }
    types: dict[str, int] = {}
    for name in file.tensors:
        types[file.tensors[name].type_name] = types.get(file.tensors[name].type_name, 0) + 1
    return entries, types


def _reader(file: GGUFFile, name: str, unfold: bool, rope_heads: int | None) -> Callable[[], torch.Tensor]:
    def read() -> torch.Tensor:
        tensor = file.read(name)
        if unfold:
            # the converter stored w + 1 (norm_shift); w = stored − 1 is exact for the 1 + w the model forms
            tensor = tensor - 1.0
        if rope_heads is not None:
            tensor = interleaved_to_rotate_half(tensor, rope_heads)
        return tensor

    return read


def gguf_quantization_summary(types: dict[str, int]) -> str:
    """'Q4_K ×150, Q6_K ×20, F32 ×40', most common first."""
    return ", ".join(f"{name} ×{count}" for name, count in sorted(types.items(), key=lambda kv: (-kv[1], kv[0])))
