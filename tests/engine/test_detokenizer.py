import contextlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from glimmer.checkpoint.tiny_tokenizer import SPECIAL_TOKENS, write_tiny_tokenizer
from glimmer.engine.detokenizer import IncrementalDetokenizer
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import CheckpointError

REPLACEMENT = "\ufffd"
TRICKY = [
    "😀",
    "🦀",
    "👩\u200d👩\u200d👧",
    "東京の天気",
    "한국어",
    "e\u0301",
    "a\u0308\u0323",
    "ﬁ",
    "½°C",
    " to=self",
]
TEXT = st.lists(
    st.one_of(st.text(max_size=10), st.sampled_from(SPECIAL_TOKENS), st.sampled_from(TRICKY)), max_size=10
).map("".join)
PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    out = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(out)
    return Tokenizer.from_dir(out)


def stream(tok: Tokenizer, ids: list[int]) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok)
    return [detok.add(i) for i in ids], detok.flush()


def assert_stream_invariants(tok: Tokenizer, ids: list[int]) -> None:
    deltas, tail = stream(tok, ids)
    full = tok.decode(ids)
    assert "".join(deltas) + tail == full
    emitted = ""
    for k, delta in enumerate(deltas, start=1):
        assert not any(0xD800 <= ord(c) <= 0xDFFF for c in delta)
        emitted += delta
        decoded_so_far = tok.decode(ids[:k])
        # never rewrites, never emits a U+FFFD the full text lacks at that place
        assert full.startswith(emitted)
        # holds back at most one incomplete UTF-8 sequence (up to 3 bytes), which decode shows as U+FFFDs:
        # one for a valid prefix, or one per byte for an invalid one whose error Python's incremental decoder
        # reports only when the next byte arrives (e.g. b"\xed\xa0", a surrogate's first two bytes)
        assert decoded_so_far.startswith(emitted)
        held = decoded_so_far[len(emitted):]
        assert len(held) <= 3 and set(held) <= {REPLACEMENT}
        if not decoded_so_far.endswith(REPLACEMENT):
            assert emitted == decoded_so_far  # the byte stream is complete here


@PROPERTY_SETTINGS
@given(text=TEXT)
def test_deltas_of_encoded_text_concatenate_to_decode(tok, text):
    ids = tok.encode(text)
    assert_stream_invariants(tok, ids)
    deltas, tail = stream(tok, ids)
    assert "".join(deltas) == text and tail == ""
    assert REPLACEMENT not in "".join(deltas) or REPLACEMENT in text


@PROPERTY_SETTINGS
@given(ids=st.lists(st.integers(min_value=0, max_value=505), max_size=24))
def test_deltas_of_arbitrary_ids_concatenate_to_decode(tok, ids):
    # random byte tokens give invalid and truncated UTF-8; ids past the vocabulary decode to nothing
    assert_stream_invariants(tok, ids)


@PROPERTY_SETTINGS
@given(ids=st.lists(st.integers(min_value=0, max_value=498), max_size=24), split=st.integers(0, 24))
def test_add_many_equals_the_sum_of_adds(tok, ids, split):
    one_by_one, tail = stream(tok, ids)
    detok = IncrementalDetokenizer(tok)
    batched = detok.add_many(ids[:split]) + detok.add_many(ids[split:])
    assert batched == "".join(one_by_one)
    assert detok.flush() == tail


@PROPERTY_SETTINGS
@given(ids=st.lists(st.integers(min_value=0, max_value=505), max_size=24), split=st.integers(0, 24))
def test_a_detokenizer_started_on_a_prompt_continues_its_text(tok, ids, split):
    """A prompt and its output: the prompt's text without the bytes of a character it leaves incomplete, then the
    output's from a detokenizer started on the prompt, add up to the decode of both together, a character straddling
    them whole (random ids split anywhere: the prompt's last few bytes decide what it leaves)."""
    before = IncrementalDetokenizer(tok)
    head = before.add_many(ids[:split])
    after = IncrementalDetokenizer(tok, prompt_token_ids=ids[:split])
    assert head + "".join(after.add(i) for i in ids[split:]) + after.flush() == tok.decode(ids)


def test_multi_byte_character_is_held_until_complete(tok):
    ids = tok.encode("🦀")
    assert len(ids) > 1, "the tiny vocabulary has no token for the crab; pick a rarer character"
    deltas, tail = stream(tok, ids)
    assert deltas == [""] * (len(ids) - 1) + ["🦀"]
    assert tail == ""


def test_flush_renders_a_truncated_character_as_one_replacement(tok):
    ids = tok.encode("ok 🦀")[:-1]
    deltas, tail = stream(tok, ids)
    assert "".join(deltas) == "ok "
    assert tail == REPLACEMENT
    assert "".join(deltas) + tail == tok.decode(ids)


def test_special_tokens_stream_verbatim(tok):
    """P-TOK-3: special tokens kept, nothing inserted between them."""
    text = "<|start|>assistant to=user<|message|>Bonjour 😀<|eot|><|end_of_text|>"
    deltas, _ = stream(tok, tok.encode(text))
    assert "".join(deltas) == text
    assert "<|eot|>" in deltas and "<|end_of_text|>" in deltas


def test_detokenizer_never_decodes_the_sequence_again(tok, monkeypatch):
    # O(1) per token: only the token's own bytes are looked up
    ids = tok.encode("The weather in 東京 is 😀 today. " * 20)
    expected = tok.decode(ids)

    def no_decode(_ids):
        raise AssertionError("the detokenizer re-decoded the sequence")

    monkeypatch.setattr(tok, "decode", no_decode)
    deltas, tail = stream(tok, ids)
    assert "".join(deltas) + tail == expected


def test_non_byte_level_tokenizer_is_refused(tmp_path: Path):
    backend = HFTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    backend.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(CheckpointError, match="ByteLevel"):
        IncrementalDetokenizer(Tokenizer.from_dir(tmp_path))


@given(ids=st.lists(st.integers(0, 400), max_size=30))
@PROPERTY_SETTINGS
def test_skipped_special_tokens_leave_the_text_as_decode_without_them(tok, ids):
    specials = frozenset(tok.all_special_ids)
    ids = [i for i in ids if i < tok.vocab_size]
    detokenizer = IncrementalDetokenizer(tok, skip_token_ids=specials)
    text = "".join(detokenizer.add(i) for i in ids) + detokenizer.flush()
    assert text == tok.decode([i for i in ids if i not in specials])


def _byte_token(tok: Tokenizer, byte: int) -> int:
    return next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == bytes([byte]))


@pytest.mark.parametrize(("held", "then", "starts"), [
    (b"\xc3", b"\xa9", [0, 0]),  # é in two pieces: the second completes the character the first began
    (b"\xe0", b"d", [0, 1]),  # a lead byte nothing continues: its U+FFFD, then "d"
    (b"\xe0", b"\x83", [0, 1]),  # a byte that cannot continue it is a U+FFFD of its own
    (b"\xed\xa0", b"d", [0, 0, 2]),  # a surrogate's first two bytes: a U+FFFD each
])
def test_add_at_says_where_the_token_starts_after_the_replacements_of_earlier_bytes(tok, held, then, starts):
    detok = IncrementalDetokenizer(tok)
    ids = [_byte_token(tok, byte) for byte in held + then]
    texts, offsets = "", []
    for token_id in ids:
        text, start = detok.add_at(token_id)
        offsets.append(len(texts) + start)
        texts += text
    assert texts == tok.decode(ids) and offsets == starts


@PROPERTY_SETTINGS
@given(ids=st.lists(st.integers(min_value=0, max_value=498), max_size=24))
def test_a_token_whole_on_its_own_starts_at_its_text(tok, ids):
    """A legacy completion's `text_offset`: a token whose bytes are text on their own is found at its offset, held
    bytes before it (which it cannot continue) being their U+FFFDs."""
    detok = IncrementalDetokenizer(tok)
    text, offsets = "", []
    for token_id in ids:
        delta, start = detok.add_at(token_id)
        offsets.append(len(text) + start)
        text += delta
    assert text + detok.flush() == tok.decode(ids)
    for token_id, offset in zip(ids, offsets, strict=True):
        data = tok.token_bytes(token_id)
        with contextlib.suppress(UnicodeDecodeError):
            own = data.decode()
            assert text[offset:offset + len(own)] == own
