"""The validated, layout-independent model configuration.

Every checkpoint layout is normalized (see `config_layouts.py`) into these dataclasses before anything
else sees it. They have no defaults: the normalizer must state every architecture field, so a field can
never be silently defaulted by accident. Each dataclass validates itself in `__post_init__` and raises
`ConfigError` naming the field and the fix.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from glimmer.errors import ConfigError, option_and_keyword

SUPPORTED_TEXT_ACTIVATIONS = ("silu", "swish")  # transformers' ACT2FN runs both as torch's silu
SUPPORTED_VISION_ACTIVATIONS = ("gelu",)
TEXT_LAYER_TYPES = ("full_attention", "sliding_attention")
VISION_LAYER_TYPES = ("full_attention", "window_attention")
# Each dataclass's sizes: positive integers, which every config.json layout must state (config_layouts.py).
TEXT_SIZE_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "sliding_window",
)
# A layer count is bounded before the per-layer patterns (layer types, the NoPE flags) are derived from it: the 30B
# has 52 layers, and a damaged file's 10**9 would take gigabytes and minutes before the weights were compared.
MAX_LAYERS = 4096
VISION_SIZE_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size", "patch_temporal",
    "merge_size", "pos_emb_size",
)


def reference_text_layer_types(num_layers: int) -> tuple[str, ...]:
    """Full attention on every 4th layer counted backward from the last — architecture.md §1.1."""
    return tuple(
        "full_attention" if (num_layers - 1 - i) % 4 == 0 else "sliding_attention" for i in range(num_layers)
    )


def reference_rope_layers(num_layers: int) -> tuple[bool, ...]:
    """RoPE everywhere except every 4th layer counted backward from the last (NoPE) — §1.1."""
    return tuple((num_layers - 1 - i) % 4 != 0 for i in range(num_layers))


def off_the_flat_pattern(layer_types: tuple[str, ...], rope_layers: tuple[bool, ...]) -> list[int]:
    """The layers the flat and vendor layouts cannot describe: full attention with RoPE, or sliding-window attention
    without it (those layouts put full attention exactly on their NoPE layers)."""
    return [i for i, (kind, rope) in enumerate(zip(layer_types, rope_layers, strict=True))
            if (kind == "full_attention") == rope]


def reference_vision_layer_types(num_layers: int) -> tuple[str, ...]:
    """Full attention on layers 3, 7, 11, … and always on the last one — architecture.md §1.2."""
    return tuple(
        "full_attention" if (i + 1) % 4 == 0 or i == num_layers - 1 else "window_attention"
        for i in range(num_layers)
    )


# Sizes and positions become torch int64 values: a larger one wraps (a sliding_window of 2**64 - 1 masked every key
# but the query's own, silently) or overflows deep inside the forward pass.
MAX_SIZE = 2**63 - 1
# One weight matrix's element count (a 4 TiB float32 matrix), as gguf_file.py bounds a GGUF's tensors: past it,
# building the model failed deep in torch ("Storage size calculation overflowed") before the weights were compared.
MAX_WEIGHT_ELEMENTS = 1 << 40


def too_many_layers(name: str, n: int, largest: str) -> str | None:
    """The problem of a layer count `n` (read from `name`) over MAX_LAYERS, or None: every reader (config.json, the
    drafter's, GGUF metadata) checks it before anything is built per layer and adds its own fix. `largest` names the
    release's count."""
    if n <= MAX_LAYERS:
        return None
    return f"{name}={n} is more layers than Glimmer builds (at most {MAX_LAYERS}; {largest})"


def _require_positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{owner}.{name}={value!r} is invalid; expected a positive integer")
    if value > MAX_SIZE:
        raise ConfigError(f"{owner}.{name}={value!r} is invalid; expected a positive integer of at most 2**63 - 1 "
                          "(torch's int64)")


def is_finite(value: Any) -> bool:
    """`math.isfinite`, false for an integer (or Fraction) past a float's range (10**400 written as digits), on which
    math.isfinite itself raises OverflowError."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A number a float holds as a finite value: not NaN or infinity (Python's json reads them), and no integer past
    a float's range (`is_finite`)."""
    return is_number(value) and is_finite(value)


def _require_positive_float(owner: str, name: str, value: Any) -> None:
    if not is_finite_number(value) or value <= 0:
        raise ConfigError(f"{owner}.{name}={value!r} is invalid; expected a positive finite number")


# the fix for sizes no model has; a GGUF's reader gives its own (gguf_file.fields_as_gguf_keys)
DAMAGED_CONFIG_FIX = "use the config.json published with the weights"
# the option naming a GGUF's vision projector file, as a refusal names it (read from the command line or LLM(...))
MMPROJ_OPTION = option_and_keyword("--mmproj")
# the warning's words for the config.json fields a config lacks (a GGUF's say gguf_file.ABSENT_KEYS_TOOK_DEFAULTS)
ABSENT_FIELDS_TOOK_DEFAULTS = "absent fields took transformers' defaults"


def _refuse_huge_weights(owner: str, matrices: dict[str, int]) -> None:
    """Refuse sizes that make a weight (named by its shape, as the config's fields multiply into it) of more than
    MAX_WEIGHT_ELEMENTS, before the model is built from them."""
    for shape, elements in matrices.items():
        if elements > MAX_WEIGHT_ELEMENTS:
            raise ConfigError(f"{owner} sizes make a weight of {shape} = {elements} elements, more than any "
                              f"checkpoint holds (at most 2**40): the config is damaged; {DAMAGED_CONFIG_FIX}")


@dataclass(frozen=True)
class RopeScaling:
    """A scaled RoPE: transformers' rope_parameters other than the default type, field by field as the file states
    them (None: absent). One table from these serves every RoPE layer, as the reference's does (architecture.md §2.5);
    `glimmer.model.rope` computes it."""

    rope_type: str
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    partial_rotary_factor: float | None = None

    def original_length(self, max_position_embeddings: int) -> int:
        """The pretraining length: the file's, else max_position_embeddings (transformers' standardization)."""
        return self.original_max_position_embeddings or max_position_embeddings

    def exact_positions(self, max_position_embeddings: int) -> int:
        """How many positions run exactly as the reference: longrope switches from its short to its long factors
        (for the whole sequence, cached keys included) once a sequence passes the pretraining length, which a KV
        cache cannot follow, so Glimmer stops there; the dynamic type equals the default table up to
        max_position_embeddings, past which Glimmer never runs; the other tables do not depend on the length."""
        if self.rope_type == "longrope":
            return min(self.original_length(max_position_embeddings), max_position_embeddings)
        return max_position_embeddings

    def as_json(self, theta: float) -> dict[str, Any]:
        """The rope_parameters object, as transformers reads it."""
        out: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": theta}
        if self.rope_type == "yarn":
            out["factor"] = None  # a key transformers requires, null when derived from the lengths
        for name, value in asdict(self).items():
            if name != "rope_type" and value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out


class _AttentionWidths:
    """Row counts of the q and k/v projections, for decoders with num_(key_value_)heads and head_dim."""

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


@dataclass(frozen=True)
class TextConfig(_AttentionWidths):
    """The text decoder (architecture.md §1.1, §2)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_activation: str
    rms_norm_eps: float
    # post-attention and post-FFN norms use this eps (1e-8 in the release), not rms_norm_eps — §2.1
    post_norm_eps: float
    rope_theta: float
    # None: the default RoPE; else transformers' scaled table of that type (RopeScaling)
    rope_scaling: RopeScaling | None
    sliding_window: int
    layer_types: tuple[str, ...]
    # rope_layers[i] is False on NoPE layers (the reference's layer_rope_theta[i] == 0) — §2.5; independent of
    # layer_types, as in the reference (the release puts full attention exactly on its NoPE layers)
    rope_layers: tuple[bool, ...]
    # the folded multiplier applied to q after QK-norm (3.87), on top of 1/sqrt(head_dim) — §15.1
    qk_scale_factor: float
    output_multiplier: float
    final_logit_softcapping: float
    attention_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    bos_token_id: int | None
    # empty where config.json says null: the stop ids then come from generation_config.json, else the tokenizer's
    # eos_token and <|eot|> (generation_config.py)
    eos_token_id: tuple[int, ...]
    pad_token_id: int | None

    def __post_init__(self) -> None:
        owner = "text_config"
        for name in (*TEXT_SIZE_FIELDS, "max_position_embeddings"):
            _require_positive_int(owner, name, getattr(self, name))
        for name in (
            "rms_norm_eps",
            "post_norm_eps",
            "rope_theta",
            "qk_scale_factor",
            "output_multiplier",
            "final_logit_softcapping",
        ):
            _require_positive_float(owner, name, getattr(self, name))
        if self.hidden_activation not in SUPPORTED_TEXT_ACTIVATIONS:
            raise ConfigError(
                f"{owner}.hidden_activation={self.hidden_activation!r} is not supported; "
                f"Muse Glimmer uses {SUPPORTED_TEXT_ACTIVATIONS[0]!r}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{owner}.num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; grouped-query attention needs whole groups"
            )
        if self.hidden_size % self.num_attention_heads:
            # the reference's validate_architecture refuses this too (§1.1)
            raise ConfigError(
                f"{owner}.hidden_size={self.hidden_size} is not a multiple of "
                f"num_attention_heads={self.num_attention_heads}; the reference refuses this config"
            )
        if self.head_dim % 2:
            raise ConfigError(f"{owner}.head_dim={self.head_dim} is odd; rotary embeddings need an even head_dim")
        if self.rope_scaling is not None:
            _check_rope_scaling(owner, self.rope_scaling, self.head_dim, self.rope_theta,
                                self.max_position_embeddings)
        _refuse_huge_weights(owner, {
            "vocab_size × hidden_size (embed_tokens, lm_head)": self.vocab_size * self.hidden_size,
            "num_attention_heads·head_dim × hidden_size (q_proj, gate_proj, o_proj)": self.q_size * self.hidden_size,
            "intermediate_size × hidden_size (the MLP)": self.intermediate_size * self.hidden_size,
        })
        n = self.num_hidden_layers
        if len(self.layer_types) != n:
            raise ConfigError(
                f"{owner}.layer_types has {len(self.layer_types)} entries but num_hidden_layers={n}; "
                "give one entry per layer or remove it to derive the reference pattern"
            )
        bad = sorted({t for t in self.layer_types if t not in TEXT_LAYER_TYPES})
        if bad:
            raise ConfigError(f"{owner}.layer_types contains {bad}; allowed values are {list(TEXT_LAYER_TYPES)}")
        if len(self.rope_layers) != n:
            raise ConfigError(
                f"{owner}: the NoPE pattern has {len(self.rope_layers)} entries but num_hidden_layers={n}"
            )
        for name in ("bos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{owner}.{name}={value!r} is invalid; expected a token id or null")
        if self.bos_token_id is not None and self.bos_token_id < 0:
            raise ConfigError(f"{owner}.bos_token_id={self.bos_token_id!r} is invalid; expected a token id or null")
        # a BOS id names a row of the embedding (prompts start with it), as the eos ids do (generation_config.py);
        # pad_token_id is left alone: converted checkpoints often set it to vocab_size or -1, ids no prompt carries,
        # which transformers and vLLM load
        if self.bos_token_id is not None and self.bos_token_id >= self.vocab_size:
            raise ConfigError(f"{owner}.bos_token_id={self.bos_token_id} is outside the model's vocabulary "
                              f"(vocab_size={self.vocab_size}); the config and the model do not match: set the "
                              "tokenizer's BOS id")

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def sliding_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "sliding_attention")


def _check_rope_scaling(owner: str, scaling: RopeScaling, head_dim: int, theta: float,
                        max_position_embeddings: int) -> None:
    """What the reference's table needs of the head: where it would fail (a ZeroDivisionError, a broadcast error in
    the attention), the config is refused here instead."""
    name = f"{owner}.rope_parameters"
    for key in ("short_factor", "long_factor"):
        factors = getattr(scaling, key)
        if factors is not None and len(factors) not in (1, head_dim // 2):
            raise ConfigError(f"{name}.{key} has {len(factors)} entries; expected head_dim/2 = {head_dim // 2} "
                              "(one per rotated pair) or 1")
    if scaling.rope_type == "dynamic" and head_dim <= 2:
        raise ConfigError(f"{name}.rope_type='dynamic' needs head_dim > 2 (its base is raised to the power "
                          f"head_dim/(head_dim-2)); head_dim={head_dim}")
    if scaling.rope_type == "longrope" and scaling.attention_factor is None:
        original = scaling.original_length(max_position_embeddings)
        factor = scaling.factor or max_position_embeddings / original
        if factor > 1 and original == 1:
            raise ConfigError(f"{name}.original_max_position_embeddings=1 leaves longrope's attention factor "
                              "undefined (it divides by log(original_max_position_embeddings)); give "
                              f"{name}.attention_factor or a longer original length")
    if scaling.rope_type == "proportional" and (scaling.partial_rotary_factor or 1.0) > 1:
        raise ConfigError(f"{name}.partial_rotary_factor={scaling.partial_rotary_factor!r} is more than the whole "
                          "head; expected at most 1")
    if scaling.rope_type == "llama3" and 0 in (scaling.low_freq_factor, scaling.high_freq_factor):
        raise ConfigError(f"{name}.low_freq_factor and high_freq_factor must not be 0 (llama3 RoPE divides the "
                          "original length by each)")
    if scaling.rope_type == "llama3" and scaling.low_freq_factor == scaling.high_freq_factor:
        raise ConfigError(f"{name}.low_freq_factor and high_freq_factor are both {scaling.low_freq_factor!r}; llama3 "
                          "RoPE divides by their difference")
    if scaling.rope_type == "yarn" and theta == 1:
        raise ConfigError(f"{name}.rope_type='yarn' needs rope_theta other than 1 (its correction range divides by "
                          "log(rope_theta))")


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower (architecture.md §1.2, §4)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    patch_size: int
    patch_temporal: int
    merge_size: int
    # the learned position grid is square in every released checkpoint; the reference assumes it (§1.2)
    pos_emb_size: int
    rope_theta: float
    layer_norm_eps: float
    hidden_act: str
    layer_types: tuple[str, ...]

    def __post_init__(self) -> None:
        owner = "vision_config"
        for name in VISION_SIZE_FIELDS:
            _require_positive_int(owner, name, getattr(self, name))
        for name in ("rope_theta", "layer_norm_eps"):
            _require_positive_float(owner, name, getattr(self, name))
        if self.hidden_act not in SUPPORTED_VISION_ACTIVATIONS:
            raise ConfigError(
                f"{owner}.hidden_act={self.hidden_act!r} is not supported; Muse Glimmer's vision tower uses 'gelu'"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{owner}.hidden_size={self.hidden_size} is not a multiple of "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.head_dim % 4:
            raise ConfigError(
                f"{owner}.hidden_size={self.hidden_size} / num_attention_heads={self.num_attention_heads} gives heads "
                f"of {self.head_dim}, not a multiple of 4 as the 2-D axial rotary embedding needs"
            )
        _refuse_huge_weights(owner, {
            "patch_temporal·3·patch_size² × hidden_size (patch_embedding)": self.patch_dim * self.hidden_size,
            "pos_emb_size² × hidden_size (position_embedding_table)": self.pos_emb_size**2 * self.hidden_size,
            "hidden_size × hidden_size (q_proj, k_proj, v_proj, proj)": self.hidden_size**2,
            "intermediate_size × hidden_size (the MLP)": self.intermediate_size * self.hidden_size,
        })
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"{owner}.layer_types has {len(self.layer_types)} entries but "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        bad = sorted({t for t in self.layer_types if t not in VISION_LAYER_TYPES})
        if bad:
            raise ConfigError(f"{owner}.layer_types contains {bad}; allowed values are {list(VISION_LAYER_TYPES)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patch_dim(self) -> int:
        """Length of one flattened (t, c, py, px) patch row."""
        return self.patch_temporal * 3 * self.patch_size**2


@dataclass(frozen=True)
class ModelConfig:
    """A whole Muse Glimmer checkpoint: the text decoder and, when present, the vision path."""

    text: TextConfig
    vision: VisionConfig | None
    image_token_id: int | None
    video_token_id: int | None
    out_hidden_size: int | None
    projector_hidden_size: int | None
    projector_hidden_act: str | None
    # how config.json was laid out, and what the normalizer had to say about it
    config_layout: str = field(default="canonical", compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    # set when the vision weights cannot encode videos: a GGUF mmproj's patch embedding has the two temporal
    # slabs summed, which is exact for images (one frame duplicated) and wrong for videos. The engine
    # refuses video inputs with this text.
    video_unsupported_reason: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.vision is None:
            stray = [
                name
                for name in ("image_token_id", "video_token_id", "out_hidden_size", "projector_hidden_size",
                             "projector_hidden_act")
                if getattr(self, name) is not None
            ]
            if stray:
                raise ConfigError(f"{', '.join(stray)} set on a config without a vision tower; leave them None")
            return
        for name in ("image_token_id", "video_token_id", "out_hidden_size", "projector_hidden_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name}={value!r} is invalid; a checkpoint with a vision tower needs it")
        if self.projector_hidden_size == 0:  # 0 is a token id, but a layer of no width
            raise ConfigError("projector_hidden_size=0 is invalid; expected a positive integer, the width of the "
                              "vision adapter's layers")
        merged = self.vision.hidden_size * self.vision.merge_size**2
        if self.out_hidden_size != merged:
            # the vision fields by their values: ModelConfig's errors rename only their leading field as the file
            # names it, and a flat config has no vision_config
            raise ConfigError(
                f"out_hidden_size={self.out_hidden_size} does not match the merged vision width, the vision tower's "
                f"hidden size {self.vision.hidden_size} × its merge size {self.vision.merge_size}² = {merged}; the "
                "adapter weights cannot be formed"
            )
        _refuse_huge_weights("config", {
            "projector_hidden_size × out_hidden_size (vision_adapter.fc1)":
                self.projector_hidden_size * self.out_hidden_size,
            "projector_hidden_size × projector_hidden_size (vision_adapter.fc2)": self.projector_hidden_size**2,
            "text_config.hidden_size × projector_hidden_size (vision_projection)":
                self.text.hidden_size * self.projector_hidden_size,
        })
        if self.projector_hidden_act not in SUPPORTED_VISION_ACTIVATIONS:
            raise ConfigError(
                f"projector_hidden_act={self.projector_hidden_act!r} is not supported; expected 'gelu'"
            )

    @property
    def has_vision(self) -> bool:
        return self.vision is not None

    @property
    def no_vision_fix(self) -> str:
        """What to do about images sent to a model without a vision tower, for the error that refuses them: a GGUF
        keeps its vision tower in a separate mmproj file."""
        if self.config_layout == "gguf" and self.vision is None:
            return f"; a GGUF's vision tower is a separate mmproj file: pass it with {MMPROJ_OPTION}"
        return ""

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly view for `glimmer inspect`."""
        out = asdict(self)
        out.pop("warnings")
        return out


DRAFTER_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class DrafterConfig(_AttentionWidths):
    """The DFlash drafter, `muse_glimmer_assistant` (architecture.md §1.4, §10).

    It has no embedding table and no lm_head of its own: it reads raw rows of the target's embedding
    and its output goes through the target's lm_head, so it only fits a target whose hidden size and
    vocabulary match (`check_fits`).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    # every layer attends bidirectionally; a sliding layer only to keys with |Δposition| <= sliding_window
    sliding_window: int
    layer_types: tuple[str, ...]
    max_position_embeddings: int
    # 1 anchor + (block_size - 1) mask tokens per draft: block_size - 1 drafted tokens
    block_size: int
    mask_token_id: int
    # 0-indexed target decoder layers whose outputs are concatenated, in this order, as the context
    target_layer_ids: tuple[int, ...]
    # only when the config states one (the reference's config class has no such field)
    vocab_size: int | None = None
    config_layout: str = field(default="canonical", compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        owner = "drafter config"
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "sliding_window", "max_position_embeddings"):
            _require_positive_int(owner, name, getattr(self, name))
        for name in ("rms_norm_eps", "rope_theta"):
            _require_positive_float(owner, name, getattr(self, name))
        if self.hidden_act != "silu":
            raise ConfigError(
                f"{owner}.hidden_act={self.hidden_act!r} is not supported; the DFlash drafter uses 'silu'"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{owner}.num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"{owner}.head_dim={self.head_dim} is odd; rotary embeddings need an even head_dim")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"{owner}.layer_types has {len(self.layer_types)} entries but num_hidden_layers="
                f"{self.num_hidden_layers}"
            )
        bad = sorted({t for t in self.layer_types if t not in DRAFTER_LAYER_TYPES})
        if bad:
            raise ConfigError(f"{owner}.layer_types contains {bad}; allowed values are {list(DRAFTER_LAYER_TYPES)}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 2:
            raise ConfigError(f"{owner}.block_size={self.block_size!r} is invalid; expected an integer >= 2 "
                              "(one anchor and at least one mask token)")
        if isinstance(self.mask_token_id, bool) or not isinstance(self.mask_token_id, int) or self.mask_token_id < 0:
            raise ConfigError(f"{owner}.mask_token_id={self.mask_token_id!r} is invalid; expected a token id")
        if not self.target_layer_ids or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.target_layer_ids
        ):
            raise ConfigError(f"{owner}.target_layer_ids={list(self.target_layer_ids)!r} is invalid; expected a "
                              "non-empty list of target layer indices")
        if self.vocab_size is not None:
            _require_positive_int(owner, "vocab_size", self.vocab_size)
        _refuse_huge_weights(owner, {
            "num_attention_heads·head_dim × hidden_size (q_proj, o_proj)": self.q_size * self.hidden_size,
            "intermediate_size × hidden_size (the MLP)": self.intermediate_size * self.hidden_size,
            "len(target_layer_ids)·hidden_size × hidden_size (fc)":
                len(self.target_layer_ids) * self.hidden_size**2,
        })

    @property
    def num_draft_tokens(self) -> int:
        """Tokens one drafter step proposes: the block minus its anchor."""
        return self.block_size - 1

    @property
    def max_visible_distance(self) -> int | None:
        """How far (in positions, either way) a drafter query may look: the sliding window, or None when a
        layer attends without a window."""
        return None if "full_attention" in self.layer_types else self.sliding_window

    def check_fits(self, target: TextConfig) -> None:
        """Raise ConfigError, with the numbers, unless this drafter can run on `target`."""
        problems = []
        if self.hidden_size != target.hidden_size:
            problems.append(f"hidden_size={self.hidden_size} but the target's hidden_size is {target.hidden_size} "
                            "(the drafter reads the target's embeddings and feeds its lm_head)")
        if self.vocab_size is not None and self.vocab_size != target.vocab_size:
            problems.append(f"vocab_size={self.vocab_size} but the target's vocab_size is {target.vocab_size}")
        if self.mask_token_id >= target.vocab_size:
            problems.append(f"mask_token_id={self.mask_token_id} is outside the target's vocabulary "
                            f"[0, {target.vocab_size})")
        outside = [i for i in self.target_layer_ids if i >= target.num_hidden_layers]
        if outside:
            problems.append(f"target_layer_ids={list(self.target_layer_ids)} name layers {outside} but the target "
                            f"has {target.num_hidden_layers} layers (0-{target.num_hidden_layers - 1})")
        if problems:
            raise ConfigError("the drafter does not fit the target model: " + "; ".join(problems))
