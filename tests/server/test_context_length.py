"""A request whose prompt the context cannot hold: the 400 says the prompt's tokens, the limit, and which part of the
request made the prompt long (tools, instructions, a system message, chat_template_kwargs, images), naming that
part's field in `param`; its message opens as vLLM's and OpenAI's ("This model's maximum context length is N
tokens"), which LiteLLM matches to raise ContextWindowExceededError, and its code is OpenAI's
context_length_exceeded. The fuzz run's 400s said "shorten the messages" (`input` on /v1/responses) whatever made
the prompt long."""

from __future__ import annotations

import base64
import io
import json
import re

import httpx
import numpy as np
import pytest
from PIL import Image
from server_support import PINNED_DATE, live_server

from glimmer.errors import ContextLengthError, PromptPart

LIMIT = 512  # max_model_len of the servers here
LONG = "lighthouse keepers watch the sea " * 120  # well over LIMIT tokens on its own
TOOL_TEXT = "lighthouse " * 60  # its tool over LIMIT, and the template's messages more than a twentieth of that
OPENING = f"This model's maximum context length is {LIMIT} tokens (max_model_len), but "


def _tool(description: str) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "description": description,
                                             "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), engine_options={"max_model_len": LIMIT}) as live:
        yield live


def _refusal(server, path: str, body: dict) -> dict:
    response = httpx.post(server.base_url + path, json={"model": "tiny", **body}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["message"].startswith(OPENING), error
    return error


def _shares(message: str) -> dict[str, int]:
    """The parts the message counts: `tools 480, messages 40` → {"tools": 480, "messages": 40}; none where the prompt
    is one part."""
    listed = re.search(r"the prompt has \d+ tokens \(([^)]*)\)|in the prompt \(([^)]*)\)", message)
    if listed is None:
        return {}
    return {name: int(tokens) for name, tokens in re.findall(r"([\w\[\]. ]+?) (\d+)(?:, |$)",
                                                             listed[1] or listed[2])}


def _chat(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "chat_template_kwargs": PINNED_DATE,
            **fields}


def _prompt_tokens(message: str) -> int:
    found = re.search(r"the prompt has (\d+) tokens|\((\d+) in the prompt", message)
    return int(found[1] or found[2])


@pytest.mark.parametrize(("fields", "param", "largest"), [
    ({"tools": [_tool(TOOL_TEXT)]}, "tools", "tools"),
    ({"messages": [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}]}, "messages[0]",
     "messages[0]"),
    ({"messages": [{"role": "user", "content": LONG}]}, "messages", None),
    ({"chat_template_kwargs": {"current_date": LONG}}, "chat_template_kwargs", "chat_template_kwargs"),
])
def test_a_chat_prompt_too_long_names_the_part_that_made_it_long(server, fields, param, largest):
    error = _refusal(server, "/chat/completions", _chat(**fields))
    shares = _shares(error["message"])  # the messages alone: not listed
    assert error["param"] == param and max(shares, key=shares.get, default=None) == largest, error
    assert sum(shares.values()) <= _prompt_tokens(error["message"]) > LIMIT
    assert error["message"].endswith(f"shorten or remove {largest}" if largest else "shorten the messages"), error


def test_a_chat_prompt_and_max_tokens_too_long_names_max_tokens_and_the_prompts_parts(server):
    messages = [{"role": "system", "content": "lighthouse " * 60}, {"role": "user", "content": "hi"}]
    error = _refusal(server, "/chat/completions", _chat(messages=messages, max_tokens=LIMIT))
    prompt = _prompt_tokens(error["message"])
    assert error["param"] == "max_tokens" and prompt < LIMIT and "messages[0]" in _shares(error["message"]), error
    assert f"you requested {prompt + LIMIT} tokens ({prompt} in the prompt (" in error["message"]
    assert f"{LIMIT} in the completion); lower max_tokens to at most {LIMIT - prompt}, or " in error["message"]
    completion = _refusal(server, "/chat/completions",
                          _chat(messages=messages, max_tokens=None, max_completion_tokens=LIMIT))
    assert completion["param"] == "max_completion_tokens" and "max_tokens" not in completion["message"], completion


@pytest.mark.parametrize(("fields", "param", "fix"), [
    ({"instructions": LONG, "input": "hi"}, "instructions", "shorten or remove instructions"),
    ({"instructions": LONG,  # each system message is measured on its own: the instructions, not both, are named
      "input": [{"role": "system", "content": "be brief " * 30}, {"role": "user", "content": "hi"}]},
     "instructions", "shorten or remove instructions"),
    ({"tools": [{"type": "function", "name": "get_weather", "description": TOOL_TEXT, "parameters": {}}],
      "input": "hi"},
     "tools", "shorten or remove tools"),
    ({"input": LONG}, "input", "shorten the input"),
])
def test_a_responses_prompt_too_long_names_its_own_field(server, fields, param, fix):
    """It said "shorten the messages", param `input`, for long instructions or tools too."""
    error = _refusal(server, "/responses", {"max_output_tokens": 4, **fields})
    shares = _shares(error["message"])
    assert error["param"] == param and error["message"].endswith(fix), error
    assert max(shares, key=shares.get, default="input") == param and "messages" not in error["message"], error


def test_a_responses_prompt_long_with_the_conversation_it_continues_names_previous_response_id(server):
    """It said "the prompt has 536 tokens; shorten the input", param `input`, of a short input after a long
    conversation: shortening the input did not help, the conversation previous_response_id continues held most of
    it. The refusal counts that conversation apart and says how to leave it."""
    first = httpx.post(server.base_url + "/responses", timeout=60, json={
        "model": "tiny", "input": "lighthouse keepers watch the sea " * 15, "max_output_tokens": 4,
        "chat_template_kwargs": PINNED_DATE}).json()
    error = _refusal(server, "/responses", {"previous_response_id": first["id"], "max_output_tokens": 4,
                                            "input": "keep the light burning " * 12})
    shares = _shares(error["message"])
    assert set(shares) == {"previous_response_id", "input"} and shares["previous_response_id"] > shares["input"], error
    assert error["param"] == "previous_response_id", error
    assert error["message"].endswith("continue an earlier response, or send a shorter conversation as input without "
                                     "previous_response_id"), error


def test_a_responses_prompt_answering_the_call_its_conversation_ends_in_counts_that_conversation(make_tiny):
    """The agent loop: the response continued ends in a call, and the input starts with that call's output. Measuring
    the conversation by rendering the prompt without it left the output answering no call, the render failed, and
    the conversation went uncounted: "(input 1393, tools 652); shorten the input", its tokens inside `input`."""
    tool = {"type": "function", "name": "get_weather", "description": "the weather in a city", "parameters": {}}
    limit = 2048
    with live_server(make_tiny(), engine_options={"max_model_len": limit}) as live:
        first = httpx.post(live.base_url + "/responses", timeout=60, json={
            "model": "tiny", "input": "lighthouse keepers watch the sea " * 50, "max_output_tokens": 64,
            "tools": [tool], "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": False,
            "chat_template_kwargs": PINNED_DATE}).json()
        assert first.get("output", [{}])[-1].get("type") == "function_call", first
        output = {"type": "function_call_output", "call_id": first["output"][-1]["call_id"], "output": "sunny " * 90}
        response = httpx.post(live.base_url + "/responses", timeout=60, json={
            "model": "tiny", "previous_response_id": first["id"], "max_output_tokens": 4, "tools": [tool],
            "input": [output]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    shares = _shares(error["message"])
    assert shares.get("previous_response_id", 0) > shares.get("input", 0) > 0, error
    assert sum(shares.values()) <= _prompt_tokens(error["message"]) and error["param"] == "previous_response_id", error


def test_a_completions_prompt_too_long_is_refused_with_the_code_and_names_the_prompt(server):
    error = _refusal(server, "/completions", {"prompt": [50] * (LIMIT + 1), "max_tokens": 1})
    assert error["param"] == "prompt", error
    assert error["message"] == f"{OPENING}the prompt has {LIMIT + 1} tokens; shorten the prompt"


def test_images_that_make_the_prompt_too_long_are_named(make_tiny):
    buffer = io.BytesIO()
    Image.fromarray(np.full((480, 640, 3), 200, dtype="uint8")).save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    content = [*[{"type": "image_url", "image_url": {"url": url}}] * 4, {"type": "text", "text": "What is it?"}]
    limit = 320  # the four images' whole expansions (260 tokens) fit alone; with the chat's text they do not
    with live_server(make_tiny("canonical", vision=True, seed=17), engine_options={"max_model_len": limit}) as live:
        response = httpx.post(live.base_url + "/chat/completions",
                              json={"model": "tiny", **_chat(messages=[{"role": "user", "content": content}])})
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded", error
    assert error["message"].startswith(f"This model's maximum context length is {limit} tokens"), error
    shares = _shares(error["message"])
    assert max(shares, key=shares.get) == "images" and error["param"] == "messages", error
    assert error["message"].endswith("shorten or remove images"), error


@pytest.mark.parametrize("path", ["/chat/completions", "/completions", "/responses"])
def test_a_prompt_refused_for_its_characters_before_tokenizing_is_a_context_length_refusal_too(server, path):
    """A text longer than max_model_len tokens could hold is refused before it is tokenized: that 400 said "the
    prompt has N characters, more than max_model_len=M tokens can hold", without the code or the words LiteLLM
    matches."""
    text = "x" * (server.engine.engine.max_prompt_chars + 1)
    body = {"/chat/completions": _chat(messages=[{"role": "user", "content": text}]),
            "/completions": {"prompt": text, "max_tokens": 1}, "/responses": {"input": text}}[path]
    error = _refusal(server, path, body)
    assert re.search(r"the prompt has [\d,]+ characters, more than that can hold", error["message"]), error
    assert error["param"] == {"/chat/completions": "messages", "/completions": "prompt", "/responses": "input"}[path]


@pytest.mark.parametrize(("path", "fields", "param", "fix"), [
    ("/responses", {"instructions": "INSTRUCTIONS", "input": "hi"}, "instructions", "shorten or remove instructions"),
    ("/responses", {"input": "INSTRUCTIONS"}, "input", "shorten the input"),
    ("/chat/completions", _chat(messages=[{"role": "system", "content": "INSTRUCTIONS"},
                                          {"role": "user", "content": "hi"}]),
     "messages[0]", "shorten or remove messages[0]"),
])
def test_a_prompt_refused_for_its_characters_names_the_field_that_made_it_long(server, path, fields, param, fix):
    """Long instructions refused before tokenizing said "shorten the input", param `input`, though the input was
    `hi`: the parts are measured in characters there, and the largest is named as the token count names it."""
    text = "x" * (server.engine.engine.max_prompt_chars + 1)
    body = json.loads(json.dumps(fields).replace('"INSTRUCTIONS"', json.dumps(text)))
    error = _refusal(server, path, body)
    assert re.search(r"the prompt has [\d,]+ characters\b.*, more than that can hold", error["message"]), error
    assert error["param"] == param and error["message"].endswith(fix), error


def test_the_refusal_is_recognised_by_the_phrase_litellm_matches():
    """LiteLLM's context-window check matches "this model's maximum context length is" in the lowercased message."""
    for error in (ContextLengthError(LIMIT, LIMIT + 1), ContextLengthError(LIMIT, 8, LIMIT),
                  ContextLengthError(LIMIT, LIMIT + 1, parts=[PromptPart("tools", LIMIT, "tools")])):
        assert "this model's maximum context length is" in str(error).lower()
        assert error.code == "context_length_exceeded"


def test_a_part_carries_its_own_fix_and_the_refusal_gives_it():
    """The fix for the conversation previous_response_id continues was a /v1/responses name spelt in the shared
    errors module, which LLM and the engine use: the part (built by the server) carries it now, and a part named so
    without one gets the fix every removable part gets."""
    fix = "continue an earlier response"
    continued = PromptPart("previous_response_id", LIMIT, "previous_response_id", fix=fix)
    for error in (ContextLengthError(LIMIT, LIMIT + 1, parts=[continued]),
                  ContextLengthError(LIMIT, 8, LIMIT, parts=[continued])):
        assert str(error).endswith(fix), error
    plain = ContextLengthError(LIMIT, LIMIT + 1, parts=[PromptPart("previous_response_id", LIMIT, "x")])
    assert str(plain).endswith("shorten or remove previous_response_id"), plain
