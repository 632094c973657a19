"""POST /v1/responses through the real server and the official `openai` SDK's `responses.create`.

The network is scripted (`ScriptedRunner`): the model's turn is known, everything after it is real.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pydantic
import pytest
from openai.pagination import SyncCursorPage
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from server_support import PINNED_DATE, agent_server, fewest_forced_call_tokens

from glimmer.errors import RequestError
from glimmer.server import responses_schemas
from glimmer.server.response_store import ResponseStore
from glimmer.server.responses import OutputBuilder
from glimmer.server.responses_input import (
    MessageSource,
    chat_messages,
    images_read,
    responses_error,
    sealed_reasoning,
)

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                "strict": True}
EXTRA = {"chat_template_kwargs": PINNED_DATE}


@pytest.fixture(scope="module")
def server(make_tiny):
    with agent_server(make_tiny()) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def _create(client, **fields):
    return client.responses.create(model="tiny", temperature=0, extra_body=EXTRA, **fields)


def test_a_response_holds_a_reasoning_item_then_the_message_with_usage(client):
    response = _create(client, input="[greet] Hello!", instructions="Be warm.")
    assert response.object == "response" and response.id.startswith("resp_") and response.status == "completed"
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "The user greets me."
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == "Hello there!"
    usage = response.usage
    assert usage.output_tokens_details.reasoning_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert response.instructions == "Be warm."


def test_the_stream_sends_the_documented_events_and_ends_as_the_whole_response(client):
    whole = _create(client, input="[greet] Hello!")
    events = list(_create(client, input="[greet] Hello!", stream=True))
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    collapsed = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]  # runs of deltas as one
    assert collapsed == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert (reasoning, text) == ("The user greets me.", "Hello there!")
    final = events[-1].response
    assert [(item.type, item.model_dump(exclude={"id"})) for item in final.output] == [
        (item.type, item.model_dump(exclude={"id"})) for item in whole.output]
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [item.id for item in final.output]


@pytest.mark.parametrize("reasoning", [{"summary": "auto"}, {"summary": "detailed"}, {"generate_summary": "auto"}])
def test_a_reasoning_summary_asked_for_is_the_reasoning_text_and_is_echoed(client, reasoning):
    """`reasoning.summary` was accepted, echoed as null, and the reasoning item's summary left empty."""
    response = _create(client, input="[greet] Hello!", reasoning=reasoning)
    item = response.output[0]
    assert [part.model_dump() for part in item.summary] == [{"type": "summary_text", "text": "The user greets me."}]
    assert item.content[0].text == "The user greets me."  # still there: it is what round-trips through input
    assert response.reasoning.summary == next(iter(reasoning.values()))
    unasked = _create(client, input="[greet] Hello!")
    assert unasked.output[0].summary == [] and unasked.reasoning.summary is None


def test_a_streamed_reasoning_summary_has_its_events_and_ends_as_the_whole_response(client):
    whole = _create(client, input="[greet] Hello!", reasoning={"summary": "auto"})
    events = list(_create(client, input="[greet] Hello!", reasoning={"summary": "auto"}, stream=True))
    types = [event.type for event in events]
    collapsed = [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]
    reasoning_events = collapsed[collapsed.index("response.output_item.added"):collapsed.index(
        "response.output_item.done") + 1]
    assert reasoning_events == [
        "response.output_item.added", "response.content_part.added", "response.reasoning_summary_part.added",
        *["response.reasoning_text.delta", "response.reasoning_summary_text.delta"] * (
            types.count("response.reasoning_text.delta")),
        "response.reasoning_text.done", "response.content_part.done", "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done"]
    summary = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    done = next(e for e in events if e.type == "response.reasoning_summary_part.done")
    assert summary == done.part.text == "The user greets me."
    final = events[-1].response
    assert [item.model_dump(exclude={"id"}) for item in final.output] == [
        item.model_dump(exclude={"id"}) for item in whole.output]


@pytest.mark.parametrize("reasoning", [{"context": "all_turns"}, {"context": "auto", "mode": "standard"}])
def test_the_reasoning_context_and_mode_glimmer_runs_are_taken_and_reported(client, reasoning):
    """`reasoning.context` and `reasoning.mode` (the SDK's Reasoning) were 400s as unknown fields; the response
    reports the effective ones, as OpenAI's does: earlier reasoning is rendered back, in the standard mode."""
    plain = _create(client, input="[greet] Hello!")
    response = _create(client, input="[greet] Hello!", reasoning=reasoning)
    assert response.output_text == plain.output_text and response.usage.input_tokens == plain.usage.input_tokens
    for echoed in (response, plain):
        assert (echoed.reasoning.context, echoed.reasoning.mode) == ("all_turns", "standard")


@pytest.mark.parametrize(("fields", "effort"), [
    ({}, "high"),  # the template's default (P-EFF-1)
    ({"reasoning": {"effort": "minimal"}}, "minimal"),  # as sent, though it renders as low (P-EFF-2)
    ({"reasoning": {"effort": "Medium"}}, "medium"),
    ({"extra_body": {"reasoning_strength": "low", **EXTRA}}, "low"),
    ({"extra_body": {"chat_template_kwargs": {**PINNED_DATE, "enable_thinking": False}}}, "low"),
])
def test_the_reasoning_effort_echoed_is_the_one_reasoned_with_never_null(client, fields, effort):
    """`reasoning.effort` was echoed as sent, null when none was: OpenAI echoes a reasoning model's effort, its
    default too. It is the one sent, else the strength the prompt was rendered with (Glimmer's reasoning_strength,
    enable_thinking false, the server's default), else the template's, high."""
    body = {"model": "tiny", "temperature": 0, "input": "[greet] Hi", "extra_body": EXTRA, **fields}
    response = client.responses.create(**body)
    created = next(iter(client.responses.create(**body, stream=True)))
    for echoed in (response, client.responses.retrieve(response.id), created.response):
        assert echoed.reasoning.effort == effort


def test_a_refusal_part_is_an_assistant_message_s_text_and_refused_elsewhere(server, client):
    """A `refusal` part (OpenAI's output part for the model's refusal) was taken as text anywhere: in a user message
    its text was read as the user's. It is what the assistant said in an assistant message item, rendered as that
    text; in another item it is a 400 naming the part."""
    def counted(content):
        items = [{"role": "user", "content": "Help?"}, {"role": "assistant", "content": content},
                 {"role": "user", "content": "[greet] Please"}]
        return client.responses.input_tokens.count(model="tiny", input=items).input_tokens
    said = "I can't help with that."
    assert counted([{"type": "refusal", "refusal": said}]) == counted([{"type": "output_text", "text": said}])
    assert counted([{"type": "refusal", "refusal": said}]) != counted([{"type": "output_text", "text": "No."}])
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    for items, param in (
            ([{"role": "user", "content": [{"type": "refusal", "refusal": said}]}], "input[0].content[0]"),
            ([{"role": "developer", "content": [{"type": "input_text", "text": "Hi"},
                                                {"type": "refusal", "refusal": said}]}], "input[0].content[1]"),
            ([call, {"type": "function_call_output", "call_id": "c1", "output": [{"type": "refusal",
                                                                                   "refusal": said}]}],
             "input[1].output[0]"),
            ([{"role": "assistant", "content": [{"type": "refusal", "text": said}]}], "input[0].content[0].refusal")):
        response = httpx.post(server.base_url + "/responses", timeout=30,
                              json={"model": "tiny", "input": items, "tools": [WEATHER_TOOL]})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param, response.text


def test_a_reasoning_item_with_its_summary_sent_back_renders_as_without(client):
    first = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL], reasoning={"summary": "auto"})
    call = next(item for item in first.output if item.type == "function_call")
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny [sunny-result]"}
    items = [item.model_dump(exclude_none=True) for item in first.output]
    with_summary = _create(client, input=[{"role": "user", "content": "[weather] Weather in Paris?"}, *items, result],
                           tools=[WEATHER_TOOL])
    for item in items:
        item.pop("summary", None)
    without = _create(client, input=[{"role": "user", "content": "[weather] Weather in Paris?"}, *items, result],
                      tools=[WEATHER_TOOL])
    assert with_summary.usage.input_tokens == without.usage.input_tokens


def test_included_encrypted_reasoning_replayed_alone_renders_as_the_reasoning(server, client):
    """`include: ["reasoning.encrypted_content"]` was accepted and nothing included: LangChain with `store=False`
    replays only reasoning items carrying it, so it dropped the reasoning of a turn before its tool call. The item now
    carries it (streamed too), and an item carrying only it renders as the item carrying the text."""
    asked = {"input": "[weather] Weather in Paris?", "tools": [WEATHER_TOOL], "store": False,
             "include": ["reasoning.encrypted_content"]}
    first = _create(client, **asked)
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content
    assert _create(client, input="[greet] Hello!").output[0].encrypted_content is None  # not asked, not included
    streamed = [e.item for e in _create(client, **asked, stream=True)
                if e.type == "response.output_item.done" and e.item.type == "reasoning"]
    assert [item.encrypted_content for item in streamed] == [reasoning.encrypted_content]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny [sunny-result]"}
    question = {"role": "user", "content": "[weather] Weather in Paris?"}
    whole = _create(client, input=[question, reasoning.model_dump(exclude_none=True), call.model_dump(), result],
                    tools=[WEATHER_TOOL])
    sealed = {"type": "reasoning", "id": reasoning.id, "summary": [], "encrypted_content": reasoning.encrypted_content}
    replayed = _create(client, input=[question, sealed, call.model_dump(), result], tools=[WEATHER_TOOL])
    assert replayed.output_text == whole.output_text == "It is sunny in Paris."
    assert replayed.usage.input_tokens == whole.usage.input_tokens
    without = _create(client, input=[question, call.model_dump(), result], tools=[WEATHER_TOOL])
    assert without.usage.input_tokens < whole.usage.input_tokens  # the reasoning is what the sealed item adds
    foreign = httpx.post(server.base_url + "/responses", timeout=30, json={
        "model": "tiny", "input": [question, {**sealed, "encrypted_content": "gAAAAABo-openai"}, call.model_dump(),
                                   result]})
    assert foreign.status_code == 400, foreign.text
    assert foreign.json()["error"]["param"] == "input[1].encrypted_content"


def _replayed(encrypted_content: str) -> list[dict]:
    """The chat messages of a user's "hi" and a reasoning item replayed sealed as `encrypted_content`."""
    item = {"type": "reasoning", "summary": [], "encrypted_content": encrypted_content}
    return chat_messages([{"role": "user", "content": "hi"}, item], None)


SUNNY_REASONING = {"role": "assistant", "recipient": "self", "content": "The tool says sunny."}


@pytest.mark.parametrize("corrupt", [lambda sealed: sealed.replace("b2wg", "!!!!"), lambda sealed: sealed + "@@",
                                     lambda sealed: "glimmer-reasoning-v1:@@@"])
def test_a_corrupted_encrypted_reasoning_is_refused_naming_it_not_read_as_other_text(corrupt):
    """Characters outside base64's alphabet were skipped: an `encrypted_content` a client's storage had mangled
    rendered as other reasoning ("The tosays sunny." for "The tool says sunny."), or as none, in the prompt."""
    sealed = sealed_reasoning("The tool says sunny.")
    assert "b2wg" in sealed  # "ol ", whose characters the first corruption replaces
    with pytest.raises(RequestError) as refused:
        _replayed(corrupt(sealed))
    assert refused.value.param == "input[1].encrypted_content"
    assert _replayed(sealed)[1] == SUNNY_REASONING


def _one_character_changed(sealed: str) -> str:
    last = sealed[-5]  # inside the text's characters, its padding after it
    return sealed[:-5] + ("A" if last != "A" else "B") + sealed[-4:]


@pytest.mark.parametrize("alter", [lambda sealed: sealed[:-4], _one_character_changed])
def test_an_encrypted_reasoning_altered_inside_base64s_alphabet_is_refused(alter):
    """A cut or a changed character kept to the alphabet decoded to other text ('The tool says sunn', or garbage)
    and rendered as the model's reasoning: the sealed text carries a digest of itself now, and a mismatch is the
    400 naming the field."""
    sealed = sealed_reasoning("The tool says sunny.")
    with pytest.raises(RequestError) as refused:
        _replayed(alter(sealed))
    assert refused.value.param == "input[1].encrypted_content"


@pytest.mark.parametrize("wrap", [lambda sealed: sealed + "\n", lambda sealed: f"\n {sealed}\r\n",
                                  lambda sealed: sealed[:30] + "\n" + sealed[30:],
                                  lambda sealed: "glimmer-reasoning-v1:VGhlIHRvb2wgc2F5cyBzdW5ueS4=\n"])
def test_an_encrypted_reasoning_wrapped_in_whitespace_reads_as_sealed(wrap):
    """validate=True refused a sealed value a client's storage had wrapped in newlines or ended with one, which read
    right before: ASCII whitespace is not part of it. The earlier form (no digest) reads too."""
    sealed = sealed_reasoning("The tool says sunny.")
    assert _replayed(wrap(sealed))[1] == SUNNY_REASONING


def test_retrieving_with_encrypted_reasoning_included_seals_the_reasoning_items_as_create_does(client):
    """`include: ["reasoning.encrypted_content"]` on `responses.retrieve` and `responses.input_items.list` was checked
    and ignored: a response made without it came back with no `encrypted_content`, which a client that replays only
    that needs. Its reasoning items now carry it, as create's would have; without the include they are as stored."""
    included = ["reasoning.encrypted_content"]
    sealed_at_create = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL], include=included)
    first = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL])
    reasoning, call = first.output
    assert reasoning.encrypted_content is None
    retrieved = client.responses.retrieve(first.id, include=included)
    assert retrieved.output[0].encrypted_content == sealed_at_create.output[0].encrypted_content
    assert retrieved.output[1] == call and client.responses.retrieve(first.id).output == first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny [sunny-result]"}
    second = _create(client, input=[result], previous_response_id=first.id, tools=[WEATHER_TOOL])
    listed = client.responses.input_items.list(second.id, order="asc", include=included).data
    assert [item.type for item in listed] == ["message", "reasoning", "function_call", "function_call_output"]
    assert listed[1].encrypted_content == retrieved.output[0].encrypted_content
    assert client.responses.input_items.list(second.id, order="asc").data[1].encrypted_content is None


def test_an_item_reference_is_the_stored_output_item_it_names(server, client):
    """The Vercel AI SDK (with its default `store: true`) sends each item of the earlier turns it holds an id for as
    `{"type": "item_reference", "id": ...}`, as OpenAI reads them from the responses it stored; they were a 400 ("input
    items of type 'item_reference' are not supported"), so its second turn failed. A reference is the stored output
    item it names: the prompt is the one with the items sent whole."""
    question = {"role": "user", "content": "[weather] Weather in Paris?"}
    first = _create(client, input=[question], tools=[WEATHER_TOOL])
    reasoning, call = first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny [sunny-result]"}
    whole = _create(client, input=[question, reasoning.model_dump(exclude_none=True), call.model_dump(), result],
                    tools=[WEATHER_TOOL])
    prompt = server.engine.engine.runner.prompts[-1]
    references = [{"type": "item_reference", "id": reasoning.id}, {"id": call.id}]  # the SDK's `type` is optional
    referenced = _create(client, input=[question, *references, result], tools=[WEATHER_TOOL])
    assert server.engine.engine.runner.prompts[-1] == prompt
    assert referenced.output_text == whole.output_text == "It is sunny in Paris."
    listed = client.responses.input_items.list(referenced.id, order="asc").data
    assert [(item.type, item.id) for item in listed[1:3]] == [("reasoning", reasoning.id), ("function_call", call.id)]
    answer = referenced.output[-1]
    then = _create(client, input=[question, *references, result, {"type": "item_reference", "id": answer.id},
                                  {"role": "user", "content": "[greet] Thanks!"}], tools=[WEATHER_TOOL])
    assert then.status == "completed"
    answered = "It is sunny in Paris.<|eot|><|start|>user<|message|>[greet] Thanks!"
    assert answered in server.engine.engine.runner.prompts[-1]


@pytest.mark.parametrize(("reference", "param"), [
    ({"type": "item_reference", "id": "msg_never_made"}, "input[1].id"),
    ({"type": "item_reference"}, "input[1].id"),
    ({"type": "item_reference", "id": 5}, "input[1].id"),
    ({"type": "item_reference", "id": "msg_x", "text": "hi"}, "input[1].text"),
])
def test_an_item_reference_naming_no_stored_output_item_is_refused_naming_it(server, reference, param):
    body = {"model": "tiny", "input": [{"role": "user", "content": "Hi"}, reference]}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_an_item_reference_to_a_response_not_stored_is_refused(client):
    unstored = _create(client, input="[greet] Hi", store=False)
    with pytest.raises(openai.BadRequestError) as refused:
        _create(client, input=[{"role": "user", "content": "[greet] Hi"},
                               {"type": "item_reference", "id": unstored.output[-1].id}])
    assert refused.value.body["param"] == "input[1].id" and "store: false" in refused.value.body["message"]


def test_a_reasoning_item_sent_back_without_its_text_renders_the_stored_text_of_its_id(client):
    """LangChain's stream builds a reasoning item from `response.output_item.added` (empty `content` and `summary`,
    `status: in_progress`; it reads no reasoning_text deltas) and sends it back so: its reasoning was left out of the
    next prompt. As OpenAI reads a stored item by its id, the stored text renders."""
    events = list(_create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL], stream=True))
    added = next(e.item for e in events if e.type == "response.output_item.added" and e.item.type == "reasoning")
    first = events[-1].response
    call = next(item for item in first.output if item.type == "function_call")
    question = {"role": "user", "content": "[weather] Weather in Paris?", "type": "message"}
    sent_call = {"type": "function_call", "name": call.name, "arguments": call.arguments, "call_id": call.call_id,
                 "id": call.id}
    result = {"type": "function_call_output", "output": "Sunny [sunny-result]", "call_id": call.call_id}
    as_langchain_sends = {"id": added.id, "summary": [], "type": "reasoning", "content": [], "status": "in_progress"}
    assert added.model_dump(exclude_none=True) == as_langchain_sends
    replayed = _create(client, input=[question, as_langchain_sends, sent_call, result], tools=[WEATHER_TOOL])
    whole = _create(client, input=[question, first.output[0].model_dump(exclude_none=True), sent_call, result],
                    tools=[WEATHER_TOOL])
    assert replayed.usage.input_tokens == whole.usage.input_tokens
    assert replayed.output_text == "It is sunny in Paris."


@pytest.mark.parametrize("store", [True, False])
def test_a_reasoning_item_sent_back_without_its_text_and_not_stored_is_400_naming_it(server, client, store):
    """A reasoning item sent back with no text renders the stored text of its id; one whose id no stored response
    holds (created with store: false, expired, evicted, deleted, or the server restarted) rendered as no reasoning at
    all, silently: the model lost what it had thought. It is refused naming the item, as OpenAI refuses an item id it
    does not find."""
    first = _create(client, input="[greet] Hello!", store=store)
    reasoning = first.output[0]
    assert reasoning.type == "reasoning"
    as_langchain_sends = {"id": reasoning.id, "summary": [], "type": "reasoning", "content": [],
                          "status": "in_progress"}
    body = {"model": "tiny", "input": [{"role": "user", "content": "[greet] Hello!"}, as_langchain_sends,
                                       {"role": "assistant", "content": first.output_text},
                                       {"role": "user", "content": "[greet] Again!"}], **EXTRA}
    response = httpx.post(server.base_url + "/responses", json=body)
    if store:
        assert response.status_code == 200
        return
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input[1]" and reasoning.id in error["message"] and "content" in error["message"]


def test_a_function_tool_round_trip_with_input_items_and_with_previous_response_id(client):
    first = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL])
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny [sunny-result]"}
    history = [{"role": "user", "content": "[weather] Weather in Paris?"},
               *[item.model_dump(exclude_none=True) for item in first.output], result]
    second = _create(client, input=history, tools=[WEATHER_TOOL])
    assert second.output_text == "It is sunny in Paris."
    chained = _create(client, input=[result], previous_response_id=first.id, tools=[WEATHER_TOOL])
    assert chained.output_text == "It is sunny in Paris." and chained.previous_response_id == first.id
    assert chained.usage.input_tokens == second.usage.input_tokens  # the same conversation was rendered


def _weather_call(city: str, end: str) -> str:
    return (f' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter '
            f'name="city">{city}</atem:parameter>\n</atem:invoke>\n</atem:function_calls>{end}')


TWO_CITIES = _weather_call("Paris", "<|eom|><|start|>assistant") + _weather_call("Oslo", "<|eot|>")
RESULTS_IN_CALL_ORDER = ('rain, 18\n</tool_output><|eot|><|start|>tool get_weather<|message|>'
                         '<tool_output name="get_weather">\nsnow, -3')


def test_outputs_sent_in_another_order_answer_their_own_calls(server, client):
    """The prompt pairs a result with its call by position (§2.1: no call id), OpenAI by call_id: outputs sent in
    another order than the calls were each read as the other call's, and the model answered "Paris -3, snow"."""
    runner = server.engine.engine.runner
    runner.add(RESULTS_IN_CALL_ORDER, " to=user<|message|>Paris 18, rain; Oslo -3, snow.<|eot|>")
    runner.add("[two-cities]", TWO_CITIES)
    first = _create(client, input="[two-cities] Weather in Paris and Oslo?", tools=[WEATHER_TOOL])
    paris, oslo = [item for item in first.output if item.type == "function_call"]
    assert [json.loads(call.arguments)["city"] for call in (paris, oslo)] == ["Paris", "Oslo"]
    outputs = [{"type": "function_call_output", "call_id": oslo.call_id, "output": "snow, -3"},
               {"type": "function_call_output", "call_id": paris.call_id, "output": "rain, 18"}]
    chained = _create(client, input=outputs, previous_response_id=first.id, tools=[WEATHER_TOOL])
    assert chained.output_text == "Paris 18, rain; Oslo -3, snow."
    prompt = runner.prompts[-1]
    assert prompt.index(">Paris<") < prompt.index(">Oslo<") < prompt.index("rain, 18") < prompt.index("snow, -3")


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_the_first_call_and_is_echoed(server, client, stream):
    server.engine.engine.runner.add("[two-cities]", TWO_CITIES)
    fields = {"input": "[two-cities] Weather in Paris and Oslo?", "tools": [WEATHER_TOOL], "parallel_tool_calls": False}
    response = _create(client, **fields, stream=True) if stream else _create(client, **fields)
    response = list(response)[-1].response if stream else response
    calls = [item for item in response.output if item.type == "function_call"]
    assert [json.loads(call.arguments)["city"] for call in calls] == ["Paris"]
    assert response.parallel_tool_calls is False and response.status == "completed"


REASONING_BETWEEN_CALLS = (" to=self<|message|>Paris first.<|eom|><|start|>assistant"
                           + _weather_call("Paris", "<|eom|><|start|>assistant")
                           + " to=self<|message|>Now Oslo.<|eom|><|start|>assistant" + _weather_call("Oslo", "<|eot|>"))


def test_a_reasoning_message_between_calls_is_an_item_holding_its_own_text(server, client):
    """P-CHAN-4 joins reasoning messages with a newline for chat's one reasoning string. The second reasoning item
    held that newline ("\nNow Oslo."), streamed it, and rendered it back through previous_response_id, so the model
    read a turn it had not written."""
    runner = server.engine.engine.runner
    runner.add("[reason-between-calls]", REASONING_BETWEEN_CALLS)
    fields = {"input": "[reason-between-calls] Weather in Paris and Oslo?", "tools": [WEATHER_TOOL]}
    first = _create(client, **fields)
    assert [(item.type, item.content[0].text if item.type == "reasoning" else json.loads(item.arguments))
            for item in first.output] == [("reasoning", "Paris first."), ("function_call", {"city": "Paris"}),
                                          ("reasoning", "Now Oslo."), ("function_call", {"city": "Oslo"})]
    events = list(_create(client, **fields, stream=True))
    reasoning_ids = [e.item.id for e in events if e.type == "response.output_item.added" and e.item.type == "reasoning"]
    assert ["".join(e.delta for e in events if e.type == "response.reasoning_text.delta" and e.item_id == item_id)
            for item_id in reasoning_ids] == ["Paris first.", "Now Oslo."]
    assert [e.text for e in events if e.type == "response.reasoning_text.done"] == ["Paris first.", "Now Oslo."]
    outputs = [{"type": "function_call_output", "call_id": item.call_id, "output": "sunny"}
               for item in first.output if item.type == "function_call"]
    _create(client, input=outputs, previous_response_id=first.id, tools=[WEATHER_TOOL])
    assert "<|start|>assistant to=self<|message|>Now Oslo.<|eom|>" in runner.prompts[-1]


def test_what_the_model_said_before_its_call_is_rendered_back_before_the_call(server, client):
    """The message item and the function_call after it made one assistant message, whose content the template drops
    when it holds calls (§2.1): the continued prompt lost the model's own words. Rendered as written, the text is a
    message to the user that did not end the turn (<|eom|>), then the call, with previous_response_id or with the
    items sent back in `input`."""
    runner = server.engine.engine.runner
    runner.add("[say-then-call]", " to=user<|message|>Let me check.<|eom|><|start|>assistant"
               + _weather_call("Paris", "<|eot|>"))
    question = "[say-then-call] Weather in Paris?"
    tools = [{**WEATHER_TOOL, "strict": False}]  # a strict tool's grammar has a turn answer or call, not both
    first = _create(client, input=question, tools=tools)
    message, call = first.output
    assert (message.type, message.content[0].text, call.type) == ("message", "Let me check.", "function_call")
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    said = "<|start|>assistant to=user<|message|>Let me check.<|eom|><|start|>assistant to=get_weather<|message|>"
    _create(client, input=[output], previous_response_id=first.id, tools=tools)
    assert said in runner.prompts[-1]
    _create(client, input=[{"role": "user", "content": question}, *first.output, output], tools=tools)
    assert said in runner.prompts[-1]


def _assert_rendered_back_as_written(client, runner, asked_text: str, first, turn: str) -> None:
    """A follow-up to `first` (the response to `asked_text`, the last prompt run) renders its turn back exactly as the
    model wrote it (`turn`), with previous_response_id and with its items sent back in `input`."""
    asked = runner.prompts[-1]
    _create(client, input="[greet] Thanks", previous_response_id=first.id)
    assert runner.prompts[-1].startswith(asked + turn)
    _create(client, input=[{"role": "user", "content": asked_text}, *first.output,
                           {"role": "user", "content": "[greet] Thanks"}])
    assert runner.prompts[-1].startswith(asked + turn)


def test_a_turn_of_several_messages_is_rendered_back_as_the_model_wrote_it(server, client):
    """A turn where the model wrote to the user, reasoned again, then answered ([reasoning, message, reasoning,
    message]) was rendered back with its first message ending the turn (<|eot|>, where the model wrote <|eom|>): the
    continued prompt held two assistant turns with no user message between them, and missed the prefix cache from
    there. Every message of the turn but the last renders as not ending it, with previous_response_id or with the
    items sent back in `input`."""
    runner = server.engine.engine.runner
    turn = (" to=self<|message|>First.<|eom|><|start|>assistant to=user<|message|>On it.<|eom|><|start|>assistant"
            " to=self<|message|>Second.<|eom|><|start|>assistant to=user<|message|>Done.<|eot|>")
    runner.add("[preamble]", turn)
    first = _create(client, input="[preamble] Go")
    assert [item.type for item in first.output] == ["reasoning", "message", "reasoning", "message"]
    _assert_rendered_back_as_written(client, runner, "[preamble] Go", first, turn)


@pytest.mark.parametrize("stream", [False, True])
def test_each_message_of_one_channel_is_an_item_of_its_own_rendered_back_as_written(server, client, stream):
    """Two messages in a row to one channel (two answers to the user, two reasoning messages) made one item: the
    answers' text ran together ("One.Two.") and was rendered back as one message, so the continued prompt held a
    turn the model had not written (and missed the prefix cache from there). Each message is an item of its own, with
    the logprobs of its own tokens, rendered back as its own message (two `to=self` messages, not one holding
    "First.\nSecond."), with previous_response_id or with the items sent back in `input`."""
    runner = server.engine.engine.runner
    turn = (" to=self<|message|>First.<|eom|><|start|>assistant to=self<|message|>Second.<|eom|>"
            "<|start|>assistant to=user<|message|>One.<|eom|><|start|>assistant to=user<|message|>Two.<|eot|>")
    runner.add("[two-by-two]", turn)
    created = _create(client, input="[two-by-two] Go", stream=stream, include=["message.output_text.logprobs"])
    first = list(created)[-1].response if stream else created
    assert [(item.type, item.content[0].text) for item in first.output] == [
        ("reasoning", "First."), ("reasoning", "Second."), ("message", "One."), ("message", "Two.")]
    assert ["".join(entry.token for entry in item.content[0].logprobs) for item in first.output[2:]] == ["One.", "Two."]
    _assert_rendered_back_as_written(client, runner, "[two-by-two] Go", first, turn)


def test_the_conversion_puts_outputs_in_call_order_and_keeps_their_sources():
    calls = [{"type": "function_call", "call_id": f"c{city}", "name": "get_weather", "arguments": "{}"}
             for city in ("Paris", "Oslo")]
    outputs = [{"type": "function_call_output", "call_id": f"c{city}", "output": city} for city in ("Oslo", "Paris")]
    sources: list = []
    messages = chat_messages([{"role": "user", "content": "hi"}, *calls, *outputs], None, sources)
    assert [(m.get("tool_call_id"), source.path) for m, source in zip(messages, sources, strict=True)] == [
        (None, "input[0]"), (None, "input[1]"), ("cParis", "input[4]"), ("cOslo", "input[3]")]


def test_a_reasoning_item_sent_back_without_its_text_renders_as_nothing():
    """A reasoning item whose text the client did not keep (`summary: []`) rendered, once each reasoning item became a
    message of its own, as an empty `to=self` message the model never wrote; it is left out, alone or before more."""
    user = {"role": "user", "content": "hi"}
    empty = {"type": "reasoning", "summary": []}
    thought = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]}
    answer = {"role": "assistant", "content": "ans"}
    assert chat_messages([user, empty, thought, answer], None) == [
        user, {"role": "assistant", "content": "ans", "reasoning_content": "think"}]
    assert chat_messages([user, empty], None) == [user]


CALL_P = {"type": "function_call", "call_id": "cP", "name": "get_weather", "arguments": '{"city": "Paris"}'}
OUTPUT_P = {"type": "function_call_output", "call_id": "cP", "output": "rain"}


@pytest.mark.parametrize(("items", "param", "message"), [
    ([CALL_P, OUTPUT_P, OUTPUT_P], "input[3].call_id",
     "duplicate function_call_output for call_id 'cP', also at input[2]: each function_call has exactly one "
     "function_call_output; remove the duplicate item"),
    ([CALL_P, CALL_P, OUTPUT_P], "input[2].call_id",
     "duplicate function_call call_id 'cP', also at input[1]: each call has its own call_id"),
    ([{**CALL_P, "id": "fc_1"}, {**OUTPUT_P, "id": "fc_1"}], "input[2].id",
     "duplicate item id 'fc_1', also at input[1]: each item is sent once"),
])
def test_an_item_sent_twice_is_refused_naming_it_and_where_it_was_first(items, param, message):
    """Both copies rendered: two answers to one call, or one call twice. OpenAI refuses them ("Duplicate
    function_call_output for call_id ...", "Duplicate item found with id ...")."""
    with pytest.raises(RequestError) as refused:
        chat_messages([{"role": "user", "content": "[weather]"}, *items], None)
    assert refused.value.param == param and str(refused.value).startswith(f"{param}: {message}")


@pytest.mark.parametrize(("output", "got"), [(None, "null"), ([], "[]"), (..., "null")])
def test_a_function_call_output_without_its_output_is_refused_as_chat_refuses_the_tool_message(output, got):
    """A missing, null or [] `output` rendered an empty tool result where chat refuses the same tool message (400:
    "a tool message needs its content"): one conversation, a prompt on one API and a 400 on the other (P-TMPL-6),
    and a client that forgot the field got an answer to a result it never sent. OpenAI refuses it too."""
    answer = {"type": "function_call_output", "call_id": "cP"} | ({} if output is ... else {"output": output})
    with pytest.raises(RequestError) as refused:
        chat_messages([{"role": "user", "content": "[weather]"}, CALL_P, answer], None)
    assert refused.value.param == "input[2].output"
    assert str(refused.value) == (f"input[2].output: a function_call_output needs its output (a string or a non-empty "
                                  f'list of parts, got {got}); send "" for a tool that returned nothing')
    empty = chat_messages([{"role": "user", "content": "[weather]"}, CALL_P, {**OUTPUT_P, "output": ""}], None)
    assert empty[-1] == {"role": "tool", "tool_call_id": "cP", "content": ""}


@pytest.mark.parametrize("output", [{"temp": 21}, 21])
def test_a_function_call_output_of_another_type_is_refused_naming_the_parts_it_takes(output):
    """It was refused as "must be a string or a list of text parts", where input_image parts are taken there too
    (chat's tool message takes images the same way), so the error told a client its image result could not be sent."""
    answer = {**OUTPUT_P, "output": output}
    with pytest.raises(RequestError) as refused:
        chat_messages([{"role": "user", "content": "[weather]"}, CALL_P, answer], None)
    assert refused.value.param == "input[2].output"
    assert str(refused.value) == ("input[2].output: must be a string or a list of text and input_image parts, not "
                                  f"{type(output).__name__}")


@pytest.mark.parametrize("item", [{}, {"type": "message", "content": "hi"}, {"content": "hi", "role": None}])
def test_a_message_item_without_a_role_is_refused_asking_for_one(item):
    """It was refused with "input[1].role: None is not one of user, ...": Python's word, a value no client sent."""
    with pytest.raises(RequestError) as refused:
        chat_messages([{"role": "user", "content": "hi"}, item], None)
    assert refused.value.param == "input[1].role"
    assert str(refused.value) == ("input[1].role: a message item needs its role, one of user, system, developer, "
                                  "assistant")


@pytest.mark.parametrize("item_id", [5, 1.5, True, ["msg_1"], {"id": "msg_1"}])
def test_an_item_id_that_is_not_a_string_is_refused_naming_it(server, item_id):
    """An id 5 was stored as sent: the response's `input_items?after=5` (the query's text) found no item 5, and two
    items with id 5 were no duplicate."""
    items = [{"role": "user", "content": "hi", "id": "msg_0"}, {"role": "user", "content": "hi", "id": item_id}]
    response = httpx.post(server.base_url + "/responses", json={"model": "tiny", "input": items}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[1].id"
    assert error["message"].startswith(f"input[1].id: must be a string (the id a response gave the item), not "
                                       f"{type(item_id).__name__}")


def test_a_continuation_sending_again_what_its_previous_response_holds_is_400(server, client):
    """A call answered in the chain answered again, or the previous response's items sent again beside
    previous_response_id, with or without their ids (the prompt held the call twice): the message says to send only
    the new items."""
    first = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL])
    (call,) = [item for item in first.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny [sunny-result]"}
    answered = _create(client, input=[output], previous_response_id=first.id, tools=[WEATHER_TOOL])
    resent = [item.model_dump(exclude_none=True) for item in first.output]
    for previous, input_, param in ((answered.id, [output], "input[0].call_id"),
                                    (first.id, [*resent, output], "input[0].id"),
                                    (first.id, [{k: v for k, v in item.items() if k != "id"} for item in resent]
                                     + [output], "input[0]"),
                                    (first.id, [{k: v for k, v in item.items() if k != "id"} for item in resent[1:]]
                                     + [output], "input[0].call_id")):
        body = {"model": "tiny", "tools": [WEATHER_TOOL], "previous_response_id": previous, "input": input_}
        response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and "duplicate" in error["message"], error
        assert "with previous_response_id, send only the new items" in error["message"]


def test_an_answer_sent_again_without_its_ids_beside_previous_response_id_is_400(server, client):
    """The previous response's reasoning and message items, ids dropped, rendered a second time after the chain's own:
    the model read its last turn twice. A new message after the chain is taken."""
    first = _create(client, input="[greet] Hello!")
    resent = [{k: v for k, v in item.model_dump(exclude_none=True).items() if k not in ("id", "status")}
              for item in first.output]
    assert [item["type"] for item in resent] == ["reasoning", "message"]
    for items, param in ((resent, "input[0]"), (resent[1:], "input[0]")):
        body = {"model": "tiny", "previous_response_id": first.id, "max_output_tokens": 4,
                "input": [*items, {"role": "user", "content": "[greet] Again"}]}
        response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and "send only the new items" in error["message"], error
    body["input"] = body["input"][1:]
    assert httpx.post(server.base_url + "/responses", json=body, timeout=30).status_code == 200


def test_a_new_assistant_message_saying_what_the_chain_said_before_is_taken(server, client):
    """Beside previous_response_id, an assistant message item after a new user message was refused as the previous
    response's answer sent again whenever an earlier answer said the same ("Hello there!" twice): a conversation
    where the model repeats itself could not be continued. What the chain holds is refused only while the input
    repeats the chain (its answer first, or its whole conversation again)."""
    first = _create(client, input="[greet] Hello!")
    said = first.output_text
    body = {"model": "tiny", "previous_response_id": first.id, "max_output_tokens": 4, **EXTRA,
            "input": [{"role": "user", "content": "Say it once more"}, {"role": "assistant", "content": said},
                      {"role": "user", "content": "[greet] Thanks"}]}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 200, response.text
    body["input"] = [{"role": "user", "content": "[greet] Hello!"}, {"role": "assistant", "content": said},
                     {"role": "user", "content": "[greet] Thanks"}]
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "input[1]", response.text


@pytest.mark.parametrize("content", [
    [{"type": "input_text", "text": "[greet] Hello!"}],
    [{"type": "input_text", "text": "[greet] "}, {"type": "input_text", "text": "Hello!"}],
])
def test_the_conversation_sent_again_with_its_user_message_as_parts_is_400(server, client, content):
    """Beside previous_response_id, the whole conversation sent again was caught with the user message as the string
    it was first sent as, but not as input_text parts saying the same: the user message read as new, the previous
    answer after it was taken, and the prompt held that answer twice. The user message is compared as it renders."""
    first = _create(client, input="[greet] Hello!")
    body = {"model": "tiny", "previous_response_id": first.id, "max_output_tokens": 4, **EXTRA,
            "input": [{"role": "user", "content": content}, {"role": "assistant", "content": first.output_text},
                      {"role": "user", "content": "[greet] Thanks"}]}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[1]", error
    assert error["message"].startswith("input[1]: duplicate assistant message item: an assistant message of the "
                                       "responses previous_response_id continues says the same"), error


def test_an_output_answering_no_call_is_400_naming_its_call_id(server, client):
    def refused(**fields):
        body = {"model": "tiny", "tools": [WEATHER_TOOL], **fields}
        response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
        assert response.status_code == 400, response.text
        return response.json()["error"]

    stray = {"type": "function_call_output", "call_id": "call_nowhere", "output": "Sunny"}
    error = refused(input=[{"role": "user", "content": "[weather] Weather in Paris?"}, stray])
    assert error["param"] == "input[1].call_id" and "'call_nowhere'" in error["message"]
    first = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL])
    error = refused(input=[stray], previous_response_id=first.id)  # the chain holds another call
    assert error["param"] == "input[0].call_id" and "'call_nowhere'" in error["message"]


def test_a_continuation_without_an_output_for_every_call_is_400_naming_the_calls(server, client):
    """It was served: the call rendered as a turn whose result never came. OpenAI answers 400 "No tool output found
    for function call ..."."""
    first = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL])
    (call,) = [item for item in first.output if item.type == "function_call"]
    body = {"model": "tiny", "tools": [WEATHER_TOOL], "previous_response_id": first.id,
            "input": [{"role": "user", "content": "[greet] Never mind."}]}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input"
    assert error["message"].startswith(f"input: no tool output found for function call {call.call_id!r} (from "
                                       "previous_response_id)")


def test_a_call_in_the_input_needs_its_output_too():
    calls = [{"type": "function_call", "call_id": f"c{i}", "name": "get_weather", "arguments": "{}"} for i in (1, 2)]
    answer = {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}
    with pytest.raises(RequestError, match=r"^input: no tool output found for function call 'c2' \(input\[2\]\);"):
        chat_messages([{"role": "user", "content": "hi"}, *calls, answer], None)
    chat_messages([{"role": "user", "content": "hi"}, *calls, answer, {**answer, "call_id": "c2"}], None)


def test_many_calls_and_outputs_are_read_in_time_linear_in_their_number():
    """Each output searched the rest of the input for a later call of its call_id, found or not: 20,000 calls and their
    outputs (a 3 MB body) held a server thread for half a minute."""
    calls = [{"type": "function_call", "call_id": f"c{i}", "name": "get_weather", "arguments": "{}"}
             for i in range(20_000)]
    outputs = [{"type": "function_call_output", "call_id": f"c{i}", "output": "Sunny"} for i in range(20_000)]
    started = time.process_time()  # CPU time: other processes on a busy machine do not count
    chat_messages([{"role": "user", "content": "hi"}, *calls, *outputs], None)
    assert time.process_time() - started < 8  # about a second; half a minute when each output searched


def test_an_output_after_a_message_that_ended_its_calls_turn_is_refused_naming_its_call_id():
    """The prompt pairs a result with the calls of the turn right before it: an output after the next message
    rendered as a result of no call (chat refuses the same history, "must be followed by tool messages")."""
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}
    answer = {"type": "function_call_output", "call_id": "c1", "output": "Sunny"}
    with pytest.raises(RequestError, match=r"^input\[3\]\.call_id: the output of call 'c1' comes after the message at "
                                           r"input\[2\], which ends the turn of its call") as refused:
        chat_messages([{"role": "user", "content": "hi"}, call, {"role": "user", "content": "hurry"}, answer], None)
    assert refused.value.param == "input[3].call_id"
    reasoning = {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Then the time."}]}
    second = {**call, "call_id": "c2"}
    chat_messages([{"role": "user", "content": "hi"}, call, reasoning, second, answer, {**answer, "call_id": "c2"},
                   {"role": "user", "content": "thanks"}], None)  # one turn: consecutive assistant items


def test_an_output_before_its_call_is_400_naming_its_call_id(server):
    """The result rendered before the call, named after the raw call_id, and the model answered in ATEM markup."""
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny [sunny-result]"}
    body = {"model": "tiny", "tools": [WEATHER_TOOL],
            "input": [{"role": "user", "content": "[weather] Weather in Paris?"}, output, call]}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[1].call_id" and "input[2]" in error["message"]
    assert "send the call's item before its output" in error["message"]
    body["input"][1:] = [call, output]
    assert httpx.post(server.base_url + "/responses", json=body, timeout=30).status_code == 200


@pytest.mark.parametrize(("input_", "param"), [
    ("", "input"),
    ([{"role": "user"}], "input[0].content"),
    ([{"type": "message", "role": "system", "content": None}, {"role": "user", "content": "[greet]"}],
     "input[0].content"),
])
def test_an_input_that_would_render_an_empty_turn_is_400(server, input_, param):
    body = {"model": "tiny", "input": input_, "max_output_tokens": 4}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("content", [None, [], ...])
def test_an_assistant_message_item_without_its_content_is_refused_naming_it(content):
    """It was taken as an empty answer: the prompt held `to=user<|message|><|eot|>`, a reply the model never wrote,
    where a user or system message item without its content is a 400. OpenAI refuses it too."""
    item = {"type": "message", "role": "assistant"} | ({} if content is ... else {"content": content})
    with pytest.raises(RequestError) as refused:
        chat_messages([{"role": "user", "content": "hi"}, item, {"role": "user", "content": "again"}], None)
    assert refused.value.param == "input[1].content"
    assert str(refused.value).startswith("input[1].content: a message item needs its content")


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_a_message_item_with_empty_content_is_refused_in_responses_words(server, role):
    """A user, system or developer item with `content: []` passed to the chat layer's 400, which says "only an
    assistant message may leave it out or null": on /v1/responses an assistant message item may not either."""
    items = [{"type": "message", "role": role, "content": []}, {"role": "user", "content": "hi"}]
    response = httpx.post(server.base_url + "/responses", timeout=30, json={"model": "tiny", "input": items})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[0].content", error
    assert error["message"].startswith("input[0].content: a message item needs its content"), error
    assert "assistant message may" not in error["message"], error


def test_a_function_call_item_without_its_arguments_is_refused_naming_them():
    """It was taken as a call with no arguments (`{}`): the prompt held a call the model never wrote. OpenAI refuses
    it too. The 400 names `input[i].arguments` and says what to send for a call without arguments (it named the item
    alone, as for a missing name or call_id)."""
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
    for arguments in (None, {}):
        with pytest.raises(RequestError) as refused:
            chat_messages([{"role": "user", "content": "[weather]"}, {**call, "arguments": arguments}, output], None)
        assert refused.value.param == "input[1].arguments"
        assert str(refused.value).startswith("input[1].arguments: a function_call item needs its arguments as a "
                                             "JSON string"), refused.value
        assert str(refused.value).endswith('send "{}" for a call without arguments'), refused.value
    taken = chat_messages([{"role": "user", "content": "[weather]"}, {**call, "arguments": ""}, output], None)
    assert taken[1]["tool_calls"][0]["function"]["arguments"] == ""  # an empty string is no arguments, as in chat


def test_a_function_call_item_without_its_name_asks_for_name_and_call_id_alone():
    """Its 400 said the item "needs string `name`, `call_id` and `arguments`", though arguments have their own 400
    (naming `input[i].arguments`) and were there: it asks for the name and the call_id alone."""
    call = {"type": "function_call", "call_id": "c1", "arguments": "{}"}
    with pytest.raises(RequestError) as refused:
        chat_messages([{"role": "user", "content": "[weather]"}, call], None)
    assert refused.value.param == "input[1]"
    assert str(refused.value) == "input[1]: a function_call item needs string `name` and `call_id`", refused.value


def test_a_function_call_item_with_an_empty_call_id_is_refused_naming_it(server):
    """Over HTTP it was a 400 already, but naming `input[1]` and saying no tool message answers the call of
    'get_weather' (id ''), whose output could not be sent (an output's empty call_id is refused): the 400 names
    `input[1].call_id` and says it must not be empty."""
    call = {"type": "function_call", "call_id": "", "name": "get_weather", "arguments": "{}"}
    items = [{"role": "user", "content": "[weather]"}, call, {"role": "user", "content": "and?"}]
    response = httpx.post(server.base_url + "/responses", timeout=30,
                          json={"model": "tiny", "input": items, "tools": [WEATHER_TOOL]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[1].call_id", error
    assert error["message"].startswith("input[1].call_id: must not be empty"), error


def test_a_chat_shaped_tool_is_400_saying_responses_tools_are_flat(server):
    chat_tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    body = {"model": "tiny", "input": "[weather]", "tools": [chat_tool]}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "tools[0].function" and "flat" in error["message"] and '"name"' in error["message"]


@pytest.mark.parametrize(("tools", "param"), [
    ([{"type": "function", "name": "a b"}], "tools[0].name"),
    ([{"type": "function", "name": "f", "parameters": 3}], "tools[0].parameters"),
    ([{"type": "function", "name": "f"}, {"type": "function", "name": "f"}], "tools[1].name"),
    ([{"type": "function", "name": "f", "color": "red"}], "tools[0].color"),
    ([{"type": "function", "name": "f", "parameters": {"type": "nonsense"}}], "tools[0].parameters"),
    ([{"type": "function", "name": "f", "parameters": {"type": "string"}}], "tools[0].parameters"),
    ([{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {
        "city": {"$ref": "#/$defs/missing"}}}}], "tools[0].parameters"),
])
@pytest.mark.parametrize("choice", [None, "required"])
def test_flat_tool_errors_name_the_field_the_request_has(server, tools, param, choice):
    body = {"model": "tiny", "input": "hi", "tools": tools, "tool_choice": choice}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["message"].startswith(param)


def test_the_sdks_tool_feature_fields_at_their_plain_values_declare_the_same_tool(client):
    """`defer_loading`, `allowed_callers` and `output_schema` (the SDK's FunctionToolParam) were 400s as unknown
    fields, whatever their value."""
    plain = _create(client, input="[weather] Paris?", tools=[WEATHER_TOOL])
    tool = {**WEATHER_TOOL, "defer_loading": False, "allowed_callers": ["direct"], "output_schema": None}
    declared = _create(client, input="[weather] Paris?", tools=[tool])
    assert [item.type for item in declared.output] == [item.type for item in plain.output]
    assert declared.output[-1].arguments == plain.output[-1].arguments
    assert declared.usage.input_tokens == plain.usage.input_tokens


@pytest.mark.parametrize(("field", "value", "words"), [("defer_loading", True, "tool search"),
                                                       ("allowed_callers", ["programmatic"], "programmatic"),
                                                       ("allowed_callers", ["direct", "programmatic"], "programmatic"),
                                                       ("output_schema", {"type": "object"}, "outputs")])
def test_a_tool_feature_glimmer_has_not_is_400_saying_so(server, field, value, words):
    body = {"model": "tiny", "input": "[weather]", "tools": [{**WEATHER_TOOL, field: value}]}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == f"tools[0].{field}" and words in error["message"], error
    assert "unknown field" not in error["message"]


def test_a_streamed_call_sends_argument_deltas(client):
    events = list(_create(client, input="[weather] Weather?", tools=[WEATHER_TOOL], stream=True))
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(arguments) == {"city": "Paris"} and done[0].arguments == arguments


def test_the_arguments_done_event_names_the_function_called(client):
    """OpenAI's API reference lists `name` among the required fields of response.function_call_arguments.done (the
    clients generated from its OpenAPI spec read it); the event carried only the arguments."""
    events = list(_create(client, input="[weather] Weather?", tools=[WEATHER_TOOL], stream=True))
    done, = [e.model_dump() for e in events if e.type == "response.function_call_arguments.done"]
    assert done["name"] == "get_weather"


@pytest.mark.parametrize("stream", [False, True])
def test_a_completed_response_says_when_it_completed_and_an_incomplete_one_does_not(client, stream):
    """`completed_at`, which the SDK's Response types and OpenAI sets on a completed response, was left out (None)."""
    def final(**fields):
        response = _create(client, input="[greet] Hi", stream=stream, **fields)
        return list(response)[-1].response if stream else response

    completed, incomplete = final(), final(max_output_tokens=2)
    assert completed.status == "completed" and incomplete.status == "incomplete"
    assert completed.created_at <= completed.completed_at <= time.time() + 1
    assert client.responses.retrieve(completed.id).completed_at == completed.completed_at
    assert incomplete.completed_at is None


def test_max_output_tokens_makes_the_response_incomplete(client):
    response = _create(client, input="[greet] Hello!", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output and response.output[-1].status == "incomplete"  # the item the limit cut, as OpenAI
    events = list(_create(client, input="[greet] Hello!", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.output[-1].status == "incomplete"
    assert [e.item.status for e in events if e.type == "response.output_item.done"][-1] == "incomplete"


def test_a_summary_cut_by_max_output_tokens_is_marked_incomplete_as_its_item(client):
    events = list(_create(client, input="[greet] Hello!", max_output_tokens=6, reasoning={"summary": "auto"},
                          stream=True))
    (done,) = [e for e in events if e.type == "response.reasoning_summary_part.done"]
    assert done.status == "incomplete" and events[-1].response.output[0].status == "incomplete"
    assert done.part.text == events[-1].response.output[0].summary[0].text
    whole = list(_create(client, input="[greet] Hello!", reasoning={"summary": "auto"}, stream=True))
    assert [e.status for e in whole if e.type == "response.reasoning_summary_part.done"] == [None]


def test_a_max_output_tokens_below_the_shortest_forced_call_is_a_400_naming_it(server, client):
    """A forced call max_output_tokens cannot hold was generated and failed (a 500): it is a 400 up front naming
    max_output_tokens and the fewest tokens any allowed call takes."""
    fewest = fewest_forced_call_tokens(server, [WEATHER_TOOL])
    with pytest.raises(openai.BadRequestError) as refused:
        _create(client, input="[greet] Hello!", tools=[WEATHER_TOOL], tool_choice="required",
                max_output_tokens=fewest - 1)
    error = refused.value.body
    assert error["param"] == "max_output_tokens" and "max_tokens" not in error["message"], error
    assert f"raise max_output_tokens to at least {fewest}" in error["message"]


def test_a_forced_call_cut_short_before_it_is_written_fails_as_tool_choice_unsatisfied(server, client):
    """P-REQ-4: never `incomplete` with no call when tool_choice forced one: a 500 of type tool_choice_unsatisfied,
    streamed an `error` event then response.failed, saying max_output_tokens cut the reply and to raise it."""
    fields = {"input": "[greet] Hello!", "tools": [WEATHER_TOOL], "tool_choice": "required",
              "max_output_tokens": fewest_forced_call_tokens(server, [WEATHER_TOOL])}
    with pytest.raises(openai.InternalServerError) as refused:
        _create(client, **fields)
    body = {"model": "tiny", "temperature": 0, **EXTRA, **fields}
    with httpx.stream("POST", server.base_url + "/responses", json={**body, "stream": True}, timeout=30) as events:
        lines = [json.loads(line[6:]) for line in events.iter_lines() if line.startswith("data: ")]
    error, failed = lines[-2:]
    assert error["type"] == "error" and failed["type"] == "response.failed"
    assert not any(line["type"] in ("response.completed", "response.incomplete") for line in lines)
    for message, kind in ((refused.value.body["message"], refused.value.body["type"]),
                          (error["message"], error["code"])):
        assert kind == "tool_choice_unsatisfied"
        assert 'cut short by max_output_tokens (finish_reason "length") before a complete call' in message
        assert "raise max_output_tokens" in message
    assert failed["response"]["error"]["message"] == error["message"]
    # as an incomplete response's cut item: the item the failure cut is `incomplete`, its done events sent
    assert failed["response"]["output"] and [item["status"] for item in failed["response"]["output"]] == \
        ["incomplete"] * len(failed["response"]["output"])
    (done,) = [line for line in lines if line["type"] == "response.output_item.done"]
    assert done["item"] == failed["response"]["output"][-1] and lines.index(done) < lines.index(error)


def _input_leaving(server, room: int) -> tuple[str, int]:
    """An input text whose prompt (with WEATHER_TOOL) leaves at most `room` tokens of the context, and what it
    leaves."""
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}
    max_model_len = server.engine.engine.max_model_len
    words, left = 0, None
    while left is None or left > room:
        words += 0 if left is None else max(1, (left - room) // 2)
        text = "[greet] Hello!" + " Paris" * words
        tokenized = httpx.post(f"{server.url}/tokenize", json={
            "model": "tiny", "messages": [{"role": "user", "content": text}], "tools": [chat_tool], **EXTRA}).json()
        left = max_model_len - tokenized["count"]
    return text, left


def test_a_forced_call_cut_short_by_the_end_of_the_context_says_to_shorten_the_conversation(server, client):
    """P-REQ-4 where no max_output_tokens was set and the context ran out: the message said to raise
    max_output_tokens, then to shorten "the messages", a chat field /v1/responses does not have."""
    max_model_len = server.engine.engine.max_model_len
    fewest = fewest_forced_call_tokens(server, [WEATHER_TOOL])
    text, room = _input_leaving(server, fewest + 1)  # room for a call, which the model spends on reasoning
    assert room >= fewest
    with pytest.raises(openai.InternalServerError) as refused:
        _create(client, input=text, tools=[WEATHER_TOOL], tool_choice="required")
    assert refused.value.body["type"] == "tool_choice_unsatisfied"
    assert refused.value.body["message"].endswith(
        f"reached the end of the context (max_model_len={max_model_len}) before a complete call; shorten the "
        "conversation so that the reasoning and the call fit")


def test_an_input_that_leaves_less_room_than_the_shortest_forced_call_is_a_400_naming_input(server, client):
    text, room = _input_leaving(server, fewest_forced_call_tokens(server, [WEATHER_TOOL]) - 1)
    assert room >= 1
    with pytest.raises(openai.BadRequestError) as refused:
        _create(client, input=text, tools=[WEATHER_TOOL], tool_choice="required")
    assert (refused.value.body["code"], refused.value.body["param"]) == ("context_length_exceeded", "input")
    assert f"leaves {room} for the reply" in refused.value.body["message"]


LOGPROBS = ["message.output_text.logprobs"]


def test_included_logprobs_are_the_answers_tokens_as_chat_gives_them(client):
    response = _create(client, input="[greet] Hello!", include=LOGPROBS, top_logprobs=2)
    assert response.top_logprobs == 2
    (part,) = response.output[-1].content
    assert b"".join(bytes(entry.bytes) for entry in part.logprobs).decode() == part.text == "Hello there!"
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in part.logprobs)
    chat = client.chat.completions.create(model="tiny", temperature=0, messages=[
        {"role": "user", "content": "[greet] Hello!"}], logprobs=True, top_logprobs=2, extra_body=EXTRA)
    assert [entry.model_dump() for entry in part.logprobs] == [
        entry.model_dump() for entry in chat.choices[0].logprobs.content]


def test_streamed_logprobs_go_with_the_text_deltas_and_add_up_to_the_parts(client):
    whole = _create(client, input="[greet] Hello!", include=LOGPROBS, top_logprobs=1)
    events = list(_create(client, input="[greet] Hello!", include=LOGPROBS, top_logprobs=1, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    for event in deltas:  # each token's entry comes with its text, coalesced for a slow client or not
        assert b"".join(bytes(entry.bytes) for entry in event.logprobs).decode() == event.delta
    streamed = [entry.model_dump(exclude={"bytes"}) for e in deltas for entry in e.logprobs]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    (part,) = events[-1].response.output[-1].content
    expected = [entry.model_dump(exclude={"bytes"}) for entry in whole.output[-1].content[0].logprobs]
    assert streamed == expected == [entry.model_dump(exclude={"bytes"}) for entry in done.logprobs]
    assert [entry.model_dump() for entry in part.logprobs] == [
        entry.model_dump() for entry in whole.output[-1].content[0].logprobs]


def test_logprobs_come_only_when_included(client):
    # as OpenAI: top_logprobs alone includes nothing; the include alone lists no alternatives
    assert _create(client, input="[greet] Hello!", top_logprobs=3).output[-1].content[0].logprobs == []
    entries = _create(client, input="[greet] Hello!", include=LOGPROBS).output[-1].content[0].logprobs
    assert entries and all(entry.top_logprobs == [] for entry in entries)


def test_logprobs_decided_after_their_text_go_in_an_empty_delta_before_the_text_is_done():
    builder = OutputBuilder()
    entry = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}
    events = builder.feed([("content", "Hi")]) + builder.feed([], [entry]) + builder.finish()
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [(e["delta"], e["logprobs"]) for e in deltas] == [("Hi", []), ("", [entry])]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == [entry] == builder.items[0]["content"][0]["logprobs"]


def test_a_response_echoes_the_temperature_and_top_p_it_sampled_with(make_tiny, tmp_path):
    """As OpenAI's and vLLM's: a field left out is echoed at the value used (here the checkpoint's
    generation_config.json default), not null; top_logprobs left out is 0."""
    model = tmp_path / "model"
    shutil.copytree(make_tiny(), model)
    generation = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps(generation | {"temperature": 0.6, "top_p": 0.9}))
    with agent_server(model) as live:
        client = openai.OpenAI(base_url=live.base_url, api_key="unused", max_retries=0)
        response = client.responses.create(model="tiny", input="[greet] Hello!", extra_body=EXTRA)
        assert (response.temperature, response.top_p, response.top_logprobs) == (0.6, 0.9, 0)
        assert client.responses.retrieve(response.id).temperature == 0.6
        events = list(client.responses.create(model="tiny", input="[greet] Hello!", top_p=0.5, stream=True,
                                              extra_body=EXTRA))
        assert {(e.response.temperature, e.response.top_p) for e in events if hasattr(e, "response")} == {(0.6, 0.5)}
        sent = _create(client, input="[greet] Hello!", top_p=1, top_logprobs=3)
        assert (sent.temperature, sent.top_p, sent.top_logprobs) == (0, 1, 3)


@pytest.mark.parametrize("top_logprobs", [-1, 21, 2.5, "3", True])
def test_top_logprobs_out_of_range_or_not_an_integer_is_a_400_naming_it(server, top_logprobs):
    body = {"model": "tiny", "input": "[greet]", "include": LOGPROBS, "top_logprobs": top_logprobs}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "top_logprobs"


@pytest.mark.parametrize(("stream_options", "stream", "param"), [
    ({"include_usage": True}, True, "stream_options.include_usage"),  # chat's: a response's usage comes once, last
    ({"continuous_usage_stats": True}, True, "stream_options.continuous_usage_stats"),
    ({"include_obfuscation": "no"}, True, "stream_options.include_obfuscation"),
    ({"include_obfuscation": False}, False, "stream_options"),  # as on chat: options of a stream only
])
def test_stream_options_glimmer_would_not_honour_are_a_400_naming_them(server, stream_options, stream, param):
    """`stream_options` took any object, with or without `stream`: chat's `include_usage` and vLLM's
    `continuous_usage_stats` were silently ignored, and so was a typo."""
    body = {"model": "tiny", "input": "[greet]", "stream": stream, "stream_options": stream_options}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_stream_options_include_obfuscation_is_taken_with_a_stream(client):
    events = list(_create(client, input="[greet] Hello!", stream=True, stream_options={"include_obfuscation": False}))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == "Hello there!"


def test_a_cut_after_a_finished_message_leaves_that_item_complete(client):
    """max_output_tokens ending the output in the next message's header (or in a call not yet emitted) cuts no
    item already written: the reasoning that ended with <|eom|> stays `completed`; the response is `incomplete`."""
    whole = _create(client, input="[greet] Hello!")
    reasoning_text = whole.output[0].content[0].text
    seen = set()
    for limit in range(1, whole.usage.output_tokens):
        response = _create(client, input="[greet] Hello!", max_output_tokens=limit)
        assert response.status == "incomplete"
        items = response.output
        assert all(item.status == "completed" for item in items[:-1])
        if len(items) == 1 and items[0].type == "reasoning":
            ended = items[0].status == "completed"
            # complete only once the whole reasoning was read; a cut inside it leaves it incomplete
            assert not ended or items[0].content[0].text == reasoning_text
            seen.add(ended)
    assert seen == {True, False}  # some cut fell inside the reasoning, some in the answer's header


def test_instructions_and_developer_input_render_as_the_system_message(server, client):
    runner = server.engine.engine.runner
    _create(client, input=[{"role": "developer", "content": "DEVNOTE"}, {"role": "user", "content": "[greet]"}],
            instructions="INSTRUCTED")
    assert "INSTRUCTED\n\nDEVNOTE" in runner.prompts[-1]


def test_a_stored_response_can_be_fetched_and_an_unknown_one_is_refused(server, client):
    response = _create(client, input="[greet] Hi")
    assert client.responses.retrieve(response.id).output_text == "Hello there!"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        _create(client, input="[greet]", previous_response_id="resp_missing")
    unstored = _create(client, input="[greet] Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize("store", [False, "deleted", None])
def test_an_unknown_previous_response_is_refused_with_openais_code(client, store):
    """A previous_response_id naming no stored response (never stored, `store: false`, deleted) was a 400 with code
    null, "no stored response ..."; OpenAI's code is `previous_response_not_found`, which clients (Codex and proxies
    in front of it) match to resend the whole conversation instead of failing the turn."""
    previous = "resp_missing"
    if store is not None:
        previous = _create(client, input="[greet] Hi", store=store is not False).id
    if store == "deleted":
        client.responses.delete(previous)
    with pytest.raises(openai.BadRequestError) as refused:
        _create(client, input="[greet]", previous_response_id=previous)
    error = refused.value.body
    assert (error["code"], error["param"]) == ("previous_response_not_found", "previous_response_id")
    assert f"previous response {previous!r} not found" in error["message"]


def test_an_empty_previous_response_id_is_refused_as_malformed_not_as_not_found(client):
    """`previous_response_id: ""` names no response at all: it was answered `previous_response_not_found`, the code
    clients match to resend the whole conversation, where OpenAI refuses the empty string itself (`empty_string`)."""
    for create in (lambda: _create(client, input="[greet]", previous_response_id=""),
                   lambda: client.responses.input_tokens.count(input="[greet]", previous_response_id="")):
        with pytest.raises(openai.BadRequestError) as refused:
            create()
        error = refused.value.body
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "empty_string",
                                                                  "previous_response_id")
        assert error["message"].startswith("previous_response_id: an empty string names no response"), error


def test_retrieving_a_stored_response_as_a_stream_is_400_not_the_json_object(client):
    """`responses.retrieve(id, stream=True)` replays a background response's events; the query was ignored (the
    answer was the JSON object, not the events asked for), and so were unknown parameters."""
    response = _create(client, input="[greet] Hi")
    with pytest.raises(openai.BadRequestError) as streamed:
        client.responses.retrieve(response.id, stream=True)
    assert streamed.value.body["param"] == "stream" and "background" in streamed.value.body["message"]
    with pytest.raises(openai.BadRequestError) as replayed:
        client.responses.retrieve(response.id, starting_after=3)
    assert replayed.value.body["param"] == "starting_after"
    with pytest.raises(openai.BadRequestError) as included:
        client.responses.retrieve(response.id, include=["file_search_call.results"])
    assert included.value.body["param"] == "include"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.retrieve(response.id, extra_query={"fields": "id"})
    assert unknown.value.body["param"] == "fields"
    kept = client.responses.retrieve(response.id, include=["message.output_text.logprobs"], stream=False)
    assert kept.output_text == "Hello there!"


@pytest.mark.parametrize(("query", "status", "param"), [
    ("stream=False", 200, None),  # Python's `requests` writes False so: it was refused as a request to stream
    ("stream=FALSE&include_obfuscation=True", 200, None),
    ("stream=0", 400, "stream"),
    ("include_obfuscation=maybe", 400, "include_obfuscation"),  # was taken, as any value
])
def test_retrieve_reads_its_boolean_query_parameters_in_either_case_and_refuses_others(server, client, query, status,
                                                                                      param):
    response = _create(client, input="[greet] Hi")
    fetched = httpx.get(f"{server.base_url}/responses/{response.id}?{query}", timeout=30)
    assert fetched.status_code == status, fetched.text
    if param is None:
        assert fetched.json()["id"] == response.id
    else:
        error = fetched.json()["error"]
        assert error["param"] == param and error["message"].endswith("is not a boolean (true or false)")


def test_a_chain_of_responses_is_stored_in_size_linear_in_its_length(server, client):
    """Each stored response held its whole conversation, so a chain of previous_response_id responses was counted (and
    kept) in size growing with the square of its length: the 30th link added 15 times the bytes of the second. Each
    response keeps the items it added, linked to those it continues: every link adds about the same."""
    store = server.app.state.context.responses
    before, previous, added = store.size_bytes, None, []
    for _ in range(30):
        previous = _create(client, input="[greet] Hi", previous_response_id=previous).id
        added.append(store.size_bytes - before)
        before = store.size_bytes
    assert max(added[1:]) < 1.2 * min(added[1:]), added
    listed = client.responses.input_items.list(previous, order="asc", limit=100).data
    assert [item.type for item in listed] == ["message", "reasoning", "message"] * 29 + ["message"]  # whole


def test_a_kept_response_keeps_its_whole_conversation_when_those_it_continues_are_evicted(make_tiny):
    """The responses a chain continues go first (the oldest); the items they added stay, counted, while a stored
    response continues them: continuing the chain's last response reads the whole conversation, as it did when
    each response held all of it, and forgetting every response gives all their bytes back."""
    with agent_server(make_tiny(), responses_store_bytes=24_000) as live:
        store = live.app.state.context.responses
        client = openai.OpenAI(base_url=live.base_url, api_key="unused", max_retries=0)
        chain = [_create(client, input="[greet] Hi").id]
        for _ in range(2):
            chain.append(_create(client, input="[greet] Hi", previous_response_id=chain[-1]).id)
        others = []
        while store.get(chain[0]) is not None:
            others.append(_create(client, input="[greet] Hello").id)
            assert store.size_bytes <= store.max_bytes
        assert store.get(chain[-1]) is not None
        with pytest.raises(openai.BadRequestError, match="previous_response_not_found|not found"):
            _create(client, input="[greet] Hi", previous_response_id=chain[0])
        continued = _create(client, input="[greet] Hi", previous_response_id=chain[-1])
        listed = client.responses.input_items.list(continued.id, order="asc", limit=100).data
        assert [item.type for item in listed] == ["message", "reasoning", "message"] * 3 + ["message"]
        for response_id in [*chain, *others, continued.id]:
            with contextlib.suppress(openai.NotFoundError):
                client.responses.delete(response_id)
        assert store.size_bytes == 0 and len(store) == 0


def test_a_response_larger_than_the_store_says_it_was_not_stored(make_tiny, caplog):
    """A response larger than the whole store is not kept: it was answered `store: true`, then GET was a 404 and
    continuing it previous_response_not_found, without a word. Its answer (and its stream's last event) says
    `store: false`, as a response not stored does, and the server logs why."""
    with agent_server(make_tiny(), responses_store_bytes=3_000) as live:
        client = openai.OpenAI(base_url=live.base_url, api_key="unused", max_retries=0)
        long_input = "[greet] " + "Hi. " * 400
        kept = _create(client, input="[greet] Hi")
        assert kept.store is True and client.responses.retrieve(kept.id).id == kept.id
        with caplog.at_level(logging.WARNING, logger="glimmer.server.response_store"):
            answered = _create(client, input=long_input)
        assert answered.status == "completed" and answered.store is False
        assert any(answered.id in record.getMessage() and "3,000" in record.getMessage() for record in caplog.records)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(answered.id)
        events = list(_create(client, input=long_input, stream=True))
        assert events[0].response.store is True  # created: it is stored when it ends, if it fits
        assert events[-1].type == "response.completed" and events[-1].response.store is False
        assert client.responses.retrieve(kept.id).id == kept.id  # the store was left as it was


def test_a_stored_response_can_be_deleted_as_openai_deletes_them(server, client):
    """DELETE /v1/responses/{id} (the SDK's `responses.delete`) was a 405."""
    response = _create(client, input="[greet] Hi")
    deleted = client.delete(f"/responses/{response.id}", cast_to=object)
    assert deleted == {"id": response.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError, match="or deleted"):  # it said "never stored, expired, or evicted"
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        _create(client, input="[greet]", previous_response_id=response.id)
    with pytest.raises(openai.NotFoundError):  # twice, or one never stored
        client.responses.delete(response.id)
    kept = _create(client, input="[greet] Hi")
    client.responses.delete(kept.id)  # the SDK's own call
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


def test_delete_and_cancel_refuse_a_query_parameter_as_get_refuses_an_unknown_one(server, client):
    """DELETE /v1/responses/{id}?anything deleted the response, the parameter ignored, while GET and input_items
    refuse one they do not know: a 400 naming it, and the response is kept."""
    response = _create(client, input="[greet] Hi")
    url = f"{server.base_url}/responses/{response.id}"
    for method, path in (("DELETE", url), ("POST", url + "/cancel"), ("GET", url)):
        refused = httpx.request(method, path, params={"dry_run": "true"}, timeout=30)
        assert refused.status_code == 400, (method, path, refused.text)
        error = refused.json()["error"]
        assert error["param"] == "dry_run" and "unknown query parameter" in error["message"], error
    assert client.responses.retrieve(response.id).id == response.id
    client.responses.delete(response.id)


def test_a_response_being_generated_is_in_progress_not_unknown(server, client, monkeypatch):
    """While a stored response is generated, the routes naming it said it was never stored, expired or evicted, and a
    request continuing it was told the same: GET shows it `in_progress` (as its response.created event did), and
    continuing, deleting, cancelling or listing it is a 400 saying it is being generated."""
    runner = server.engine.engine.runner
    release, steps = threading.Event(), []

    def held(step):  # the first step (the prompt, the first token) runs; the next waits for the test
        steps.append(step)
        if len(steps) > 1:
            release.wait(timeout=60)
        return runner_execute(step)

    runner_execute = runner.execute
    monkeypatch.setattr(runner, "execute", held)
    events = _create(client, input="[greet] Hello!", stream=True)
    try:
        created = next(iter(events))
        assert created.type == "response.created"
        response_id = created.response.id
        assert client.responses.retrieve(response_id).status == "in_progress"
        with pytest.raises(openai.BadRequestError, match="is still being generated; continue it once it has"):
            _create(client, input="[greet] Again", previous_response_id=response_id)
        with pytest.raises(openai.BadRequestError, match="is still being generated; it can be deleted once"):
            client.responses.delete(response_id)
        with pytest.raises(openai.BadRequestError, match="is being generated: close its connection to stop it"):
            client.responses.cancel(response_id)
        with pytest.raises(openai.BadRequestError, match="still being generated; its input items are listed once"):
            client.responses.input_items.list(response_id)
    finally:
        release.set()
    assert [event.type for event in events][-1] == "response.completed"
    assert client.responses.retrieve(response_id).status == "completed"
    assert _create(client, input="[greet] Again", previous_response_id=response_id).output_text == "Hello there!"


@pytest.mark.parametrize(("fields", "param"), [
    ({"background": True}, "background"),
    ({"truncation": "auto"}, "truncation"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),  # Glimmer's model has no verbosity control
    ({"text": {"verbosity": "high"}}, "text.verbosity"),
    ({"text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "text"}, "colour": "red"}}, "text.colour"),  # was param "text"
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 3}}}}, "text.format.schema"),
    ({"input": [{"role": "user", "content": "[greet]", "bogus": 1}]}, "input[0].bogus"),
    ({"tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x", "name": "f"}]}, "input[0].name"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),  # required here
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": None}}}, "text.format.schema"),
    ({"text": {"format": {"type": "text"}, "fmt": {"type": "json_object"}}}, "text.fmt"),  # param was `text`
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "description": ["x"]}}},
     "text.format.description"),  # was taken, as any value
    ({"reasoning": {"summary": "concise"}}, "reasoning.summary"),  # the reasoning comes whole or not at all
    ({"reasoning": {"context": "current_turn"}}, "reasoning.context"),  # earlier reasoning is always rendered
    ({"reasoning": {"context": "some_turns"}}, "reasoning.context"),
    ({"reasoning": {"mode": "pro"}}, "reasoning.mode"),
    ({"reasoning": {"generate_summary": "concise"}}, "reasoning.generate_summary"),
    ({"reasoning": {"summary": "auto", "generate_summary": "detailed"}}, "reasoning.generate_summary"),
    ({"max_tool_calls": -1}, "max_tool_calls"),
    ({"max_tool_calls": 1.5}, "max_tool_calls"),
    ({"service_tier": "fastest"}, "service_tier"),
    ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
    # a cache filled without generating: Glimmer would generate instead
    ({"prompt_cache_options": {"prewarm": True}}, "prompt_cache_options.prewarm"),
    ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl"),
    ({"prompt_cache_options": {"size": 3}}, "prompt_cache_options.size"),
    ({"metadata": {"run": 1}}, "metadata.run"),  # OpenAI's metadata values are strings
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),  # at most 16 pairs
    ({"metadata": {"k" * 65: "v"}}, "metadata"),  # keys at most 64 characters
    ({"metadata": {"note": "v" * 513}}, "metadata.note"),  # values at most 512
])
def test_fields_glimmer_cannot_honour_are_400_naming_them(server, fields, param):
    body = {"model": "tiny", "input": "[greet]", **fields}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("status", ["done", "failed", 1, ["completed"]])
def test_an_input_item_status_openai_does_not_know_is_refused_naming_it(server, client, status):
    """An input item's `status` was taken whatever it held, stored as sent, and listed back by input_items ("done",
    not one of the statuses an item has); it is a 400 naming `input[i].status`. The statuses output items carry,
    which clients send back, are taken."""
    items = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!", "status": status},
             {"role": "user", "content": "[greet]"}]
    response = httpx.post(server.base_url + "/responses", json={"model": "tiny", "input": items}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[1].status" and "in_progress, completed, incomplete" in error["message"]
    kept = _create(client, input=[{**item, "status": "incomplete"} for item in items])
    listed = client.responses.input_items.list(kept.id, order="asc")
    assert [item.status for item in listed.data] == ["incomplete"] * 3


@pytest.mark.parametrize("phase", ["commentary", "final_answer"])
def test_an_assistant_message_phase_is_taken_and_leaves_the_prompt_as_it_is(server, client, phase):
    """An assistant message item's `phase` (OpenAI's label of a message inside its turn or ending it, which clients
    resend on every assistant message, as OpenAI asks) was a 400 as an unknown field, so such a client failed on its
    second turn. It is taken: the item's place in its turn already says which it is, and the prompt is the one
    without it; input_items lists it back as sent."""
    items = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "[greet]"}]
    plain = _create(client, input=items)
    prompt = server.engine.engine.runner.prompts[-1]
    phased = _create(client, input=[items[0], {**items[1], "phase": phase}, items[2]])
    assert server.engine.engine.runner.prompts[-1] == prompt
    assert phased.output_text == plain.output_text == "Hello there!"
    listed = client.responses.input_items.list(phased.id, order="asc")
    assert [getattr(item, "phase", None) for item in listed.data] == [None, phase, None]


@pytest.mark.parametrize(("index", "phase"), [(1, "thinking"), (1, 1), (0, "commentary"), (2, "final_answer")])
def test_a_phase_openai_does_not_know_or_on_a_user_message_is_refused_naming_it(server, index, phase):
    """A `phase` is one of OpenAI's two, on an assistant message ("not used for user messages")."""
    items = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "[greet]"}]
    items[index] = {**items[index], "phase": phase}
    response = httpx.post(server.base_url + "/responses", json={"model": "tiny", "input": items}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == f"input[{index}].phase"


def test_the_response_echoes_the_fields_that_cannot_change_the_output_as_openai_does(client):
    """`safety_identifier`, `prompt_cache_key`, `prompt_cache_retention` were dropped from the response object, and
    `service_tier` was null: OpenAI reports the tier that served the request, and Glimmer has one."""
    fields = {"metadata": {"run": "r1"}, "user": "u-1", "safety_identifier": "s-1", "prompt_cache_key": "pck",
              "prompt_cache_retention": "24h"}
    response = _create(client, input="[greet] Hi", service_tier="flex", **fields)
    for echoed in (response, client.responses.retrieve(response.id)):
        assert {name: getattr(echoed, name) for name in fields} == fields
        assert (echoed.service_tier, echoed.background, echoed.max_tool_calls) == ("default", False, None)
    created = next(iter(_create(client, input="[greet] Hi", stream=True, **fields)))
    assert created.type == "response.created" and created.response.safety_identifier == "s-1"


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_max_tool_calls_is_taken_and_echoed_and_bounds_no_function_call_as_openai(client, bound):
    """`max_tool_calls` was a 400 whatever its value. OpenAI's bounds calls to its built-in tools, which function calls
    do not count against, and Glimmer has function tools only: any count is taken, echoed (created, streamed,
    retrieved) and the function call is made as without it."""
    plain = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL])
    bounded = _create(client, input="[weather] Weather in Paris?", tools=[WEATHER_TOOL], max_tool_calls=bound)
    assert [item.type for item in bounded.output] == [item.type for item in plain.output]
    assert "function_call" in [item.type for item in bounded.output]
    streamed = list(_create(client, input="[greet] Hi", max_tool_calls=bound, stream=True))
    for echoed in (bounded, client.responses.retrieve(bounded.id), streamed[0].response, streamed[-1].response):
        assert echoed.max_tool_calls == bound
    assert plain.max_tool_calls is None


def test_text_verbosity_medium_openai_s_default_is_taken_echoed_and_changes_nothing(server, client):
    """`text.verbosity` was a 400 whatever its value, "medium" too: OpenAI's default, which asks for nothing
    different. It is echoed in `text` as sent (created, streamed, retrieved), as the SDK's Response types it; a
    request without it has "medium" echoed too, as OpenAI echoes its default (none was echoed)."""
    text = {"format": {"type": "text"}, "verbosity": "medium"}
    body = {"model": "tiny", "temperature": 0, "input": "[greet] Hi", **EXTRA}
    created = httpx.post(server.base_url + "/responses", json={**body, "text": text}, timeout=30).json()
    plain = httpx.post(server.base_url + "/responses", json=body, timeout=30).json()
    stored = httpx.get(f"{server.base_url}/responses/{created['id']}", timeout=30).json()
    assert created["text"] == stored["text"] == plain["text"] == text
    assert Response.model_validate(created).text.verbosity == "medium"
    assert created["output"][-1]["content"] == plain["output"][-1]["content"]
    streamed = next(iter(_create(client, input="[greet] Hi", stream=True, text={"verbosity": "medium"})))
    unsent = next(iter(_create(client, input="[greet] Hi", stream=True)))
    assert streamed.response.text.verbosity == unsent.response.text.verbosity == "medium"
    counted = httpx.post(server.base_url + "/responses/input_tokens", timeout=30,
                         json={"model": "tiny", "input": "[greet] Hi", "text": text})
    assert counted.status_code == 200, counted.text


@pytest.mark.parametrize("options", [{}, {"mode": "explicit", "ttl": "12h", "comparison_response_id": "resp_1"},
                                     {"mode": "implicit", "prewarm": False}])
def test_prompt_cache_options_of_the_openai_sdk_are_accepted_echoed_and_change_nothing(server, client, options):
    """`prompt_cache_options`, the SDK's successor of `prompt_cache_retention`, was a 400 as an unknown field. The echo
    is the options applied, as the SDK's Response types them: `mode` and `ttl` are required there, and a request that
    left one out had it echoed missing, a ValidationError for a client that validates the response."""
    body = {"model": "tiny", "temperature": 0, "input": "[greet] Hi", "prompt_cache_options": options, **EXTRA}
    created = httpx.post(server.base_url + "/responses", json=body, timeout=30).json()
    stored = httpx.get(f"{server.base_url}/responses/{created['id']}", timeout=30).json()
    hinted, again = (Response.model_validate(raw) for raw in (created, stored))
    plain = _create(client, input="[greet] Hi")
    assert hinted.output_text == plain.output_text and hinted.usage.input_tokens == plain.usage.input_tokens
    echoed = {"mode": "implicit", "ttl": "30m", **{key: value for key, value in options.items() if key != "prewarm"}}
    for response in (hinted, again):
        assert response.prompt_cache_options.model_dump(exclude_none=True) == echoed
    assert plain.prompt_cache_options is None


def _validated_stream(server, body: dict) -> Response:
    """Streams `body`, validating each event's JSON as the SDK's event union; returns the last event's response."""
    with httpx.stream("POST", server.base_url + "/responses", json={**body, "stream": True}, timeout=30) as reply:
        parsed = [pydantic.TypeAdapter(ResponseStreamEvent).validate_python(json.loads(line[len("data: "):]))
                  for line in reply.iter_lines() if line.startswith("data: ")]
    assert parsed[-1].type == "response.completed"
    return parsed[-1].response


def test_every_body_and_event_validates_as_the_sdks_types_with_every_echoed_field_set(server):
    """The SDK builds its objects without validating them (`construct`), so a client using it reads a body missing a
    required field as it is; agent frameworks and clients that validate (`Response.model_validate`) refused one:
    `prompt_cache_options: {}` was echoed without the `mode` and `ttl` the SDK's Response requires. Each body here
    (created, streamed event by event, continued, retrieved, its input items listed) is validated as the SDK's type,
    with every field the response echoes set."""
    echoed = {"instructions": "Be brief.", "tools": [WEATHER_TOOL], "tool_choice": "auto", "metadata": {"run": "1"},
              "user": "u", "safety_identifier": "s", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
              "prompt_cache_options": {}, "service_tier": "auto", "reasoning": {"summary": "auto", "effort": "low"},
              "text": {"format": {"type": "text"}}, "include": LOGPROBS, "top_logprobs": 2, "max_output_tokens": 300,
              "temperature": 0, **EXTRA}
    call = Response.model_validate(httpx.post(server.base_url + "/responses", timeout=30, json={
        "model": "tiny", "input": "[weather] Paris?", **echoed}).json())
    (function_call,) = [item for item in call.output if item.type == "function_call"]
    assert _validated_stream(server, {"model": "tiny", "input": "[weather] Paris?", **echoed}).output[-1].name == (
        function_call.name)
    answer_body = {"model": "tiny", "previous_response_id": call.id, **echoed, "input": [
        {"type": "function_call_output", "call_id": function_call.call_id, "output": "[sunny-result] sunny"}]}
    answer = Response.model_validate(httpx.post(server.base_url + "/responses", json=answer_body, timeout=30).json())
    assert answer.output_text == _validated_stream(server, answer_body).output_text == "It is sunny in Paris."
    assert answer.output[-1].content[0].logprobs
    stored = httpx.get(f"{server.base_url}/responses/{answer.id}", timeout=30).json()
    assert Response.model_validate(stored).output == answer.output
    items = httpx.get(f"{server.base_url}/responses/{answer.id}/input_items", timeout=30).json()
    page = SyncCursorPage[ResponseItem].model_validate(items)
    assert [item.type for item in page.data] == ["function_call_output", "function_call", "reasoning", "message"]


@pytest.mark.parametrize("tier", ["fast", "ultrafast"])
def test_every_service_tier_of_the_openai_sdk_is_accepted_and_served_as_default(client, tier):
    """The SDK's ServiceTier has `fast` and `ultrafast` beside auto, default, flex, scale and priority; they were a 400
    that named the other five, for a field that cannot change the output."""
    response = _create(client, input="[greet] Hi", service_tier=tier, max_output_tokens=16)
    assert response.service_tier == "default"


@pytest.mark.parametrize(("name", "value"), [("continue_final_message", True), ("add_generation_prompt", False),
                                           ("chat_template", "{{ messages }}")])
def test_chat_rendering_fields_in_chat_template_kwargs_are_400_saying_responses_has_none(server, name, value):
    """Chat's refusal sent the client to "the top level of the request", where /v1/responses refuses the field."""
    body = {"model": "tiny", "input": "[greet]", "chat_template_kwargs": {name: value}}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "chat_template_kwargs" and "top level" not in error["message"]
    assert "field of /v1/chat/completions, which /v1/responses does not take" in error["message"]


@pytest.mark.parametrize(("name", "value"), [("continue_final_message", True), ("add_generation_prompt", False),
                                           ("add_generation_prompt", True), ("chat_template", "{{ messages }}")])
def test_chat_rendering_fields_at_the_top_level_are_400_saying_they_are_chat_fields(server, name, value):
    """They were refused as "unknown field", which did not say that /v1/chat/completions takes them."""
    body = {"model": "tiny", "input": "[greet]", name: value}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == name and "unknown field" not in error["message"]
    assert f"{name}: a field of /v1/chat/completions, which /v1/responses does not take" in error["message"]


IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}


def test_a_media_error_after_a_developer_message_names_the_input_item_holding_the_image(server):
    """The developer item joins the instructions' system message before rendering; the error named input[0], the
    developer item, for the image of input[1]."""
    body = {"model": "tiny", "instructions": "Be brief.", "max_output_tokens": 4,
            "input": [{"role": "developer", "content": "Answer in French."},
                      {"role": "user", "content": [{"type": "input_text", "text": "[greet] What is it?"}, IMAGE]}]}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input[1].content[1]" and "no vision tower" in error["message"], error


def test_a_refused_part_names_the_parts_its_message_takes():
    """A user message takes input_image parts too; an assistant message takes text only."""
    video = {"type": "input_video", "video_url": "data:video/mp4;base64,AAAA"}
    with pytest.raises(RequestError, match=r"^input\[0\]\.content\[1\]: parts of type 'input_video' are not "
                                           r"supported here \(text and input_image parts are\)$"):
        chat_messages([{"role": "user", "content": [IMAGE, video]}], None)
    with pytest.raises(RequestError, match=r"^input\[0\]\.content\[0\]: .* \(text parts are\)$"):
        chat_messages([{"role": "assistant", "content": [IMAGE]}], None)


def test_an_input_image_detail_openai_does_not_know_is_refused_naming_it():
    """OpenAI refuses a `detail` other than low, high, auto and original, as chat's image_url.detail is refused; it
    was taken silently."""
    for detail in ("low", "high", "auto", "original", None):
        chat_messages([{"role": "user", "content": [{**IMAGE, "detail": detail}]}], None)
    with pytest.raises(RequestError, match=r"^input\[0\]\.content\[1\]\.detail must be one of 'auto', 'low', "
                                           r"'high', 'original' \(or left out\), not 'hgih'") as refused:
        chat_messages([{"role": "user", "content": [{"type": "input_text", "text": "[greet]"},
                                                 {**IMAGE, "detail": "hgih"}]}], None)
    assert refused.value.param == "input[0].content[1].detail"


@pytest.mark.parametrize("part", [{"type": "input_image", "file_id": "file-abc"}, {**IMAGE, "file_id": "file-abc"},
                                  {**IMAGE, "file_id": "file-abc", "detail": "low"}])
def test_an_input_image_file_id_is_refused_naming_it_even_beside_its_image_url(part):
    """Glimmer has no Files API. Beside an image_url the file id was dropped without a word, the image_url's image
    read in its place (the client may have meant the file)."""
    with pytest.raises(RequestError) as refused:
        chat_messages([{"role": "user", "content": [{"type": "input_text", "text": "[greet]"}, part]}], None)
    assert str(refused.value) == ("input[0].content[1].file_id: Glimmer has no Files API, so a file id names no "
                                  "image; send the image itself as image_url (a data: URL, or a local path or "
                                  "http(s) URL where the server allows them)")
    assert refused.value.param == "input[0].content[1].file_id"
    chat_messages([{"role": "user", "content": [{**IMAGE, "file_id": None}]}], None)  # the SDK's null: no file


@pytest.mark.parametrize(("item", "param"), [
    ({"type": "reasoning", "content": 2**64}, "input[0].content"),
    ({"type": "reasoning", "content": "thinking"}, "input[0].content"),
    ({"type": "reasoning", "content": {"type": "reasoning_text", "text": "thinking"}}, "input[0].content"),
    ({"type": "reasoning", "summary": True}, "input[0].summary"),
    ({"type": "reasoning", "summary": [{"type": "summary_text"}]}, "input[0].summary[0].text"),
])
def test_a_reasoning_item_whose_parts_are_no_list_of_parts_is_refused_naming_the_field(item, param):
    """A number there was a 500 (TypeError); a string was read character by character, an object by its keys."""
    with pytest.raises(RequestError) as refused:
        chat_messages([item, {"role": "user", "content": "[greet]"}], None)
    assert refused.value.param == param


@pytest.mark.parametrize(("fields", "param"), [
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "[greet]"}, IMAGE]}]},
     "input[0].content[1]"),  # a text-only model: the chat layer named messages[0].content[1]
    ({"instructions": "Be brief.", "input": [{"role": "user", "content": "[greet]"},
                                             {"role": "user", "content": [IMAGE]}]}, "input[1].content[0]"),
    ({"input": [{"role": "user", "content": "[weather]"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{not json"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]}, "input[1].arguments"),
    ({"input": [{"role": "user", "content": "[weather]"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather",
                 "arguments": '{"city": "Paris", "city": "Oslo"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]}, "input[1].arguments"),
    ({"input": [{"role": "user", "content": "[weather]"},
                {"type": "function_call", "call_id": "c1", "name": "get weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]}, "input[1].name"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"max_output_tokens": 5000}, "max_output_tokens"),  # over max_model_len: the engine names max_tokens
])
def test_errors_the_chat_layer_finds_name_the_responses_fields(server, fields, param):
    body = {"model": "tiny", "input": "[greet]", **fields}
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "messages" not in error["message"], error


def test_a_renamed_error_keeps_the_other_fields_it_quotes():
    """reasoning_effort is reasoning.effort here, but chat_template_kwargs.reasoning_effort is a field the request has
    under that very name: the message must not send the user looking for chat_template_kwargs.reasoning.effort."""
    error = RequestError("reasoning_effort is given twice with different values ('low' and "
                         "chat_template_kwargs.reasoning_effort='high'); give it once", param="reasoning_effort")
    renamed = responses_error(error, [])
    assert renamed.param == "reasoning.effort"
    assert str(renamed) == ("reasoning.effort is given twice with different values ('low' and "
                            "chat_template_kwargs.reasoning_effort='high'); give it once")


def test_an_output_item_is_found_by_its_id_until_its_response_is_forgotten():
    """item_reference inputs read the store by an output item's id, which it looks up (an agent sends every earlier
    item as one, and a scan read the whole store for each): replaced, deleted, evicted or expired, the item is gone."""
    now = [0.0]
    store = ResponseStore(max_bytes=2_000, max_age_s=10, clock=lambda: now[0])

    def put(response_id, *item_ids):
        output = [{"id": item_id, "type": "message", "content": []} for item_id in item_ids]
        store.put(response_id, output, {"id": response_id, "output": output})

    put("r1", "msg_1", "fc_1")
    put("r2", "msg_2")
    assert store.output_item("fc_1")["id"] == "fc_1" and store.output_item("msg_2")["id"] == "msg_2"
    put("r1", "msg_3")  # a later response under r1's id replaces it
    assert store.output_item("fc_1") is None and store.output_item("msg_3")["id"] == "msg_3"
    assert store.delete("r2") and store.output_item("msg_2") is None
    for n in range(40):  # the oldest go once the store is full
        put(f"r{n + 10}", f"msg_{n + 10}")
    assert store.output_item("msg_3") is None and store.output_item("msg_49")["id"] == "msg_49"
    now[0] = 11.0
    assert store.output_item("msg_49") is None and not store._output_items


def test_the_store_is_bounded_by_size_and_age():
    now = [0.0]
    store = ResponseStore(max_bytes=200, max_age_s=10, clock=lambda: now[0])
    for i in range(5):
        store.put(f"r{i}", [{"text": "x" * 50}], {"id": f"r{i}"})
    assert store.get("r0") is None and store.get("r4") is not None and len(store) < 5
    now[0] = 11.0
    assert store.get("r4") is None and len(store) == 0
    store.put("r5", [{"text": "x" * 50}], {"id": "r5"})
    assert store.delete("r5") and not store.delete("r5") and store.get("r5") is None
    for i in range(3):  # the deleted one's bytes were given back: two fit again
        store.put(f"s{i}", [{"text": "x" * 50}], {"id": f"s{i}"})
    assert store.get("s1") is not None and store.get("s2") is not None


def test_a_response_continuing_one_forgotten_meanwhile_keeps_and_counts_its_conversation():
    """A response continues the one it read, even if that one was deleted (or evicted) while it was generated: the
    items it continues are kept and counted again for as long as it is stored, and given back with it."""
    store = ResponseStore(max_bytes=10_000, max_age_s=10)
    store.put("a", [{"text": "question"}, {"text": "answer"}], {"id": "a", "output": [{"text": "answer"}]})
    read = store.get("a")
    assert store.delete("a") and store.size_bytes == 0
    store.put("b", [{"text": "again"}, {"text": "reply"}], {"id": "b", "output": [{"text": "reply"}]}, read)
    assert store.get("b").items == [{"text": "question"}, {"text": "answer"}, {"text": "again"}, {"text": "reply"}]
    assert store.get("b").input_items == store.get("b").items[:3]
    kept = store.get("b")  # a's items counted again, its response object not (a stays deleted)
    assert store.get("a") is None and store.size_bytes == read.segment.size_bytes + kept.size_bytes + \
        kept.segment.size_bytes
    assert store.delete("b") and store.size_bytes == 0


def test_the_store_says_whether_it_kept_a_response():
    """put is False for a response larger than the store, and for one whose conversation is; the answer says
    `store: false` by it."""
    store = ResponseStore(max_bytes=300, max_age_s=10)
    item = {"id": "msg_1", "role": "user", "content": "x" * 100}
    assert store.put("a", [item], {"id": "a", "output": []})
    assert not store.put("big", [{**item, "content": "x" * 300}], {"id": "big", "output": []})
    assert store.get("a") is not None and store.get("big") is None
    held = store.size_bytes
    assert not store.put("b", [{**item, "id": "msg_2"}], {"id": "b", "output": []}, store.get("a"))
    assert store.get("b") is None and store.get("a") is not None and store.size_bytes == held


def test_a_response_too_large_with_its_conversation_evicts_no_other():
    """A response that fits the store alone but not with the conversation it continues is refused before anything
    is evicted: it evicted every other stored response, then itself, and the store was left empty."""
    store = ResponseStore(max_bytes=2_000, max_age_s=10)

    def put(response_id: str, text_bytes: int, previous=None) -> bool:
        return store.put(response_id, [{"text": "x" * text_bytes}], {"id": response_id}, previous)

    assert put("a", 900) and put("x", 200) and put("y", 200)
    assert not put("c", 1_200, store.get("a"))
    assert [response_id for response_id in ("a", "x", "y", "c") if store.get(response_id)] == ["a", "x", "y"]
    assert put("d", 500, store.get("a"))  # one that fits with its conversation evicts the oldest it must
    assert store.get("d").items == [{"text": "x" * 900}, {"text": "x" * 500}] and store.size_bytes <= 2_000


def test_a_continuation_renders_the_images_a_response_read_and_lists_them_as_sent():
    """An image named by a path or URL is kept as the bytes it was read as (`images_read`), which the responses
    continuing its response render as a data: URL and the store counts as their length: kept as base64 text, it was
    counted at 4/3 of the file, and a response whose image fitted the store was dropped. input_items lists it as
    sent."""
    data = bytes(range(256)) * 8
    store = ResponseStore(max_bytes=2_600, max_age_s=10)
    sent = [{"id": "msg_1", "role": "user", "content": [{"type": "input_image", "image_url": "/shots/now.png"}]},
            {"id": "msg_2", "role": "assistant", "content": "a cat"}]
    read = [{**sent[0], "content": [{"type": "input_image", "image_url": "data:application/octet-stream;base64,"
                                     + base64.b64encode(data).decode()}]}, sent[1]]
    response = {"id": "a", "output": [sent[1]]}
    store.put("a", sent, response, images_read={(0, "content", 0): data})
    kept = store.get("a")
    assert kept is not None and kept.rendered_items == read and kept.items == sent and kept.input_items == sent[:1]
    assert kept.segment.size_bytes == len(json.dumps(sent)) + len(data)
    assert store.size_bytes == kept.segment.size_bytes + len(json.dumps(response))
    store.put("b", [{"id": "msg_3", "role": "user", "content": "and?"}], {"id": "b", "output": []}, kept)
    assert store.get("b").rendered_items == [*read, {"id": "msg_3", "role": "user", "content": "and?"}]


def test_an_image_read_from_a_path_is_kept_by_where_it_is_in_the_items():
    """images_read says where in the request's own items each part read from a path or URL is (by its chat part): a
    user message's content, a function_call_output's output (the chain's images are their data already)."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "[greet]"},
                                          {"type": "input_image", "image_url": "/shots/a.png", "detail": "low"}]},
             {"type": "function_call", "call_id": "c1", "name": "snap", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": [{**IMAGE, "image_url": "/shots/b.png"}]}]
    sources: list[MessageSource] = []
    chat_messages(items, "Be brief.", sources)
    read = images_read(sources, {(1, 1): b"\x89PNG", (3, 0): b"GIF8"})
    assert read == {(0, "content", 1): b"\x89PNG", (2, "output", 0): b"GIF8"}
    assert images_read(sources, {}) == {}


def test_an_expired_response_lends_no_reasoning_item_by_its_id():
    """A reasoning item sent back without its text is filled from the stored item of its id; once its response has
    expired, that text is forgotten with it (the lookup read responses past max_age_s that no `get` had evicted)."""
    now = [0.0]
    store = ResponseStore(max_bytes=10_000, max_age_s=10, clock=lambda: now[0])
    reasoning = {"id": "rs_1", "type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}]}
    store.put("r1", [reasoning], {"id": "r1", "output": [reasoning]})
    assert store.output_item("rs_1") == reasoning
    now[0] = 11.0
    assert store.output_item("rs_1") is None and len(store) == 0


def test_a_response_stored_under_an_id_replaces_the_one_it_had():
    """A client's `request_id` may name two responses: the later is stored, in the earlier's bytes and age (the
    store's size was counted twice, and the replaced one's age kept its place among the oldest)."""
    now = [0.0]
    store = ResponseStore(max_bytes=200, max_age_s=10, clock=lambda: now[0])
    for _ in range(5):
        store.put("same", [{"text": "x" * 50}], {"id": "same"})
    store.put("other", [{"text": "x" * 50}], {"id": "other"})
    assert store.get("same") is not None and store.get("other") is not None
    now[0] = 6.0
    store.put("other-2", [{"text": "y"}], {"id": "other-2"})
    store.put("same", [{"text": "z"}], {"id": "same"})
    now[0] = 12.0  # the first ones expired; the same id stored at 6 has not
    assert store.get("same").items == [{"text": "z"}] and store.get("other-2") is not None
    store.put("same", [{"text": "x" * 500}], {"id": "same"})  # too large to keep: the id no longer names the old one
    assert store.get("same") is None


def _failing_constraint_body(server) -> dict:
    """A request whose text.format constraint the model's answer breaks once it has begun (it spells `<|`)."""
    server.engine.engine.runner.add("[marker]", ' to=user<|message|>"b')
    text = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": r"^[ab]<\|x$"}}}
    return {"model": "tiny", "input": "[marker]", "temperature": 0, "text": text, **EXTRA}


def test_a_constraint_that_fails_while_generating_names_the_responses_field(server):
    """The answer may begin otherwise, so the constraint is not refused up front; once it spells `<|` the request
    fails as its own fault, naming `text.format.schema` (the chat layer's name for it is response_format's)."""
    body = _failing_constraint_body(server)
    response = httpx.post(server.base_url + "/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "text.format.schema"
    with httpx.stream("POST", server.base_url + "/responses", json={**body, "stream": True}, timeout=30) as events:
        lines = [line for line in events.iter_lines() if line.startswith("data: ")]
    (error,) = [json.loads(line[6:]) for line in lines if '"type":"error"' in line]
    assert (error["code"], error["param"]) == ("invalid_request_error", "text.format.schema")


def test_a_failed_response_s_error_code_says_whose_fault_it_was_as_openai_s_codes_do(server):
    """A failed response's error.code was always `server_error`, even where the request itself was at fault. It is
    OpenAI's `invalid_prompt` for a constraint the answer broke (with the param and type the error event names), and
    `server_error` for a failure of the server's (a forced call cut short: type tool_choice_unsatisfied)."""
    def failed_error(body):
        with httpx.stream("POST", server.base_url + "/responses", json={**body, "stream": True}, timeout=30) as events:
            lines = [line[6:] for line in events.iter_lines() if line.startswith("data: ")]
        failed = pydantic.TypeAdapter(ResponseStreamEvent).validate_python(json.loads(lines[-1]))
        return failed.type, failed.response.error.model_dump()

    kind, error = failed_error(_failing_constraint_body(server))
    assert (kind, error["code"], error["type"], error["param"]) == (
        "response.failed", "invalid_prompt", "invalid_request_error", "text.format.schema")
    forced = {"model": "tiny", "temperature": 0, **EXTRA, "input": "[greet] Hello!", "tools": [WEATHER_TOOL],
              "tool_choice": "required", "max_output_tokens": fewest_forced_call_tokens(server, [WEATHER_TOOL])}
    kind, error = failed_error(forced)
    assert (kind, error["code"], error["type"], error["param"]) == (
        "response.failed", "server_error", "tool_choice_unsatisfied", "tool_choice")


def test_a_stored_stream_that_failed_is_retrieved_as_failed_and_not_continued(server):
    """A streamed response that failed midway was never stored: its id came with response.created, and GET answered
    404 once it had failed. It is kept as its response.failed event shows it, as OpenAI keeps a failed response; a
    request continuing it is a 400 naming previous_response_id (its last item may be cut anywhere)."""
    body = _failing_constraint_body(server)
    with httpx.stream("POST", server.base_url + "/responses", json={**body, "stream": True}, timeout=30) as events:
        lines = [json.loads(line[6:]) for line in events.iter_lines() if line.startswith("data: ")]
    failed = lines[-1]
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    retrieved = httpx.get(f"{server.base_url}/responses/{failed['response']['id']}", timeout=30)
    assert retrieved.status_code == 200 and retrieved.json() == failed["response"]
    continued = httpx.post(server.base_url + "/responses", timeout=30, json={
        "model": "tiny", "input": "[greet] Hi", "previous_response_id": failed["response"]["id"], **EXTRA})
    assert continued.status_code == 400 and continued.json()["error"]["param"] == "previous_response_id"
    assert "failed" in continued.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/responses", "/responses/input_tokens"])
def test_tool_schemas_slow_to_check_do_not_hold_the_other_requests(server, monkeypatch, path):
    """A Responses request's tool schemas were checked on the event loop: a body of a thousand strict tools held every
    other request and stream for 6 s (chat checks them off it, where it renders its prompt)."""
    check = responses_schemas.check_tool_parameters
    checking, health_answered = threading.Event(), threading.Event()

    def slow_check(*args, **kwargs):  # a check that ends only once /health has answered while it ran
        checking.set()
        health_answered.wait(timeout=60)
        return check(*args, **kwargs)

    monkeypatch.setattr(responses_schemas, "check_tool_parameters", slow_check)
    body = {"model": "tiny", "input": "[greet] Hi", "tools": [WEATHER_TOOL], **EXTRA}
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(httpx.post, server.base_url + path, json=body, timeout=120)
        try:
            assert checking.wait(timeout=60), slow.result().text
            # held by the check, the event loop would leave /health unanswered until the check's minute was up
            assert httpx.get(server.url + "/health", timeout=15).status_code == 200
        finally:
            health_answered.set()
        assert slow.result().status_code == 200, slow.result().text


def test_a_turn_cut_while_reasoning_is_rendered_back_as_its_reasoning_alone(server, client):
    """A response that max_output_tokens cut while the model reasoned holds one reasoning item. Continued, it rendered
    back as that reasoning then an empty answer to the user (`to=user<|message|><|eot|>`), a message the model never
    wrote; it renders as the reasoning message alone, ending <|eom|> as §2.1 ends a message to `self`, with
    previous_response_id or with its items sent back in `input` (then the model goes on with its turn)."""
    runner = server.engine.engine.runner
    first = _create(client, input="[greet] Hello!", max_output_tokens=6)
    (reasoning,) = first.output
    assert (reasoning.type, first.status) == ("reasoning", "incomplete")
    turn = f" to=self<|message|>{reasoning.content[0].text}<|eom|>"
    asked = runner.prompts[-1]
    _create(client, input="[greet] Thanks", previous_response_id=first.id)
    assert runner.prompts[-1] == asked + turn + "<|start|>user<|message|>[greet] Thanks<|eot|><|start|>assistant"
    _create(client, input=[{"role": "user", "content": "[greet] Hello!"}, *first.output])
    assert runner.prompts[-1] == asked + turn + "<|start|>assistant"


def _tokens_of(server, transcript: str, prefix: str) -> int:
    """How many of `transcript`'s tokens spell `prefix`: a max_output_tokens that cuts the turn right after it."""
    tokenizer = server.engine.engine.tokenizer
    ids = tokenizer.encode(transcript)
    return next(n for n in range(len(ids) + 1) if tokenizer.decode(ids[:n]) == prefix)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("key", "transcript", "cut_before", "tools"), [
    ("[two-answers]", " to=user<|message|>First.<|eom|><|start|>assistant to=user<|message|>Second.<|eot|>",
     "Second.", None),
    ("[two-cities]", TWO_CITIES, '<atem:parameter name="city">Oslo', [WEATHER_TOOL]),
], ids=["answers", "calls"])
def test_a_cut_in_the_next_message_before_it_wrote_anything_leaves_the_item_before_it_completed(
        server, client, stream, key, transcript, cut_before, tools):
    """README: items whose message had ended stay `completed`. max_output_tokens ending the output right after the
    next message's header (no text yet), or inside the next call's message before its call started, marked the
    item of the message before it `incomplete`, a whole answer or call a client may then drop."""
    server.engine.engine.runner.add(key, transcript)
    cut = transcript.rindex(cut_before)
    fields = {"input": f"{key} hi", "max_output_tokens": _tokens_of(server, transcript, transcript[:cut])}
    if tools:
        fields["tools"] = tools
    response = list(_create(client, **fields, stream=True))[-1].response if stream else _create(client, **fields)
    assert response.status == "incomplete"
    assert [item.status for item in response.output] == ["completed"]
