"""Headers and boundaries of a generated turn (protocol.md §4.2: P-HDR-1..8), each shape parsed every way."""

import logging

import pytest
from protocol_support import CALENDAR_TOOLS, atem, calls, parse_all_ways, tool_message

from glimmer.protocol import HEADER_SPAN, RECIPIENT_MAX, OutputParser, parse_output

LONG_TOOL = "t" * RECIPIENT_MAX
TOOLS = CALENDAR_TOOLS + [
    {"name": LONG_TOOL, "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}
]


def content_of(text, tools=None):
    return parse_all_ways(text, tools).content


# -- P-HDR-1: the turn starts header-open ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        (" to=self<|message|>think<|eom|>", "think", None),
        ("to=self<|message|>think", "think", None),
        (" to=user<|message|>hello<|eot|>", None, "hello"),
        ("<|message|>hello", None, "hello"),
        ("\n\n\n\n\n\n\n\n\n\n to=user<|message|>hello", None, "hello"),
        (" assistant to=self<|message|>think", "think", None),
    ],
)
def test_the_first_header_is_bare_and_takes_the_normal_header_path(text, reasoning, content):
    """P-HDR-1: the prompt ends with <|start|>assistant; the synthetic <|start|> is never delivered."""
    result = parse_all_ways(text)
    assert (result.reasoning, result.content) == (reasoning, content)


def test_a_reply_after_a_finished_message_is_read_from_the_header_it_writes():
    """P-HDR-1, P-HDR-4 (README, `add_generation_prompt=False`): the prompt ends after a message's <|eot|>; the model's
    own <|start|> voids the synthetic turn-start candidate at once, and its header is read. Text before any header is
    content between messages (P-CHAN-1: leading whitespace dropped; P-CHAN-5: joined without a separator)."""
    result = parse_all_ways("<|start|>assistant to=self<|message|>r<|eom|>"
                            "<|start|>assistant to=user<|message|> Hi<|eot|>")
    assert (result.reasoning, result.content) == ("r", " Hi")
    headerless = parse_all_ways(" No header.<|eom|><|start|>assistant to=user<|message|>Hi<|eot|>")
    assert (headerless.reasoning, headerless.content) == (None, "No header.Hi")


def test_a_turn_may_open_with_a_tool_call():
    """P-HDR-1, §3.1 (llama.cpp missed this): the first message can be a tool call."""
    text = tool_message("calendar.lookup", atem("calendar.lookup", {"day": "Mon"}), first=True) + "<|eot|>"
    assert calls(parse_all_ways(text, TOOLS)) == [("calendar.lookup", {"day": "Mon"})]


# -- P-HDR-2: well-formed and ill-formed headers --------------------------------------------------------


@pytest.mark.parametrize(
    "header", ["assistant to=user", "  assistant \n to=user \t", "to=user", "", "assistant", " \n "]
)
def test_well_formed_headers_open_a_message_of_the_recipient_class(header):
    assert content_of(f"<|eom|><|start|>{header}<|message|>hi") == "hi"


@pytest.mark.parametrize(
    "header",
    [
        "assistantto=user",
        "assistant to=" + "x" * (RECIPIENT_MAX + 1),
        "assistant to=user extra",
        "assistant to=",
        "junk",
        "user",
        "assistant to=us<er",
    ],
)
def test_complete_ill_formed_headers_open_a_discarded_channel(header, caplog):
    """P-HDR-2: not shown, not executed; a warning (round 6: a junk recipient yields an empty channel)."""
    text = (
        f"<|start|>{header}<|message|>"
        + atem("calendar.lookup", {"day": "x"})
        + "<|eom|><|start|>assistant to=user<|message|>after"
    )
    with caplog.at_level(logging.WARNING):
        result = parse_all_ways(" to=user<|message|>before<|eom|>" + text, TOOLS)
    assert result.content == "beforeafter"
    assert result.tool_calls == []
    assert "ill-formed header" in caplog.text


@pytest.mark.parametrize("first", ["assistantto=x", "to=" + "x" * (RECIPIENT_MAX + 1), "hello there"])
def test_ill_formed_first_header_discards_its_message(first):
    """Round 6: a bare-header lookalike ending in <|message|> is one message, discarded; the turn goes on."""
    result = parse_all_ways(f"{first}<|message|>hidden<|eom|><|start|>assistant to=user<|message|>shown")
    assert result.content == "shown"


def test_recipient_up_to_the_maximum_length_and_with_quotes_is_well_formed():
    text = tool_message(LONG_TOOL, atem(LONG_TOOL, {"x": "1"}), first=True)
    assert calls(parse_all_ways(text, TOOLS)) == [(LONG_TOOL, {"x": "1"})]
    assert parse_all_ways(' to=a"b<|message|>body<|eot|>').content is None


# -- P-HDR-3: header span --------------------------------------------------------------------------------


def test_a_header_of_exactly_header_span_characters_is_a_header():
    """P-HDR-3 and round 4: a legal long header is never cut, in any chunking."""
    header = (
        "assistant" + " " * (HEADER_SPAN - len("assistant") - len("to=") - len(LONG_TOOL)) + "to=" + LONG_TOOL
    )
    assert len(header) == HEADER_SPAN
    text = (
        "to=user<|message|>before<|eom|><|start|>"
        + header
        + "<|message|>"
        + atem(LONG_TOOL, {"x": "v"})
        + "<|eom|><|start|>assistant to=user<|message|>after<|eot|>"
    )
    result = parse_all_ways(text, TOOLS)
    assert calls(result) == [(LONG_TOOL, {"x": "v"})]
    assert result.content == "beforeafter"


@pytest.mark.parametrize("length", [HEADER_SPAN, HEADER_SPAN + 1, HEADER_SPAN + 10, HEADER_SPAN + 11, 400])
def test_no_message_marker_within_header_span_voids_the_candidate(length):
    """P-HDR-3/5: past HEADER_SPAN characters the candidate is text of the interrupted body."""
    junk = "x" * length
    result = parse_all_ways(f"to=user<|message|>A<|start|>{junk}<|message|>B<|eot|>")
    assert result.content == ("A" if length <= HEADER_SPAN else f"A{junk}B")


def test_streaming_decides_a_header_candidate_at_header_span_plus_eleven_characters():
    """P-HDR-3: a `<|message|>` starting at offset HEADER_SPAN still fits, so the decision waits for it."""
    parser = OutputParser()
    parser.feed("to=user<|message|>A<|start|>")
    assert parser.feed("x" * (HEADER_SPAN + len("<|message|>") - 1)).content == ""
    assert parser.channel is None
    assert parser.feed("x").content == "x" * (HEADER_SPAN + len("<|message|>"))
    assert parser.channel == "content"


# -- P-HDR-4 / P-HDR-5: voided candidates -------------------------------------------------------------------


@pytest.mark.parametrize("marker", ["<|start|>", "<|eom|>", "<|eot|>", "<|end_of_text|>"])
def test_a_framing_marker_before_the_message_marker_voids_the_candidate_at_once(marker):
    """P-HDR-4; round 6: turn-start prose ahead of the first real header flows as content."""
    text = f"Some prose{marker}<|start|>assistant to=user<|message|>answer<|eot|>"
    assert content_of(text) == "Some proseanswer"


def test_stray_start_and_junk_do_not_swallow_the_next_real_header():
    """Round 4/5: stray <|start|> + junk + the next real header is not one giant header."""
    text = (
        "to=user<|message|>before<|start|>junk to=calendar.lookup junk<|start|>assistant to=user<|message|>"
        "reply<|eot|>"
    )
    result = parse_all_ways(text, TOOLS)
    assert result.content == "beforejunk to=calendar.lookup junkreply"
    assert result.tool_calls == []


def test_a_voided_start_is_dropped_and_its_text_continues_a_parameter_value():
    """P-HDR-5: a literal <|start|> inside a parameter value."""
    body = atem("calendar.lookup", {"day": "Mon<|start|>day"})
    result = parse_all_ways(tool_message("calendar.lookup", body, first=True) + "<|eot|>", TOOLS)
    assert calls(result) == [("calendar.lookup", {"day": "Monday"})]


def test_prose_before_a_stray_start_and_the_reply_after_it_survive():
    assert content_of("to=user<|message|>Hello <|start|> world<|eot|>") == "Hello  world"
    assert parse_all_ways(" to=self<|message|>a<|start|>b<|eom|>").reasoning == "ab"


# -- P-HDR-6: end of stream inside a header ------------------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        "",
        "a",
        "assist",
        "assistant",
        "assistant ",
        "assistant to",
        "assistant to=",
        "assistant to=us",
        "assistant to=calendar.lookup",
        "\nassistant to=user ",
    ],
)
def test_an_interrupted_real_header_is_dropped_at_end_of_stream(tail):
    assert content_of(f"to=user<|message|>Answer.<|start|>{tail}") == "Answer."


@pytest.mark.parametrize("tail", ["junk", "to=user", "user", "assistantto=x", "assistant to=a b"])
def test_an_unfinished_real_header_that_is_not_framing_is_text_at_end_of_stream(tail):
    """P-HDR-6 and round 5: the reply after a stray start + junk is delivered, marker dropped."""
    assert content_of(f"to=user<|message|>Answer.<|start|>{tail}") == f"Answer.{tail}"


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("to=ann@example.org", "to=ann@example.org"),
        (" to=ann@example.org", "to=ann@example.org"),
        ("assistant", "assistant"),
        (" to=user", "to=user"),
        ("Hello", "Hello"),
        ("assistant to=user hello", "assistant to=user hello"),
    ],
)
def test_the_synthetic_turn_start_candidate_is_always_delivered(text, content):
    """P-HDR-6 and round 2: a reply that merely looks like a bare header prefix stays visible."""
    assert content_of(text) == content


# -- P-HDR-7: headerless switches ------------------------------------------------------------------------


def test_headerless_switch_from_reasoning_to_a_tool_channel():
    """P-HDR-7 (FreeToken hid the call in reasoning): to=self left without <|eom|> before a call."""
    text = (
        " to=self<|message|>I'll check the calendar. to=calendar.lookup<|message|>"
        + atem("calendar.lookup", {"day": "Fri"})
        + "<|eot|>"
    )
    result = parse_all_ways(text, TOOLS)
    assert result.reasoning == "I'll check the calendar."
    assert calls(result) == [("calendar.lookup", {"day": "Fri"})]


def test_headerless_switch_drops_exactly_one_whitespace_character():
    result = parse_all_ways(" to=self<|message|>line\n\n to=user<|message|>answer")
    assert (result.reasoning, result.content) == ("line\n\n", "answer")


def test_headerless_switch_at_the_start_of_a_body():
    result = parse_all_ways(" to=self<|message|>to=user<|message|>answer")
    assert (result.reasoning, result.content) == (None, "answer")


@pytest.mark.parametrize(
    "text",
    [
        "to=user<|message|>The auto=user<|message|>x",
        "to=user<|message|>a to=" + "r" * (RECIPIENT_MAX + 1) + "<|message|>x",
        "to=user<|message|>a to=<|message|>x",
        "to=user<|message|>a to= user<|message|>x",
    ],
)
def test_glued_or_over_long_switch_is_text(text):
    """P-HDR-7: `to=` glued to a word, or an over-long recipient, is text (the stray marker is removed)."""
    result = parse_all_ways(text)
    assert result.content == text[len("to=user<|message|>") :].replace("<|message|>", "")


def test_headerless_switch_out_of_a_tool_value_ends_the_call_and_shows_the_reply():
    """P-HDR-7 in open values; P-ATEM-5: the unmaterialized call is dropped."""
    body = '<atem:invoke name="calendar.lookup"><atem:parameter name="day">Fri to=user<|message|>Done.'
    result = parse_all_ways(tool_message("calendar.lookup", body, first=True) + "<|eot|>", TOOLS)
    assert result.tool_calls == []
    assert result.content == "Done."


@pytest.mark.parametrize("between", ["", "\n", "\n \n "])
def test_headerless_switch_in_orphan_text(between):
    result = parse_all_ways(f" to=self<|message|>r<|eom|>{between}to=user<|message|>answer")
    assert (result.reasoning, result.content) == ("r", "answer")


def test_headerless_switch_in_a_discarded_channel():
    result = parse_all_ways("<|start|>junk<|message|>hidden to=user<|message|>shown")
    assert result.content == "shown"


# -- P-HDR-8: other roles ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header", ["user", "system", "developer", "tool calendar.lookup", " user to=x", "tool"]
)
def test_a_header_for_another_role_is_flagged_and_discarded(header):
    """P-HDR-8: the model is inventing a tool result or user turn; the engine should stop."""
    parser = OutputParser(TOOLS)
    parser.feed(" to=user<|message|>ok<|eom|>")
    assert not parser.other_role_header_seen
    delta = parser.feed(f"<|start|>{header}<|message|>fabricated")
    assert parser.other_role_header_seen
    assert "fabricated" not in delta.content
    assert parse_output(f" to=user<|message|>ok<|eom|><|start|>{header}<|message|>fabricated").content == "ok"


@pytest.mark.parametrize("header", ["assistant to=user", "userland", "assistant to=user.tool"])
def test_assistant_and_junk_headers_are_not_other_roles(header):
    parser = OutputParser()
    parser.feed(f"<|eom|><|start|>{header}<|message|>x")
    assert not parser.other_role_header_seen
