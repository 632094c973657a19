"""`glimmer chat`: rendering a stream to the terminal, and a whole exchange with a live (scripted) server."""

from __future__ import annotations

import io
import json

import pytest
from server_support import AGENT_SCRIPTS, WEATHER_TOOL, live_server

from glimmer.server.chat_client import (
    DIM,
    RESET,
    TOOL,
    ChatClientError,
    StreamRenderer,
    check_server,
    check_server_url,
    parse_sse_lines,
    run_chat,
)


def chunk(**delta):
    finish = delta.pop("finish_reason", None)
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


STREAM = [
    chunk(role="assistant"),
    chunk(reasoning_content="Let me ", reasoning="Let me "),
    chunk(reasoning_content="check.", reasoning="check."),
    chunk(content="Checking now."),
    chunk(tool_calls=[{"index": 0, "id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": '{"city": "Paris"'}}]),
    chunk(tool_calls=[{"index": 0, "function": {"arguments": "}"}}]),
    chunk(tool_calls=[{"index": 1, "id": "call_2", "type": "function",
                       "function": {"name": "get_time", "arguments": "{}"}}]),
    chunk(finish_reason="tool_calls"),
]


def render(chunks, color=False):
    out = io.StringIO()
    renderer = StreamRenderer(out, color=color)
    for piece in chunks:
        renderer.feed(piece)
    message = renderer.finish()
    return out.getvalue(), message, renderer


def test_a_stream_renders_reasoning_answer_and_calls_in_order():
    text, _, _ = render(STREAM)
    assert text == 'Let me check.\nChecking now.\n→ get_weather({"city": "Paris"})\n→ get_time({})\n'


def test_reasoning_is_dimmed_and_calls_colored():
    text, _, _ = render(STREAM, color=True)
    assert f"{DIM}Let me {RESET}" in text and f"{TOOL}→ get_weather({RESET}" in text
    assert "Checking now." in text.replace(DIM, "").split(RESET)[2]


def test_the_assembled_message_goes_back_into_the_history():
    _, message, renderer = render(STREAM)
    assert message == {
        "role": "assistant", "content": "Checking now.", "reasoning_content": "Let me check.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    }
    assert renderer.finish_reason == "tool_calls"


def test_a_server_that_repeats_the_call_id_in_every_delta_gives_one_call():
    """Deltas belong to calls by `index` (the OpenAI stream's key); some servers repeat the id in each delta."""
    same = [chunk(tool_calls=[{"index": 0, "id": "call_x", "type": "function",
                               "function": {"name": "get_weather", "arguments": piece}}])
            for piece in ('{"city"', ': "Paris"}')]
    text, message, _ = render([chunk(role="assistant"), *same, chunk(finish_reason="tool_calls")])
    assert text == '→ get_weather({"city": "Paris"})\n'
    assert message["tool_calls"] == [{"id": "call_x", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]


def test_a_broken_stream_is_a_chat_error_and_the_turn_is_dropped():
    """A stream that is cut, sends an event that is not JSON, or ends without [DONE]: one error line, the chat
    goes on without the turn (no traceback, no half reply in the history)."""
    import http.server
    import threading

    bodies = iter([
        b'data: {"choices": [{"index": 0, "delta": {"content": "hi"\n\n',  # not JSON
        b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n',  # no [DONE]: cut short
        b'data: {"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}\n\n'
        b"data: [DONE]\n\n",
    ])
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = next(bodies)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        lines = iter(["one", "two", "three", "/exit"])
        out = io.StringIO()
        run_chat(f"http://127.0.0.1:{server.server_address[1]}", model=None, api_key=None, out=out,
                 read_line=lambda prompt: next(lines), color=False)
    finally:
        server.shutdown()
    text = out.getvalue()
    assert "error: the server sent an event that is not JSON" in text
    assert "ended before it finished (no [DONE])" in text and "Traceback" not in text
    # the third request carries only its own message: the broken turns were dropped
    assert [m["content"] for m in seen[2]["messages"]] == ["three"]


def test_an_error_event_raises():
    with pytest.raises(ChatClientError, match="no call"):
        render([chunk(role="assistant"), {"error": {"message": "no call", "type": "tool_choice_unsatisfied"}}])


def test_sse_lines_parse_until_done():
    lines = ['data: {"a": 1}', "", ": comment", 'data: {"b": 2}', "data: [DONE]", 'data: {"c": 3}']
    assert list(parse_sse_lines(lines)) == [{"a": 1}, {"b": 2}]


def test_a_chat_exchange_against_a_live_server(make_tiny):
    with live_server(make_tiny(), scripted=True) as server:
        server.engine.engine.runner.add("[hello]", " to=self<|message|>A greeting.<|eom|>"
                                                   "<|start|>assistant to=user<|message|>Hi!<|eot|>")
        lines = iter(["[hello] h\udcffello", "", "/exit"])  # a byte that is not UTF-8, as Python reads it
        out = io.StringIO()
        run_chat(server.url, model="tiny", api_key=None, out=out, read_line=lambda prompt: next(lines),
                 request_options={"temperature": 0, "chat_template_kwargs": {"current_date": "2026-01-01"}},
                 color=False)
    assert "A greeting.\nHi!\n" in out.getvalue() and "error" not in out.getvalue()


RESULT_PROMPT = 'get_weather({"city": "Paris"}) result> '


def scripted_tool_chat(make_tiny, lines):
    """A chat with --tools against a scripted server: [weather] calls get_weather, [sunny-result] answers."""
    with live_server(make_tiny(), scripted=True) as server:
        runner = server.engine.engine.runner
        for key, text in AGENT_SCRIPTS.items():
            runner.add(key, text)
        prompts = []
        out = io.StringIO()

        def read_line(prompt):
            prompts.append(prompt)
            return next(lines)

        run_chat(server.url, model="tiny", api_key=None, out=out, read_line=read_line, tools=[WEATHER_TOOL],
                 request_options={"temperature": 0, "chat_template_kwargs": {"current_date": "2026-01-01"}},
                 color=False)
        return out.getvalue(), prompts, runner.prompts


def test_a_tool_call_in_the_chat_asks_for_its_result_and_the_reply_goes_on_from_it(make_tiny):
    text, prompts, model_prompts = scripted_tool_chat(make_tiny, iter(["[weather] in Paris?", "[sunny-result]",
                                                                       "/exit"]))
    assert prompts == ["you> ", RESULT_PROMPT, "you> "]
    assert '→ get_weather({"city": "Paris"})' in text and "The tool says sunny.\nIt is sunny in Paris.\n" in text
    assert "error" not in text
    # the second request carried the call and its result: the model saw the result after the call
    continued = model_prompts[-1]
    assert continued.index("<atem:invoke") < continued.index("[sunny-result]")


@pytest.mark.parametrize("answer", ["/exit", "/reset"])
def test_exit_or_reset_at_a_result_prompt_drop_the_unanswered_turn(make_tiny, answer):
    lines = iter(["[weather] in Paris?", answer, "[greet] hi", "/exit"])
    text, prompts, model_prompts = scripted_tool_chat(make_tiny, lines)
    if answer == "/exit":
        assert prompts == ["you> ", RESULT_PROMPT] and len(model_prompts) == 1
    else:  # the next message starts a new conversation: no trace of the call
        assert prompts == ["you> ", RESULT_PROMPT, "you> ", "you> "]
        assert "Hello there!" in text and "[weather]" not in model_prompts[-1]


def test_end_of_input_at_a_result_prompt_ends_the_chat(make_tiny):
    def lines():
        yield "[weather] in Paris?"
        raise EOFError
    text, prompts, _ = scripted_tool_chat(make_tiny, lines())
    assert prompts == ["you> ", RESULT_PROMPT] and text.endswith("\n")


def test_the_chat_sends_one_cache_salt_per_session_so_salted_servers_take_it(make_tiny):
    with live_server(make_tiny(), require_cache_salt=True) as server:
        lines = iter(["Hello there, how are you today? " * 4, "And again?", "/exit"])
        out = io.StringIO()
        run_chat(server.url, model="tiny", api_key=None, out=out, read_line=lambda prompt: next(lines),
                 request_options={"max_tokens": 2, "chat_template_kwargs": {"current_date": "2026-01-01"}},
                 color=False)
        assert "error" not in out.getvalue()
        assert server.metrics()["glimmer_prefix_cache_hit_rate"] > 0  # the second turn reused the first's blocks


def test_a_refused_request_is_reported_and_the_chat_goes_on(make_tiny):
    with live_server(make_tiny()) as server:
        lines = iter(["hello", "/exit"])
        out = io.StringIO()
        run_chat(server.url, model="no-such-model", api_key=None, out=out, read_line=lambda prompt: next(lines),
                 color=False)
    assert "error: HTTP 404" in out.getvalue()


@pytest.mark.parametrize("api_key", [None, "wrong-key"])
def test_a_keyed_server_refusing_the_chat_says_how_to_give_the_key(make_tiny, api_key):
    with live_server(make_tiny(), api_key="right-key") as server, pytest.raises(ChatClientError) as refused:
        check_server(server.url, api_key)
    message = str(refused.value)
    assert ("refused the API key" if api_key else "needs an API key") in message
    assert message.endswith("pass the server's key with --api-key KEY or set GLIMMER_API_KEY")


@pytest.mark.parametrize("url", ["notaurl", "localhost:8000", "file:///etc/passwd", "http://", "http://h:99999"])
def test_a_url_that_is_not_an_http_server_address_is_refused_before_any_request(url):
    with pytest.raises(ChatClientError, match="http://127.0.0.1:8000"):
        check_server(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://glimmer.example.com/base/", "http://[::1]:80"])
def test_http_server_addresses_pass_the_url_check(url):
    check_server_url(url)
