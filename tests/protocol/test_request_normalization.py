"""normalize_messages / normalize_tools: requests made renderable (P-TMPL-6, P-TMPL-7, P-REQ-8)."""

import copy
import dataclasses
import datetime
import decimal
import logging
import re
import time

import pytest

from glimmer.errors import RequestError
from glimmer.protocol import builtin_template_source, normalize_messages, normalize_tools, render_chat
from glimmer.protocol.deltas import ToolCall
from glimmer.protocol.request_normalization import refuse_unmatched_tool_messages


def assistant_call(arguments, **function_fields):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calendar.lookup", "arguments": arguments, **function_fields},
            }
        ],
    }


def arguments_of(messages):
    return messages[0]["tool_calls"][0]["function"]["arguments"]


# -- messages ----------------------------------------------------------------------------------------------


def test_string_arguments_are_json_decoded():
    """P-TMPL-6: OpenAI history carries arguments as JSON text; the template needs a mapping."""
    assert arguments_of(normalize_messages([assistant_call('{"day": "Fri", "limit": 3}')])) == {
        "day": "Fri",
        "limit": 3,
    }


@pytest.mark.parametrize("empty", ["", "   ", None])
def test_empty_arguments_become_an_empty_object(empty):
    assert arguments_of(normalize_messages([assistant_call(empty)])) == {}


def test_mapping_arguments_are_kept():
    assert arguments_of(normalize_messages([assistant_call({"day": "Fri"})])) == {"day": "Fri"}


@pytest.mark.parametrize("value", [datetime.date(2026, 1, 2), {"at": [decimal.Decimal("1.5")]}])
def test_mapping_arguments_holding_a_non_json_value_are_request_errors(value):
    """Arguments given in Python may hold what no JSON value is; the template rendered it as its `<date>`
    placeholder, a call the model never made. Refused naming the field; tuples, like lists, are JSON arrays."""
    messages = [{"role": "user", "content": "hi"}, assistant_call({"day": value})]
    with pytest.raises(RequestError, match="no JSON value") as caught:
        normalize_messages(messages)
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"
    assert arguments_of(normalize_messages([assistant_call({"days": ("Fri", 1, None, True)})])) == {
        "days": ("Fri", 1, None, True)}


def test_a_tool_call_object_is_refused_saying_how_to_send_it_back():
    """`LLM.chat`'s reply holds ToolCall objects; put back into the history as they are, the error says how to
    send them (it said only "must be an object")."""
    call = ToolCall("c1", "calendar.lookup", '{"day": "Fri"}')
    with pytest.raises(RequestError, match=r"got ToolCall .*dataclasses\.asdict\(call\)") as caught:
        normalize_messages([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}])
    assert caught.value.param == "messages[1].tool_calls[0]"
    bare = {"role": "assistant", "tool_calls": [dataclasses.asdict(call)]}
    assert arguments_of(normalize_messages([bare])) == {"day": "Fri"}


# A template that reads calls as chat templates do (transformers' documented shape, the reference template's):
# `tool_call.function`, never a bare call's own fields.
FUNCTION_READING_TEMPLATE = builtin_template_source().replace(
    "call.function if call.function is defined else call", "call.function")


@pytest.mark.parametrize("arguments", ['{"day": "Fri"}', {"day": "Fri"}])
def test_a_bare_tool_call_gets_openais_shape_which_templates_read(arguments):
    """P-TMPL-6: a call given bare, `{"id", "name", "arguments"}` (`dataclasses.asdict` of the ToolCall that LLM.chat
    returns), renders with a template reading `tool_call.function` as the same call in OpenAI's shape does; it was
    passed on bare, and such a template failed on it ("has no attribute 'function'")."""
    bare = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "calendar.lookup",
                                                                  "arguments": arguments}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "none"}
    normalized = normalize_messages([{"role": "user", "content": "hi"}, bare, result])
    assert normalized[1]["tool_calls"] == [{"id": "c1", "type": "function",
                                            "function": {"name": "calendar.lookup", "arguments": {"day": "Fri"}}}]
    wrapped = normalize_messages([{"role": "user", "content": "hi"}, assistant_call('{"day": "Fri"}'), result])
    kwargs = {"template": FUNCTION_READING_TEMPLATE, "current_date": "2026-01-01"}
    rendered = render_chat(normalized, **kwargs)
    assert rendered == render_chat(wrapped, **kwargs)
    assert ('<|start|>assistant to=calendar.lookup<|message|><atem:function_calls>\n'
            '<atem:invoke name="calendar.lookup">\n<atem:parameter name="day">Fri</atem:parameter>') in rendered


@pytest.mark.parametrize("bad", ['{"day": ', "[1, 2]", '"text"', "3", 7, ["a"], '{"a": NaN}', '{"b": 1e400}',
                                 '{"c": Infinity}'])
def test_invalid_or_non_object_arguments_are_request_errors_naming_index_and_field(bad):
    messages = [{"role": "user", "content": "hi"}, assistant_call(bad)]
    with pytest.raises(RequestError) as caught:
        normalize_messages(messages)
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"
    assert "messages[1].tool_calls[0].function.arguments" in str(caught.value)


@pytest.mark.parametrize("arguments", [{"a": float("nan")}, {"b": [1, float("inf")]}, {"c": {"d": float("-inf")}}])
def test_non_finite_numbers_in_object_arguments_are_refused_as_in_string_arguments(arguments):
    """P-TMPL-6, P-VAL-4: arguments sent as an object (a server body's `NaN`, `Infinity` or `1e400` decode to these; a
    Python dict) were rendered as `nan` / `inf` / `[1, Infinity]`, while the same arguments as a JSON string are
    refused."""
    messages = [{"role": "user", "content": "hi"}, assistant_call(arguments)]
    with pytest.raises(RequestError, match="no JSON value") as caught:
        normalize_messages(messages)
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"


@pytest.mark.parametrize("arguments", ['{"ci\\"ty": "Paris"}', {'"': 1}, {"city": "x", 'say "hi"': True}])
def test_an_argument_name_holding_a_quote_is_refused_naming_the_arguments(arguments):
    """A history argument name is written into `<atem:parameter name="NAME">`, which ends at its first `"` (P-ATEM-1):
    the prompt held a broken tag, which the parser (and the model) reads as no argument."""
    messages = [{"role": "user", "content": "hi"}, assistant_call(arguments)]
    with pytest.raises(RequestError, match="argument name") as caught:
        normalize_messages(messages)
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("parameters", [
    {"type": "object", "properties": {"city": {"type": "string"}, 'say "hi"': {"type": "boolean"}}},
    {"type": "object", "properties": {'say "hi"': {"type": "boolean"}}, "required": ['say "hi"']},
    {"type": "object", "required": ['"']},
])
def test_a_declared_parameter_name_holding_a_quote_is_refused_naming_it(parameters, strict):
    """P-ATEM-1: a call writes each parameter's name into `<atem:parameter name="NAME">`, which ends at its first `"`,
    so no call can pass such a parameter. An optional one was taken (tool_choice auto), and the model's call of it
    came back without it, its value silently lost; a history call naming it is refused already (above)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters, "strict": strict}}
    with pytest.raises(RequestError, match="parameter name") as caught:
        normalize_tools([tool])
    assert caught.value.param.startswith("tools[0].function.parameters.properties.")
    assert '"' in caught.value.param


def test_a_quote_in_a_nested_object_key_is_a_json_value_and_taken():
    """Only a parameter's own name goes into an ATEM tag: keys inside an object value are JSON text."""
    nested = {"type": "object", "properties": {"options": {"type": "object", "properties": {'say "hi"': {}}}}}
    assert normalize_tools([{"type": "function", "function": {"name": "f", "parameters": nested}}])


@pytest.mark.parametrize("name", [1, None, (1, 2)])
def test_an_argument_name_that_is_no_string_is_refused_naming_the_arguments(name):
    """P-TMPL-6: a Python caller's arguments dict keyed by an int or None failed with a bare TypeError ("argument of
    type 'int' is not iterable"), and a tuple key rendered as `<atem:parameter name="(1, 2)">`."""
    messages = [{"role": "user", "content": "hi"}, assistant_call({name: "x"})]
    with pytest.raises(RequestError, match="not a string") as caught:
        normalize_messages(messages)
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"


def test_tool_call_without_a_name_is_a_request_error():
    with pytest.raises(RequestError, match=r"messages\[0\].tool_calls\[0\].function.name"):
        normalize_messages(
            [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}]
        )


@pytest.mark.parametrize("kind", ["custom", "web_search", 7])
def test_a_history_tool_call_of_another_type_than_function_is_refused_naming_its_type(kind):
    """The SDK types a custom tool's call as {"type": "custom", "custom": {"name", "input"}}: it was refused as a call
    without `function.name`, which it does not claim to have, leaving the client to guess."""
    call = {"id": "c1", "type": kind, "custom": {"name": "grep", "input": "x"}}
    with pytest.raises(RequestError) as caught:
        normalize_messages([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [call]}])
    assert caught.value.param == "messages[1].tool_calls[0].type"
    assert "only 'function' tool calls" in str(caught.value)


def test_a_history_tool_call_with_type_function_or_none_is_kept():
    for call in ({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                 {"id": "c1", "type": None, "function": {"name": "f", "arguments": "{}"}},
                 {"id": "c1", "name": "f", "arguments": "{}"}):
        normalized = normalize_messages([{"role": "assistant", "tool_calls": [call]}])
        assert normalized[0]["tool_calls"][0]["function"]["name"] == "f"


@pytest.mark.parametrize("name", ["get weather", "a\nb", "a<b", 'a"b', "x" * 65, "self", "user", 7])
def test_a_history_tool_name_no_header_can_carry_is_refused_naming_it(name):
    """P-REQ-8 holds for the names a history renders too (`to=NAME`, `tool NAME`, `name="NAME"`): `self` rendered
    a call as reasoning, `user` as the answer, whitespace or a quote as an ill-formed header or attribute."""
    USER = {"role": "user", "content": "x"}
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": name, "arguments": "{}"}}]}
    with pytest.raises(RequestError) as caught:
        normalize_messages([USER, call])
    assert caught.value.param == "messages[1].tool_calls[0].function.name"
    answered = {"role": "tool", "tool_call_id": "c1", "name": name, "content": "ok"}
    with pytest.raises(RequestError) as caught:
        normalize_messages([USER, assistant_call("{}"), answered])
    assert caught.value.param == "messages[2].name"



def test_a_tool_result_naming_another_tool_than_its_call_is_refused_naming_it():
    """A result whose `tool_call_id` names a call of `calendar.lookup` but whose `name` is another tool rendered as
    that other tool's output, for a call the model never made to it; the name its call has is taken."""
    USER = {"role": "user", "content": "x"}
    result = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    with pytest.raises(RequestError) as caught:
        normalize_messages([USER, assistant_call("{}"), {**result, "name": "weather.get"}])
    assert caught.value.param == "messages[2].name" and "'calendar.lookup'" in str(caught.value)
    normalized = normalize_messages([USER, assistant_call("{}"), {**result, "name": "calendar.lookup"}])
    assert normalized[2]["name"] == "calendar.lookup"

def test_a_history_tool_name_a_header_can_carry_is_kept():
    call = {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "天气.查询", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c1", "name": "", "content": "ok"}  # "" names no tool: the call's
    normalized = normalize_messages([{"role": "user", "content": "x"}, call, result])
    assert normalized[1]["tool_calls"][0]["function"]["name"] == "天气.查询"


def test_reasoning_fills_a_missing_reasoning_content():
    normalized = normalize_messages(
        [
            {"role": "assistant", "reasoning": "why", "content": "a"},
            {"role": "assistant", "reasoning": "x", "reasoning_content": "kept"},
        ]
    )
    assert normalized[0]["reasoning_content"] == "why"
    assert normalized[1]["reasoning_content"] == "kept"


def test_image_url_and_video_url_parts_become_image_and_video_parts_keeping_the_url():
    content = [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "video_url", "video_url": {"url": "https://example.org/v.mp4"}},
    ]
    normalized = normalize_messages([{"role": "user", "content": content}])
    assert normalized[0]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        {"type": "video", "video_url": {"url": "https://example.org/v.mp4"}},
    ]
    rendered = render_chat(normalized, template=builtin_template_source(), current_date="2026-01-01")
    assert rendered.endswith("<|start|>user<|message|>see<|patch|><|video|><|eot|><|start|>assistant")


def test_normalization_copies_and_never_modifies_the_request():
    messages = [
        assistant_call('{"a": 1}'),
        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
    ]
    original = copy.deepcopy(messages)
    normalize_messages(messages)
    assert messages == original


def test_unrendered_roles_pass_unchanged_with_a_warning_naming_them(caplog):
    """P-TMPL-7: dropped roles are passed unchanged (they render nothing), with a warning."""
    messages = [{"role": "critic", "content": "secret"}, {"role": "user", "content": "hi"}]
    with caplog.at_level(logging.WARNING, logger="glimmer.protocol.request_normalization"):
        normalized = normalize_messages(messages)
    assert normalized == messages
    assert "'critic'" in caplog.text
    # audit: it said "dropped from the prompt", and LLM.chat and the server then refused the request
    assert "dropped" not in caplog.text and "refuse" in caplog.text


def test_the_warning_of_developer_messages_left_as_they_are_says_llm_chat_and_serve_render_them(caplog):
    """developer_as_system=False leaves developer messages to the template, which drops them; the warning said that
    LLM.chat and glimmer serve refuse them, where both render them as the system instruction."""
    with caplog.at_level(logging.WARNING, logger="glimmer.protocol.request_normalization"):
        normalize_messages([{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "x"}],
                           developer_as_system=False)
    assert "'developer'" in caplog.text and "refuse" not in caplog.text
    assert "LLM.chat and glimmer serve render developer messages as the system instruction" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="glimmer.protocol.request_normalization"):
        normalize_messages([{"role": "developer", "content": "Be terse."}, {"role": "critic", "content": "x"}],
                           developer_as_system=False)
    assert "render developer messages as the system instruction and refuse the other roles" in caplog.text


def test_a_refused_unrendered_role_is_named_and_logs_nothing(caplog):
    """A serving API's refusal (refuse_unrendered) is the request's error, not a warning too."""
    messages = [{"role": "user", "content": "hi"}, {"role": "critic", "content": "secret"}]
    with caplog.at_level(logging.DEBUG, logger="glimmer.protocol.request_normalization"), \
            pytest.raises(RequestError, match=r"messages\[1\]\.role: 'critic' is not a role") as caught:
        normalize_messages(messages, refuse_unrendered=True)
    assert caught.value.param == "messages[1].role" and caplog.records == []


def test_a_developer_message_becomes_the_system_message():
    normalized = normalize_messages([{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "x"}])
    assert normalized == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "x"}]
    kept = normalize_messages([{"role": "developer", "content": "x"}], developer_as_system=False)
    assert kept[0]["role"] == "developer"


def test_developer_text_joins_the_first_system_message_in_message_order():
    normalized = normalize_messages([
        {"role": "system", "content": "Rules."}, {"role": "user", "content": "q"},
        {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "system", "content": "Second."}])
    assert normalized == [{"role": "system", "content": "Rules.\n\nBe terse."}, {"role": "user", "content": "q"},
                          {"role": "system", "content": "Second."}]


@pytest.mark.parametrize("part", [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                                  {"type": "file", "file": {"file_id": "f"}}, {"type": "hologram"}, "text"])
def test_content_parts_the_model_cannot_take_are_refused_naming_the_part(part):
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]
    with pytest.raises(RequestError, match=r"messages\[0\]\.content\[1\]") as caught:
        normalize_messages(messages)
    assert caught.value.param == "messages[0].content[1]"


@pytest.mark.parametrize(("content", "param"), [
    ({"type": "text", "text": "an object, not a list"}, "messages[0].content"), (5, "messages[0].content"),
    (True, "messages[0].content"), ([{"type": "text", "text": None}], "messages[0].content[0]"),
    ([{"type": "text"}], "messages[0].content[0]"), ([{"type": "text", "text": 7}], "messages[0].content[0]")])
def test_content_that_would_render_wrong_or_nothing_is_refused(content, param):
    """An object for a list, a number, a text part without string text: refused, never rendered as nothing
    or as the word None."""
    with pytest.raises(RequestError) as caught:
        normalize_messages([{"role": "user", "content": content}])
    assert caught.value.param == param


@pytest.mark.parametrize("bad", ["text", None, [1], [{"content": "no role"}], [{"role": 3}]])
def test_malformed_messages_are_request_errors(bad):
    with pytest.raises(RequestError):
        normalize_messages(bad)


def test_normalized_history_renders_with_the_template():
    messages = normalize_messages(
        [
            {"role": "user", "content": "Friday?"},
            assistant_call('{"day": "Friday", "limit": 3}'),
            {"role": "tool", "tool_call_id": "c1", "content": "one event"},
        ]
    )
    rendered = render_chat(
        messages,
        tools=normalize_tools([{"name": "calendar.lookup"}]),
        template=builtin_template_source(),
        current_date="2026-01-01",
    )
    assert '<atem:parameter name="limit">3</atem:parameter>' in rendered
    assert "<|start|>tool calendar.lookup<|message|>" in rendered



def test_an_assistant_messages_content_beside_its_calls_renders_before_them_not_dropped():
    """The template drops the content of an assistant message with tool_calls (§2.1): an OpenAI-style history turn
    with text before its calls lost the text from the prompt silently. It renders as the model writes such a turn,
    reasoning, then the text to the user without ending the turn, then the calls (as /v1/responses renders a message
    item before function_call items)."""
    call = assistant_call('{"day": "Friday"}')
    turn = {**call, "content": "Let me look.", "reasoning_content": "Check the calendar."}
    history = [{"role": "user", "content": "Friday?"}, turn, {"role": "tool", "tool_call_id": "c1", "content": "one"}]
    kwargs = {"tools": normalize_tools([{"name": "calendar.lookup"}]), "template": builtin_template_source(),
              "current_date": "2026-01-01"}
    rendered = render_chat(normalize_messages(history), **kwargs)
    assert ("<|start|>assistant to=self<|message|>Check the calendar.<|eom|>"
            "<|start|>assistant to=user<|message|>Let me look.<|eom|>"
            "<|start|>assistant to=calendar.lookup<|message|><atem:function_calls>") in rendered
    as_two = [history[0], {"role": "assistant", "content": "Let me look.", "reasoning_content": "Check the calendar.",
                           "end_turn": False}, call, history[2]]
    assert rendered == render_chat(normalize_messages(as_two), **kwargs)
    assert turn["content"] == "Let me look." and "tool_calls" in turn  # the request is not modified


# -- tools -------------------------------------------------------------------------------------------------


def test_tools_are_completed_with_empty_description_and_empty_schema():
    """P-TMPL-6: a missing description becomes "", missing parameters an empty object schema."""
    normalized = normalize_tools(
        [{"type": "function", "function": {"name": "a"}}, {"name": "b", "description": None}]
    )
    assert normalized == [
        {
            "type": "function",
            "function": {"name": "a", "description": "", "parameters": {"type": "object", "properties": {}}},
        },
        {
            "type": "function",
            "function": {"name": "b", "description": "", "parameters": {"type": "object", "properties": {}}},
        },
    ]


def test_wrapped_and_bare_tools_are_accepted_and_extra_fields_kept():
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    normalized = normalize_tools(
        [
            {
                "type": "function",
                "function": {"name": "a", "description": "d", "parameters": schema, "strict": True},
            },
            {"name": "b", "description": "e", "parameters": schema},
        ]
    )
    assert normalized[0]["function"] == {
        "name": "a",
        "description": "d",
        "parameters": schema,
        "strict": True,
    }
    assert normalized[1]["function"] == {"name": "b", "description": "e", "parameters": schema}


def test_no_tools_is_an_empty_list():
    assert normalize_tools(None) == []


@pytest.mark.parametrize(
    "name", ["", "a" * 65, "has space", "tab\tname", "new\nline", "a<b", 'quo"te', None, 3]
)
def test_tool_names_are_validated(name):
    """P-REQ-8: 1..RECIPIENT_MAX characters, no whitespace, `<` or `"`; else 400 naming the field, as param and
    in the message, where the declaration holds it (flat, or under `function`)."""
    with pytest.raises(RequestError) as caught:
        normalize_tools([{"name": name}])
    assert caught.value.param == "tools[0].name" and str(caught.value).startswith("tools[0].name ")
    with pytest.raises(RequestError) as caught:
        normalize_tools([{"type": "function", "function": {"name": "ok"}}, {"function": {"name": name}}])
    assert caught.value.param == "tools[1].function.name"
    assert str(caught.value).startswith("tools[1].function.name ")


@pytest.mark.parametrize("tool", [{"type": "function"}, {}, {"type": "function", "funtion": {"name": "f"}}])
def test_a_tool_declaring_no_function_says_what_a_tool_is(tool):
    """`{"type": "function"}` (its `function` object left out or misspelled) was "tools[0].name must be a non-empty
    string", read as a flat declaration that had lost only its name; a flat one without its name still is that."""
    with pytest.raises(RequestError, match='declares no function: give the function\'s "name"') as error:
        normalize_tools([{"type": "function", "function": {"name": "ok"}}, tool])
    assert error.value.param == "tools[1]"
    with pytest.raises(RequestError, match=r"^tools\[0\]\.name must be a non-empty string"):
        normalize_tools([{"type": "function", "description": "d"}])


def test_tool_names_must_be_unique():
    with pytest.raises(RequestError, match="twice") as caught:
        normalize_tools([{"name": "a"}, {"type": "function", "function": {"name": "a"}}])
    assert caught.value.param == "tools[1].function.name"


def test_the_longest_legal_tool_name_passes():
    assert normalize_tools([{"name": "n." + "x" * 62}])[0]["function"]["name"] == "n." + "x" * 62


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        ({"type": "code_interpreter", "function": {"name": "a"}}, "tools[0].type"),
        ({"type": "function", "function": "a"}, "tools[0].function"),
        ({"name": "a", "parameters": "not a schema"}, "tools[0].parameters"),
        ({"function": {"name": "a", "parameters": []}}, "tools[0].function.parameters"),
        ({"name": "a", "description": 3}, "tools[0].description"),
        ({"function": {"name": "a", "strict": "yes"}}, "tools[0].function.strict"),
        ("a", "tools[0]"),
    ],
)
def test_malformed_tools_are_request_errors_naming_the_field(bad, param):
    with pytest.raises(RequestError) as caught:
        normalize_tools([bad])
    assert caught.value.param == param and str(caught.value).startswith(param + " ")


@pytest.mark.parametrize("parameters", [
    {"type": "string"}, {"type": "array", "items": {"type": "integer"}}, {"enum": ["a", "b"]}, {"const": 3},
    {"type": ["string", "null"]}, {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    {"$ref": "#/$defs/name", "$defs": {"name": {"type": "string"}}},
])
def test_parameters_that_admit_no_object_are_refused_naming_the_field(parameters):
    """A call's arguments are an object: such a tool was taken, and its forced calls came back as `{}`, which its
    schema refuses (OpenAI refuses the tool)."""
    for tool, field in (({"function": {"name": "f", "parameters": parameters}}, "tools[0].function.parameters"),
                        ({"name": "f", "parameters": parameters}, "tools[0].parameters")):
        with pytest.raises(RequestError) as caught:
            normalize_tools([tool])
        assert caught.value.param == field
        assert str(caught.value).startswith(f'{field} must be a JSON schema of type "object"')


@pytest.mark.parametrize("parameters", [
    None, {}, {"type": "object"}, {"type": ["object", "null"]}, {"properties": {"city": {"type": "string"}}},
    {"description": "no arguments"}, {"$ref": "#/$defs/args", "$defs": {"args": {"type": "object"}}},
    {"allOf": [{"type": "object"}, {"properties": {"n": {"type": "integer"}}}]},
])
def test_parameters_that_admit_an_object_or_name_no_type_are_taken(parameters):
    declared = {"name": "f"} if parameters is None else {"name": "f", "parameters": parameters}
    expected = {"type": "object", "properties": {}} if parameters is None else parameters  # P-TMPL-6
    assert normalize_tools([declared])[0]["function"]["parameters"] == expected


def test_each_declared_parameters_schema_goes_to_the_schema_check_with_its_field():
    """The protocol layer has no JSON-schema compiler; the caller's check sees every declared schema, wrapped or
    flat, and its error stands (value typing would read an invalid schema as "any value")."""
    seen = []
    schema = {"type": "object", "properties": {"x": {"type": "nonsense"}}}
    normalize_tools([{"type": "function", "function": {"name": "a", "parameters": schema}}, {"name": "b"},
                     {"name": "c", "parameters": {}, "strict": True}],
                    check_schema=lambda s, field, strict: seen.append((s, field, strict)))
    # a strict tool's check is told so: keywords a non-strict schema may leave unenforced, it may not
    assert seen == [(schema, "tools[0].function.parameters", False), ({}, "tools[2].parameters", True)]

    def refuse(schema, field, strict):
        raise RequestError(f"{field}: refused", param=field)

    with pytest.raises(RequestError) as caught:
        normalize_tools([{"name": "a", "parameters": schema}], check_schema=refuse)
    assert caught.value.param == "tools[0].parameters"


_TWO = {"a": {"type": "integer"}, "b": {"type": "integer"}}


@pytest.mark.parametrize(("parameters", "keyword"), [
    ({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, "anyOf"),
    ({"type": "object", "properties": _TWO, "allOf": [{"$ref": "#/$defs/one"}],
      "$defs": {"one": {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}}}, "oneOf"),
    ({"type": "object", "properties": _TWO, "additionalProperties": False, "minProperties": 1}, "minProperties 1"),
    ({"type": "object", "properties": _TWO, "additionalProperties": False, "maxProperties": 1}, "maxProperties 1"),
])
def test_a_strict_tools_root_keyword_its_calls_cannot_hold_is_refused_naming_it(parameters, keyword):
    """A call writes each declared property as an ATEM parameter of its own, so the turn grammar held a strict tool's
    call to none of these: a call without parameters was taken under an `anyOf` whose members each require one, and
    one with both under `maxProperties: 1`. A non-strict tool keeps them as hints."""
    with pytest.raises(RequestError) as caught:
        normalize_tools([{"name": "f", "strict": True, "parameters": parameters}])
    assert caught.value.param == "tools[0].parameters" and keyword in str(caught.value)
    normalize_tools([{"name": "f", "parameters": parameters}])


def test_a_strict_tools_root_property_counts_its_calls_hold_are_taken():
    held = {"type": "object", "properties": _TWO, "required": ["a"], "additionalProperties": False,
            "minProperties": 1, "maxProperties": 2}
    assert normalize_tools([{"name": "f", "strict": True, "parameters": held}])[0]["function"]["parameters"] == held

@pytest.mark.parametrize("kind", ["code_interpreter", "retrieval", "web_search"])
def test_a_tool_of_another_type_is_named_as_unsupported(kind):
    """Not "function.name must be a non-empty string": the type is what is wrong."""
    with pytest.raises(RequestError, match=f"tools\\[0\\].type '{kind}' is not supported"):
        normalize_tools([{"type": kind}])


def test_a_tool_message_that_names_no_tool_is_refused():
    """Neither tool_call_id nor name: the template would render `<tool_output name="">` (OpenAI refuses it too)."""
    with pytest.raises(RequestError) as caught:
        normalize_messages([{"role": "user", "content": "q"}, {"role": "tool", "content": "sunny"}])
    assert caught.value.param == "messages[1].tool_call_id"
    assert normalize_messages([{"role": "tool", "name": "get_weather", "content": "sunny"}])[0]["name"] == "get_weather"


USER = {"role": "user", "content": "Friday?"}


@pytest.mark.parametrize(("messages", "index"), [
    ([USER, assistant_call("{}"), {"role": "tool", "tool_call_id": "zzz", "content": "x"}], 2),
    ([USER, {"role": "tool", "tool_call_id": "c1", "content": "x"}], 1),
    ([USER, {"role": "tool", "tool_call_id": "c1", "content": "x"}, assistant_call("{}")], 1),  # call after it
    ([USER, assistant_call("{}"), {"role": "tool", "tool_call_id": 5, "content": "x"}], 2),
    ([USER, assistant_call("{}"), {"role": "tool", "tool_call_id": ["c1"], "name": "f", "content": "x"}], 2),
    ([USER, {"role": "user", "content": "q", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "x"}], 2),  # only an assistant's calls are rendered
])
def test_a_tool_message_answering_no_earlier_call_is_refused(messages, index):
    """§2.1: without `name`, the template names the result after the call whose id is `tool_call_id`, else after
    the raw id: a result of a call the model never made, under a made-up tool name."""
    with pytest.raises(RequestError) as caught:
        normalize_messages(messages)
    assert caught.value.param == f"messages[{index}].tool_call_id"
    assert str(caught.value).startswith(f"messages[{index}].tool_call_id")


def test_a_tool_message_with_a_name_or_a_matching_id_renders_that_name():
    """§2.1: NAME = the message's `name`, else the function name of the earlier call with that id (last wins)."""
    answered = normalize_messages([USER, assistant_call("{}"), {"role": "tool", "tool_call_id": "c1", "content": "x"}])
    named = normalize_messages([USER, {"role": "tool", "tool_call_id": "elsewhere", "name": "calendar.lookup",
                                       "content": "x"}])
    for messages in (answered, named):
        rendered = render_chat(messages, template=builtin_template_source(), current_date="2026-01-01")
        assert "<|start|>tool calendar.lookup<|message|>" in rendered


def _call_and_result(call_id, function):
    call = {"id": call_id, "type": "function", "function": {"name": function, "arguments": "{}"}}
    return [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "tool_call_id": call_id, "content": "r"}]


def test_a_tool_message_is_named_after_its_call_as_the_template_would_name_it():
    """§2.1: a result without `name` gets the function of the last earlier call with its id (an id may come back in a
    later turn), so the template need not search the history for it; the prompt is the one the ids render."""
    messages = [USER, *_call_and_result("search:0", "calendar.lookup"), *_call_and_result("search:0", "weather.now")]
    normalized = normalize_messages(messages)
    assert [message.get("name") for message in normalized if message["role"] == "tool"] == ["calendar.lookup",
                                                                                          "weather.now"]
    unnamed = [{key: value for key, value in message.items() if key != "name"} for message in normalized]
    assert render_chat(normalized, template=builtin_template_source(), current_date="2026-01-01") == render_chat(
        unnamed, template=builtin_template_source(), current_date="2026-01-01")


def test_many_tool_results_named_by_name_are_matched_to_their_calls_in_linear_time():
    """Each result named by its tool alone searched the turn's calls not yet answered for the first of its name: 8,000
    results sent in the reverse order of their calls took half a minute of a server thread."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": f"f{i}", "arguments": "{}"}} for i in range(8000)]
    results = [{"role": "tool", "name": f"f{i}", "content": "r"} for i in reversed(range(8000))]
    started = time.process_time()  # CPU time: other processes on a busy machine do not count
    refuse_unmatched_tool_messages([USER, {"role": "assistant", "tool_calls": calls}, *results])
    assert time.process_time() - started < 5  # a tenth of a second; half a minute when each result searched
    with pytest.raises(RequestError) as caught:  # the first call left unanswered is named, as before
        refuse_unmatched_tool_messages([USER, {"role": "assistant", "tool_calls": calls}, *results[:-2], results[-1]])
    assert caught.value.param == "messages[1].tool_calls[1]"


def test_many_tool_results_render_in_time_linear_in_their_number():
    """The template searched every earlier call for each unnamed result: 1,500 results (a 200 kB request) held a
    server thread for half a minute, a 4 MB body's worth for hours, and a client that left could not stop it."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(1500)]
    results = [{"role": "tool", "tool_call_id": f"c{i}", "content": "r"} for i in range(1500)]
    started = time.process_time()  # CPU time: other processes on a busy machine do not count
    render_chat(normalize_messages([USER, {"role": "assistant", "tool_calls": calls}, *results]),
                template=builtin_template_source(), current_date="2026-01-01")
    assert time.process_time() - started < 10  # about 0.4 s; 30 s when the template searched


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
@pytest.mark.parametrize("absent", [{}, {"content": None}, {"content": []}])
def test_a_message_without_content_is_refused_unless_it_is_the_assistant_s(role, absent):
    """The template renders a missing user content as an empty turn, and the model makes a question up; an empty
    list of parts renders the same empty turn (OpenAI refuses it: "empty array")."""
    message = {"role": role, **absent, **({"name": "f"} if role == "tool" else {})}
    with pytest.raises(RequestError) as caught:
        normalize_messages([USER, message])
    assert caught.value.param == "messages[1].content"


@pytest.mark.parametrize("assistant", [assistant_call("{}"), {"role": "assistant", "reasoning_content": "r"},
                                       {"role": "assistant", "content": None}])
def test_an_assistant_message_may_leave_content_null(assistant):
    """Beside tool calls or reasoning, or as a reply came back with no content (P-API-1: content null when empty)."""
    assert normalize_messages([USER, assistant])[1]["role"] == "assistant"


@pytest.mark.parametrize("role", ["system", "developer"])
def test_instructions_take_text_only(role):
    """A system message with an image used to be rendered with it while a developer one was refused."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(RequestError, match="take text only") as caught:
        normalize_messages([{"role": role, "content": [{"type": "text", "text": "Rules."}, image]},
                            {"role": "user", "content": "q"}])
    assert caught.value.param == "messages[0].content"


@pytest.mark.parametrize("name", ["self", "user"])
def test_tools_named_like_the_reasoning_or_answer_recipient_are_refused(name):
    """`to=self` and `to=user` open the reasoning and the answer: such a tool could never be called (P-REQ-8)."""
    with pytest.raises(RequestError, match="recipient") as caught:
        normalize_tools([{"type": "function", "function": {"name": name}}])
    assert caught.value.param == "tools[0].function.name"


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning", "thinking"])
def test_reasoning_that_is_not_text_is_refused(key):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", key: {"a": 1}}]
    with pytest.raises(RequestError, match="must be a string"):
        normalize_messages(messages)


# -- tool results in their calls' order --------------------------------------------------------------------


def weather_calls(*cities):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{city}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
        for city in cities]}


def result(call_id, content, **fields):
    return {"role": "tool", "tool_call_id": call_id, "content": content, **fields}


def rendered_results(messages):
    """The tool results' texts in the order the prompt shows them."""
    prompt = render_chat(normalize_messages(messages), template=builtin_template_source(), current_date="2026-01-01")
    return [body.split("\n", 1)[1].split("\n</tool_output>", 1)[0] for body in prompt.split("<tool_output ")[1:]]


def test_tool_results_render_in_the_order_of_their_calls_whatever_order_they_came_in():
    """§2.1: a result renders as `tool NAME`, with no call id, so the model matches it to a call by position; results
    sent in another order (OpenAI matches them by tool_call_id) were read as each other's: Paris got Oslo's snow."""
    messages = [USER, weather_calls("Paris", "Oslo"), result("cOslo", "snow, -3"), result("cParis", "rain, 18")]
    assert rendered_results(messages) == ["rain, 18", "snow, -3"]
    assert [m.get("tool_call_id") for m in normalize_messages(messages)] == [None, None, "cParis", "cOslo"]


def test_results_follow_the_calls_of_the_whole_turn_and_only_their_own_turn():
    """Consecutive assistant messages are one turn; a later turn's results are ordered by that turn's calls."""
    messages = [USER, weather_calls("Paris"), weather_calls("Oslo"), result("cOslo", "snow"), result("cParis", "rain"),
                {"role": "assistant", "content": "Next?"}, USER, weather_calls("Rome", "Bern"), result("cBern", "fog"),
                result("cRome", "sun")]
    assert rendered_results(messages) == ["rain", "snow", "sun", "fog"]


@pytest.mark.parametrize("results", [
    [result("cOslo", "snow"), result("elsewhere", "rain", name="get_weather")],  # an id of no call of the turn
    [result("cOslo", "snow"), {"role": "tool", "name": "get_weather", "content": "rain"}],  # answered by name alone
])
def test_results_that_do_not_all_answer_a_call_of_the_turn_by_id_keep_their_order(results):
    """Nothing says which call a result named only by its tool answers: the run renders as sent."""
    assert rendered_results([USER, weather_calls("Paris", "Oslo"), *results]) == ["snow", "rain"]


def test_a_result_answering_an_earlier_turn_keeps_its_place():
    messages = [USER, weather_calls("Paris"), USER, weather_calls("Oslo"), result("cOslo", "snow"),
                result("cParis", "rain")]
    assert rendered_results(messages) == ["snow", "rain"]


# -- each call answered once -------------------------------------------------------------------------------


def test_a_second_result_for_one_call_is_refused_naming_both_messages():
    """Two answers to one call, both rendered; OpenAI refuses them ("Duplicate value for 'tool_call_id'")."""
    messages = [USER, weather_calls("Paris", "Oslo"), result("cParis", "rain"), result("cOslo", "snow"),
                result("cParis", "sun")]
    with pytest.raises(RequestError, match=r"^messages\[4\]\.tool_call_id: duplicate tool_call_id 'cParis': "
                                           r"messages\[2\] answers the same tool call") as caught:
        normalize_messages(messages)
    assert caught.value.param == "messages[4].tool_call_id"


def test_two_calls_of_one_turn_with_one_id_are_refused_naming_both():
    """No result could say which of them it answers."""
    (call,) = weather_calls("Paris")["tool_calls"]
    for messages, field, other in (
            ([USER, {"role": "assistant", "tool_calls": [call, call]}], "messages[1].tool_calls[1].id",
             "messages[1].tool_calls[0].id"),
            ([USER, weather_calls("Paris"), weather_calls("Paris")], "messages[2].tool_calls[0].id",
             "messages[1].tool_calls[0].id")):
        with pytest.raises(RequestError, match=rf"duplicate tool call id 'cParis' \(also {re.escape(other)}\)") as err:
            normalize_messages(messages)
        assert err.value.param == field


def test_an_id_a_later_turn_makes_again_is_a_new_call_answered_again():
    """Some servers number calls per turn (`search:0` in every turn): each turn's call has its own result."""
    turn = [weather_calls("Paris"), result("cParis", "rain")]
    assert rendered_results([USER, *turn, USER, *turn]) == ["rain", "rain"]


@pytest.mark.parametrize(("arguments", "key"), [('{"city": "Paris", "city": "Oslo"}', "city"),
                                                ('{"options": {"unit": "C", "unit": "F"}}', "options.unit")])
def test_arguments_giving_a_key_twice_are_refused_naming_the_field_and_the_key(arguments, key):
    """P-TMPL-6: the last value was rendered (the model read a call to Oslo), while another reader of the same
    history reads the first; as the request body's own repeated keys, it is refused."""
    with pytest.raises(RequestError) as caught:
        normalize_messages([USER, assistant_call(arguments)])
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"
    assert str(caught.value).startswith(f"messages[1].tool_calls[0].function.arguments: the key {key!r} is given "
                                        "more than once in the same JSON object")


@pytest.mark.parametrize("recipient", ["get weather", "a<b", "x" * 200, 5, ["user"]],
                         ids=["whitespace", "angle-bracket", "too-long", "int", "list"])
def test_an_assistant_recipient_no_header_can_name_is_a_request_error(recipient):
    """P-HDR-2: `to=RECIPIENT` is written into the message's header; `to=get weather` renders a header the model reads
    as ill-formed (and a continued message's reply was parsed for a channel the prompt did not open)."""
    messages = [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"},
                {"role": "assistant", "content": "Hi", "recipient": recipient}]
    with pytest.raises(RequestError, match=r"^messages\[2\]\.recipient") as raised:
        normalize_messages(messages)
    assert raised.value.param == "messages[2].recipient"


@pytest.mark.parametrize("recipient", [None, "", "user", "self", "calendar.lookup", "x" * 64])
def test_an_assistant_recipient_a_header_can_name_is_kept(recipient):
    messages = [{"role": "assistant", "content": "Hi", "recipient": recipient}]
    assert normalize_messages(messages)[0].get("recipient") == recipient
