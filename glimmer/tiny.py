"""Write small random Muse Glimmer checkpoints: the test fixtures and the embedded default model.

A tiny checkpoint is a complete model directory — config.json in the chosen layout, weights in the
matching weight layout, a byte-level BPE tokenizer whose special tokens sit at ids of its own, a
generation config, and the project's own chat template — so every code path a real checkpoint takes
is exercised. Every weight is random, norms included (architecture.md §12.2: a freshly initialized
reference model has all-ones norms, which hides norm bugs).
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from glimmer.checkpoint.compressed_tensors import nvfp4_quantization_config, quantize_text_linears
from glimmer.checkpoint.config import (
    DrafterConfig,
    ModelConfig,
    TextConfig,
    VisionConfig,
    reference_rope_layers,
    reference_text_layer_types,
    reference_vision_layer_types,
)
from glimmer.checkpoint.config_layouts import config_to_dict
from glimmer.checkpoint.drafter import NATIVE_FILE
from glimmer.checkpoint.random_weights import fill_random_
from glimmer.checkpoint.safetensors_files import INDEX_FILE, SINGLE_FILE
from glimmer.checkpoint.tiny_tokenizer import TinyTokenizerInfo, write_tiny_tokenizer
from glimmer.checkpoint.weight_layouts import (
    CANONICAL,
    DRAFTER_CANONICAL,
    DRAFTER_NATIVE,
    LEGACY,
    NATIVE,
    locate,
    rotate_half_to_interleaved,
)
from glimmer.errors import ConfigError
from glimmer.model.drafter import DFlashDrafter
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

logger = logging.getLogger(__name__)

# `glimmer make-tiny --layout X` → (config.json layout, weight layout)
TINY_LAYOUTS: dict[str, tuple[str, str]] = {
    "canonical": ("canonical", CANONICAL),
    "legacy": ("canonical-text", LEGACY),
    "flat": ("flat", CANONICAL),
    "native": ("vendor", NATIVE),
}


@dataclass(frozen=True)
class TinySpec:
    """Sizes of a tiny model. The defaults give 8 layers (NoPE full attention at 3 and 7), GQA 2:1 and a
    32-token window, so ordinary test prompts cross the window."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    sliding_window: int = 32
    max_position_embeddings: int = 4096
    rope_theta: float = 500000.0
    # logits are scaled by 1/sqrt(hidden_size / output_base_width); the release's base width is 256 (§1.1)
    output_base_width: int = 16
    vocab_multiple: int = 64
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_num_hidden_layers: int = 4
    vision_num_attention_heads: int = 2
    # a 4×4 learned position grid gives 4×4-patch attention windows, so small images have ragged windows
    vision_pos_emb_size: int = 4
    projector_hidden_size: int = 48
    # small media budgets keep test prompts short
    max_image_tokens: int = 64
    max_video_frame_tokens: int = 16
    video_max_frames: int = 8


def tiny_model_config(tokens: TinyTokenizerInfo, spec: TinySpec = TinySpec(), *, vision: bool = False) -> ModelConfig:
    n = spec.num_hidden_layers
    vocab = math.ceil(tokens.vocab_size / spec.vocab_multiple) * spec.vocab_multiple
    text = TextConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=n,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        hidden_activation="silu",
        rms_norm_eps=1e-5,
        post_norm_eps=1e-8,
        rope_theta=spec.rope_theta,
        rope_scaling=None,
        sliding_window=spec.sliding_window,
        layer_types=reference_text_layer_types(n),
        rope_layers=reference_rope_layers(n),
        qk_scale_factor=3.87,
        output_multiplier=1 / math.sqrt(spec.hidden_size / spec.output_base_width),
        final_logit_softcapping=20.0,
        attention_bias=False,
        tie_word_embeddings=False,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokens.bos_token_id,
        eos_token_id=(tokens.eos_token_id,),
        pad_token_id=None,
    )
    if not vision:
        return ModelConfig(text=text, vision=None, image_token_id=None, video_token_id=None, out_hidden_size=None,
                           projector_hidden_size=None, projector_hidden_act=None)
    merge = 2
    vision_config = VisionConfig(
        hidden_size=spec.vision_hidden_size,
        intermediate_size=spec.vision_intermediate_size,
        num_hidden_layers=spec.vision_num_hidden_layers,
        num_attention_heads=spec.vision_num_attention_heads,
        patch_size=14,
        patch_temporal=2,
        merge_size=merge,
        pos_emb_size=spec.vision_pos_emb_size,
        rope_theta=10000.0,
        layer_norm_eps=1e-5,
        hidden_act="gelu",
        layer_types=reference_vision_layer_types(spec.vision_num_hidden_layers),
    )
    return ModelConfig(
        text=text,
        vision=vision_config,
        image_token_id=tokens.image_token_id,
        video_token_id=tokens.video_token_id,
        out_hidden_size=spec.vision_hidden_size * merge**2,
        projector_hidden_size=spec.projector_hidden_size,
        projector_hidden_act="gelu",
    )


def random_state_dict(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every canonical parameter drawn at random, scaled to keep activations O(1) (see random_weights)."""
    with torch.device("meta"):
        model = MuseGlimmerForConditionalGeneration(config)
    return _random_parameters(model, seed)


def _random_parameters(
    model: torch.nn.Module, seed: int, norm_neutral: float | None = None
) -> dict[str, torch.Tensor]:
    """Random tensors for every entry of `model.state_dict()`, drawn as random_weights.fill_random_ draws them
    (norm_neutral: the neutral value of every 1-D norm weight, when the names do not decide it)."""
    generator = torch.Generator().manual_seed(seed)
    return {name: fill_random_(torch.empty(tuple(meta.shape)), name, generator,
                               norm_neutral=norm_neutral).contiguous()
            for name, meta in model.state_dict().items()}


def to_weight_layout(
    state_dict: dict[str, torch.Tensor], config: ModelConfig | DrafterConfig, layout: str
) -> dict[str, torch.Tensor]:
    """Re-express canonical tensors in another weight layout (fusing and permuting as that layout does)."""
    sources: dict[str, list[tuple[tuple[int, int] | None, torch.Tensor]]] = {}
    for target, tensor in state_dict.items():
        where = locate(layout, target, config)
        if where is None:
            raise ConfigError(f"the {layout} weight layout cannot hold {target}")
        if where.rope_heads is not None:
            tensor = rotate_half_to_interleaved(tensor, where.rope_heads)
        sources.setdefault(where.source, []).append((where.rows, tensor))
    out = {}
    for source, parts in sources.items():
        if parts[0][0] is None:
            out[source] = parts[0][1].contiguous()
        else:
            out[source] = torch.cat([t for _, t in sorted(parts, key=lambda p: p[0][0])]).contiguous()
    return out


SEED_LIMIT = 2**64
"""Seeds of the random weights are 0 .. 2**64 - 1, what a torch generator takes (a negative seed would alias one)."""


def check_seed(seed: int) -> None:
    """Raises ConfigError unless `seed` can seed the random weights."""
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"seed={seed} (--seed) is out of range; choose a seed from 0 to 2**64 - 1")


def remove_weight_files(out: Path) -> list[Path]:
    """Delete the weights an earlier checkpoint left in `out` — every *.safetensors, the safetensors index and a
    native drafter's head.pt — and return them: a loader would read them instead of (or beside) new weights.
    Nothing else in `out` is touched."""
    stale = [p for p in (*sorted(out.glob("*.safetensors")), out / INDEX_FILE, out / NATIVE_FILE) if p.is_file()]
    for path in stale:
        path.unlink()
    if stale:
        logger.info("removed the earlier weights in %s: %s", out, ", ".join(p.name for p in stale))
    return stale


def check_num_shards(num_shards: int, num_tensors: int) -> None:
    """Raises ConfigError when `num_shards` shards of `num_tensors` tensors would leave a shard empty."""
    if num_shards > num_tensors:
        raise ConfigError(f"num_shards={num_shards} (--shards) is more than the {num_tensors} tensors of this "
                          f"checkpoint, so some shards would be empty; choose at most {num_tensors}")


def save_weights(tensors: dict[str, torch.Tensor], out_dir: Path, num_shards: int = 1) -> None:
    """model.safetensors, or num_shards files with a model.safetensors.index.json, each holding at least one
    tensor. Raises ConfigError, before writing anything, when there are fewer tensors than shards."""
    names = sorted(tensors)
    check_num_shards(num_shards, len(names))
    if num_shards <= 1:
        save_file(tensors, str(out_dir / SINGLE_FILE), metadata={"format": "pt"})
        return
    weight_map = {}
    for shard in range(num_shards):
        # even split: shard sizes differ by at most one, so none is empty
        chunk = names[shard * len(names) // num_shards : (shard + 1) * len(names) // num_shards]
        file = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: tensors[n] for n in chunk}, str(out_dir / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(chunk, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


# `glimmer make-tiny --preset`: the tiny test geometry, or the released 30B one (config only: its random
# weights are drawn on the device at load time with load_format="dummy")
PRESETS = ("tiny", "30b")
# `glimmer make-tiny --quantize`: none, or compressed-tensors NVFP4 W4A16
QUANTIZATIONS = (None, "nvfp4")
RELEASE_MEDIA_LIMITS = {"max_image_tokens": 4096, "max_video_frame_tokens": 144, "num_frames": 96}  # §6, §7


def released_30b_config() -> ModelConfig:
    """The released Muse-Glimmer-30B geometry, every field as the converter sets it (architecture.md §1.1–1.3)."""
    n = 52
    text = TextConfig(
        vocab_size=202048, hidden_size=6656, intermediate_size=19968, num_hidden_layers=n,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, hidden_activation="silu",
        rms_norm_eps=1e-5, post_norm_eps=1e-8, rope_theta=500000.0, rope_scaling=None, sliding_window=2048,
        layer_types=reference_text_layer_types(n), rope_layers=reference_rope_layers(n),
        qk_scale_factor=3.87, output_multiplier=0.19611613513818404, final_logit_softcapping=20.0,
        attention_bias=False, tie_word_embeddings=False, max_position_embeddings=131072,
        bos_token_id=200000, eos_token_id=(200001,), pad_token_id=None,
    )
    vision = VisionConfig(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=50, num_attention_heads=16, patch_size=14,
        patch_temporal=2, merge_size=2, pos_emb_size=32, rope_theta=10000.0, layer_norm_eps=1e-5,
        hidden_act="gelu", layer_types=reference_vision_layer_types(50),
    )
    return ModelConfig(text=text, vision=vision, image_token_id=200092, video_token_id=200091, out_hidden_size=6144,
                       projector_hidden_size=4096, projector_hidden_act="gelu")


def released_assistant_config() -> dict:
    """config.json of the released DFlash drafter, Muse-Glimmer-30B-assistant (architecture.md §1.4)."""
    return {
        "model_type": "muse_glimmer_assistant", "architectures": ["MuseGlimmerAssistantModel"],
        "hidden_size": 6656, "intermediate_size": 19968, "num_hidden_layers": 5, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "max_position_embeddings": 131072,
        "sliding_window": 2048, "layer_types": ["sliding_attention"] * 5, "attention_dropout": 0.0,
        "hidden_act": "silu", "bos_token_id": 200000, "eos_token_id": 200001, "pad_token_id": 200018,
        "block_size": 16, "mask_token_id": 201818, "target_layer_ids": [1, 13, 25, 37, 49],
    }


def write_tiny_checkpoint(
    out_dir: str | os.PathLike,
    *,
    layout: str = "canonical",
    vision: bool = False,
    seed: int = 0,
    spec: TinySpec = TinySpec(),
    num_shards: int = 1,
    dtype: torch.dtype = torch.float32,
    preset: str = "tiny",
    config_only: bool = False,
    quantize: str | None = None,
) -> Path:
    """Write a complete tiny checkpoint directory and return its path.

    quantize "nvfp4" stores every text decoder Linear as compressed-tensors NVFP4 W4A16 (`compressed_tensors.py`),
    with its quantization_config, as llm-compressor writes the published NVFP4 release.

    preset "30b" writes the released geometry (vision tower and a drafter config in `assistant/`
    included) with a tokenizer at the release's ids; it needs `config_only`, since its weights are drawn
    at load time (`load_format="dummy"`). `config_only` writes everything but the weights. Weights an
    earlier checkpoint left in `out_dir` are removed (see remove_weight_files). Raises ConfigError for an
    option out of range or that does not apply.
    """
    if layout not in TINY_LAYOUTS:
        raise ConfigError(f"layout={layout!r} is not one of {sorted(TINY_LAYOUTS)}")
    if preset not in PRESETS:
        raise ConfigError(f"preset={preset!r} is not one of {list(PRESETS)}")
    if preset == "30b" and not config_only:
        raise ConfigError("preset '30b' would write about 60 GB of random weights; pass --config-only and load it "
                          "with --load-format dummy, which draws the weights on the device")
    if num_shards < 1:
        raise ConfigError(f"num_shards={num_shards} (--shards) must be at least 1")
    if config_only and num_shards != 1:
        raise ConfigError(f"num_shards={num_shards} (--shards) does not apply with config_only (--config-only), "
                          "which writes no weights; leave one of them out")
    check_seed(seed)
    config_layout, weight_layout = TINY_LAYOUTS[layout]
    if quantize not in QUANTIZATIONS:
        raise ConfigError(f"quantize={quantize!r} (--quantize) is not one of {[q for q in QUANTIZATIONS if q]}")
    if quantize is not None and (config_only or weight_layout == NATIVE):
        given = "config_only (--config-only), which writes no weights" if config_only else (
            "the native layout (--layout native), whose fused MLP weight is no Linear module")
        raise ConfigError(f"quantize={quantize!r} (--quantize) does not apply with {given}; leave one of them out")
    release = preset == "30b"
    if (vision or release) and weight_layout == LEGACY:
        given = "vision=True (--vision)" if vision else "preset='30b' (--preset 30b)"
        raise ConfigError(f"the legacy layout (--layout legacy) is text-only, and {given} has a vision tower; use "
                          "--layout canonical, flat or native")
    # everything is built and checked before `out_dir` is touched: a refused option leaves it as it was
    with tempfile.TemporaryDirectory() as scratch:
        tokens = write_tiny_tokenizer(Path(scratch), release_ids=release)
    config = released_30b_config() if release else tiny_model_config(tokens, spec, vision=vision)
    weights = None
    if not config_only:
        weights = to_weight_layout({k: v.to(dtype) for k, v in random_state_dict(config, seed).items()}, config,
                                   weight_layout)
        if quantize is not None:
            weights = quantize_text_linears(weights, config, weight_layout)
        check_num_shards(num_shards, len(weights))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_weight_files(out)
    if write_tiny_tokenizer(out, release_ids=release) != tokens:
        raise RuntimeError("the tiny tokenizer came out differently twice")
    release_defaults = {"max_length": config.text.max_position_embeddings} if release else None
    write_model_config_files(out, config, tokens, config_layout=config_layout, generation_defaults=release_defaults)
    if quantize is not None:
        written = json.loads((out / "config.json").read_text())
        written["quantization_config"] = nvfp4_quantization_config()
        (out / "config.json").write_text(json.dumps(written, indent=2) + "\n")
    if config.has_vision:
        limits = RELEASE_MEDIA_LIMITS if release else {
            "max_image_tokens": spec.max_image_tokens, "max_video_frame_tokens": spec.max_video_frame_tokens,
            "num_frames": spec.video_max_frames}
        for name, settings in _preprocessor_configs(**limits).items():
            (out / name).write_text(json.dumps(settings, indent=2) + "\n")
    if release:
        (out / "assistant").mkdir(exist_ok=True)
        (out / "assistant" / "config.json").write_text(json.dumps(released_assistant_config(), indent=2) + "\n")
    if weights is not None:
        save_weights(weights, out, num_shards)
    return out


def write_model_config_files(
    out: Path,
    config: ModelConfig,
    tokens: TinyTokenizerInfo,
    *,
    config_layout: str = "canonical",
    generation_defaults: dict[str, object] | None = None,
) -> None:
    """config.json, generation_config.json (stop ids per P-TOK-2, plus `generation_defaults` such as a
    default temperature) and the project's chat_template.jinja, for a model whose tokenizer is in `out`."""
    (out / "config.json").write_text(json.dumps(config_to_dict(config, config_layout), indent=2) + "\n")
    generation = {
        "bos_token_id": tokens.bos_token_id,
        "eos_token_id": [tokens.eos_token_id, tokens.eot_token_id],
        "pad_token_id": tokens.pad_token_id,
        "do_sample": False,
        **(generation_defaults or {}),
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    from glimmer.protocol.builtin_template import builtin_template_source

    (out / "chat_template.jinja").write_text(builtin_template_source())


def _preprocessor_configs(max_image_tokens: int, max_video_frame_tokens: int, num_frames: int) -> dict[str, dict]:
    """Image and video processor configs in the reference processors' keys (architecture.md §6-7)."""
    common = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
              "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255, "resample": 1, "do_resize": True,
              "do_rescale": True, "do_normalize": True, "do_convert_rgb": True}
    return {
        "preprocessor_config.json": {**common, "image_processor_type": "MuseGlimmerImageProcessor",
                                     "max_image_tokens": max_image_tokens},
        "video_preprocessor_config.json": {**common, "video_processor_type": "MuseGlimmerVideoProcessor",
                                           "max_video_frame_tokens": max_video_frame_tokens,
                                           "num_frames": num_frames, "fps": 2.0, "do_sample_frames": True},
    }


# `glimmer make-tiny --drafter-for TARGET --layout X` → the drafter's weight layout
TINY_DRAFTER_LAYOUTS = {"canonical": DRAFTER_CANONICAL, "native": DRAFTER_NATIVE}


@dataclass(frozen=True)
class TinyDrafterSpec:
    """Sizes of a tiny DFlash drafter. Its hidden size is the target's; the small window makes ordinary
    test contexts cross it; block 6 drafts 5 tokens per step (tests stay fast; `RELEASE_BLOCK_DRAFTER` is
    what `glimmer make-tiny --drafter-for` writes)."""

    intermediate_size: int = 96
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    sliding_window: int = 24
    block_size: int = 6
    target_layer_ids: tuple[int, ...] = (1, 4, 6)
    rope_theta: float = 500000.0


RELEASE_BLOCK_DRAFTER = TinyDrafterSpec(block_size=16)
"""The tiny drafter with the release's block of 16 (architecture.md §1.4): up to 15 speculative tokens per
step, as the README's speculative example asks for."""


def tiny_drafter_config(target: ModelConfig, mask_token_id: int, spec: TinyDrafterSpec = TinyDrafterSpec()
                        ) -> DrafterConfig:
    return DrafterConfig(
        hidden_size=target.text.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_theta=spec.rope_theta,
        sliding_window=spec.sliding_window,
        layer_types=("sliding_attention",) * spec.num_hidden_layers,
        max_position_embeddings=target.text.max_position_embeddings,
        block_size=spec.block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=spec.target_layer_ids,
    )


def random_drafter_state_dict(config: DrafterConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every drafter parameter random; all its norms are plain-scale (neutral 1)."""
    with torch.device("meta"):
        model = DFlashDrafter(config)
    return _random_parameters(model, seed, norm_neutral=1.0)


def write_tiny_drafter(
    out_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    *,
    layout: str = "canonical",
    seed: int = 0,
    spec: TinyDrafterSpec = RELEASE_BLOCK_DRAFTER,
) -> Path:
    """Write a random DFlash drafter that fits the checkpoint at `target_dir`: config.json (HF keys) with
    model.safetensors (canonical) or head.pt (native: fused wqkv/fc1, interleaved RoPE rows). Weights an
    earlier checkpoint left in `out_dir` are removed (see remove_weight_files)."""
    from glimmer.checkpoint.drafter import RELEASED_MASK_TOKEN, drafter_config_to_dict
    from glimmer.checkpoint.formats import open_checkpoint
    from glimmer.engine.tokenizer import Tokenizer

    if layout not in TINY_DRAFTER_LAYOUTS:
        raise ConfigError(f"drafter layout={layout!r} is not one of {sorted(TINY_DRAFTER_LAYOUTS)}")
    check_seed(seed)
    target = open_checkpoint(target_dir, weights=False).config  # by its reader: a quantized target's too
    mask_token_id = Tokenizer.from_dir(target_dir).require_token_id(RELEASED_MASK_TOKEN)
    config = tiny_drafter_config(target, mask_token_id, spec)
    config.check_fits(target.text)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_weight_files(out)
    (out / "config.json").write_text(json.dumps(drafter_config_to_dict(config), indent=2) + "\n")
    weights = random_drafter_state_dict(config, seed)
    if layout == "native":
        torch.save(to_weight_layout(weights, config, DRAFTER_NATIVE), out / NATIVE_FILE)
    else:
        save_weights(weights, out)
    return out
