"""A DFlash drafter GGUF (llama.cpp architecture 'dflash') as the Hugging Face `muse_glimmer_assistant` config and
canonical state dict (architecture.md §1.4, §10.1), for the drafter loader to consume.

llama.cpp's converter (`conversion/muse_glimmer.py`, class `MuseGlimmerAssistantModel`) only renames:
`encoder.fc` → `fc`, `encoder.output_norm_enc` → `enc.output_norm`, and the Llama-style per-layer names
(blk.N.attn_norm / attn_q / attn_k / attn_v / attn_output / attn_q_norm / attn_k_norm / ffn_norm /
ffn_gate / ffn_up / ffn_down, output_norm). Unlike the target's, the drafter's q/k rows are NOT
un-permuted, so they stay in the HF rotate-half layout and load unchanged; its q_norm / k_norm are real
weights (§10.1). `dflash.target_layers` holds the target layer ids + 1 (the converter records the inputs
of the next layer), so 1 is subtracted. The drafter has no embedding table and no LM head: it borrows the
target's (§10.1), so the file must hold none.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from glimmer.checkpoint.gguf_file import (
    CONVERT_AGAIN,
    DRAFTER_ARCH,
    GGUF_ADVICE,
    GGUFFile,
    fields_as_gguf_keys,
    unread_keys_warning,
)
from glimmer.checkpoint.gguf_model import (
    ROPE_SCALING_KEYS,
    refuse_other_head_sizes,
    refuse_rope_scaling,
    refuse_too_many_layers,
)
from glimmer.checkpoint.mapped_tensors import MappedTensor, MappedTensors

ARCH = DRAFTER_ARCH
_GLOBAL = {"output_norm.weight": "norm.weight", "fc.weight": "encoder.fc.weight",
           "enc.output_norm.weight": "encoder.output_norm_enc.weight"}
_LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}

# drafter config field → the GGUF key it is read from, for errors about a value of the file (dflash.target_layers
# holds the ids + 1, so target_layer_ids keeps its name)
_FIELD_KEYS = {
    "num_hidden_layers": "block_count", "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base", "max_position_embeddings": "context_length", "block_size": "block_size",
    "sliding_window": "attention.sliding_window",
}
_FIELD_KEYS = {field: f"{ARCH}.{key}" for field, key in _FIELD_KEYS.items()} | {
    "mask_token_id": "tokenizer.ggml.mask_token_id"}


# every key read_gguf_drafter reads; any other under `dflash.` is named in a warning, as a model GGUF's are
_READ_KEYS = frozenset({*_FIELD_KEYS.values(), *(f"{ARCH}.{key}" for key in (
    "attention.value_length", "rope.dimension_count", "target_layers", "attention.sliding_window_pattern",
    *ROPE_SCALING_KEYS,
))})


def name_gguf_keys(message: str) -> str:
    """An error or warning about the drafter config read from a GGUF, each field named by the key the file holds it
    under (`block_size=0` → `dflash.block_size=0`; absent `sliding_window` → `dflash.attention.sliding_window`)."""
    return fields_as_gguf_keys(message, _FIELD_KEYS)


@dataclasses.dataclass(frozen=True)
class GGUFDrafter:
    """A DFlash drafter GGUF read as the HF drafter it was converted from."""

    config: dict[str, Any]  # config.json's dict, model_type muse_glimmer_assistant
    tensors: MappedTensors  # under the canonical HF names, read on demand as float32
    warnings: list[str]  # the one naming the `dflash.*` keys Glimmer does not read, if any


def read_gguf_drafter(path: str | Path) -> GGUFDrafter:
    """The drafter GGUF at `path` as its config.json dict, tensors and warnings. Feeds
    `glimmer.checkpoint.drafter.open_drafter_checkpoint`.

    Raises CheckpointError: one line for a missing or bad metadata key; for missing, stray or misshapen tensors,
    one error listing them all (weight_mismatch.py).
    """
    file = GGUFFile(path)
    arch = file.string("general.architecture")
    if arch != ARCH:
        raise file.error(f"general.architecture={arch!r} is not a DFlash drafter ({ARCH!r})")

    def key(name: str) -> str:
        return f"{ARCH}.{name}"

    n = refuse_too_many_layers(file, key("block_count"), file.integer(key("block_count")),
                               "the release's drafter has 5")
    hidden, inner = file.integer(key("embedding_length")), file.integer(key("feed_forward_length"))
    heads, kv_heads = file.integer(key("attention.head_count")), file.integer(key("attention.head_count_kv"))
    head_dim = file.integer(key("attention.key_length"))
    refuse_other_head_sizes(file, ARCH, head_dim)
    refuse_rope_scaling(file, ARCH)
    targets = [t - 1 for t in file.array(key("target_layers"), "INTEGER")]
    if any(t < 0 for t in targets):
        raise file.error(f"{key('target_layers')} must hold target layer ids + 1 (≥ 1)")
    window = file.integer(key("attention.sliding_window")) if file.has(key("attention.sliding_window")) else None
    pattern = (file.array(key("attention.sliding_window_pattern"), "BOOL")
               if file.has(key("attention.sliding_window_pattern")) else [True] * n)
    if len(pattern) != n:
        raise file.error(f"{key('attention.sliding_window_pattern')} has {len(pattern)} entries but block_count={n}")
    config: dict[str, Any] = {
        "model_type": "muse_glimmer_assistant",
        "architectures": ["MuseGlimmerAssistantModel"],
        "hidden_size": hidden,
        "intermediate_size": inner,
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": file.number(key("attention.layer_norm_rms_epsilon")),
        "rope_parameters": {"rope_type": "default", "rope_theta": file.number(key("rope.freq_base"))},
        "max_position_embeddings": file.integer(key("context_length")),
        "layer_types": ["sliding_attention" if swa else "full_attention" for swa in pattern],
        "block_size": file.integer(key("block_size")),
        "target_layer_ids": targets,
    }
    if file.has("tokenizer.ggml.mask_token_id"):  # else the drafter loader resolves the released mask token
        config["mask_token_id"] = file.integer("tokenizer.ggml.mask_token_id")
    if window is not None:
        config["sliding_window"] = window
    for name, stored in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                         ("pad_token_id", "padding_token_id")):
        if file.has(f"tokenizer.ggml.{stored}"):
            config[name] = file.integer(f"tokenizer.ggml.{stored}")

    shapes = {"norm.weight": (hidden,), "encoder.fc.weight": (hidden, len(targets) * hidden),
              "encoder.output_norm_enc.weight": (hidden,)}
    layer_shapes = {
        "input_layernorm": (hidden,), "self_attn.q_proj": (heads * head_dim, hidden),
        "self_attn.k_proj": (kv_heads * head_dim, hidden), "self_attn.v_proj": (kv_heads * head_dim, hidden),
        "self_attn.o_proj": (hidden, heads * head_dim), "self_attn.q_norm": (head_dim,),
        "self_attn.k_norm": (head_dim,), "post_attention_layernorm": (hidden,), "mlp.gate_proj": (inner, hidden),
        "mlp.up_proj": (inner, hidden), "mlp.down_proj": (hidden, inner),
    }
    sources = dict(_GLOBAL)
    for i in range(n):
        for stored, canonical in _LAYER.items():
            sources[f"blk.{i}.{stored}.weight"] = f"layers.{i}.{canonical}.weight"
            shapes[f"layers.{i}.{canonical}.weight"] = layer_shapes[canonical]
    found = file.tensor_mismatch({stored: shapes[canonical] for stored, canonical in sources.items()})
    file.refuse_mismatch(found, dataclasses.replace(GGUF_ADVICE, extra_fix=(
        "a DFlash drafter borrows the target's embedding and LM head and holds no others: load the drafter GGUF "
        f"published for the model, or {CONVERT_AGAIN}")))
    entries = {canonical: MappedTensor(file.tensor_info(canonical, shapes[canonical], stored),
                                       lambda stored=stored: file.read(stored))
               for stored, canonical in sources.items()}
    return GGUFDrafter(config, MappedTensors(file.path, entries, file.total_bytes),
                       unread_keys_warning(file, f"{ARCH}.", _READ_KEYS))
