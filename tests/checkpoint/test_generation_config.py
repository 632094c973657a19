"""P-TOK-2: stop ids, and the other generation defaults of a checkpoint."""

import json
import logging
import re
from pathlib import Path

import pytest

from glimmer.checkpoint import generation_config
from glimmer.checkpoint.config import TextConfig, reference_rope_layers, reference_text_layer_types
from glimmer.checkpoint.generation_config import GenerationDefaults, load_generation_defaults
from glimmer.checkpoint.tiny_tokenizer import TinyTokenizerInfo, write_tiny_tokenizer
from glimmer.engine import sampling_params
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import ConfigError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[TinyTokenizerInfo, Tokenizer]:
    out = tmp_path_factory.mktemp("tokenizer")
    info = write_tiny_tokenizer(out)
    return info, Tokenizer.from_dir(out)


def text_config(info: TinyTokenizerInfo, eos: tuple[int, ...] | None = None) -> TextConfig:
    return TextConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_activation="silu",
        rms_norm_eps=1e-5,
        post_norm_eps=1e-8,
        rope_theta=500000.0,
        rope_scaling=None,
        sliding_window=8,
        layer_types=reference_text_layer_types(4),
        rope_layers=reference_rope_layers(4),
        qk_scale_factor=3.87,
        output_multiplier=0.196116,
        final_logit_softcapping=20.0,
        attention_bias=False,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        bos_token_id=info.bos_token_id,
        eos_token_id=eos if eos is not None else (info.eos_token_id,),
        pad_token_id=None,
    )


def load(directory: Path, tiny, generation_config: dict | None, eos: tuple[int, ...] | None = None):
    info, tok = tiny
    if generation_config is not None:
        (directory / "generation_config.json").write_text(json.dumps(generation_config), encoding="utf-8")
    return load_generation_defaults(directory, text_config(info, eos), tok.token_to_id)


def test_listed_eos_ids_are_the_stop_ids(tmp_path, tiny):
    info, _ = tiny
    listed = [info.eos_token_id, info.eot_token_id, info.special_token_ids["<|reserved_special_token_2|>"]]
    defaults = load(tmp_path, tiny, {"eos_token_id": listed})
    assert defaults.stop_token_ids == tuple(listed)


@pytest.mark.parametrize("form", ["int", "list"])
def test_a_single_eos_is_completed_with_eot(tmp_path, tiny, form):
    info, _ = tiny
    eos = info.eos_token_id if form == "int" else [info.eos_token_id]
    defaults = load(tmp_path, tiny, {"eos_token_id": eos})
    assert defaults.stop_token_ids == (info.eos_token_id, info.eot_token_id)


def test_without_generation_config_the_model_eos_and_eot_stop(tmp_path, tiny):
    info, _ = tiny
    defaults = load(tmp_path, tiny, None)
    assert defaults == GenerationDefaults(
        stop_token_ids=(info.eos_token_id, info.eot_token_id),
        bos_token_id=info.bos_token_id,
        pad_token_id=None,
    )


def test_generation_config_without_eos_falls_back_to_the_model_eos(tmp_path, tiny):
    info, _ = tiny
    defaults = load(tmp_path, tiny, {"do_sample": False}, eos=(info.eos_token_id, info.eot_token_id))
    assert defaults.stop_token_ids == (info.eos_token_id, info.eot_token_id)


def test_eom_is_never_a_stop_id(tmp_path, tiny, caplog):
    info, _ = tiny
    with caplog.at_level(logging.WARNING, logger="glimmer.checkpoint.generation_config"):
        defaults = load(
            tmp_path, tiny, {"eos_token_id": [info.eos_token_id, info.eot_token_id, info.eom_token_id]}
        )
    assert defaults.stop_token_ids == (info.eos_token_id, info.eot_token_id)
    assert "<|eom|>" in caplog.text


def test_eom_dropped_from_a_pair_leaves_eos_completed_with_eot(tmp_path, tiny):
    info, _ = tiny
    defaults = load(tmp_path, tiny, {"eos_token_id": [info.eos_token_id, info.eom_token_id]})
    assert defaults.stop_token_ids == (info.eos_token_id, info.eot_token_id)


def test_tokenizer_without_eot_stops_at_eos_only(tmp_path, tiny, caplog):
    info, _ = tiny
    token_to_id = lambda token: None if token == "<|eot|>" else tiny[1].token_to_id(token)
    with caplog.at_level(logging.WARNING, logger="glimmer.checkpoint.generation_config"):
        defaults = load_generation_defaults(tmp_path, text_config(info), token_to_id)
    assert defaults.stop_token_ids == (info.eos_token_id,)
    assert "<|eot|>" in caplog.text


def test_sampling_defaults_and_token_ids_are_read(tmp_path, tiny):
    info, _ = tiny
    defaults = load(
        tmp_path,
        tiny,
        {
            "bos_token_id": info.bos_token_id,
            "eos_token_id": [info.eos_token_id, info.eot_token_id],
            "pad_token_id": info.pad_token_id,
            "temperature": 0.6,
            "top_p": 0.9,
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "do_sample": True,
            "max_new_tokens": 64,
            "max_length": 131072,
            "transformers_version": "5.23.0",
        },
    )
    assert defaults == GenerationDefaults(
        stop_token_ids=(info.eos_token_id, info.eot_token_id),
        bos_token_id=info.bos_token_id,
        pad_token_id=info.pad_token_id,
        temperature=0.6,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        do_sample=True,
        max_new_tokens=64,
        max_length=131072,
    )
    assert defaults.sampling_defaults() == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
                                            "repetition_penalty": 1.1, "max_tokens": 64}


def test_invalid_json_names_the_file(tmp_path, tiny):
    info, tok = tiny
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [1,', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"generation_config\.json is not valid JSON"):
        load_generation_defaults(tmp_path, text_config(info), tok.token_to_id)


@pytest.mark.parametrize(
    "field, value",
    [
        ("eos_token_id", "2"),
        ("eos_token_id", []),
        ("eos_token_id", [1, True]),
        ("pad_token_id", [3]),
        ("temperature", "hot"),
        ("top_p", 1.5),
        ("top_p", 0.0),  # accepted by transformers, refused by every request it would become the default of
        ("top_k", 2.5),
        ("top_k", -2),
        ("do_sample", 1),
        ("max_new_tokens", 0),
        ("min_p", 1.5),
        ("repetition_penalty", 0),  # would divide by zero
        ("repetition_penalty", -1.0),
        ("repetition_penalty", 1e-39),  # float32 underflow: the penalized logits overflowed
        ("temperature", 1e39),  # infinite in float32: every draw was token 0
        ("bos_token_id", 512),
    ],
)
def test_invalid_field_names_the_file_and_field(tmp_path, tiny, field, value):
    with pytest.raises(ConfigError, match=rf"generation_config\.json: {field}="):
        load(tmp_path, tiny, {field: value})


def test_top_p_zero_is_refused_as_outside_the_open_interval(tmp_path, tiny):
    with pytest.raises(ConfigError, match=r"top_p=0\.0 is invalid; expected a number in \(0\.0, 1\.0\]"):
        load(tmp_path, tiny, {"top_p": 0.0})
    assert load(tmp_path, tiny, {"top_p": 1e-9}).top_p == 1e-9


@pytest.mark.parametrize("top_k", [-1, 0])
def test_a_top_k_that_turns_top_k_off_is_a_default_requests_take(tmp_path, tiny, top_k):
    """vLLM's -1 is off, as 0 is, for SamplingParams too: a checkpoint setting it loads (it was refused) and its
    requests sample without top-k."""
    defaults = load(tmp_path, tiny, {"top_k": top_k})
    assert defaults.sampling_defaults() == {"top_k": top_k}
    assert sampling_params.SamplingParams(**defaults.sampling_defaults()).top_k == top_k


def test_stop_id_outside_the_model_vocabulary_is_an_error(tmp_path, tiny):
    with pytest.raises(ConfigError, match="outside the model's vocabulary"):
        load(tmp_path, tiny, {"eos_token_id": [200001, 200008]})


def test_sampling_bounds_are_those_of_sampling_params():
    assert generation_config.MAX_TEMPERATURE == sampling_params.MAX_TEMPERATURE
    assert generation_config.REPETITION_PENALTY_RANGE == sampling_params.REPETITION_PENALTY_RANGE


def test_bos_outside_the_model_vocabulary_is_an_error(tmp_path, tiny):
    with pytest.raises(ConfigError, match=r"bos_token_id=512 is outside the model's vocabulary \(vocab_size=512\)"):
        load(tmp_path, tiny, {"bos_token_id": 512})
    assert load(tmp_path, tiny, {"bos_token_id": 511}).bos_token_id == 511


def test_pad_outside_the_model_vocabulary_is_a_warning_naming_it(tmp_path, tiny, caplog):
    """It was taken silently; nothing pads with it, so it warns (bos and the stop ids, which are used, are errors)."""
    with caplog.at_level(logging.WARNING, logger="glimmer.checkpoint.generation_config"):
        assert load(tmp_path, tiny, {"pad_token_id": 600}).pad_token_id == 600
    assert re.search(r"generation_config\.json: pad_token_id=600 is outside the model's vocabulary \(vocab_size=512\); "
                     "Glimmer does not use it", caplog.text)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="glimmer.checkpoint.generation_config"):
        assert load(tmp_path, tiny, {"pad_token_id": 511}).pad_token_id == 511
    assert "pad_token_id" not in caplog.text


def test_a_pad_of_minus_one_is_a_warning_naming_it(tmp_path, tiny, caplog):
    """-1 ("no pad token", as converted checkpoints write it) was refused: "pad_token_id=-1 is invalid"."""
    with caplog.at_level(logging.WARNING, logger="glimmer.checkpoint.generation_config"):
        assert load(tmp_path, tiny, {"pad_token_id": -1}).pad_token_id == -1
    assert re.search(r"generation_config\.json: pad_token_id=-1 is outside the model's vocabulary", caplog.text)


def test_only_eom_configured_leaves_eot(tmp_path, tiny):
    info, _ = tiny
    defaults = load(tmp_path, tiny, {"eos_token_id": [info.eom_token_id]})
    assert defaults.stop_token_ids == (info.eot_token_id,)


def test_a_null_eos_in_config_json_stops_at_the_tokenizers_eos_and_eot(make_tiny, tmp_path, caplog):
    """config.json's `eos_token_id: null` was refused ("text_config.eos_token_id is empty"). transformers' generate
    then stops at no id and vLLM at the tokenizer's eos_token alone; the engine stops at that and at <|eot|>, which
    ends a chat turn (P-TOK-2), and says so."""
    import shutil

    from glimmer import LLM, SamplingParams
    from glimmer.checkpoint.config_writers import write_canonical

    checkpoint = tmp_path / "null-eos"
    shutil.copytree(make_tiny(), checkpoint)
    (checkpoint / "generation_config.json").unlink()
    config = json.loads((checkpoint / "config.json").read_text())
    config["text_config"]["eos_token_id"] = None
    (checkpoint / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="glimmer.checkpoint.generation_config"):
        llm = LLM(str(checkpoint), progress=False)
    assert "config.json's eos_token_id is null" in caplog.text
    assert write_canonical(llm.engine.model_config)["text_config"]["eos_token_id"] is None  # written back as read
    tokenizer = llm.engine.tokenizer
    eos, eot = tokenizer.eos_token_id, tokenizer.token_to_id("<|eot|>")
    assert llm.engine.generation_defaults.stop_token_ids == (eos, eot)
    for stop in (eos, eot):
        out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8, logit_bias={stop: 100}))[0].outputs[0]
        assert (out.token_ids, out.finish_reason) == ([stop], "stop")


def test_a_null_eos_with_no_eot_in_the_tokenizer_is_refused_naming_the_field(tmp_path, tiny):
    info, tok = tiny
    with pytest.raises(ConfigError, match=r"config\.json eos_token_id leaves no stop token \(and the tokenizer has no "
                                          r"<\|eot\|>\); set eos_token_id"):
        load_generation_defaults(tmp_path, text_config(info, eos=()),
                                 lambda token: None if token == "<|eot|>" else tok.token_to_id(token))


def _checkpoint_with_eot_moved_to_505(make_tiny, tmp_path):
    """The tiny checkpoint with <|eot|> moved from id 481 to 505 (special tokens in the model vocabulary too, as
    tiktoken conversions write them): the tokenizer still has 499 tokens, id 481 is a gap, and 505 is <|eot|>."""
    import shutil

    checkpoint = tmp_path / "gapped"
    shutil.copytree(make_tiny(), checkpoint)
    state = json.loads((checkpoint / "tokenizer.json").read_text())
    for added in state["added_tokens"]:
        if added["content"] == "<|eot|>":
            added["id"] = 505
        state["model"]["vocab"][added["content"]] = added["id"]
    (checkpoint / "tokenizer.json").write_text(json.dumps(state))
    return checkpoint


@pytest.mark.parametrize(("gapped", "eos", "unknown", "eot_id"), [
    (False, [485, 500], [500], 481), (False, 511, [511], 481), (True, [485, 481], [481], 505)])
def test_a_stop_id_naming_no_token_is_refused_naming_the_fix(make_tiny, tmp_path, gapped, eos, unknown, eot_id):
    """The tiny model's vocabulary (512 rows) pads its tokenizer's 499 tokens. An eos_token_id naming a padding row
    (a generation_config.json from another model) loaded without a word: no token has that id, so generation never
    stopped there. So did one naming a gap in the tokenizer's ids (<|eot|> moved from 481 to 505), below its token
    count. Both are refused naming the file, the field, and the ids to set."""
    import shutil

    from glimmer import LLM

    if gapped:
        checkpoint = _checkpoint_with_eot_moved_to_505(make_tiny, tmp_path)
    else:
        checkpoint = tmp_path / "padding-eos"
        shutil.copytree(make_tiny(), checkpoint)
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    with pytest.raises(ConfigError) as raised:
        LLM(str(checkpoint), progress=False)
    assert str(raised.value) == (
        f"{checkpoint / 'generation_config.json'} eos_token_id: stop ids {unknown} name no token of the tokenizer, so "
        f"generation never stops there; set eos_token_id to the tokenizer's eos_token and <|eot|> ids, "
        f"[485, {eot_id}], or use the tokenizer the model was trained with")


def test_a_stop_id_past_the_tokenizers_token_count_that_names_a_token_loads(make_tiny, tmp_path):
    """<|eot|> at id 505, past the tokenizer's count of 499 tokens: the stop ids the fix names, [485, 505], were
    refused as naming no token. They load, and generation stops at both."""
    from glimmer import LLM

    checkpoint = _checkpoint_with_eot_moved_to_505(make_tiny, tmp_path)
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [485, 505]}))
    llm = LLM(str(checkpoint), progress=False)
    assert set(llm.engine.generation_defaults.stop_token_ids) >= {485, 505}
