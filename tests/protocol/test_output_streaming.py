"""Streaming properties of the output parser (protocol.md §4.1: P-STREAM-1..8)."""

import json
import re
import time

import pytest
from protocol_support import CALENDAR_TOOLS, atem, parse_all_ways, parse_in_chunks, parsed_key, tool_message

from glimmer.protocol import HOLD_MAX, Delta, OutputParser, ParsedOutput, parse_output
from glimmer.protocol.tokens import FRAMING_MARKERS

TURN = (
    " to=self<|message|>Friday was asked about.<|eom|>"
    + tool_message("calendar.lookup", atem("calendar.lookup", {"day": "Fri <b>", "limit": "3"}))
    + "<|eom|><|start|>assistant to=self<|message|>Now answer.<|eom|>"
    "<|start|>assistant to=user<|message|>One event on Friday.<|eot|>"
)


def token_like_pieces(text):
    """Split roughly as a tokenizer would: each marker whole, words and spaces apart."""
    return [piece for piece in re.split(r"(<\|[a-z_]+\|>|\s+|[<>=\"/])", text) if piece]


# -- P-STREAM-1 ----------------------------------------------------------------------------------------------


def test_one_shot_is_the_streaming_machine_fed_everything_at_once():
    parser = OutputParser(CALENDAR_TOOLS)
    by_definition = ParsedOutput.from_deltas([parser.feed(TURN), parser.finish()])
    assert parsed_key(parse_output(TURN, CALENDAR_TOOLS)) == parsed_key(by_definition)


def test_token_aligned_chunking_equals_one_shot():
    pieces = token_like_pieces(TURN)
    assert "".join(pieces) == TURN
    streamed = parse_in_chunks(TURN, (len(piece) for piece in pieces), CALENDAR_TOOLS)
    assert parsed_key(streamed) == parsed_key(parse_all_ways(TURN, CALENDAR_TOOLS))


# -- P-STREAM-2 ----------------------------------------------------------------------------------------------


def test_emitted_text_only_grows():
    parser = OutputParser(CALENDAR_TOOLS)
    final = parse_output(TURN, CALENDAR_TOOLS)
    reasoning = content = ""
    arguments = ""
    for character in TURN:
        delta = parser.feed(character)
        reasoning += delta.reasoning
        content += delta.content
        arguments += "".join(piece.arguments for piece in delta.tool_calls)
        assert (final.reasoning or "").startswith(reasoning)
        assert (final.content or "").startswith(content)
        assert final.tool_calls[0].arguments.startswith(arguments)


# -- P-STREAM-3 ----------------------------------------------------------------------------------------------


def content_after(*chunks):
    parser = OutputParser()
    parser.feed("to=user<|message|>")
    return [parser.feed(chunk).content for chunk in chunks]


def test_a_proper_prefix_of_a_marker_is_held_and_other_text_is_not():
    """P-STREAM-3: `<|eo` is held, `<|ex` is not."""
    assert content_after("ok <|eo", "x") == ["ok ", "<|eox"]
    assert content_after("ok <|ex") == ["ok <|ex"]
    assert content_after("a<", "b") == ["a", "<b"]


def test_a_possible_headerless_switch_is_held_until_decided():
    assert content_after("a to=us", "er and more") == ["a", " to=user and more"]
    assert content_after("a to=user<|mess", "age|>b") == ["a", "b"]
    assert content_after("a ", "b") == ["a", " b"]
    assert content_after("a t", "o", "p") == ["a", "", " top"]


def test_complete_markers_are_decided_at_once():
    parser = OutputParser()
    parser.feed("to=user<|message|>")
    assert parser.feed("done<|eot|>").content == "done"
    assert parser.channel is None and parser.turn_ended


def test_an_open_header_candidate_is_held():
    parser = OutputParser()
    parser.feed("to=user<|message|>a")
    assert parser.feed("<|start|>assistant to=us").content == ""
    assert parser.feed("er<|message|>b").content == "b"


# -- P-STREAM-4 ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [" to=self<|message|>", " to=user<|message|>", ""])
def test_long_text_streams_live_with_bounded_hold_back(prefix):
    """P-STREAM-4: undecided reasoning/content text never exceeds HOLD_MAX."""
    parser = OutputParser()
    parser.feed(prefix)
    words = ("word to=be <|eo or not to ", "spaced\n\n\t ", "x" * 70 + " to=" + "y" * 70 + " ")
    text = "".join(words) * 40
    emitted = 0
    for position, character in enumerate(text, start=1):
        delta = parser.feed(character)
        emitted += len(delta.reasoning) + len(delta.content)
        assert position - emitted <= HOLD_MAX


HELD_NAME = "n" * 150  # an ATEM name attribute in reasoning or content, still open


@pytest.mark.parametrize("prefix", [" to=self<|message|>", " to=user<|message|>"])
@pytest.mark.parametrize("text", [
    'Hi <atem:invoke name="' + HELD_NAME + "<|start|>" + "j" * 138,
    'Hi <atem:invoke name="' + HELD_NAME + " to=" + "r" * 64 + "<|message",
    "Hi <|eo<|start|>m|" + '<atem:parameter name="' + HELD_NAME + "<|start|>" + "j" * 138,
], ids=["tag-then-header", "tag-then-switch", "marker-tag-then-header"])
def test_the_undecided_pieces_held_at_once_stay_within_hold_max(prefix, text):
    """P-STREAM-4: a cut-short ATEM tag (held by the markup filter), an open header candidate or headerless switch
    (held by the parser) and a marker completion (held by MarkerSafeText) can all be undecided at once; together
    they stay within HOLD_MAX (a 150-character name in front of a header candidate held 307 characters)."""
    parser = OutputParser()
    parser.feed(prefix)
    emitted = 0
    for position, character in enumerate(text, start=1):
        delta = parser.feed(character)
        emitted += len(delta.reasoning) + len(delta.content)
        dropped_markers = text[:position].count("<|start|>") * len("<|start|>")
        assert position - dropped_markers - emitted <= HOLD_MAX


def test_a_long_tool_value_is_not_streamed_but_does_not_stall_the_channel():
    value = "line <b>\n" * 5000
    body = atem("calendar.lookup", {"day": value})
    result = parse_in_chunks(
        tool_message("calendar.lookup", body, first=True), iter(lambda: 7, None), CALENDAR_TOOLS
    )
    assert json.loads(result.tool_calls[0].arguments) == {"day": value}


# -- P-STREAM-5 ----------------------------------------------------------------------------------------------


ADVERSARIAL_STREAMS = {
    "prose": "The quick brown fox jumps over the lazy dog to tell a story. ",
    "whitespace": " \n\t " * 4,
    "marker_lookalikes": "<|eo <|st <| |> <|x|> ",
    "switch_lookalikes": " to=a to= to=" + "z" * 70 + " ",
    "atem_in_content": '<atem:invoke name="x"><atem:parameter name="y">v</atem:parameter></atem:invoke>',
}


def feed_seconds(prefix, unit, repeats, tools=CALENDAR_TOOLS):
    chunks = [prefix] + [piece for _ in range(repeats) for piece in token_like_pieces(unit)]
    best = float("inf")
    for _ in range(3):
        parser = OutputParser(tools)
        started = time.process_time()
        for chunk in chunks:
            parser.feed(chunk)
        parser.finish()
        best = min(best, time.process_time() - started)
    return best


@pytest.mark.parametrize(
    "prefix",
    [
        " to=self<|message|>",
        " to=user<|message|>",
        tool_message(
            "calendar.lookup", '<atem:invoke name="calendar.lookup"><atem:parameter name="day">', first=True
        ),
    ],
)
@pytest.mark.parametrize("name", sorted(ADVERSARIAL_STREAMS))
def test_feeding_cost_is_linear_in_the_text_length(prefix, name):
    """P-STREAM-5: no re-scan of accumulated text; 4x the text costs about 4x the time, not 16x."""
    unit = ADVERSARIAL_STREAMS[name]
    short = feed_seconds(prefix, unit, 150)
    long = feed_seconds(prefix, unit, 600)
    assert long / short < 8


ONE_SHOT_PATHOLOGIES = {
    "closers_in_a_value": (
        ' to=f<|message|><atem:invoke name="f"><atem:parameter name="c">',
        "</atem:parameter>x",
    ),
    "angle_brackets_between_tags": (" to=f<|message|>", "< a "),
    "unclosed_names": (" to=f<|message|>", '<atem:invoke name="'),
    "marker_in_names": (" to=f<|message|>", '<atem:invoke name="a<|message|>'),
    "swallow_checks": (" to=f<|message|>", '<atem:invoke name="f.c">   '),
    "stray_starts": (" to=user<|message|>", "<|start|>" + "x" * 50),
    "over_long_switches": (" to=user<|message|>", " to=" + "x" * 70 + "<|message|>"),
}


@pytest.mark.parametrize("name", sorted(ONE_SHOT_PATHOLOGIES))
def test_one_shot_parsing_is_linear_on_pathological_text(name):
    """P-STREAM-5 for the whole-text path: no lookahead re-slices the rest of the input."""
    prefix, unit = ONE_SHOT_PATHOLOGIES[name]
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"c": {"type": "string"}}}}]

    def seconds(repeats):
        text = prefix + unit * repeats
        best = float("inf")
        for _ in range(5):  # the best of five, in CPU time: other processes on a busy machine do not count
            started = time.process_time()
            parse_output(text, tools)
            best = min(best, time.process_time() - started)
        return best

    assert seconds(4000) / seconds(1000) < 8


# -- P-STREAM-6 ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("to=user<|message|>ok <|eo", "ok <|eo"),
        ("to=user<|message|>ok to=x", "ok to=x"),
        ("to=user<|message|>ok to=x<|mess", "ok to=x<|mess"),
        ("to=user<|message|>ends with space ", "ends with space "),
        ("to=user<|message|><", "<"),
    ],
)
def test_end_of_stream_delivers_held_text_that_proved_not_to_be_markup(text, content):
    assert parse_all_ways(text).content == content


def test_an_unterminated_reasoning_body_is_reasoning():
    assert parse_all_ways(" to=self<|message|>still thinking to").reasoning == "still thinking to"


def test_finish_returns_the_held_text_as_the_last_delta():
    parser = OutputParser()
    assert parser.feed("to=user<|message|>ok <|eo").content == "ok "
    assert parser.finish().content == "<|eo"
    assert parser.finish() == Delta()
    assert parser.feed("more") == Delta()


# -- P-STREAM-7 ----------------------------------------------------------------------------------------------


def test_events_keep_wire_order_across_kinds():
    parser = OutputParser(CALENDAR_TOOLS)
    delta = parser.feed(TURN)
    kinds = [kind for kind, _ in delta.events]
    assert kinds == ["reasoning", "tool_call", "tool_call", "tool_call", "reasoning", "content"]
    assert delta.reasoning == "Friday was asked about.\nNow answer."
    assert delta.content == "One event on Friday."
    assert [piece.index for piece in delta.tool_calls] == [0, 0, 0]


# -- P-STREAM-8 ----------------------------------------------------------------------------------------------


NASTY = [
    "",
    "<|",
    "|>",
    "<|start|>" * 50,
    "<|message|>" * 50,
    "<|eom|><|eot|><|end_of_text|>" * 5,
    "</atem:parameter>" * 20,
    '<atem:invoke name="' * 20,
    '<atem:parameter name="">' * 5,
    "<atem:function_calls>" + '<atem:invoke name="calendar.lookup">' * 3 + "</atem:invoke>" * 7,
    " to=" * 100,
    "to=self<|message|>" * 30,
    "\x00\x01\ufffd\ud7ff" * 10,
    "😀" * 300,
    tool_message("calendar.lookup", '<atem:invoke name="calendar.lookup<|message|><|message|>"', first=True),
    tool_message("x" * 200, "y", first=True),
    "<|start|>" + "a" * 1000,
]


@pytest.mark.parametrize("text", NASTY)
def test_never_raises_and_never_leaks_framing_on_garbage(text):
    for tools in (None, CALENDAR_TOOLS):
        result = parse_all_ways(text, tools)
        for field in (result.reasoning or "", result.content or ""):
            assert not any(marker in field for marker in FRAMING_MARKERS)


def test_lenient_about_malformed_tool_declarations():
    tools = [None, "x", {"function": None}, {"name": 3}, {"name": "ok", "parameters": "bad"}]
    text = tool_message("ok", atem("ok", {"a": "1"}), first=True)
    assert parse_all_ways(text, tools).tool_calls[0].arguments == '{"a": "1"}'


def _merged(events: list) -> list:
    """`events` with adjacent text of one kind merged and call ids left out (each parser makes its own)."""
    merged: list = []
    for kind, payload in events:
        if kind == "tool_call":
            merged.append((kind, (payload.index, payload.name, payload.arguments)))
        elif merged and kind in ("reasoning", "content") and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + payload)
        else:
            merged.append((kind, payload))
    return merged


def _events_fed_in(text: str, size: int, *, marks: bool) -> list:
    """The events of a parser (with or without `mark_messages`) fed `text` `size` characters at a time."""
    parser = OutputParser(CALENDAR_TOOLS, mark_messages=marks)
    deltas = [parser.feed(text[i:i + size]) for i in range(0, len(text), size)] + [parser.finish()]
    return [event for delta in deltas for event in delta.events]


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_marked_messages_start_each_reasoning_and_content_message_and_change_nothing_else(size):
    """With mark_messages, a ("message", channel) event goes before the first text of each reasoning or content
    message a header opens (not before orphan text, nor for an empty message), however the text is fed; the text and
    calls are the unmarked parser's."""
    turn = (TURN.removesuffix("<|eot|>") + "<|eom|><|start|>assistant to=user<|message|>Any more?<|eom|> orphan"
            "<|start|>assistant to=self<|message|><|eom|><|eot|>")
    raw = _events_fed_in(turn, size, marks=True)
    marked = _merged(raw)
    starts = [i for i, (kind, _) in enumerate(marked) if kind == "message"]
    assert [(marked[i][1], marked[i + 1]) for i in starts] == [
        ("reasoning", ("reasoning", "Friday was asked about.")), ("reasoning", ("reasoning", "\nNow answer.")),
        ("content", ("content", "One event on Friday.")), ("content", ("content", "Any more?orphan"))]
    assert _merged([event for event in raw if event[0] != "message"]) == _merged(
        _events_fed_in(turn, size, marks=False))
