"""Delta, ToolCallDelta and ParsedOutput: what the parser hands the server."""

from glimmer.protocol import Delta, ParsedOutput, ToolCall, ToolCallDelta


def test_an_empty_delta_is_falsy_and_equal_to_another_empty_one():
    assert not Delta()
    assert Delta() == Delta("", "", [], [])
    assert Delta().tool_calls == [] and Delta().events == []


def test_fields_and_wire_ordered_events():
    start = ToolCallDelta(0, "call_1", "f", '{"a": 1')
    delta = Delta.from_events([("reasoning", "r"), ("tool_call", start), ("content", "c")])
    assert (delta.reasoning, delta.content, delta.tool_calls) == ("r", "c", [start])
    assert delta.events == [("reasoning", "r"), ("tool_call", start), ("content", "c")]
    assert delta and start.is_start and not ToolCallDelta(0, None, None, "}").is_start


def test_single_text_delta_derives_its_event():
    assert Delta.single("content", "hi").events == [("content", "hi")]
    assert Delta.single("reasoning", "hm") == Delta.from_events([("reasoning", "hm")])


def test_parsed_output_assembles_deltas_by_call_index():
    deltas = [
        Delta.from_events([("reasoning", "a"), ("tool_call", ToolCallDelta(0, "call_x", "f", '{"k": 1'))]),
        Delta.from_events([("tool_call", ToolCallDelta(1, "call_y", "g", "{}")), ("content", "b")]),
        Delta.from_events([("tool_call", ToolCallDelta(0, None, None, "}")), ("reasoning", "c")]),
    ]
    assert ParsedOutput.from_deltas(deltas) == ParsedOutput(
        "ac", "b", [ToolCall("call_x", "f", '{"k": 1}'), ToolCall("call_y", "g", "{}")]
    )
    assert ParsedOutput.from_deltas([Delta()]) == ParsedOutput(None, None, [])
