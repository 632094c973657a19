"""Test support: write a tiny safetensors checkpoint as GGUF with `gguf.GGUFWriter`, the way llama.cpp's
converter does (conversion/muse_glimmer.py: MuseGlimmerModel, MuseGlimmerVisionModel), and pack the
K-quants that `gguf.quants` can only dequantize, following ggml's documented block layouts.

Converter conventions reproduced here: architecture 'muse-glimmer'; the four per-layer norms stored as
w + 1; q/k rows un-permuted to the interleaved RoPE layout; synthetic attn_q_norm = qk_scale_factor and
attn_k_norm = 1; logit_scale = output_multiplier; a bool sliding_window_pattern; the tokenizer as 'gpt2'
with pre 'llama4', [PAD{i}] UNUSED rows up to the embedding size, eot as its own id; 1-D tensors in F32;
generation_config.json's sampling defaults as general.sampling.*.
The mmproj: architecture 'clip', projector 'muse-glimmer', the patch embedding's two temporal slabs summed
into a (hidden, 3, p, p) conv weight, mm.0/1/2 for the adapter and projection.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer

from glimmer.checkpoint.config import ModelConfig
from glimmer.checkpoint.config_layouts import load_config
from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint
from glimmer.checkpoint.weight_layouts import rotate_half_to_interleaved

# llama.cpp's fallback when a row is not a whole number of K-quant super-blocks (llama-quant.cpp)
K_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
QK_K = 256


def canonical_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    files = SafetensorsCheckpoint(checkpoint)
    return {name: files.read(name).float() for name in files.names()}


def _encode(array: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    """The stored bytes/values of a 2-D float32 array in `qtype` (with llama.cpp's K-quant fallback)."""
    if qtype in K_FALLBACK and array.shape[-1] % QK_K:
        qtype = K_FALLBACK[qtype]
    if qtype == Q.F32:
        return array.astype(np.float32), qtype
    if qtype == Q.F16:
        return array.astype(np.float16), qtype
    if qtype in K_PACKERS:
        return K_PACKERS[qtype](array), qtype
    return gguf.quants.quantize(array, qtype), qtype


def export_text_gguf(checkpoint: Path, out: Path, tensor_type: Q = Q.F32, *, drop: tuple[str, ...] = ()) -> Path:
    config = load_config(checkpoint)
    text = config.text
    writer = gguf.GGUFWriter(out, "muse-glimmer")
    writer.add_block_count(text.num_hidden_layers)
    writer.add_context_length(text.max_position_embeddings)
    writer.add_embedding_length(text.hidden_size)
    writer.add_feed_forward_length(text.intermediate_size)
    writer.add_head_count(text.num_attention_heads)
    writer.add_head_count_kv(text.num_key_value_heads)
    writer.add_key_length(text.head_dim)
    writer.add_value_length(text.head_dim)
    writer.add_rope_freq_base(text.rope_theta)
    writer.add_layer_norm_rms_eps(text.rms_norm_eps)
    writer.add_final_logit_softcapping(text.final_logit_softcapping)
    writer.add_logit_scale(text.output_multiplier)
    writer.add_sliding_window(text.sliding_window)
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in text.layer_types])
    writer.add_file_type(int(tensor_type))
    _add_sampling_defaults(writer, checkpoint)
    _add_tokenizer(writer, checkpoint, config)
    for name, tensor in _text_tensors(canonical_state(checkpoint), config).items():
        if name in drop:
            continue
        array = tensor.numpy()
        if array.ndim == 1:
            writer.add_tensor(name, array.astype(np.float32))
            continue
        stored, stored_type = _encode(array, tensor_type)
        writer.add_tensor(name, stored, raw_dtype=stored_type if stored.dtype == np.uint8 else None)
    _write(writer)
    return out


def _write(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _text_tensors(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    text = config.text
    out = {
        "token_embd.weight": state["model.language_model.embed_tokens.weight"],
        "output_norm.weight": state["model.language_model.norm.weight"],
        "output.weight": state["lm_head.weight"],
    }
    for i in range(text.num_hidden_layers):
        p, b = f"model.language_model.layers.{i}.", f"blk.{i}."
        out[b + "attn_q.weight"] = rotate_half_to_interleaved(state[p + "self_attn.q_proj.weight"],
                                                              text.num_attention_heads)
        out[b + "attn_k.weight"] = rotate_half_to_interleaved(state[p + "self_attn.k_proj.weight"],
                                                              text.num_key_value_heads)
        out[b + "attn_v.weight"] = state[p + "self_attn.v_proj.weight"]
        out[b + "attn_output.weight"] = state[p + "self_attn.o_proj.weight"]
        out[b + "attn_gate.weight"] = state[p + "self_attn.gate_proj.weight"]
        out[b + "attn_q_norm.weight"] = torch.full((text.head_dim,), text.qk_scale_factor)
        out[b + "attn_k_norm.weight"] = torch.ones(text.head_dim)
        for hf, stored in (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "post_attention_norm"),
                           ("pre_feedforward_layernorm", "ffn_norm"), ("post_feedforward_layernorm", "post_ffw_norm")):
            out[b + stored + ".weight"] = state[p + hf + ".weight"] + 1.0  # the converter's norm_shift
        for hf, stored in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
            out[b + stored + ".weight"] = state[p + f"mlp.{hf}.weight"]
    return out


def _add_sampling_defaults(writer: gguf.GGUFWriter, checkpoint: Path) -> None:
    """generation_config.json's temperature / top_k / top_p / min_p as general.sampling.*, as llama.cpp's
    converter writes them (gguf.Keys.General.SAMPLING_*)."""
    path = checkpoint / "generation_config.json"
    generation = json.loads(path.read_text()) if path.is_file() else {}
    for field, add in (("temperature", writer.add_sampling_temp), ("top_k", writer.add_sampling_top_k),
                       ("top_p", writer.add_sampling_top_p), ("min_p", writer.add_sampling_min_p)):
        if generation.get(field) is not None:
            add(generation[field])


def _add_tokenizer(writer: gguf.GGUFWriter, checkpoint: Path, config: ModelConfig) -> None:
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    spec = json.loads((checkpoint / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    added = {t.content: t.special for t in tokenizer.get_added_tokens_decoder().values()}
    tokens, types = [], []
    for i in range(config.text.vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(token)
            kind = gguf.TokenType.NORMAL
            if token in added:
                kind = gguf.TokenType.CONTROL if added[token] else gguf.TokenType.USER_DEFINED
            types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama4")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    special = json.loads((checkpoint / "tokenizer_config.json").read_text())
    ids = tokenizer.get_vocab(with_added_tokens=True)
    writer.add_bos_token_id(ids[special["bos_token"]])
    writer.add_eos_token_id(ids[special["eos_token"]])
    writer.add_pad_token_id(ids[special["pad_token"]])
    writer.add_eot_token_id(ids["<|eot|>"])
    writer.add_eom_token_id(ids["<|eom|>"])
    writer.add_add_bos_token(True)
    writer.add_chat_template((checkpoint / "chat_template.jinja").read_text())


def export_mmproj_gguf(checkpoint: Path, out: Path, tensor_type: Q = Q.F32) -> Path:
    config = load_config(checkpoint)
    vision = config.vision
    assert vision is not None
    state = canonical_state(checkpoint)
    preprocessor = json.loads((checkpoint / "preprocessor_config.json").read_text())
    writer = gguf.GGUFWriter(out, "clip")
    writer.add_clip_has_vision_encoder(True)
    writer.add_clip_projector_type("muse-glimmer")
    writer.add_vision_projection_dim(config.text.hidden_size)
    writer.add_vision_image_size(vision.pos_emb_size * vision.patch_size * vision.merge_size)
    writer.add_vision_patch_size(vision.patch_size)
    writer.add_vision_embedding_length(vision.hidden_size)
    writer.add_vision_feed_forward_length(vision.intermediate_size)
    writer.add_vision_block_count(vision.num_hidden_layers)
    writer.add_vision_head_count(vision.num_attention_heads)
    writer.add_vision_attention_layernorm_eps(vision.layer_norm_eps)
    writer.add_vision_spatial_merge_size(vision.merge_size)
    writer.add_vision_image_mean(preprocessor["image_mean"])
    writer.add_vision_image_std(preprocessor["image_std"])
    writer.add_vision_max_pixels(preprocessor["max_image_tokens"] * (vision.patch_size * vision.merge_size) ** 2)
    heads, p, t = vision.num_attention_heads, vision.patch_size, vision.patch_temporal
    vt = "model.vision_tower."
    tensors = {
        # the converter's view(n_embd, pt, 3, ps, ps).sum(dim=1)
        "v.patch_embd.weight": state[vt + "patch_embedder.patch_embedding.weight"]
        .view(vision.hidden_size, t, 3, p, p).sum(dim=1),
        "v.position_embd.weight": state[vt + "patch_embedder.position_embedding_table.weight"],
        "mm.0.weight": state["model.vision_adapter.fc1.weight"],
        "mm.1.weight": state["model.vision_adapter.fc2.weight"],
        "mm.2.weight": state["model.vision_projection.weight"],
    }
    for part in ("weight", "bias"):
        tensors[f"v.pre_ln.{part}"] = state[vt + f"ln_pre.{part}"]
        tensors[f"v.post_ln.{part}"] = state[vt + f"ln_post.{part}"]
        for i in range(vision.num_hidden_layers):
            src, dst = f"{vt}layers.{i}.", f"v.blk.{i}."
            for hf, stored, rope in (("attn.q_proj", "attn_q", True), ("attn.k_proj", "attn_k", True),
                                     ("attn.v_proj", "attn_v", False), ("attn.proj", "attn_out", False),
                                     ("norm1", "ln1", False), ("norm2", "ln2", False),
                                     ("mlp.fc1", "ffn_up", False), ("mlp.fc2", "ffn_down", False)):
                tensor = state[src + f"{hf}.{part}"]
                tensors[dst + f"{stored}.{part}"] = rotate_half_to_interleaved(tensor, heads) if rope else tensor
    for name, tensor in tensors.items():
        array = tensor.numpy()
        if array.ndim == 2 and tensor_type != Q.F32:
            stored, stored_type = _encode(array, tensor_type)
            writer.add_tensor(name, stored, raw_dtype=stored_type if stored.dtype == np.uint8 else None)
        else:
            writer.add_tensor(name, array.astype(np.float32))
    _write(writer)
    return out


# --------------------------------------------------------------------------------------------------------
# K-quant packers: the inverse of gguf.quants' Q4_K / Q5_K / Q6_K dequantizers (ggml-common.h layouts).
# Scales are rounded up so every sub-block's range is covered: the error is at most half a step.


def _f16_up(x: np.ndarray) -> np.ndarray:
    """float16 values ≥ x (so that a scale never shrinks when stored)."""
    h = x.astype(np.float16)
    low = h.astype(np.float32) < x
    return np.where(low, np.nextafter(h, np.float16(np.inf)), h).astype(np.float16)


def _pack_scales_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per block into ggml's 12-byte layout (gguf Q4_K.get_scale_min, inverted)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return out


def _k_affine(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Shared Q4_K / Q5_K quantization of (n, 256) blocks into q ∈ [0, levels], 8 sub-blocks of 32."""
    sub = blocks.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0.0)
    hi = np.maximum(sub.max(axis=2), 0.0)
    dmin = _f16_up(np.maximum((-lo).max(axis=1), 1e-30) / 63)
    m = np.minimum(np.ceil(-lo / dmin.astype(np.float32)[:, None]), 63).astype(np.uint8)
    offset = dmin.astype(np.float32)[:, None] * m
    span = np.maximum(hi + offset, 1e-30) / levels
    d = _f16_up(span.max(axis=1) / 63)
    sc = np.clip(np.ceil(span / d.astype(np.float32)[:, None]), 1, 63).astype(np.uint8)
    step = d.astype(np.float32)[:, None] * sc
    q = np.clip(np.rint((sub + offset[:, :, None]) / step[:, :, None]), 0, levels).astype(np.uint8)
    return d, dmin, sc, m, q


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 8, 32) 4-bit values → 128 bytes: chunk c holds sub-block 2c (low) and 2c+1 (high)."""
    q = q.reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)


def pack_q4_k(array: np.ndarray) -> np.ndarray:
    blocks = array.reshape(-1, QK_K).astype(np.float32)
    d, dmin, sc, m, q = _k_affine(blocks, 15)
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8),
                          _pack_scales_k4(sc, m), _pack_nibbles(q)], axis=1)
    return out.reshape(*array.shape[:-1], -1)


def pack_q5_k(array: np.ndarray) -> np.ndarray:
    blocks = array.reshape(-1, QK_K).astype(np.float32)
    d, dmin, sc, m, q = _k_affine(blocks, 31)
    high = (q >> 4) & 1  # (n, 8, 32): bit j of byte i is sub-block j's element i
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= (high[:, j, :] << j).astype(np.uint8)
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8),
                          _pack_scales_k4(sc, m), qh, _pack_nibbles(q & 0x0F)], axis=1)
    return out.reshape(*array.shape[:-1], -1)


def pack_q6_k(array: np.ndarray) -> np.ndarray:
    blocks = array.reshape(-1, QK_K).astype(np.float32)
    sub = blocks.reshape(-1, 16, 16)
    # levels −32..31 around zero: the scale covers max/31 and −min/32
    span = np.maximum(np.maximum(sub.max(axis=2) / 31, -sub.min(axis=2) / 32), 1e-30)
    d = _f16_up(span.max(axis=1) / 127)
    scales = np.clip(np.ceil(span / d.astype(np.float32)[:, None]), 1, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None] * scales
    q = (np.clip(np.rint(sub / step[:, :, None]), -32, 31) + 32).astype(np.uint8).reshape(-1, QK_K)
    # element e: ql byte (e // 128) * 64 + e % 64, nibble (e % 128) // 64; qh byte (e // 128) * 32 + e % 32,
    # bits 2 · ((e % 128) // 32)
    ql = np.zeros((q.shape[0], 128), dtype=np.uint8)
    qh = np.zeros((q.shape[0], 64), dtype=np.uint8)
    for e in range(QK_K):
        low, high = q[:, e] & 0x0F, (q[:, e] >> 4) & 0x03
        ql[:, (e // 128) * 64 + e % 64] |= low << (4 * ((e % 128) // 64))
        qh[:, (e // 128) * 32 + e % 32] |= high << (2 * ((e % 128) // 32))
    out = np.concatenate([ql, qh, scales.view(np.uint8), d.reshape(-1, 1).view(np.uint8)], axis=1)
    return out.reshape(*array.shape[:-1], -1)


K_PACKERS = {Q.Q4_K: pack_q4_k, Q.Q5_K: pack_q5_k, Q.Q6_K: pack_q6_k}


def block_steps(raw: np.ndarray, qtype: Q) -> np.ndarray:
    """Per stored value, the quantization step of its (sub-)block, read from the packed bytes."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, size)
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        d = np.abs(blocks[:, :2].copy().view(np.float16).astype(np.float32))
        return np.repeat(d, block, axis=1).reshape(-1)
    if qtype in (Q.Q4_K, Q.Q5_K):
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        sc, _ = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
        return np.repeat(d * sc.astype(np.float32), 32, axis=1).reshape(-1)
    if qtype == Q.Q6_K:
        scales = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)
        d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
        return np.repeat(np.abs(d * scales), 16, axis=1).reshape(-1)
    raise ValueError(qtype)
