"""`glimmer make-tiny --preset 30b --config-only` and `load_format="dummy"`: full-size geometry without a download."""

from __future__ import annotations

import json

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.checkpoint.config_layouts import load_config
from glimmer.checkpoint.tiny_tokenizer import RELEASE_SPECIAL_IDS
from glimmer.cli import main
from glimmer.engine.model_loader import load_model
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import ConfigError
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration
from glimmer.tiny import released_30b_config, write_tiny_checkpoint


@pytest.fixture(scope="module")
def config_30b(tmp_path_factory):
    out = tmp_path_factory.mktemp("glimmer-30b")
    assert main(["make-tiny", str(out), "--preset", "30b", "--config-only"]) == 0
    return out


def test_30b_config_only_writes_the_released_geometry_and_no_weights(config_30b):
    config = load_config(config_30b)
    assert config == released_30b_config()
    assert not config.warnings
    text = config.text
    assert (text.num_hidden_layers, text.hidden_size, text.intermediate_size, text.vocab_size) == (52, 6656, 19968,
                                                                                                   202048)
    assert (text.num_attention_heads, text.num_key_value_heads, text.head_dim, text.sliding_window) == (32, 2, 128,
                                                                                                       2048)
    assert text.full_attention_layers == tuple(range(3, 52, 4))  # 13 NoPE full-attention layers (§1.1)
    assert not any(text.rope_layers[i] for i in text.full_attention_layers)
    assert (text.rope_theta, text.qk_scale_factor, text.final_logit_softcapping) == (500000.0, 3.87, 20.0)
    assert not list(config_30b.glob("*.safetensors"))
    assistant = json.loads((config_30b / "assistant" / "config.json").read_text())
    assert (assistant["num_hidden_layers"], assistant["target_layer_ids"], assistant["block_size"]) == (
        5, [1, 13, 25, 37, 49], 16)


def test_30b_parameter_count_matches_the_release(config_30b):
    with torch.device("meta"):
        model = MuseGlimmerForConditionalGeneration(load_config(config_30b))
    # architecture.md §0: 29,776,626,688 parameters in total
    assert sum(p.numel() for p in model.parameters()) == 29_776_626_688


def test_30b_tokenizer_has_the_release_special_token_ids(config_30b):
    tokenizer = Tokenizer.from_dir(config_30b)
    config = load_config(config_30b)
    assert tokenizer.vocab_size == config.text.vocab_size
    for token, token_id in RELEASE_SPECIAL_IDS.items():
        assert tokenizer.token_to_id(token) == token_id
    assert tokenizer.token_to_id("<|patch|>") == config.image_token_id
    assert tokenizer.token_to_id("<|reserved_special_token_1818|>") == 201818
    assert tokenizer.encode("hello <|eot|>", add_special_tokens=True)[0] == 200000
    generation = json.loads((config_30b / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [200001, 200008] and generation["pad_token_id"] == 200018


def test_30b_preset_without_config_only_is_refused(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path), "--preset", "30b"]) == 2
    assert "--config-only" in capsys.readouterr().err


def test_dummy_load_reads_no_weights_and_randomizes_every_tensor(tmp_path):
    path = write_tiny_checkpoint(tmp_path, vision=True, config_only=True)
    assert not list(path.glob("*.safetensors"))
    loaded = load_model(path, load_format="dummy", seed=3)
    assert loaded.weight_layout == "dummy"
    state = loaded.model.state_dict()
    assert all(t.std() > 0 for t in state.values())  # norms included
    again = load_model(path, load_format="dummy", seed=3).model.state_dict()
    assert all(torch.equal(state[k], again[k]) for k in state)


def test_unknown_load_format_is_refused(tiny_checkpoint):
    with pytest.raises(ConfigError, match="load_format"):
        load_model(tiny_checkpoint, load_format="pt")


def test_llm_generates_from_dummy_weights(tmp_path):
    path = write_tiny_checkpoint(tmp_path, config_only=True)
    llm = LLM(str(path), load_format="dummy", progress=False, kv_cache_memory=8 << 20)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert len(out.token_ids) == 8


def test_dummy_30b_geometry_forward_is_finite_in_bf16(config_30b):
    """The released depth and head layout (52 layers, 32 heads, GQA 16:1) at a small width, drawn as `dummy`
    draws: finite bf16 logits."""
    import dataclasses

    config = load_config(config_30b)
    text = dataclasses.replace(config.text, num_hidden_layers=52, hidden_size=128, intermediate_size=256,
                               num_attention_heads=32, head_dim=4, vocab_size=1024, bos_token_id=None)
    small = dataclasses.replace(config, text=text, vision=None, image_token_id=None, video_token_id=None,
                                out_hidden_size=None, projector_hidden_size=None, projector_hidden_act=None)
    from glimmer.checkpoint.random_weights import randomize_parameters_
    from glimmer.model.context import ForwardContext

    model = MuseGlimmerForConditionalGeneration(small).to(torch.bfloat16)
    randomize_parameters_(model, seed=1)
    with torch.no_grad():
        logits = model.compute_logits(model(torch.arange(12) * 37, ForwardContext.without_cache([12])))
    assert torch.isfinite(logits).all()
    assert logits.float().std() > 0.1
