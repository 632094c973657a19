import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers
from transformers import AutoTokenizer

from glimmer.checkpoint.tiny_tokenizer import SPECIAL_TOKENS, write_tiny_tokenizer
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import CheckpointError, ConfigError

VARIED_TEXTS = (
    "",
    "The weather in Paris is nice today.",
    "  leading and trailing spaces  ",
    "line one\nline two\r\n\n\ttabbed",
    "def f(x):\n    return {'a': [1, 2, 3]}\n",
    '{"city": "Paris", "days": 2, "ok": true, "none": null}',
    '<atem:invoke name="calendar.lookup">\n<atem:parameter name="day">Friday</atem:parameter>\n',
    "Un café crème, naïve façade — 東京の天気は晴れ 😀🦀👩‍👩‍👧 e\u0301 ½°C",
    "12345678901234567890 3.14159 -42",
    "<|begin_of_text|><|start|>user<|message|>Hi!<|eot|><|start|>assistant",
    "text<|eom|>more text<|patch|><|image_start|><|image_end|>",
    "<|not_a_token|> <| start |> <|start",
    "<|reserved_special_token_1818|><|video|><|vid_frame_separator|>",
)
SPECIAL_TEXT = st.sampled_from(SPECIAL_TOKENS)
MIXED_TEXT = st.lists(
    st.one_of(
        st.text(max_size=12), SPECIAL_TEXT, st.sampled_from(["😀", "東京", "e\u0301", " to=self", "\n"])
    ),
    max_size=8,
).map("".join)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def tok(tiny_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.fixture(scope="module")
def hf(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def copy_tokenizer(tiny_dir: Path, dest: Path) -> Path:
    shutil.copytree(tiny_dir, dest)
    return dest


def set_added_token_flags(path: Path, contents: tuple[str, ...], **flags: bool) -> None:
    """Set `flags` on the added tokens `contents` in tokenizer.json and in tokenizer_config.json's added_tokens_decoder,
    whose flags transformers takes over tokenizer.json's."""
    for name, entries in (("tokenizer.json", lambda state: state["added_tokens"]),
                          ("tokenizer_config.json", lambda state: state["added_tokens_decoder"].values())):
        state = json.loads((path / name).read_text())
        for added in entries(state):
            if added["content"] in contents:
                added |= flags
        (path / name).write_text(json.dumps(state))


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_encode_matches_transformers(tok, hf, text):
    assert tok.encode(text) == hf(text, add_special_tokens=False)["input_ids"]
    assert tok.encode(text, add_special_tokens=True) == hf(text)["input_ids"]


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_decode_matches_transformers_and_round_trips(tok, hf, text):
    ids = tok.encode(text)
    expected = hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert tok.decode(ids) == expected == text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=MIXED_TEXT)
def test_encode_and_decode_match_transformers_on_random_text(tok, hf, text):
    ids = tok.encode(text)
    assert ids == hf(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(min_value=0, max_value=520), max_size=16))
def test_decode_of_arbitrary_ids_matches_transformers(tok, hf, ids):
    # byte tokens in any order make invalid UTF-8; ids past the vocabulary are dropped by both
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("token", SPECIAL_TOKENS)
def test_special_token_spelled_in_text_encodes_as_that_token(tok, token):
    token_id = tok.token_to_id(token)
    assert tok.encode(f"a{token}b")[1:-1] == [token_id]
    assert tok.encode(token) == [token_id]


def test_rendered_prompt_keeps_exactly_one_bos_at_position_zero(tok):
    """P-TMPL-5: the template writes the bos; encoding must not add another."""
    prompt = "<|begin_of_text|><|start|>user<|message|>What is the weather?<|eot|><|start|>assistant"
    ids = tok.encode(prompt)
    assert ids[0] == tok.bos_token_id
    assert ids.count(tok.bos_token_id) == 1


def test_adding_special_tokens_to_a_rendered_prompt_doubles_the_bos(tok):
    """architecture.md §14.22: the trap P-TMPL-5 avoids is real with this tokenizer."""
    ids = tok.encode("<|begin_of_text|><|start|>user<|message|>Hi<|eot|>", add_special_tokens=True)
    assert ids[:2] == [tok.bos_token_id, tok.bos_token_id]


def test_decode_keeps_adjacent_special_tokens_without_spaces(tok, hf):
    """P-TOK-3."""
    names = ("<|eom|>", "<|start|>", "<|message|>", "<|eot|>", "<|end_of_text|>")
    ids = [tok.token_to_id(t) for t in names]
    assert tok.decode(ids) == "".join(names)
    assert hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == "".join(names)


def test_named_special_tokens_come_from_tokenizer_config(tok, hf):
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|finetune_right_pad|>",
        None,
    )
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.pad_token_id,
        None,
    )


def test_special_tokens_are_the_template_variables_that_are_set(tok):
    assert tok.special_tokens == {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "pad_token": "<|finetune_right_pad|>",
    }


def test_vocab_size_counts_added_tokens_like_transformers(tok, hf):
    assert tok.vocab_size == len(hf) == max(tok.all_special_ids) + 1


def test_all_special_ids_are_the_added_special_tokens(tok, hf):
    assert tok.all_special_ids == tuple(sorted(tok.token_to_id(t) for t in SPECIAL_TOKENS))
    assert set(hf.all_special_ids) <= set(tok.all_special_ids)


def test_token_lookup_both_ways(tok):
    eot = tok.token_to_id("<|eot|>")
    assert eot is not None and tok.id_to_token(eot) == "<|eot|>"
    assert tok.token_to_id("<|call|>") is None
    assert tok.id_to_token(tok.vocab_size) is None
    assert tok.id_to_token(-1) is None
    assert tok.id_to_token(tok.encode(" the")[0]) == "Ġthe"


def test_require_token_id_names_the_missing_token_and_file(tok, tiny_dir):
    assert tok.require_token_id("<|patch|>") == tok.token_to_id("<|patch|>")
    with pytest.raises(ConfigError, match=r"<\|call\|>") as excinfo:
        tok.require_token_id("<|call|>")
    assert str(tiny_dir / "tokenizer.json") in str(excinfo.value)


def test_token_bytes_reproduce_decode_for_every_token(tok):
    for token_id in range(tok.vocab_size + 3):
        assert tok.token_bytes(token_id).decode("utf-8", errors="replace") == tok.decode([token_id]), token_id


def test_byte_level_alphabet_covers_every_byte_once(tok):
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_tokens = [tok.token_to_id(char) for char in alphabet]
    assert sorted(b"".join(tok.token_bytes(i) for i in byte_tokens)) == list(range(256))


def test_token_bytes_of_an_added_token_holding_a_space_are_its_utf8(tmp_path):
    # tokenizers' ByteLevel decoder passes a token with characters outside the alphabet through as UTF-8
    backend = HFTokenizer(models.BPE())
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens([" héllo", "é"])
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.token_bytes(0) == " héllo".encode()
    assert tok.token_bytes(1) == b"\xe9"
    assert tok.decode([0, 1]) == " héllo\ufffd"


def test_byte_level_is_detected_from_the_decoder(tok, tmp_path):
    assert tok.is_byte_level
    backend = HFTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.save(str(tmp_path / "tokenizer.json"))
    assert not Tokenizer.from_dir(tmp_path).is_byte_level


def test_a_checkpoint_whose_tokenizer_is_not_byte_level_is_refused_at_load(tiny_checkpoint, tmp_path):
    """It loaded, and every generate call then failed as its text was made."""
    from glimmer import LLM

    checkpoint = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    state = json.loads((checkpoint / "tokenizer.json").read_text())
    state["decoder"] = {"type": "Sequence", "decoders": [state["decoder"]]}
    (checkpoint / "tokenizer.json").write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=r"tokenizer.json does not decode with a ByteLevel decoder \(its "
                                              r"decoder: Sequence\)"):
        LLM(str(checkpoint), progress=False)


def test_missing_tokenizer_json_names_the_file(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer.json") as excinfo:
        Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(excinfo.value)


def test_corrupt_tokenizer_json_names_the_file(tiny_dir, tmp_path):
    bad = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    (bad / "tokenizer.json").write_text('{"version": "1.0", "model": ', encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json is not a valid tokenizers file"):
        Tokenizer.from_dir(bad)


@pytest.mark.parametrize("marker", ["<|start|>", "<|eom|>"])
def test_a_protocol_marker_that_is_only_a_vocabulary_entry_is_refused(tiny_dir, tmp_path, marker):
    """P-TOK-1: a marker in the BPE vocabulary but not an added token is split like text, so every prompt's markup
    was silently other tokens than the model's."""
    bad = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    state = json.loads((bad / "tokenizer.json").read_text(encoding="utf-8"))
    entry = next(added for added in state["added_tokens"] if added["content"] == marker)
    state["added_tokens"].remove(entry)
    state["model"]["vocab"][marker] = entry["id"]
    (bad / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    config = json.loads((bad / "tokenizer_config.json").read_text())
    del config["added_tokens_decoder"][str(entry["id"])]  # else transformers (and Glimmer) adds it back from there
    (bad / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=re.escape(f"{marker!r} (id {entry['id']}) encodes as ")) as refused:
        Tokenizer.from_dir(bad)
    assert "must be special tokens" in str(refused.value)


def test_invalid_tokenizer_config_json_names_the_file(tiny_dir, tmp_path):
    bad = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    (bad / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json is not valid JSON"):
        Tokenizer.from_dir(bad)


def test_special_tokens_given_as_added_token_objects(tiny_dir, tmp_path):
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    config_file = ckpt / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token"] = {"__type": "AddedToken", "content": "<|eot|>", "special": True}
    config_file.write_text(json.dumps(config))
    tok = Tokenizer.from_dir(ckpt)
    assert tok.eos_token == "<|eot|>"
    assert tok.eos_token_id == tok.token_to_id("<|eot|>")


@pytest.mark.parametrize(("value", "refused"), [("<|eot|>", "additional_special_tokens='<|eot|>' is invalid"),
                                               ([5], "additional_special_tokens=5 is invalid")])
def test_a_bad_additional_special_tokens_is_named_as_the_file_names_it(tiny_dir, tmp_path, value, refused):
    """Refused as extra_special_tokens, the newer name of the field, which the file does not have."""
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    config_file = ckpt / "tokenizer_config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"additional_special_tokens": value}))
    with pytest.raises(CheckpointError, match=re.escape(f"tokenizer_config.json: {refused}")):
        Tokenizer.from_dir(ckpt)


def _with_tokenizer_config(tiny_dir, tmp_path, edit):
    """A copy of the tiny tokenizer whose tokenizer_config.json `edit` (a function of the dict) changed."""
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    config_file = ckpt / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    edit(config)
    config_file.write_text(json.dumps(config))
    return ckpt


def test_an_added_tokens_decoder_key_that_is_no_token_id_is_refused(tiny_dir, tmp_path):
    """It was passed over, where transformers fails to read the file (int() of the key)."""
    ckpt = _with_tokenizer_config(tiny_dir, tmp_path, lambda config: config["added_tokens_decoder"].update(
        eot={"content": "<|eot|>", "special": True}))
    with pytest.raises(CheckpointError, match=re.escape("tokenizer_config.json: added_tokens_decoder['eot']: the key "
                                                        "is not a token id")):
        Tokenizer.from_dir(ckpt)


def test_special_tokens_map_fills_names_an_older_config_lacks(tiny_dir, tmp_path):
    """An older tokenizer_config.json, without `added_tokens_decoder`: transformers 5 reads the map's names."""
    ckpt = _with_tokenizer_config(tiny_dir, tmp_path, lambda config: [
        config.pop(name) for name in ("bos_token", "pad_token", "added_tokens_decoder")])
    tok = Tokenizer.from_dir(ckpt)
    assert tok.bos_token == "<|begin_of_text|>"  # from special_tokens_map.json
    assert tok.pad_token == "<|finetune_right_pad|>"
    assert tok.eos_token == "<|end_of_text|>"


def test_a_bos_an_older_configs_map_sets_is_blamed_on_the_map_where_the_post_processor_disagrees(tiny_dir, tmp_path):
    """The map's names win over an older config's, so the bos checked against the post-processor is the map's: the
    error said it came from tokenizer_config.json."""
    ckpt = _with_tokenizer_config(tiny_dir, tmp_path, lambda config: config.pop("added_tokens_decoder"))
    map_file = ckpt / "special_tokens_map.json"
    map_file.write_text(json.dumps({**json.loads(map_file.read_text()), "bos_token": "<|end_of_text|>"}))
    with pytest.raises(CheckpointError, match=re.escape(f"bos_token='<|end_of_text|>' (from {map_file}) is id")):
        Tokenizer.from_dir(ckpt)


def test_special_tokens_map_is_unread_beside_added_tokens_decoder(tiny_dir, tmp_path):
    """As transformers 5, which names no bos or pad where the map alone names them beside `added_tokens_decoder`."""
    ckpt = _with_tokenizer_config(tiny_dir, tmp_path, lambda config: [config.pop(name)
                                                                      for name in ("bos_token", "pad_token")])
    tok = Tokenizer.from_dir(ckpt)
    assert tok.bos_token is None and tok.pad_token is None
    assert tok.eos_token == "<|end_of_text|>"


def test_without_config_files_no_tokens_are_named(tiny_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copy(tiny_dir / "tokenizer.json", ckpt)
    tok = Tokenizer.from_dir(ckpt)
    assert tok.bos_token is None and tok.bos_token_id is None
    assert tok.special_tokens == {}
    assert tok.token_to_id("<|begin_of_text|>") is not None


def test_named_token_missing_from_vocabulary_is_an_error(tiny_dir, tmp_path):
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    config_file = ckpt / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["pad_token"] = "<pad>"
    config_file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"pad_token='<pad>'.*do not belong together"):
        Tokenizer.from_dir(ckpt)


def test_an_added_token_of_tokenizer_config_that_tokenizer_json_lacks_is_an_error(tiny_dir, tmp_path):
    """transformers adds such a token to the vocabulary (a row the model's embedding lacks, at an id of its own choice)
    and encodes its spelling as that one token, where Glimmer's encoding split it into its characters."""
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    config_file = ckpt / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["added_tokens_decoder"]["511"] = {"content": "<|tool_x|>", "lstrip": False, "normalized": False,
                                             "rstrip": False, "single_word": False, "special": True}
    config_file.write_text(json.dumps(config))
    hf = AutoTokenizer.from_pretrained(str(ckpt))
    assert len(hf("<|tool_x|>", add_special_tokens=False)["input_ids"]) == 1
    with pytest.raises(CheckpointError, match=r"added_tokens_decoder\['511'\] is '<\|tool_x\|>', which is not a "
                                              r"token of .*tokenizer\.json.*do not belong together"):
        Tokenizer.from_dir(ckpt)


@pytest.mark.parametrize("setting", [
    {"truncation": {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}},
    {"padding": {"strategy": {"Fixed": 32}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                 "pad_type_id": 0, "pad_token": "<|finetune_right_pad|>"}},
], ids=["truncation", "padding"])
def test_truncation_or_padding_saved_in_tokenizer_json_changes_no_encoding(tiny_dir, tmp_path, setting):
    """transformers turns a tokenizer.json's saved truncation and padding off for every call that does not ask for
    them; Glimmer's encoding kept them, so every prompt, chat prompts included, was cut to 8 tokens without a word, and
    padding made the load refuse the protocol's markers as "encoding as 32 tokens"."""
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    backend = json.loads((ckpt / "tokenizer.json").read_text())
    (ckpt / "tokenizer.json").write_text(json.dumps(backend | setting))
    text = "Hello world, this is a longer piece of text than eight tokens"
    expected = AutoTokenizer.from_pretrained(str(ckpt))(text)["input_ids"]
    assert len(expected) > 8
    tok = Tokenizer.from_dir(ckpt)
    assert tok.encode(text, add_special_tokens=True) == expected
    assert tok.encode_text(text) == expected[1:]


# -- caller text kept plain (issue 8): `literals` ------------------------------------------------------------

PLACEHOLDER = "\u27ea123.0\u27eb"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=MIXED_TEXT)
def test_splitting_at_special_tokens_tokenizes_as_the_backend_does(tok, text):
    """The literal path cuts the text where the backend's added-token pass does; without placeholders to
    restore it gives the same ids, so only the caller's own spellings change."""
    for add in (False, True):
        assert tok._encode_with_literals(text, {PLACEHOLDER: "x"}, add) == tok.encode(text, add_special_tokens=add)


@pytest.mark.parametrize(("lstrip", "rstrip"), [(True, False), (False, True), (True, True)])
def test_splitting_honours_special_tokens_that_swallow_whitespace(tiny_dir, tmp_path, lstrip, rstrip):
    path = copy_tokenizer(tiny_dir, tmp_path / "strip")
    set_added_token_flags(path, ("<|start|>", "<|message|>"), lstrip=lstrip, rstrip=rstrip)
    stripping = Tokenizer.from_dir(path)
    for text in VARIED_TEXTS + ("a  <|start|>  b <|message|>\n c", " <|start|><|message|> "):
        assert stripping._encode_with_literals(text, {PLACEHOLDER: "x"}, False) == stripping.encode(text)


@pytest.mark.parametrize(("lstrip", "rstrip"), [(True, False), (False, True)])
def test_special_tokens_swallow_only_the_whitespace_the_backend_swallows(tiny_dir, tmp_path, lstrip, rstrip):
    """The tokenizers library strips Rust's whitespace (Unicode White_Space) beside a stripping token; Python's
    str.strip also takes the separators U+001C..U+001F, which the split dropped from the caller's text."""
    path = copy_tokenizer(tiny_dir, tmp_path / "strip")
    set_added_token_flags(path, ("<|start|>",), lstrip=lstrip, rstrip=rstrip)
    stripping = Tokenizer.from_dir(path)
    backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
    for text in ("a\x1c<|start|>\x1fb", "a\x1d\x1e <|start|> \x1e\x1db", "a\u3000\x85<|start|>\xa0\tb"):
        expected = backend.encode(text, add_special_tokens=False).ids
        assert stripping.encode(text) == expected
        assert stripping._encode_with_literals(text, {PLACEHOLDER: "x"}, False) == expected


def test_literals_are_tokenized_as_plain_text_and_markup_as_control_tokens(tok):
    prompt = f"<|begin_of_text|><|start|>user<|message|>hi {PLACEHOLDER}system<|eot|>"
    ids = tok.encode(prompt, literals={PLACEHOLDER: "<|start|>"})
    start = tok.token_to_id("<|start|>")
    assert ids.count(start) == 1  # the template's own
    assert tok.decode(ids) == prompt.replace(PLACEHOLDER, "<|start|>")
    assert ids[-1] == tok.token_to_id("<|eot|>")
    body = tok.encode("hi <|start|>system".replace("<|start|>", PLACEHOLDER), literals={PLACEHOLDER: "<|start|>"})
    assert ids[-1 - len(body):-1] == body  # the user's text, tokenized as one piece of plain text
    assert start not in body and len(body) > len(tok.encode("hi <|start|>system"))


def test_text_without_placeholders_ignores_literals(tok):
    text = "<|begin_of_text|><|start|>user<|message|>hi<|eot|>"
    assert tok.encode(text, literals={PLACEHOLDER: "<|start|>"}) == tok.encode(text)


def test_control_tokens_are_the_special_added_tokens(tok):
    assert set(tok.control_tokens) == set(SPECIAL_TOKENS)


# -- tokenizer_config.json's split_special_tokens ------------------------------------------------------------


def with_split_special_tokens(tiny_dir: Path, dest: Path, value: object = True) -> Path:
    ckpt = copy_tokenizer(tiny_dir, dest)
    config_file = ckpt / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "split_special_tokens": value}))
    return ckpt


@pytest.mark.parametrize("split", [True, False])
def test_a_text_prompt_is_tokenized_as_transformers_tokenizes_it_under_split_special_tokens(tiny_dir, tmp_path,
                                                                                            split):
    """split_special_tokens was ignored: a completion's `<|eot|>` became the control token where transformers (and
    vLLM through it) tokenizes the checkpoint's text prompts with special-token spellings as text."""
    ckpt = with_split_special_tokens(tiny_dir, tmp_path / "ckpt", split)
    hf = AutoTokenizer.from_pretrained(str(ckpt))
    tok = Tokenizer.from_dir(ckpt)
    assert tok.split_special_tokens is split
    for text in VARIED_TEXTS:
        for add_special_tokens in (True, False):
            expected = hf(text, add_special_tokens=add_special_tokens)["input_ids"]
            assert tok.encode_input_text(text, add_special_tokens=add_special_tokens) == expected, text
    # a rendered chat prompt keeps its template's markup as control tokens, and its user text plain, either way
    rendered = "<|begin_of_text|><|start|>user<|message|>" + PLACEHOLDER + "<|eot|><|start|>assistant"
    assert tok.encode(rendered, literals={PLACEHOLDER: "<|eot|>"}) == Tokenizer.from_dir(tiny_dir).encode(
        rendered, literals={PLACEHOLDER: "<|eot|>"})


def test_a_split_special_tokens_that_is_no_boolean_is_refused_naming_it(tiny_dir, tmp_path):
    ckpt = with_split_special_tokens(tiny_dir, tmp_path / "ckpt", "yes")
    with pytest.raises(CheckpointError, match=r"split_special_tokens='yes' in .*tokenizer_config\.json is not true "
                                              r"or false"):
        Tokenizer.from_dir(ckpt)


@pytest.mark.parametrize(("in_config", "in_tokenizer_json"), [
    ({"lstrip": True}, {}), ({"rstrip": True}, {}), ({}, {"lstrip": True}), ({}, {"rstrip": True}),
    ({"special": False}, {}), ({}, {"special": False}),
], ids=["config-lstrip", "config-rstrip", "json-lstrip", "json-rstrip", "config-not-special", "json-not-special"])
@pytest.mark.parametrize("split_special_tokens", [False, True], ids=["", "split"])
def test_added_token_flags_of_tokenizer_config_win_over_tokenizer_json_as_in_transformers(
        tiny_dir, tmp_path, in_config, in_tokenizer_json, split_special_tokens):
    """transformers (and so vLLM) adds each added_tokens_decoder entry of tokenizer_config.json again, so its lstrip /
    rstrip are the token's where tokenizer.json says otherwise (a token tokenizer.json flags special stays special):
    these were read from tokenizer.json alone, so `a  <|reserved_special_token_1|>  b` kept or lost the spaces beside
    the token unlike transformers."""
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    token = "<|reserved_special_token_1|>"
    config_file, json_file = ckpt / "tokenizer_config.json", ckpt / "tokenizer.json"
    config, state = json.loads(config_file.read_text()), json.loads(json_file.read_text())
    token_id = next(added["id"] for added in state["added_tokens"] if added["content"] == token)
    config["added_tokens_decoder"][str(token_id)] |= in_config
    config["split_special_tokens"] = split_special_tokens
    for added in state["added_tokens"]:
        if added["id"] == token_id:
            added |= in_tokenizer_json
    config_file.write_text(json.dumps(config))
    json_file.write_text(json.dumps(state))
    hf, tok = AutoTokenizer.from_pretrained(str(ckpt)), Tokenizer.from_dir(ckpt)
    text = f"a  {token}  b<|eot|> x {token}y"
    for add_special_tokens in (False, True):
        expected = hf(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert tok.encode_input_text(text, add_special_tokens=add_special_tokens) == expected
    if not split_special_tokens:
        expected = hf(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text) == tok.encode(text, literals={"\x00": "q"}) == expected
    hidden = [i for i in expected if i not in tok.all_special_ids]
    assert tok.decode(hidden) == hf.decode(expected, skip_special_tokens=True)


def test_an_added_token_flag_that_is_not_true_or_false_is_refused_naming_it(tiny_dir, tmp_path):
    """transformers' AddedToken raises a bare TypeError for it."""
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    config_file = ckpt / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["added_tokens_decoder"]["481"]["rstrip"] = "yes"
    config_file.write_text(json.dumps(config))
    refusal = "tokenizer_config.json: added_tokens_decoder['481'].rstrip='yes' is not true or false"
    with pytest.raises(CheckpointError, match=re.escape(refusal)):
        Tokenizer.from_dir(ckpt)


def test_a_single_word_special_token_splits_a_chat_prompt_only_where_the_backend_matches_it(tiny_dir, tmp_path):
    """An added token flagged `single_word` is matched only with no word character beside it (Rust's `\\w`: letters,
    marks, decimal digits, `_`). The split of a rendered prompt with placeholders (every chat prompt holding a caller's
    control-token spelling) matched it inside words too, so `hello<|reserved_special_token_1|>` became that token
    where transformers (and the same text without placeholders) spells it out as text."""
    ckpt = copy_tokenizer(tiny_dir, tmp_path / "ckpt")
    token = "<|reserved_special_token_1|>"
    set_added_token_flags(ckpt, (token,), single_word=True)
    hf, tok = AutoTokenizer.from_pretrained(str(ckpt)), Tokenizer.from_dir(ckpt)
    placeholder = "\u27eaP\u27eb"
    for before, after in [("hello", ""), ("", "x"), ("a_", " "), ("e\u0301", ""), ("\u0663", ""), ("\u216b", ""),
                          ("\u24b6", ""), ("", "\U0001f170"),  # Ⓐ and 🅰: symbols Unicode counts Alphabetic
                          (" ", " "), ("-", "-"), ("\u00bd", "\u00b2"), ("<|eot|>", "<|eot|>"), ("", "")]:
        text = f"{placeholder} {before}{token}{after}"
        expected = hf(text.replace(placeholder, "x"), add_special_tokens=False)["input_ids"]
        assert tok.encode(text, literals={placeholder: "x"}) == expected, (before, after)
