"""Protocol mapping through the real server: the model's turn → reasoning_content, content and tool_calls.

Only the network is scripted (`ScriptedRunner`); the engine, sampler, tool-choice controller, parser and HTTP
layers are the real ones, and the client is the official `openai` SDK. Each script is checked streamed and
not streamed, and the two must agree (P-API-4).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from server_support import (
    PINNED_DATE,
    TIME_TOOL,
    WEATHER_TOOL,
    ScriptedRunner,
    fewest_forced_call_tokens,
    live_server,
)

from glimmer import LLM, SamplingParams

REASON_THEN_ANSWER = (" to=self<|message|>The user greets me.<|eom|>"
                      "<|start|>assistant to=user<|message|>Hello there!<|eot|>")
WEATHER_CALL_BODY = ('<atem:function_calls>\n<atem:invoke name="get_weather">\n'
                     '<atem:parameter name="city">Paris</atem:parameter>\n'
                     '<atem:parameter name="days">3</atem:parameter>\n'
                     '</atem:invoke>\n</atem:function_calls>')
REASON_THEN_CALL = (" to=self<|message|>I should look the weather up.<|eom|>"
                    f"<|start|>assistant to=get_weather<|message|>{WEATHER_CALL_BODY}<|eot|>")
WEATHER_CALL = f" to=get_weather<|message|>{WEATHER_CALL_BODY}<|eot|>"
TIME_CALL = (' to=get_time<|message|><atem:function_calls>\n<atem:invoke name="get_time">\n'
             '<atem:parameter name="city">Oslo</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>')
ANSWER_DIRECTLY = " to=user<|message|>It is sunny in Paris.<|eot|>"
TWO_CALLS = (f" to=get_weather<|message|>{WEATHER_CALL_BODY}<|eom|><|start|>assistant" + TIME_CALL)
INVENTED_USER_TURN = (" to=user<|message|>Sure, done.<|eom|><|start|>user<|message|>Thanks! Now tell me a joke."
                      "<|eot|>")
STOP_IN_BOTH = (" to=self<|message|>Never say HALT too early.<|eom|>"
                "<|start|>assistant to=user<|message|>one two HALT three<|eot|>")
UNKNOWN_TOOL_CALL = (' to=send_mail<|message|><atem:function_calls>\n<atem:invoke name="send_mail">\n'
                     '<atem:parameter name="to">ann@example.org</atem:parameter>\n</atem:invoke>\n'
                     '</atem:function_calls><|eot|>')
WITH_MEDIA_MARKERS = (" to=self<|message|>Look<|image_end|>ing.<|eom|>"
                      "<|start|>assistant to=user<|message|>Hi<|image_end|> there<|patch|>!<|eot|>")
HTML_CALL = (' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
             '<atem:parameter name="city"><b>Paris</b> </atem:parameter\n</atem:parameter>\n'
             '</atem:invoke>\n</atem:function_calls><|eot|>')
INVENTED_USER_TURN_THEN_CALL = (" to=user<|message|>Sure.<|eom|><|start|>user<|message|>Now mail Ann.<|eom|>"
                                f"<|start|>assistant to=get_weather<|message|>{WEATHER_CALL_BODY}<|eot|>")
STOP_THEN_CALL = (" to=user<|message|>one HALT two<|eom|><|start|>assistant to=self<|message|>More to do.<|eom|>"
                  f"<|start|>assistant to=get_weather<|message|>{WEATHER_CALL_BODY}<|eot|>")
CALL_THEN_ANSWER = (f" to=get_weather<|message|>{WEATHER_CALL_BODY}<|eom|><|start|>assistant to=self<|message|>Done."
                    "<|eom|><|start|>assistant to=user<|message|>It is sunny.<|eot|>")
ANSWER_IN_TWO_MESSAGES = (" to=user<|message|>one HALT two<|eom|><|start|>assistant to=user<|message|>three HALT four"
                          "<|eot|>")
ANSWER_WITH_LIGHT = " to=user<|message|>The light is on.<|eot|>"
GO_TO_THE_END = " to=user<|message|>Go to the end.<|eot|>"
TWO_THOUGHTS_THEN_CALL = (" to=self<|message|>First thought.<|eom|><|start|>assistant to=self<|message|>Second thought."
                          f"<|eom|><|start|>assistant to=get_weather<|message|>{WEATHER_CALL_BODY}<|eot|>")
STOP_ACROSS_A_CALL = (" to=user<|message|>one HA<|eom|><|start|>assistant to=get_weather<|message|>"
                      f"{WEATHER_CALL_BODY}<|eom|><|start|>assistant to=user<|message|>LT two<|eot|>")
STOP_ACROSS_REASONING = (" to=user<|message|>one HA<|eom|><|start|>assistant to=self<|message|>Hmm.<|eom|>"
                         "<|start|>assistant to=user<|message|>LT two<|eot|>")
LONG_AFTER_THE_STOP = (" to=self<|message|>HALT is a word I may think.<|eom|>"
                       "<|start|>assistant to=user<|message|>one HALT" + " and then many more words" * 8 + "<|eot|>")
SCRIPTS = {
    "[specials]": [WITH_MEDIA_MARKERS],
    "[long-after-stop]": [LONG_AFTER_THE_STOP],
    "[stop-across-call]": [STOP_ACROSS_A_CALL],
    "[stop-across-reasoning]": [STOP_ACROSS_REASONING],
    "[reason-answer]": [REASON_THEN_ANSWER],
    "[reason-call]": [REASON_THEN_CALL],
    "[answer-or-call]": [ANSWER_DIRECTLY, REASON_THEN_CALL],
    "[answer-only]": [ANSWER_DIRECTLY],
    "[time-or-weather]": [TIME_CALL, WEATHER_CALL],
    "[two-calls]": [TWO_CALLS],
    "[invent-user]": [INVENTED_USER_TURN],
    "[stop-both]": [STOP_IN_BOTH],
    "[unknown-call]": [UNKNOWN_TOOL_CALL],
    "[html-call]": [HTML_CALL],
    "[two-thoughts]": [TWO_THOUGHTS_THEN_CALL],
    "[invent-then-call]": [INVENTED_USER_TURN_THEN_CALL],
    "[stop-then-call]": [STOP_THEN_CALL],
    "[call-then-answer]": [CALL_THEN_ANSWER],
    "[answer-in-two]": [ANSWER_IN_TWO_MESSAGES],
    "[light]": [ANSWER_WITH_LIGHT],
    "[go-to]": [GO_TO_THE_END],
    "[empty-call]": [' to=get_time<|message|><atem:function_calls>\n<atem:invoke name="get_time">\n</atem:invoke>\n'
                     '</atem:function_calls><|eot|>'],
}
PER_CHOICE_SCRIPTS = {"[per-choice]": [INVENTED_USER_TURN, LONG_AFTER_THE_STOP]}  # completion i follows script i
TOOLS = [WEATHER_TOOL, TIME_TOOL]
WEATHER_ARGUMENTS = {"city": "Paris", "days": 3}


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), scripted=True) as live:
        for key, transcripts in SCRIPTS.items():
            live.engine.engine.runner.add(key, *transcripts)
        for key, transcripts in PER_CHOICE_SCRIPTS.items():
            live.engine.engine.runner.add_per_choice(key, *transcripts)
        yield live


@pytest.fixture(scope="module")
def llm(make_tiny):
    llm = LLM(str(make_tiny()), device="cpu", progress=False, kv_cache_memory=32 << 20, max_model_len=2048)
    llm.engine.runner = ScriptedRunner(llm.engine)
    for key, transcripts in SCRIPTS.items():
        llm.engine.runner.add(key, *transcripts)
    for key, transcripts in PER_CHOICE_SCRIPTS.items():
        llm.engine.runner.add_per_choice(key, *transcripts)
    return llm


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def _request(key: str, **overrides: Any) -> dict[str, Any]:
    request = {"model": "tiny", "messages": [{"role": "user", "content": f"{key} What is the weather in Paris?"}],
               "temperature": 0, "max_tokens": 200, "extra_body": {"chat_template_kwargs": PINNED_DATE}}
    request.update(overrides)
    return request


def _non_streamed(client, **request: Any) -> dict[str, Any]:
    response = client.chat.completions.create(**request)
    choice = response.choices[0]
    message = choice.message
    return {
        "reasoning": message.model_extra.get("reasoning_content"),
        "reasoning_mirror": message.model_extra.get("reasoning"),
        "content": message.content,
        "calls": [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls or []],
        "ids": [call.id for call in message.tool_calls or []],
        "finish_reason": choice.finish_reason,
        "usage": response.usage,
    }


def _streamed(client, **request: Any) -> dict[str, Any]:
    reasoning, content, calls, ids = [], [], {}, []
    finish_reason = usage = None
    roles = []
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **request)
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.role:
                roles.append(delta.role)
            if delta.model_extra.get("reasoning_content"):
                assert delta.model_extra["reasoning"] == delta.model_extra["reasoning_content"]
                reasoning.append(delta.model_extra["reasoning_content"])
            if delta.content:
                content.append(delta.content)
            for call in delta.tool_calls or []:
                if call.id:
                    ids.append(call.id)
                    calls[call.index] = [call.function.name, ""]
                calls[call.index][1] += call.function.arguments or ""
            if choice.finish_reason:
                finish_reason = choice.finish_reason
    assert roles == ["assistant"]
    return {
        "reasoning": "".join(reasoning) or None,
        "content": "".join(content) or None,
        "calls": [(name, json.loads(arguments)) for _, (name, arguments) in sorted(calls.items())],
        "ids": ids,
        "finish_reason": finish_reason,
        "usage": usage,
    }


def _both(client, **request: Any) -> dict[str, Any]:
    """Non-streamed result, after checking the stream says the same (P-API-4)."""
    whole = _non_streamed(client, **request)
    streamed = _streamed(client, **request)
    for field in ("reasoning", "content", "calls", "finish_reason"):
        assert streamed[field] == whole[field], field
    assert streamed["usage"].completion_tokens == whole["usage"].completion_tokens
    assert (streamed["usage"].completion_tokens_details.reasoning_tokens
            == whole["usage"].completion_tokens_details.reasoning_tokens)
    return whole


def _token_count(server, text: str) -> int:
    return len(server.engine.engine.tokenizer.encode(text))


def test_reasoning_and_answer_map_to_reasoning_content_and_content(client, server):
    result = _both(client, **_request("[reason-answer]"))
    assert result["reasoning"] == "The user greets me."
    assert result["reasoning_mirror"] == "The user greets me."  # P-API-1
    assert result["content"] == "Hello there!"
    assert result["calls"] == []
    assert result["finish_reason"] == "stop"


def test_usage_counts_every_generated_token_and_the_reasoning_ones(client, server):
    # P-API-5: reasoning tokens are those of the reasoning message, from the turn start through <|eom|>
    usage = _non_streamed(client, **_request("[reason-answer]"))["usage"]
    assert usage.completion_tokens == _token_count(server, REASON_THEN_ANSWER)
    assert usage.completion_tokens_details.reasoning_tokens == _token_count(
        server, " to=self<|message|>The user greets me.<|eom|>")
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_tool_call_maps_to_tool_calls_with_ids_and_finish_reason_tool_calls(client):
    result = _both(client, **_request("[reason-call]", tools=TOOLS))
    assert result["reasoning"] == "I should look the weather up."
    assert result["content"] is None
    assert result["calls"] == [("get_weather", WEATHER_ARGUMENTS)]
    assert all(call_id.startswith("call_") for call_id in result["ids"])
    assert result["finish_reason"] == "tool_calls"


def test_parallel_calls_arrive_in_wire_order_with_distinct_ids(client):
    result = _both(client, **_request("[two-calls]", tools=TOOLS))
    assert result["calls"] == [("get_weather", WEATHER_ARGUMENTS), ("get_time", {"city": "Oslo"})]
    assert len(set(result["ids"])) == 2


def test_tool_results_sent_in_another_order_render_in_the_order_of_their_calls(client, server):
    """The prompt has no call ids (§2.1: a result is `tool NAME`), so the model pairs results with calls by position:
    results sent in another order than the calls (OpenAI pairs them by tool_call_id) were each read as the other's."""
    request = _request("[two-calls]", tools=TOOLS)
    reply = client.chat.completions.create(**request).choices[0].message
    weather, time = reply.tool_calls
    request["messages"] += [reply.model_dump(exclude_none=True),
                            {"role": "tool", "tool_call_id": time.id, "content": "09:15"},
                            {"role": "tool", "tool_call_id": weather.id, "content": "rain, 18"}]
    client.chat.completions.create(**request)
    prompt = server.engine.engine.runner.prompts[-1]
    assert prompt.index("<|start|>tool get_weather<|message|>") < prompt.index("<|start|>tool get_time<|message|>")
    assert prompt.index("rain, 18") < prompt.index("09:15")


def test_a_call_answered_twice_is_400_naming_the_second_answer(client):
    """Both results rendered, and the model read two answers to one call; OpenAI refuses them ("Duplicate value for
    'tool_call_id'")."""
    request = _request("[two-calls]", tools=TOOLS)
    reply = client.chat.completions.create(**request).choices[0].message
    weather, time = reply.tool_calls
    request["messages"] += [reply.model_dump(exclude_none=True),
                            *({"role": "tool", "tool_call_id": call.id, "content": "x"} for call in (weather, time)),
                            {"role": "tool", "tool_call_id": weather.id, "content": "rain, 18"}]
    with pytest.raises(openai.BadRequestError, match="duplicate tool_call_id") as refused:
        client.chat.completions.create(**request)
    assert refused.value.body["param"] == "messages[4].tool_call_id"


def test_parallel_tool_calls_false_keeps_the_first_call_and_stops(client, server):
    result = _both(client, **_request("[two-calls]", tools=TOOLS, parallel_tool_calls=False))
    assert result["calls"] == [("get_weather", WEATHER_ARGUMENTS)]
    assert result["finish_reason"] == "tool_calls"
    assert result["usage"].completion_tokens < _token_count(server, TWO_CALLS)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_choice_pass_when_the_model_calls(client, tool_choice):
    result = _both(client, **_request("[reason-call]", tools=TOOLS, tool_choice=tool_choice))
    assert result["calls"] == [("get_weather", WEATHER_ARGUMENTS)]
    assert result["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_model_that_would_answer_directly_is_steered_into_the_call(client, tool_choice):
    # P-REQ-5: the model prefers ` to=user`; the controller refuses that header, so the model's next choice
    # (reasoning, then the call) is what it writes
    result = _both(client, **_request("[answer-or-call]", tools=TOOLS, tool_choice=tool_choice))
    assert result["content"] is None
    assert result["calls"] == [("get_weather", WEATHER_ARGUMENTS)]
    assert result["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_may_follow_reasoning_in_several_messages(client, tool_choice):
    # §3.1, P-REQ-5: `self` messages, then the call. One was allowed: the second steered the model off its call.
    result = _both(client, **_request("[two-thoughts]", tools=TOOLS, tool_choice=tool_choice))
    assert result["reasoning"] == "First thought.\nSecond thought."
    assert result["calls"] == [("get_weather", WEATHER_ARGUMENTS)]
    assert result["finish_reason"] == "tool_calls"


def test_auto_choice_lets_the_same_model_answer_directly(client):
    result = _both(client, **_request("[answer-or-call]", tools=TOOLS, tool_choice="auto"))
    assert result["content"] == "It is sunny in Paris."
    assert result["calls"] == []


def test_named_choice_steers_away_from_another_tool(client):
    # the model prefers get_time; once the header reaches `get_`, only `weather` may follow
    named = {"type": "function", "function": {"name": "get_weather"}}
    result = _both(client, **_request("[time-or-weather]", tools=TOOLS, tool_choice=named))
    assert result["calls"] == [("get_weather", WEATHER_ARGUMENTS)]


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_a_forced_call_cut_short_before_it_is_written_is_tool_choice_unsatisfied(client, server, limit):
    # P-REQ-4: the model only knows how to answer; the grammar steers it into a call of a declared tool, which
    # max_tokens cuts short before a call is written (the fewest tokens a call takes, which the model spends on
    # reasoning first). Never success with empty tool_calls: a 500 of type tool_choice_unsatisfied, streamed an
    # error event, saying what cut the reply and what to raise.
    before = server.metrics().get("glimmer_tool_choice_unsatisfied_total", 0)
    request = _request("[answer-only]", tools=TOOLS, tool_choice="required")
    del request["max_tokens"]
    request[limit] = fewest_forced_call_tokens(server, TOOLS)
    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(**request)
    streamed = client.chat.completions.create(**request, stream=True)
    with pytest.raises(openai.APIError) as streamed_error:
        finish_reasons = [choice.finish_reason for chunk in streamed for choice in chunk.choices]
    for error in (refused.value.body, streamed_error.value.body):
        assert error["type"] == "tool_choice_unsatisfied" and error["param"] == "tool_choice"
        assert f'cut short by {limit} (finish_reason "length") before a complete call' in error["message"]
        assert f"raise {limit}" in error["message"]
    assert "finish_reasons" not in locals()  # no chunk ended the choice as a success
    assert server.metrics().get("glimmer_tool_choice_unsatisfied_total", 0) == before + 2


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_token_limit_below_the_shortest_forced_call_is_a_400_naming_it_and_the_minimum(client, server, limit, choice):
    """A forced call (P-REQ-4) that max_tokens cannot hold was generated and failed, a 500, however few tokens were
    allowed. A limit below the fewest tokens of any call the turn grammar allows (its header and ATEM tags with
    values empty, counted with the model's tokenizer) is a 400 up front naming the field and the minimum."""
    allowed = TOOLS if choice == "required" else [WEATHER_TOOL]
    fewest = fewest_forced_call_tokens(server, allowed)
    request = _request("[answer-only]", tools=TOOLS, tool_choice=choice)
    del request["max_tokens"]
    for too_few in (1, fewest - 1):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**{**request, limit: too_few})
        error = refused.value.body
        assert error["param"] == limit and f"the shortest takes {fewest} tokens" in error["message"], error
        assert f"raise {limit} to at least {fewest}" in error["message"]


def test_a_forced_call_the_shortest_output_holds_comes_back_at_the_minimum_limit(client, server):
    """The minimum is no more than a call needs: a call of a tool without required parameters, written in the fewest
    tokens (the empty invoke closed), comes back whole at that limit, cut short before its block's close (P-ATEM-5)."""
    named = {"type": "function", "function": {"name": "get_time"}}
    fewest = fewest_forced_call_tokens(server, [TIME_TOOL])
    request = {**_request("[empty-call]", tools=TOOLS, tool_choice=named), "max_tokens": fewest}
    result = _both(client, **request)
    assert (result["calls"], result["finish_reason"]) == ([("get_time", {})], "length")
    assert result["usage"].completion_tokens == fewest
    shortest = (' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
                '<atem:parameter name="city"></atem:parameter>')  # a required parameter, its value empty
    assert fewest_forced_call_tokens(server, [WEATHER_TOOL]) == len(server.engine.engine.tokenizer.encode(shortest))


def _pad_to_leave(server, request: dict[str, Any], room: int) -> int:
    """Pads the request's user message until its prompt leaves at most `room` tokens of the context; returns what it
    leaves."""
    max_model_len = server.engine.engine.max_model_len
    words = 0
    while True:
        request["messages"] = [{"role": "user", "content": "[answer-only] Weather?" + " Paris" * words}]
        tokenized = httpx.post(f"{server.url}/tokenize", json={
            "model": "tiny", "messages": request["messages"], "tools": TOOLS,
            "chat_template_kwargs": PINNED_DATE}).json()
        left = max_model_len - tokenized["count"]
        if left <= room:
            return left
        words += max(1, (left - room) // 2)


def test_a_forced_call_cut_short_by_the_end_of_the_context_says_to_shorten_the_conversation(client, server):
    # P-REQ-4: a request without max_tokens runs to the end of the context; the error said to raise max_tokens,
    # which no request can do there (prompt + max_tokens past max_model_len is a 400)
    request = _request("[answer-only]", tools=TOOLS, tool_choice="required")
    del request["max_tokens"]
    max_model_len = server.engine.engine.max_model_len
    fewest = fewest_forced_call_tokens(server, TOOLS)
    room = _pad_to_leave(server, request, fewest + 1)  # room for a call, which the model spends on reasoning
    assert room >= fewest
    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(**request)
    streamed = client.chat.completions.create(**request, stream=True)
    with pytest.raises(openai.APIError) as streamed_error:
        list(streamed)
    for error in (refused.value.body, streamed_error.value.body):
        assert error["type"] == "tool_choice_unsatisfied"
        assert (f"reached the end of the context (max_model_len={max_model_len}) before a complete call; "
                "shorten the conversation") in error["message"]
        assert "raise max_tokens" not in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_that_leaves_less_room_than_the_shortest_forced_call_is_a_400_context_length_exceeded(
        client, server, stream):
    """Without max_tokens, a forced call (P-REQ-4) whose prompt left fewer tokens of the context than any allowed call
    takes was generated to the end of the context and failed, a 500 (which the openai SDK retries, generating again);
    it is refused up front as the prompt too long for the context it is."""
    request = _request("[answer-only]", tools=TOOLS, tool_choice="required")
    del request["max_tokens"]
    max_model_len = server.engine.engine.max_model_len
    fewest = fewest_forced_call_tokens(server, TOOLS)
    room = _pad_to_leave(server, request, fewest - 1)
    assert room >= 1
    # a max_tokens the call fits in: the context-length refusal said to lower it to the room, below the call's minimum
    for limit in ({}, {"max_tokens": fewest + 5}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**request, **limit, stream=stream)
        error = refused.value.body
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
        assert error["message"].startswith(f"This model's maximum context length is {max_model_len} tokens")
        assert f"leaves {room} for the reply" in error["message"]
        assert f"the shortest takes {fewest} tokens" in error["message"]
        assert f"at most {max_model_len - fewest} prompt tokens" in error["message"]


def test_a_forced_call_cut_short_after_it_is_written_is_kept_with_length(client):
    # P-ATEM-5 keeps the call max_tokens cut short (its arguments closed JSON), which satisfies the choice; P-API-2
    # reports `length`, so that the client knows it may lack parameters
    result = _both(client, **_request("[answer-only]", tools=TOOLS, tool_choice="required", max_tokens=30))
    assert result["finish_reason"] == "length"
    assert [name for name, _ in result["calls"]] == ["get_time"] and result["content"] is None


def test_tool_choice_none_hides_the_tools_and_returns_no_calls(client, server):
    # P-REQ-3 / P-NAME-4
    result = _both(client, **_request("[reason-call]", tools=TOOLS, tool_choice="none"))
    assert result["calls"] == []
    assert result["finish_reason"] == "stop"
    assert result["reasoning"] == "I should look the weather up."
    prompt = server.engine.engine.runner.prompts[-1]
    assert "[reason-call]" in prompt and "get_weather" not in prompt


def test_tools_are_declared_in_the_prompt_for_auto(client, server):
    _non_streamed(client, **_request("[reason-call]", tools=TOOLS))
    prompt = server.engine.engine.runner.prompts[-1]
    assert '"name": "get_weather"' in prompt and "Valid recipients" in prompt


def test_a_header_for_another_role_ends_the_generation(client, server):
    # P-HDR-8: the model starts inventing the user's next turn; the server stops it there
    result = _both(client, **_request("[invent-user]"))
    assert result["content"] == "Sure, done."
    assert result["finish_reason"] == "stop"
    assert result["usage"].completion_tokens < _token_count(server, INVENTED_USER_TURN)


def test_stop_strings_match_the_answer_only(client):
    # P-REQ-2: the stop string in the reasoning does not end the turn; the one in the answer does
    result = _both(client, **_request("[stop-both]", stop=["HALT"]))
    assert result["reasoning"] == "Never say HALT too early."
    assert result["content"] == "one two "
    assert result["finish_reason"] == "stop"


def test_the_stop_string_that_ended_the_answer_is_its_stop_reason(client):
    request = _request("[stop-both]", stop=["HALT"])
    assert client.chat.completions.create(**request).choices[0].stop_reason == "HALT"
    last = [chunk.choices[0] for chunk in client.chat.completions.create(**request, stream=True) if chunk.choices][-1]
    assert last.finish_reason == "stop" and last.stop_reason == "HALT"
    assert client.chat.completions.create(**_request("[reason-answer]")).choices[0].stop_reason is not None  # <|eot|>


def test_stop_strings_can_stay_in_the_answer(client):
    result = _both(client, **_request("[stop-both]", stop=["HALT"],
                                      extra_body={"chat_template_kwargs": PINNED_DATE,
                                                  "include_stop_str_in_output": True}))
    assert (result["content"], result["finish_reason"]) == ("one two HALT", "stop")


def test_min_tokens_holds_off_stop_strings_in_the_answer(client, server):
    """As vLLM: stop strings are looked for once more than min_tokens tokens were generated, so one ending in the
    min_tokens-th token stays text (as a stop id can come only after it); one ending in a later token stops."""
    tokenizer = server.engine.engine.tokenizer
    halt = len(tokenizer.encode(STOP_IN_BOTH[:STOP_IN_BOTH.index("HALT three") + len("HALT")],
                                add_special_tokens=False))  # the token that completes the answer's HALT
    held = _both(client, **_request("[stop-both]", stop=["HALT"], extra_body={
        "chat_template_kwargs": PINNED_DATE, "min_tokens": halt}))
    assert (held["content"], held["finish_reason"]) == ("one two HALT three", "stop")
    armed = _both(client, **_request("[stop-both]", stop=["HALT"], extra_body={
        "chat_template_kwargs": PINNED_DATE, "min_tokens": halt - 1}))
    assert armed["content"] == "one two "


def _served_and_llm_chat(client, llm, key: str, stop: list[str], min_tokens: int) -> tuple[dict[str, Any], Any]:
    """The server's answer (`_both`) and LLM.chat's reply to the script `key` under `stop` and `min_tokens`."""
    request = _request(key, stop=stop, extra_body={"chat_template_kwargs": PINNED_DATE, "min_tokens": min_tokens})
    reply = llm.chat(request["messages"], SamplingParams(temperature=0, max_tokens=200, min_tokens=min_tokens,
                                                         stop=stop), chat_template_kwargs=PINNED_DATE,
                     use_tqdm=False)[0]
    return _both(client, **request), reply


def test_llm_chat_holds_off_a_stop_string_in_the_min_tokens_of_an_answer_of_two_messages(client, server, llm):
    """LLM.chat found the answer in the turn by its text to tell which stop strings min_tokens holds off; an answer of
    two messages is no one piece of the turn, so it cut at a stop string the server keeps as text."""
    first_halt = _token_count(server, ANSWER_IN_TWO_MESSAGES[:ANSWER_IN_TWO_MESSAGES.index("HALT") + len("HALT")])
    served, reply = _served_and_llm_chat(client, llm, "[answer-in-two]", ["HALT"], first_halt)
    assert served["content"].startswith("one HALT two") and served["content"].endswith("three ")
    assert (reply.content, reply.finish_reason, reply.stop_string) == (served["content"], "stop", "HALT")


@pytest.mark.parametrize(("through", "content", "stop_string"), [
    ("Go to", "Go to the end.", None),  # "to" ends in the min_tokens-th token, whose text the parser held
    ("Go", "Go ", "to"),  # it ends in the token after
])
def test_llm_chat_holds_off_a_stop_string_ending_in_its_min_tokens_though_the_parser_held_its_text(
        client, server, llm, through, content, stop_string):
    """LLM.chat told a stop string min_tokens holds off by the token whose text made the parser release it, not by
    the token it ends in: ' to' may start a headerless switch (P-HDR-7) and is held until ' the' comes, so with
    min_tokens through ' to' it cut the answer to 'Go ', where the server keeps it (README: a stop string counts if it
    ends in a token after the min_tokens-th, as in vLLM)."""
    min_tokens = _token_count(server, GO_TO_THE_END[: GO_TO_THE_END.index(through) + len(through)])
    served, reply = _served_and_llm_chat(client, llm, "[go-to]", ["to"], min_tokens)
    assert (served["content"], served["finish_reason"]) == (content, "stop")
    assert (reply.content, reply.finish_reason, reply.stop_string) == (content, "stop", stop_string)


@pytest.mark.parametrize("include", [False, True])
def test_llm_chat_ends_the_answer_at_the_stop_string_the_server_ends_it_at_within_a_token(client, server, llm,
                                                                                         include):
    """Two stop strings starting at one place in one token's text ("ight" then "ig" in the token "ight"): the server
    and LLM.chat end the answer at the one that ends first, "ig", as they would had the text come in smaller tokens
    (vLLM takes the first listed among those a token completed, so its answer depends on the tokens)."""
    tokenizer = server.engine.engine.tokenizer
    assert tokenizer.token_to_id("ight") in tokenizer.encode(ANSWER_WITH_LIGHT)  # "ig" lies within one token
    stop = ["ight", "ig"]
    request = _request("[light]", stop=stop, extra_body={"chat_template_kwargs": PINNED_DATE,
                                                         "include_stop_str_in_output": include})
    served = _both(client, **request)
    reply = llm.chat(request["messages"], SamplingParams(temperature=0, max_tokens=200, stop=stop,
                                                         include_stop_str_in_output=include),
                     chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
    assert served["content"] == ("The lig" if include else "The l")
    assert (reply.content, reply.stop_string) == (served["content"], "ig")


@pytest.mark.parametrize(("key", "stop", "include", "through"), [
    ("[stop-both]", "HALT", False, "HALT"),  # the reasoning's HALT does not end the raw turn either
    ("[stop-both]", "HALT", True, "HALT"),
    ("[light]", "ig", False, "light"),  # "ig" ends inside the token "ight": the turn's text ends inside it too
    ("[light]", "ig", True, "light"),
])
def test_llm_chat_raw_completion_ends_where_the_stop_string_ended_the_answer(server, llm, key, stop, include, through):
    """`outputs[0]`, what vLLM code reads of LLM.chat's reply, ran on past a stop string that ended the answer, to the
    turn's end or max_tokens (finish_reason "length"), though `content` was cut; it now ends there as vLLM's
    generation ends at a stop string: its text before the stop string (through it with include_stop_str_in_output),
    its tokens through the one the stop string ends in, finish_reason "stop" and the string as stop_reason."""
    script = SCRIPTS[key][0]
    answer = script.rindex("<|message|>") + len("<|message|>")
    at = script.index(stop, answer)
    tokens = _token_count(server, script[: script.index(through, answer) + len(through)])
    messages = [{"role": "user", "content": f"{key} What is the weather in Paris?"}]
    free = llm.chat(messages, SamplingParams(temperature=0, max_tokens=200, logprobs=1),
                    chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0].outputs[0]
    reply = llm.chat(messages, SamplingParams(temperature=0, max_tokens=200, stop=[stop], logprobs=1,
                                              include_stop_str_in_output=include),
                     chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
    raw = reply.outputs[0]
    assert free.text == script and len(free.token_ids) > tokens
    assert raw.text == script[: at + len(stop) if include else at]
    assert (raw.token_ids, len(raw.logprobs)) == (free.token_ids[:tokens], tokens)
    assert (raw.finish_reason, raw.stop_reason) == ("stop", stop)
    assert (reply.stop_string, reply.finish_reason, reply.choices[0].outputs) == (stop, "stop", [raw])


def test_llm_chat_raw_completion_a_stop_string_ended_after_a_call_says_stop_as_vllm_where_the_reply_says_tool_calls(
        client, llm):
    """A stop string in an answer after a call ends the reply with the call: the server's finish_reason and
    ChatOutput's are tool_calls (P-API-2), the string the stop_reason; the raw completion keeps the engine's word,
    stop, as vLLM's raw outputs say only stop, length or abort."""
    request = _request("[call-then-answer]", tools=TOOLS, stop=["sunny"])
    served = client.chat.completions.create(**request)
    reply = llm.chat(request["messages"], SamplingParams(temperature=0, max_tokens=200, stop=["sunny"]), tools=TOOLS,
                     chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
    raw, served_choice = reply.outputs[0], served.choices[0]
    assert raw.text == CALL_THEN_ANSWER[: CALL_THEN_ANSWER.index("sunny")]
    assert len(raw.token_ids) == served.usage.completion_tokens
    assert (served_choice.finish_reason, served_choice.model_extra["stop_reason"]) == ("tool_calls", "sunny")
    assert (raw.finish_reason, raw.stop_reason, reply.finish_reason) == ("stop", "sunny", "tool_calls")


def _counting_sampled_tokens(llm, monkeypatch) -> list[int]:
    """A list whose length is kept as the number of tokens the engine of `llm` samples from now on."""
    sampled: list[int] = []
    runner = llm.engine.runner
    execute = runner.execute

    def counted(step):
        sampled.extend(i for i in range(len(step.seqs)) if step.samples(i))
        return execute(step)

    monkeypatch.setattr(runner, "execute", counted)
    return sampled


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("include", [False, True])
def test_llm_chat_stops_generating_where_a_stop_string_ended_the_answer(client, server, llm, monkeypatch, n,
                                                                        include):
    """LLM.chat generated a turn a stop string ended to its end or max_tokens and dropped the rest (the raw outputs
    and the answer were cut), so stop=["\n"] with max_tokens=4096 waited for thousands of tokens nobody reads, n times;
    each completion now ends at the token the stop string ends in, as the server's chat ends it, with the outputs
    the server gives for the same request (the reasoning's HALT ends nothing)."""
    stop = ["HALT"]
    script = LONG_AFTER_THE_STOP
    through = _token_count(server, script[: script.index("HALT", script.rindex("<|message|>")) + len("HALT")])
    request = _request("[long-after-stop]", stop=stop, n=n, logprobs=True, extra_body={
        "chat_template_kwargs": PINNED_DATE, "include_stop_str_in_output": include})
    served = client.chat.completions.create(**request)
    sampled = _counting_sampled_tokens(llm, monkeypatch)
    reply = llm.chat(request["messages"], SamplingParams(temperature=0, max_tokens=200, n=n, stop=stop, logprobs=0,
                                                         include_stop_str_in_output=include),
                     chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
    assert len(sampled) == n * through < n * _token_count(server, script)
    assert served.usage.completion_tokens == n * through
    for choice, served_choice in zip(reply.choices, served.choices, strict=True):
        raw = choice.outputs[0]
        answer = script.index("HALT", script.rindex("<|message|>")) + (len("HALT") if include else 0)
        assert (raw.text, len(raw.token_ids), len(raw.logprobs)) == (script[:answer], through, through)
        assert (raw.finish_reason, raw.stop_reason) == ("stop", "HALT")
        assert (choice.reasoning, choice.content, choice.finish_reason, choice.stop_string) == (
            served_choice.message.model_extra["reasoning_content"], served_choice.message.content,
            served_choice.finish_reason, served_choice.model_extra["stop_reason"])
        assert [entry.token_id for entry in raw.logprobs] == raw.token_ids
        answer_tokens = served_choice.logprobs.content  # the raw turn ends with the answer's tokens
        assert [entry.logprob for entry in raw.logprobs[-len(answer_tokens):]] == pytest.approx(
            [entry.logprob for entry in answer_tokens])


def test_llm_chat_generates_on_past_a_stop_string_in_the_reasoning(server, llm, monkeypatch):
    """The stop string in the reasoning ends nothing (P-REQ-2): with no stop string in its answer the turn is
    generated to its end, its raw output whole."""
    sampled = _counting_sampled_tokens(llm, monkeypatch)
    reply = llm.chat([{"role": "user", "content": "[long-after-stop] Go on."}],
                     SamplingParams(temperature=0, max_tokens=200, stop=["think"]),
                     chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
    assert reply.outputs[0].text == LONG_AFTER_THE_STOP
    assert len(sampled) == len(reply.outputs[0].token_ids) == _token_count(server, LONG_AFTER_THE_STOP)
    assert (reply.stop_string, reply.finish_reason, reply.outputs[0].finish_reason) == (None, "stop", "stop")


@pytest.mark.parametrize(("key", "parallel_tool_calls", "finish_reason"), [
    ("[invent-user]", True, "stop"),  # P-HDR-8: the model invents the user's next turn
    ("[two-calls]", False, "tool_calls"),  # the first call, with parallel_tool_calls false
])
def test_llm_chat_stops_generating_where_the_server_ends_the_reply(client, server, llm, monkeypatch, key,
                                                                  parallel_tool_calls, finish_reason):
    """Where the server ends the reply at another role's header or, with parallel_tool_calls false, at the first
    call, LLM.chat generated the turn on to its end or max_tokens and returned all of it raw (38 tokens to the
    server's 16 for an invented user turn, 99 to 51 for two calls); the completion now stops at the token the server
    ends it at, its raw output cut there, with the server's completion_tokens and stop_reason (none: no stop string
    ended it); its finish_reason is stop, the engine's word, where ChatOutput's is the server's."""
    script = SCRIPTS[key][0]
    request = _request(key, tools=TOOLS, logprobs=True, parallel_tool_calls=parallel_tool_calls)
    served = client.chat.completions.create(**request)
    sampled = _counting_sampled_tokens(llm, monkeypatch)
    reply = llm.chat(request["messages"], SamplingParams(temperature=0, max_tokens=200, logprobs=0), tools=TOOLS,
                     parallel_tool_calls=parallel_tool_calls, chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
    raw, served_choice = reply.outputs[0], served.choices[0]
    through = served.usage.completion_tokens
    assert len(sampled) == through < _token_count(server, script)
    assert (len(raw.token_ids), len(raw.logprobs)) == (through, through)
    assert raw.token_ids == server.engine.engine.tokenizer.encode(script)[:through]
    assert script.startswith(raw.text) and _token_count(server, raw.text) == through
    assert (served_choice.finish_reason, served_choice.model_extra["stop_reason"]) == (finish_reason, None)
    assert (raw.finish_reason, raw.stop_reason) == ("stop", None)
    assert (reply.finish_reason, reply.content, reply.choices[0].outputs) == (
        finish_reason, served_choice.message.content, [raw])


def test_llm_chat_outputs_hold_each_completion_where_the_server_ends_it(client, server, llm):
    """With n=2 and a different turn per completion (one inventing a user turn, one whose answer a stop string ends),
    the request's `outputs` (what vLLM code reads) hold each completion's raw output in order, ending where the server
    ends that choice: their tokens add up to the server's completion_tokens, each with the server's finish_reason
    and stop_reason."""
    request = _request("[per-choice]", stop=["HALT"], n=2)
    served = client.chat.completions.create(**request)
    reply = llm.chat(request["messages"], SamplingParams(temperature=0, max_tokens=200, n=2, stop=["HALT"]),
                     chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
    assert reply.outputs == [choice.outputs[0] for choice in reply.choices]
    assert [raw.index for raw in reply.outputs] == [0, 1]
    assert sum(len(raw.token_ids) for raw in reply.outputs) == served.usage.completion_tokens
    assert [(raw.finish_reason, raw.stop_reason) for raw in reply.outputs] == [
        (choice.finish_reason, choice.model_extra["stop_reason"]) for choice in served.choices] == [
        ("stop", None), ("stop", "HALT")]
    invented, stopped = (raw.text for raw in reply.outputs)
    assert INVENTED_USER_TURN.startswith(invented) and len(invented) < len(INVENTED_USER_TURN)
    answer = LONG_AFTER_THE_STOP.rindex("<|message|>")
    assert stopped == LONG_AFTER_THE_STOP[: LONG_AFTER_THE_STOP.index("HALT", answer)]
    assert [choice.content for choice in reply.choices] == [choice.message.content for choice in served.choices]


def test_llm_chat_logs_each_warning_of_the_parser_once_per_completion(llm, caplog):
    """LLM.chat read a turn again after generating it, up to three times, and each reading logged the parser's
    warnings: one reply inventing a user turn logged "discarding a message with the ill-formed header 'user'" three
    times. Each completion now logs it once, as the server does."""
    with caplog.at_level(logging.WARNING, logger="glimmer.protocol.output_parser"):
        reply = llm.chat([{"role": "user", "content": "[invent-user] Go on."}],
                         SamplingParams(temperature=0, max_tokens=200, n=2), chat_template_kwargs=PINNED_DATE,
                         use_tqdm=False)[0]
    assert [choice.content for choice in reply.choices] == ["Sure, done."] * 2
    discarded = [record for record in caplog.records if "discarding a message" in record.getMessage()]
    assert [record.getMessage() for record in discarded] == [
        "discarding a message with the ill-formed header 'user'"] * 2


def test_special_tokens_stay_out_of_reasoning_and_answer_unless_asked_for(client):
    result = _both(client, **_request("[specials]"))
    assert (result["reasoning"], result["content"]) == ("Looking.", "Hi there!")
    kept = _both(client, **_request("[specials]", extra_body={"chat_template_kwargs": PINNED_DATE,
                                                              "skip_special_tokens": False}))
    assert (kept["reasoning"], kept["content"]) == ("Look<|image_end|>ing.", "Hi<|image_end|> there<|patch|>!")


def test_llm_chat_hides_the_special_token_not_text_spelling_it_before(client, server, llm):
    """A hidden special token is left out where its token stands: LLM.chat removed the first text spelling it, which
    the model may have written before the token (the server's answer kept that text and dropped the token)."""
    tokenizer = llm.get_tokenizer().tokenizer
    turn = (tokenizer.encode(" to=user<|message|>A") + tokenizer.encode_text("<|image_end|>")
            + tokenizer.encode("B<|image_end|>C<|eot|>"))
    for runner in (server.engine.engine.runner, llm.engine.runner):
        runner.add_ids("[spelled-special]", turn)
    request = _request("[spelled-special]")
    reply = llm.chat(request["messages"], SamplingParams(temperature=0, max_tokens=200),
                     chat_template_kwargs=PINNED_DATE, use_tqdm=False)[0]
    assert reply.content == _both(client, **request)["content"] == "A<|image_end|>BC"


def test_a_hidden_special_token_does_not_shift_the_reasoning_token_count(client, server):
    # P-API-5: every token of the reasoning message counts, the hidden <|image_end|> and those after it too
    reasoning_message = WITH_MEDIA_MARKERS[:WITH_MEDIA_MARKERS.index("<|eom|>") + len("<|eom|>")]
    for skip in (True, False):
        result = _both(client, **_request("[specials]", extra_body={"chat_template_kwargs": PINNED_DATE,
                                                                    "skip_special_tokens": skip}))
        assert result["usage"].completion_tokens_details.reasoning_tokens == _token_count(server, reasoning_message)


def test_truncation_mid_call_reports_length_and_keeps_valid_json(client, server):
    cut = _token_count(server, f" to=get_weather<|message|>{WEATHER_CALL_BODY}") - 8
    result = _both(client, **_request("[two-calls]", tools=TOOLS, max_tokens=cut))
    assert result["finish_reason"] == "length"  # P-API-2, even with calls
    # P-ATEM-5: kept with its complete parameters; the cut falls in the closers after `days` (`...</`)
    assert result["calls"] == [("get_weather", {"city": "Paris", "days": 3})]
    days = WEATHER_CALL_BODY.index('<atem:parameter name="days"') + len('<atem:parameter name="da')
    short_cut = _token_count(server, f" to=get_weather<|message|>{WEATHER_CALL_BODY[:days]}")
    short = _both(client, **_request("[two-calls]", tools=TOOLS, max_tokens=short_cut))
    assert short["calls"] == [("get_weather", {"city": "Paris"})]  # cut inside `days`: its value is dropped


def test_include_reasoning_false_hides_reasoning(client):
    result = _both(client, **_request("[reason-answer]", extra_body={"include_reasoning": False,
                                                                       "chat_template_kwargs": PINNED_DATE}))
    assert result["reasoning"] is None
    assert result["content"] == "Hello there!"
    assert result["usage"].completion_tokens_details.reasoning_tokens > 0


def test_each_of_n_choices_has_its_own_parser(client, server):
    response = client.chat.completions.create(n=3, **_request("[reason-call]", tools=TOOLS))
    assert [choice.index for choice in response.choices] == [0, 1, 2]
    for choice in response.choices:
        assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
            ("get_weather", WEATHER_ARGUMENTS)]
        assert choice.message.model_extra["reasoning_content"] == "I should look the weather up."
    ids = [choice.message.tool_calls[0].id for choice in response.choices]
    assert len(set(ids)) == 3
    assert response.usage.completion_tokens == 3 * _token_count(server, REASON_THEN_CALL)


def test_reasoning_effort_reaches_the_template_as_strength(client, server):
    _non_streamed(client, **_request("[reason-answer]", reasoning_effort="minimal"))
    assert "Reasoning strength: low." in server.engine.engine.runner.prompts[-1]  # P-EFF-2


@pytest.mark.parametrize(("key", "content"), [("[reason-answer]", "Hello there!"), ("[specials]", "Hi there!"),
                                              ("[reason-call]", "")])
def test_logprobs_list_the_answer_tokens_only_streamed_and_not(client, key, content):
    """OpenAI's `logprobs.content` holds the message content's tokens: the reasoning's, the call's, headers,
    terminators and hidden special tokens are left out, so the tokens spell the content."""
    request = _request(key, tools=TOOLS, logprobs=True, top_logprobs=2)
    response = client.chat.completions.create(**request)
    entries = response.choices[0].logprobs.content
    assert (response.choices[0].message.content or "") == content
    assert "".join(entry.token for entry in entries) == content
    assert all(len(entry.top_logprobs) == 2 for entry in entries)
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            if choice.logprobs:
                assert not choice.delta.model_extra.get("reasoning_content") and not choice.delta.tool_calls
                streamed += [(entry.token, entry.logprob) for entry in choice.logprobs.content]
    assert streamed == [(entry.token, entry.logprob) for entry in entries]


def test_a_call_of_an_undeclared_tool_passes_through_and_is_counted(client, server):
    # P-NAME-3: unresolved names pass through unchanged, with a warning and a counter
    result = _both(client, **_request("[unknown-call]", tools=TOOLS))
    assert result["calls"] == [("send_mail", {"to": "ann@example.org"})]
    assert server.metrics()["glimmer_unresolved_tool_calls_total"] >= 2


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_a_strict_or_forced_call_may_write_closing_tags_in_a_string(client, tool_choice):
    """A strict tool (the OpenAI Agents SDK's default) or a forced call is written under a grammar, whose raw values
    held no `</`: a string argument with HTML or XML in it (`</b>`) was steered into something else. Only the
    parameter's own closer ends it (P-ATEM-2)."""
    strict = {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}
    result = _both(client, **_request("[html-call]", tools=[strict], tool_choice=tool_choice))
    assert result["calls"] == [("get_weather", {"city": "<b>Paris</b> </atem:parameter\n"})]
    assert result["finish_reason"] == "tool_calls"



@pytest.mark.parametrize(("key", "fields"), [("[invent-then-call]", {}), ("[invent-then-call]", {"max_tokens": 40}),
                                             ("[stop-then-call]", {"stop": ["HALT"]}),
                                             ("[call-then-answer]", {"parallel_tool_calls": False}),
                                             ("[call-then-answer]", {"stop": ["sunny"]}),
                                             ("[stop-across-call]", {"stop": ["HALT"]}),
                                             ("[stop-across-reasoning]", {"stop": ["HALT"]})])
def test_llm_chat_ends_the_reply_where_the_server_ends_it(client, llm, key, fields):
    """The server ends a choice at another role's header (P-HDR-8), at a stop string in the answer (P-REQ-2) and, with
    parallel_tool_calls false, at the first call; LLM.chat read the turn on, and returned the call made for the
    invented user turn, the reasoning and call after the stop string, the answer after the call. A max_tokens that
    cuts the invented turn does not end the reply: the header did (finish_reason stop). A stop string in an answer
    after a call ends the reply with the call: finish_reason tool_calls (P-API-2), which LLM.chat said was stop. A stop
    string does not span a call or reasoning between two answer messages (the server releases the answer text it
    holds before another kind's event): LLM.chat cut the answer there."""
    stop, max_tokens = fields.get("stop"), fields.get("max_tokens", 200)
    request = _request(key, tools=TOOLS, max_tokens=max_tokens, **({"stop": stop} if stop else {}),
                       **({"parallel_tool_calls": False} if "parallel_tool_calls" in fields else {}))
    served = _non_streamed(client, **request)
    reply = llm.chat(request["messages"], SamplingParams(temperature=0, max_tokens=max_tokens, stop=stop), tools=TOOLS,
                     chat_template_kwargs=PINNED_DATE, use_tqdm=False,
                     parallel_tool_calls=fields.get("parallel_tool_calls", True))[0]
    calls = [(call.name, json.loads(call.arguments)) for call in reply.tool_calls]
    assert (reply.reasoning, reply.content, calls, reply.finish_reason) == (
        served["reasoning"], served["content"], served["calls"], served["finish_reason"])


@pytest.mark.parametrize("key", ["[reason-answer]", "[two-calls]", "[call-then-answer]"])
def test_the_body_and_every_chunk_validate_as_the_sdks_types(server, key):
    """The SDK builds its objects without validating them (`construct`), so the tests above, which read through it,
    would take a body of the wrong shape; clients and agent frameworks that validate (`model_validate`) would not.
    Reasoning, parallel calls, logprobs, n > 1 and the usage chunk, each body validated as the SDK's type."""
    body = _request(key, tools=TOOLS, logprobs=True, top_logprobs=2, n=2)
    body.update(body.pop("extra_body"))
    reply = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    whole = ChatCompletion.model_validate(reply.json())
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=stream, timeout=60) as events:
        data = [line[len("data: "):] for line in events.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(line) for line in data[:-1]]
    assert [choice.index for choice in whole.choices] == [0, 1]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
