"""config.json layouts → ModelConfig and back (glimmer/checkpoint/config_layouts.py).

transformers 5.23 is the oracle for the canonical layouts: its config classes must accept what we write,
derive the same layer patterns, and what it saves must normalize without a warning.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import MuseGlimmerConfig, MuseGlimmerTextConfig

from glimmer.checkpoint.config import (
    ModelConfig,
    TextConfig,
    VisionConfig,
    reference_rope_layers,
    reference_text_layer_types,
    reference_vision_layer_types,
)
from glimmer.checkpoint.config_layouts import CONFIG_LAYOUTS, config_to_dict, load_config, normalize_config
from glimmer.errors import ConfigError

RELEASE_THETA = {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
RELEASE_FULL_LAYERS = tuple(range(3, 52, 4))
# TextConfig fields that MuseGlimmerTextConfig holds under the same name and meaning
SAME_NAMED_TEXT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_activation",
    "rms_norm_eps",
    "post_norm_eps",
    "sliding_window",
    "qk_scale_factor",
    "output_multiplier",
    "final_logit_softcapping",
    "attention_bias",
    "max_position_embeddings",
    "bos_token_id",
    "pad_token_id",
)


def tiny_text(**changes) -> TextConfig:
    n = changes.pop("num_hidden_layers", 4)
    rope_layers = changes.pop("rope_layers", reference_rope_layers(n))
    fields = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=n,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_activation="silu",
        rms_norm_eps=1e-5,
        post_norm_eps=1e-8,
        rope_theta=500000.0,
        rope_scaling=None,
        sliding_window=8,
        layer_types=tuple("sliding_attention" if rope else "full_attention" for rope in rope_layers),
        rope_layers=rope_layers,
        qk_scale_factor=3.87,
        output_multiplier=0.19611613513818404,
        final_logit_softcapping=20.0,
        attention_bias=False,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=(2,),
        pad_token_id=None,
    )
    return TextConfig(**(fields | changes))


def tiny_vision(**changes) -> VisionConfig:
    n = changes.pop("num_hidden_layers", 4)
    fields = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=n,
        num_attention_heads=2,
        patch_size=14,
        patch_temporal=2,
        merge_size=2,
        pos_emb_size=4,
        rope_theta=10000.0,
        layer_norm_eps=1e-5,
        hidden_act="gelu",
        layer_types=reference_vision_layer_types(n),
    )
    return VisionConfig(**(fields | changes))


def tiny_model(vision: bool = True, **text_changes) -> ModelConfig:
    if not vision:
        return ModelConfig(tiny_text(**text_changes), None, None, None, None, None, None)
    return ModelConfig(tiny_text(**text_changes), tiny_vision(), 10, 11, 128, 48, "gelu")


def text_only(config: ModelConfig) -> ModelConfig:
    return replace(
        config,
        vision=None,
        image_token_id=None,
        video_token_id=None,
        out_hidden_size=None,
        projector_hidden_size=None,
        projector_hidden_act=None,
    )


def assert_same_config(got: ModelConfig, expected: ModelConfig) -> None:
    assert replace(got, config_layout=expected.config_layout) == expected


def hf_tiny_config() -> MuseGlimmerConfig:
    """The tiny VLM of architecture.md §12.3, built by the reference classes."""
    text = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        **RELEASE_THETA,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        patch_size=14,
        patch_temporal=2,
        merge_size=2,
        pos_emb_height=4,
        pos_emb_width=4,
        max_position_embeddings=16,
    )
    return MuseGlimmerConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=10,
        video_token_id=11,
        out_hidden_size=128,
        projector_hidden_size=48,
    )


def release_config() -> ModelConfig:
    return normalize_config(MuseGlimmerConfig(text_config=RELEASE_THETA).to_dict())


def expect_error(raw: dict, *fragments: str) -> str:
    with pytest.raises(ConfigError) as info:
        normalize_config(raw)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


# ---------------------------------------------------------------------------------------------------------
# Round trips


@st.composite
def model_configs(draw, *, any_nope_pattern: bool = False) -> ModelConfig:
    n = draw(st.integers(1, 9))
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([16, 32, 64, 128]))
    if any_nope_pattern:
        rope_layers = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    else:
        rope_layers = reference_rope_layers(n)
    text = tiny_text(
        vocab_size=draw(st.integers(16, 1024)),
        hidden_size=heads * draw(st.integers(1, 6)) * 8,
        intermediate_size=draw(st.integers(1, 300)),
        num_hidden_layers=n,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=draw(st.sampled_from([1e-5, 1e-6])),
        post_norm_eps=draw(st.sampled_from([1e-8, 1e-6])),
        rope_theta=draw(st.sampled_from([10000.0, 500000.0, 123456.5])),
        sliding_window=draw(st.integers(1, 64)),
        rope_layers=rope_layers,
        # the canonical layouts need qk < √head_dim, the flat ones qk ≥ 1 with ≤ 12 significant digits
        qk_scale_factor=draw(st.sampled_from([3.87, 1.0, 2.5, 1.234567])),
        output_multiplier=draw(st.sampled_from([0.19611613513818404, 0.5])),
        final_logit_softcapping=draw(st.sampled_from([20.0, 30.0])),
        attention_bias=draw(st.booleans()),
        tie_word_embeddings=draw(st.booleans()),
        max_position_embeddings=draw(st.integers(1, 4096)),
        bos_token_id=draw(st.none() | st.integers(0, 15)),
        eos_token_id=tuple(draw(st.lists(st.integers(0, 15), min_size=1, max_size=3))),
        pad_token_id=draw(st.none() | st.integers(0, 15)),
    )
    if not draw(st.booleans()):
        return ModelConfig(text, None, None, None, None, None, None)
    vision_layers = draw(st.integers(1, 7))
    vision_heads = draw(st.integers(1, 3))
    merge = draw(st.sampled_from([1, 2]))
    period = draw(st.integers(1, 5))
    vision = tiny_vision(
        hidden_size=vision_heads * draw(st.sampled_from([4, 8, 12])),
        intermediate_size=draw(st.integers(1, 200)),
        num_hidden_layers=vision_layers,
        num_attention_heads=vision_heads,
        patch_size=draw(st.sampled_from([2, 14])),
        patch_temporal=draw(st.sampled_from([1, 2])),
        merge_size=merge,
        pos_emb_size=draw(st.integers(1, 8)),
        layer_types=tuple(
            "full_attention" if (i + 1) % period == 0 or i == vision_layers - 1 else "window_attention"
            for i in range(vision_layers)
        ),
    )
    return ModelConfig(
        text,
        vision,
        image_token_id=draw(st.integers(0, 15)),
        video_token_id=draw(st.integers(0, 15)),
        out_hidden_size=vision.hidden_size * merge**2,
        projector_hidden_size=draw(st.integers(1, 64)),
        projector_hidden_act="gelu",
    )


def expressible_layouts(config: ModelConfig) -> tuple[str, ...]:
    layouts = ["canonical", "vendor"]
    if config.vision is None:
        layouts.append("canonical-text")
    if config.text.rope_layers == reference_rope_layers(config.text.num_hidden_layers):
        layouts.append("flat")
    return tuple(layouts)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(model_configs())
def test_reference_pattern_configs_round_trip_through_every_layout_that_can_express_them(config):
    assert set(expressible_layouts(config)) == set(CONFIG_LAYOUTS) - ({"canonical-text"} if config.vision else set())
    for layout in expressible_layouts(config):
        written = config_to_dict(config, layout)
        json.dumps(written)  # it is config.json content
        read = normalize_config(written)
        assert read.config_layout == layout
        assert read.warnings == ()
        assert_same_config(read, config)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(model_configs(any_nope_pattern=True))
def test_any_nope_pattern_round_trips_where_expressible_and_is_refused_elsewhere(config):
    for layout in expressible_layouts(config):
        assert_same_config(normalize_config(config_to_dict(config, layout)), config)
    if "flat" not in expressible_layouts(config):
        with pytest.raises(ConfigError, match="NoPE pattern other than the reference"):
            config_to_dict(config, "flat")


def test_layout_names_are_the_interface():
    assert CONFIG_LAYOUTS == ("canonical", "canonical-text", "flat", "vendor")


def test_vision_config_cannot_be_written_in_the_text_only_layout():
    with pytest.raises(ConfigError, match="canonical-text layout .* is text-only"):
        config_to_dict(tiny_model(), "canonical-text")


def test_unknown_layout_name_is_refused_by_the_writer():
    with pytest.raises(ConfigError, match="unknown config layout 'native'"):
        config_to_dict(tiny_model(), "native")


def test_qk_outside_a_layouts_convention_cannot_be_written():
    small = tiny_model(qk_scale_factor=0.5)
    assert_same_config(normalize_config(config_to_dict(small, "canonical")), small)
    with pytest.raises(ConfigError, match="qk_scale_factor=0.5 cannot be written in the flat layout"):
        config_to_dict(small, "flat")
    large = tiny_model(qk_scale_factor=5.0)  # ≥ √16
    assert_same_config(normalize_config(config_to_dict(large, "vendor")), large)
    with pytest.raises(ConfigError, match="not below √head_dim"):
        config_to_dict(large, "canonical")


def test_vision_constants_the_flat_layouts_lack_cannot_be_written_there():
    config = replace(tiny_model(), vision=tiny_vision(rope_theta=20000.0))
    assert_same_config(normalize_config(config_to_dict(config, "canonical")), config)
    with pytest.raises(ConfigError, match="vision_config.rope_theta=20000.0 cannot be written in the flat layout"):
        config_to_dict(config, "flat")
    irregular = replace(
        tiny_model(),
        vision=tiny_vision(layer_types=("full_attention", "window_attention", "window_attention", "full_attention")),
    )
    with pytest.raises(ConfigError, match="vision_sparse_attention_factor"):
        config_to_dict(irregular, "vendor")


def test_text_only_config_with_vision_path_ids_is_refused():
    with pytest.raises(ConfigError, match="image_token_id set on a config without a vision tower"):
        replace(tiny_model(vision=False), image_token_id=10)


def test_vendor_writer_states_the_nope_period_when_there_is_one():
    written = config_to_dict(tiny_model(num_hidden_layers=8), "vendor")
    assert written["every_n_layers_nope"] == 4
    assert written["no_rope_layers"] == [1, 1, 1, 0, 1, 1, 1, 0]
    assert written["rope_is_neox_style"] is False
    irregular = (True, False, False, True, False)
    assert "every_n_layers_nope" not in config_to_dict(tiny_model(num_hidden_layers=5, rope_layers=irregular), "vendor")


# ---------------------------------------------------------------------------------------------------------
# transformers as the oracle


def test_canonical_dict_is_accepted_by_transformers_with_the_same_layer_patterns():
    irregular = (True, False, True, True, False, True)
    tied = tiny_model(tie_word_embeddings=True)
    for config in (tiny_model(), tiny_model(num_hidden_layers=6, rope_layers=irregular), tied):
        written = config_to_dict(config, "canonical")
        for hf in (MuseGlimmerConfig(**copy.deepcopy(written)), MuseGlimmerConfig.from_dict(copy.deepcopy(written))):
            # the composite model ties lm_head by its own flag; it ignores the text config's
            assert bool(getattr(hf, "tie_word_embeddings", False)) == config.text.tie_word_embeddings
            assert tuple(hf.text_config.layer_types) == config.text.layer_types
            assert tuple(theta != 0 for theta in hf.text_config.layer_rope_theta) == config.text.rope_layers
            assert hf.text_config.rope_parameters["rope_theta"] == config.text.rope_theta
            for name in SAME_NAMED_TEXT_FIELDS:
                assert getattr(hf.text_config, name) == getattr(config.text, name), name
            for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "merge_size"):
                assert getattr(hf.vision_config, name) == getattr(config.vision, name), name
            assert hf.vision_config.pos_emb_height == hf.vision_config.pos_emb_width == config.vision.pos_emb_size
            assert tuple(hf.vision_config.layer_types) == config.vision.layer_types
            assert hf.vision_config.rope_parameters["rope_theta"] == config.vision.rope_theta
            assert hf.out_hidden_size == config.out_hidden_size
        hf_text = MuseGlimmerTextConfig(**config_to_dict(text_only(config), "canonical-text"))
        assert tuple(hf_text.layer_types) == config.text.layer_types
        assert hf_text.tie_word_embeddings == config.text.tie_word_embeddings


@pytest.mark.parametrize("num_layers", range(1, 14))
def test_absent_layer_patterns_are_derived_exactly_as_transformers_derives_them(num_layers):
    written = config_to_dict(tiny_model(vision=False, num_hidden_layers=num_layers), "canonical-text")
    del written["layer_types"], written["layer_rope_theta"]
    hf = MuseGlimmerTextConfig(**copy.deepcopy(written))
    ours = normalize_config(written).text
    assert ours.layer_types == tuple(hf.layer_types)
    assert ours.rope_layers == tuple(theta != 0 for theta in hf.layer_rope_theta)
    assert ours.layer_types == reference_text_layer_types(num_layers)


def test_transformers_saved_config_normalizes_to_the_expected_config_without_warnings(tmp_path, caplog):
    hf_tiny_config().save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        config = load_config(tmp_path)
    assert config.config_layout == "canonical"
    assert config.warnings == ()
    assert not caplog.records
    assert_same_config(config, tiny_model())
    # the full to_dict() (every base-class key) is just as quiet
    assert normalize_config(hf_tiny_config().to_dict()).warnings == ()


def test_transformers_saved_text_config_normalizes_as_canonical_text(tmp_path):
    hf_tiny_config().text_config.save_pretrained(tmp_path)
    config = load_config(tmp_path)
    assert config.config_layout == "canonical-text"
    assert config.warnings == ()
    assert_same_config(config, tiny_model(vision=False))


# ---------------------------------------------------------------------------------------------------------
# The released hyper-parameters (architecture.md §1)


def assert_release_text(text: TextConfig) -> None:
    assert text.num_hidden_layers == 52
    assert text.full_attention_layers == RELEASE_FULL_LAYERS
    assert len(text.sliding_attention_layers) == 39
    assert text.rope_layers == tuple(i not in RELEASE_FULL_LAYERS for i in range(52))
    assert text.rope_theta == 500000.0
    assert abs(text.qk_scale_factor - 3.87) < 1e-9
    assert (text.hidden_size, text.head_dim, text.num_attention_heads, text.num_key_value_heads) == (6656, 128, 32, 2)
    assert (text.rms_norm_eps, text.post_norm_eps, text.final_logit_softcapping) == (1e-5, 1e-8, 20.0)


def test_release_hyper_parameters_survive_every_layout():
    release = release_config()
    assert release.warnings == ()
    assert_release_text(release.text)
    assert [i for i, t in enumerate(release.vision.layer_types) if t == "full_attention"] == [*range(3, 48, 4), 49]
    assert (release.image_token_id, release.out_hidden_size, release.projector_hidden_size) == (200092, 6144, 4096)
    for layout in CONFIG_LAYOUTS:
        source = text_only(release) if layout == "canonical-text" else release
        read = normalize_config(config_to_dict(source, layout))
        assert_release_text(read.text)
        assert_same_config(read, source)
    assert config_to_dict(release, "flat")["qk_scale_factor"] == pytest.approx(43.7840518911)


def flat_release_dict() -> dict:
    """A legacy flat config.json with the released values, as the older converter wrote it."""
    return {
        "architectures": ["MuseGlimmerForConditionalGeneration"],
        "model_type": "muse_glimmer",
        "vocab_size": 202048,
        "hidden_size": 6656,
        "intermediate_size": 19968,
        "num_hidden_layers": 52,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "post_norm_eps": 1e-8,
        "rope_theta": 500000.0,
        "sliding_window": 2048,
        "qk_scale_factor": 43.7840518911,
        "output_multiplier": 0.19611613513818404,
        "output_soft_cap_temp": 20.0,
        "use_qk_norm": True,
        "use_attn_output_gate": True,
        "normalize_tok_embeddings": True,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 200000,
        "eos_token_id": 200001,
        "vision_latent_dim": 1536,
        "vision_output_dim": 6144,
        "vision_layers": 50,
        "vision_heads": 16,
        "vision_mlp_ratio": 8960 / 1536,
        "vision_patch_size": 14,
        "vision_patch_temporal": 2,
        "vision_downsample_factor": 2,
        "vision_sparse_attention_factor": 4,
        "vision_pos_emb_grid_h": 32,
        "vision_pos_emb_grid_w": 32,
        "vision_adapter_dim": 4096,
        "patch_token_id": 200092,
        "video_token_id": 200091,
        "vid_start_id": 200082,
        "video_sampling_fps": 2.0,
        "torch_dtype": "bfloat16",
    }


def test_flat_release_config_folds_the_raw_qk_scale_and_matches_the_canonical_release():
    config = normalize_config(flat_release_dict())
    assert config.config_layout == "flat"
    assert config.warnings == ()
    assert abs(config.text.qk_scale_factor - 3.87) < 1e-9
    assert_release_text(config.text)
    assert config.vision.intermediate_size == 8960
    assert_same_config(config, release_config())


def test_vendor_markers_make_a_flat_config_vendor():
    raw = flat_release_dict() | {
        "no_rope_layers": [int(i not in RELEASE_FULL_LAYERS) for i in range(52)],
        "every_n_layers_nope": 4,
        "rope_is_neox_style": False,
    }
    config = normalize_config(raw)
    assert config.config_layout == "vendor"
    assert_same_config(config, release_config())


def test_vendor_config_may_nest_its_vision_tower_in_a_canonical_vision_config():
    raw = config_to_dict(tiny_model(), "vendor")
    for key in [key for key in raw if key.startswith("vision_")]:
        del raw[key]
    raw |= {
        "vision_config": config_to_dict(tiny_model(), "canonical")["vision_config"],
        "out_hidden_size": 128,
        "projector_hidden_size": 48,
    }
    assert_same_config(normalize_config(raw), tiny_model())


def test_rc_nested_schema_is_read_as_canonical_with_its_folded_qk():
    # the vendor's "RC nested" text_config (SGLang's flatten_rc_config input) is the canonical schema
    raw = {
        "model_type": "muse_glimmer",
        "text_config": config_to_dict(tiny_model(qk_scale_factor=0.5), "canonical")["text_config"],
    }
    config = normalize_config(raw)
    assert config.config_layout == "canonical"
    assert config.text.qk_scale_factor == 0.5
    assert config.vision is None


# ---------------------------------------------------------------------------------------------------------
# What the normalizer accepts


def test_vendor_period_without_an_explicit_pattern_derives_the_nope_layers():
    raw = config_to_dict(tiny_model(vision=False, num_hidden_layers=6), "vendor")
    del raw["no_rope_layers"], raw["layer_types"]
    raw["every_n_layers_nope"] = 2
    text = normalize_config(raw).text
    assert text.rope_layers == (True, False, True, False, True, False)
    assert text.full_attention_layers == (1, 3, 5)


def test_vendor_layer_rope_theta_marks_nope_layers_by_zero():
    raw = config_to_dict(tiny_model(vision=False), "vendor")
    del raw["no_rope_layers"], raw["every_n_layers_nope"]
    raw["layer_rope_theta"] = [500000.0, 500000.0, 500000.0, 0]
    config = normalize_config(raw)
    assert config.config_layout == "vendor"
    assert config.text.rope_layers == (True, True, True, False)


def test_sliding_window_pattern_gives_the_layer_types_of_a_flat_config():
    raw = config_to_dict(tiny_model(vision=False, num_hidden_layers=6), "flat")
    del raw["layer_types"]
    raw["sliding_window_pattern"] = [8, 8, 8, 0]
    assert normalize_config(raw).text.full_attention_layers == (1, 5)


def test_per_layer_theta_values_other_than_the_global_one_give_one_warning():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["layer_rope_theta"] = [1.0, 2.0, 3.0, 0]
    config = normalize_config(raw)
    assert config.text.rope_layers == (True, True, True, False)
    assert config.text.rope_theta == 500000.0
    assert len(config.warnings) == 1
    assert "only distinguishes 0 (NoPE) from non-zero" in config.warnings[0]


def test_unknown_keys_give_exactly_one_warning_listing_them_all(caplog):
    raw = config_to_dict(tiny_model(), "canonical")
    raw["mystery"] = 1
    raw["text_config"]["query_pre_attn_scalar"] = 256
    raw["vision_config"]["spatial_merge"] = 2
    with caplog.at_level(logging.WARNING, logger="glimmer.checkpoint.config_layouts"):
        config = normalize_config(raw)
    assert len(config.warnings) == 1
    for key in ("mystery", "text_config.query_pre_attn_scalar", "vision_config.spatial_merge"):
        assert key in config.warnings[0]
    assert [record.getMessage() for record in caplog.records] == list(config.warnings)


def test_rope_is_neox_style_of_a_canonical_config_is_read_silently():
    # the weights' RoPE pairing flag, which formats.py checks against the tensor names: not an unknown key
    raw = config_to_dict(tiny_model(), "canonical")
    raw["rope_is_neox_style"] = True
    raw["text_config"]["rope_is_neox_style"] = True
    assert normalize_config(raw).warnings == ()


@pytest.mark.parametrize("layout, section", [("canonical", None), ("canonical", "text_config"),
                                             ("canonical-text", None), ("flat", None)])
@pytest.mark.parametrize("value", ["false", 0, None])
def test_rope_is_neox_style_that_is_no_boolean_is_refused_naming_it(layout, section, value):
    # formats.py can only check a boolean against the tensor names; "false" loaded interleaved rows as rotate-half
    raw = config_to_dict(tiny_model(vision=False), layout)
    (raw[section] if section else raw)["rope_is_neox_style"] = value
    name = f"{section}.rope_is_neox_style" if section else "rope_is_neox_style"
    expect_error(raw, f"{name}={value!r} is invalid; expected true or false")


def test_bookkeeping_and_training_keys_are_accepted_silently():
    raw = config_to_dict(tiny_model(), "canonical")
    raw |= {"torch_dtype": "bfloat16", "transformers_version": "5.9.0", "_name_or_path": "x", "use_cache": True}
    raw["text_config"] |= {"attention_dropout": 0.1, "initializer_range": 0.02, "architectures": None}
    assert normalize_config(raw).warnings == ()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float", "half", "auto", None])
def test_dtype_fields_naming_a_floating_point_dtype_are_accepted_silently(dtype):
    raw = config_to_dict(tiny_model(), "canonical")
    raw |= {"torch_dtype": dtype, "dtype": dtype}
    raw["text_config"]["torch_dtype"] = dtype
    assert normalize_config(raw).warnings == ()


def test_dtype_fields_naming_no_floating_point_dtype_give_a_warning_each_naming_the_field():
    raw = config_to_dict(tiny_model(), "canonical")
    raw |= {"torch_dtype": "float128", "dtype": "complex64"}
    raw["text_config"]["torch_dtype"] = "int4"
    raw["vision_config"]["dtype"] = 16
    config = normalize_config(raw)
    assert_same_config(config, tiny_model())
    assert len(config.warnings) == 4
    for fragment in ("torch_dtype='float128'", "dtype='complex64'", "text_config.torch_dtype='int4'",
                     "vision_config.dtype=16"):
        assert any(fragment in warning and "not a torch floating-point dtype" in warning
                   for warning in config.warnings), fragment


def test_absent_optional_canonical_fields_take_the_reference_defaults_with_one_warning():
    raw = config_to_dict(tiny_model(), "canonical")
    for key in ("rms_norm_eps", "post_norm_eps", "qk_scale_factor", "hidden_activation"):
        del raw["text_config"][key]
    del raw["vision_config"]["layer_norm_eps"], raw["projector_hidden_act"]
    config = normalize_config(raw)
    assert_same_config(config, tiny_model())
    (warning,) = config.warnings
    for fragment in (
        "text_config.rms_norm_eps=1e-05",
        "text_config.post_norm_eps=1e-08",
        "text_config.qk_scale_factor=3.87",
        "vision_config.layer_norm_eps=1e-05",
        "projector_hidden_act='gelu'",
    ):
        assert fragment in warning


@pytest.mark.parametrize("layout, section", [("canonical", "text_config"), ("canonical", "vision_config"),
                                             ("canonical-text", None), ("flat", None)])
def test_an_empty_layer_types_list_is_refused_not_derived(layout, section):
    # the reference refuses it (len(layer_types) != num_hidden_layers); only an absent or null one is derived
    raw = config_to_dict(tiny_model(vision=section == "vision_config"), layout)
    (raw[section] if section else raw)["layer_types"] = []
    name = f"{section}.layer_types" if section else "layer_types"
    expect_error(raw, f"{name} has 0 entries but")


@pytest.mark.parametrize("layout", ["canonical", "flat"])
def test_a_pad_token_id_of_minus_one_is_read_as_transformers_reads_it(layout):
    """Converted configs write -1 for "no pad token" (transformers and vLLM load them; nothing pads with it): it was
    refused, "pad_token_id=-1 is invalid; expected a token id or null"."""
    raw = config_to_dict(tiny_model(), layout)
    (raw["text_config"] if layout == "canonical" else raw)["pad_token_id"] = -1
    assert normalize_config(raw).text.pad_token_id == -1


def test_a_negative_bos_token_id_is_refused():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["bos_token_id"] = -1
    expect_error(raw, "text_config.bos_token_id=-1 is invalid; expected a token id or null")


def test_token_ids_may_be_lists_or_null():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"] |= {"eos_token_id": [2, 7], "bos_token_id": None, "pad_token_id": None}
    text = normalize_config(raw).text
    assert (text.eos_token_id, text.bos_token_id, text.pad_token_id) == ((2, 7), None, None)
    raw["text_config"]["eos_token_id"] = 2
    assert normalize_config(raw).text.eos_token_id == (2,)


@pytest.mark.parametrize("layout", ["canonical", "canonical-text", "flat", "vendor"])
def test_bos_outside_the_vocabulary_is_refused_naming_the_field(layout):
    raw = config_to_dict(tiny_model(vision=layout != "canonical-text"), layout)
    text = raw["text_config"] if layout == "canonical" else raw
    text["bos_token_id"] = text["vocab_size"]
    name = "text_config.bos_token_id" if layout == "canonical" else "bos_token_id"
    with pytest.raises(ConfigError, match=rf"(?<![\w.]){name}={text['vocab_size']} is outside the model's vocabulary"):
        normalize_config(raw)
    text["bos_token_id"] = text["vocab_size"] - 1
    assert normalize_config(raw).text.bos_token_id == text["vocab_size"] - 1


def test_null_or_absent_vision_config_means_text_only():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["vision_config"] = None
    config = normalize_config(raw)
    assert config.vision is None and config.image_token_id is None and config.warnings == ()
    del raw["vision_config"]
    assert normalize_config(raw).vision is None


def test_has_vision_false_makes_a_flat_config_text_only_with_a_warning():
    raw = config_to_dict(tiny_model(), "flat") | {"has_vision": False}
    config = normalize_config(raw)
    assert config.vision is None
    assert any("has_vision is false" in w for w in config.warnings)


def test_input_dict_is_not_modified():
    raw = config_to_dict(tiny_model(), "canonical")
    before = copy.deepcopy(raw)
    normalize_config(raw)
    assert raw == before


# ---------------------------------------------------------------------------------------------------------
# Refusals: each names the field (as spelled in the file) and the fix


def test_unrecognized_model_type_is_refused_naming_the_layouts_looked_for():
    message = expect_error({"model_type": "llama", "hidden_size": 64}, "model_type='llama'", "canonical-text", "flat")
    for layout in CONFIG_LAYOUTS:
        assert layout in message


def test_a_sub_models_config_is_refused_saying_what_it_is():
    expect_error({"model_type": "muse_glimmer_vision", "hidden_size": 64}, "a sub-model's config")
    # a drafter given where a model goes: the message says how a drafter is run
    message = expect_error({"model_type": "muse_glimmer_assistant", "hidden_size": 64}, "a DFlash drafter's config",
                           "--speculative-config")
    # the example it gives is one --speculative-config takes (it left out "method", which is required)
    from glimmer.engine.spec_decode import SpeculativeConfig

    example = message.split("--speculative-config '", 1)[1].split("'", 1)[0]
    assert SpeculativeConfig.parse(example).model == "DRAFTER_DIR"


def test_config_without_recognizable_fields_is_refused():
    expect_error({"model_type": "muse_glimmer", "foo": 1}, "unrecognized config layout", "text_config")
    expect_error({"hidden_size": 64, "num_hidden_layers": 2}, "no model_type")


def test_packaged_mlx_config_is_left_to_the_mlx_reader():
    raw = config_to_dict(tiny_model(), "vendor") | {"muse_glimmer_mlx_format": 1}
    expect_error(raw, "muse_glimmer_mlx_format", "MLX reader")


def test_checkpoint_code_keys_are_ignored_with_a_warning():
    raw = config_to_dict(tiny_model(), "canonical") | {"auto_map": {"AutoModel": "modeling.Muse"}}
    config = normalize_config(raw)
    assert config == tiny_model()
    assert any("auto_map" in w and "never executes code" in w for w in config.warnings)


def test_a_quantization_config_is_left_to_the_compressed_tensors_reader():
    raw = config_to_dict(tiny_model(), "canonical") | {"quantization_config": {"quant_method": "compressed-tensors"}}
    expect_error(raw, "quantization_config", "compressed-tensors reader")


@pytest.mark.parametrize("layout", ["canonical", "canonical-text", "flat", "vendor"])
def test_null_quantization_config_means_unquantized(layout):
    config = tiny_model(vision=False)
    raw = config_to_dict(config, layout) | {"quantization_config": None}
    if "text_config" in raw:
        raw["text_config"] = raw["text_config"] | {"quantization_config": None}
    normalized = normalize_config(raw)
    assert normalized.text == config.text and normalized.warnings == ()


@pytest.mark.parametrize("layout", ["canonical", "flat"])
def test_missing_required_fields_are_named(layout):
    raw = config_to_dict(tiny_model(), layout)
    text = raw["text_config"] if layout == "canonical" else raw
    del text["head_dim"], text["sliding_window"]
    prefix = "text_config." if layout == "canonical" else ""
    expect_error(raw, f"{prefix}head_dim", f"{prefix}sliding_window", "add them")


@pytest.mark.parametrize("layout", ["canonical", "canonical-text", "flat", "vendor"])
def test_missing_rope_theta_is_refused_never_defaulted(layout):
    raw = config_to_dict(tiny_model(vision=False), layout)
    text = raw["text_config"] if layout == "canonical" else raw
    text.pop("rope_parameters", None)
    text.pop("rope_theta", None)
    expect_error(raw, "rope_theta", "never defaulted", "500000")


def test_flat_layouts_require_the_head_fields_whose_conventions_differ():
    raw = config_to_dict(tiny_model(vision=False), "flat")
    del raw["qk_scale_factor"], raw["output_soft_cap_temp"], raw["output_multiplier"]
    expect_error(raw, "qk_scale_factor", "output_soft_cap_temp", "output_multiplier")


def test_missing_vision_shape_fields_are_named():
    raw = config_to_dict(tiny_model(), "canonical")
    del raw["vision_config"]["patch_size"], raw["out_hidden_size"]
    expect_error(raw, "vision_config.patch_size", "out_hidden_size")


def test_swish_is_read_as_silu_as_transformers_runs_it():
    """transformers' ACT2FN runs "swish" as torch's silu, the same function; Glimmer refused it."""
    from transformers.activations import ACT2FN

    x = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 8
    assert torch.equal(ACT2FN["swish"](x), ACT2FN["silu"](x))
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["hidden_activation"] = "swish"
    assert normalize_config(raw).text.hidden_activation == "swish"
    assert normalize_config(config_to_dict(tiny_model(), "flat") | {"hidden_act": "swish"}).text.hidden_activation \
        == "swish"


def test_unsupported_activation_is_refused_with_the_name_in_the_file():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["hidden_activation"] = "gelu"
    expect_error(raw, "text_config.hidden_activation='gelu' is not supported; Muse Glimmer uses 'silu'")
    raw = config_to_dict(tiny_model(), "flat") | {"hidden_act": "gelu"}
    message = expect_error(raw, "hidden_act='gelu' is not supported; Muse Glimmer uses 'silu'")
    assert "hidden_activation" not in message
    raw = config_to_dict(tiny_model(), "canonical")
    raw["vision_config"]["hidden_act"] = "quick_gelu"
    expect_error(raw, "vision_config.hidden_act='quick_gelu' is not supported")


def test_canonical_layer_types_and_nope_pattern_are_independent_as_in_the_reference():
    """The reference derives layer_types and layer_rope_theta independently and runs any pair (architecture.md §1.1):
    a full-attention layer with RoPE and a sliding one without are read as written, and written back."""
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["layer_types"] = ["full_attention", "sliding_attention", "sliding_attention",
                                         "sliding_attention"]
    raw["text_config"]["layer_rope_theta"] = [500000.0, 0, 500000.0, 500000.0]
    config = normalize_config(raw)
    assert config.text.layer_types == tuple(raw["text_config"]["layer_types"])
    assert config.text.rope_layers == (True, False, True, True)
    assert normalize_config(config_to_dict(config, "canonical")) == config
    for layout in ("flat", "vendor"):
        with pytest.raises(ConfigError, match=r"layers \[0, 1\] are full attention with RoPE .* use 'canonical'"):
            config_to_dict(config, layout)


def test_flat_layer_types_inconsistent_with_the_nope_pattern_are_refused():
    raw = config_to_dict(tiny_model(), "flat") | {"layer_types": ["full_attention"] * 4}
    expect_error(raw, "layer_types is inconsistent with the NoPE pattern at layers [0, 1, 2]", "canonical layout")
    raw = config_to_dict(tiny_model(), "vendor") | {"layer_types": ["sliding_attention"] * 4}
    expect_error(raw, "layer_types is inconsistent with the NoPE pattern at layers [3]")


def test_sliding_window_pattern_inconsistent_with_the_nope_pattern_is_refused_by_name():
    raw = config_to_dict(tiny_model(vision=False), "flat") | {"sliding_window_pattern": [8, 0, 8, 8]}
    del raw["layer_types"]
    expect_error(raw, "sliding_window_pattern is inconsistent with the NoPE pattern at layers [1, 3]")


def test_non_binary_nope_flags_are_refused():
    raw = config_to_dict(tiny_model(), "vendor") | {"no_rope_layers": [1, 2, 1, 0]}
    raw.pop("every_n_layers_nope")
    expect_error(raw, "no_rope_layers contains non-binary entries 2", "1 (RoPE + sliding window) or 0 (NoPE")


def test_nope_sources_that_disagree_are_refused():
    raw = config_to_dict(tiny_model(), "vendor") | {"every_n_layers_nope": 2}
    expect_error(raw, "every_n_layers_nope=2 disagrees with no_rope_layers at layers [1]", "remove every_n_layers_nope")
    raw = config_to_dict(tiny_model(), "vendor") | {"layer_rope_theta": [0, 500000.0, 500000.0, 0]}
    expect_error(raw, "disagrees with layer_rope_theta at layers [0]")
    raw = config_to_dict(tiny_model(), "canonical")
    del raw["text_config"]["layer_rope_theta"]
    raw["text_config"]["no_rope_layers"] = [0, 1, 1, 1]
    expect_error(raw, "text_config.no_rope_layers disagrees with the reference NoPE pattern", "at layers [0, 3]")


def test_per_layer_lists_of_the_wrong_length_are_refused():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["layer_rope_theta"] = [500000.0, 0]
    expect_error(raw, "text_config.layer_rope_theta has 2 entries but num_hidden_layers=4")


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"hidden_size": 66}, ("text_config.hidden_size=66 is not a multiple of text_config.num_attention_heads=4",)),
        (
            {"num_key_value_heads": 3},
            ("text_config.num_attention_heads=4 is not a multiple of text_config.num_key_value_heads=3",),
        ),
        ({"head_dim": 15}, ("head_dim=15 is odd",)),
        ({"num_attention_heads": 0}, ("num_attention_heads=0 is invalid",)),
    ],
)
def test_head_and_hidden_sizes_that_cannot_form_the_weights_are_refused(changes, fragments):
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"] |= changes
    expect_error(raw, *fragments)


def test_vision_geometry_that_cannot_form_the_weights_is_refused():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["vision_config"]["num_attention_heads"] = 3
    expect_error(raw, "vision_config.hidden_size=32 is not a multiple of vision_config.num_attention_heads=3")
    raw = config_to_dict(tiny_model(), "flat") | {"vision_heads": 3}
    expect_error(raw, "vision_latent_dim=32 is not a multiple of vision_heads=3")
    raw = config_to_dict(tiny_model(), "flat") | {"vision_output_dim": 100}
    expect_error(raw, "vision_output_dim=100 does not match the merged vision width")
    # the merged width's fields were named vision_config.hidden_size × merge_size², which a flat config lacks
    raw = config_to_dict(tiny_model(), "flat") | {"vision_downsample_factor": 3}
    expect_error(raw, "vision_output_dim=128 does not match the merged vision width, the vision tower's hidden size 32 "
                      "× its merge size 3² = 288")
    raw = config_to_dict(tiny_model(), "flat") | {"vision_mlp_ratio": 1.9}
    expect_error(raw, "vision_mlp_ratio=1.9 × vision_latent_dim=32", "not a whole number")
    raw = config_to_dict(tiny_model(), "flat") | {"vision_pos_emb_grid_w": 8}
    expect_error(raw, "vision_pos_emb_grid_h=4 and vision_pos_emb_grid_w=8 differ", "square")


@pytest.mark.parametrize(("layout", "key"), [("canonical", "projector_hidden_size"), ("flat", "vision_adapter_dim"),
                                             ("vendor", "vision_adapter_dim")])
def test_a_vision_adapter_of_no_width_is_refused_naming_its_field(layout, key):
    """A width of 0 passed the check that lets token ids be 0: the config loaded, with --load-format dummy a model
    whose adapter has no weights, and with the weights a list of shape mismatches naming the tensors, not the field."""
    raw = config_to_dict(tiny_model(), layout) | {key: 0}
    expect_error(raw, f"{key}=0 is invalid; expected a positive integer, the width of the vision adapter's layers")


@pytest.mark.parametrize("ratio", [float("nan"), float("inf"), 1e308, 10**400],
                         ids=["nan", "infinity", "infinite-width", "integer-past-float"])
@pytest.mark.parametrize("layout", ["flat", "vendor"])
def test_a_vision_mlp_ratio_giving_no_finite_width_is_refused_naming_it(layout, ratio):
    """config.json's NaN and Infinity, which Python's json reads, passed the positive-number check and failed in
    round() with a bare ValueError or OverflowError (a traceback from `glimmer inspect`), naming no field; an integer
    too large for a float (10**400 written as digits) made the finiteness check itself raise a bare OverflowError."""
    raw = json.loads(json.dumps(config_to_dict(tiny_model(), layout) | {"vision_mlp_ratio": ratio}))
    expect_error(raw, f"vision_mlp_ratio={ratio!r} is invalid; expected a positive finite number")


@pytest.mark.parametrize(("section", "key"), [
    ("text_config", "rms_norm_eps"), ("text_config", "final_logit_softcapping"),
    ("vision_config", "layer_norm_eps")])
def test_a_float_field_of_an_integer_past_a_floats_range_is_refused_naming_it(section, key):
    """An integer too large for a float (10**400 written as digits) made the positive-number check's math.isfinite
    raise a bare OverflowError ("int too large to convert to float"), a traceback naming no field."""
    raw = config_to_dict(tiny_model(vision=True), "canonical")
    raw[section][key] = 10**400
    expect_error(json.loads(json.dumps(raw)), f"{key}={10**400!r} is invalid; expected a positive finite number")


def test_canonical_qk_scale_in_the_raw_convention_is_refused():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["qk_scale_factor"] = 15.48  # 3.87·√16
    expect_error(
        raw,
        "text_config.qk_scale_factor=15.48",
        "raw vendor convention",
        "folded multiplier",
        "divide the value by √head_dim",
    )


def test_flat_qk_scale_in_the_folded_convention_is_refused():
    raw = config_to_dict(tiny_model(), "flat") | {"qk_scale_factor": 3.87}
    expect_error(
        raw, "qk_scale_factor=3.87 is below √head_dim=4", "raw value 3.87·√head_dim", "multiply the value by √head_dim"
    )


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("use_qk_norm", False, "use_qk_norm=False is not supported"),
        ("use_attn_output_gate", False, "use_attn_output_gate=False is not supported"),
        ("attn_logit_softcapping", 50.0, "attn_logit_softcapping=50.0 is not supported"),
        ("output_soft_cap_temp", None, "output_soft_cap_temp=None is invalid"),
    ],
)
def test_architecture_variants_glimmer_does_not_have_are_refused(key, value, fragment):
    expect_error(config_to_dict(tiny_model(), "vendor") | {key: value}, fragment)


def test_rope_scalings_are_read_as_transformers_reads_them_and_written_back():
    """Every scaled RoPE the reference runs is read field by field (a pretraining length left out is the model's
    max_position_embeddings, as transformers' standardization fills it in) and written back in every layout."""
    scalings = {
        "linear": {"factor": 4.0},
        "dynamic": {"factor": 2},
        "yarn": {"factor": None, "original_max_position_embeddings": 64, "attention_factor": None, "beta_fast": 8,
                 "truncate": False},
        "longrope": {"short_factor": [1.0] * 8, "long_factor": [4] * 8},
        "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 128},
        "proportional": {"partial_rotary_factor": 0.25},
    }
    for rope_type, fields in scalings.items():
        raw = config_to_dict(tiny_model(), "canonical")
        raw["text_config"]["rope_parameters"] = {"rope_type": rope_type, "rope_theta": 1000.0, **fields}
        MuseGlimmerConfig(**copy.deepcopy(raw))  # the reference takes it
        config = normalize_config(copy.deepcopy(raw))
        scaling = config.text.rope_scaling
        assert scaling.rope_type == rope_type and config.text.rope_theta == 1000.0
        for key, value in fields.items():
            got = getattr(scaling, key)
            assert (list(got) if isinstance(got, tuple) else got) == value, (rope_type, key)
        for layout in ("canonical", "flat", "vendor"):
            assert normalize_config(config_to_dict(config, layout)).text == config.text, (rope_type, layout)
    raw["text_config"]["rope_parameters"] = {"type": "linear", "rope_theta": 1000.0, "factor": 2.0}  # legacy spelling
    assert normalize_config(raw).text.rope_scaling.rope_type == "linear"
    assert normalize_config(config_to_dict(tiny_model(), "canonical")).text.rope_scaling is None


@pytest.mark.parametrize(
    ("rope_parameters", "fragments"),
    [
        ({"rope_type": "ntk", "factor": 2.0}, ["rope_parameters.rope_type='ntk' is not supported", "'longrope'"]),
        ({"rope_type": "linear"}, ["rope_parameters.factor is missing; rope_type 'linear' needs ['factor']"]),
        ({"rope_type": "linear", "factor": None}, ["rope_parameters.factor is null"]),
        ({"rope_type": "linear", "factor": 0}, ["rope_parameters.factor=0 is invalid"]),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0},
         ["low_freq_factor and high_freq_factor are both 2.0"]),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0, "high_freq_factor": 4.0},
         ["low_freq_factor and high_freq_factor must not be 0"]),
        ({"rope_type": "yarn", "factor": 2.0, "rope_theta": 1.0}, ["rope_type='yarn' needs rope_theta other than 1"]),
        ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "original_max_position_embeddings": 1},
         ["original_max_position_embeddings=1 leaves longrope's attention factor undefined"]),
        ({"rope_type": "proportional", "partial_rotary_factor": 1.5},
         ["rope_parameters.partial_rotary_factor=1.5 is more than the whole head"]),
        ({"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 8},
         ["rope_parameters.short_factor has 3 entries; expected head_dim/2 = 8"]),
        ({"rope_type": "longrope", "short_factor": "1", "long_factor": [1.0]},
         ["short_factor must be a non-empty list"]),
        ({"rope_type": "yarn", "factor": 2.0, "beta_fast": -1}, ["rope_parameters.beta_fast=-1 is invalid"]),
        ({"rope_type": "yarn", "factor": 2.0, "truncate": "yes"}, ["rope_parameters.truncate='yes' is invalid"]),
        # the reference's table would not fit the head: its forward fails
        ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5},
         ["partial_rotary_factor=0.5 is not supported with rope_type 'linear'", "only 'proportional'"]),
        # the reference reads one object for every layer and fails on per-layer-type ones
        ({"sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "linear", "factor": 2.0}},
         ["rope_parameters.full_attention: rope parameters per layer type are not supported"]),
    ],
)
def test_rope_parameters_the_reference_cannot_run_are_refused_naming_the_key(rope_parameters, fragments):
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["rope_parameters"] = {"rope_theta": 1000.0, **rope_parameters}
    expect_error(raw, *fragments)


def test_a_dynamic_rope_needs_a_head_of_more_than_two():
    """transformers raises its NTK base to head_dim/(head_dim-2): with a head of 2 it divides by zero."""
    from glimmer.checkpoint.config import RopeScaling

    with pytest.raises(ConfigError, match=r"rope_parameters.rope_type='dynamic' needs head_dim > 2"):
        tiny_text(head_dim=2, rope_scaling=RopeScaling("dynamic", factor=2.0))
    assert tiny_text(head_dim=4, rope_scaling=RopeScaling("dynamic", factor=2.0)).rope_scaling.factor == 2.0


def test_partial_rotary_factor_is_ignored_by_the_default_type_and_taken_from_the_top_level_by_proportional():
    """transformers' default RoPE rotates the whole head whatever partial_rotary_factor says (a warning says so), and
    its standardization moves a top-level partial_rotary_factor into rope_parameters, where proportional reads it."""
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["rope_parameters"]["partial_rotary_factor"] = 0.5
    config = normalize_config(copy.deepcopy(raw))
    assert config.text.rope_scaling is None
    assert any("partial_rotary_factor=0.5 is ignored" in warning for warning in config.warnings)
    raw["text_config"]["rope_parameters"] = {"rope_type": "proportional", "rope_theta": 1000.0}
    raw["text_config"]["partial_rotary_factor"] = 0.25
    assert MuseGlimmerConfig(**copy.deepcopy(raw)).text_config.rope_parameters["partial_rotary_factor"] == 0.25
    assert normalize_config(raw).text.rope_scaling.partial_rotary_factor == 0.25


def test_a_top_level_original_max_position_embeddings_is_read_where_transformers_reads_it():
    """transformers' standardization moves a text config's top-level original_max_position_embeddings into the rope
    object for llama3, yarn and longrope only (the forward comparison: test_config_fuzz.py); Glimmer reads it there in
    every layout, says it is ignored by the other types, and refuses a bad one naming the top-level key."""

    def reference_rope(raw: dict) -> dict:
        text = MuseGlimmerConfig(**copy.deepcopy(raw)).text_config
        text.standardize_rope_params()  # again, as each rotary table does once the config holds the top-level key
        return text.rope_parameters

    raw = config_to_dict(tiny_model(), "canonical")
    theta = raw["text_config"]["rope_parameters"]["rope_theta"]
    raw["text_config"]["rope_parameters"] = {"rope_type": "yarn", "rope_theta": theta, "factor": 2.0}
    raw["text_config"]["original_max_position_embeddings"] = 24
    assert reference_rope(raw)["original_max_position_embeddings"] == 24
    config = normalize_config(copy.deepcopy(raw))
    assert config.text.rope_scaling.original_max_position_embeddings == 24 and config.warnings == ()
    for layout in ("flat", "vendor"):
        flat = config_to_dict(config, layout)
        rope_key = "rope_scaling" if "rope_scaling" in flat else "rope_parameters"
        flat[rope_key].pop("original_max_position_embeddings")
        assert normalize_config(flat | {"original_max_position_embeddings": 24}).text == config.text, layout
    raw["text_config"]["original_max_position_embeddings"] = True
    expect_error(copy.deepcopy(raw), "text_config.original_max_position_embeddings=True is invalid")
    raw["text_config"]["original_max_position_embeddings"] = None  # transformers copies the null: its table fails
    expect_error(copy.deepcopy(raw), "text_config.original_max_position_embeddings is null")
    raw["text_config"]["original_max_position_embeddings"] = 24
    raw["text_config"]["rope_parameters"] = {"rope_type": "linear", "rope_theta": theta, "factor": 2.0}
    assert "original_max_position_embeddings" not in reference_rope(raw)
    ignored = normalize_config(copy.deepcopy(raw)).warnings
    assert len(ignored) == 1 and "text_config.original_max_position_embeddings=24 is ignored" in ignored[0]
    del raw["text_config"]["rope_parameters"]
    raw["text_config"]["rope_theta"] = theta
    assert "original_max_position_embeddings=24 is ignored" in normalize_config(raw).warnings[0]


@pytest.mark.parametrize(
    ("layout", "rope", "fragment"),
    [
        ("canonical", {"rope_type": "linear", "factor": 2.0},
         "config.json: text_config.partial_rotary_factor=0.5 is not supported with rope_type 'linear'"),
        ("canonical", {"rope_type": "proportional"}, "config.json: text_config.partial_rotary_factor=1.5 is more than"),
        ("flat", {"rope_type": "linear", "factor": 2.0},
         "config.json: partial_rotary_factor=0.5 is not supported with rope_type 'linear'"),
        ("flat", {"rope_type": "proportional"}, "config.json: partial_rotary_factor=1.5 is more than"),
    ],
)
def test_a_top_level_partial_rotary_factor_is_named_where_the_file_has_it(layout, rope, fragment):
    """transformers moves a top-level partial_rotary_factor into the rope object; a refusal of it named
    `text_config.rope_parameters.partial_rotary_factor`, a key the file does not have."""
    raw = config_to_dict(tiny_model(), layout)
    text = raw["text_config"] if layout == "canonical" else raw
    theta = text.pop("rope_parameters", {}).get("rope_theta") or text.pop("rope_theta")
    text["rope_scaling"] = {"rope_theta": theta, **rope}
    text["partial_rotary_factor"] = 1.5 if rope["rope_type"] == "proportional" else 0.5
    assert "rope_parameters" not in expect_error(raw, fragment)


def test_the_default_type_s_ignored_partial_rotary_factor_is_named_where_the_file_has_it():
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["partial_rotary_factor"] = 0.5
    warnings = normalize_config(raw).warnings
    assert len(warnings) == 1 and "config.json: text_config.partial_rotary_factor=0.5 is ignored" in warnings[0]


def test_a_flat_config_s_scaling_is_named_as_the_file_names_it():
    """TextConfig's checks of a scaling named `text_config.rope_parameters.<key>` in a flat file as well."""
    raw = config_to_dict(tiny_model(), "flat")
    raw["rope_scaling"] = {"rope_type": "longrope", "rope_theta": raw.pop("rope_theta"), "short_factor": [1.0] * 3,
                           "long_factor": [1.0]}
    expect_error(raw, "config.json: rope_scaling.short_factor has 3 entries")


def test_a_rope_type_in_its_legacy_spelling_type_is_read_as_the_rope_type():
    """transformers reads `type` as `rope_type` ({"type": "linear"} scales the positions); Glimmer took it for an
    unknown key and loaded plain RoPE with a warning, a silently different model."""
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["rope_parameters"] = {"type": "linear", "rope_theta": 500000.0, "factor": 4.0}
    assert MuseGlimmerConfig(**copy.deepcopy(raw)).text_config.rope_parameters["rope_type"] == "linear"
    assert normalize_config(copy.deepcopy(raw)).text.rope_scaling.factor == 4.0
    raw["text_config"]["rope_parameters"] = {"type": "default", "rope_theta": 500000.0}
    assert normalize_config(raw).warnings == ()
    raw["text_config"]["rope_parameters"] = {"type": "linear", "rope_type": "default", "rope_theta": 500000.0}
    expect_error(raw, "rope_type='default' and text_config.rope_parameters.type='linear' disagree")


def test_rope_scaling_is_read_as_rope_parameters_as_transformers_reads_it():
    """transformers reads the legacy `rope_scaling` in place of `rope_parameters`; Glimmer refused any such object,
    and its advice (remove it) then left the rope theta missing."""
    raw = config_to_dict(tiny_model(), "canonical")
    del raw["text_config"]["rope_parameters"]
    raw["text_config"]["rope_scaling"] = {"rope_type": "default", "rope_theta": 123456.0}
    reference = MuseGlimmerConfig(**copy.deepcopy(raw)).text_config.rope_parameters
    normalized = normalize_config(copy.deepcopy(raw))
    assert not any("rope_scaling" in warning for warning in normalized.warnings)  # not an unknown key either
    assert normalized.text.rope_theta == reference["rope_theta"] == 123456.0
    raw["text_config"]["rope_scaling"] = {"rope_type": "linear", "rope_theta": 123456.0, "factor": 4.0}
    assert MuseGlimmerConfig(**copy.deepcopy(raw)).text_config.rope_parameters["rope_type"] == "linear"
    assert normalize_config(copy.deepcopy(raw)).text.rope_scaling.rope_type == "linear"
    # beside rope_parameters transformers takes rope_scaling alone: two different objects are refused
    raw["text_config"]["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    raw["text_config"]["rope_scaling"] = {"rope_type": "default"}
    assert MuseGlimmerConfig(**copy.deepcopy(raw)).text_config.rope_parameters["rope_theta"] != 500000.0
    expect_error(raw, "text_config.rope_scaling=", "differ; transformers reads only rope_scaling")
    for same in ({"rope_type": "default", "rope_theta": 500000.0}, {}, None):  # the same object, or empty
        raw["text_config"]["rope_scaling"] = same
        assert normalize_config(copy.deepcopy(raw)).text.rope_theta == 500000.0
    raw["text_config"]["rope_scaling"] = True
    expect_error(raw, "text_config.rope_scaling must be a JSON object")


def test_a_vision_config_s_rope_scaling_is_read_as_its_rope_parameters_as_transformers_reads_it():
    """The vision tower's legacy `rope_scaling` too: Glimmer consumed it without a word (no unknown-key warning) and ran
    the default theta, 10000, where transformers takes the theta it holds: other image features."""
    raw = config_to_dict(tiny_model(), "canonical")
    del raw["vision_config"]["rope_parameters"]
    raw["vision_config"]["rope_scaling"] = {"rope_type": "axial", "rope_theta": 100.0}
    reference = MuseGlimmerConfig(**copy.deepcopy(raw)).vision_config.rope_parameters
    normalized = normalize_config(copy.deepcopy(raw))
    assert normalized.vision.rope_theta == reference["rope_theta"] == 100.0
    assert normalized.warnings == ()
    raw["vision_config"]["rope_scaling"] = {"type": "axial", "rope_theta": 100.0}
    assert normalize_config(copy.deepcopy(raw)).vision.rope_theta == 100.0
    raw["vision_config"]["rope_parameters"] = {"rope_type": "axial", "rope_theta": 10000.0}
    expect_error(raw, "vision_config.rope_scaling=", "differ; transformers reads only rope_scaling")


def test_aliases_that_disagree_are_refused():
    raw = config_to_dict(tiny_model(), "flat") | {"image_token_id": 12}
    expect_error(raw, "patch_token_id=10 and image_token_id=12 disagree")


def test_load_config_names_the_path_of_a_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json: not found"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json: not valid JSON \(line 1"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text('{"hidden_size": ' + "9" * 5000 + "}")  # past Python's int digits limit
    with pytest.raises(ConfigError, match=r"config\.json: not readable JSON \(Exceeds the limit"):
        load_config(tmp_path)


def test_errors_name_the_source_file(tmp_path):
    raw = config_to_dict(tiny_model(), "canonical")
    raw["text_config"]["hidden_activation"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=str(tmp_path / "config.json")):
        load_config(tmp_path)


def _with_layers(layout: str, part: str, count: int) -> dict:
    """tiny_model() in `layout` with `count` layers in its text decoder or vision tower and no per-layer list, so
    the patterns would be derived from the count."""
    raw = config_to_dict(tiny_model(), layout)
    if layout == "canonical":
        section = raw[f"{part}_config"]
        section["num_hidden_layers"] = count
        for key in ("layer_types", "layer_rope_theta"):
            section.pop(key, None)
        return raw
    if part == "vision":
        raw["vision_layers"] = count
    else:
        raw["num_hidden_layers"] = count
        for key in ("layer_types", "no_rope_layers"):
            raw.pop(key, None)
    return raw


@pytest.mark.parametrize(("layout", "part", "field"), [
    ("canonical", "text", "text_config.num_hidden_layers"), ("canonical", "vision", "vision_config.num_hidden_layers"),
    ("flat", "text", "num_hidden_layers"), ("vendor", "text", "num_hidden_layers"), ("flat", "vision", "vision_layers"),
])
def test_a_layer_count_no_model_has_is_refused_before_its_patterns_are_derived(tmp_path, layout, part, field):
    """QA: num_hidden_layers=10**9 without layer_types made a tuple per layer before the weights were compared:
    gigabytes of memory (18 GB within seconds) and minutes, not an error. Inspected under test_gguf_hostile's
    address-space cap, so the old behaviour fails the test with a MemoryError instead of taking the machine."""
    from test_gguf_hostile import assert_one_line_error, inspect_all

    (tmp_path / "config.json").write_text(json.dumps(_with_layers(layout, part, 10**9)))
    result = inspect_all([tmp_path])[str(tmp_path)]
    assert_one_line_error(result, f"{field}=1000000000 is more layers than Glimmer builds (at most 4096",
                          "use the config.json published with the weights")
    assert normalize_config(_with_layers(layout, part, 4096)).text.num_hidden_layers == (4096 if part == "text" else 4)


@pytest.mark.parametrize(("layout", "field"), [("canonical", "text_config.sliding_window"),
                                               ("flat", "sliding_window")])
@pytest.mark.parametrize("window", [2**63, 2**64 - 1, 10**30])
def test_a_sliding_window_past_int64_is_refused_naming_the_field(layout, field, window):
    """QA: 2**64 - 1 loaded and wrapped to -1 in the attention mask (a silently wrong model: each query saw only
    itself on the sliding layers), and 10**30 loaded and failed in the first forward pass with OverflowError."""
    raw = config_to_dict(tiny_model(vision=False), layout)
    (raw["text_config"] if layout == "canonical" else raw)["sliding_window"] = window
    expect_error(raw, f"{field}={window} is invalid; expected a positive integer of at most 2**63 - 1")
    (raw["text_config"] if layout == "canonical" else raw)["sliding_window"] = 2**63 - 1  # as wide as int64 goes
    assert normalize_config(raw).text.sliding_window == 2**63 - 1


@pytest.mark.parametrize(("sizes", "shape"), [
    ({"vocab_size": 2**40}, "vocab_size × hidden_size (embed_tokens, lm_head) = 70368744177664 elements"),
    ({"hidden_size": 2**20, "num_attention_heads": 2**20, "head_dim": 2**22},
     "num_attention_heads·head_dim × hidden_size (q_proj, gate_proj, o_proj) = 4611686018427387904 elements"),
    ({"intermediate_size": 2**40}, "intermediate_size × hidden_size (the MLP) = 70368744177664 elements"),
], ids=["embedding", "attention", "mlp"])
def test_sizes_that_make_a_weight_no_checkpoint_holds_are_refused_naming_them(sizes, shape):
    """QA: such a config was taken, and building the model failed deep inside torch (`RuntimeError: Storage size
    calculation overflowed`, a raw traceback from `glimmer inspect`) before the weights were compared."""
    raw = config_to_dict(tiny_model(vision=False), "canonical")
    raw["text_config"].update(sizes)
    expect_error(raw, f"text_config sizes make a weight of {shape}, more than any checkpoint holds (at most 2**40)",
                 "use the config.json published with the weights")


@pytest.mark.parametrize(("section", "sizes", "shape"), [
    ("vision_config", {"hidden_size": 2**21, "intermediate_size": 2**21},
     "vision_config sizes make a weight of hidden_size × hidden_size (q_proj, k_proj, v_proj, proj) = "
     "4398046511104 elements"),
    ("vision_config", {"intermediate_size": 2**40},
     "vision_config sizes make a weight of intermediate_size × hidden_size (the MLP) = 35184372088832 elements"),
    ("vision_config", {"patch_size": 2**20},
     "vision_config sizes make a weight of patch_temporal·3·patch_size² × hidden_size (patch_embedding) = "
     "211106232532992 elements"),
    (None, {"projector_hidden_size": 2**40},
     "config sizes make a weight of projector_hidden_size × out_hidden_size (vision_adapter.fc1) = "
     "140737488355328 elements"),
], ids=["vision-attention", "vision-mlp", "vision-patch-embedding", "adapter"])
def test_vision_sizes_that_make_a_weight_no_checkpoint_holds_are_refused_naming_them(section, sizes, shape):
    """QA: the text decoder's sizes were bounded so (above), the vision tower's and its adapter's were not: such a
    config was taken, and building the model failed deep inside torch with a raw traceback."""
    raw = config_to_dict(tiny_model(), "canonical")
    (raw[section] if section else raw).update(sizes)
    vision = raw["vision_config"]
    raw["out_hidden_size"] = vision["hidden_size"] * vision["merge_size"] ** 2  # the merged width, kept consistent
    expect_error(raw, f"{shape}, more than any checkpoint holds (at most 2**40)",
                 "use the config.json published with the weights")
