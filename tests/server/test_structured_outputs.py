"""Structured outputs and forced tool calls on a random tiny model, which follows no instruction (P-REQ-4..6).

Every answer must parse and validate against its schema (jsonschema), streamed and not, with reasoning and
without, with tools declared; every forced tool choice must return a valid call of an allowed tool. The schemas
bound what the grammar lets the model write (enums, bounded numbers and strings), so a random model finishes
within a few dozen tokens; `thinking_token_budget` bounds its reasoning, which it would never end by itself.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import random
import re
import uuid
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
from server_support import PINNED_DATE, live_server

ANSWER_SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                      "days": {"type": "integer", "minimum": 1, "maximum": 7}},
     "required": ["city", "days"], "additionalProperties": False},
    {"type": "object", "properties": {"mood": {"enum": ["calm", "grey", "stormy"]}, "ok": {"type": "boolean"},
                                      "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 2}},
     "required": ["mood", "ok", "tags"], "additionalProperties": False,
     "$defs": {"tag": {"type": "string", "enum": ["a", "b"]}}},
    {"type": "object", "properties": {"answer": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99},
                                                           {"type": "null"}]}},
     "required": ["answer"], "additionalProperties": False},
]
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look a city up.", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 5},
                   "unit": {"enum": ["c", "f"]}, "detail": {"type": "boolean"}},
    "required": ["city", "days"]}}}
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time.", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}}
TOOLS = [LOOKUP, CLOCK]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny()) as live:
        yield live


def _messages(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Request {i}: answer in JSON."}]


async def _complete(client: openai.AsyncOpenAI, stream: bool, **request: Any) -> dict[str, Any]:
    """The message fields of one choice, collected from a stream or a single response."""
    if not stream:
        response = await client.chat.completions.create(stream=False, **request)
        choice = response.choices[0]
        message = choice.message
        return {"content": message.content, "reasoning": message.model_extra.get("reasoning_content"),
                "calls": [(c.function.name, c.function.arguments) for c in message.tool_calls or []],
                "finish_reason": choice.finish_reason}
    content, reasoning, calls, finish_reason = [], [], {}, None
    async for chunk in await client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append(delta.model_extra.get("reasoning_content") or "")
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
            finish_reason = choice.finish_reason or finish_reason
    return {"content": "".join(content) or None, "reasoning": "".join(reasoning) or None,
            "calls": [tuple(entry) for _, entry in sorted(calls.items())], "finish_reason": finish_reason}


def _gather(server, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(_complete(client, **request) for request in requests))
    return asyncio.run(run())


def test_two_hundred_json_schema_answers_all_parse_and_validate(server):
    # P-REQ-6: reasoning free (here bounded), the answer body constrained, streamed and not, with tools declared
    rng = random.Random(0)
    requests, schemas = [], []
    for i in range(200):
        schema = ANSWER_SCHEMAS[i % len(ANSWER_SCHEMAS)]
        reasoning = i % 2 == 0
        extra = {"chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 12 if reasoning else 0}
        request = {"model": "tiny", "messages": _messages(i), "max_tokens": 120, "seed": rng.randrange(2**31),
                   "stream": i % 4 in (0, 3), "reasoning_effort": "high" if reasoning else "none",
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "answer", "schema": schema, "strict": i % 3 == 0}},
                   "extra_body": extra}
        if i % 5 == 1:  # tools declared, not callable
            request.update(tools=TOOLS, tool_choice="none")
        requests.append(request)
        schemas.append(schema)
    results = _gather(server, requests)
    for schema, result in zip(schemas, results, strict=True):
        assert result["finish_reason"] == "stop", result
        assert result["calls"] == []
        jsonschema.validate(json.loads(result["content"]), schema)
    with_reasoning = [r for r, q in zip(results, requests, strict=True) if q["extra_body"]["thinking_token_budget"]]
    assert sum(r["reasoning"] is not None for r in with_reasoning) >= 20  # the random model does reason
    assert all(r["reasoning"] is None for r in results if r not in with_reasoning)


def test_with_callable_tools_a_turn_is_a_valid_call_or_a_valid_answer(server):
    # tools declared with tool_choice auto: a call is not held to the answer schema, an answer always is
    schema = ANSWER_SCHEMAS[0]
    requests = [{"model": "tiny", "messages": _messages(i), "max_tokens": 200, "seed": i, "stream": i % 2 == 0,
                 "tools": TOOLS, "parallel_tool_calls": False,
                 "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
                 "extra_body": {"chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 6}}
                for i in range(16)]
    results = _gather(server, requests)
    answers = 0
    for result in results:
        if result["calls"]:
            assert result["finish_reason"] == "tool_calls" and result["content"] is None
            ((name, arguments),) = result["calls"]
            jsonschema.validate(json.loads(arguments), PARAMETERS[name])
        else:
            assert result["finish_reason"] == "stop"
            jsonschema.validate(json.loads(result["content"]), schema)
            answers += 1
    assert answers >= 2


def test_strict_tools_hold_calls_to_their_schema_under_auto(server):
    # OpenAI's strict mode: with tool_choice auto the turn may answer or call, but every call follows the schema
    strict_tools = [{"type": "function", "function": {**tool["function"], "strict": True}} for tool in TOOLS]
    requests = [{"model": "tiny", "messages": _messages(i), "max_tokens": 120, "seed": i, "stream": i % 2 == 0,
                 "tools": strict_tools, "temperature": 1.0,
                 "extra_body": {"chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 4}}
                for i in range(24)]
    results = _gather(server, requests)
    calls = 0
    for result in results:
        complete = result["calls"][:-1] if result["finish_reason"] == "length" else result["calls"]
        for name, arguments in complete:
            jsonschema.validate(json.loads(arguments), PARAMETERS[name])
            calls += 1
    assert calls >= 3  # (a random model calls in some turns and answers in others)


def test_every_forced_tool_choice_returns_a_valid_call_of_an_allowed_tool(server):
    # P-REQ-4/5: `required` or named, parallel or not, streamed or not: valid by construction
    named_clock = {"type": "function", "function": {"name": "clock"}}
    requests = []
    for i in range(36):
        choice = ("required", named_clock, {"type": "function", "function": {"name": "lookup"}})[i % 3]
        requests.append({"model": "tiny", "messages": _messages(i), "max_tokens": 400, "seed": i,
                         "stream": i % 2 == 1, "tools": TOOLS, "tool_choice": choice,
                         "parallel_tool_calls": i % 4 < 2,
                         "extra_body": {"chat_template_kwargs": PINNED_DATE,
                                        "thinking_token_budget": 8 if i % 5 else 0}})
    results = _gather(server, requests)
    for request, result in zip(requests, results, strict=True):
        choice = request["tool_choice"]
        allowed = {"lookup", "clock"} if choice == "required" else {choice["function"]["name"]}
        assert result["content"] is None and result["calls"]
        complete = result["calls"]
        if request["parallel_tool_calls"]:
            # a random model may chain calls until max_tokens cuts the last one short (P-ATEM-5 keeps it)
            assert result["finish_reason"] in ("tool_calls", "length"), result
            if result["finish_reason"] == "length":
                complete = complete[:-1]
        else:
            assert result["finish_reason"] == "tool_calls", result
            assert len(complete) == 1
        assert complete
        assert {name for name, _ in result["calls"]} <= allowed
        for name, arguments in complete:
            jsonschema.validate(json.loads(arguments), PARAMETERS[name])


FORMATTED = {"type": "function", "function": {"name": "book", "description": "Book a slot.", "strict": True,
                                             "parameters": {"type": "object", "properties": {
    "id": {"type": "string", "format": "uuid"}, "day": {"type": "string", "format": "date"},
    "host": {"type": "string", "format": "ipv4"}, "currency": {"type": "string", "pattern": "^[A-Z]{3}$"}},
    "required": ["id", "day", "host", "currency"], "additionalProperties": False}}}


def test_a_strict_tools_string_formats_and_patterns_hold_in_the_calls_arguments(server):
    # raw string values took any text: a random model's call carried no UUID, date or address at all
    requests = [{"model": "tiny", "messages": _messages(i), "max_tokens": 400, "seed": i, "stream": i % 2 == 1,
                 "tools": [FORMATTED], "tool_choice": "required", "parallel_tool_calls": False, "temperature": 1.0,
                 "extra_body": {"chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 0}} for i in range(6)]
    for result in _gather(server, requests):
        assert result["finish_reason"] == "tool_calls", result
        (name, arguments), = result["calls"]
        values = json.loads(arguments)
        uuid.UUID(values["id"])
        datetime.date.fromisoformat(values["day"])
        assert values["host"] == str(ipaddress.IPv4Address(values["host"]))
        assert re.fullmatch("[A-Z]{3}", values["currency"]), values


SHAPED = {"type": "function", "function": {"name": "shaped", "description": "Schemas the call grammar resolves.",
                                           "parameters": {"$ref": "#/$defs/args", "$defs": {
    "City": {"type": "string", "enum": ["Oslo", "Rome"]},
    "args": {"allOf": [{"type": "object", "properties": {
        "level": {"allOf": [{"type": "integer", "minimum": 0, "maximum": 9}]},
        "mode": {"enum": ["low", "high", 1, None]},
        "op": {"enum": ["a<b", "c"]},
        "note": {"type": ["string", "null"], "maxLength": 5},
        # as pydantic writes Optional[Literal[...]], a described $ref, and a union with a non-string member
        "unit": {"anyOf": [{"enum": ["c", "f"], "type": "string"}, {"type": "null"}]},
        "city": {"allOf": [{"$ref": "#/$defs/City"}], "description": "where"},
        "code": {"oneOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}]}},
        "required": ["level", "mode", "op", "note", "unit", "city", "code"]},
        {"properties": {"extra": {"type": "boolean"}}, "required": ["extra"]}]}}}}}


def test_forced_calls_follow_refs_all_of_mixed_enums_and_nullable_bounds(server):
    schema = {**SHAPED["function"]["parameters"]["$defs"]["args"], "$defs": SHAPED["function"]["parameters"]["$defs"]}
    requests = [{"model": "tiny", "messages": _messages(i), "max_tokens": 200, "seed": i, "tools": [SHAPED],
                 "stream": i % 2 == 0,
                 "tool_choice": "required", "parallel_tool_calls": False, "temperature": 1.0,
                 "extra_body": {"chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 0}}
                for i in range(12)]
    for result in _gather(server, requests):
        assert result["finish_reason"] == "tool_calls", result
        ((name, arguments),) = result["calls"]
        jsonschema.validate(json.loads(arguments), schema)
        assert "extra" in json.loads(arguments)


def test_vllm_fields_constrain_the_answer_too(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    base = {"model": "tiny", "messages": _messages(0), "max_tokens": 60}
    budget = {"chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 0}
    cases = [({"structured_outputs": {"choice": ["yes", "no"]}}, lambda text: text in ("yes", "no")),
             ({"guided_choice": ["left", "right"]}, lambda text: text in ("left", "right")),
             ({"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}, lambda text: len(text) == 6 and text[3] == "-"),
             ({"guided_regex": "(ab)+c"}, lambda text: text.endswith("c")),
             ({"guided_json": ANSWER_SCHEMAS[2]}, lambda text: "answer" in json.loads(text)),
             ({"guided_grammar": 'start: "x" DIGIT\nDIGIT: /[0-9]/'}, lambda text: text[0] == "x" and len(text) == 2)]
    for i, (fields, check) in enumerate(cases):
        response = client.chat.completions.create(**base, seed=i, extra_body={**budget, **fields})
        assert check(response.choices[0].message.content), (fields, response.choices[0].message.content)
    # any object: its keys are unbounded strings, which a random model may not close within max_tokens
    for fields in ({"response_format": {"type": "json_object"}}, {"structured_outputs": {"json_object": True}}):
        for seed in range(3):
            response = client.chat.completions.create(**base, seed=seed, extra_body={**budget, **fields})
            content, finish_reason = response.choices[0].message.content, response.choices[0].finish_reason
            assert content.startswith("{")
            if finish_reason == "stop":
                assert isinstance(json.loads(content), dict)


def test_completions_constrain_the_raw_text(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    schema = ANSWER_SCHEMAS[1]
    for stream in (False, True):
        kwargs = {"model": "tiny", "prompt": "The weather:", "max_tokens": 80, "seed": 3,
                  "extra_body": {"response_format": {"type": "json_schema",
                                                     "json_schema": {"name": "w", "schema": schema}}}}
        if stream:
            text = "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **kwargs)
                           if chunk.choices)
        else:
            response = client.completions.create(**kwargs)
            assert response.choices[0].finish_reason == "stop"
            text = response.choices[0].text
        jsonschema.validate(json.loads(text), schema)
    text = client.completions.create(model="tiny", prompt="x", max_tokens=10,
                                     extra_body={"structured_outputs": {"regex": "[a-c]{4}"}}).choices[0].text
    assert len(text) == 4 and set(text) <= set("abc")


def test_vllms_other_structured_outputs_fields_are_taken_where_they_change_nothing(server):
    """As StructuredOutputsParams takes them in LLM.generate (they were 400s as unknown fields): vLLM's defaults pass,
    other values are refused naming the field and saying what Glimmer does instead."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    defaults = {"disable_any_whitespace": False, "disable_additional_properties": False, "whitespace_pattern": None,
                "structural_tag": None, "disable_fallback": True}
    text = client.completions.create(model="tiny", prompt="x", max_tokens=5, extra_body={
        "structured_outputs": {"choice": ["yes", "no"], **defaults}}).choices[0].text
    assert text in ("yes", "no")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="tiny", messages=_messages(0), max_tokens=5, extra_body={
            "structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": True}})
    assert raised.value.body["param"] == "structured_outputs.disable_any_whitespace"
    assert "json.dumps" in raised.value.body["message"]


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
    # OpenAI's rule for the name: a-z, A-Z, 0-9, '_' and '-', at most 64
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "my answer", "schema": {}}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a" * 65, "schema": {}}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "description": 5}}},
     "response_format.json_schema.description"),  # was taken, as any value
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(open"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
    ({"guided_json": "{nope"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": 5}, "guided_json"),  # not `guided_json.str`, the union member pydantic tried last
    ({"structured_outputs": {"json": [1]}}, "structured_outputs.json"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
    ({"thinking_token_budget": -1}, "thinking_token_budget"),
    ({"structured_outputs": {"json": "[" * 3000 + "]" * 3000}}, "structured_outputs.json"),  # (deeper than json's
    ({"guided_json": "[" * 3000 + "]" * 3000}, "guided_json"),                               # recursion limit)
    # a chat answer spelling a framing marker would end there (P-CHAN-6); completions take it
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"const": "<|eot|>"}}}},
     "response_format.json_schema.schema"),
    ({"structured_outputs": {"choice": ["a<|start|>b", "c"]}}, "structured_outputs.choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"enum": ["a</atem:parameter>b", "c<|d"]}}, "required": ["x"]}}}],
      "tool_choice": "required"}, "tools"),  # no member can be written as a raw value
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": "x"}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters"),
])
def test_an_invalid_constraint_is_a_400_naming_the_field(server, fields, param):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="tiny", messages=_messages(0), max_tokens=5, extra_body=fields)
    assert raised.value.body["param"] == param, raised.value.body
    client.chat.completions.create(model="tiny", messages=_messages(0), max_tokens=2)  # the engine lives on


@pytest.mark.parametrize("name", ["Answer_v2-final", "a" * 64, "0"])
def test_a_response_format_name_openai_takes_is_taken(server, name):
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": _messages(0), "max_tokens": 30, "thinking_token_budget": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": {"enum": ["ok"]}}}})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == '"ok"'


@pytest.mark.parametrize(("fields", "named"), [
    ({"thinking_token_budget": 3}, "thinking_token_budget"),
    ({"tools": [{**CLOCK, "function": {**CLOCK["function"], "strict": True}}], "tool_choice": "auto"}, "strict tools"),
    ({"tools": TOOLS, "tool_choice": "required"}, "required or named tool choice"),
    ({"response_format": {"type": "json_object"}}, "structured outputs"),
])
def test_min_tokens_beside_a_grammar_is_refused_naming_what_makes_the_grammar(server, fields, named):
    """thinking_token_budget and a strict tool under `auto` make a grammar too, but the 400 said "cannot be combined
    with structured outputs or a forced tool choice": neither of which the request had."""
    body = {"model": "tiny", "messages": _messages(0), "max_tokens": 80, "min_tokens": 2, **fields}
    response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "min_tokens" and named in error["message"], error


ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "required": ["a"],
           "$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/a"}}, "required": ["b"]}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_a_required_parameter_only_an_endless_value_meets_is_a_400_naming_it(server, choice):
    """The grammar engine took a `$ref` cycle with no way out, and a forced call of it was written until max_tokens
    cut it short: a 500 "tool_choice_unsatisfied". response_format refused the same schema only once generating."""
    tools = [CLOCK, {"type": "function", "function": {"name": "f", "parameters": ENDLESS}}]
    body = {"model": "tiny", "messages": _messages(0), "max_tokens": 200, "tools": tools, "tool_choice": choice}
    response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tools[1].function.parameters.properties.a"
    body = {"model": "tiny", "messages": _messages(0), "max_tokens": 200, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": ENDLESS}}}
    response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "response_format.json_schema.schema.properties.a"


BAD_PARAMETERS = [{"type": "object", "properties": {"city": {"type": "nonsense"}}, "required": ["city"]},
                  {"type": "object", "properties": {"city": {"$ref": "#/$defs/missing"}}, "required": ["city"]},
                  {"type": "nonsense"}]


@pytest.mark.parametrize("parameters", BAD_PARAMETERS)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}, "auto", "none"])
def test_an_invalid_tool_schema_is_a_400_naming_the_parameters_under_any_tool_choice(server, parameters, choice):
    """As the same schema in response_format is: a string parameter of an unknown type or a dangling `$ref` was
    read as "any raw text" and a forced call went ahead; under auto and none the schema was never looked at."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    tools = [CLOCK, {"type": "function", "function": {"name": "f", "parameters": parameters}}]
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="tiny", messages=_messages(0), max_tokens=5, tools=tools,
                                       tool_choice=choice)
    assert raised.value.body["param"] == "tools[1].function.parameters", raised.value.body
    assert raised.value.body["message"].startswith("tools[1].function.parameters: the grammar engine refused it")


class _Tagging(pydantic.BaseModel):
    tags: set[Literal["red", "blue"]]  # pydantic writes `uniqueItems`, a keyword the grammar engine lacks


TAGGER = {"type": "function", "function": {"name": "tagger", "description": "Tag it.",
                                           "parameters": _Tagging.model_json_schema()}}


@pytest.mark.parametrize("fields", [
    {"tool_choice": "required"}, {"tool_choice": {"type": "function", "function": {"name": "tagger"}}},
    {"thinking_token_budget": 0}, {"response_format": {"type": "json_object"}}])
def test_a_tool_schema_with_keywords_the_engine_does_not_implement_serves_grammar_backed_turns(server, fields):
    """Such keywords made every grammar-backed turn a 400 quoting the turn grammar; a non-strict tool ignores them."""
    assert "uniqueItems" in json.dumps(TAGGER)
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": _messages(0), "max_tokens": 60, "seed": 0, "tools": [TAGGER, CLOCK],
        "parallel_tool_calls": False, "chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 0, **fields})
    assert response.status_code == 200, response.text
    if "tool_choice" in fields:
        ((call),) = response.json()["choices"][0]["message"]["tool_calls"]
        assert set(json.loads(call["function"]["arguments"])["tags"]) <= {"red", "blue"}


def test_a_responses_forced_call_of_a_tool_with_keywords_the_engine_does_not_implement_is_served(server):
    called = []
    for seed in range(4):
        response = httpx.post(server.base_url + "/responses", timeout=60, json={
            "model": "tiny", "input": "Tag it.", "max_output_tokens": 60, "seed": seed, "tool_choice": "required",
            "tools": [{"type": "function", **TAGGER["function"]}], "parallel_tool_calls": False})
        if response.status_code == 500:  # reasoning is free here: a random model may spend max_output_tokens on it
            assert response.json()["error"]["type"] == "tool_choice_unsatisfied", response.text
            continue
        assert response.status_code == 200, response.text
        called += [item["name"] for item in response.json()["output"] if item["type"] == "function_call"]
    assert called and set(called) == {"tagger"}


PASSWORD = {"type": "function", "function": {"name": "set_password", "description": "Set the password.", "parameters": {
    "type": "object", "properties": {"password": {"type": "string", "pattern": "^(?=.*[A-Z])(?=.*\\d).{8,}$",
                                                   "maxLength": 12}},
    "required": ["password"]}}}


@pytest.mark.parametrize("choice", ["auto", "none", "required",
                                    {"type": "function", "function": {"name": "set_password"}}])
def test_a_pattern_beyond_the_grammar_engine_is_a_hint_in_a_non_strict_tool_and_a_400_in_a_strict_one(server, choice):
    """A lookahead is ECMA-262, as JSON Schema's `pattern` is, but beyond the grammar engine's regexes: the tool's
    every request was a 400 quoting the engine's regex parse error, under auto too, where no grammar runs."""
    body = {"model": "tiny", "messages": _messages(0), "max_tokens": 60, "seed": 0, "tool_choice": choice,
            "chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 0}
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={**body, "tools": [PASSWORD]})
    assert response.status_code == 200, response.text
    if choice not in ("auto", "none"):
        ((call),) = response.json()["choices"][0]["message"]["tool_calls"]
        assert set(json.loads(call["function"]["arguments"])) == {"password"}
    strict = {"type": "function", "function": {**PASSWORD["function"], "strict": True}}
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={**body, "tools": [strict]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tools[0].function.parameters"


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
def test_a_strict_tool_with_keywords_the_engine_does_not_implement_is_a_400_naming_them(server, choice):
    strict = {"type": "function", "function": {**TAGGER["function"], "strict": True}}
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": _messages(0), "max_tokens": 5, "tools": [CLOCK, strict], "tool_choice": choice})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools[1].function.parameters"
    assert '"uniqueItems"' in error["message"] and "<|" not in error["message"] and "atem" not in error["message"]


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_a_tool_whose_parameters_are_not_an_object_schema_is_a_400_naming_them(server, choice):
    """Forced calls of `{"type": "string"}` parameters came back as `{}`, which that schema refuses."""
    tools = [CLOCK, {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": _messages(0), "max_tokens": 5, "tools": tools, "tool_choice": choice})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools[1].function.parameters" and '"object"' in error["message"]


def test_constrained_text_holds_exactly_what_the_grammar_allows(server):
    """Text a grammar spells out is text, special-token spellings included (on completions); a choice among
    thousands is one of them; a chat answer keeps ATEM-like text as written (P-CHAN-2)."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    eot = {"type": "object", "properties": {"tag": {"const": "<|eot|>"}}, "required": ["tag"],
           "additionalProperties": False}
    for seed in range(3):
        response = client.completions.create(model="tiny", prompt="x", max_tokens=40, seed=seed, extra_body={
            "structured_outputs": {"json": eot}})
        assert json.loads(response.choices[0].text) == {"tag": "<|eot|>"}, response.choices[0].text
        assert response.choices[0].finish_reason == "stop"
    choices = [f"c{i}" for i in range(3000)]
    for seed in range(3):
        text = client.completions.create(model="tiny", prompt="x", max_tokens=20, seed=seed, extra_body={
            "structured_outputs": {"choice": choices}}).choices[0].text
        # (a choice that may go on, c5 → c50, ends with a stop token, which completions text keeps)
        assert text.removesuffix("<|eot|>").removesuffix("<|end_of_text|>") in choices, text
    atem = {"type": "object", "properties": {"tag": {"const": '<atem:invoke name="'}}, "required": ["tag"],
            "additionalProperties": False}
    for stream in (False, True):
        result = _gather(server, [{"model": "tiny", "messages": _messages(0), "max_tokens": 60, "seed": 1,
                                   "stream": stream, "response_format": {
                                       "type": "json_schema", "json_schema": {"name": "a", "schema": atem}},
                                   "extra_body": {"chat_template_kwargs": PINNED_DATE, "thinking_token_budget": 0}}])
        assert json.loads(result[0]["content"]) == {"tag": '<atem:invoke name="'}, result


def _server_errors(server) -> float:
    return sum(value for name, value in server.metrics().items()
               if name.startswith("glimmer_requests_total") and 'status="500"' in name)


@pytest.mark.parametrize(("fields", "param"), [
    ({"structured_outputs": {"regex": r"Hi <\|eot\|>"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"regex": "Hi <[|]start[|]>user"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": 'root ::= "a<" "|b"'}}, "structured_outputs.grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": r"^<\|x$"}}}}, "response_format.json_schema.schema"),
])
def test_a_chat_answer_that_must_spell_a_framing_marker_is_a_400_before_it_runs(server, fields, param):
    """A constraint can spell `<|` past the check of its text (`<\\|`, `<[|]`, two literals): the parser would read
    the answer's text as framing and cut it (P-CHAN-6). Every answer of these begins by spelling it: they failed
    mid-generation with a 500 (a 200 and an error event, streamed); they are refused before generation."""
    errors = _server_errors(server)
    for stream in (False, True):
        response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
            "model": "tiny", "messages": _messages(0), "max_tokens": 40, "chat_template_kwargs": PINNED_DATE,
            "thinking_token_budget": 0, "stream": stream, **fields})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param
        assert "a chat answer cannot contain '<|'" in response.json()["error"]["message"]
    completion = httpx.post(server.base_url + "/completions", timeout=60, json={
        "model": "tiny", "prompt": "x", "max_tokens": 20, "structured_outputs": {"regex": r"Hi <\|eot\|>"}})
    assert completion.json()["choices"][0]["text"] == "Hi <|eot|>"  # raw text may spell it
    assert _server_errors(server) == errors


def test_a_chat_answer_that_spells_a_framing_marker_while_generating_fails_as_the_requests_fault(server):
    """An answer that may begin otherwise (`[HJ]i`) is not refused up front; when it spells `<|` the request fails
    rather than come back cut: a 400 naming the field (an error event of the same type once streaming), never a
    500, for it is the constraint's fault, not the server's."""
    errors = _server_errors(server)
    body = {"model": "tiny", "messages": _messages(0), "max_tokens": 40, "chat_template_kwargs": PINNED_DATE,
            "thinking_token_budget": 0, "structured_outputs": {"regex": r"[HJ]i <\|eot\|>"}}
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "structured_outputs.regex"
    assert "framing marker" in error["message"]
    streamed = {**body, "stream": True}
    with httpx.stream("POST", server.base_url + "/chat/completions", timeout=60, json=streamed) as events:
        assert events.status_code == 200  # the error comes once the answer has begun
        lines = [line for line in events.iter_lines() if line.startswith("data: {")]
    failures = [json.loads(line[6:])["error"] for line in lines if '"error"' in line]
    assert [(f["type"], f["param"]) for f in failures] == [("invalid_request_error", "structured_outputs.regex")]
    assert _server_errors(server) == errors


def test_a_grammar_engine_limit_met_while_generating_fails_as_the_requests_fault(server):
    """A regex past the lexer's limits on a branch the compiler's probe does not take (the `x`s, which the bias
    makes the model write) fails its request when it gets there: a 400 naming the field, not a 500."""
    errors = _server_errors(server)
    x = server.engine.engine.tokenizer.encode_text("x")[0]
    response = httpx.post(server.base_url + "/completions", timeout=60, json={
        "model": "tiny", "prompt": "x", "max_tokens": 20, "logit_bias": {str(x): 100},
        "structured_outputs": {"regex": "(c|x{999999999})"}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "structured_outputs.regex" and "too many expressions" in error["message"]
    refused = httpx.post(server.base_url + "/completions", timeout=60, json={  # past them at the first token:
        "model": "tiny", "prompt": "x", "max_tokens": 20, "structured_outputs": {"regex": "a{1000000}"}})
    assert refused.status_code == 400 and "first token" in refused.json()["error"]["message"]  # refused up front
    assert _server_errors(server) == errors


def test_a_constraint_naming_a_special_token_by_id_is_a_400_not_a_cut_or_framed_answer(server):
    """Lark's `<[N]>` names a token by id, past the check for `<|`: a chat answer `ok<|eot|>more` came back as
    `ok`, finish_reason stop, and `<[start]>` put framing inside the answer; on /v1/completions `<|eot|>` ended the
    text before the grammar was complete, as a normal stop. Each is a 400 naming the field before it runs; raw
    text still takes a special token that does not end it (here `<|eot|>` under `ignore_eos`)."""
    errors = _server_errors(server)
    tokenizer = server.engine.engine.tokenizer
    eot, start, reserved = (tokenizer.require_token_id(t) for t in ("<|eot|>", "<|start|>",
                                                                     "<|reserved_special_token_0|>"))
    for grammar in (f'start: "ok" <[{eot}]> "more"', f'start: "ok" <[{reserved}]> "to=functions.x" <[{start}]> "hi"'):
        response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
            "model": "tiny", "messages": _messages(0), "max_tokens": 40, "chat_template_kwargs": PINNED_DATE,
            "thinking_token_budget": 0, "guided_grammar": grammar})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "guided_grammar" and "cannot contain special tokens" in error["message"]
    body = {"model": "tiny", "prompt": "x", "max_tokens": 20, "guided_grammar": f'start: "ok" <[{eot}]> "more"'}
    refused = httpx.post(server.base_url + "/completions", timeout=60, json=body)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "guided_grammar" and "stop token" in refused.json()["error"]["message"]
    taken = httpx.post(server.base_url + "/completions", timeout=60, json={**body, "ignore_eos": True}).json()
    assert (taken["choices"][0]["text"], taken["choices"][0]["finish_reason"]) == ("ok<|eot|>more", "stop")
    assert _server_errors(server) == errors


@pytest.mark.parametrize("where", ["tools", "response_format"])
@pytest.mark.parametrize(("schema", "named"), [
    ({"type": "string", "minLength": 4, "maxLength": 2}, "minLength 4 is above maxLength 2"),
    ({"type": "number", "minimum": 1, "exclusiveMaximum": 1}, "minimum 1 is not below exclusiveMaximum 1"),
    ({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3},
     "no integer lies between exclusiveMinimum 2 and exclusiveMaximum 3"),
    ({"type": "integer", "minimum": 2.5, "maximum": 2.9}, "no integer lies between minimum 2.5 and maximum 2.9"),
    ({"type": "integer", "minimum": 3, "maximum": 5, "multipleOf": 7},
     "no integer multiple of multipleOf 7 lies between minimum 3 and maximum 5")])
def test_a_strict_schema_whose_bounds_no_value_meets_is_a_400_naming_the_field(server, where, schema, named):
    """A strict tool's `minLength` 4 with `maxLength` 2 was a 400 quoting Glimmer's own regex `(.|\\n){4,2}`; an
    integer between 2 and 3 (exclusive), or a multiple of 7 between 3 and 5, a 400 naming only the schema's root in
    the grammar engine's words ("required property 'x' is unsatisfiable"). A tool's optional parameter counts (a call
    may write it); an answer's optional property does not (`{}` meets the schema: the next test)."""
    parameters = {"type": "object", "properties": {"x": schema}, "required": [] if where == "tools" else ["x"]}
    fields = ({"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters, "strict": True}}],
               "tool_choice": "required"} if where == "tools" else
              {"response_format": {"type": "json_schema",
                                   "json_schema": {"name": "a", "schema": parameters, "strict": True}}})
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": _messages(0), "max_tokens": 5, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    field = ("tools[0].function.parameters" if where == "tools" else "response_format.json_schema.schema") \
        + ".properties.x"
    assert error["param"] == field and error["message"].startswith(f"{field}: {named}"), error


def test_a_strict_answer_schema_some_value_meets_is_taken_whatever_bounds_its_unneeded_schemas_hold(server):
    """An unused `$defs` entry, one a single `anyOf` branch points to and an optional property with bounds no value
    meets made a strict schema a 400, though values meet it; the grammar engine refused a `$ref` to such an entry
    even in a branch. The answers follow the schema (here the other branch, and no `x`)."""
    gap = {"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3}
    schema = {"type": "object", "properties": {"n": {"anyOf": [{"$ref": "#/$defs/gap"}, {"type": "null"}]},
                                               "x": {"type": "string", "minLength": 4, "maxLength": 2}},
              "required": ["n"], "additionalProperties": False,
              "$defs": {"gap": gap, "unused": {"type": "array", "minItems": 2, "maxItems": 1}}}
    for stream in (False, True):
        response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
            "model": "tiny", "messages": _messages(0), "max_tokens": 40, "thinking_token_budget": 0, "stream": stream,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema,
                                                                       "strict": True}}})
        assert response.status_code == 200, response.text
        if not stream:
            assert json.loads(response.json()["choices"][0]["message"]["content"]) == {"n": None}


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("pattern", ["^<\\|x$", "^a</atem:parameter>b$", "(<\\|)+"])
def test_a_raw_parameter_whose_pattern_only_framing_text_meets_is_a_400_before_generating(server, pattern, strict):
    """A string parameter is written as raw text, which cannot hold `<|` or `</atem:parameter>`: a pattern met only
    by text holding one was taken, and the forced call failed while generating (the grammar engine's bare
    "NoExtensionBias", the request stopped). It is a 400 up front; a pattern other text meets is taken."""
    errors = _server_errors(server)

    def tool(pattern: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "f", "strict": strict, "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}, "required": ["a"]}}}

    body = {"model": "tiny", "messages": _messages(0), "max_tokens": 60, "thinking_token_budget": 0,
            "tool_choice": "required", "parallel_tool_calls": False}
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={**body, "tools": [tool(pattern)]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools" and "parameter 'a' of 'f'" in error["message"], error
    assert "NoExtensionBias" not in error["message"] and "stopped" not in error["message"], error
    taken = httpx.post(server.base_url + "/chat/completions", timeout=60, json={**body, "tools": [tool("^x<\\|?$")]})
    assert taken.status_code == 200, taken.text
    call = taken.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert json.loads(call["arguments"]) == {"a": "x<"}  # `x<|` cannot be written
    assert _server_errors(server) == errors


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "clock"}}])
def test_a_required_call_stopping_at_the_end_of_message_token_is_a_400_before_generating(server, tool_choice):
    """`<|eom|>` ends a reasoning message, before the call's own message: a required or named call that stops there
    failed while generating once the turn reasoned ("the constraint needs <|eom|>", the request stopped; mid-stream
    when streamed). It is a 400 naming stop_token_ids up front; without reasoning the call needs no `<|eom|>`."""
    errors = _server_errors(server)
    eom = server.engine.engine.tokenizer.require_token_id("<|eom|>")
    body = {"model": "tiny", "messages": _messages(0), "max_tokens": 60, "tools": TOOLS, "tool_choice": tool_choice,
            "stop_token_ids": [eom]}
    for fields in ({}, {"thinking_token_budget": 3}, {"thinking_token_budget": 3, "stream": True}):
        response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={**body, **fields})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "stop_token_ids" and "<|eom|>" in error["message"], error
    taken = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        **body, "thinking_token_budget": 0, "parallel_tool_calls": False, "chat_template_kwargs": PINNED_DATE})
    assert taken.status_code == 200, taken.text
    called = taken.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"]
    assert called == "clock" if tool_choice != "required" else called in ("clock", "lookup")
    assert _server_errors(server) == errors


def test_a_non_strict_tool_whose_parameters_are_alternatives_calls_with_their_parameters(server):
    """Parameters given as a root `anyOf` of object shapes (zod's and pydantic's unions; a hint in a non-strict tool)
    declared no property the turn grammar knew, so every forced call was `{}`. Their members' properties are the
    call's parameters, typed as their declarations (here `a` an integer, `b` a string of at most 4)."""
    parameters = {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                             "required": ["a"]},
                            {"$ref": "#/$defs/B"}],
                  "$defs": {"B": {"type": "object", "properties": {"b": {"type": "string", "maxLength": 4}},
                                  "required": ["b"]}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    written = []
    for seed in range(6):
        response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
            "model": "tiny", "messages": _messages(seed), "max_tokens": 60, "thinking_token_budget": 0,
            "tools": [tool], "tool_choice": "required", "parallel_tool_calls": False, "seed": seed,
            "temperature": 1.0})
        assert response.status_code == 200, response.text
        arguments = json.loads(response.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
        assert set(arguments) <= {"a", "b"}, arguments
        assert isinstance(arguments.get("a", 0), int) and len(arguments.get("b", "")) <= 4, arguments
        written += arguments
    assert written, "no call wrote a parameter"


def test_a_strict_tool_whose_optional_parameter_no_value_satisfies_is_a_400_naming_it(server):
    """A forced call that began writing it failed while generating with the grammar engine's "NoExtensionBias"."""
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "ab", "maxLength": 1}}, "required": []}}}
    response = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": _messages(0), "max_tokens": 5, "tools": [tool], "tool_choice": "required"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "tools[0].function.parameters.properties.x", error
    assert "optional parameter" in error["message"] and "NoExtensionBias" not in error["message"], error


PAST_FLOAT_RANGE = 10**400
"""An integer JSON holds and Python reads exactly, but no 64-bit float reaches (float() overflows)."""
HUGE_INTEGER_PLACES = {
    "minimum": {"type": "integer", "minimum": PAST_FLOAT_RANGE},
    "maximum": {"type": "integer", "maximum": -PAST_FLOAT_RANGE},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": PAST_FLOAT_RANGE},
    "exclusiveMaximum": {"type": "number", "exclusiveMaximum": PAST_FLOAT_RANGE},
    "multipleOf": {"type": "integer", "multipleOf": PAST_FLOAT_RANGE},
    "minItems": {"type": "array", "items": {"type": "string"}, "minItems": PAST_FLOAT_RANGE},
    "maxItems": {"type": "array", "maxItems": PAST_FLOAT_RANGE},
    "minLength": {"type": "string", "minLength": PAST_FLOAT_RANGE},
    "maxLength": {"type": "string", "maxLength": PAST_FLOAT_RANGE},
    "minProperties": {"type": "object", "minProperties": PAST_FLOAT_RANGE},
    "enum[1]": {"enum": [1, PAST_FLOAT_RANGE]},
    "const": {"const": PAST_FLOAT_RANGE},
}


def _huge_integer_requests(schema: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any], str]]:
    """Each entry point of a JSON schema: its endpoint, the request fields holding `schema`, and the field naming
    it."""
    def tool(strict: bool) -> dict[str, Any]:
        return {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema, "strict": strict}}],
                "tool_choice": "required"}

    def response_format(strict: bool) -> dict[str, Any]:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                           "strict": strict}}}
    return {
        "response_format strict": ("/chat/completions", response_format(True), "response_format.json_schema.schema"),
        "response_format": ("/chat/completions", response_format(False), "response_format.json_schema.schema"),
        "tool strict": ("/chat/completions", tool(True), "tools[0].function.parameters"),
        "tool": ("/chat/completions", tool(False), "tools[0].function.parameters"),
        "structured_outputs": ("/chat/completions", {"structured_outputs": {"json": schema}},
                               "structured_outputs.json"),
        "guided_json": ("/completions", {"guided_json": schema}, "guided_json"),
        "text.format": ("/responses", {"text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}},
                        "text.format.schema"),
    }


@pytest.mark.parametrize("entry", list(_huge_integer_requests({})))
@pytest.mark.parametrize("place", list(HUGE_INTEGER_PLACES))
def test_an_integer_past_the_float_range_in_a_schema_is_a_400_naming_where_it_is(server, entry, place):
    """10**400 is a JSON integer no float holds: the bounds checks made it a float (an OverflowError, a 500), and
    the grammar engine refuses it as "number out of range", naming no field."""
    schema = {"type": "object", "properties": {"a": HUGE_INTEGER_PLACES[place]}, "required": ["a"],
              "additionalProperties": False}
    path, fields, param = _huge_integer_requests(schema)[entry]
    prompt = {"/responses": {"input": "hi", "max_output_tokens": 40},
              "/completions": {"prompt": "hi", "max_tokens": 40},
              "/chat/completions": {"messages": _messages(0), "max_tokens": 40}}[path]
    body = {"model": "tiny", **prompt, **fields}
    response = httpx.post(server.base_url + path, content=json.dumps(body), timeout=60,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == f"{param}.properties.a.{place}", response.text
    assert "past the range of a 64-bit float" in response.json()["error"]["message"]


def test_a_reference_to_a_bound_past_the_float_range_in_an_optional_branch_is_a_400(server):
    """A non-strict schema's `$ref` in an `anyOf` is looked through for empty bounds (schema_bounds), which made the
    bound a float: a 500."""
    schema = {"$defs": {"big": {"type": "integer", "minimum": PAST_FLOAT_RANGE}},
              "anyOf": [{"$ref": "#/$defs/big"}, {"type": "string"}]}
    body = {"model": "tiny", "messages": _messages(0), "max_tokens": 5,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    response = httpx.post(server.base_url + "/chat/completions", content=json.dumps(body), timeout=60,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "response_format.json_schema.schema.$defs.big.minimum"
