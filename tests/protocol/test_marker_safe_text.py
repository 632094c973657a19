"""MarkerSafeText: channel text joined around removed pieces never spells a framing marker (P-CHAN-6)."""

import pytest

from glimmer.protocol.marker_safe_text import MarkerSafeText, open_marker_prefix


def emitted(*pieces):
    text = MarkerSafeText()
    return "".join(text.accept(piece) for piece in pieces) + text.flush()


def test_plain_text_passes_through_unchanged():
    assert emitted("hello ", "world <b>", " a < b") == "hello world <b> a < b"


@pytest.mark.parametrize(("pieces", "result"), [
    (("ok <|eo", "m|> fine"), "ok <|eo fine"),
    (("<", "|start|>x"), "<x"),
    (("<|e<|e", "om|>om|>!"), "<|e<|e!"),
    (("<|mess", "a", "ge|>", "x"), "<|messx"),
    (("<|eo", "t|>"), "<|eo"),
])
def test_a_completion_of_a_marker_begun_in_emitted_text_is_dropped(pieces, result):
    assert emitted(*pieces) == result


def test_a_possible_completion_is_held_then_released_when_it_is_not_one():
    text = MarkerSafeText()
    assert text.accept("x <|eo") == "x <|eo"
    assert text.accept("m|") == ""
    assert text.accept("?") == "m|?"


def test_held_text_is_released_at_the_end():
    text = MarkerSafeText()
    text.accept("<|st")
    assert text.accept("art") == ""
    assert text.flush() == "art"


def test_open_marker_prefix_is_the_trailing_proper_prefix():
    assert open_marker_prefix("abc <|eo") == "<|eo"
    assert open_marker_prefix("abc <") == "<"
    assert open_marker_prefix("abc <|eox") == ""
    assert open_marker_prefix("<|eom|>") == ""
