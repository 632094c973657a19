"""`glimmer chat`: rendering a stream to the terminal, and a whole exchange with a live (scripted) server."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import threading
from collections.abc import Iterator

import pytest
from server_support import WEATHER_TOOL, agent_server, live_server

from glimmer.server.chat_client import (
    DIM,
    RESET,
    TOOL,
    ChatClientError,
    ServerRefusedError,
    StreamRenderer,
    call_label,
    check_server,
    check_server_url,
    endpoint_url,
    length_notice,
    parse_sse_lines,
    run_chat,
)
from glimmer.server.settings import UNSENDABLE_KEY


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


@contextlib.contextmanager
def canned_server(replies: list[tuple[int | None, bytes] | tuple[int, bytes, dict[str, str]]]
                  ) -> Iterator[tuple[str, list[dict]]]:
    """A server answering each request with the next (status, body) of `replies` (a 200 to a POST as an event
    stream), or (status, body, headers), whose headers replace those it would send (a Content-Length longer than the
    body: the connection closes mid-body; None: that header left out), or (None, bytes), the bytes alone, no HTTP;
    yields its address and the list the POSTs' JSON bodies are appended to."""
    bodies, seen = iter(replies), []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.do_POST()

        def do_POST(self):  # noqa: N802 (http.server's name)
            if self.command == "POST":
                seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            status, body, *given = next(bodies)
            if status is None:
                self.wfile.write(body)
                return
            self.send_response(status)
            headers = {"Content-Length": str(len(body))}
            if status == 200 and self.command == "POST":
                headers["Content-Type"] = "text/event-stream"
            for name, value in (headers | (given[0] if given else {})).items():
                if value is not None:
                    self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def chat_text(url: str, messages: list[str]) -> str:
    """What `run_chat` against `url` prints as the user sends `messages` and then /exit."""
    lines = iter([*messages, "/exit"])
    out = io.StringIO()
    run_chat(url, model=None, api_key=None, out=out, read_line=lambda prompt: next(lines), color=False)
    return out.getvalue()


def test_https_to_a_plain_http_server_names_the_http_address():
    """`--url https://...` of a server without TLS said `[SSL: WRONG_VERSION_NUMBER] wrong version number
    (_ssl.c:1006)` and to start the server there, which was running."""
    with canned_server([(200, b'{"object": "list", "data": []}')] * 2) as (address, _):
        with pytest.raises(ChatClientError) as error:
            check_server(address.replace("http://", "https://") + "/v1", None, None)
    assert str(error.value).endswith(f"answers plain HTTP, not HTTPS (`glimmer serve` without --ssl-keyfile); "
                                     f"give {address}/v1")


def test_a_servers_refusal_of_the_check_shows_its_control_characters_as_symbols():
    """The check before the first message printed the server's error message as it came, where a refusal during the
    chat shows its control characters as symbols: a server (or whatever answered at its address) could clear the
    terminal, retitle its window or hide text with escape sequences in it."""
    body = json.dumps({"error": {"message": "no \x1b[2J\x1b]0;title\x07 model"}}).encode()
    with canned_server([(500, body)]) as (address, _), pytest.raises(ChatClientError) as refused:
        check_server(address)
    assert "\x1b" not in str(refused.value) and "\x07" not in str(refused.value)
    assert "no \u241b[2J\u241b]0;title\u2407 model" in str(refused.value)


def test_an_answer_that_is_not_http_is_one_line_with_its_control_characters_as_symbols():
    """Whatever answered at the address with a line that is no HTTP status line (http.client's BadStatusLine, neither
    an OSError nor a URLError) ended `glimmer chat --url` in a traceback holding the line's escapes as sent."""
    answer = b"\x1b]0;pwned\x07 HELLO\r\n"
    with canned_server([(None, answer)] * 2) as (address, _):
        with pytest.raises(ChatClientError) as refused:
            check_server(address)
        text = chat_text(address, ["hi"])
    assert str(refused.value).startswith(f"{address} did not answer in HTTP (BadStatusLine: ")
    assert "\u241b]0;pwned\u2407 HELLO" in str(refused.value) and "\x1b" not in str(refused.value)
    assert f"error: {address} did not answer in HTTP (BadStatusLine: " in text
    assert "\x1b" not in text and "\x07" not in text and "Traceback" not in text


def test_a_broken_stream_is_a_chat_error_and_the_turn_is_dropped():
    """A stream that is cut, sends an event that is not JSON, or ends without [DONE]: one error line, the chat
    goes on without the turn (no traceback, no half reply in the history)."""
    replies = [
        (200, b'data: {"choices": [{"index": 0, "delta": {"content": "hi"\n\n'),  # not JSON
        (200, b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'),  # no [DONE]: cut short
        (200, b'data: {"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}\n\n'
              b"data: [DONE]\n\n"),
    ]
    with canned_server(replies) as (url, seen):
        text = chat_text(url, ["one", "two", "three"])
    assert "error: the server sent an event that is not JSON" in text
    assert "ended before it finished (no [DONE])" in text and "Traceback" not in text
    # the third request carries only its own message: the broken turns were dropped
    assert [m["content"] for m in seen[2]["messages"]] == ["three"]


def test_a_stream_whose_fields_have_no_space_after_the_colon_ends_at_its_done():
    """`data:[DONE]` is `data: [DONE]` in an event stream (the space after a field's colon is optional); its events
    were read, but the end was looked for as `data: [DONE]` alone: each reply was answered, then said to have 'ended
    before it finished (no [DONE])' and dropped from the conversation."""
    reply = (200, b'data:{"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}\n\n'
                  b"data:[DONE]\n\n")
    with canned_server([reply, reply]) as (url, seen):
        text = chat_text(url, ["one", "two"])
    assert text.splitlines()[1:] == ["fine", "fine"]
    assert [m["content"] for m in seen[1]["messages"]] == ["one", "fine", "two"]  # the first turn was kept


def test_the_chat_counts_its_failed_turns_and_writes_their_errors_where_asked():
    """A script piping messages in could not tell that some failed: run_chat returned nothing. It returns how many
    turns failed, their errors on `err` (stderr for piped messages) and the replies on `out`."""
    fine = (200, b'data: {"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}\n\n'
                 b"data: [DONE]\n\n")
    refused = (400, b'{"error": {"message": "bad request", "code": null}}')
    lines, out, err = iter(["one", "two", "three", "four", "/exit"]), io.StringIO(), io.StringIO()
    with canned_server([refused, fine, (200, b"data: {\n\n"), fine]) as (url, _):
        failed = run_chat(url, model=None, api_key=None, out=out, err=err, read_line=lambda prompt: next(lines),
                          color=False)
    assert failed == 2
    assert err.getvalue() == ("error: the server answered HTTP 400: bad request\n"
                              "error: the server sent an event that is not JSON (Expecting property name enclosed in "
                              "double quotes: line 1 column 2 (char 1))\n")
    assert out.getvalue().splitlines()[1:] == ["fine", "fine"]


def test_a_server_that_answers_one_json_body_is_named_as_not_streaming():
    """A server (or proxy) ignoring `stream: true` answers one chat.completion: the chat said the reply 'ended
    before it finished (no [DONE])', as if a stream had been cut; a 200 {"error": ...} body showed no message."""
    completion = {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
                                                            "message": {"role": "assistant", "content": "hi"}}]}
    replies = [(200, json.dumps(completion).encode(), {"Content-Type": "application/json"}),
               (200, b'{"error": {"message": "the engine is asleep", "type": "server_error"}}',
                {"Content-Type": "application/json; charset=utf-8"})]
    with canned_server(replies) as (url, _):
        text = chat_text(url, ["one", "two"])
    assert (f"error: {url} answered one JSON body (Content-Type: application/json), not an event stream: it ignores "
            "`stream: true`" in text)
    assert "error: the engine is asleep\n" in text
    assert "no [DONE]" not in text


def test_a_reply_that_is_no_event_stream_nor_json_is_named_by_its_content_type():
    """A 200 that is a proxy's web page was read as a stream without events: the chat said the reply 'ended before it
    finished (no [DONE])'. A stream whose server names no Content-Type is still read as one."""
    replies = [(200, b"<html><body>Sign in to continue</body></html>", {"Content-Type": "text/html; charset=utf-8"}),
               (200, b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n',
                {"Content-Type": None})]
    with canned_server(replies) as (url, _):
        text = chat_text(url, ["one", "two"])
    assert (f"error: {url} answered a body of Content-Type text/html; charset=utf-8, not an event stream "
            "(Content-Type: text/event-stream)" in text)
    assert "no [DONE]" not in text and "Sign in" not in text
    assert text.endswith("\nhi\n")


def test_a_json_body_cut_short_is_a_broken_connection_and_the_chat_goes_on():
    """A server answering one JSON body and closing the connection partway through it: reading that body raised
    IncompleteRead out of the chat, a traceback that ended it."""
    replies = [(200, b'{"object": "chat.completion", "choi', {"Content-Type": "application/json",
                                                              "Content-Length": "1000"}),
               (200, b'data: {"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}\n\n'
                     b"data: [DONE]\n\n")]
    with canned_server(replies) as (url, seen):
        text = chat_text(url, ["one", "two"])
    assert f"error: the connection to {url} broke mid-reply (IncompleteRead(" in text
    assert "fine" in text
    assert [m["content"] for m in seen[1]["messages"]] == ["two"]


def test_a_reply_that_ends_without_an_answer_or_a_call_says_so():
    """A turn of reasoning alone (the embedded model's, for a request it cannot place) showed the reasoning and
    then nothing, as if the answer were still to come."""
    replies = [
        (200, b'data: {"choices": [{"index": 0, "delta": {"reasoning_content": "Hmm."}}]}\n\n'
              b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'),
        (200, b'data: {"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}\n\n'
              b"data: [DONE]\n\n"),
    ]
    with canned_server(replies) as (url, _):
        text = chat_text(url, ["one", "two"])
    assert text.split("\n")[1:4] == ["Hmm.", "[no answer: the model ended its turn without one]", "fine"]


def test_an_error_event_raises():
    with pytest.raises(ChatClientError, match="no call"):
        render([chunk(role="assistant"), {"error": {"message": "no call", "type": "tool_choice_unsatisfied"}}])


@pytest.mark.parametrize("event", [{"error": "Input validation error: too long", "error_type": "validation"},
                                   {"error": {"message": "Input validation error: too long"}}])
def test_an_error_event_as_text_or_object_raises_its_message(event):
    """TGI and others stream `{"error": "text"}`: it was an AttributeError traceback that ended the chat."""
    with pytest.raises(ChatClientError, match="^Input validation error: too long$"):
        render([chunk(role="assistant"), event])


@pytest.mark.parametrize("event", [[1, 2], "text", {"choices": ["text"]}, {"choices": [{"delta": "text"}]},
                                   {"choices": [{"delta": {"tool_calls": ["text"]}}]}])
def test_an_event_that_is_no_chunk_is_a_chat_error_and_the_chat_goes_on(event):
    """It was an AttributeError traceback that ended the chat."""
    replies = [(200, f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()),
               (200, b'data: {"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}\n\n'
                     b"data: [DONE]\n\n")]
    with canned_server(replies) as (url, seen):
        text = chat(url, ["one", "two", "/exit"])
    assert "error: the server sent an event that is not a chat completion chunk: " in text and text.endswith("fine\n")
    assert [m["content"] for m in seen[1]["messages"]] == ["two"]


def test_a_message_past_the_servers_body_limit_is_one_line_naming_the_limit_and_the_chat_goes_on(make_tiny):
    """The server refuses the body (413) and closes the connection before reading it, so the refusal never arrives:
    it was `cannot reach URL: [Errno 32] Broken pipe`, as though the server were down."""
    with live_server(make_tiny(), scripted=True, max_request_bytes=1 << 20) as server:
        text = chat(server.url, ["x" * (32 << 20), "/exit"])
    assert text.startswith(f"error: {server.url} closed the connection before answering the request of ")
    assert text.endswith("send a shorter one (a server refuses requests larger than its limit: `glimmer serve "
                         "--max-request-bytes`, 4 MiB by default)\n")


def test_control_characters_of_a_reply_show_as_symbols_and_the_history_keeps_them():
    """A reply's control characters were written to the terminal as they came: ESC [2J cleared the screen, a carriage
    return wrote over the line. A model's output, or any server's stream, is not the terminal's to command."""
    call = {"index": 0, "id": "c1", "function": {"name": "f\x1b", "arguments": "{}"}}
    text, message, _ = render([chunk(reasoning_content="\x1b]0;title\x07"),
                               chunk(content="a\x1b[2Jb\rc\x9bd\te\nf\x7f"), chunk(tool_calls=[call])])
    assert text == "\u241b]0;title\u2407\na\u241b[2Jb\u240dc\ufffdd\te\nf\u2421\n→ f\u241b({})\n"
    assert message["content"] == "a\x1b[2Jb\rc\x9bd\te\nf\x7f" and message["reasoning_content"] == "\x1b]0;title\x07"
    assert call_label(call) == "f\u241b({})"  # the result prompt
    with canned_server([(400, b'{"error": {"message": "bad \\u001b[2J request"}}')]) as (url, _):
        assert chat(url, ["hello", "/exit"]) == "error: the server answered HTTP 400: bad \u241b[2J request\n"


class CtrlCOnce(io.StringIO):
    """A terminal where Ctrl-C is pressed as `text` is first printed."""

    def __init__(self, text: str):
        super().__init__()
        self.text: str | None = text

    def write(self, s: str) -> int:
        if self.text is not None and self.text in s:
            self.text = None
            raise KeyboardInterrupt
        return super().write(s)


def test_ctrl_c_during_a_reply_stops_it_and_the_chat_goes_on_without_the_turn():
    """Ctrl-C in a long reply ended the whole chat, its conversation lost; it stops the reply, as Ctrl-D leaves."""
    stream = (b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}, "finish_reason": "stop"}]}\n\n'
              b"data: [DONE]\n\n")
    with canned_server([(200, stream % b"runaway"), (200, stream % b"fine")]) as (url, seen):
        lines, out = iter(["one", "two", "/exit"]), CtrlCOnce("runaway")
        try:
            run_chat(url, model=None, api_key=None, out=out, read_line=lambda prompt: next(lines), color=False)
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C during a reply ended the chat")
    # the reply's line ends (here empty: Ctrl-C came as its first text was printed) before the notice
    assert out.getvalue().split("\n", 1)[1] == "\n[stopped by Ctrl-C: the turn is dropped]\nfine\n"
    assert [m["content"] for m in seen[1]["messages"]] == ["two"]


def test_ctrl_c_at_a_prompt_ends_the_chat_after_ending_the_prompts_line():
    """Ctrl-C at `you>` ends the chat (status 130), as README says; it left the terminal's line open after `you> ^C`,
    so the shell's prompt went on that line, where Ctrl-D (and /exit) end it first."""
    out = io.StringIO()

    def read_line(prompt: str) -> str:
        out.write(prompt)  # as input() writes it
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_chat("http://127.0.0.1:9", model=None, api_key=None, out=out, read_line=read_line, color=False)
    assert out.getvalue().endswith("you> \n")


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


@pytest.fixture(scope="module")
def tool_server(make_tiny):
    """The scripted agent server the tool chats talk to, shared by the module: [weather] calls get_weather,
    [sunny-result] answers."""
    with agent_server(make_tiny()) as server:
        yield server


def scripted_tool_chat(server, lines):
    """A chat with --tools against `server` (tool_server): the chat's text, the prompts it showed, and the prompts
    the model saw in this chat."""
    prompts = []
    out = io.StringIO()
    seen_before = len(server.engine.engine.runner.prompts)

    def read_line(prompt):
        prompts.append(prompt)
        return next(lines)

    run_chat(server.url, model="tiny", api_key=None, out=out, read_line=read_line, tools=[WEATHER_TOOL],
             request_options={"temperature": 0, "chat_template_kwargs": {"current_date": "2026-01-01"}},
             color=False)
    return out.getvalue(), prompts, server.engine.engine.runner.prompts[seen_before:]


def test_a_tool_call_in_the_chat_asks_for_its_result_and_the_reply_goes_on_from_it(tool_server):
    text, prompts, model_prompts = scripted_tool_chat(tool_server, iter(["[weather] in Paris?", "[sunny-result]",
                                                                       "/exit"]))
    assert prompts == ["you> ", RESULT_PROMPT, "you> "]
    assert '→ get_weather({"city": "Paris"})' in text and "The tool says sunny.\nIt is sunny in Paris.\n" in text
    assert "error" not in text
    # the second request carried the call and its result: the model saw the result after the call
    continued = model_prompts[-1]
    assert continued.index("<atem:invoke") < continued.index("[sunny-result]")


@pytest.mark.parametrize("answer", ["/exit", "/reset"])
def test_exit_or_reset_at_a_result_prompt_drop_the_unanswered_turn(tool_server, answer):
    lines = iter(["[weather] in Paris?", answer, "[greet] hi", "/exit"])
    text, prompts, model_prompts = scripted_tool_chat(tool_server, lines)
    if answer == "/exit":
        assert prompts == ["you> ", RESULT_PROMPT] and len(model_prompts) == 1
    else:  # the next message starts a new conversation: no trace of the call
        assert prompts == ["you> ", RESULT_PROMPT, "you> ", "you> "]
        assert "Hello there!" in text and "[weather]" not in model_prompts[-1]


def test_an_unknown_command_at_a_result_prompt_asks_for_the_result_again(tool_server):
    lines = iter(["[weather] in Paris?", "/foo", "[sunny-result]", "/exit"])
    text, prompts, _ = scripted_tool_chat(tool_server, lines)
    assert prompts == ["you> ", RESULT_PROMPT, RESULT_PROMPT, "you> "]
    assert "unknown command /foo: the commands are /reset, /exit and /quit" in text
    assert "It is sunny in Paris.\n" in text


def test_end_of_input_at_a_result_prompt_ends_the_chat(tool_server):
    def lines():
        yield "[weather] in Paris?"
        raise EOFError
    text, prompts, _ = scripted_tool_chat(tool_server, lines())
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


def test_a_refused_request_is_one_line_with_the_servers_message_and_the_chat_goes_on(make_tiny):
    with live_server(make_tiny()) as server:
        lines = iter(["hello", "again", "/exit"])
        out = io.StringIO()
        run_chat(server.url, model="no-such-model", api_key=None, out=out, read_line=lambda prompt: next(lines),
                 color=False)
    refusal = ("error: the server answered HTTP 404: the model 'no-such-model' does not exist here; this server "
               "serves 'tiny', 'tiny-alias'\n")
    assert out.getvalue().split("\n", 1)[1] == refusal * 2


KEYS_OUTSIDE_ASCII = ["sk\u2010\u043a\u043b\u044e\u0447", "caf\u00e9-key"]  # beyond Latin-1, and within it


@pytest.fixture(scope="module")
def keyed_server(make_tiny):
    """A server whose API keys are "secret-key" and KEYS_OUTSIDE_ASCII, shared by the tests of the keys the chat sends
    it (none changes it)."""
    with live_server(make_tiny(), api_key=("secret-key", *KEYS_OUTSIDE_ASCII)) as server:
        yield server


@pytest.mark.parametrize("api_key", [None, "wrong-key"])
def test_a_keyed_server_refusing_the_chat_says_how_to_give_the_key(keyed_server, api_key):
    with pytest.raises(ChatClientError) as refused:
        check_server(keyed_server.url, api_key)
    message = str(refused.value)
    assert ("refused the API key" if api_key else "needs an API key") in message
    assert message.endswith("pass the server's key with --api-key KEY or set GLIMMER_API_KEY")


@pytest.mark.parametrize("key", KEYS_OUTSIDE_ASCII)
def test_a_key_outside_ascii_reaches_a_glimmer_server_that_holds_it(keyed_server, key):
    """A key beyond Latin-1 (a pasted U+2010 hyphen, Cyrillic) could not be put in a header by http.client: the chat
    said `cannot reach URL: ... ordinal not in range(256); start the server there`, of a running server. It is sent in
    UTF-8, as curl sends it, which the server takes; a key within Latin-1 still goes as Latin-1 (as vLLM reads it)."""
    check_server(keyed_server.url, key)
    lines, out = iter(["hello", "/exit"]), io.StringIO()
    failed = run_chat(keyed_server.url, model=None, api_key=key, out=out, read_line=lambda prompt: next(lines),
                      request_options={"max_tokens": 2}, color=False)
    assert failed == 0 and "error" not in out.getvalue()


def test_a_key_ending_in_a_newline_is_sent_without_it_and_one_holding_a_line_break_is_refused_unechoed(keyed_server):
    """A key read from a file (`GLIMMER_API_KEY="$(<key.txt)"` keeps none, an env file may) ended in a newline, which
    no header can carry: the chat said `cannot reach URL: Invalid header value b'Bearer KEY\\n'`, echoing the key,
    and to start the server. The server strips its own key; the chat strips the one it sends."""
    check_server(keyed_server.url, "secret-key\n")
    with pytest.raises(ChatClientError) as refused:
        check_server(keyed_server.url, "secret\nkey")
    assert "secret" not in str(refused.value) and "a control character, which no HTTP header can carry" in str(
        refused.value)


@pytest.mark.parametrize("key", ["secret\x00key", "secret\x1bkey", "secret\x7fkey"])
def test_a_key_holding_any_control_character_is_refused_unechoed_by_the_servers_rule(keyed_server, key):
    """The chat refused a line break alone; another control character (NUL, ESC, DEL), which `glimmer serve` refuses
    in its own key (`sendable_in_a_header`), went on to the request. It is refused in the server's words."""
    with pytest.raises(ChatClientError) as refused:
        check_server(keyed_server.url, key)
    assert "secret" not in str(refused.value) and UNSENDABLE_KEY in str(refused.value)


def test_a_blank_key_is_no_key_as_an_empty_one_is(keyed_server):
    """A whitespace-only GLIMMER_API_KEY stripped to nothing and was sent as `Bearer `, so a keyed server said it
    refused the key given; like an empty one (`GLIMMER_API_KEY=`), it is no key."""
    with pytest.raises(ChatClientError) as refused:
        check_server(keyed_server.url, " \t ")
    assert "needs an API key" in str(refused.value)


@contextlib.contextmanager
def redirecting_server(to: str) -> Iterator[tuple[str, list[str | None]]]:
    """A server answering every request with a 302 to `to` and its path, then, for the requests that followed it
    back to this server, a model list; yields its address and the Authorization header of each request it took."""
    authorizations: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            authorizations.append(self.headers["Authorization"])
            if self.path.startswith("/back"):
                body = b'{"object": "list", "data": []}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
            else:
                body = b""
                self.send_response(302)
                self.send_header("Location", (to or address) + "/back" + self.path)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    address = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield address, authorizations
    finally:
        server.shutdown()


def test_the_key_follows_a_redirect_within_the_server_and_not_one_elsewhere():
    """urllib sends a request's headers on to wherever a redirect points: whatever a redirect from the server's
    address pointed to (another host, another port) was sent `Authorization: Bearer KEY`, the server's key. As
    requests and httpx (the openai SDK's) do, the key goes only to the scheme, host and port it was given for."""
    with redirecting_server("") as (address, same_host):
        check_server(address, "secret-key")
    assert same_host == ["Bearer secret-key", "Bearer secret-key"]
    with redirecting_server("") as (elsewhere, other_host), redirecting_server(elsewhere) as (address, first_host):
        check_server(address, "secret-key")
    assert first_host == ["Bearer secret-key"] and other_host == [None]


@pytest.mark.parametrize("url", ["notaurl", "localhost:8000", "file:///etc/passwd", "http://", "http://h:99999"])
def test_a_url_that_is_not_an_http_server_address_is_refused_before_any_request(url):
    with pytest.raises(ChatClientError, match="http://127.0.0.1:8000"):
        check_server(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "https://glimmer.example.com/base/", "http://[::1]:80"])
def test_http_server_addresses_pass_the_url_check(url):
    check_server_url(url)


@pytest.mark.parametrize(("url", "models"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1/models"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1/models"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/models"),
    ("http://127.0.0.1:8000/v1//", "http://127.0.0.1:8000/v1/models"),
    ("https://glimmer.example.com/base/v1/", "https://glimmer.example.com/base/v1/models"),
    ("http://v1:8000/v1", "http://v1:8000/v1/models"),  # a host named v1 stays
    ("http://127.0.0.1:8000/v10", "http://127.0.0.1:8000/v10/v1/models"),
    # the query string was left before the path ("http://h:8000?x=1/v1/models", the server's root asked for), and a
    # fragment likewise ("http://h:8000#x/v1/models", sent as "http://h:8000"): the query is kept on every request,
    # the fragment, which no request sends, left out
    ("http://h:8000/v1?x=1", "http://h:8000/v1/models?x=1"),
    ("https://h/base/?api-version=2&x=a%20b", "https://h/base/v1/models?api-version=2&x=a%20b"),
    ("http://h:8000/v1#x", "http://h:8000/v1/models"),
])
def test_an_endpoint_is_the_servers_address_less_trailing_slashes_and_a_final_v1_then_its_path(url, models):
    assert endpoint_url(url, "/v1/models") == models


CHAT_OPTIONS = {"chat_template_kwargs": {"current_date": "2026-01-01"}}


def chat(url, lines, *, request_options=None, max_model_len=None, system=None):
    """The output of a chat at `url` (model tiny) typing `lines`."""
    lines = iter(lines)
    out = io.StringIO()
    run_chat(url, model="tiny", api_key=None, out=out, read_line=lambda prompt: next(lines), color=False,
             request_options={**CHAT_OPTIONS, **(request_options or {})}, max_model_len=max_model_len, system=system)
    return out.getvalue().split("\n", 1)[1]  # after the greeting line


@pytest.fixture(scope="module")
def small_context_server(make_tiny):
    """A scripted server whose context holds 256 tokens (a one-line chat's prompt is about 130): [hi] answers
    `Hi!`, [long] answers more than the context holds."""
    with live_server(make_tiny(), scripted=True, engine_options={"max_model_len": 256}) as server:
        server.engine.engine.runner.add("[hi]", " to=user<|message|>Hi!<|eot|>")
        server.engine.engine.runner.add("[long]", " to=user<|message|>" + "la " * 200 + "<|eot|>")
        yield server


@pytest.mark.parametrize("suffix", ["/", "/v1", "/v1/", "/v1?tenant=a", "?tenant=a"])
def test_a_base_url_with_v1_or_a_trailing_slash_reaches_the_same_server(small_context_server, suffix):
    url = small_context_server.url + suffix
    assert check_server(url, model="tiny") == 256
    assert chat(url, ["[hi]", "/exit"]) == "Hi!\n"


def test_a_model_the_server_does_not_serve_is_refused_by_the_check_naming_the_served_ones(small_context_server):
    with pytest.raises(ChatClientError) as refused:
        check_server(small_context_server.url, model="nope")
    assert str(refused.value) == (f"{small_context_server.url} does not serve the model 'nope'; it serves 'tiny', "
                                  "'tiny-alias': pass one of them with --served-model, or leave it out for the "
                                  "server's default")


def test_the_check_gives_the_context_length_of_the_server_default_when_no_model_is_named(small_context_server):
    assert check_server(small_context_server.url) == 256


def test_a_reply_cut_by_max_tokens_says_so(small_context_server):
    text = chat(small_context_server.url, ["[long]", "/exit"], request_options={"max_tokens": 3}, max_model_len=256)
    assert text.endswith("\n[stopped at max_tokens]\n")


def test_a_reply_cut_by_the_full_context_window_says_so_and_names_reset(small_context_server):
    text = chat(small_context_server.url, ["[long]", "/exit"], max_model_len=256)
    assert text.endswith("\n[stopped: the context window (256 tokens) is full; /reset starts a new conversation]\n")


def test_a_conversation_past_the_context_hints_at_reset_and_reset_starts_a_new_one(small_context_server):
    text = chat(small_context_server.url, ["[hi]", "[hi] " + "word " * 50, "/reset", "[hi]", "/exit"])
    lines = text.splitlines()
    assert lines[0] == "Hi!" and lines[-1] == "Hi!"
    assert lines[1].startswith("error: the server answered HTTP 400: This model's maximum context length is 256 "
                               "tokens (max_model_len), but the prompt has ")
    assert lines[1].endswith(" tokens; shorten the messages")
    assert lines[2:] == ["The conversation no longer fits the model's context: /reset starts a new one.", "Hi!"]


def test_a_refusal_naming_max_tokens_also_hints_at_fewer_tokens(small_context_server):
    text = chat(small_context_server.url, ["[hi]", "[hi] " + "word " * 30, "/exit"],
                request_options={"max_tokens": 120})
    lines = text.splitlines()
    assert "lower max_tokens" in lines[1]
    assert lines[2] == ("The conversation no longer fits the model's context: /reset starts a new one (or a smaller "
                        "--max-tokens leaves room).")


def test_a_first_message_refused_for_the_max_tokens_given_names_the_flag(small_context_server):
    """It said only `lower max_tokens to at most N`, the API's field, which the chat's user sets with --max-tokens."""
    text = chat(small_context_server.url, ["[hi] " + "word " * 30, "/exit"], request_options={"max_tokens": 120})
    lines = text.splitlines()
    assert "lower max_tokens" in lines[0] and lines[1:] == ["A smaller --max-tokens leaves the message room."]


def test_a_first_message_past_the_context_gets_no_reset_hint(small_context_server):
    """/reset would not help: the message alone does not fit."""
    text = chat(small_context_server.url, ["[hi] " + "word " * 80, "/exit"])
    assert text.startswith("error: the server answered HTTP 400: This model's maximum context length is ")
    assert text.count("\n") == 1


def test_a_message_refused_for_a_system_prompt_past_the_context_names_the_system_flag(small_context_server):
    """With --url the --system prompt is not checked against the context at start-up: every message was refused with
    "shorten or remove messages[0]", an index of a list the chat's user never sees."""
    text = chat(small_context_server.url, ["[hi]", "/exit"], system="word " * 200)
    lines = text.splitlines()
    assert lines[0].startswith("error: the server answered HTTP 400: This model's maximum context length is 256 ")
    assert lines[0].endswith("shorten or remove messages[0]")
    assert lines[1:] == ["messages[0] is the --system prompt, sent with every message: give a shorter --system."]


@pytest.mark.parametrize(("usage", "max_tokens", "max_model_len", "notice"), [
    ({"prompt_tokens": 10, "completion_tokens": 5}, 5, 100, "[stopped at max_tokens]"),
    ({"prompt_tokens": 10, "completion_tokens": 5}, 5, None, "[stopped at max_tokens]"),
    ({"prompt_tokens": 95, "completion_tokens": 5}, None, 100,
     "[stopped: the context window (100 tokens) is full; /reset starts a new conversation]"),
    ({"prompt_tokens": 95, "completion_tokens": 5}, 5, 100,  # both: the full window is what the next turn meets
     "[stopped: the context window (100 tokens) is full; /reset starts a new conversation]"),
    ({"prompt_tokens": 10, "completion_tokens": 5}, None, 100, "[stopped at the server's default max_tokens]"),
    ({"prompt_tokens": 10, "completion_tokens": 5}, None, None,
     "[stopped at a length limit: max_tokens or the end of the context window]"),
    (None, 5, 100, "[stopped at a length limit: max_tokens or the end of the context window]"),
])
def test_the_length_notice_names_the_limit_only_where_the_usage_tells(usage, max_tokens, max_model_len, notice):
    assert length_notice(usage, max_tokens, max_model_len) == notice


def test_in_process_the_default_max_tokens_is_the_models():
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    assert length_notice(usage, None, 100, in_process=True) == ("[stopped at the model's default max_tokens "
                                                               "(generation_config max_new_tokens)]")


def test_an_unknown_command_is_not_sent_and_a_double_slash_sends_one_slash():
    stop = b'data: {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'
    with canned_server([(200, stop)]) as (url, seen):
        text = chat(url, ["/foo", "//foo", "/exit"])
    assert text.startswith("unknown command /foo: the commands are /reset, /exit and /quit")
    assert [[m["content"] for m in body["messages"]] for body in seen] == [["/foo"]]


@pytest.mark.parametrize(("status", "body", "line"), [
    (502, b"<html>\n<body>Bad gateway</body>\n</html>\n", "the server answered HTTP 502: <html> <body>Bad gateway"
                                                           "</body> </html>"),
    (503, b"", "the server answered HTTP 503: Service Unavailable"),
    (400, b'{"error": {"message": "This model\'s maximum context length is 8 tokens", "code": null}}',
     "the server answered HTTP 400: This model's maximum context length is 8 tokens"),
])
def test_an_error_from_another_server_is_one_line(status, body, line):
    with canned_server([(status, body)]) as (url, _):
        text = chat(f"{url}/v1", ["hello", "/exit"])
    assert text == f"error: {line}\n"


@pytest.mark.parametrize(("status", "message", "code", "exceeded"), [
    (400, "the prompt has 256 tokens, which leaves no room to generate within max_model_len=256", None, True),
    (400, "the prompt has 300 tokens, which exceeds max_model_len=256; shorten the messages", None, True),
    (400, "prompt (250 tokens) + max_tokens (10) exceeds max_model_len=256; lower max_tokens to at most 6", None,
     True),
    (400, "the prompt has 9,000 characters, more than max_model_len=256 tokens can hold (at most 2,000); shorten "
          "the messages", None, True),
    (400, "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens", None, True),
    (400, "Your input is too long", "context_length_exceeded", True),
    (400, "temperature: must be at least 0", None, False),
    (500, "max_model_len=256 could not be read", None, False),
])
def test_a_refusal_for_the_context_length_is_told_from_other_refusals(status, message, code, exceeded):
    assert ServerRefusedError(status, message, code).context_exceeded is exceeded


def test_an_endpoints_url_given_for_the_servers_is_refused_by_the_check_saying_which_to_give():
    """`--url http://127.0.0.1:8000/v1/chat/completions` (an endpoint's URL, as API docs show it) was refused as
    `answered HTTP 404: Not Found`, with no word of what to give instead."""
    with canned_server([(404, b'{"detail": "Not Found"}')]) as (url, _):
        with pytest.raises(ChatClientError) as refused:
            check_server(f"{url}/v1/chat/completions")
    assert str(refused.value) == (
        f"{url}/v1/chat/completions has no OpenAI-compatible API: {url}/v1/chat/completions/v1/models answered HTTP "
        '404 ({"detail": "Not Found"}); give the server\'s address, e.g. http://127.0.0.1:8000 (a trailing /v1 is '
        "fine), not an endpoint's")


def test_a_server_without_an_openai_model_list_passes_the_check_unchecked():
    """Nothing to check the model against: the chat starts, as it did before the check, and the first message
    tells."""
    with canned_server([(200, b"<html>models</html>")]) as (url, _):
        assert check_server(url, model="anything") is None
