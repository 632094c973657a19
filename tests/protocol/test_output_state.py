"""Parser state the engine reads while generating (P-REQ-4, P-REQ-6, P-REQ-7, P-API-5, P-TMPL-8)."""

import itertools

import pytest
from protocol_support import CALENDAR_TOOLS, atem, calls, parse_all_ways, tool_message

from glimmer.protocol import OutputParser, count_reasoning_tokens, parse_output

TURN = (
    " to=self<|message|>think<|eom|>"
    + tool_message("calendar.lookup", atem("calendar.lookup", {"day": "Fri"}))
    + "<|eom|><|start|>assistant to=self<|message|>again<|eom|>"
    "<|start|>assistant to=user<|message|>Answer.<|eot|>"
)


def channels_after_each_character(text, tools=CALENDAR_TOOLS):
    parser = OutputParser(tools)
    seen = []
    for character in text:
        parser.feed(character)
        if not seen or seen[-1] != parser.channel:
            seen.append(parser.channel)
    return seen


def test_channel_reports_the_open_message_class_and_none_between_messages():
    """P-REQ-6/7: the structured-output gate opens at a content header's <|message|>, from O(1) state."""
    assert channels_after_each_character(TURN) == [
        None,
        "reasoning",
        None,
        "tool",
        None,
        "reasoning",
        None,
        "content",
        None,
    ]


def test_the_bare_first_header_opens_the_content_gate():
    """P-REQ-6 (vLLM's gate fired only on tool channels): `to=user` or no recipient, bare header included."""
    for text in (" to=user<|message|>{", "<|message|>{", " to=self<|message|>r to=user<|message|>{"):
        parser = OutputParser()
        parser.feed(text)
        assert parser.channel == "content"


def test_channel_is_discarded_for_ill_formed_headers_and_none_inside_a_header():
    parser = OutputParser()
    assert parser.channel is None
    parser.feed("assistantto=x<|message|>")
    assert parser.channel == "discarded"
    parser.feed("<|start|>assistant to=us")
    assert parser.channel is None


def test_channel_at_finish_names_the_message_a_cut_fell_inside_and_none_between_messages():
    """What a cut output (max_tokens, an abort) left open: the Responses API marks only that message's item
    incomplete. An unfinished turn-start header is delivered as content (P-HDR-6), so it counts as content."""
    call = TURN.index("<|start|>assistant to=calendar.lookup")
    cuts = {
        " to=se": "content",  # the turn-start header, cut: delivered as content
        " to=self<|message|>thi": "reasoning",
        " to=self<|message|>think<|eom|>": None,
        TURN[: call + len("<|start|>assistant to=cal")]: None,  # a later header, cut: the reasoning was whole
        TURN[: TURN.index("</atem:invoke>")]: "tool",  # the call started with its parameter: its arguments were cut
        TURN[: TURN.index("Answer.") + 3]: "content",
        TURN: None,
    }
    for text, channel in cuts.items():
        for chunks in ([text], list(text)):
            parser = OutputParser(CALENDAR_TOOLS)
            for chunk in chunks:
                parser.feed(chunk)
            parser.finish()
            assert parser.channel_at_finish == channel, text


def test_a_cut_inside_a_message_that_delivered_nothing_yet_leaves_channel_at_finish_none():
    """A cut right after a later message's header, before its first text (or inside a tool message before its call
    started, the parameter not yet complete), cut no output: the Responses API marked the item of the message
    before it `incomplete`, a whole answer or call, though that message had ended."""
    second_reasoning = TURN.index("again")
    cuts = [TURN[:second_reasoning],  # the body of a later reasoning message opened, no text yet
            TURN[: TURN.index("Answer.")],  # the same for the answer
            TURN[: TURN.index("Fri")],  # inside the tool message's invoke, no parameter complete: no call started
            " to=user<|message|>First.<|eom|><|start|>assistant to=user<|message|>"]
    for text, mark_messages in itertools.product(cuts, (False, True)):
        for chunks in ([text], list(text)):
            parser = OutputParser(CALENDAR_TOOLS, mark_messages=mark_messages)
            for chunk in chunks:
                parser.feed(chunk)
            parser.finish()
            assert parser.channel_at_finish is None, text


def test_reasoning_spans_run_from_header_start_or_turn_start_through_the_terminator():
    """P-API-5: spans are absolute offsets into the fed text, the same for every chunking."""
    second = TURN.index("<|start|>assistant to=self")
    expected = [
        (0, TURN.index("<|eom|>") + len("<|eom|>")),
        (second, TURN.index("<|eom|>", second) + len("<|eom|>")),
    ]
    for size in (1, 3, 8, len(TURN)):
        parser = OutputParser(CALENDAR_TOOLS)
        for position in range(0, len(TURN), size):
            parser.feed(TURN[position : position + size])
        parser.finish()
        assert parser.reasoning_spans == expected


def test_an_open_reasoning_span_ends_at_the_text_fed_so_far():
    parser = OutputParser()
    parser.feed(" to=self<|message|>abc")
    assert parser.reasoning_spans == [(0, 22)]
    parser.feed("def to=user<|message|>x")
    assert parser.reasoning_spans == [(0, 25)]


def test_reasoning_span_after_a_headerless_switch_starts_at_the_switch():
    text = " to=user<|message|>a to=self<|message|>r<|eom|>"
    parser = OutputParser()
    parser.feed(text)
    assert parser.reasoning_spans == [(text.index(" to=self"), len(text))]


def test_content_spans_hold_exactly_the_answer_text_for_every_chunking():
    """The answer's text by offsets into the fed text (what chat logprobs list): not the turn-start header, the
    orphan whitespace (P-CHAN-1), a stray <|message|> (P-CHAN-6), nor the whitespace of a headerless switch."""
    text = (" to=user<|message|>a<|message|>b to=self<|message|>r<|eom|>\n\n orphan<|start|>assistant"
            " to=user<|message|>x<|eot|>")
    content = parse_output(text).content
    assert content == "aborphanx"
    for size in (1, 2, 5, len(text)):
        parser = OutputParser()
        for position in range(0, len(text), size):
            parser.feed(text[position : position + size])
            assert parser.decided_offset <= position + size
        parser.finish()
        assert parser.decided_offset == len(text)
        assert "".join(text[start:end] for start, end in parser.content_spans) == content


def test_text_that_may_still_be_framing_is_not_decided():
    """P-STREAM-3: a trailing marker prefix or possible headerless switch is held, so its offset is not decided."""
    parser = OutputParser()
    parser.feed(" to=user<|message|>Hi")
    assert parser.decided_offset == len(" to=user<|message|>Hi")
    parser.feed(" to")
    assert parser.decided_offset == len(" to=user<|message|>Hi")
    parser.feed("day<|eo")
    assert parser.decided_offset == len(" to=user<|message|>Hi today")


def test_reasoning_token_count_from_spans_is_never_zero_when_reasoning_is_not():
    """P-API-5: tokens overlapping a reasoning message, header or turn start through <|eom|>."""
    tokens = [
        " to",
        "=self",
        "<|message|>",
        "think",
        "<|eom|>",
        "<|start|>",
        "assistant",
        " to",
        "=user",
        "<|message|>",
        "Answer",
        ".",
        "<|eot|>",
    ]
    text = "".join(tokens)
    offsets, position = [], 0
    for token in tokens:
        offsets.append((position, position + len(token)))
        position += len(token)
    parser = OutputParser()
    for token in tokens:
        parser.feed(token)
    parser.finish()
    assert parse_all_ways(text).reasoning == "think"
    assert count_reasoning_tokens(offsets, parser.reasoning_spans) == 5


def test_valid_calls_are_finished_calls_with_declared_names():
    """P-REQ-4: required/named tool_choice needs at least one valid call (resolved name, object args)."""
    parser = OutputParser(CALENDAR_TOOLS)
    parser.feed(tool_message("calendar.lookup", atem("calendar.lookup", {"day": "Fri"}), first=True))
    assert parser.valid_call_names == ["calendar.lookup"] and parser.has_valid_call
    parser.feed("<|eom|>" + tool_message("nope", atem("nope.fn", {"a": "b"})) + "<|eom|>")
    parser.feed(tool_message("lookup.lookup", atem("lookup.lookup", {"query": "q"})))
    parser.finish()
    assert parser.valid_call_names == ["calendar.lookup", "lookup"]
    assert parser.unresolved_call_count == 1


def test_a_call_kept_at_truncation_counts_as_valid():
    parser = OutputParser(CALENDAR_TOOLS)
    parser.feed(
        tool_message(
            "calendar.lookup",
            '<atem:invoke name="calendar.lookup"><atem:parameter name="day">'
            'Fri</atem:parameter><atem:parameter name="limit">2',
            first=True,
        )
    )
    assert not parser.has_valid_call
    parser.finish()
    assert parser.valid_call_names == ["calendar.lookup"]


@pytest.mark.parametrize(
    ("recipient", "channel", "field"), [("self", "reasoning", "reasoning"), ("user", "content", "content")]
)
def test_a_continued_final_message_starts_inside_its_channel(recipient, channel, field):
    """P-TMPL-8: when the last assistant message is continued, the parser starts in its channel."""
    parser = OutputParser(continue_recipient=recipient)
    assert parser.channel == channel
    result = parse_all_ways(
        "more text<|eom|><|start|>assistant to=user<|message|>end", continue_recipient=recipient
    )
    assert getattr(result, field).startswith("more text")


def test_a_continued_tool_message_continues_its_atem_body():
    text = '<atem:invoke name="calendar.lookup"><atem:parameter name="day">Fri</atem:parameter></atem:invoke>'
    result = parse_all_ways(text, CALENDAR_TOOLS, continue_recipient="calendar.lookup")
    assert calls(result) == [("calendar.lookup", {"day": "Fri"})]


CALL_OPENED = '<atem:function_calls>\n<atem:invoke name="calendar.lookup">\n<atem:parameter name="day">'


def test_a_continued_tool_call_is_read_from_the_prefix_in_the_prompt_on():
    """P-TMPL-8, P-ATEM-4: the prompt ends inside a tool message's ATEM; the call is the whole call, its prefix
    included (without the prefix the reply was text outside ATEM tags, dropped: no call)."""
    text = "Fri</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>"
    result = parse_all_ways(text, CALENDAR_TOOLS, continue_recipient="calendar.lookup", continue_prefix=CALL_OPENED)
    assert calls(result) == [("calendar.lookup", {"day": "Fri"})]
    assert (result.content, result.reasoning) == (None, None)  # P-CHAN-3: no tool-channel text elsewhere


def test_what_the_continued_prefix_completes_streams_with_the_first_delta():
    """P-ATEM-4, P-STREAM-7: a parameter the prefix completed materializes the call; its start is the first event."""
    prefix = CALL_OPENED + 'Fri</atem:parameter>\n<atem:parameter name="limit">'
    parser = OutputParser(CALENDAR_TOOLS, continue_recipient="calendar.lookup", continue_prefix=prefix)
    [start] = parser.feed("3").tool_calls
    assert (start.index, start.name, start.arguments) == (0, "calendar.lookup", '{"day": "Fri"')
    result = parse_all_ways("3</atem:parameter>\n</atem:invoke>\n</atem:function_calls>", CALENDAR_TOOLS,
                            continue_recipient="calendar.lookup", continue_prefix=prefix)
    assert calls(result) == [("calendar.lookup", {"day": "Fri", "limit": 3})]
    assert calls(parse_output("", CALENDAR_TOOLS, continue_recipient="calendar.lookup", continue_prefix=prefix)) == [
        ("calendar.lookup", {"day": "Fri"})]  # P-ATEM-5: cut off at once, the materialized call is kept


@pytest.mark.parametrize(("recipient", "field"), [("self", "reasoning"), ("user", "content")])
def test_a_continued_answer_or_reasoning_is_not_repeated(recipient, field):
    """The reply continues the prompt's text: the prefix is the prompt's, not the reply's (P-TMPL-8)."""
    result = parse_all_ways(" more", continue_recipient=recipient, continue_prefix="Hello")
    assert getattr(result, field) == " more"


@pytest.mark.parametrize(("recipient", "prefix", "reply", "expected"), [
    ("self", "Plan:\n", "to=user<|message|>Answer", (None, "Answer")),
    ("self", "", "to=user<|message|>Answer", (None, "Answer")),
    ("user", "So far ", "to=self<|message|>Hmm", ("Hmm", None)),
    ("calendar.lookup", CALL_OPENED + "Fri</atem:parameter>\n</atem:invoke>\n</atem:function_calls>\n",
     "to=user<|message|>Done", (None, "Done")),
    ("self", "Plan:", "to=user<|message|>Answer", ("to=userAnswer", None)),
])
def test_a_continued_body_is_switched_out_of_as_the_whole_body_would_be(recipient, prefix, reply, expected):
    """P-HDR-7, P-TMPL-8: the prompt holds the start of the continued body, so a reply's `to=R<|message|>` right
    after a prefix ending in whitespace (or an empty one) is a headerless switch, as in the whole body; glued to the
    prefix's last word it stays text. The reply's answer went to reasoning after a prefix ending in a newline."""
    result = parse_all_ways(reply, CALENDAR_TOOLS, continue_recipient=recipient, continue_prefix=prefix)
    assert (result.reasoning, result.content) == expected


@pytest.mark.parametrize(("prefix", "expected"), [("I should check.", "\nActually, no."), ("", "Actually, no.")])
def test_a_continued_reasoning_block_is_joined_to_the_next_one_as_in_the_whole_reasoning(prefix, expected):
    """P-CHAN-4, P-TMPL-8: the prompt's reasoning prefix is a non-empty block, so the reply's next reasoning block
    starts with the joining newline: the prefix and the reply's reasoning concatenate to the turn's reasoning (they
    were glued, `I should check.Actually, no.`)."""
    reply = "<|eom|><|start|>assistant to=self<|message|>Actually, no.<|eom|><|start|>assistant to=user<|message|>Hi"
    result = parse_all_ways(reply, continue_recipient="self", continue_prefix=prefix)
    assert (result.reasoning, result.content) == (expected, "Hi")
    assert prefix + result.reasoning == parse_all_ways(" to=self<|message|>" + prefix + reply).reasoning


def test_turn_ended_after_eot_or_eos_but_not_eom():
    for terminator, ended in (("<|eom|>", False), ("<|eot|>", True), ("<|end_of_text|>", True)):
        parser = OutputParser()
        parser.feed(" to=user<|message|>x" + terminator)
        assert parser.turn_ended is ended
