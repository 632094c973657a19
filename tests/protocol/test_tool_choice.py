"""What `tool_choice` means for a request (P-REQ-3..5), and the turn constraint it implies."""

from __future__ import annotations

import pytest

from glimmer.errors import RequestError
from glimmer.protocol import normalize_tools
from glimmer.protocol.tool_choice import plan_tools

TOOLS = normalize_tools([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                         {"type": "function", "function": {"name": "get_time"}}])


@pytest.mark.parametrize(("tool_choice", "rendered", "parsed", "required"), [
    (None, True, True, None),
    ("auto", True, True, None),
    ("none", False, False, None),  # P-REQ-3
    ("required", True, True, ["get_weather", "get_time"]),
    ({"type": "function", "function": {"name": "get_time"}}, True, True, ["get_time"]),
])
def test_tool_choice_decides_what_is_rendered_parsed_and_required(tool_choice, rendered, parsed, required):
    plan = plan_tools(TOOLS, tool_choice)
    assert (plan.render_tools is not None, plan.parser_tools is not None, plan.required_names) == (
        rendered, parsed, required)


def test_no_tools_means_nothing_to_render_or_parse():
    plan = plan_tools([], None)
    assert (plan.render_tools, plan.parser_tools, plan.required_names) == (None, None, None)


@pytest.mark.parametrize(("tools", "choice", "message"), [
    ([], "required", "needs `tools`"),
    (TOOLS, {"type": "function", "function": {"name": "send_mail"}}, "not among the declared tools"),
    (TOOLS, "sometimes", "is not"),
    (TOOLS, {"type": "function"}, "must be"),
])
def test_choices_that_cannot_be_met_are_refused(tools, choice, message):
    with pytest.raises(RequestError, match=message) as raised:
        plan_tools(tools, choice)
    assert raised.value.param == "tool_choice"


def test_a_free_auto_turn_has_no_constraint_and_a_named_one_calls_only_that_tool():
    assert plan_tools(TOOLS, "auto").turn_constraint(None) is None
    named = plan_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}}).turn_constraint(None)
    assert named.must_call and [tool["function"]["name"] for tool in named.call_tools] == ["get_time"]
    answer = plan_tools(TOOLS, "auto").turn_constraint({"json_schema": {}}, parallel_calls=False)
    assert not answer.must_call and len(answer.call_tools) == 2 and not answer.parallel_calls
    assert plan_tools(TOOLS, "none").turn_constraint(None, thinking_token_budget=0).call_tools == []


def test_a_strict_tool_constrains_calls_under_auto_and_strict_must_be_a_boolean():
    strict = normalize_tools([{"type": "function", "function": {"name": "get_weather", "strict": True}},
                              {"type": "function", "function": {"name": "get_time", "strict": False}}])
    constraint = plan_tools(strict, "auto").turn_constraint(None)
    assert constraint is not None and not constraint.must_call and constraint.answer is None
    assert [tool["function"]["name"] for tool in constraint.call_tools] == ["get_weather", "get_time"]
    assert plan_tools(strict, "none").turn_constraint(None) is None
    assert plan_tools(normalize_tools([{"name": "f", "strict": False}]), "auto").turn_constraint(None) is None
    with pytest.raises(RequestError, match="strict must be a boolean"):
        normalize_tools([{"name": "f", "strict": "yes"}])


@pytest.mark.parametrize(("tool_choice", "calls", "finish_reason", "unsatisfied"), [
    ("auto", [], "length", False),
    ("required", ["get_time"], "length", False),  # a call max_tokens cut after it was written (P-ATEM-5, P-API-2)
    ({"type": "function", "function": {"name": "get_time"}}, ["get_weather"], "tool_calls", True),
    ("required", [], "length", True),
    ("required", [], "stop", True),
])
def test_a_forced_choice_is_unsatisfied_without_a_call_of_an_allowed_tool(tool_choice, calls, finish_reason,
                                                                           unsatisfied):
    # P-REQ-4: never success with empty tool_calls, a length cut included
    error = plan_tools(TOOLS, tool_choice).unsatisfied(calls, finish_reason, where="choice 0")
    assert (error is not None) == unsatisfied


def test_the_unsatisfied_error_of_a_length_cut_names_the_limit_to_raise():
    plan = plan_tools(TOOLS, "required")
    error = plan.unsatisfied([], "length", where="the response", limit_field="max_output_tokens")
    assert str(error) == ('tool_choice asked for a tool call, but the response was cut short by max_output_tokens '
                          '(finish_reason "length") before a complete call; raise max_output_tokens so that the '
                          'reasoning and the call fit')
