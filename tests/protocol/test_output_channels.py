"""Channels and assembly (protocol.md §4.3: P-CHAN-1..7) and tool names in context (§4.6: P-NAME-2..4)."""

import logging

import pytest
from protocol_support import CALENDAR_TOOLS, atem, calls, parse_all_ways, tool_message

from glimmer.protocol import OutputParser
from glimmer.protocol.tokens import FRAMING_MARKERS

TOOLS = CALENDAR_TOOLS


# -- P-CHAN-1: classes and orphan text ----------------------------------------------------------------------


def test_text_goes_to_the_class_of_the_open_message():
    text = (
        " to=self<|message|>R1<|eom|><|start|>assistant to=user<|message|>C1<|eom|>"
        "<|start|>assistant to=calendar.lookup<|message|>"
        + atem("calendar.lookup", {"day": "d"})
        + "<|eom|><|start|>assistant to=self<|message|>R2<|eom|><|start|>assistant<|message|>C2<|eot|>"
    )
    result = parse_all_ways(text, TOOLS)
    assert (result.reasoning, result.content) == ("R1\nR2", "C1C2")
    assert calls(result) == [("calendar.lookup", {"day": "d"})]


def test_orphan_text_between_messages_is_content_without_its_leading_whitespace():
    """P-CHAN-1: whitespace between <|eom|> and <|start|> never shows."""
    result = parse_all_ways(" to=self<|message|>r<|eom|>\n\n  <|start|>assistant to=user<|message|>a<|eot|>")
    assert result.content == "a"
    result = parse_all_ways(
        " to=self<|message|>r<|eom|>\n  stray words \n<|start|>assistant to=user<|message|>a"
    )
    assert result.content == "stray words \na"


def test_text_after_the_end_of_turn_is_orphan_text():
    assert parse_all_ways("to=user<|message|>a<|eot|> b").content == "ab"


# -- P-CHAN-2: ATEM executes only in tool channels -----------------------------------------------------------


@pytest.mark.parametrize("prefix", [" to=self<|message|>", " to=user<|message|>", "<|message|>", ""])
def test_atem_outside_a_tool_channel_is_verbatim_text(prefix):
    """P-CHAN-2: quoted ATEM, or the system prompt's example echoed back, is never executed."""
    quoted = "Call it like this:\n" + atem("calendar.lookup", {"day": "Fri"})
    result = parse_all_ways(prefix + quoted + "<|eot|>", TOOLS)
    assert result.tool_calls == []
    assert quoted in ((result.reasoning or "") + (result.content or ""))


def test_atem_in_a_channel_to_the_wrong_recipient_is_not_executed():
    text = "<|start|>assistant to=user<|message|>" + atem("calendar.lookup", {"day": "Fri"})
    assert parse_all_ways(text, TOOLS).tool_calls == []


# -- P-CHAN-3: tool-channel text never reaches content or reasoning ------------------------------------------


def test_tool_channel_prose_is_dropped_with_a_warning(caplog):
    text = (
        tool_message(
            "calendar.lookup", "SECRET prose " + atem("calendar.lookup", {"day": "d"}) + " MORE", first=True
        )
        + "<|eom|>"
    )
    with caplog.at_level(logging.WARNING):
        result = parse_all_ways(text, TOOLS)
    assert result.content is None and result.reasoning is None
    assert calls(result) == [("calendar.lookup", {"day": "d"})]
    assert "outside ATEM tags" in caplog.text


def test_unterminated_tool_channel_text_is_never_flushed_to_content():
    """P-STREAM-6: tool-channel text is never flushed to content."""
    result = parse_all_ways(
        tool_message("calendar.lookup", '<atem:invoke name="calendar.lo', first=True), TOOLS
    )
    assert (result.reasoning, result.content, result.tool_calls) == (None, None, [])


# -- P-CHAN-4 / P-CHAN-5: assembly ------------------------------------------------------------------------


def test_reasoning_blocks_are_joined_by_one_newline_between_non_empty_blocks():
    text = (
        " to=self<|message|>one<|eom|><|start|>assistant to=self<|message|><|eom|>"
        "<|start|>assistant to=self<|message|>two\n<|eom|><|start|>assistant to=self<|message|>three"
    )
    assert parse_all_ways(text).reasoning == "one\ntwo\n\nthree"


def test_the_separator_goes_out_with_the_next_blocks_first_character():
    parser = OutputParser()
    assert parser.feed(" to=self<|message|>one<|eom|>").reasoning == "one"
    assert parser.feed("<|start|>assistant to=self<|message|>").reasoning == ""
    assert parser.feed("w").reasoning == "\nw"


def test_every_reasoning_block_is_kept_an_unterminated_last_one_too():
    """P-CHAN-4 (vLLM kept one block of a truncated multi-block reasoning)."""
    text = (
        " to=self<|message|>a<|eom|><|start|>assistant to=self<|message|>b<|eom|>"
        "<|start|>assistant to=self<|message|>c"
    )
    assert parse_all_ways(text).reasoning == "a\nb\nc"


def test_content_concatenates_bodies_and_orphan_text_without_separators():
    text = "to=user<|message|>a<|eom|>b<|start|>assistant to=user<|message|>c<|eom|><|start|><|message|>d"
    assert parse_all_ways(text).content == "abcd"


# -- P-CHAN-6: no framing leaks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "to=user<|message|>a<|eot|><|eot|><|eom|>b",
        "to=user<|message|>a<|message|>b<|message|>",
        "to=user<|message|>a<|begin_of_text|>b",
        "to=user<|message|><|eo<|start|>m|>",
        "to=user<|message|><|eo<|eom|>m|>",
        "to=user<|message|><|e<|e<|eom|>om|>om|>",
        "to=user<|message|><|mess<|message|>age|>",
        " to=self<|message|><|st<|message|>art|>",
        "<|eom|><|st<|eom|>art|>",
        "to=user<|message|>x<|start|>y<|eom|>z<|start|>assistant to=user<|message|>w",
    ],
)
def test_no_complete_framing_marker_ever_reaches_content_or_reasoning(text):
    """P-CHAN-6: redundant terminators, stray <|message|>, dropped <|start|> are removed, and text joined
    around a removed piece never spells a marker."""
    result = parse_all_ways(text)
    for field in (result.reasoning or "", result.content or ""):
        assert not any(marker in field for marker in FRAMING_MARKERS)


def test_a_lone_angle_bracket_before_a_dropped_switch_space_cannot_spell_a_marker():
    text = "to=user<|message|>a< to=user<|message|>|eom|> b"
    content = parse_all_ways(text).content
    assert content == "a< b"
    parser = OutputParser()
    streamed = "".join(
        parser.feed(piece).content
        for piece in ("to=user<|message|>", "a", "< ", "to=user", "<|message|>", "|eom", "|>", " b")
    )
    assert streamed + parser.finish().content == content


def test_a_join_that_would_spell_a_marker_loses_only_the_completion():
    assert parse_all_ways("to=user<|message|>ok <|eo<|start|>m|> fine").content == "ok <|eo fine"


def test_other_special_tokens_are_text():
    text = "to=user<|message|>a<|patch|>b<|image|><|finetune_right_pad|><|reserved_special_token_9|>"
    assert parse_all_ways(text).content == text[len("to=user<|message|>") :]


# -- P-CHAN-7: residue after a channel closed mid-invoke --------------------------------------------------


def test_closing_tag_residue_after_a_mid_invoke_switch_is_dropped():
    """P-CHAN-7 (rounds 3-4): a literal to=user<|message|> in a value switched channel; the broken
    channel's closing tags must not surface in the reply."""
    body = (
        '<atem:function_calls>\n<atem:invoke name="calendar.lookup">\n<atem:parameter name="day">'
        "see to=user<|message|></atem:parameter>\n</atem:invoke>\n</atem:function_calls>\nHere is the answer."
    )
    result = parse_all_ways(tool_message("calendar.lookup", body, first=True) + "<|eot|>", TOOLS)
    assert result.content == "Here is the answer."
    assert result.tool_calls == []


def test_a_reply_after_an_interrupted_call_flows_at_once_without_its_later_tags():
    """P-CHAN-7 (round 4, issue 8): a real reply flows at once; ATEM tags later in that body are the broken
    call's remains and are dropped with the whitespace after them, so no markup reaches content."""
    body = '<atem:invoke name="calendar.lookup"><atem:parameter name="day">x to=user<|message|>'
    text = tool_message("calendar.lookup", body, first=True) + "Reply </atem:invoke> kept"
    assert parse_all_ways(text, TOOLS).content == "Reply kept"
    parser = OutputParser(TOOLS)
    assert parser.feed(text[:-len("</atem:invoke> kept")]).content == "Reply"  # streams before the tag comes


@pytest.mark.parametrize("marker", ["<|eot|>", "<|start|>", "<|end_of_text|>"])
@pytest.mark.parametrize("channel", ["user", "self"])
def test_a_residual_tag_removed_between_two_halves_of_a_marker_does_not_join_them(marker, channel):
    """P-CHAN-6, P-STREAM-1: the residue filter (P-CHAN-7) removes a tag from inside `<|eo</atem:invoke>t|>`; the
    halves it leaves must not spell a framing marker in the reply, and one-shot must agree with streaming (it showed
    `<|eot|>` whole, while a stream fed one character at a time showed `<|eo`)."""
    body = '<atem:invoke name="calendar.lookup"><atem:parameter name="day">x to=' + channel + "<|message|>"
    half = len(marker) // 2
    reply = f"Reply {marker[:half]}</atem:invoke>{marker[half:]} kept"
    result = parse_all_ways(tool_message("calendar.lookup", body, first=True) + reply, TOOLS)
    shown = result.content if channel == "user" else result.reasoning
    assert shown == f"Reply {marker[:half]} kept"


def test_residue_rule_applies_after_a_terminator_too():
    body = '<atem:invoke name="calendar.lookup"><atem:parameter name="day">x</atem:parameter>'
    text = (
        tool_message("calendar.lookup", body, first=True) + "<|eom|>\n</atem:invoke>\n</atem:function_calls>"
        "<|start|>assistant to=user<|message|>Answer"
    )
    result = parse_all_ways(text, TOOLS)
    assert result.content == "Answer"
    assert calls(result) == [("calendar.lookup", {"day": "x"})]


def test_known_cost_a_reply_starting_with_a_closing_tag_loses_it_after_a_mid_invoke_close():
    body = '<atem:invoke name="calendar.lookup"><atem:parameter name="day">x'
    text = (
        tool_message("calendar.lookup", body, first=True)
        + "<|eom|><|start|>assistant to=user<|message|>"
        + "</atem:invoke> is the closing tag."
    )
    assert parse_all_ways(text, TOOLS).content == "is the closing tag."


def test_no_residue_rule_after_a_cleanly_closed_channel():
    text = (
        tool_message("calendar.lookup", atem("calendar.lookup", {"day": "x"}), first=True)
        + "<|eom|><|start|>assistant to=user<|message|></atem:invoke> quoted"
    )
    assert parse_all_ways(text, TOOLS).content == "</atem:invoke> quoted"


# -- P-NAME-2..4 ------------------------------------------------------------------------------------------


def test_doubled_recipient_and_invoke_name_resolve_to_the_bare_tool():
    """P-NAME-1 in context (seed round 1): `to=lookup.lookup` for a bare tool."""
    text = tool_message("lookup.lookup", atem("lookup.lookup", {"query": "q"}), first=True)
    assert calls(parse_all_ways(text, TOOLS)) == [("lookup", {"query": "q"})]


def test_unresolved_invoke_name_takes_the_recipients_resolution():
    """P-NAME-2."""
    text = tool_message("calendar.lookup", atem("lookup_calendar", {"day": "Fri"}), first=True)
    assert calls(parse_all_ways(text, TOOLS)) == [("calendar.lookup", {"day": "Fri"})]


def test_invoke_name_wins_when_both_resolve_differently(caplog):
    text = tool_message("calendar.lookup", atem("lookup", {"query": "q"}), first=True)
    with caplog.at_level(logging.WARNING):
        assert calls(parse_all_ways(text, TOOLS)) == [("lookup", {"query": "q"})]
    assert "resolves to" in caplog.text


def test_unresolved_names_pass_through_unchanged_counted_and_never_valid():
    """P-NAME-3."""
    text = tool_message("weather", atem("weather.get", {"city": "42"}), first=True)
    parser = OutputParser(TOOLS)
    parser.feed(text)
    parser.finish()
    assert parser.unresolved_call_count == 1
    assert not parser.has_valid_call and parser.valid_call_names == []
    assert calls(parse_all_ways(text, TOOLS)) == [("weather.get", {"city": "42"})]


@pytest.mark.parametrize("tools", [None, []])
def test_without_declared_tools_tool_channels_yield_no_calls(tools, caplog):
    """P-NAME-4, P-REQ-3 (tool_choice "none" is passed as tools=None): bodies dropped with a warning."""
    text = (
        tool_message("calendar.lookup", atem("calendar.lookup", {"day": "Fri"}), first=True)
        + "<|eom|><|start|>assistant to=user<|message|>ok"
    )
    with caplog.at_level(logging.WARNING):
        result = parse_all_ways(text, tools)
    assert result.tool_calls == [] and result.content == "ok"
    assert "yields no calls" in caplog.text
