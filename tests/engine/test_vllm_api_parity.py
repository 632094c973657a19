"""The offline API behaves as vLLM's where a vLLM user would rely on it: `LLM.chat` parses whatever
`skip_special_tokens` says, `get_tokenizer()` has Hugging Face's defaults, a long max_tokens ends at max_model_len,
`dtype="auto"` / torch dtypes / `seed=None` are taken, and errors name the prompt a caller gave."""

from __future__ import annotations

import copy
import gc
import json
import pickle
import re
import shutil
import sys
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoTokenizer

from glimmer import LLM, BeamSearchParams, LLMTokenizer, SamplingParams
from glimmer.default_model import default_model_dir
from glimmer.engine.outputs import Logprob
from glimmer.errors import (
    CheckpointError,
    ConfigError,
    ContextLengthError,
    PromptTextTooLongError,
    RequestError,
    UnsupportedArgumentError,
)
from glimmer.protocol import parse_output

MESSAGES = [{"role": "user", "content": "hi"}]
KWARGS = {"current_date": "2026-01-01"}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def llm(tiny_checkpoint, same_cpu_kernels_in_module):
    return LLM(str(tiny_checkpoint), device="cpu", progress=False, kv_cache_memory=16 << 20, max_model_len=1024)


@pytest.fixture(scope="module")
def nano():
    return LLM("glimmer-nano", device="cpu", progress=False)


# 1. LLM.chat generates with special tokens and applies skip_special_tokens to the parsed reply -----------------

def test_chat_parses_the_turn_whatever_skip_special_tokens_says(nano):
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    replies = {skip: nano.chat(messages, SamplingParams(temperature=0, max_tokens=120, skip_special_tokens=skip),
                               tools=[WEATHER_TOOL])[0] for skip in (True, False, None)}
    kept = replies[False]
    assert kept.reasoning and kept.content and "<|" not in kept.content
    for skipped in (replies[True], replies[None]):
        assert (skipped.reasoning, skipped.content, skipped.tool_calls) == (kept.reasoning, kept.content,
                                                                           kept.tool_calls)


def test_chat_hides_stray_special_tokens_by_token_identity_unless_told_to_keep_them(llm):
    from glimmer.engine.detokenizer import IncrementalDetokenizer

    tok = llm.engine.tokenizer
    patch = tok.token_to_id("<|patch|>")
    assert patch in tok.hidden_in_replies
    ids = tok.encode_text("a") + [patch] + tok.encode_text("b<|patch|>")  # the last tokens only spell it: it stays
    assert IncrementalDetokenizer(tok, skip_token_ids=tok.hidden_in_replies).add_many(ids) == "ab<|patch|>"
    assert IncrementalDetokenizer(tok).add_many(ids) == "a<|patch|>b<|patch|>"


# 2. get_tokenizer() -----------------------------------------------------------------------------------------------

def test_get_tokenizer_encodes_with_bos_as_hugging_face_does(llm):
    tok = llm.get_tokenizer()
    assert isinstance(tok, LLMTokenizer)
    ids = tok.encode("Hello")
    assert ids[0] == tok.bos_token_id and ids[1:] == tok.encode("Hello", add_special_tokens=False)
    assert tok("Hello") == {"input_ids": ids, "attention_mask": [1] * len(ids)}
    assert tok(["Hello", "a"])["input_ids"][0] == ids
    greedy = SamplingParams(temperature=0, max_tokens=4)
    by_ids = llm.generate({"prompt_token_ids": tok.encode("Hello")}, greedy)[0]
    by_text = llm.generate("Hello", greedy)[0]
    assert by_ids.prompt_token_ids == by_text.prompt_token_ids and by_ids.token_ids == by_text.token_ids


def test_get_tokenizer_has_the_hugging_face_calls(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello")
    assert tok.decode(ids) == tok.bos_token + "Hello" and tok.decode(ids, skip_special_tokens=True) == "Hello"
    assert tok.convert_ids_to_tokens(ids[0]) == tok.bos_token and len(tok.convert_ids_to_tokens(ids)) == len(ids)
    assert tok.get_vocab()[tok.bos_token] == tok.bos_token_id and len(tok) == tok.tokenizer.vocab_size
    assert tok.eos_token_id is not None and tok.tokenizer is llm.engine.tokenizer


@pytest.fixture(scope="module")
def hf(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint)


def test_get_tokenizer_has_the_members_of_vllms_tokenizer_as_vllm_computes_them(llm, hf):
    """`max_token_id`, `max_chars_per_token`, `num_special_tokens_to_add()` and `get_chat_template()`, which vLLM's
    `get_tokenizer()` offers (its TokenizerLike), were AttributeErrors; they answer as vLLM's cached tokenizer and
    transformers' do."""
    tok, vocab = llm.get_tokenizer(), hf.get_vocab()
    assert tok.max_token_id == max(max(vocab.values()), hf.vocab_size) == len(hf) - 1
    assert tok.max_chars_per_token == max(len(token) for token in vocab)
    assert tok.num_special_tokens_to_add() == hf.num_special_tokens_to_add() == len(tok.encode("")) == 1
    with pytest.raises(ValueError, match=r"pair=True\): text pairs are not supported"):
        tok.num_special_tokens_to_add(pair=True)
    assert tok.get_chat_template() == hf.get_chat_template() == tok.chat_template
    assert tok.get_chat_template("{{ messages }}") == hf.get_chat_template("{{ messages }}")
    with pytest.raises(TypeError, match="^chat_template must be a template's source"):
        tok.get_chat_template(5)


def test_batch_decode_and_decode_take_what_transformers_takes(llm, hf):
    """`batch_decode` was missing (an AttributeError naming `Tokenizer`); both take ids as transformers 5 does."""
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello the world")
    for given in ([ids, ids[:2]], (tuple(ids),), np.array([ids]), torch.tensor([ids]), ids, []):
        for skip in (False, True):
            assert tok.batch_decode(given, skip_special_tokens=skip) == hf.batch_decode(given, skip_special_tokens=skip)
            assert tok.decode(given, skip_special_tokens=skip) == hf.decode(given, skip_special_tokens=skip)
    for given in (np.array(ids), torch.tensor(ids), ids[0]):
        assert tok.decode(given) == hf.decode(given)


def test_decode_takes_an_encoding_as_transformers_5_does(llm, hf):
    """`tok.decode(tok.apply_chat_template(messages))` (transformers 5 returns a dict there by default, and decodes
    its input_ids) was a TypeError "takes token ids ..., not ChatEncoding"."""
    tok = llm.get_tokenizer()
    for make in (lambda t: t("Hello the world"), lambda t: dict(t("Hello")),
                 lambda t: t.apply_chat_template(MESSAGES, add_generation_prompt=True, sanitize_control_tokens=True,
                                                 **KWARGS)):
        for skip in (False, True):
            assert tok.decode(make(tok), skip_special_tokens=skip) == hf.decode(make(hf), skip_special_tokens=skip)
            assert tok.batch_decode(make(tok), skip_special_tokens=skip) == \
                hf.batch_decode(make(hf), skip_special_tokens=skip)
    # a batch's encoding gives its texts, as its input_ids do (transformers' decode fails on it)
    for batch in (tok(["Hello", "the world"]), tok("Hello", return_tensors="pt")):
        assert tok.decode(batch) == tok.batch_decode(batch) == tok.decode(batch["input_ids"])
    with pytest.raises(TypeError, match="not dict$"):
        tok.decode({"ids": [1]})


def _decoded(tokenizer, call, given):
    try:
        return getattr(tokenizer, call)(given)
    except TypeError:  # the messages differ: Glimmer's names the call and the item at fault
        return TypeError


def test_arrays_and_tensors_in_a_list_are_ids_before_a_batch_is_told_from_one_sequence(llm, hf):
    """A list of 1-element tensors (`list(column)`) was decoded as one sequence, silently, and a list of 1-D arrays
    or tensors was refused; transformers 5 converts them first, then decides by the first item."""
    tok = llm.get_tokenizer()
    column, rows = torch.tensor([[300], [301]]), torch.tensor([[300, 301, 302], [303, 304, 305]])
    cases = [list(column), list(rows), tuple(rows), [np.array([300, 301]), np.array([302])], list(rows.numpy()),
             [torch.tensor(300), torch.tensor(301)], [np.int64(300), np.int32(301)], [torch.tensor([300]), 301],
             [torch.tensor(300), torch.tensor([301])], [[300, 301], 302], [302, [300, 301]], [[torch.tensor(300)], []],
             [[]], [[[300]]], torch.tensor([[[300]]]), list(torch.zeros((2, 0), dtype=torch.long)), np.array(300)]
    for given in cases:
        for call in ("decode", "batch_decode"):
            assert _decoded(tok, call, given) == _decoded(hf, call, given), (call, given)
    assert tok.batch_decode(list(column)) == [tok.decode(300), tok.decode(301)]


@pytest.mark.parametrize("text", ["Hello the world", ["Hello", "a longer one", ""]], ids=["one", "batch"])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_calling_the_tokenizer_gives_what_transformers_gives(llm, hf, text, add_special_tokens):
    # a script reading enc["attention_mask"] (as HF's calls return it) met a KeyError
    assert llm.get_tokenizer()(text, add_special_tokens=add_special_tokens) == dict(
        hf(text, add_special_tokens=add_special_tokens))


def test_the_vocabulary_calls_answer_as_transformers_does(llm, hf):
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello the world")
    assert (tok.vocab_size, len(tok)) == (hf.vocab_size, len(hf)) and tok.vocab_size < len(tok)
    assert tok.tokenize("Hello the world") == hf.tokenize("Hello the world")
    for given in (ids, ids[0], np.array(ids), torch.tensor(ids)):
        for skip in (False, True):
            assert tok.convert_ids_to_tokens(given, skip_special_tokens=skip) == \
                hf.convert_ids_to_tokens(given, skip_special_tokens=skip)
    tokens = [*hf.convert_ids_to_tokens(ids), "not-a-token"]
    assert tok.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)
    assert tok.convert_tokens_to_ids(tokens[1]) == hf.convert_tokens_to_ids(tokens[1])
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == (hf.eos_token_id, hf.bos_token_id,
                                                                      hf.pad_token_id)


def test_convert_ids_to_tokens_and_all_special_ids_skip_the_named_tokens_as_transformers_does(llm, hf, nano):
    """convert_ids_to_tokens(skip_special_tokens=True) left out every token flagged special (19, the framing too) and
    all_special_ids listed them; transformers' are the named tokens (3), and only its decode leaves out all 19."""
    for tok, reference in ((llm.get_tokenizer(), hf), (nano.get_tokenizer(), AutoTokenizer.from_pretrained(
            default_model_dir()))):
        every_id = list(range(len(tok)))
        assert (tok.all_special_tokens, tok.all_special_ids) == (reference.all_special_tokens,
                                                                 reference.all_special_ids)
        for skip in (False, True):
            assert tok.convert_ids_to_tokens(every_id, skip_special_tokens=skip) == \
                reference.convert_ids_to_tokens(every_id, skip_special_tokens=skip)
            assert tok.decode(every_id, skip_special_tokens=skip) == reference.decode(every_id,
                                                                                      skip_special_tokens=skip)
        text_ids = tok.encode("<|start|>user<|message|>hi", add_special_tokens=True)
        kept = [i for i in text_ids if i not in tok.all_special_ids]  # a script stripping them keeps the framing
        assert kept == [i for i in text_ids if i not in reference.all_special_ids] == text_ids[1:]


def test_all_special_tokens_are_the_named_ones_once_in_transformers_order(tiny_checkpoint, tmp_path):
    checkpoint = shutil.copytree(tiny_checkpoint, tmp_path / "named")
    config_file = checkpoint / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(unk_token="<|reserved_special_token_0|>", pad_token=config["eos_token"])
    config_file.write_text(json.dumps(config))
    tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64).get_tokenizer()
    reference = AutoTokenizer.from_pretrained(checkpoint)
    assert tok.all_special_tokens == reference.all_special_tokens == [config["bos_token"], config["eos_token"],
                                                                      "<|reserved_special_token_0|>"]
    assert tok.all_special_ids == reference.all_special_ids


@pytest.mark.parametrize("config", [{}, {"clean_up_tokenization_spaces": True},
                                    {"clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": True},
                                    {"clean_up_tokenization_spaces": True,
                                     "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": True}])
def test_clean_up_tokenization_spaces_means_what_it_means_in_transformers(tiny_checkpoint, tmp_path, config):
    """decode and batch_decode refused it; transformers 5 takes the config's default for None and leaves a BPE
    tokenizer's text (Muse's) as it is unless the config forces the clean-up."""
    checkpoint = shutil.copytree(tiny_checkpoint, tmp_path / "clean_up")
    config_file = checkpoint / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | config))
    tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64).get_tokenizer()
    reference = AutoTokenizer.from_pretrained(checkpoint)
    ids = tok.encode("Hello , world . I 'm here ! Is it ? don 't , we 're")
    for clean_up in (None, True, False):
        assert tok.decode(ids, clean_up_tokenization_spaces=clean_up) == \
            reference.decode(ids, clean_up_tokenization_spaces=clean_up)
        assert tok.batch_decode([ids, ids[:3]], clean_up_tokenization_spaces=clean_up) == \
            reference.batch_decode([ids, ids[:3]], clean_up_tokenization_spaces=clean_up)
    cleaned = tok.decode(ids, clean_up_tokenization_spaces=True) != tok.decode(ids, clean_up_tokenization_spaces=False)
    assert cleaned is ("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output" in config)


@pytest.mark.parametrize("spaces", [True, False, None, 0, 1, "no"])
def test_spaces_between_special_tokens_of_any_value_is_taken_by_decode_as_transformers_takes_it(llm, hf, spaces):
    """decode and batch_decode raised TypeError on the argument vLLM's detokenizer passes, then on None, 0 and 1; a
    tokenizer.json tokenizer (Muse's) spaces tokens by its decoder alone and takes any value of the argument (as
    skip_special_tokens is not type-checked either), so transformers' text is the same whatever it is."""
    tok = llm.get_tokenizer()
    ids = [*tok.all_special_ids, *tok.encode("Hello <|start|>user<|message|>hi", add_special_tokens=True)]
    assert tok.decode(ids, spaces_between_special_tokens=spaces) == \
        hf.decode(ids, spaces_between_special_tokens=spaces) == tok.decode(ids)
    assert tok.batch_decode([ids, ids[:2]], skip_special_tokens=True, spaces_between_special_tokens=spaces) == \
        hf.batch_decode([ids, ids[:2]], skip_special_tokens=True, spaces_between_special_tokens=spaces)


TRANSFORMERS_ATTRIBUTES = ("model_max_length", "special_tokens_map", "padding_side", "truncation_side",
                           "added_tokens_decoder", "added_tokens_encoder", "name_or_path", "chat_template", "is_fast",
                           "model_input_names", "vocab", "eos_token", "eos_token_id", "bos_token", "bos_token_id",
                           "pad_token", "pad_token_id", "unk_token", "unk_token_id", "vocab_size")


def _checkpoint_with_tokenizer_config(tiny_checkpoint, directory, **changes):
    checkpoint = shutil.copytree(tiny_checkpoint, directory)
    config_file = checkpoint / "tokenizer_config.json"
    config = {k: v for k, v in json.loads(config_file.read_text()).items() if v is not None} | changes
    config_file.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return checkpoint


@pytest.mark.parametrize("changes", [{}, {"model_max_length": None, "padding_side": "left",
                                          "truncation_side": "left", "unk_token": "<|reserved_special_token_0|>"}],
                         ids=["as_written", "other_config"])
def test_the_attributes_vllm_users_read_are_transformers(tiny_checkpoint, tmp_path, changes):
    """model_max_length, special_tokens_map, padding_side, added_tokens_decoder, name_or_path, chat_template ... were
    AttributeErrors; each is what transformers reads from the same files (its default where the config has none)."""
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config", **changes)
    tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64).get_tokenizer()
    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    for name in TRANSFORMERS_ATTRIBUTES:
        assert getattr(tok, name) == getattr(reference, name), name
    assert len(tok) == len(reference) and tok.get_added_vocab() == reference.get_added_vocab()
    tokens = reference.tokenize("Hello the  world, ünïcode")
    assert tok.convert_tokens_to_string(tokens) == reference.convert_tokens_to_string(tokens)
    assert tok.convert_tokens_to_string([]) == reference.convert_tokens_to_string([]) == ""


SEP_CLS_MASK = ("sep_token", "sep_token_id", "cls_token", "cls_token_id", "mask_token", "mask_token_id")


@pytest.mark.parametrize("changes", [{}, {"sep_token": "<|reserved_special_token_0|>",
                                          "cls_token": "<|reserved_special_token_1|>",
                                          "mask_token": "<|reserved_special_token_2|>"}], ids=["unset", "set"])
def test_sep_cls_and_mask_tokens_are_transformers(tiny_checkpoint, tmp_path, changes):
    """`tok.sep_token`, `cls_token`, `mask_token` and their ids were AttributeErrors; each is what transformers reads
    from the same files (None where they set none), and the set ones are named special tokens in transformers'
    order (`special_tokens_map`, `all_special_tokens`)."""
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config", **changes)
    tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64).get_tokenizer()
    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    for name in (*SEP_CLS_MASK, "special_tokens_map", "all_special_tokens", "all_special_ids"):
        assert getattr(tok, name) == getattr(reference, name), name
    # transformers 5 renamed it extra_special_tokens: reading the old name fails there, and so it does here
    for name in ("additional_special_tokens", "additional_special_tokens_ids"):
        assert not hasattr(reference, name) and not hasattr(tok, name), name


R0, R1 = "<|reserved_special_token_0|>", "<|reserved_special_token_1|>"
EXTRA_SPECIAL_TOKEN_CONFIGS = {
    "none": {},
    "listed": {"extra_special_tokens": [R0, R1]},
    "older_name": {"additional_special_tokens": [R1, R0]},
    "both_names": {"additional_special_tokens": [R1], "extra_special_tokens": [R0]},
    "empty_list_and_older_name": {"additional_special_tokens": [R1], "extra_special_tokens": []},
    "named_in_a_dict": {"extra_special_tokens": {"image_token": "<|patch|>"}, "additional_special_tokens": [R0]},
    "model_specific_field": {"image_token": "<|patch|>", "video_token": "<|video|>"},
    "repeats_a_named_one": {"extra_special_tokens": ["<|begin_of_text|>", R0, R0]},
}


@pytest.mark.parametrize("changes", EXTRA_SPECIAL_TOKEN_CONFIGS.values(), ids=EXTRA_SPECIAL_TOKEN_CONFIGS.keys())
def test_extra_special_tokens_are_transformers(tiny_checkpoint, tmp_path, changes):
    """`tok.extra_special_tokens` was an AttributeError and `all_special_tokens` left out what tokenizer_config.json
    lists beyond the named tokens; each is what transformers 5 reads from the same files, the older
    `additional_special_tokens` and model-specific named tokens (`image_token`) included."""
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config", **changes)
    tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64).get_tokenizer()
    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    for name in ("extra_special_tokens", "extra_special_tokens_ids", "special_tokens_map", "all_special_tokens",
                 "all_special_ids"):
        assert getattr(tok, name) == getattr(reference, name), name
    for name in ("image_token", "image_token_id", "video_token", "video_token_id"):
        assert getattr(tok, name, None) == getattr(reference, name, None), name
    every_id = list(range(len(tok)))
    assert tok.convert_ids_to_tokens(every_id, skip_special_tokens=True) == \
        reference.convert_ids_to_tokens(every_id, skip_special_tokens=True)


R2 = "<|reserved_special_token_2|>"
LEGACY_MAP_CONFIGS = {  # (tokenizer_config.json changes, special_tokens_map.json changes)
    "older_name_in_the_map": ({}, {"additional_special_tokens": [R1, R0]}),
    "lists_in_both": ({"extra_special_tokens": [R0]}, {"extra_special_tokens": [R1, R0]}),
    "older_names_in_both": ({"additional_special_tokens": [R0]}, {"additional_special_tokens": [R1]}),
    "map_list_beside_the_older_name": ({"additional_special_tokens": [R0]}, {"extra_special_tokens": [R1]}),
    "older_name_in_the_map_beside_a_list": ({"extra_special_tokens": [R0]}, {"additional_special_tokens": [R1]}),
    "list_in_the_map_alone": ({}, {"extra_special_tokens": [R2, R1]}),
    "model_specific_in_the_map": ({}, {"image_token": "<|patch|>"}),
}


@pytest.mark.parametrize("decoder", [False, True], ids=["without_added_tokens_decoder", "with_added_tokens_decoder"])
@pytest.mark.parametrize(("config", "special_map"), LEGACY_MAP_CONFIGS.values(), ids=LEGACY_MAP_CONFIGS.keys())
def test_special_tokens_map_json_adds_extra_tokens_as_transformers_reads_it(tiny_checkpoint, tmp_path, config,
                                                                            special_map, decoder):
    """transformers 5 reads special_tokens_map.json's extra tokens for a tokenizer_config.json without
    `added_tokens_decoder` (older files) and ignores them beside it; Glimmer read them never."""
    changes = config if decoder else {**config, "added_tokens_decoder": None}
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config", **changes)
    map_file = checkpoint / "special_tokens_map.json"
    map_file.write_text(json.dumps(json.loads(map_file.read_text()) | special_map))
    tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64).get_tokenizer()
    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    for name in ("extra_special_tokens", "special_tokens_map", "all_special_tokens", "all_special_ids"):
        assert getattr(tok, name) == getattr(reference, name), name


NAMED_TOKEN_LAYOUTS = {  # tokenizer_config.json changes; special_tokens_map.json keeps bos, eos and pad
    "in_the_map_alone_beside_added_tokens_decoder": {"bos_token": None, "pad_token": None},
    "in_the_map_alone_without_added_tokens_decoder": {"bos_token": None, "pad_token": None,
                                                      "added_tokens_decoder": None},
    "in_both_without_added_tokens_decoder": {"pad_token": "<|reserved_special_token_0|>",
                                             "added_tokens_decoder": None},
}


@pytest.mark.parametrize("changes", NAMED_TOKEN_LAYOUTS.values(), ids=NAMED_TOKEN_LAYOUTS.keys())
def test_named_tokens_in_special_tokens_map_json_are_read_as_transformers_reads_them(tiny_checkpoint, tmp_path,
                                                                                     changes):
    """transformers 5 reads the map only for a config without `added_tokens_decoder`, and there the map's names win
    over the config's: a bos and pad the map alone named beside it were Glimmer's (None in transformers, and so in
    vLLM: the chat template's `{{ bos_token }}` writes nothing), and the config's pad won over the map's."""
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config", **changes)
    llm = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=1024)
    tok, reference = llm.get_tokenizer(), AutoTokenizer.from_pretrained(str(checkpoint))
    for name in ("bos_token", "bos_token_id", "pad_token", "pad_token_id", "special_tokens_map", "all_special_ids"):
        assert getattr(tok, name) == getattr(reference, name), name
    chat = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, current_date="2026-01-01") == \
        reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, current_date="2026-01-01")


def test_a_bos_the_files_do_not_name_is_still_written_once(tiny_checkpoint, tmp_path):
    """With bos named in special_tokens_map.json alone (unread beside `added_tokens_decoder`, as in transformers), a
    prompt is still told by the post-processor's bos: a template that writes it as text, or a text prompt that
    begins with it, gets no second one."""
    changes = NAMED_TOKEN_LAYOUTS["in_the_map_alone_beside_added_tokens_decoder"]
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config", **changes)
    llm = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=1024)
    bos = "<|begin_of_text|>"
    bos_id = llm.get_tokenizer().convert_tokens_to_ids(bos)
    template = llm.get_tokenizer().chat_template
    assert "bos_token if bos_token is defined else ''" in template
    written = template.replace("bos_token if bos_token is defined else ''", repr(bos))
    params = SamplingParams(max_tokens=1)
    for template_used in (None, written):
        ids = llm.chat([{"role": "user", "content": "hi"}], params, chat_template=template_used,
                       chat_template_kwargs={"current_date": "2026-01-01"})[0].output.prompt_token_ids
        assert ids[0] == bos_id and ids.count(bos_id) == 1
    assert llm.generate(bos + "hello", params)[0].prompt_token_ids.count(bos_id) == 1
    # as the README says: apply_chat_template's ids begin with it as chat's do, where transformers' have none
    chat = [{"role": "user", "content": "hi"}]
    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    assert llm.get_tokenizer().apply_chat_template(chat, return_dict=False, current_date="2026-01-01") == \
        [bos_id, *reference.apply_chat_template(chat, return_dict=False, add_generation_prompt=True,
                                                current_date="2026-01-01")]


def test_a_chat_template_sees_every_named_token_the_config_sets_as_transformers_passes_them(tiny_checkpoint, tmp_path):
    """The template saw bos, eos, pad and unk only: `{{ sep_token }}` or a model-specific `{{ image_token }}` rendered
    as nothing, silently; transformers 5 passes its whole `special_tokens_map`."""
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config", sep_token=R0,
                                                   image_token="<|patch|>")
    tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64).get_tokenizer()
    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    template = ("{{ bos_token }}[{{ sep_token }}][{{ image_token }}][{{ cls_token }}]"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    text = tok.apply_chat_template(MESSAGES, chat_template=template, tokenize=False)
    assert text == reference.apply_chat_template(MESSAGES, chat_template=template, tokenize=False)
    assert text == f"<|begin_of_text|>[{R0}][<|patch|>][]hi"
    assert tok.apply_chat_template(MESSAGES, chat_template=template) == dict(
        reference.apply_chat_template(MESSAGES, chat_template=template))


def test_a_model_specific_field_that_is_no_token_is_left_out_with_a_warning(tiny_checkpoint, tmp_path, caplog):
    """Any string field named `*_token` is a model-specific token to transformers, which adds an unknown one to the
    vocabulary; it may be no token at all, so loading goes on without it, saying so."""
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config", image_token="<|patch|>",
                                                   auth_token="hf_not_a_token")
    with caplog.at_level("WARNING", logger="glimmer.engine.tokenizer"):
        tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20,
                  max_model_len=64).get_tokenizer()
    assert "auth_token='hf_not_a_token' is not a token of the tokenizer; it is left out" in caplog.text
    assert tok.special_tokens_map["image_token"] == "<|patch|>" and "auth_token" not in tok.special_tokens_map
    assert "hf_not_a_token" not in tok.all_special_tokens


def test_an_extra_special_token_outside_the_vocabulary_is_refused(tiny_checkpoint, tmp_path):
    # transformers adds it as a new token, which the model has no embedding row for
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "config",
                                                   extra_special_tokens=["<|not_a_token|>"])
    with pytest.raises(CheckpointError, match=r"the special token '<\|not_a_token\|>' of .*tokenizer_config\.json is "
                                              r"not a token of .*tokenizer\.json"):
        LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64)


@pytest.mark.parametrize("arguments", [dict(padding=True), dict(padding="max_length", max_length=12),
                                       dict(truncation=True, max_length=3), dict(padding=True, return_tensors="pt"),
                                       dict(padding="longest", truncation=True, max_length=4, return_tensors="np"),
                                       dict(add_special_tokens=False, padding=True), dict(max_length=2),
                                       dict(max_length=2, truncation=False), dict(max_length=2, padding="do_not_pad")])
@pytest.mark.parametrize("side", ["right", "left"])
def test_calling_the_tokenizer_pads_and_truncates_as_transformers(llm, hf, arguments, side):
    """`tok(texts, padding=True, return_tensors="pt")` raised TypeError (unexpected keyword argument); it pads and cuts
    on the tokenizer's sides, which a script sets as on transformers' (`tok.padding_side = "left"`)."""
    tok = llm.get_tokenizer()
    texts = ["Hello the world", "a", "Hello"]
    for given in (texts, texts[0]):
        tok.padding_side = tok.truncation_side = side
        reference = AutoTokenizer.from_pretrained(hf.name_or_path, padding_side=side, truncation_side=side)
        ours, theirs = llm.get_tokenizer()(given, **arguments), reference(given, **arguments)
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert type(ours[key]) is type(theirs[key]), key
            assert getattr(ours[key], "dtype", None) == getattr(theirs[key], "dtype", None), key
            assert (ours[key].tolist() if hasattr(ours[key], "tolist") else ours[key]) == \
                (theirs[key].tolist() if hasattr(theirs[key], "tolist") else theirs[key]), key
    tok.padding_side = tok.truncation_side = "right"


@pytest.mark.parametrize("arguments", [dict(max_length=3), dict(max_length=3, truncation=False),
                                       dict(max_length=3, return_tensors="pt")])
def test_encode_with_max_length_alone_cuts_to_it_as_transformers(llm, hf, arguments):
    """`encode(text, max_length=3)` returned every token, where transformers (whose `truncation` defaults to None)
    cuts to max_length unless `truncation=False` says otherwise."""
    ours, theirs = llm.get_tokenizer().encode("Hello the world", **arguments), hf.encode("Hello the world", **arguments)
    assert type(ours) is type(theirs)
    assert (ours.tolist() if hasattr(ours, "tolist") else ours) == \
        (theirs.tolist() if hasattr(theirs, "tolist") else theirs)


@pytest.mark.parametrize("side", ["left", "right"])
def test_calling_the_tokenizer_takes_a_padding_side_for_the_call_as_transformers(llm, hf, side):
    """`tok(texts, padding=True, padding_side="left")` (transformers 5's argument) was a TypeError."""
    tok, texts = llm.get_tokenizer(), ["Hello the world", "a"]
    other = "right" if side == "left" else "left"
    tok.padding_side = hf.padding_side = other
    try:
        assert tok(texts, padding=True, padding_side=side) == dict(hf(texts, padding=True, padding_side=side))
        assert tok.encode(texts[1], padding="max_length", max_length=4, padding_side=side) == \
            hf.encode(texts[1], padding="max_length", max_length=4, padding_side=side)
        assert tok.padding_side == other  # the call's side is the call's alone
        with pytest.raises(ValueError, match="^padding_side must be 'right' or 'left', not 'top'$"):
            tok(texts, padding=True, padding_side="top")
    finally:
        tok.padding_side = hf.padding_side = "right"


@pytest.mark.parametrize(("argument", "instead"), [
    ("return_offsets_mapping", "load transformers.AutoTokenizer.from_pretrained()"),
    ("text_pair", "text pairs are not supported"), ("return_attention_mask", "leave it out"),
    ("pad_to_multiple_of", "padding='max_length'"), ("verbose", "leave it out")])
@pytest.mark.parametrize("call", ["__call__", "encode"])
def test_an_argument_of_transformers_tokenizer_call_glimmer_lacks_says_what_to_do(llm, argument, instead, call):
    """`tok(text, return_offsets_mapping=True)` met Python's bare "unexpected keyword argument"; it says what to do."""
    with pytest.raises(TypeError, match=rf"^LLMTokenizer\.{call}\(\) got an unexpected keyword argument '{argument}' "
                                        rf"\(transformers' {argument}=\): .*{re.escape(instead)}"):
        getattr(llm.get_tokenizer(), call)("Hello", **{argument: 2})
    with pytest.raises(TypeError, match=rf"^LLMTokenizer\.{call}\(\) got an unexpected keyword argument 'bogus'$"):
        getattr(llm.get_tokenizer(), call)("Hello", bogus=1)


def test_truncation_only_second_of_one_text_says_text_pairs_are_not_supported(llm):
    """Calling the tokenizer on a text with truncation='only_second' said "a chat is one" of the text."""
    with pytest.raises(RequestError, match=r"^truncation='only_second' needs a second sequence, and a chat or a text "
                                           r"is one \(text pairs are not supported\): use truncation=True$") as caught:
        llm.get_tokenizer()("Hello the world", truncation="only_second", max_length=2)
    assert caught.value.param == "truncation"


@pytest.mark.parametrize("arguments", [dict(padding="max_length"), dict(padding="max_length", truncation=True),
                                       dict(padding="max_length", max_length=10**25), dict(truncation=True)])
def test_padding_to_max_length_without_a_model_max_length_pads_nothing_as_transformers(tiny_checkpoint, tmp_path,
                                                                                         arguments):
    """A tokenizer_config.json without `model_max_length` (transformers' 1e30, no limit): padding='max_length' without
    max_length raised OverflowError ("cannot fit 'int' into an index-sized integer"); transformers pads nothing."""
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "no-limit", model_max_length=None)
    tok = LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64).get_tokenizer()
    hf = AutoTokenizer.from_pretrained(checkpoint)
    assert tok.model_max_length == hf.model_max_length > 10**20
    texts = ["Hello the world", "a"]
    expected = {"input_ids": [tok.encode(text) for text in texts], "attention_mask": [[1] * len(tok.encode(text))
                                                                                      for text in texts]}
    assert tok(texts, **arguments) == expected
    if "max_length" not in arguments:  # transformers runs out of memory padding to 1e25
        assert dict(hf(texts, **arguments)) == expected


def test_calling_the_tokenizer_on_no_texts_gives_no_sequences_whatever_the_padding(llm):
    """`tok([], padding=True)` (an empty batch of a loop) raised "max() arg is an empty sequence"."""
    for padding in (False, True, "longest", "max_length"):
        assert llm.get_tokenizer()([], padding=padding, max_length=4) == {"input_ids": [], "attention_mask": []}


def test_apply_chat_template_pads_on_the_tokenizers_side(llm, hf):
    tok = llm.get_tokenizer()
    batch = [MESSAGES, [{"role": "user", "content": "a longer question here"}]]
    right = tok.apply_chat_template(batch, padding=True, **KWARGS)["input_ids"]
    tok.padding_side = "left"
    try:
        left = tok.apply_chat_template(batch, padding=True, **KWARGS)["input_ids"]
    finally:
        tok.padding_side = "right"
    pad = tok.pad_token_id
    assert right[0][-1] == pad and left[0][0] == pad and left[0][-1] != pad
    assert [i for i in left[0] if i != pad] == [i for i in right[0] if i != pad]


@pytest.mark.parametrize("limit", [None, "8", 0, -3, 2.5, True])
def test_a_model_max_length_a_script_sets_is_checked(llm, limit):
    """`tok.model_max_length = None` (or "8", 2.5) was taken, and the next call with truncation or padding failed deep
    inside ("'>' not supported between instances of 'NoneType' and 'int'"); 0 or -3 cut every text to its BOS."""
    tok = llm.get_tokenizer()
    with pytest.raises(ValueError, match=f"^model_max_length must be a positive integer, not {re.escape(repr(limit))}"):
        tok.model_max_length = limit
    assert tok.model_max_length == 131072
    tok.model_max_length = np.int64(3)
    try:
        assert tok.model_max_length == 3 and type(tok.model_max_length) is int
        assert tok("Hello the world", truncation=True)["input_ids"] == tok.encode("Hello the world")[:3]
    finally:
        tok.model_max_length = 131072


def test_get_tokenizer_is_one_object_whose_sides_are_checked(llm):
    assert llm.get_tokenizer() is llm.get_tokenizer()
    with pytest.raises(ValueError, match="^padding_side must be 'right' or 'left', not 'top'$"):
        llm.get_tokenizer().padding_side = "top"
    with pytest.raises(TypeError, match=r"^LLMTokenizer\.convert_tokens_to_string\(\) takes a list of token strings"):
        llm.get_tokenizer().convert_tokens_to_string("Hello")
    assert llm.get_tokenizer().padding_side == "right"


@pytest.mark.parametrize(("field", "value"), [("padding_side", "up"), ("truncation_side", 1),
                                              ("model_max_length", "long"), ("model_max_length", 0)])
def test_a_tokenizer_config_with_a_bad_shape_field_is_refused_naming_it(tiny_checkpoint, tmp_path, field, value):
    checkpoint = _checkpoint_with_tokenizer_config(tiny_checkpoint, tmp_path / "bad", **{field: value})
    with pytest.raises(CheckpointError, match=f"^{field}={value!r} in .*tokenizer_config.json is not"):
        LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64)


@pytest.mark.parametrize(("name", "instead"), [
    ("backend_tokenizer", "tokenizers.Tokenizer.from_file(str(tok.tokenizer_file))"),
    ("additional_special_tokens", "extra_special_tokens"), ("encode_plus", "tok(text)"),
    ("add_tokens", "Glimmer adds no tokens"), ("pad", "tok(texts, padding=True)"),
    ("clean_up_tokenization_spaces", "decode() and batch_decode() take clean_up_tokenization_spaces=")])
def test_reading_one_of_transformers_tokenizer_attributes_glimmer_lacks_says_what_to_use(llm, hf, name, instead):
    """`tok.backend_tokenizer` or `tok.add_tokens` met Python's bare AttributeError; it now says what to use."""
    with pytest.raises(AttributeError, match=f"^'LLMTokenizer' object has no attribute '{name}' \\(transformers' "
                                             f"tokenizer.{name}\\): .*{re.escape(instead)}") as caught:
        getattr(llm.get_tokenizer(), name)
    assert caught.value.name == name and not hasattr(llm.get_tokenizer(), name)


def test_what_the_missing_attributes_say_to_use_gives_transformers_answer(llm, hf):
    import tokenizers

    tok = llm.get_tokenizer()
    assert str(tokenizers.Tokenizer.from_file(str(tok.tokenizer_file)).decoder) == str(hf.backend_tokenizer.decoder)
    assert tok.model_max_length - tok.num_special_tokens_to_add() == hf.max_len_single_sentence
    ids = tok.encode("Hello <|eot|> world")
    assert [int(i in tok.all_special_ids) for i in ids] == hf.get_special_tokens_mask(ids,
                                                                                        already_has_special_tokens=True)
    assert json.loads(tok.tokenizer_file.with_name("tokenizer_config.json").read_text())["model_max_length"] == \
        hf.init_kwargs["model_max_length"]


def test_tokenizer_errors_name_the_llm_tokenizer(llm):
    tok = llm.get_tokenizer()
    with pytest.raises(AttributeError, match="^'LLMTokenizer' object has no attribute 'batch_decoder'$"):
        tok.batch_decoder  # noqa: B018
    with pytest.raises(TypeError, match=r"^LLMTokenizer\.decode\(\) takes token ids .* not str$"):
        tok.decode("Hello")
    with pytest.raises(TypeError, match=r"^LLMTokenizer\.batch_decode\(\) \(sequence 1\) takes token ids \(integers >= "
                                        r"0\); item 0 is -1$"):
        tok.batch_decode([[1], [-1]])
    with pytest.raises(TypeError, match=r"^LLMTokenizer\.convert_ids_to_tokens\(\) takes token ids"):
        tok.convert_ids_to_tokens("Hello")
    for call in ("decode", "batch_decode", "convert_ids_to_tokens"):  # it said "..., not int" of an int
        with pytest.raises(TypeError, match=rf"^LLMTokenizer\.{call}\(\) takes token ids \(integers >= 0\), not -1$"):
            getattr(tok, call)(-1)
        with pytest.raises(TypeError, match=r"\(integers >= 0\), not -2$"):
            getattr(tok, call)(np.int64(-2))
    with pytest.raises(TypeError, match=r"^LLMTokenizer\.encode\(\) takes a string, not list$"):
        tok.encode([1, 2])


def test_an_encoding_given_as_a_prompt_is_refused_saying_to_pass_its_input_ids(llm):
    """apply_chat_template returns transformers 5's dict by default; handed to generate it is refused, saying how."""
    encoding = llm.get_tokenizer().apply_chat_template(MESSAGES, **KWARGS)
    for prompt, param in (({"prompt_token_ids": encoding}, "prompt.prompt_token_ids"), (encoding, "prompt")):
        with pytest.raises(RequestError, match=r"pass its \['input_ids'\], or call apply_chat_template\(\.\.\., "
                                               r"return_dict=False\)") as caught:
            llm.generate(prompt, SamplingParams(max_tokens=1))
        assert caught.value.param == param
    by_ids = llm.generate({"prompt_token_ids": encoding["input_ids"]}, SamplingParams(max_tokens=1))[0]
    assert by_ids.prompt_token_ids == encoding["input_ids"]


def test_apply_chat_template_renders_as_chat_does(llm):
    tok = llm.get_tokenizer()
    out = llm.chat(MESSAGES, SamplingParams(max_tokens=1), tools=[WEATHER_TOOL], chat_template_kwargs=KWARGS)[0]
    ids = tok.apply_chat_template(MESSAGES, tools=[WEATHER_TOOL], **KWARGS)["input_ids"]
    assert ids == out.output.prompt_token_ids and ids.count(tok.bos_token_id) == 1
    assert tok.apply_chat_template(MESSAGES, tools=[WEATHER_TOOL], tokenize=False, **KWARGS) == out.output.prompt
    bare = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False, **KWARGS)
    assert not bare.endswith("<|start|>assistant")


# 3. max_tokens past max_model_len ends the output there -------------------------------------------------------------

def test_generate_stops_at_max_model_len_instead_of_refusing(llm):
    prompt = [llm.get_tokenizer().bos_token_id] + [10] * (llm.engine.max_model_len - 5)
    out = llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    unbounded = llm.generate([prompt], SamplingParams(max_tokens=None, ignore_eos=True))[0]
    assert len(unbounded.token_ids) == 4


def test_generate_stops_at_max_model_len_under_a_min_tokens_past_it_as_vllm(llm):
    prompt = [llm.get_tokenizer().bos_token_id] + [10] * (llm.engine.max_model_len - 5)
    for max_tokens in (16, None):
        out = llm.generate([prompt], SamplingParams(max_tokens=max_tokens, min_tokens=8))[0].outputs[0]
        assert len(out.token_ids) == 4 and out.finish_reason == "length"
        assert not set(out.token_ids) & set(llm.engine.generation_defaults.stop_token_ids)  # held off to the end


def test_a_prompt_that_fills_max_model_len_is_refused_naming_it(llm):
    with pytest.raises(RequestError) as caught:
        llm.generate([[10] * llm.engine.max_model_len], SamplingParams(max_tokens=1))
    assert caught.value.param == "prompts[0]" and "no room" in str(caught.value)
    assert not llm.engine.has_unfinished_requests


def test_a_prompt_over_max_model_len_is_refused_as_exceeding_it(llm):
    limit = llm.engine.max_model_len
    with pytest.raises(RequestError) as caught:
        llm.generate([10] * (limit + 1), SamplingParams(max_tokens=1))
    assert caught.value.param == "prompt"
    assert str(caught.value) == (f"This model's maximum context length is {limit} tokens (max_model_len), but the "
                                 f"prompt has {limit + 1} tokens; shorten the prompt")


def test_a_conversation_of_several_over_max_model_len_is_refused_saying_to_shorten_its_messages(llm):
    """LLM.chat's second conversation was told "shorten the prompt", generate's wording: chat takes no prompt."""
    limit = llm.engine.max_model_len
    conversations = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "hi " * limit}]]
    with pytest.raises(ContextLengthError) as caught:
        llm.chat(conversations, SamplingParams(max_tokens=1))
    assert caught.value.param == "messages[1]" and str(caught.value).startswith("messages[1]: This model's maximum")
    assert str(caught.value).endswith("; shorten the messages")


# 6. errors name the prompt; stop set late; numpy and tuple token ids ------------------------------------------------

def test_prompt_errors_name_the_prompt(llm):
    with pytest.raises(RequestError) as caught:
        llm.generate(["fine", "a" * (llm.engine.max_prompt_chars + 1)])
    assert caught.value.param == "prompts[1]" and "messages" not in str(caught.value)
    image = Image.new("RGB", (32, 32))
    with pytest.raises(RequestError) as caught:
        llm.generate({"prompt": "<|patch|>", "multi_modal_data": {"image": image}})
    assert caught.value.param == "prompt" and "vision" in str(caught.value)  # one prompt, not a list


def test_a_chat_prompt_refused_for_its_characters_names_the_part_that_made_it_long(llm):
    """LLM.chat named `messages`, "shorten the messages", whatever made a prompt too long to tokenize: a long system
    message, tools or documents included. The parts are measured as the server measures them, the largest named (in
    its conversation, of several); a conversation refused so loads none of its media."""
    text = "x" * (llm.engine.max_prompt_chars + 1)
    hi = {"role": "user", "content": "hi"}
    tool = {"type": "function", "function": {"name": "f", "description": text, "parameters": {"type": "object"}}}
    unreachable = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}]}
    cases = [
        ({"messages": [{"role": "system", "content": text}, hi]}, "messages[0]", "shorten or remove messages[0]"),
        ({"messages": [hi], "tools": [tool]}, "tools", "shorten or remove tools"),
        ({"messages": [hi], "documents": [{"title": "t", "text": text}], "chat_template_kwargs": {"note": "n"},
          "chat_template": "<|begin_of_text|>{% for m in messages %}{{ m.content }}{% endfor %}{{ documents }}"
                           "{{ note }}{% if add_generation_prompt %}<|start|>assistant{% endif %}"},
         "documents", "shorten or remove documents"),  # measured apart from the other template variables
        ({"messages": [{"role": "user", "content": text}]}, "messages", "shorten the messages"),
        ({"messages": [[hi], [{"role": "system", "content": text}, unreachable]]}, "messages[1][0]",
         "shorten or remove messages[1][0]"),
        ({"messages": [[hi], [{"role": "user", "content": text}]]}, "messages[1]", "shorten or remove messages[1]"),
    ]
    for arguments, param, fix in cases:
        with pytest.raises(PromptTextTooLongError) as caught:
            llm.chat(**arguments, sampling_params=SamplingParams(max_tokens=1))
        assert caught.value.param == param and str(caught.value).endswith(fix), (param, str(caught.value))


def test_stop_set_to_one_string_after_construction_is_taken(llm):
    params = SamplingParams(temperature=0, max_tokens=8)
    params.stop = "x"
    llm.generate("Hello", params)
    assert params.stop == ["x"]


@pytest.mark.parametrize(("stop", "stop_token_ids", "expected"), [
    (None, None, ([], [])), (("x", "y"), (5,), (["x", "y"], [5]))])
def test_stop_fields_set_after_construction_are_taken_as_at_construction(llm, stop, stop_token_ids, expected):
    """vLLM's default `stop=None`, or a tuple, set on an existing SamplingParams was refused on submission though the
    constructor takes it."""
    params = SamplingParams(temperature=0, max_tokens=2)
    params.stop, params.stop_token_ids = stop, stop_token_ids
    llm.generate("Hello", params)
    assert (params.stop, params.stop_token_ids) == expected == (SamplingParams(stop=stop).stop,
                                                               SamplingParams(stop_token_ids=stop_token_ids).stop_token_ids)


def test_token_ids_of_any_integral_type_are_taken(llm):
    ids = llm.get_tokenizer().encode("Hello")
    greedy = SamplingParams(temperature=0, max_tokens=3)
    expected = llm.generate([ids], greedy)[0].token_ids
    for prompt in (list(np.array(ids)), tuple(ids), {"prompt_token_ids": list(np.array(ids, dtype=np.int32))}):
        got = llm.generate(prompt, greedy)[0]
        assert got.token_ids == expected and all(type(t) is int for t in got.prompt_token_ids)
    with pytest.raises(RequestError) as caught:
        llm.generate([[1.0, 2.0]])
    assert caught.value.param == "prompts[0]" and "integers" in str(caught.value)


# 5. LLM.chat's rendering arguments: chat_template, add_generation_prompt, continue_final_message --------------------

def _forcing(tok, token="Ġthe", count=3):
    """Greedy sampling that writes `token` `count` times (a reply whose text is known on a random model)."""
    return SamplingParams(temperature=0, max_tokens=count, logit_bias={tok.convert_tokens_to_ids(token): 100})


def test_continue_final_message_continues_the_assistant_answer_and_parses_the_reply_as_its_continuation(llm):
    """P-TMPL-8: the prompt ends inside the final assistant message, and the parser starts in its channel: the reply's
    text is the answer's continuation as written (its leading space kept), not a new turn's header."""
    tok = llm.get_tokenizer()
    messages = [*MESSAGES, {"role": "assistant", "content": "Hello"}]
    out = llm.chat(messages, _forcing(tok), chat_template_kwargs=KWARGS, continue_final_message=True)[0]
    assert out.output.prompt.endswith("<|start|>assistant to=user<|message|>Hello")
    assert out.output.prompt_token_ids == tok.apply_chat_template(messages, continue_final_message=True,
                                                                  return_dict=False, **KWARGS)
    assert out.output.text == " the the the"
    assert (out.reasoning, out.content, out.finish_reason) == (None, " the the the", "length")


def test_continue_final_message_naming_the_reasoning_continues_it(llm, nano):
    tok = llm.get_tokenizer()
    messages = [*MESSAGES, {"role": "assistant", "reasoning_content": "Let me think", "content": None}]
    out = llm.chat(messages, _forcing(tok), chat_template_kwargs=KWARGS, continue_final_message="reasoning_content")[0]
    assert out.output.prompt.endswith("<|start|>assistant to=self<|message|>Let me think")
    assert (out.reasoning, out.content) == (" the the the", None)
    # the embedded model goes on from its reasoning to an answer: each part where it belongs
    messages = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "reasoning_content": "The user asks about France.", "content": None}]
    greedy = SamplingParams(temperature=0, max_tokens=80)
    out = nano.chat(messages, greedy, continue_final_message="reasoning_content")[0]
    assert out.output.text.startswith(out.reasoning + "<|eom|><|start|>assistant to=user<|message|>")
    assert out.content and out.output.text.endswith(out.content + "<|eot|>")


def test_continue_final_message_to_a_tool_returns_the_whole_call(llm):
    """The README's promise: a final message to a tool continues as that tool's call. Its ATEM is read from the
    message's body in the prompt on (P-TMPL-8); the reply alone, here the turn's end, held no call."""
    tok = llm.get_tokenizer()
    body = ('<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris'
            '</atem:parameter>\n</atem:invoke>\n')
    messages = [*MESSAGES, {"role": "assistant", "recipient": "get_weather", "content": body}]
    ends_the_turn = SamplingParams(temperature=0, max_tokens=1, logit_bias={tok.convert_tokens_to_ids("<|eot|>"): 100})
    out = llm.chat(messages, ends_the_turn, tools=[WEATHER_TOOL], chat_template_kwargs=KWARGS,
                   continue_final_message=True)[0]
    assert out.output.prompt.endswith("<|start|>assistant to=get_weather<|message|>" + body)
    assert out.output.text == "<|eot|>"
    assert [(call.name, call.arguments) for call in out.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert (out.content, out.finish_reason) == (None, "tool_calls")


@pytest.mark.parametrize("given", ["reasoning_content", "reasoning", "thinking"])
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
def test_continue_final_message_finds_the_reasoning_under_any_of_its_names(llm, given, field):
    """The three names are one field: `continue_final_message="reasoning"` found only a key so named."""
    tok = llm.get_tokenizer()
    messages = [*MESSAGES, {"role": "assistant", given: "Let me think", "content": None}]
    out = llm.chat(messages, _forcing(tok), chat_template_kwargs=KWARGS, continue_final_message=field)[0]
    assert out.output.prompt.endswith("<|start|>assistant to=self<|message|>Let me think")
    assert (out.reasoning, out.content) == (" the the the", None)


def test_add_generation_prompt_false_ends_the_prompt_after_the_final_message(llm):
    tok = llm.get_tokenizer()
    out = llm.chat(MESSAGES, _forcing(tok), chat_template_kwargs=KWARGS, add_generation_prompt=False)[0]
    assert out.output.prompt == tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=False, **KWARGS)
    assert out.output.prompt.endswith("hi<|eot|>")
    assert out.content == parse_output(out.output.text).content == "the the the"  # a turn of its own, header first


def test_chat_template_renders_with_the_template_given(llm):
    template = ("{{ bos_token }}{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>"
                "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}")
    out = llm.chat(MESSAGES, SamplingParams(max_tokens=1), chat_template=template)[0]
    assert out.output.prompt == "<|begin_of_text|><|start|>user<|message|>hi<|eot|><|start|>assistant"
    assert out.output.prompt_token_ids == llm.get_tokenizer().apply_chat_template(MESSAGES, chat_template=template,
                                                                                  return_dict=False)
    with pytest.raises(RequestError) as caught:
        llm.chat(MESSAGES, chat_template=open)
    assert caught.value.param == "chat_template"


@pytest.mark.parametrize("template,fault", [
    ("{{ bos_token }}{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>{% endfor %}",
     "generation prompt"),
    ("{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>{% endfor %}"
     "{% if add_generation_prompt %}<|start|>assistant{% endif %}", "P-TMPL-5"),
    ("{{ bos_token }}{{ messages[5].content }}<|start|>assistant", "probe"),
], ids=["no-generation-prompt", "no-bos", "fails-to-render"])
def test_a_chat_template_the_parser_cannot_read_replies_after_is_refused(llm, template, fault):
    # P-TMPL-8: the reply is parsed from `<|start|>assistant` on; P-TMPL-5: one bos. The checkpoint's template and a
    # server request's pass the same check; a template without either gave prompts whose replies parsed wrongly.
    with pytest.raises(RequestError, match=fault) as caught:
        llm.chat(MESSAGES, SamplingParams(max_tokens=1), chat_template=template)
    assert caught.value.param == "chat_template"


ANSWERED = [*MESSAGES, {"role": "assistant", "content": "x"}]


@pytest.mark.parametrize(("arguments", "messages", "param", "message"), [
    ({"continue_final_message": True, "add_generation_prompt": True}, ANSWERED, "continue_final_message",
     "with add_generation_prompt=True"),
    ({"continue_final_message": True}, MESSAGES, "continue_final_message", "the final message has role 'user'"),
    ({"continue_final_message": True}, [ANSWERED, MESSAGES], "continue_final_message",
     "messages[1]: the final message has role 'user'"),
    ({"continue_final_message": "tool_calls"}, ANSWERED, "continue_final_message",
     "LLM.chat continues 'content' or 'reasoning_content'"),
    ({"add_generation_prompt": "yes"}, MESSAGES, "add_generation_prompt", "must be True, False or None"),
])
def test_conflicting_or_invalid_rendering_arguments_are_value_errors_naming_them(llm, arguments, messages, param,
                                                                                 message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        llm.chat(messages, SamplingParams(max_tokens=1), chat_template_kwargs=KWARGS, **arguments)
    assert isinstance(caught.value, RequestError) and caught.value.param == param


@pytest.mark.parametrize(("arguments", "constraint"), [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "tool_choice"),
    ({"thinking_token_budget": 4}, "thinking_token_budget")])
@pytest.mark.parametrize("ending", ["continue_final_message", "add_generation_prompt"])
def test_a_prompt_that_does_not_end_with_the_generation_prompt_refuses_a_turn_grammar(llm, arguments, constraint,
                                                                                      ending):
    """A turn's grammar starts at the generation prompt: after another prompt end it would constrain a wrong turn."""
    messages = [*MESSAGES, {"role": "assistant", "content": "Hel"}]
    given = {"continue_final_message": True} if ending == "continue_final_message" else {"add_generation_prompt": False}
    with pytest.raises(RequestError, match=f"^{ending}: cannot be combined with {constraint}") as caught:
        llm.chat(messages, SamplingParams(max_tokens=1), chat_template_kwargs=KWARGS, **given, **arguments)
    assert caught.value.param == ending


def test_rendering_arguments_in_template_kwargs_name_the_llm_chat_arguments(llm):
    """vLLM's LLM.chat reads them from chat_template_kwargs too; a template never would: not silently ignored."""
    messages = [*MESSAGES, {"role": "assistant", "content": "Hel"}]
    for name in ("add_generation_prompt", "continue_final_message", "chat_template"):
        with pytest.raises(RequestError) as caught:
            llm.chat(messages, chat_template_kwargs={name: False})
        assert caught.value.param == "chat_template_kwargs" and f"LLM.chat(messages, {name}=...)" in str(caught.value)


# 4. stop_reason as vLLM reports it ----------------------------------------------------------------------------------

def test_the_tokenizer_eos_reports_no_stop_reason_other_stop_ids_report_theirs(nano):
    eos = nano.get_tokenizer().eos_token_id
    out = nano.generate("hi", SamplingParams(temperature=0, max_tokens=3, logit_bias={eos: 100}))[0].outputs[0]
    assert out.token_ids == [eos] and out.finish_reason == "stop" and out.stop_reason is None
    eot = next(i for i in nano.engine.generation_defaults.stop_token_ids if i != eos)
    out = nano.generate("hi", SamplingParams(temperature=0, max_tokens=3, logit_bias={eot: 100}))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == eot
    listed = SamplingParams(temperature=0, max_tokens=3, logit_bias={eos: 100}, stop_token_ids=[eos], ignore_eos=True)
    assert nano.generate("hi", listed)[0].outputs[0].stop_reason == eos


def test_cumulative_logprob_sums_the_token_logprobs_as_vllm_reports_it(llm):
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=5, logprobs=0))[0].outputs[0]
    assert out.cumulative_logprob == pytest.approx(sum(entry.logprob for entry in out.logprobs))
    assert out.cumulative_logprob < 0
    assert llm.generate("Hello", SamplingParams(max_tokens=2))[0].outputs[0].cumulative_logprob is None


# 7. dtype and seed as vLLM takes them -------------------------------------------------------------------------------

@pytest.mark.parametrize(("dtype", "expected"), [("auto", torch.float32), (torch.float32, torch.float32),
                                                 (torch.bfloat16, torch.bfloat16), ("float", torch.float32)])
def test_dtype_auto_and_torch_dtypes_are_taken(tiny_checkpoint, dtype, expected):
    assert LLM(str(tiny_checkpoint), device="cpu", dtype=dtype, progress=False).engine.dtype == expected


def test_unsupported_dtypes_are_refused_naming_the_choices(tiny_checkpoint):
    for dtype in (torch.int8, "float64"):
        with pytest.raises(ConfigError, match="dtype=.*'auto'"):
            LLM(str(tiny_checkpoint), device="cpu", dtype=dtype, progress=False)


def test_seed_none_draws_a_fresh_engine_seed(tiny_checkpoint):
    first, second = (LLM(str(tiny_checkpoint), device="cpu", seed=None, progress=False) for _ in range(2))
    assert isinstance(first.engine.config.seed, int) and first.engine.config.seed != second.engine.config.seed
    # a random seed may draw the end of the turn first: only the count of tokens is checked
    assert len(first.generate("Hello", SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids) == 2


DOCUMENTS_TEMPLATE = ("{{ bos_token }}{% for d in documents or [] %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
                      "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>{% endfor %}"
                      "{% if add_generation_prompt %}<|start|>assistant{% endif %}")


def test_chat_takes_vllms_documents_as_apply_chat_template_does(llm):
    documents = [{"title": "t", "text": "x"}]
    out = llm.chat(MESSAGES, SamplingParams(max_tokens=1), chat_template=DOCUMENTS_TEMPLATE, documents=documents)[0]
    assert out.output.prompt.startswith("<|begin_of_text|>[t: x]<|start|>user")
    assert out.output.prompt == llm.get_tokenizer().apply_chat_template(
        MESSAGES, chat_template=DOCUMENTS_TEMPLATE, documents=documents, tokenize=False)
    with pytest.raises(RequestError) as caught:
        llm.chat(MESSAGES, documents=["x"])
    assert caught.value.param == "documents[0]"


@pytest.mark.parametrize("call,name,value", [
    ("generate", "lora_request", object()), ("generate", "priority", [1]), ("generate", "tokenization_kwargs",
                                                                            {"truncation": True}),
    ("chat", "lora_request", object()), ("chat", "chat_template_content_format", "string"),
    ("chat", "mm_processor_kwargs", {"max_pixels": 100}),
    # older vLLM's; "prompt_token_ids" was "did you mean 'prompts'?", with no word of how to pass the ids
    ("generate", "prompt_token_ids", [[1, 10, 11]]), ("generate", "guided_options_request", {"guided_json": {}}),
])
def test_a_vllm_argument_of_generate_or_chat_is_refused_naming_it_and_what_to_do(llm, call, name, value):
    # vLLM's LLM.generate / LLM.chat take these; Python's bare "unexpected keyword argument" said nothing more
    first = "hi" if call == "generate" else MESSAGES
    with pytest.raises(UnsupportedArgumentError, match=f"{name}: an argument of vLLM's LLM.{call}") as caught:
        getattr(llm, call)(first, SamplingParams(max_tokens=1), **{name: value})
    assert caught.value.param == name and isinstance(caught.value, TypeError)


def test_chat_takes_use_tqdm_third_by_position_as_vllms_does(llm):
    """vLLM's `LLM.chat(messages, sampling_params, use_tqdm)`: the third positional argument was a TypeError."""
    params = SamplingParams(max_tokens=2, temperature=0)
    by_position = llm.chat(MESSAGES, params, False, chat_template_kwargs=KWARGS)[0]
    assert by_position.output.token_ids == llm.chat(MESSAGES, params, use_tqdm=False,
                                                    chat_template_kwargs=KWARGS)[0].output.token_ids
    with pytest.raises(RequestError) as caught:
        llm.chat(MESSAGES, params, "yes")
    assert caught.value.param == "use_tqdm"


def test_vllm_arguments_of_generate_and_chat_that_change_nothing_are_taken(llm):
    params = SamplingParams(max_tokens=2, temperature=0)
    want = llm.generate("hi", params)[0].outputs[0].token_ids
    got = llm.generate("hi", params, lora_request=None, priority=[0], tokenization_kwargs=None)[0].outputs[0].token_ids
    assert got == want
    chat = llm.chat(MESSAGES, params)[0].output.token_ids
    assert llm.chat(MESSAGES, params, lora_request=None, chat_template_content_format="auto",
                    mm_processor_kwargs={})[0].output.token_ids == chat


def test_sampling_params_of_another_count_than_the_prompts_are_refused_naming_the_argument(llm):
    """generate said "got 1 SamplingParams for 2 prompts", naming neither the argument nor the fix, where chat names
    both."""
    with pytest.raises(RequestError, match=r"^sampling_params: 1 for 2 prompts; give one, or one per prompt$"):
        llm.generate(["a", "b"], [SamplingParams(max_tokens=1)])
    with pytest.raises(RequestError, match=r"^sampling_params: 2 for 1 conversations; give one, or one per "):
        llm.chat([[{"role": "user", "content": "a"}]], [SamplingParams(max_tokens=1)] * 2)


@pytest.mark.parametrize(("prompt", "key", "fix"), [
    ({"prompt": "hi", "multi_modal_uuids": {"image": ["cat-1"]}}, "multi_modal_uuids", "by its content"),
    ({"prompt_embeds": torch.zeros(2, 8)}, "prompt_embeds", "prompts are text or token ids"),
    ({"prompt_token_ids": [1, 2], "token_type_ids": [0, 0]}, "token_type_ids", "generative models only"),
    ({"encoder_prompt": "hi", "decoder_prompt": None}, "encoder_prompt", "decoder-only"),
])
def test_a_key_of_vllms_prompt_dicts_glimmer_lacks_is_refused_saying_what_to_do(llm, prompt, key, fix):
    """They were "unknown key(s)", listed beside the keys taken, with no word of what Glimmer does instead."""
    with pytest.raises(UnsupportedArgumentError, match=rf"^prompt\.{key}: a key of vLLM's prompt dicts .*{fix}"):
        llm.generate(prompt, SamplingParams(max_tokens=1))


def test_a_key_of_vllms_prompt_dicts_at_a_value_that_changes_nothing_is_taken(llm):
    params = SamplingParams(max_tokens=2, temperature=0)
    plain = llm.generate({"prompt": "hi"}, params)[0].outputs[0].token_ids
    keyed = llm.generate({"prompt": "hi", "multi_modal_uuids": None, "prompt_embeds": None, "token_type_ids": None},
                         params)
    assert keyed[0].outputs[0].token_ids == plain


def test_a_misspelled_argument_of_generate_names_the_closest(llm):
    with pytest.raises(UnsupportedArgumentError, match="did you mean 'use_tqdm'"):
        llm.generate("hi", SamplingParams(max_tokens=1), use_tqmd=False)


def test_a_misspelled_vllm_argument_names_the_closest_one_glimmer_takes():
    """vLLM's arguments taken at the values that change nothing are arguments a script passes too: a misspelled
    one (`tensor_paralel_size=1`) listed Glimmer's own fields with no suggestion."""
    with pytest.raises(UnsupportedArgumentError, match="did you mean 'tensor_parallel_size'"):
        LLM("/nonexistent/model/dir", progress=False, tensor_paralel_size=1)
    with pytest.raises(UnsupportedArgumentError, match="did you mean 'use_beam_search'"):
        SamplingParams(use_beam_serach=False)


# use_tqdm: vLLM's progress bar -----------------------------------------------------------------------------------

class _RecordedBar:
    def __init__(self, **arguments):
        self.arguments, self.updates, self.closed = arguments, 0, False

    def update(self, count):
        self.updates += count

    def close(self):
        self.closed = True


def test_use_tqdm_shows_a_bar_of_the_prompts_on_stderr(llm, capsys):
    llm.generate(["Hello", "a"], SamplingParams(max_tokens=2), use_tqdm=True)
    bar = capsys.readouterr().err
    assert "Generating" in bar and "2/2" in bar
    llm.generate(["Hello", "a"], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.chat(MESSAGES, SamplingParams(max_tokens=2), use_tqdm=False)
    assert capsys.readouterr().err == ""


def test_use_tqdm_by_default_follows_the_llms_progress_setting(llm, capsys, monkeypatch):
    """vLLM's default is a bar (use_tqdm=True); Glimmer's shows one unless the LLM was made with progress=False."""
    llm.generate("Hello", SamplingParams(max_tokens=2))
    assert capsys.readouterr().err == ""  # the fixture's LLM has progress=False
    monkeypatch.setattr(llm.engine.config, "progress", True)
    llm.chat(MESSAGES, SamplingParams(max_tokens=2))
    assert "Generating" in capsys.readouterr().err


def test_use_tqdm_takes_a_callable_that_makes_the_bar_as_vllms(llm):
    bars = []
    llm.generate(["Hello", "a", "b"], SamplingParams(max_tokens=2, n=2),
                 use_tqdm=lambda **arguments: bars.append(_RecordedBar(**arguments)) or bars[-1])
    (bar,) = bars
    assert bar.arguments["total"] == 3 and bar.updates == 3 and bar.closed


def test_a_use_tqdm_callable_that_makes_no_bar_is_refused_naming_it(llm):
    """A callable whose result lacks `update` or `close` failed with Python's bare AttributeError ('object' object has
    no attribute 'close'), raised while the prompts' requests were being aborted."""
    with pytest.raises(RequestError, match="^use_tqdm: the callable made a .object., which has no update") as caught:
        llm.generate(["Hello", "a"], SamplingParams(max_tokens=2), use_tqdm=lambda **arguments: object())
    assert caught.value.param == "use_tqdm" and "close" in str(caught.value)
    assert not llm.engine.has_unfinished_requests


def test_use_tqdm_of_another_kind_is_refused_naming_it(llm):
    with pytest.raises(RequestError, match="^use_tqdm must be True, False, None or a callable") as caught:
        llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm="yes")
    assert caught.value.param == "use_tqdm" and not llm.engine.has_unfinished_requests


@pytest.mark.parametrize(("name", "instead"), [("embed", "generative models only"),
                                               ("score", "prompt_logprobs=0"), ("llm_engine", "llm.engine"),
                                               ("sleep", "delete the LLM")])
def test_reading_one_of_vllms_llm_methods_glimmer_lacks_says_what_to_do(llm, name, instead):
    """`llm.score(...)` or `llm.embed(...)` met Python's bare AttributeError; it now says what to do instead,
    and hasattr stays honest (False)."""
    with pytest.raises(AttributeError, match=f"^'LLM' object has no attribute '{name}'; vLLM's LLM.{name}: ") as caught:
        getattr(llm, name)
    assert instead in str(caught.value) and not hasattr(llm, name)
    with pytest.raises(AttributeError, match="^'LLM' object has no attribute 'generat'$"):
        llm.generat  # noqa: B018


# logprobs read as vLLM's dicts ------------------------------------------------------------------------------------

def test_logprobs_read_as_vllms_dicts_of_logprob(llm):
    """vLLM code reads a position as a dict token id → Logprob (`lp[token_id].logprob`); Glimmer's entries were
    TokenLogprobs alone, and that code raised TypeError ('TokenLogprobs' object is not subscriptable)."""
    tok = llm.get_tokenizer()
    out = llm.generate("Hello", SamplingParams(max_tokens=6, logprobs=3, prompt_logprobs=2, seed=2))[0]
    completion = out.outputs[0]
    assert completion.cumulative_logprob == pytest.approx(
        sum(position[token].logprob for position, token in zip(completion.logprobs, completion.token_ids,
                                                                strict=True)))
    positions = [(completion.logprobs, completion.token_ids, 3), (out.prompt_logprobs[1:], out.prompt_token_ids[1:], 2)]
    for entries, tokens, k in positions:
        for position, token in zip(entries, tokens, strict=True):
            assert isinstance(position, Mapping) and list(position)[0] == token == position.token_id
            assert list(position)[1:] == [t for t in position.top if t != token]
            assert len(position) == len(dict(position)) == k + (token not in position.top)
            assert position[token] == Logprob(position.logprob, position.rank, tok.decode([token]))
            for rank, (top_id, logprob) in enumerate(position.top.items(), start=1):
                assert position[top_id] == Logprob(logprob, rank, tok.decode([top_id]))
            assert position.get(-1) is None and -1 not in position
    assert out.prompt_logprobs[0] is None


def test_logprobs_zero_hold_the_token_alone_as_vllms(llm):
    completion = llm.generate("Hello", SamplingParams(max_tokens=3, logprobs=0))[0].outputs[0]
    assert [list(position) for position in completion.logprobs] == [[t] for t in completion.token_ids]


def test_chat_outputs_read_as_vllms_request_outputs(llm):
    """vLLM's LLM.chat returns RequestOutputs, and its scripts read `out.outputs[0].text`: an AttributeError on a
    ChatOutput; what they read is the raw output's (`finished` too, which vLLM's loops test)."""
    reply = llm.chat(MESSAGES, SamplingParams(max_tokens=4, n=2, seed=1, prompt_logprobs=0))[0]
    assert reply.finished is reply.output.finished is True
    assert reply.outputs is reply.output.outputs and len(reply.outputs) == 2
    assert [o.text for o in reply.outputs] == [choice.output.outputs[0].text for choice in reply.choices]
    assert (reply.prompt, reply.prompt_token_ids, reply.request_id, reply.num_cached_tokens, reply.prompt_logprobs) == (
        reply.output.prompt, reply.output.prompt_token_ids, reply.output.request_id, reply.output.num_cached_tokens,
        reply.output.prompt_logprobs)


# vLLM's prompt forms -----------------------------------------------------------------------------------------------

def test_vllms_prompt_types_build_the_prompts_generate_takes(llm):
    from glimmer import TextPrompt, TokensPrompt

    greedy = SamplingParams(temperature=0, max_tokens=3)
    ids = llm.get_tokenizer().encode("Hello")
    by_ids, by_text = llm.generate([TokensPrompt(prompt_token_ids=ids), TextPrompt(prompt="Hello")], greedy)
    assert by_ids.prompt_token_ids == by_text.prompt_token_ids and by_ids.token_ids == by_text.token_ids


def test_the_prompt_types_declare_every_key_generate_takes():
    """TokensPrompt left out multi_modal_data, which generate takes with token ids (as vLLM's TokensPrompt declares
    it), so a type checker refused TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": image})."""
    from glimmer import TextPrompt, TokensPrompt
    from glimmer.engine.prompts import PROMPT_KEYS

    assert set(TokensPrompt.__annotations__) == PROMPT_KEYS
    assert set(TextPrompt.__annotations__) == PROMPT_KEYS - {"prompt_token_ids"}


def test_a_prompts_cache_salt_salts_its_request_as_vllms(llm, monkeypatch):
    """vLLM takes `cache_salt` on the prompt; Glimmer refused the key (its salt is a SamplingParams field)."""
    submitted = []
    add_request = llm.engine.add_request
    monkeypatch.setattr(llm.engine, "add_request", lambda request_id, ids, params, *args, **kwargs: (
        submitted.append(params.cache_salt), add_request(request_id, ids, params, *args, **kwargs))[1])
    params = SamplingParams(max_tokens=1)
    llm.generate([{"prompt": "a", "cache_salt": "tenant-1"}, "b", {"prompt_token_ids": [486, 64], "cache_salt": "t2",
                                                                   "mm_processor_kwargs": None}], params)
    assert submitted == ["tenant-1", None, "t2"] and params.cache_salt is None
    with pytest.raises(RequestError, match=r"^prompts\[1\]\.cache_salt='x' differs from its SamplingParams' "
                                           r"cache_salt='y'; give one$"):
        llm.generate(["a", {"prompt": "b", "cache_salt": "x"}], SamplingParams(max_tokens=1, cache_salt="y"))
    with pytest.raises(RequestError, match=r"^prompt\.cache_salt must be a non-empty string$"):
        llm.generate({"prompt": "b", "cache_salt": ""}, params)
    with pytest.raises(UnsupportedArgumentError, match=r"^prompt\.mm_processor_kwargs: not supported per prompt"):
        llm.generate({"prompt": "b", "mm_processor_kwargs": {"max_pixels": 4}}, params)
    assert not llm.engine.has_unfinished_requests


# setting and encoding as on transformers' tokenizer -----------------------------------------------------------------

@pytest.mark.parametrize("arguments", [dict(return_tensors="pt"), dict(truncation=True, max_length=2),
                                       dict(truncation=None), dict(padding="max_length", max_length=8),
                                       dict(return_tensors="np", add_special_tokens=False)])
def test_encode_takes_transformers_shaping_arguments(llm, hf, arguments):
    """`tok.encode(text, return_tensors="pt")` raised TypeError (unexpected keyword argument)."""
    ours, theirs = llm.get_tokenizer().encode("Hello world", **arguments), hf.encode("Hello world", **arguments)
    assert type(ours) is type(theirs)
    assert (ours.tolist() if hasattr(ours, "tolist") else ours) == (theirs.tolist() if hasattr(theirs, "tolist")
                                                                   else theirs)


def test_a_script_sets_the_pad_token_as_on_transformers(llm, tiny_checkpoint):
    tok, reference = llm.get_tokenizer(), AutoTokenizer.from_pretrained(tiny_checkpoint)
    try:
        tok.pad_token, reference.pad_token = tok.eos_token, reference.eos_token
        assert (tok.pad_token_id, tok.special_tokens_map, tok.all_special_ids) == (
            reference.pad_token_id, reference.special_tokens_map, reference.all_special_ids)
        assert dict(tok(["a", "bb cc"], padding=True)) == dict(reference(["a", "bb cc"], padding=True))
        tok.pad_token_id = reference.pad_token_id = 480
        assert tok.pad_token == reference.pad_token
        assert tok.apply_chat_template([MESSAGES, [{"role": "user", "content": "longer"}]], padding=True,
                                       **KWARGS)["input_ids"][0][-1] == 480
        with pytest.raises(ValueError, match="^pad_token='nope' is not a token of this tokenizer"):
            tok.pad_token = "nope"
    finally:
        tok.pad_token = llm.engine.tokenizer.pad_token


@pytest.mark.parametrize("name", ["eos_token_id", "bos_token", "chat_template", "vocab_size"])
def test_setting_what_the_checkpoint_decides_is_refused_instead_of_shadowed(llm, name):
    """`tok.eos_token_id = 5` made the script read 5 while nothing used it: a silent wrong answer."""
    tok = llm.get_tokenizer()
    before = getattr(tok, name)
    with pytest.raises(AttributeError, match=f"^LLMTokenizer.{name} cannot be set: it is the checkpoint's; what can "
                                             "be set is model_max_length, padding_side"):
        setattr(tok, name, 5)
    assert getattr(tok, name) == before
    setattr(tok, f"my_{name}", "a script's own attribute")
    assert getattr(tok, f"my_{name}") == "a script's own attribute"
    delattr(tok, f"my_{name}")


def test_deleting_an_llm_frees_its_engine_without_waiting_for_the_cycle_collector(tiny_checkpoint):
    """`del llm` is how a vLLM script frees a model's memory before loading the next; the tokenizer the LLM keeps
    (one object, as vLLM's get_tokenizer) must not hold the LLM back in a reference cycle."""
    gc.disable()
    try:
        llm = LLM(str(tiny_checkpoint), device="cpu", progress=False, kv_cache_memory=1 << 20, max_model_len=64)
        llm.get_tokenizer().encode("Hello")
        engine = weakref.ref(llm.engine)
        del llm
        assert engine() is None
    finally:
        gc.enable()


def test_logprobs_pickle_with_their_tokens_texts_not_the_tokenizer(llm):
    """Scripts pickle outputs (multiprocessing, caches); a position must not carry the tokenizer (megabytes)."""
    out = llm.generate("Hello", SamplingParams(max_tokens=3, logprobs=2, prompt_logprobs=1))[0]
    data = pickle.dumps(out)
    assert len(data) < len(pickle.dumps(llm.engine.tokenizer)) / 4
    again = pickle.loads(data)
    for ours, theirs in ((again.outputs[0].logprobs, out.outputs[0].logprobs), (again.prompt_logprobs[1:],
                                                                                  out.prompt_logprobs[1:])):
        assert ours == theirs and [dict(position) for position in ours] == [dict(position) for position in theirs]


@pytest.mark.parametrize("copy_it", [pickle.dumps, copy.deepcopy])
def test_an_llm_sent_to_another_process_is_refused_saying_what_to_send(llm, copy_it):
    """A multiprocessing pool's argument is pickled: it failed deep in the engine ("ctypes objects containing
    pointers cannot be pickled")."""
    with pytest.raises(TypeError, match="^an LLM cannot be pickled or deep-copied: .* make one LLM in each process"):
        copy_it(llm)
    assert copy.copy(llm).engine is llm.engine


def test_a_tokenizer_sent_to_another_process_is_refused_saying_what_to_send_and_copies_share_the_engine(
        llm, tiny_checkpoint):
    """Pickling failed deep in the engine; the tokenizer's own `.tokenizer`, which the error offers, pickles and
    encodes. A copy (transformers scripts deep-copy a tokenizer to pad on another side) has settings of its own."""
    tok = llm.get_tokenizer()
    with pytest.raises(TypeError, match=rf"^an LLMTokenizer cannot be pickled: .*from_pretrained\("
                                        rf"'{re.escape(str(tiny_checkpoint))}'\)\), or send its .tokenizer"):
        pickle.dumps(tok)
    sent = pickle.loads(pickle.dumps(tok.tokenizer))
    assert sent.encode("Hello") == tok.tokenizer.encode("Hello")
    for copied in (copy.copy(tok), copy.deepcopy(tok)):
        copied.padding_side = "left" if tok.padding_side == "right" else "right"
        assert copied.padding_side != tok.padding_side and copied.encode("Hello") == tok.encode("Hello")


def test_tensors_of_texts_of_different_lengths_need_padding_as_in_transformers(llm, hf):
    with pytest.raises(ValueError):
        hf(["Hello the world", "a"], return_tensors="pt")
    with pytest.raises(RequestError, match=r"^return_tensors='pt': the sequences' token ids differ in length "
                                           r"\(\[2, \d+\]\); pass padding=True"):
        llm.get_tokenizer()(["Hello the world", "a"], return_tensors="pt")


@pytest.mark.parametrize("call", ["__call__", "encode"])
def test_a_text_pair_is_refused_naming_it(llm, call):
    """transformers reads `tok("a", "b")` as a pair; here the second text was taken as add_special_tokens and failed
    deep in the tokenizers library ("'str' object is not an instance of 'bool'")."""
    with pytest.raises(TypeError, match="^add_special_tokens must be True or False, not 'world'; a second text "
                                        r"\(transformers' text_pair\) is not supported"):
        getattr(llm.get_tokenizer(), call)("Hello", "world")


# RequestOutput.metrics: vLLM's RequestMetrics, from times the engine records -----------------------------------------

def test_request_metrics_are_the_wall_clock_times_of_the_request_in_order(llm):
    """`out.metrics` was an AttributeError; its times are vLLM's (time.time()), each point after the one before."""
    before = time.time()
    out = llm.generate([[1, 10, 11]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    after = time.time()
    m = out.metrics
    assert before <= m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time
    assert m.last_token_time <= m.finished_time <= after
    assert m.time_in_queue == m.first_scheduled_time - m.arrival_time
    assert m.scheduler_time is None and m.model_forward_time is None and m.model_execute_time is None


def test_request_metrics_of_a_request_that_generates_nothing_have_no_token_times(llm):
    """max_tokens=0 produces no token: no first token time is invented, and the last token time stays the arrival."""
    m = llm.generate([[1, 10, 11]], SamplingParams(max_tokens=0))[0].metrics
    assert m.first_token_time is None and m.last_token_time == m.arrival_time
    assert m.arrival_time <= m.first_scheduled_time <= m.finished_time


def test_finished_is_a_real_bool_on_both_outputs(llm):
    """vLLM's `CompletionOutput.finished()` is a method; here it stays a bool property (README: a method reads as
    always true in `if c.finished:`, a callable stand-in for a bool makes `c.finished is True` silently false), so
    vLLM's call fails loudly rather than answering wrong."""
    out = llm.generate([[1, 10, 11]], SamplingParams(max_tokens=2, ignore_eos=True))[0]
    assert out.finished is True and out.outputs[0].finished is True
    with pytest.raises(TypeError, match="'bool' object is not callable"):
        out.outputs[0].finished()


def test_calls_from_several_threads_each_get_their_own_outputs(llm):
    """A script sharing one LLM between threads (a thread pool of requests): a second call stepping the engine took
    the first call's outputs (KeyError 'llm-6') or stepped it from two threads at once (a StepError)."""
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often, as on a busy machine
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = [[1, 10 + i, 11] for i in range(6)]
    alone = [[out.outputs[0].token_ids for out in llm.generate([ids, ids], params)] for ids in prompts]
    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(lambda ids: llm.generate([ids, ids], params), prompts))
    finally:
        sys.setswitchinterval(switch_interval)
    assert [[out.outputs[0].token_ids for out in outs] for outs in together] == alone


@pytest.mark.parametrize("outer", ["generate", "chat"])
@pytest.mark.parametrize("inner", ["generate", "chat", "beam_search"])
def test_the_refusal_of_a_nested_call_names_the_calls_made(llm, outer, inner):
    """The refusal said "LLM.generate / LLM.chat was called" whichever call was made, of a beam_search too; it
    names the inner call and the one running."""
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    calls = {"generate": lambda **kw: llm.generate([[1, 10, 11]], params, **kw),
             "chat": lambda **kw: llm.chat(MESSAGES, params, chat_template_kwargs=KWARGS, **kw),
             "beam_search": lambda **kw: llm.beam_search([[1, 10, 11]], BeamSearchParams(beam_width=2, max_tokens=2),
                                                         **kw)}

    def bar(total, desc):
        calls[inner]()

    with pytest.raises(RuntimeError, match=rf"^LLM\.{inner} was called while LLM\.{outer} runs on this LLM in the "
                                           "same thread"):
        calls[outer](use_tqdm=bar)
    assert len(llm.generate([[1, 12, 13]], params)[0].outputs[0].token_ids) == 2


def test_a_call_made_from_inside_a_running_call_is_refused_not_waited_for(llm):
    """A `use_tqdm` callable that calls `llm.generate` itself: the inner call would wait for the outer one's lock for
    ever; it is refused saying so, and the LLM serves the next call."""
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)

    def bar(total, desc):
        llm.generate([[1, 10, 11]], params)

    with pytest.raises(RuntimeError, match="while LLM.generate runs on this LLM in the same thread"):
        llm.generate([[1, 12, 13]], params, use_tqdm=bar)
    assert len(llm.generate([[1, 12, 13]], params)[0].outputs[0].token_ids) == 3
