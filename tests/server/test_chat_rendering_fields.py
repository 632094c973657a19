"""vLLM's rendering fields on /v1/chat/completions, through the real server with a scripted model: where the prompt
ends (`add_generation_prompt`, `continue_final_message`, P-TMPL-8). The prompt they make is tested in
test_chat_prompt.py; here, the reply, streamed and not."""

from __future__ import annotations

import json

import httpx
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
        runner.add("[weather-call]", '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter '
                   'name="city">Paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|>')
        yield live


def chat(server, **fields) -> httpx.Response:
    body = {"model": "tiny", "max_tokens": 40, "temperature": 0, "chat_template_kwargs": PINNED_DATE, **fields}
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)


def streamed_message(server, **fields) -> dict:
    """The deltas of a streamed chat completion's first choice, joined: content and the calls' names and arguments."""
    body = {"model": "tiny", "max_tokens": 40, "temperature": 0, "chat_template_kwargs": PINNED_DATE, "stream": True,
            **fields}
    message: dict = {"content": "", "calls": {}}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[len("data: "):])["choices"]:
                delta = choice["delta"]
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


def test_a_refused_combination_is_a_400_naming_the_field(server):
    response = chat(server, messages=COLOR, continue_final_message=True, add_generation_prompt=True)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "continue_final_message" and "add_generation_prompt=True" in error["message"]
