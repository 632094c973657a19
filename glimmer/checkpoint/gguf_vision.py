"""A Muse Glimmer mmproj GGUF (llama.cpp's vision projector file) as a vision config and canonical tensors.

Conventions of llama.cpp's converter (`conversion/muse_glimmer.py`, class `MuseGlimmerVisionModel`) and of
gguf-py's vision tensor names (architecture.md §15.2, §4, §5.3):

* Metadata under `clip.vision.*`: embedding_length, feed_forward_length, block_count,
  attention.head_count, attention.layer_norm_epsilon, patch_size, spatial_merge_size, projection_dim
  (the text width), image_mean / image_std; `clip.projector_type` is 'muse-glimmer'.
* Tensors: v.patch_embd, v.position_embd, v.pre_ln, v.post_ln, v.blk.N.{attn_q, attn_k, attn_v,
  attn_out, ln1, ln2, ffn_up, ffn_down}, and the three projector matrices mm.0 (adapter fc1), mm.1
  (adapter fc2), mm.2 (vision_projection).
* q and k (weights and biases) are stored in the interleaved RoPE layout and permuted back on load (§5.4).
* The patch embedding is stored as a conv2d (hidden, 3, p, p): the converter SUMMED the two temporal
  slabs (t = 0, 1) of the (hidden, 2·3·p·p) linear. For an image the processor duplicates the frame into
  both slabs, so W0·x + W1·x = (W0 + W1)·x and loading [W0 + W1, 0] is exact; a video's two frames
  differ, and the separate slabs cannot be recovered. Videos are therefore refused for an mmproj tower
  (`ModelConfig.video_unsupported_reason`); they need the safetensors checkpoint's vision weights.
* Not stored, constants of the format: the 2-frame temporal patch, the axial RoPE theta (10000), exact
  GELU, the window / full layer pattern (§1.2) and the adapter's activation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glimmer.checkpoint.config import MMPROJ_OPTION, TextConfig, VisionConfig, reference_vision_layer_types
from glimmer.checkpoint.gguf_file import (
    ARCHITECTURE_KEY,
    CONVERT_AGAIN,
    MMPROJ_ARCH,
    GGUFFile,
    fields_as_gguf_keys,
    unread_keys_warning,
)
from glimmer.checkpoint.mapped_tensors import MappedTensor
from glimmer.checkpoint.weight_layouts import interleaved_to_rotate_half
from glimmer.errors import ConfigError

PROJECTOR_TYPE = "muse-glimmer"
PATCH_TEMPORAL = 2
VISION_ROPE_THETA = 10000.0
IMAGE_TOKEN = "<|patch|>"
VIDEO_TOKEN = "<|video|>"
# the release's image preprocessing (architecture.md §6), for an mmproj that lacks the keys giving it
REFERENCE_NORMALIZATION = (0.5, 0.5, 0.5)  # image_mean and image_std: pixel = (x/255 − 0.5)/0.5
REFERENCE_MAX_IMAGE_TOKENS = 4096
VIDEO_UNSUPPORTED = (
    "videos need the safetensors checkpoint's vision tower: the GGUF mmproj's patch embedding has the two "
    "temporal slabs summed, which is exact for images only"
)

# vision config field → the mmproj key it is read from, for errors about a value of the file
_FIELD_KEYS = {field: f"clip.vision.{name}" for field, name in (
    ("hidden_size", "embedding_length"), ("intermediate_size", "feed_forward_length"),
    ("num_hidden_layers", "block_count"), ("num_attention_heads", "attention.head_count"),
    ("patch_size", "patch_size"), ("merge_size", "spatial_merge_size"),
    ("layer_norm_eps", "attention.layer_norm_epsilon"),
)}

# llama.cpp's flags choosing the vision MLP's activation → the value that means Muse Glimmer's exact GELU
# (architecture.md §1.2, hidden_act "gelu"); any other asks for another model
_ACTIVATION_KEYS = {"clip.use_gelu": True, "clip.use_silu": False}

# every clip.* key read_mmproj reads, and clip.vision.image_size, llama.cpp's warm-up image (Glimmer sizes each image by
# image_max_pixels); any other is ignored with a warning, as the model GGUF's unread muse-glimmer.* keys are
_READ_KEYS = frozenset({
    "clip.projector_type", "clip.vision.projector_type", "clip.has_vision_encoder", "clip.vision.projection_dim",
    "clip.vision.image_size", "clip.vision.image_mean", "clip.vision.image_std", "clip.vision.image_max_pixels",
    *_FIELD_KEYS.values(), *_ACTIVATION_KEYS,
})


@dataclass(frozen=True)
class MmprojVision:
    config: VisionConfig
    entries: dict[str, MappedTensor]
    tensor_types: dict[str, int]
    warnings: list[str]
    out_hidden_size: int
    projector_hidden_size: int
    # preprocessor_config.json equivalent, read by glimmer.multimodal.load_media_settings
    preprocessor_config: dict[str, Any]
    total_bytes: int  # the file's size, or every part's of a split one
    video_unsupported_reason: str = VIDEO_UNSUPPORTED


def read_mmproj(path: str | Path, text: TextConfig) -> MmprojVision:
    """Open an mmproj GGUF for the text model `text`; CheckpointError names the key or tensor at fault."""
    file = GGUFFile(path)
    if not file.has(ARCHITECTURE_KEY) or file.string(ARCHITECTURE_KEY) != MMPROJ_ARCH:
        raise file.error(f"{MMPROJ_OPTION} expects a vision projector GGUF ({ARCHITECTURE_KEY} "
                         f"{MMPROJ_ARCH!r})")
    projector = file.string("clip.projector_type") if file.has("clip.projector_type") else (
        file.string("clip.vision.projector_type") if file.has("clip.vision.projector_type") else None)
    if projector != PROJECTOR_TYPE:
        raise file.error(f"clip.projector_type={projector!r} is not Muse Glimmer's {PROJECTOR_TYPE!r}")
    if file.has("clip.has_vision_encoder") and not file.boolean("clip.has_vision_encoder"):
        raise file.error("clip.has_vision_encoder is false; this mmproj has no vision tower")
    for key, gelu in _ACTIVATION_KEYS.items():
        if file.has(key) and (value := file.boolean(key)) != gelu:
            raise file.error(f"{key}={value} is not supported; Muse Glimmer's vision tower uses exact GELU: remove "
                             f"the key or {CONVERT_AGAIN}")

    def positive(key: str) -> int:
        value = file.integer(key)
        if value <= 0:
            raise file.error(f"{key}={value} is invalid; expected a positive integer")
        return value

    hidden = positive("clip.vision.embedding_length")
    layers = positive("clip.vision.block_count")
    patch = positive("clip.vision.patch_size")
    merge = positive("clip.vision.spatial_merge_size")
    if file.has("clip.vision.projection_dim") and file.integer("clip.vision.projection_dim") != text.hidden_size:
        raise file.error(f"clip.vision.projection_dim={file.integer('clip.vision.projection_dim')} does not match "
                         f"the model's embedding_length={text.hidden_size}; the mmproj belongs to another model")
    position = _entry(file, "v.position_embd.weight", 2)
    side = math.isqrt(position.shape[0])
    if side * side != position.shape[0] or position.shape[1] != hidden:
        raise file.error(f"tensor v.position_embd.weight has shape {list(position.shape)}; expected a square grid "
                         f"[P·P, {hidden}]")
    adapter_in = _entry(file, "mm.0.weight", 2)
    try:
        config = VisionConfig(
            hidden_size=hidden,
            intermediate_size=positive("clip.vision.feed_forward_length"),
            num_hidden_layers=layers,
            num_attention_heads=positive("clip.vision.attention.head_count"),
            patch_size=patch,
            patch_temporal=PATCH_TEMPORAL,
            merge_size=merge,
            pos_emb_size=side,
            rope_theta=VISION_ROPE_THETA,
            layer_norm_eps=file.number("clip.vision.attention.layer_norm_epsilon"),
            hidden_act="gelu",
            layer_types=reference_vision_layer_types(layers),
        )
    except ConfigError as exc:
        raise file.error("the metadata describes an invalid vision tower: "
                         f"{fields_as_gguf_keys(str(exc), _FIELD_KEYS, 'vision_config')}") from None
    projector_hidden = adapter_in.shape[0]
    out_hidden = hidden * merge**2
    entries = _vision_tensors(file, config, text, projector_hidden, out_hidden)
    types: dict[str, int] = {}
    for entry in file.tensors.values():
        types[entry.type_name] = types.get(entry.type_name, 0) + 1
    preprocessor: dict[str, Any] = {"patch_size": patch, "temporal_patch_size": PATCH_TEMPORAL, "merge_size": merge}
    defaulted = []
    # checked here, where the error can name the file and its key (the preprocessing settings would name fields
    # of a preprocessor_config.json the user does not have)
    for key, name in (("clip.vision.image_mean", "image_mean"), ("clip.vision.image_std", "image_std")):
        if not file.has(key):  # llama.cpp's clip loader requires them
            preprocessor[name] = list(REFERENCE_NORMALIZATION)
            defaulted.append(f"{key}={preprocessor[name]}")
            continue
        values = file.array(key, "NUMBER")
        if len(values) != 3 or not all(math.isfinite(v) and (v > 0 or name == "image_mean") for v in values):
            raise file.error(f"{key}={values} is invalid; expected three finite numbers (R, G, B)"
                             + (", each positive" if name == "image_std" else ""))
        preprocessor[name] = values
    merged_patch = (patch * merge) ** 2  # llama.cpp's image token budget: max pixels / (patch · merge)² merged tokens
    if file.has("clip.vision.image_max_pixels"):
        max_pixels = file.integer("clip.vision.image_max_pixels")
        if max_pixels < merged_patch:
            raise file.error(f"clip.vision.image_max_pixels={max_pixels} is invalid; expected at least one merged "
                             f"patch, (patch_size · spatial_merge_size)² = {merged_patch} pixels")
        preprocessor["max_image_tokens"] = max_pixels // merged_patch
    else:
        preprocessor["max_image_tokens"] = REFERENCE_MAX_IMAGE_TOKENS
        defaulted.append(f"clip.vision.image_max_pixels={REFERENCE_MAX_IMAGE_TOKENS * merged_patch} "
                         f"({REFERENCE_MAX_IMAGE_TOKENS} tokens an image)")
    warnings = [f"{file.path}: metadata keys absent from the mmproj took the reference values: {', '.join(defaulted)}"
                ] if defaulted else []
    warnings += unread_keys_warning(file, "clip.", _READ_KEYS)
    return MmprojVision(config, entries, types, warnings, out_hidden, projector_hidden, preprocessor,
                        file.total_bytes)


def _entry(file: GGUFFile, name: str, rank: int) -> Any:
    entry = file.tensors.get(name)
    if entry is None:
        raise file.error(f"tensor {name} is missing")
    if len(entry.shape) != rank:
        raise file.error(f"tensor {name} has shape {list(entry.shape)}; expected rank {rank}")
    return entry


_VT = "model.vision_tower."


def _vision_tensors(
    file: GGUFFile, vision: VisionConfig, text: TextConfig, projector_hidden: int, out_hidden: int
) -> dict[str, MappedTensor]:
    v, inner, heads = vision.hidden_size, vision.intermediate_size, vision.num_attention_heads
    p = vision.patch_size
    # canonical name → (GGUF name, canonical shape, stored shape, transform)
    table: list[tuple[str, str, tuple[int, ...], tuple[int, ...], Callable[[torch.Tensor], torch.Tensor] | None]] = [
        (_VT + "patch_embedder.patch_embedding.weight", "v.patch_embd.weight", (v, vision.patch_dim), (v, 3, p, p),
         _unsum_temporal_slabs),
        (_VT + "patch_embedder.position_embedding_table.weight", "v.position_embd.weight",
         (vision.pos_emb_size**2, v), (vision.pos_emb_size**2, v), None),
        ("model.vision_adapter.fc1.weight", "mm.0.weight", (projector_hidden, out_hidden),
         (projector_hidden, out_hidden), None),
        ("model.vision_adapter.fc2.weight", "mm.1.weight", (projector_hidden, projector_hidden),
         (projector_hidden, projector_hidden), None),
        ("model.vision_projection.weight", "mm.2.weight", (text.hidden_size, projector_hidden),
         (text.hidden_size, projector_hidden), None),
    ]
    for part in ("weight", "bias"):
        table += [(_VT + f"{norm}.{part}", f"v.{stored}.{part}", (v,), (v,), None)
                  for norm, stored in (("ln_pre", "pre_ln"), ("ln_post", "post_ln"))]
    unpermute = lambda t: interleaved_to_rotate_half(t, heads)  # noqa: E731 - §5.4, weights and biases
    for i in range(vision.num_hidden_layers):
        layer, blk = f"{_VT}layers.{i}.", f"v.blk.{i}."
        for part in ("weight", "bias"):
            bias = part == "bias"
            table += [
                (layer + f"attn.q_proj.{part}", blk + f"attn_q.{part}", (v,) if bias else (v, v),
                 (v,) if bias else (v, v), unpermute),
                (layer + f"attn.k_proj.{part}", blk + f"attn_k.{part}", (v,) if bias else (v, v),
                 (v,) if bias else (v, v), unpermute),
                (layer + f"attn.v_proj.{part}", blk + f"attn_v.{part}", (v,) if bias else (v, v),
                 (v,) if bias else (v, v), None),
                (layer + f"attn.proj.{part}", blk + f"attn_out.{part}", (v,) if bias else (v, v),
                 (v,) if bias else (v, v), None),
                (layer + f"norm1.{part}", blk + f"ln1.{part}", (v,), (v,), None),
                (layer + f"norm2.{part}", blk + f"ln2.{part}", (v,), (v,), None),
                (layer + f"mlp.fc1.{part}", blk + f"ffn_up.{part}", (inner,) if bias else (inner, v),
                 (inner,) if bias else (inner, v), None),
                (layer + f"mlp.fc2.{part}", blk + f"ffn_down.{part}", (v,) if bias else (v, inner),
                 (v,) if bias else (v, inner), None),
            ]
    file.refuse_mismatch(file.tensor_mismatch({source: stored_shape for _, source, _, stored_shape, _ in table}))
    entries = {target: MappedTensor(file.tensor_info(target, canonical_shape, source), _reader(file, source, transform))
               for target, source, canonical_shape, _, transform in table}
    return entries


def _unsum_temporal_slabs(summed: torch.Tensor) -> torch.Tensor:
    """(hidden, 3, p, p) conv weight → (hidden, 2·3·p·p) linear in (t, c, py, px) order: [W0 + W1, 0]."""
    flat = summed.reshape(summed.shape[0], -1)
    return torch.cat([flat, torch.zeros_like(flat)], dim=1)


def _reader(file: GGUFFile, name: str, transform: Callable[[torch.Tensor], torch.Tensor] | None):
    def read() -> torch.Tensor:
        tensor = file.read(name)
        return transform(tensor) if transform is not None else tensor

    return read
