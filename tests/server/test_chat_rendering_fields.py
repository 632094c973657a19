"""vLLM's rendering fields on /v1/chat/completions, through the real server with a scripted model: where the prompt
ends (`add_generation_prompt`, `continue_final_message`, P-TMPL-8), `echo`, and a request's own `chat_template`.
The prompt they make is tested in test_chat_prompt.py; here, the reply, streamed and not, and the HTTP answer."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_support import PINNED_DATE, WEATHER_TOOL, live_server

COLOR = [{"role": "user", "content": "[color] Name a color."}, {"role": "assistant", "content": "My favorite is"}]
WEATHER = [{"role": "user", "content": "[weather-call] Weather in Paris?"},
           {"role": "assistant", "recipient": "get_weather", "content": ""}]  # the call's header, written for it


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), scripted=True) as live:
        runner = live.engine.engine.runner
        runner.add("My favorite is", " blue, of course.<|eot|>")
        runner.add("[parts]", " to=user<|message|>Done.<|eot|>")
        runner.add("[weather-call]", '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter '
                   'name="city">Paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>')
        runner.add("[weather-open]", 'Paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>')
        runner.add("[weather-days]", '3</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>')
        runner.add("[think]", " about it.<|eom|><|start|>assistant to=user<|message|>Blue.<|eot|>")
        runner.add("[own-headers]", "<|start|>assistant to=self<|message|>Look it up.<|eom|><|start|>assistant "
                   'to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
                   '<atem:parameter name="city">Oslo</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>')
        yield live


def chat(server, **fields) -> httpx.Response:
    body = {"model": "tiny", "max_tokens": 40, "temperature": 0, "chat_template_kwargs": PINNED_DATE, **fields}
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)


def streamed_deltas(server, **fields) -> list[tuple[int, dict]]:
    """(choice index, delta) of each chunk of a streamed chat completion, in order."""
    body = {"model": "tiny", "max_tokens": 40, "temperature": 0, "chat_template_kwargs": PINNED_DATE, "stream": True,
            **fields}
    deltas = []
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                deltas += [(choice["index"], choice["delta"]) for choice in json.loads(line[len("data: "):])["choices"]]
    return deltas


def streamed_message(server, **fields) -> dict:
    """The deltas of a streamed chat completion's first choice, joined: content and the calls' names and arguments."""
    message: dict = {"content": "", "calls": {}}
    for index, delta in streamed_deltas(server, **fields):
        if index == 0:
            message["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                name, arguments = message["calls"].get(call["index"], ("", ""))
                function = call.get("function") or {}
                message["calls"][call["index"]] = (name + (function.get("name") or ""),
                                                   arguments + (function.get("arguments") or ""))
    return message


def test_a_continued_answer_comes_back_as_its_continuation_streamed_or_not(server):
    """P-TMPL-8: the reply is the rest of the final message's body, read from inside it: its leading space is kept,
    and nothing of it is taken for a new message's header."""
    response = chat(server, messages=COLOR, continue_final_message=True)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (" blue, of course.", "stop")
    assert streamed_message(server, messages=COLOR, continue_final_message=True)["content"] == " blue, of course."
    assert server.engine.engine.runner.prompts[-1].endswith("<|start|>assistant to=user<|message|>My favorite is")


def test_a_continued_message_to_a_tool_comes_back_as_the_call(server):
    """The final message's recipient is a tool: the continuation is read in that tool's channel."""
    response = chat(server, messages=WEATHER, tools=[WEATHER_TOOL], continue_final_message=True)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    streamed = streamed_message(server, messages=WEATHER, tools=[WEATHER_TOOL], continue_final_message=True)
    assert streamed["calls"] == {0: ("get_weather", '{"city": "Paris"}')} and streamed["content"] == ""


CALL_OPENED = '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">'


@pytest.mark.parametrize(("key", "prefix", "arguments"), [
    ("[weather-open]", CALL_OPENED, {"city": "Paris"}),
    ("[weather-days]", CALL_OPENED + 'Paris</atem:parameter>\n<atem:parameter name="days">',
     {"city": "Paris", "days": 3}),
], ids=["value-open", "a-parameter-complete"])
def test_a_continued_call_comes_back_whole_streamed_or_not(server, key, prefix, arguments):
    """The final message's ATEM is read from its prefix in the prompt on: the call returned is the whole call. The
    reply alone is text outside ATEM tags, which was dropped (content null, no call). P-API-4: the stream adds up to
    the response; the prefix is sent as neither content nor a second call, echo included."""
    messages = [{"role": "user", "content": f"{key} Weather in Paris?"},
                {"role": "assistant", "recipient": "get_weather", "content": prefix}]
    response = chat(server, messages=messages, tools=[WEATHER_TOOL], continue_final_message=True, echo=True)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    [call] = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", arguments)
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    streamed = streamed_message(server, messages=messages, tools=[WEATHER_TOOL], continue_final_message=True,
                                echo=True)
    assert streamed == {"content": "", "calls": {0: ("get_weather", call["function"]["arguments"])}}


def test_a_reply_after_the_final_message_is_read_from_the_headers_the_model_writes_streamed_or_not(server):
    """add_generation_prompt: false ends the prompt after the final message's <|eot|>: the reply's own <|start|> voids
    the parser's turn-start header (P-HDR-1, P-HDR-4), and each message goes to its recipient's channel, as after the
    generation prompt: reasoning, then the tool's call (README, /v1/chat/completions)."""
    messages = [{"role": "user", "content": "[own-headers] Weather in Oslo?"}]
    fields = {"messages": messages, "tools": [WEATHER_TOOL], "add_generation_prompt": False, "max_tokens": 80}
    response = chat(server, **fields)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert server.engine.engine.runner.prompts[-1].endswith("Weather in Oslo?<|eot|>")
    [call] = choice["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("get_weather", '{"city": "Oslo"}')
    assert (choice["message"]["reasoning_content"], choice["message"]["content"]) == ("Look it up.", None)
    assert choice["finish_reason"] == "tool_calls"
    assert streamed_reasoning(streamed_deltas(server, **fields)) == "Look it up."
    assert streamed_message(server, **fields) == {"content": "", "calls": {0: ("get_weather", '{"city": "Oslo"}')}}


def test_an_assistant_prefix_is_continued_as_continue_final_message_continues_it_streamed_or_not(server):
    """DeepSeek's and Kimi's assistant prefill, `"prefix": true` on the final assistant message (as vLLM continues it
    for the models whose API has it), was ignored: the message rendered finished and a new turn began after it. The
    reply continues it, as with `continue_final_message`, the openai SDK sending the field as an extra key."""
    prefixed = [COLOR[0], {**COLOR[1], "prefix": True}]
    response = chat(server, messages=prefixed)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (" blue, of course.", "stop")
    assert server.engine.engine.runner.prompts[-1].endswith("<|start|>assistant to=user<|message|>My favorite is")
    assert streamed_message(server, messages=prefixed)["content"] == " blue, of course."
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="tiny", messages=prefixed, max_tokens=40, temperature=0,
                                           extra_body={"chat_template_kwargs": PINNED_DATE})
    assert reply.choices[0].message.content == " blue, of course."
    tokens = [httpx.post(server.url + "/tokenize", timeout=30, json={
        "messages": messages, "chat_template_kwargs": PINNED_DATE, **fields}).json()["tokens"]
        for messages, fields in ((prefixed, {}), (COLOR, {"continue_final_message": True}))]
    assert tokens[0] == tokens[1]
    called = chat(server, messages=[WEATHER[0], {**WEATHER[1], "prefix": True}], tools=[WEATHER_TOOL])
    assert called.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(("messages", "fields", "param", "says"), [
    ([{**COLOR[0], "prefix": True}], {}, "messages[0].prefix", "'user' message"),
    ([COLOR[0], {**COLOR[1], "prefix": True}, COLOR[0]], {},
     "messages[1].prefix", "non-final 'assistant'"),
    ([COLOR[0], {**COLOR[1], "prefix": "yes"}], {}, "messages[1].prefix", "must be true or false"),
    ([COLOR[0], {**COLOR[1], "prefix": True}], {"add_generation_prompt": True}, "messages[1].prefix",
     "add_generation_prompt"),
    ([COLOR[0], {"role": "assistant", "content": None, "prefix": True}], {}, "messages[1].prefix",
     "nothing to continue"),
    ([COLOR[0], {**COLOR[1], "prefix": True}], {"tool_choice": "required", "tools": [WEATHER_TOOL]},
     "messages[1].prefix", "cannot be combined with tool_choice"),
])
def test_a_prefix_that_cannot_be_continued_is_a_400_naming_it(server, messages, fields, param, says):
    response = chat(server, messages=messages, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_a_refused_combination_is_a_400_naming_the_field(server):
    response = chat(server, messages=COLOR, continue_final_message=True, add_generation_prompt=True)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "continue_final_message" and "add_generation_prompt=True" in error["message"]


# echo: vLLM's, the final message's content before each choice's when it is the assistant's ------------------------

def test_echo_puts_the_continued_message_before_each_choice_streamed_or_not(server):
    """As vLLM: prepended to every choice's content; streamed, one chunk per choice right after the role chunks."""
    response = chat(server, messages=COLOR, continue_final_message=True, echo=True, n=2)
    assert response.status_code == 200, response.text
    contents = [choice["message"]["content"] for choice in response.json()["choices"]]
    assert contents == ["My favorite is blue, of course."] * 2
    deltas = streamed_deltas(server, messages=COLOR, continue_final_message=True, echo=True, n=2)
    assert deltas[:4] == [(0, {"role": "assistant"}), (1, {"role": "assistant"}),
                          (0, {"content": "My favorite is"}), (1, {"content": "My favorite is"})]
    for index in (0, 1):  # P-API-4: the stream adds up to the response
        assert "".join(delta.get("content") or "" for i, delta in deltas if i == index) == contents[index]


def test_echo_of_a_final_assistant_message_in_parts_joins_their_texts_with_newlines(server):
    parts = [{"type": "text", "text": "First."}, {"type": "text", "text": "Then"}]
    messages = [{"role": "user", "content": "[parts] Go."}, {"role": "assistant", "content": parts}]
    response = chat(server, messages=messages, echo=True)  # a new turn after it: still echoed, as in vLLM
    assert response.json()["choices"][0]["message"]["content"] == "First.\nThenDone."
    assert streamed_message(server, messages=messages, echo=True)["content"] == "First.\nThenDone."


THINKING = [{"role": "user", "content": "[think] Name a color."},
            {"role": "assistant", "recipient": "self", "content": "Let me think"}]


def streamed_reasoning(deltas: list[tuple[int, dict]], index: int = 0) -> str:
    return "".join(delta.get("reasoning_content") or "" for i, delta in deltas if i == index)


def test_echo_puts_a_continued_reasoning_message_before_each_choices_reasoning_streamed_or_not(server):
    """A message to `self` is reasoning (§2.1), and continued, its reply is read as the rest of it (P-TMPL-8): the echo
    goes where that text goes, before the reasoning (both its names), never into the answer. Streamed, one reasoning
    chunk per choice right after the role chunks; P-API-4: the stream adds up to the response."""
    response = chat(server, messages=THINKING, continue_final_message=True, echo=True, n=2)
    assert response.status_code == 200, response.text
    for choice in response.json()["choices"]:
        message = choice["message"]
        assert (message["reasoning_content"], message["reasoning"]) == ("Let me think about it.",) * 2
        assert message["content"] == "Blue."
    deltas = streamed_deltas(server, messages=THINKING, continue_final_message=True, echo=True, n=2)
    echoed = {"reasoning_content": "Let me think", "reasoning": "Let me think"}
    assert deltas[:4] == [(0, {"role": "assistant"}), (1, {"role": "assistant"}), (0, echoed), (1, echoed)]
    for index in (0, 1):
        assert streamed_reasoning(deltas, index) == "Let me think about it."
        assert "".join(delta.get("content") or "" for i, delta in deltas if i == index) == "Blue."


def test_echo_of_reasoning_is_left_out_with_the_reasoning(server):
    """include_reasoning: false leaves every reasoning text out of the response, the echoed one too."""
    response = chat(server, messages=THINKING, continue_final_message=True, echo=True, include_reasoning=False)
    message = response.json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (None, "Blue.")
    deltas = streamed_deltas(server, messages=THINKING, continue_final_message=True, echo=True,
                             include_reasoning=False)
    assert streamed_reasoning(deltas) == "" and deltas[1] != (0, {"content": "Let me think"})


def test_echo_leaves_a_reply_to_a_user_message_as_it_is(server):
    """The response's role is the assistant's: a final user message is not its to echo."""
    messages = [{"role": "user", "content": "[parts] Go."}]
    assert chat(server, messages=messages, echo=True).json()["choices"][0]["message"]["content"] == "Done."
    assert streamed_message(server, messages=messages, echo=True)["content"] == "Done."


# chat_template: a request's own template, under --trust-request-chat-template -------------------------------------

SIMPLE_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>"
                   "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}")


@pytest.fixture(scope="module")
def trusting_server(make_tiny):
    with live_server(make_tiny(), scripted=True, trust_request_chat_template=True) as live:
        live.engine.engine.runner.add("<|start|>user<|message|>[own] hi<|eot|>", " to=user<|message|>Hi!<|eot|>")
        yield live


def test_a_request_template_is_a_400_naming_the_flag_on_a_server_that_does_not_trust_them(server):
    response = chat(server, messages=COLOR[:1], chat_template=SIMPLE_TEMPLATE)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "chat_template" and "--trust-request-chat-template" in error["message"]


def test_a_trusted_request_template_renders_the_prompt_and_one_that_fails_is_a_400(trusting_server):
    response = chat(trusting_server, messages=[{"role": "user", "content": "[own] hi"}], chat_template=SIMPLE_TEMPLATE)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "Hi!"
    assert trusting_server.engine.engine.runner.prompts[-1] == (
        "<|begin_of_text|><|start|>user<|message|>[own] hi<|eot|><|start|>assistant")
    for template in ("{% for %}", "{{ lipsum.__globals__['os'] }}<|start|>assistant", "{{ bos_token }}no prompt end"):
        response = chat(trusting_server, messages=COLOR[:1], chat_template=template)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "chat_template"
