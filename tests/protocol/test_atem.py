"""ATEM tool calls in tool channels (protocol.md §3.2, §4.4: P-ATEM-1..8), each shape parsed every way."""

import json
import logging

import pytest
from protocol_support import CALENDAR_TOOLS, atem, calls, parse_all_ways, tool_message

from glimmer.protocol import OutputParser, ParsedOutput

FILE_TOOLS = [
    {"name": "read", "parameters": {"type": "object", "properties": {"filePath": {"type": "string"}}}},
    {
        "name": "write",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "mode": {"type": "integer"},
            },
        },
    },
]
TOOLS = CALENDAR_TOOLS + FILE_TOOLS


def lookup(body: str, **kwargs) -> str:
    return tool_message("calendar.lookup", body, **kwargs)


def test_the_composed_example_of_the_spec():
    """§3.3: reasoning, then one call with typed arguments, no content."""
    text = (
        " to=self<|message|>Friday was asked about; query the calendar.<|eom|>"
        + lookup(atem("calendar.lookup", {"day": "Friday", "limit": "3"}))
        + "<|eot|>"
    )
    result = parse_all_ways(text, TOOLS)
    assert result.reasoning == "Friday was asked about; query the calendar."
    assert result.content is None
    assert calls(result) == [("calendar.lookup", {"day": "Friday", "limit": 3})]
    assert result.tool_calls[0].arguments == '{"day": "Friday", "limit": 3}'


# -- P-ATEM-1: canonical tags, free whitespace ---------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        '<atem:function_calls><atem:invoke name="calendar.lookup">'
        '<atem:parameter name="day">Fri</atem:parameter>'
        "</atem:invoke></atem:function_calls>",
        '\n\n  <atem:function_calls>\n\n\t<atem:invoke name="calendar.lookup">   \n'
        '<atem:parameter name="day">Fri</atem:parameter>\n\n</atem:invoke>  \n</atem:function_calls>\n',
        '<atem:invoke name="calendar.lookup">\n'
        '<atem:parameter name="day">Fri</atem:parameter>\n</atem:invoke>',
    ],
)
def test_whitespace_between_tags_is_free_and_the_wrapper_is_optional(body):
    """P-ATEM-1."""
    assert calls(parse_all_ways(lookup(body, first=True), TOOLS)) == [("calendar.lookup", {"day": "Fri"})]


@pytest.mark.parametrize(
    "body",
    [
        "<atem:invoke name='calendar.lookup'><atem:parameter name='day'>Fri</atem:parameter></atem:invoke>",
        '<invoke name="calendar.lookup"><parameter name="day">Fri</parameter></invoke>',
        '<atem:invoke  name="calendar.lookup"></atem:invoke>',
        '<atem:invoke name="calendar.lookup" ></atem:invoke>',
        '{"name": "calendar.lookup", "arguments": {"day": "Fri"}}',
    ],
)
def test_only_canonical_tags_count(body):
    """P-ATEM-1: lookalike markup is not a call."""
    assert parse_all_ways(lookup(body, first=True) + "<|eot|>", TOOLS).tool_calls == []


def test_a_name_ends_at_the_first_quote():
    body = '<atem:invoke name="calendar.lookup"><atem:parameter name="da"y">x</atem:parameter></atem:invoke>'
    assert calls(parse_all_ways(lookup(body, first=True), TOOLS)) == [("calendar.lookup", {})]


def test_text_between_tags_is_ignored_with_one_warning_per_channel(caplog):
    body = (
        'Let me call it.\n<atem:function_calls>\nfirst note\n<atem:invoke name="calendar.lookup">\nnote '
        '<atem:parameter name="day">Fri</atem:parameter>\n</atem:invoke>\n</atem:function_calls>\nbye'
    )
    with caplog.at_level(logging.WARNING, logger="glimmer.protocol.atem"):
        parser = OutputParser(TOOLS)
        result = ParsedOutput.from_deltas(
            [parser.feed(lookup(body, first=True) + "<|eot|>"), parser.finish()]
        )
    assert calls(result) == [("calendar.lookup", {"day": "Fri"})]
    assert result.content is None
    assert sum("characters of text outside ATEM tags" in record.message for record in caplog.records) == 1
    assert calls(parse_all_ways(lookup(body, first=True) + "<|eot|>", TOOLS)) == calls(result)


# -- P-ATEM-2: positional closers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "see </atem:parameter> in the docs",
        'fake <atem:invoke name="write"> and <atem:parameter name="mode">7</atem:parameter>x',
        "</atem:invoke></atem:function_calls> as text",
        "</atem:parameter>\nnot a tag",
        "</atem:parameter></atem:parameter>",
        "ends with a lookalike </atem:parameter",
        "<|message|> and <|patch|> and <|eo and <|start and |>",
        "quotes \" ' and unicode ü 😀\nand\nnewlines\n",
        "   leading and trailing spaces   ",
    ],
)
def test_tag_lookalikes_and_special_token_spellings_inside_a_value_are_value_text(value):
    """P-ATEM-2: a closer ends a value only before a parameter opener, an invoke/block closer or the end;
    fake openers, unmatched tags and a stray <|message|> are value text."""
    body = atem("write", {"path": "a.txt", "content": value, "mode": "1"})
    result = parse_all_ways(tool_message("write", body, first=True) + "<|eot|>", TOOLS)
    assert calls(result) == [("write", {"path": "a.txt", "content": value, "mode": 1})]


def test_closer_followed_by_a_parameter_opener_ends_the_value():
    value = 'a</atem:parameter> <atem:parameter name="mode">7'
    body = atem("write", {"content": value})
    assert calls(parse_all_ways(tool_message("write", body, first=True), TOOLS)) == [
        ("write", {"content": "a", "mode": 7})
    ]


def test_closer_at_the_end_of_the_body_ends_the_value():
    body = '<atem:invoke name="write"><atem:parameter name="path">p</atem:parameter>  '
    for ending in ("<|eom|>", "<|eot|>", "<|end_of_text|>", "<|start|>assistant to=user<|message|>ok", ""):
        result = parse_all_ways(tool_message("write", body, first=True) + ending, TOOLS)
        assert calls(result) == [("write", {"path": "p"})]


def test_more_than_64_whitespace_characters_of_lookahead_count_as_legal():
    value = "v</atem:parameter>" + " " * 65 + "more"
    body = (
        '<atem:invoke name="write"><atem:parameter name="content">'
        + value
        + "</atem:parameter></atem:invoke>"
    )
    assert calls(parse_all_ways(tool_message("write", body, first=True), TOOLS)) == [
        ("write", {"content": "v"})
    ]
    value = "v</atem:parameter>" + " " * 64 + "more"
    body = (
        '<atem:invoke name="write"><atem:parameter name="content">'
        + value
        + "</atem:parameter></atem:invoke>"
    )
    assert calls(parse_all_ways(tool_message("write", body, first=True), TOOLS)) == [
        ("write", {"content": value})
    ]


def test_invoke_closer_not_followed_by_an_invoke_or_block_end_does_not_close():
    body = (
        '<atem:invoke name="write"><atem:parameter name="path">p</atem:parameter></atem:invoke> junk '
        '<atem:parameter name="mode">2</atem:parameter></atem:invoke></atem:function_calls>'
    )
    assert calls(parse_all_ways(tool_message("write", body, first=True), TOOLS)) == [
        ("write", {"path": "p", "mode": 2})
    ]


def test_a_missing_invoke_closer_is_closed_by_the_block_closer():
    body = (
        '<atem:function_calls><atem:invoke name="read"><atem:parameter name="filePath">a</atem:parameter>'
        "</atem:function_calls>" + atem("read", {"filePath": "b"})
    )
    assert calls(parse_all_ways(tool_message("read", body, first=True), TOOLS)) == [
        ("read", {"filePath": "a"}),
        ("read", {"filePath": "b"}),
    ]


def test_a_parameter_closer_directly_before_an_invoke_opener_is_value_text():
    """P-ATEM-2 lists the legal followers of `</atem:parameter>`; an invoke opener is not one."""
    value = 'a</atem:parameter><atem:invoke name="read">b'
    body = atem("read", {"filePath": value})
    assert calls(parse_all_ways(tool_message("read", body, first=True), TOOLS)) == [
        ("read", {"filePath": value})
    ]


def test_framing_sits_above_atem_inside_values():
    """P-ATEM-2: inside a value only framing is structural: <|eot|> ends the channel (and the call)."""
    body = (
        '<atem:invoke name="write"><atem:parameter name="path">p</atem:parameter>'
        '<atem:parameter name="content">x'
    )
    result = parse_all_ways(
        tool_message("write", body + "<|eot|>rest</atem:parameter></atem:invoke>", first=True), TOOLS
    )
    assert calls(result) == [("write", {"path": "p"})]
    assert result.content == "rest"  # P-CHAN-7: the broken call's closing tags are residue (issue 8)


# -- P-ATEM-3: numbering -------------------------------------------------------------------------------------


def test_calls_are_numbered_densely_in_wire_order_across_invokes_blocks_and_channels():
    """P-ATEM-3: invokes per block, blocks per channel, tool channels per turn; reasoning interleaves."""
    two_invokes = (
        '<atem:function_calls><atem:invoke name="read"><atem:parameter name="filePath">1'
        '</atem:parameter></atem:invoke><atem:invoke name="read"><atem:parameter name="filePath">2'
        "</atem:parameter></atem:invoke></atem:function_calls>"
    )
    second_block = atem("read", {"filePath": "3"})
    text = (
        " to=self<|message|>plan<|eom|>"
        + tool_message("read", two_invokes + "\n" + second_block)
        + "<|eom|><|start|>assistant to=self<|message|>more<|eom|>"
        + tool_message("calendar.lookup", atem("calendar.lookup", {"day": "4"}))
        + "<|eot|>"
    )
    parser = OutputParser(TOOLS)
    deltas = [parser.feed(text), parser.finish()]
    starts = [piece for delta in deltas for piece in delta.tool_calls if piece.is_start]
    assert [piece.index for piece in starts] == [0, 1, 2, 3]
    assert len({piece.id for piece in starts}) == 4
    assert all(piece.id.startswith("call_") for piece in starts)
    result = parse_all_ways(text, TOOLS)
    assert result.reasoning == "plan\nmore"
    assert [arguments["filePath" if name == "read" else "day"] for name, arguments in calls(result)] == [
        "1",
        "2",
        "3",
        "4",
    ]


# -- P-ATEM-4: materialization and streaming -----------------------------------------------------------------


def call_pieces(text, tools=TOOLS, chunk=1):
    parser = OutputParser(tools)
    pieces = []
    for position in range(0, len(text), chunk):
        delta = parser.feed(text[position : position + chunk])
        pieces.extend((position + chunk, piece) for piece in delta.tool_calls)
    pieces.extend((len(text), piece) for piece in parser.finish().tool_calls)
    return pieces


def test_a_call_starts_streaming_when_its_first_parameter_completes():
    """P-ATEM-4: start (index, id, name, `{` + first pair), then `, "k": v` per parameter, `}` at close;
    partial values are never streamed; fragments concatenate to json.dumps of the arguments."""
    body = (
        '<atem:invoke name="write">\n<atem:parameter name="path">a.txt</atem:parameter>\n'
        '<atem:parameter name="content">hello</atem:parameter>\n<atem:parameter name="mode">'
        "6</atem:parameter>\n</atem:invoke>\n</atem:function_calls>"
    )
    text = tool_message("write", "<atem:function_calls>\n" + body, first=True) + "<|eot|>"
    pieces = call_pieces(text)
    first_closer_end = text.index("</atem:parameter>\n<atem:parameter") + len("</atem:parameter>\n<")
    assert [piece.arguments for _, piece in pieces] == [
        '{"path": "a.txt"',
        ', "content": "hello"',
        ', "mode": 6',
        "}",
    ]
    assert pieces[0][1].name == "write" and pieces[0][1].id is not None and pieces[0][1].index == 0
    assert all(piece.id is None and piece.name is None for _, piece in pieces[1:])
    assert pieces[0][0] >= first_closer_end
    arguments = "".join(piece.arguments for _, piece in pieces)
    assert arguments == json.dumps({"path": "a.txt", "content": "hello", "mode": 6}, ensure_ascii=False)


def test_a_closed_empty_invoke_streams_an_empty_object():
    text = tool_message("calendar.lookup", '<atem:invoke name="calendar.lookup">\n</atem:invoke>', first=True)
    pieces = call_pieces(text + "<|eot|>")
    assert [(piece.index, piece.name, piece.arguments) for _, piece in pieces] == [
        (0, "calendar.lookup", "{}")
    ]


def test_nothing_streams_before_a_call_materializes():
    text = tool_message(
        "write", '<atem:invoke name="write"><atem:parameter name="content">partial value', first=True
    )
    parser = OutputParser(TOOLS)
    assert all(not parser.feed(character).tool_calls for character in text)


def test_arguments_keep_wire_key_order_and_unicode():
    body = atem("write", {"mode": "1", "path": "ü/😀.txt"})
    assert parse_all_ways(tool_message("write", body, first=True), TOOLS).tool_calls[0].arguments == (
        '{"mode": 1, "path": "ü/😀.txt"}'
    )


# -- P-ATEM-5: abnormal end ---------------------------------------------------------------------------------


OPEN_INVOKE = (
    '<atem:function_calls>\n<atem:invoke name="write">\n<atem:parameter name="path">a.txt'
    '</atem:parameter>\n<atem:parameter name="content">half a val'
)


@pytest.mark.parametrize(
    "closer",
    [
        "<|eom|>",
        "<|eot|>",
        "<|end_of_text|>",
        "<|start|>assistant to=self<|message|>",
        " to=user<|message|>",
        "",
    ],
)
def test_a_channel_closed_mid_invoke_keeps_the_materialized_call_with_closed_json(closer):
    """P-ATEM-5: completed parameters kept, the open value discarded, arguments valid JSON."""
    result = parse_all_ways(tool_message("write", OPEN_INVOKE, first=True) + closer, TOOLS)
    assert calls(result) == [("write", {"path": "a.txt"})]


def test_an_unmaterialized_call_is_dropped_and_calls_never_merge():
    """P-ATEM-5: the next call takes the next index (FreeToken merged the calls)."""
    unfinished = '<atem:invoke name="write"><atem:parameter name="path">lost'
    text = (
        tool_message("write", OPEN_INVOKE, first=True)
        + "<|eom|>"
        + tool_message("write", unfinished)
        + "<|eom|>"
        + tool_message("read", atem("read", {"filePath": "b"}))
        + "<|eot|>"
    )
    parser = OutputParser(TOOLS)
    deltas = [parser.feed(text), parser.finish()]
    assert [piece.index for delta in deltas for piece in delta.tool_calls if piece.is_start] == [0, 1]
    assert calls(parse_all_ways(text, TOOLS)) == [("write", {"path": "a.txt"}), ("read", {"filePath": "b"})]


@pytest.mark.parametrize("cut", range(1, 140, 3))
def test_truncation_anywhere_yields_valid_json_arguments(cut):
    """P-ATEM-5: max_tokens mid-invoke (mid-string included) never ships invalid JSON."""
    body = atem("write", {"path": 'a "quoted" path', "content": "line1\nline2", "mode": "6"})
    text = tool_message("write", body, first=True)[: cut + 25]
    for name, arguments in calls(parse_all_ways(text, TOOLS)):
        assert name == "write" and isinstance(arguments, dict)


ONE_PARAMETER_CLOSED = atem("write", {"path": "a.txt", "content": "x"})
FIRST_CLOSED = ONE_PARAMETER_CLOSED.index("</atem:parameter>") + len("</atem:parameter>")
SECOND_CLOSED = ONE_PARAMETER_CLOSED.index("</atem:parameter>", FIRST_CLOSED) + len("</atem:parameter>")


@pytest.mark.parametrize("end", range(FIRST_CLOSED, len(ONE_PARAMETER_CLOSED) + 1))
def test_a_parameter_whose_closer_is_complete_survives_any_later_cut(end):
    """P-ATEM-2 + P-ATEM-5: a body that ends (max_tokens, or a terminator) while the text after a closer is
    still a proper prefix of a legal follower (`</atem:parameter>` then `\n</`) keeps the closer, as the end
    of the body itself would. The call used to be dropped at such cuts."""
    expected = {"path": "a.txt", "content": "x"} if end >= SECOND_CLOSED else {"path": "a.txt"}
    for closer in ("", "<|eom|>"):
        text = tool_message("write", ONE_PARAMETER_CLOSED[:end], first=True) + closer
        assert calls(parse_all_ways(text, TOOLS)) == [("write", expected)]


def test_a_tag_cut_short_at_the_end_of_the_body_is_not_reported_as_prose(caplog):
    """`...</atem:parameter>\n</atem:inv` at max_tokens: the cut tag is framing, not text outside the tags."""
    for end in range(FIRST_CLOSED, len(ONE_PARAMETER_CLOSED)):
        caplog.clear()
        parse_all_ways(tool_message("write", ONE_PARAMETER_CLOSED[:end], first=True), TOOLS)
        assert "outside ATEM tags" not in caplog.text, ONE_PARAMETER_CLOSED[FIRST_CLOSED:end]


# -- P-ATEM-6: swallowed parameter opener --------------------------------------------------------------------


def test_swallowed_parameter_opener_is_repaired_when_the_head_declares_the_parameter():
    """P-ATEM-6 (the seed's `read.filePath` shape): the model glued the parameter name onto the tool name."""
    body = (
        '<atem:function_calls>\n<atem:invoke name="read.filePath">/tmp/norm.txt</atem:parameter>\n'
        "</atem:invoke>"
    )
    result = parse_all_ways(
        tool_message("read", body + "\n</atem:function_calls>", first=True) + "<|eot|>", TOOLS
    )
    assert calls(result) == [("read", {"filePath": "/tmp/norm.txt"})]


def test_swallowed_opener_keeps_leading_whitespace_and_later_parameters():
    body = (
        '<atem:invoke name="write.content">\n  indented\n</atem:parameter>\n'
        '<atem:parameter name="mode">3</atem:parameter>\n</atem:invoke>'
    )
    assert calls(parse_all_ways(tool_message("write", body, first=True), TOOLS)) == [
        ("write", {"content": "\n  indented\n", "mode": 3})
    ]


def test_swallowed_opener_through_a_doubled_head():
    body = '<atem:invoke name="lookup.lookup.query">cats</atem:parameter></atem:invoke>'
    assert calls(parse_all_ways(tool_message("lookup.lookup", body, first=True), TOOLS)) == [
        ("lookup", {"query": "cats"})
    ]


def test_no_repair_when_the_head_does_not_declare_the_parameter():
    body = '<atem:invoke name="read.nonsense">x</atem:parameter></atem:invoke>'
    result = parse_all_ways(tool_message("notes", body, first=True), TOOLS)
    assert calls(result) == [("read.nonsense", {})]


def test_an_invoke_named_head_dot_parameter_with_real_parameters_is_a_normal_invoke():
    body = (
        '<atem:invoke name="read.filePath">\n<atem:parameter name="filePath">a</atem:parameter>\n'
        "</atem:invoke>"
    )
    assert calls(parse_all_ways(tool_message("read", body, first=True), TOOLS)) == [
        ("read", {"filePath": "a"})
    ]


# -- P-ATEM-7: <|message|> in a name attribute ---------------------------------------------------------------


def test_message_marker_where_the_closing_quote_belongs_ends_the_name():
    """P-ATEM-7 (ollama): `<|message|>` fumbled into the invoke name."""
    body = (
        '<atem:invoke name="calendar.lookup<|message|>\n<atem:parameter name="day">Fri</atem:parameter>\n'
        "</atem:invoke>"
    )
    assert calls(parse_all_ways(lookup(body, first=True), TOOLS)) == [("calendar.lookup", {"day": "Fri"})]


def test_message_marker_inside_a_name_is_removed():
    body = (
        '<atem:invoke name="calendar.<|message|>lookup">'
        '<atem:parameter name="d<|message|>ay">Fri</atem:parameter></atem:invoke>'
    )
    assert calls(parse_all_ways(lookup(body, first=True), TOOLS)) == [("calendar.lookup", {"day": "Fri"})]


def test_message_marker_closing_a_parameter_name_starts_its_value():
    body = (
        '<atem:invoke name="calendar.lookup">'
        '<atem:parameter name="day<|message|>Friday</atem:parameter></atem:invoke>'
    )
    assert calls(parse_all_ways(lookup(body, first=True), TOOLS)) == [("calendar.lookup", {"day": "Friday"})]


# -- P-ATEM-8: duplicate parameters --------------------------------------------------------------------------


def test_duplicate_parameter_names_keep_the_first(caplog):
    body = (
        '<atem:invoke name="calendar.lookup"><atem:parameter name="day">Fri</atem:parameter>'
        '<atem:parameter name="day">Sat</atem:parameter><atem:parameter name="limit">2</atem:parameter>'
        "</atem:invoke>"
    )
    with caplog.at_level(logging.WARNING):
        assert calls(parse_all_ways(lookup(body, first=True), TOOLS)) == [
            ("calendar.lookup", {"day": "Fri", "limit": 2})
        ]
    assert "repeats parameter 'day'" in caplog.text
