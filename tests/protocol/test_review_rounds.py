"""Every failure shape the seeds report from other engines' parsers (seeds 002-004, protocol.md §7).

Each test pins one shape from a review round, parsed one-shot and in every chunking (`parse_all_ways`), so a
shape that once passed one path and failed the other cannot come back.
"""

import json

import pytest
from protocol_support import CALENDAR_TOOLS, atem, calls, parse_all_ways, tool_message

from glimmer.errors import RequestError
from glimmer.protocol import (
    HEADER_SPAN,
    OutputParser,
    builtin_template_source,
    render_chat,
    resolve_reasoning_strength,
)

WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
FILES = [
    {"name": "read", "parameters": {"type": "object", "properties": {"filePath": {"type": "string"}}}},
    {
        "name": "write",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        },
    },
]
TOOLS = CALENDAR_TOOLS + [WEATHER] + FILES
REPLY = "<|start|>assistant to=user<|message|>The reply.<|eot|>"


# -- round 1 -------------------------------------------------------------------------------------------------


def test_r1_channel_closed_mid_invoke_does_not_merge_into_the_next_call():
    text = (
        tool_message(
            "write",
            '<atem:invoke name="write"><atem:parameter name="path">a</atem:parameter>'
            '<atem:parameter name="content">cut',
            first=True,
        )
        + "<|eom|>"
        + tool_message("read", atem("read", {"filePath": "b"}))
        + "<|eot|>"
    )
    assert calls(parse_all_ways(text, TOOLS)) == [("write", {"path": "a"}), ("read", {"filePath": "b"})]


def test_r1_headerless_switch_after_reasoning_keeps_an_empty_argument_call():
    text = (
        " to=self<|message|>No arguments needed. to=calendar.lookup<|message|>"
        '<atem:function_calls>\n<atem:invoke name="calendar.lookup">\n</atem:invoke>\n</atem:function_calls>'
        "<|eom|>" + REPLY
    )
    result = parse_all_ways(text, TOOLS)
    assert result.reasoning == "No arguments needed."
    assert calls(result) == [("calendar.lookup", {})]
    assert result.content == "The reply."


@pytest.mark.parametrize(
    "reply",
    [
        "assistant is my job title",
        "to= is an operator",
        "to=be or not to be",
        "assistant to=user hello",
        " assistant",
    ],
)
def test_r1_content_that_merely_starts_like_a_header_streams_as_text(reply):
    assert parse_all_ways(reply).content == reply.lstrip()


def test_r1_atem_echoed_in_the_answer_is_not_executed():
    prompt_example = render_chat(
        [{"role": "user", "content": "hi"}],
        tools=[WEATHER | {"description": ""}],
        template=builtin_template_source(),
        current_date="2026-01-01",
    )
    echo = prompt_example[prompt_example.index('<atem:function_calls>\n<atem:invoke name="demo.report">') :]
    echo = echo[: echo.index("</atem:function_calls>") + len("</atem:function_calls>")]
    result = parse_all_ways(" to=user<|message|>The example reads:\n" + echo + "<|eot|>", TOOLS)
    assert result.tool_calls == [] and echo in result.content


def test_r1_template_doubled_recipient_collapses_onto_the_registered_name():
    text = tool_message(
        "get_weather.get_weather", atem("get_weather.get_weather", {"city": "Oslo"}), first=True
    )
    assert calls(parse_all_ways(text, TOOLS)) == [("get_weather", {"city": "Oslo"})]


def test_r1_streamed_content_never_grows_a_partial_marker_that_turns_out_to_open_a_header():
    parser = OutputParser(TOOLS)
    shown = parser.feed(" to=user<|message|>Sure.<|start").content
    shown += parser.feed("|>assistant to=calendar.lookup<|message|>").content
    assert shown == "Sure."


# -- round 2 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exit_", ["<|start|>assistant to=user<|message|>", " to=user<|message|>"])
def test_r2_leaving_a_tool_channel_without_a_terminator_keeps_the_rest_of_the_turn(exit_):
    text = tool_message("read", atem("read", {"filePath": "x"}), first=True) + exit_ + "The reply.<|eot|>"
    result = parse_all_ways(text, TOOLS)
    assert calls(result) == [("read", {"filePath": "x"})]
    assert result.content == "The reply."


@pytest.mark.parametrize("cut", ['"quoted', "half\\", "line\n", "<", "</atem:param", "</atem:parameter>"])
def test_r2_max_tokens_mid_invoke_ships_valid_json(cut):
    text = tool_message(
        "write",
        '<atem:invoke name="write"><atem:parameter name="path">p</atem:parameter>'
        '<atem:parameter name="content">' + cut,
        first=True,
    )
    result = parse_all_ways(text, TOOLS)
    arguments = json.loads(result.tool_calls[0].arguments)
    assert arguments in ({"path": "p"}, {"path": "p", "content": cut[: -len("</atem:parameter>")]})


def test_r2_a_second_invoke_block_in_one_channel_is_parsed():
    body = atem("read", {"filePath": "1"}) + "\n" + atem("read", {"filePath": "2"})
    assert calls(parse_all_ways(tool_message("read", body, first=True) + "<|eot|>", TOOLS)) == [
        ("read", {"filePath": "1"}),
        ("read", {"filePath": "2"}),
    ]


@pytest.mark.parametrize("reply", ["to=ann@example.org", "assistant to", " to=x"])
def test_r2_a_complete_response_that_looks_like_a_bare_header_prefix_is_delivered(reply):
    assert parse_all_ways(reply).content == reply.lstrip()


def test_r2_prose_stranded_after_a_literal_closer_is_delivered_at_end_of_stream():
    text = " to=user<|message|>Use </atem:parameter> to close, then <|eo"
    assert parse_all_ways(text, TOOLS).content == "Use </atem:parameter> to close, then <|eo"


# -- round 3 -------------------------------------------------------------------------------------------------


def test_r3_a_headerless_continuation_after_eom_streams_live():
    """Seek mode held a post-<|eom|> repetition loop until the end; orphan text streams with bounded hold."""
    parser = OutputParser()
    parser.feed(" to=self<|message|>r<|eom|>")
    shown = "".join(parser.feed(" again").content for _ in range(500))
    assert len(shown) >= 500 * len(" again") - 10


def test_r3_text_around_a_complete_start_whose_message_never_comes_is_kept():
    text = " to=user<|message|>before<|start|>" + "n" * (HEADER_SPAN + 40)
    assert parse_all_ways(text).content == "before" + "n" * (HEADER_SPAN + 40)


def test_r3_out_of_vocabulary_effort_is_refused_not_sent_verbatim():
    with pytest.raises(RequestError):
        resolve_reasoning_strength(reasoning_effort="max")


def test_r3_literal_channel_marker_in_a_value_leaks_no_markup_into_the_reply():
    body = (
        '<atem:function_calls>\n<atem:invoke name="write">\n<atem:parameter name="path">p</atem:parameter>\n'
        '<atem:parameter name="content">say to=user<|message|></atem:parameter>\n</atem:invoke>\n'
        "</atem:function_calls>"
    )
    result = parse_all_ways(tool_message("write", body, first=True) + "<|eot|>", TOOLS)
    assert result.content is None
    assert calls(result) == [("write", {"path": "p"})]


# -- round 4 -------------------------------------------------------------------------------------------------


def test_r4_a_truncated_invoke_does_not_swallow_the_rest_of_the_reply():
    text = (
        tool_message("write", '<atem:invoke name="write"><atem:parameter name="path">p', first=True)
        + " to=user<|message|>Here is everything you asked for.<|eot|>"
    )
    assert parse_all_ways(text, TOOLS).content == "Here is everything you asked for."


def test_r4_stray_start_plus_junk_cannot_hijack_the_recipient_of_the_next_header():
    text = " to=user<|message|>A<|start|>junk to=write junk" + "<|start|>assistant to=user<|message|>B<|eot|>"
    result = parse_all_ways(text, TOOLS)
    assert result.tool_calls == [] and result.content == "Ajunk to=write junkB"


@pytest.mark.parametrize("span", [110, 119, 125, 128])
def test_r4_protocol_legal_long_headers_are_never_cut(span):
    header = " " * (span - len("assistant to=write")) + "assistant to=write"
    text = (
        " to=user<|message|>A<|eom|><|start|>"
        + header
        + "<|message|>"
        + atem("write", {"path": "p"})
        + "<|eom|>"
        + REPLY
    )
    result = parse_all_ways(text, TOOLS)
    assert calls(result) == [("write", {"path": "p"})]
    assert result.content == "AThe reply."


def test_r4_text_delivered_mid_stream_is_never_swallowed_at_end_of_stream():
    parser = OutputParser(TOOLS)
    shown = parser.feed(" to=user<|message|>kept text ").content
    shown += parser.finish().content
    assert shown == "kept text "


# -- round 5 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("junk_length", [5, 100, 129, 135, 139, 200])
def test_r5_reply_after_a_stray_start_and_junk_survives_end_of_stream(junk_length):
    junk = "j" * junk_length
    assert parse_all_ways(" to=user<|message|>Reply<|start|>" + junk).content == "Reply" + junk


def test_r5_a_reply_beginning_with_a_closing_tag_after_a_truncated_invoke_loses_only_the_tag():
    """Known cost of P-CHAN-7, pinned on the reviewer's wire."""
    text = (
        tool_message("write", '<atem:invoke name="write"><atem:parameter name="path">p', first=True)
        + "<|eom|><|start|>assistant to=user<|message|></atem:invoke>closes an invoke."
    )
    assert parse_all_ways(text, TOOLS).content == "closes an invoke."


# -- round 6 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lookalike", ["to=" + "r" * 65, "assistantto=x"])
def test_r6_bare_header_lookalikes_ending_in_message_yield_an_empty_channel(lookalike):
    result = parse_all_ways(lookalike + "<|message|>hidden<|eom|>" + REPLY)
    assert result.content == "The reply."


def test_r6_many_leading_newlines_before_the_first_header_are_fine():
    assert parse_all_ways("\n" * 12 + " to=user<|message|>ok").content == "ok"


def test_r6_turn_start_prose_ahead_of_the_first_real_header_flows_as_content():
    text = "Preamble words<|start|>assistant to=self<|message|>think<|eom|>" + REPLY
    result = parse_all_ways(text)
    assert (result.reasoning, result.content) == ("think", "Preamble wordsThe reply.")


def test_r6_seed_turn_leaks_nothing():
    text = (
        " to=self<|message|>Plan.<|eom|>"
        + tool_message("calendar.lookup", atem("calendar.lookup", {"day": "Fri"}))
        + "<|eom|>"
        + REPLY
    )
    result = parse_all_ways(text, TOOLS)
    for leaked in ("<|", "to=", "atem", "assistant"):
        assert leaked not in (result.content or "") and leaked not in (result.reasoning or "")


# -- seed 002 (vLLM) and protocol.md §7 ----------------------------------------------------------------------


def test_vllm_string_parameter_holding_a_jsonl_line_stays_a_string():
    line = '{"span": "1-3", "name": "intro"}'
    text = tool_message("write", atem("write", {"path": "x.jsonl", "content": line}), first=True)
    assert calls(parse_all_ways(text, TOOLS)) == [("write", {"path": "x.jsonl", "content": line})]


def test_vllm_swallowed_parameter_opener_binds_the_value():
    body = '<atem:invoke name="read.filePath">/tmp/norm.txt</atem:parameter>\n</atem:invoke>'
    assert calls(parse_all_ways(tool_message("read", body, first=True), TOOLS)) == [
        ("read", {"filePath": "/tmp/norm.txt"})
    ]


def test_vllm_nan_never_becomes_invalid_json():
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}]
    text = tool_message("f", atem("f", {"x": "NaN"}), first=True)
    assert parse_all_ways(text, tools).tool_calls[0].arguments == '{"x": "NaN"}'


def test_vllm_partial_atem_tags_never_leak_into_streamed_content():
    text = tool_message("read", atem("read", {"filePath": "x"}), first=True) + "<|eom|>" + REPLY
    parser = OutputParser(TOOLS)
    streamed = "".join(parser.feed(character).content for character in text) + parser.finish().content
    assert streamed == "The reply."


def test_mlx_and_osaurus_headers_and_reasoning_never_reach_the_wrong_channel():
    text = (
        " to=self<|message|>Reasoning only.<|eom|><|start|>assistant to=calendar.lookup<|message|>"
        + atem("calendar.lookup", {"day": "x"})
        + "<|eom|>"
        + REPLY
    )
    result = parse_all_ways(text, TOOLS)
    assert result.reasoning == "Reasoning only." and result.content == "The reply."


def test_freetoken_double_bos_the_rendered_prompt_holds_exactly_one_bos_at_position_zero():
    """P-TMPL-5: the template writes bos itself; tokenize the prompt without adding special tokens."""
    rendered = render_chat(
        [{"role": "user", "content": "hi"}], template=builtin_template_source(), current_date="2026-01-01"
    )
    assert rendered.startswith("<|begin_of_text|><|start|>system")
    assert rendered.count("<|begin_of_text|>") == 1


def test_ollama_think_false_is_strength_low_never_none():
    assert resolve_reasoning_strength(enable_thinking=False) == "low"
