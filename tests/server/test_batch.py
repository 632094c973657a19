"""`glimmer run-batch` (glimmer/server/batch.py): an OpenAI batch file run through the server's own routes, in-process,
one record a line in input order; a line that cannot run is a record of its own, never the end of the batch."""

from __future__ import annotations

import asyncio
import bz2
import gzip
import io
import json
import lzma
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import live_server

from glimmer.cli import main
from glimmer.engine.tokenizer import Tokenizer
from glimmer.server.batch import parse_batch_input, run_batch

CITY_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                   "required": ["city"]}}}
# custom_id → (url, body): one of each kind of request the server answers, a refused one included
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}],
                                      "max_tokens": 8, "temperature": 0}),
    "completion": ("/v1/completions", {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8,
                                       "temperature": 0}),
    "tool-call": ("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [CITY_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False,
        "max_tokens": 64, "temperature": 0}),
    "json": ("/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "Give JSON"}], "max_tokens": 64, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
            "additionalProperties": False}}}}),
    "responses": ("/v1/responses", {"model": "tiny", "input": "Hi", "max_output_tokens": 8, "temperature": 0}),
    "invalid-body": ("/v1/chat/completions", {"model": "tiny", "messages": [], "max_tokens": 8}),
}
_VOLATILE = {"id", "created", "created_at", "completed_at", "call_id"}  # ids and clocks differ between two runs


def _line(custom_id: Any, url: Any, body: Any, method: Any = "POST") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _stable(item) for key, item in value.items() if key not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(item) for item in value]
    return value


def _run(app: Any, text: str, max_in_flight: int = 8) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    asyncio.run(run_batch(app, parse_batch_input(text.encode()), records.append, max_in_flight=max_in_flight))
    return records


def test_batch_records_hold_what_the_http_server_answers_for_the_same_bodies(tiny_checkpoint):
    """The batch runs each body through the server's own routes: validation, chat rendering, tool-call parsing,
    structured outputs and error bodies are the HTTP server's (greedy: the same text). Prefix caching is off so
    that the second run of a prompt computes and counts it as the first did."""
    with live_server(tiny_checkpoint, engine_options={"enable_prefix_caching": False}) as live:
        records = _run(live.app, "\n".join(_line(custom_id, url, body) for custom_id, (url, body) in BODIES.items()))
        assert [record["custom_id"] for record in records] == list(BODIES)
        for record in records:
            url, body = BODIES[record["custom_id"]]
            answer = httpx.post(live.url + url, json=body, timeout=120)
            assert record["response"]["status_code"] == answer.status_code, record["custom_id"]
            # as vLLM's run_batch writes them: the answer in `response.body`, or a refusal's in `error`
            written = record["response"]["body"] if answer.status_code == 200 else record["error"]
            assert (record["response"]["body"] is None) == (record["error"] is not None), record["custom_id"]
            assert _stable(written) == _stable(answer.json()), record["custom_id"]
    answered = {record["custom_id"]: record for record in records}
    assert {custom_id: record["response"]["status_code"] for custom_id, record in answered.items()} == {
        "chat": 200, "completion": 200, "tool-call": 200, "json": 200, "responses": 200, "invalid-body": 400}
    call = answered["tool-call"]["response"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"] in ("Paris", "Oslo")
    assert isinstance(json.loads(answered["json"]["response"]["body"]["choices"][0]["message"]["content"])["ok"], bool)
    error = answered["invalid-body"]["error"]["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"


def test_a_responses_line_continuing_an_earlier_line_s_response_runs_after_it(tiny_checkpoint):
    """Lines run concurrently, so a line whose previous_response_id named the response an earlier line makes (its
    request_id) ran before that response was stored and failed "not found" or "still being generated". It runs once
    that line's record is ready; after a line that failed it fails saying so, and naming a later line's response is
    an error record of its own."""
    def responses(custom_id, **fields):
        return _line(custom_id, "/v1/responses", {"model": "tiny", "input": f"Turn {custom_id}",
                                                   "max_output_tokens": 4, "temperature": 0, **fields})
    text = "\n".join([
        responses("a", request_id="resp-a"),
        *[responses(custom_id, request_id=f"resp-{custom_id}", previous_response_id=f"resp-{before}")
          for before, custom_id in zip("abc", "bcd", strict=True)],
        responses("early", previous_response_id="resp-late"),
        responses("late", request_id="resp-late"),
        responses("broken", request_id="resp-broken", max_output_tokens=0),
        responses("after-broken", previous_response_id="resp-broken"),
        responses("alone")])
    with live_server(tiny_checkpoint) as live:
        records = {record["custom_id"]: record for record in _run(live.app, text, max_in_flight=16)}
    assert {custom_id: record["response"]["status_code"] for custom_id, record in records.items()} == {
        "a": 200, "b": 200, "c": 200, "d": 200, "early": 400, "late": 200, "broken": 400, "after-broken": 400,
        "alone": 200}
    chain = [records[custom_id]["response"]["body"] for custom_id in "abcd"]
    assert [body["previous_response_id"] for body in chain] == [None, "resp-a", "resp-b", "resp-c"]
    sizes = [body["usage"]["input_tokens"] for body in chain]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4  # each read the turns before it
    early = records["early"]["error"]["error"]
    assert (early["param"], early["line"]) == ("body.previous_response_id", 5)
    assert "'resp-late' is the response line 6 makes" in early["message"]
    after = records["after-broken"]["error"]["error"]
    assert after["code"] == "previous_response_not_found" and "line 7 failed" in after["message"]


def test_an_empty_request_id_makes_no_response_an_empty_previous_response_id_continues(tiny_checkpoint):
    """An empty request_id is none given (the response gets an id of its own), yet run-batch took the line as making
    the response "", so a line with previous_response_id "" was refused as continuing a later line's response, or as
    following a line that failed, where the server refuses the empty id itself."""
    def responses(custom_id, **fields):
        return _line(custom_id, "/v1/responses", {"model": "tiny", "input": "Hi", "max_output_tokens": 4, **fields})
    text = "\n".join([responses("before", previous_response_id=""),
                      responses("maker", request_id="", max_output_tokens=0),  # refused: max_output_tokens
                      responses("after", previous_response_id="")])
    with live_server(tiny_checkpoint) as live:
        records = {record["custom_id"]: record for record in _run(live.app, text)}
    for custom_id in ("before", "after"):
        assert records[custom_id]["response"]["status_code"] == 400, records[custom_id]
        record = records[custom_id]  # the server's refusal in the body; run-batch's own in `error`
        error = record["response"]["body"]["error"] if record["response"]["body"] else record["error"]["error"]
        assert (error["code"], error["param"]) == ("empty_string", "previous_response_id"), error


@pytest.mark.parametrize(("line", "code", "param", "custom_id"), [
    ("not json", "invalid_json_line", None, None),
    ('["a", "list"]', "invalid_json_line", None, None),
    ('{"custom_id": "a", "custom_id": "b", "method": "POST"}', "invalid_json_line", None, None),
    (_line(None, "/v1/completions", {"prompt": "x"}), "missing_required_parameter", "custom_id", None),
    (_line(7, "/v1/completions", {"prompt": "x"}), "invalid_parameter", "custom_id", None),
    # an unpaired escape, which the UTF-8 output could not hold: writing its record ended the batch with a traceback
    (_line("q\ud800", "/v1/completions", {"prompt": "x"}), "invalid_parameter", "custom_id", None),
    (_line("first", "/v1/completions", {"prompt": "x"}), "duplicate_custom_id", "custom_id", "first"),
    (_line("b", "/v1/embeddings", {"input": "x"}), "invalid_parameter", "url", "b"),
    (_line("b", "/v1/completions", {"prompt": "x"}, method="GET"), "invalid_parameter", "method", "b"),
    (_line("b", None, {"prompt": "x"}), "missing_required_parameter", "url", "b"),
    (_line("b", "/v1/completions", None), "missing_required_parameter", "body", "b"),
    (_line("b", "/v1/completions", "prompt"), "invalid_parameter", "body", "b"),
    (_line("b", "/v1/chat/completions", {"messages": [], "stream": True}), "invalid_parameter", "body.stream", "b"),
])
def test_a_line_that_cannot_run_is_an_error_record_of_its_own(line, code, param, custom_id):
    text = "\n".join([_line("first", "/v1/completions", {"prompt": "x"}), "", line,
                      _line("last", "/v1/completions", {"prompt": "y"})])
    first, refused, last = parse_batch_input(text.encode())
    assert first.error is None and last.error is None and last.number == 4  # the blank line is counted, not run
    assert refused.custom_id == custom_id and refused.number == 3
    error = refused.error["error"]
    assert {key: error[key] for key in ("code", "param", "line")} == {"code": code, "param": param, "line": 3}
    assert error["message"].startswith("line 3: ") and error["type"] == "invalid_request_error"
    assert "list" not in error["message"]  # JSON's names: an array, a string


def test_a_line_that_is_no_utf_8_or_starts_with_a_byte_order_mark():
    first, second = parse_batch_input(b"\xef\xbb\xbf" + _line("a", "/v1/completions", {"prompt": "x"}).encode()
                                      + b"\n\xff\xfe{}\n")
    assert first.error is None and first.custom_id == "a"
    assert second.error["error"]["code"] == "invalid_json_line" and "UTF-8" in second.error["error"]["message"]


def test_files_written_with_a_byte_order_mark_and_joined_run_every_line():
    """`cat a.jsonl b.jsonl` of two files an editor saved with a byte order mark puts the second's mark at the start of
    a line in the middle: that line was an error record ("not a JSON object"). The mark is dropped at any line's start;
    one inside a line's JSON is still its error."""
    saved = [b"\xef\xbb\xbf" + _line(custom_id, "/v1/completions", {"prompt": "x"}).encode() + b"\n"
             for custom_id in "ab"]
    lines = parse_batch_input(b"".join(saved) + b'{"custom_id": \xef\xbb\xbf"c"}\n')
    assert [(line.custom_id, line.error) for line in lines[:2]] == [("a", None), ("b", None)]
    assert lines[2].error["error"]["code"] == "invalid_json_line" and lines[2].error["error"]["line"] == 3


@pytest.mark.parametrize(("encoding", "named"), [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16 or UTF-32"),
                                              ("utf-32", "UTF-32"), ("utf-32-le", "UTF-16 or UTF-32")])
def test_a_file_in_utf_16_or_32_is_refused_whole(capsys, tmp_path, encoding, named):
    """PowerShell's `>` writes UTF-16: each line was run, and refused as not JSON, once the model had loaded (a NUL byte
    after the last newline a line of its own); the file is refused before the model loads, saying how to save it."""
    text = "\r\n".join(_line(custom_id, "/v1/completions", {"prompt": "x"}) for custom_id in "ab") + "\r\n"
    (tmp_path / "in.jsonl").write_bytes(text.encode(encoding))
    out = tmp_path / "out.jsonl"
    assert main(["run-batch", str(tmp_path / "no-such-model"), "-i", str(tmp_path / "in.jsonl"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--input-file {tmp_path / 'in.jsonl'}: the file is {named} text" in err, err
    assert "UTF-8" in err and not out.exists()
    assert [line.custom_id for line in parse_batch_input(text.encode("utf-8-sig"))] == ["a", "b"]


def _zstd(data: bytes) -> bytes:
    return pytest.importorskip("zstandard").ZstdCompressor().compress(data)


@pytest.mark.parametrize(("compress", "named"), [(gzip.compress, "gzip"), (bz2.compress, "bzip2"),
                                                 (lzma.compress, "xz"), (_zstd, "zstd")])
def test_a_compressed_file_is_refused_whole_saying_how_to_decompress_it(capsys, tmp_path, compress, named):
    """A `requests.jsonl.gz` was run once the model had loaded, each stretch of its bytes between two newline bytes an
    error record ("not UTF-8 text"), exit 0: it is refused before the model loads, naming the program to decompress it
    with."""
    text = "".join(_line(custom_id, "/v1/completions", {"prompt": "x"}) + "\n" for custom_id in "ab")
    (tmp_path / "in.jsonl.gz").write_bytes(compress(text.encode()))
    out = tmp_path / "out.jsonl"
    assert main(["run-batch", str(tmp_path / "no-such-model"), "-i", str(tmp_path / "in.jsonl.gz"), "-o",
                 str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--input-file {tmp_path / 'in.jsonl.gz'}: the file is {named}-compressed" in err
    assert f"{named} -dc FILE | glimmer run-batch" in err and not out.exists()


def test_a_body_is_sent_as_the_line_has_it():
    """The server refuses a key given twice in a body; read into a dict and written again, the last value would
    have been taken silently."""
    (line,) = parse_batch_input(b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", '
                                b'"body": {"prompt": "x",  "prompt": "y"}}')
    assert line.body == b'{"prompt": "x",  "prompt": "y"}'


class _SlowApp:
    """An ASGI app whose answer to body {"delay": s} takes s seconds; it counts the requests in flight, and answers
    the first request of body {"busy": true} as a full engine queue does (429)."""

    def __init__(self):
        self.in_flight = 0
        self.most_in_flight = 0
        self.refused_busy = False

    async def __call__(self, scope, receive, send):
        body = json.loads((await receive())["body"])
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(body.get("delay", 0))
        self.in_flight -= 1
        status, answer = 200, {"echo": body}
        if body.get("busy") and not self.refused_busy:
            self.refused_busy = True
            status, answer = 429, {"error": {"message": "full", "type": "overloaded_error", "param": None,
                                             "code": "engine_overloaded"}}
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})


def test_requests_run_concurrently_and_records_are_written_in_input_order():
    app = _SlowApp()
    delays = [0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0]  # each line finishes before the ones above it
    lines = [_line(f"r{index}", "/v1/completions", {"delay": delay}) for index, delay in enumerate(delays)]
    lines.insert(3, "not json")
    records = _run(app, "\n".join(lines), max_in_flight=3)
    assert [record["custom_id"] for record in records] == ["r0", "r1", "r2", None, "r3", "r4", "r5", "r6"]
    assert app.most_in_flight == 3
    assert [record["response"]["body"]["echo"]["delay"] for record in records if record["error"] is None] == delays
    assert len({record["id"] for record in records}) == len(records)


def test_a_request_the_engine_queue_refuses_is_sent_again():
    """A full queue (429 engine_overloaded) says "retry later": a batch has no client to retry, so it waits and sends
    the request again instead of writing the 429."""
    app = _SlowApp()
    (record,) = _run(app, _line("a", "/v1/completions", {"busy": True}))
    assert app.refused_busy and record["response"]["status_code"] == 200


def test_a_line_continuing_the_response_of_a_line_refused_for_its_order_fails_after_that_line():
    """Line 1 makes 'resp-x' but is refused, continuing line 2's response: line 3, continuing 'resp-x', said line 1
    "does not come before this line", which it does. It fails, not run, saying line 1 failed."""
    app = _SlowApp()
    records = _run(app, "\n".join([
        _line("a", "/v1/responses", {"request_id": "resp-x", "previous_response_id": "resp-y"}),
        _line("b", "/v1/responses", {"request_id": "resp-y"}),
        _line("c", "/v1/responses", {"previous_response_id": "resp-x"})]))
    assert [record["response"]["status_code"] for record in records] == [400, 200, 400]
    first, last = records[0]["error"]["error"], records[2]["error"]["error"]
    assert "'resp-y' is the response line 2 makes" in first["message"]
    assert (last["code"], last["line"]) == ("previous_response_not_found", 3)
    assert last["param"] == "body.previous_response_id"
    assert "'resp-x' is the response line 1 makes, and line 1 failed" in last["message"]


class _WaitingApp:
    """An ASGI app that, as the server's handlers do while a request generates, waits for its client to leave."""

    def __init__(self):
        self.started = 0
        self.disconnected = 0

    async def __call__(self, scope, receive, send):
        await receive()
        self.started += 1
        if (await receive())["type"] == "http.disconnect":
            self.disconnected += 1


def test_a_cancelled_batch_disconnects_its_requests_and_writes_no_more():
    """Ctrl-C cancels the batch: the requests in flight see their client leave, as a server's do, instead of being
    cancelled inside their handlers (where the engine's stream broke, each logged as an internal error)."""
    app = _WaitingApp()
    records: list[dict[str, Any]] = []

    async def cancel_when_two_run():
        lines = parse_batch_input("\n".join(_line(f"r{index}", "/v1/completions", {"prompt": "x"})
                                            for index in range(3)).encode())
        batch = asyncio.ensure_future(run_batch(app, lines, records.append, max_in_flight=2))
        while app.started < 2:
            await asyncio.sleep(0.01)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch

    asyncio.run(cancel_when_two_run())
    assert (app.started, app.disconnected, records) == (2, 2, [])


def test_a_cancelled_batch_aborts_its_requests_without_internal_errors(tiny_checkpoint, caplog):
    with live_server(tiny_checkpoint) as live:
        runner = live.engine.engine.runner
        execute = runner.execute

        def slow_execute(step):  # the first tokens take a while: the batch is cancelled while they are awaited
            time.sleep(0.5)
            return execute(step)

        runner.execute = slow_execute

        async def cancel_while_generating():
            text = "\n".join(_line(f"r{index}", "/v1/completions", {"prompt": f"p{index}", "max_tokens": 1500,
                                                                    "ignore_eos": True}) for index in range(2))
            batch = asyncio.ensure_future(run_batch(live.app, parse_batch_input(text.encode()), print,
                                                    max_in_flight=2))
            scheduler = live.engine.engine.scheduler
            while len(scheduler.running) + len(scheduler.waiting) < 2:  # both admitted, their first token awaited
                await asyncio.sleep(0.01)
            batch.cancel()
            with pytest.raises(asyncio.CancelledError):
                await batch

        asyncio.run(cancel_while_generating())
        samples = live.wait_for_idle()
    busy = {name: value for name, value in samples.items() if value and name.startswith(
        ("glimmer_kv_blocks_used", "glimmer_num_requests_running", "glimmer_num_requests_waiting"))}
    assert busy == {}  # the engine aborted both
    assert [record.getMessage() for record in caplog.records if record.levelname == "ERROR"] == []


def _batch_file(tmp_path: Path) -> tuple[Path, list[str]]:
    lines = [_line(custom_id, url, body) for custom_id, (url, body) in BODIES.items()]
    lines[2:2] = ["{broken", _line("chat", "/v1/completions", {"prompt": "again"}),
                  _line("stream", "/v1/completions", {"prompt": "x", "stream": True})]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    ids = [*list(BODIES)[:2], None, "chat", "stream", *list(BODIES)[2:]]
    return path, ids


def test_run_batch_writes_a_record_for_each_line_and_exits_0(tiny_checkpoint, tmp_path, capsys):
    source, ids = _batch_file(tmp_path)
    out = tmp_path / "results.jsonl"
    assert main(["run-batch", str(tiny_checkpoint), "-i", str(source), "-o", str(out), "--max-model-len", "2048",
                 "--served-model-name", "tiny"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [record["custom_id"] for record in records] == ids
    # a failed line as vLLM's run_batch writes one: its status, no body, the error body in `error`
    statuses = [(record["response"]["status_code"], record["error"] and record["error"]["error"]["code"])
                for record in records]
    assert statuses == [(200, None), (200, None), (400, "invalid_json_line"), (400, "duplicate_custom_id"),
                        (400, "invalid_parameter"), (200, None), (200, None), (200, None), (400, None)]
    assert all((record["response"]["body"] is None) == (record["error"] is not None) for record in records)
    assert all(set(record) == {"id", "custom_id", "response", "error"} for record in records)
    err = capsys.readouterr().err
    assert "wrote 9 records" in err and "5 answered with status 200, 4 failed" in err


def test_run_batch_takes_vllms_limit_mm_per_prompt(make_tiny, tmp_path):
    """`vllm run-batch ... --limit-mm-per-prompt '{"image": 0}'` was refused as an unrecognized argument (serve took
    it): a request with more images than it allows gets a 400 record naming the image over the limit (refused
    before it is read); at 0 it says images are disabled, where it said "more than 0 images", and names run-batch's
    flag, where it said "on this server (--max-images-per-request 0, ...)", neither of which run-batch has."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    source, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text(_line("two", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": [image, image, {"type": "text", "text": "Compare"}]}],
        "max_tokens": 1}) + "\n")
    assert main(["run-batch", str(make_tiny(vision=True)), "-i", str(source), "-o", str(out), "--max-model-len",
                 "2048", "--limit-mm-per-prompt", '{"image": 0}']) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["response"]["status_code"] == 400
    error = record["error"]["error"]
    assert error["param"] == "messages[0].content[0]"
    assert error["message"].startswith("messages[0].content[0]: images are disabled ("), error["message"]
    assert "run-batch --limit-mm-per-prompt image=0" in error["message"], error["message"]
    assert "more than 0" not in error["message"] and "on this server" not in error["message"]


def test_a_record_stays_one_line_for_readers_that_split_at_unicode_line_breaks(tiny_checkpoint, tmp_path):
    """U+2028, U+2029 and NEL, written raw in a record (here its custom_id; an answer's text too), end a line for
    str.splitlines, as they did in streamed events: such a reader of the output read the record as two broken ones."""
    custom_id = "a\u2028b\u2029c\x85d"
    source, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    source.write_text(_line(custom_id, "/v1/completions", {"prompt": "Once", "max_tokens": 1}) + "\n")
    assert main(["run-batch", str(tiny_checkpoint), "-i", str(source), "-o", str(out), "--max-model-len", "2048"]) == 0
    (line,) = out.read_text(encoding="utf-8").splitlines()
    assert json.loads(line)["custom_id"] == custom_id


def test_run_batch_to_stdout_writes_utf8_and_gives_stdout_back_as_it_was(tiny_checkpoint, monkeypatch):
    """run-batch -o - set stdout's encoding to UTF-8 (errors strict) for good: a program running
    glimmer.cli.main(["run-batch", ...]) wrote in it after main returned. The records are UTF-8 still."""
    text = _line("é", "/v1/completions", {"model": tiny_checkpoint.name, "prompt": "Once", "max_tokens": 2}) + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="latin-1", errors="backslashreplace")
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["run-batch", str(tiny_checkpoint), "-i", "-", "-o", "-", "--max-model-len", "2048"]) == 0
    assert (sys.stdout.encoding, sys.stdout.errors) == ("latin-1", "backslashreplace")
    stdout.flush()
    (line,) = stdout.buffer.getvalue().decode("utf-8").splitlines()
    assert json.loads(line)["custom_id"] == "é"


def test_run_batch_reads_stdin_and_writes_stdout(tiny_checkpoint, monkeypatch, capsys):
    """A body's `model` may name the model as `glimmer serve` does (the directory's name) or as MODEL was given, which
    is how vLLM's run-batch serves it."""
    text = "".join(_line(custom_id, "/v1/completions", {"model": model, "prompt": "Once", "max_tokens": 4}) + "\n"
                   for custom_id, model in (("by-name", tiny_checkpoint.name), ("as-given", str(tiny_checkpoint))))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    # a vllm run-batch command line: MODEL as --model, options whose values change nothing (noted on stderr)
    assert main(["run-batch", "-i", "-", "-o", "-", "--model", str(tiny_checkpoint), "--max-model-len", "2048",
                 "--dtype", "auto", "--response-role", "assistant", "--output-tmp-dir", "/tmp",
                 "--enable-force-include-usage", "--port", "8000", "--disable-log-stats"]) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]  # stdout holds the records alone
    assert [(record["custom_id"], record["response"]["status_code"]) for record in records] == [
        ("by-name", 200), ("as-given", 200)]
    assert [record["response"]["body"]["model"] for record in records] == [tiny_checkpoint.name, str(tiny_checkpoint)]
    assert "wrote 2 records to stdout" in captured.err
    assert "vLLM's --output-tmp-dir /tmp changes nothing here" in captured.err
    assert "vLLM's --response-role assistant changes nothing here" in captured.err
    # run-batch has no /metrics: the note said "the server exports its metrics at /metrics"
    assert ("vLLM's --disable-log-stats changes nothing here: Glimmer logs no periodic statistics to turn off "
            "(`glimmer serve` exports its metrics at /metrics); leave it out\n") in captured.err


def _run_batch_with_a_stream_closed(tiny_checkpoint: Path, tmp_path: Path, closed: str
                                    ) -> subprocess.CompletedProcess:
    """`glimmer run-batch MODEL -i - -o -` of two completion lines, run with `closed` (a shell redirection such as
    `2>&-`) as a daemonizer or a job runner starts it."""
    text = "".join(_line(f"q{index}", "/v1/completions", {"prompt": "Once", "max_tokens": 2}) + "\n"
                   for index in range(2))
    return subprocess.run(["sh", "-c", f'exec "$@" {closed}', "sh", sys.executable, "-m", "glimmer.cli", "run-batch",
                           str(tiny_checkpoint), "-i", "-", "-o", "-", "--max-model-len", "2048",
                           "--disable-log-requests"], input=text, capture_output=True, text=True, timeout=300)


def test_run_batch_started_with_stderr_closed_writes_its_records_alone(tiny_checkpoint, tmp_path):
    """Python has no sys.stderr then: the progress bar wrote to None (an AttributeError once the batch began, the
    output emptied, exit 1), and print(file=None) wrote the notes and the summary to stdout, among the records."""
    run = _run_batch_with_a_stream_closed(tiny_checkpoint, tmp_path, "2>&-")
    assert run.returncode == 0
    records = [json.loads(line) for line in run.stdout.splitlines()]  # stdout holds the records alone
    assert [(record["custom_id"], record["response"]["status_code"]) for record in records] == [("q0", 200),
                                                                                                   ("q1", 200)]


def test_run_batch_to_a_closed_stdout_is_one_line_before_the_model_loads(tiny_checkpoint, tmp_path):
    """It loaded the model, then failed writing the first record to None: a traceback, exit 1."""
    run = _run_batch_with_a_stream_closed(tiny_checkpoint, tmp_path, ">&-")
    assert run.returncode == 2 and "Loading weights" not in run.stderr, run.stderr
    assert run.stderr.splitlines()[-1] == ("glimmer: error: --output-file -: stdout is closed; give the path to write "
                                           "the results to")


def test_a_short_engine_queue_still_leaves_a_full_batch_in_flight(tiny_checkpoint, tmp_path, monkeypatch):
    """--max-waiting-requests bounds the requests waiting beside those the engine runs: at 1, the batch ran one request
    at a time, and the engine batched none."""
    import glimmer.server.batch

    in_flight = []

    async def recorded(app, lines, write, *, max_in_flight, on_done):
        in_flight.append(max_in_flight)
        return await run_batch(app, lines, write, max_in_flight=max_in_flight, on_done=on_done)

    monkeypatch.setattr(glimmer.server.batch, "run_batch", recorded)
    (tmp_path / "in.jsonl").write_text(_line("a", "/v1/completions", {"prompt": "x", "max_tokens": 2}) + "\n")
    assert main(["run-batch", str(tiny_checkpoint), "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out"),
                 "--max-model-len", "2048", "--max-num-seqs", "8", "--max-waiting-requests", "1"]) == 0
    assert in_flight[0] > 8


def test_run_batch_from_a_closed_stdin_is_one_line_before_the_model_loads(tiny_checkpoint, tmp_path):
    """`-i -` started with stdin closed (`<&-`, as a daemonizer starts it) read from None: an AttributeError traceback,
    exit 1."""
    run = _run_batch_with_a_stream_closed(tiny_checkpoint, tmp_path, "<&-")
    assert run.returncode == 2 and "Loading weights" not in run.stderr, run.stderr
    assert run.stderr.splitlines()[-1] == ("glimmer: error: --input-file -: stdin is closed; give the batch file's "
                                           "path, or pipe the file in")


def test_records_written_to_stdout_are_utf_8_whatever_the_locale_encoding(tiny_checkpoint):
    """`-o -` wrote the records in stdout's encoding: under PYTHONIOENCODING=ascii (or a latin-1 locale, a Windows
    code page) a record with "é" ended the batch in a UnicodeEncodeError traceback, exit 1, where the file a JSON
    Lines reader takes is UTF-8."""
    text = _line("café", "/v1/completions", {"prompt": "Once", "max_tokens": 2}) + "\n"
    run = subprocess.run([sys.executable, "-m", "glimmer.cli", "run-batch", str(tiny_checkpoint), "-i", "-", "-o", "-",
                          "--max-model-len", "2048"], input=text.encode(), capture_output=True, timeout=300,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    (record,) = [json.loads(line) for line in run.stdout.decode("utf-8").splitlines()]
    assert (record["custom_id"], record["response"]["status_code"]) == ("café", 200)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a file every write to fails")
def test_an_output_that_cannot_be_written_is_one_line(tiny_checkpoint, tmp_path, capsys):
    """A full disk was a traceback (the buffered records failed when the file was closed)."""
    (tmp_path / "in.jsonl").write_text(_line("a", "/v1/completions", {"prompt": "x", "max_tokens": 2}) + "\n")
    assert main(["run-batch", str(tiny_checkpoint), "-i", str(tmp_path / "in.jsonl"), "-o", "/dev/full",
                 "--max-model-len", "2048"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "glimmer: error: --output-file /dev/full: No space left on device"
    assert "Traceback" not in "\n".join(err)


@pytest.mark.parametrize(("flags", "words"), [
    (["--enable-metrics"], ("--enable-metrics", "no Prometheus metrics")),
    (["--response-role", "user"], ("--response-role user", "assistant role")),
    (["--tensor-parallel-size", "2"], ("--tensor-parallel-size 2", "one device")),
])
def test_a_vllm_option_that_would_change_something_is_refused_before_the_output_is_opened(capsys, tmp_path, flags,
                                                                                         words):
    (tmp_path / "in.jsonl").write_text(_line("a", "/v1/completions", {"prompt": "x"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["run-batch", str(tmp_path / "no-such-model"), "-i", str(tmp_path / "in.jsonl"), "-o", str(out),
                 *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(word in err for word in words), err
    assert not out.exists()


@pytest.mark.parametrize(("argv", "words"), [
    (["-i", "{dir}/missing.jsonl", "-o", "{dir}/out.jsonl"], ("--input-file", "missing.jsonl", "No such file")),
    (["-i", "https://example.com/batch.jsonl", "-o", "{dir}/out.jsonl"], ("--input-file", "URL is not supported")),
    (["-i", "{dir}/in.jsonl", "-o", "https://example.com/out.jsonl"], ("--output-file", "URL is not supported")),
    (["-i", "{dir}/in.jsonl", "-o", "{dir}/in.jsonl"], ("--output-file", "is the input file", "overwrite")),
    (["-i", "{dir}/in.jsonl", "-o", "{dir}/no/such/dir/out.jsonl"], ("--output-file", "No such file")),
])
def test_an_input_or_output_that_cannot_be_used_is_one_line_before_the_model_loads(capsys, tmp_path, argv, words):
    (tmp_path / "in.jsonl").write_text(_line("a", "/v1/completions", {"prompt": "x"}) + "\n")
    model = str(tmp_path / "no-such-model")  # loading it would be refused naming it
    assert main(["run-batch", model, *[arg.format(dir=tmp_path) for arg in argv]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("glimmer: error:"), err
    assert all(word in err for word in words) and "no-such-model" not in err


def test_an_earlier_output_is_kept_when_the_model_fails_to_load_and_replaced_by_a_batch(tiny_checkpoint, tmp_path,
                                                                                          capsys):
    """The output was opened for writing, emptied, before the model loaded: a typo in MODEL (or a bad config) erased
    the results of an earlier run, and no batch ran. It is emptied once the batch begins, then written whole."""
    (tmp_path / "in.jsonl").write_text(_line("a", "/v1/completions", {"prompt": "x", "max_tokens": 2}) + "\n")
    out = tmp_path / "out.jsonl"
    earlier = "".join(_line(f"earlier-{index}", "/v1/completions", {"prompt": "x"}) + "\n" for index in range(3))
    out.write_text(earlier)
    assert main(["run-batch", str(tmp_path / "no-such-model"), "-i", str(tmp_path / "in.jsonl"), "-o", str(out)]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert out.read_text() == earlier
    assert main(["run-batch", str(tiny_checkpoint), "-i", str(tmp_path / "in.jsonl"), "-o", str(out),
                 "--max-model-len", "2048"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(record["custom_id"], record["response"]["status_code"]) for record in records] == [("a", 200)]


def test_no_output_file_is_left_when_the_model_fails_to_load(tmp_path, capsys):
    """An output that was not there was created empty to check that it could be written, and left so when the model
    failed to load: an empty results file, as an empty batch writes, from a run that answered nothing."""
    (tmp_path / "in.jsonl").write_text(_line("a", "/v1/completions", {"prompt": "x", "max_tokens": 2}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["run-batch", str(tmp_path / "no-such-model"), "-i", str(tmp_path / "in.jsonl"), "-o", str(out)]) == 2
    assert "no-such-model" in capsys.readouterr().err
    assert not out.exists()


def test_an_output_that_is_a_hard_link_to_the_input_is_refused_leaving_the_input_whole(capsys, tmp_path):
    """Only the same resolved path was taken for the input: a hard link to it was opened for writing, which emptied the
    input file (the batch ran from the bytes read before)."""
    source = tmp_path / "in.jsonl"
    text = _line("a", "/v1/completions", {"prompt": "x"}) + "\n"
    source.write_text(text)
    (tmp_path / "link.jsonl").hardlink_to(source)
    assert main(["run-batch", str(tmp_path / "no-such-model"), "-i", str(source), "-o",
                 str(tmp_path / "link.jsonl")]) == 2
    assert "is the input file" in capsys.readouterr().err
    assert source.read_text() == text


def _stop_a_running_batch(checkpoint: Path, tmp_path: Path, signal_number: int) -> tuple[list[str], str, int, Path]:
    """Runs a batch of three quick requests and sixteen long ones, sends `signal_number` once the batch runs; the
    custom_ids of the records written, stderr, the exit code, and the output's path."""
    quick = [_line(f"quick-{index}", "/v1/completions", {"prompt": "Once", "max_tokens": 1}) for index in range(3)]
    long = [_line(f"long-{index}", "/v1/completions", {"prompt": "Once", "max_tokens": 1900, "ignore_eos": True})
            for index in range(16)]
    source, out, err = tmp_path / "requests.jsonl", tmp_path / "results.jsonl", tmp_path / "stderr.txt"
    source.write_text("\n".join(quick + long) + "\n")
    with err.open("w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "glimmer.cli", "run-batch", str(checkpoint), "-i",
                                    str(source), "-o", str(out), "--max-model-len", "2048"], stderr=stderr)
        try:
            deadline = time.monotonic() + 120
            while "run-batch:" not in err.read_text():  # the progress bar: the engine is loaded, the batch runs
                assert process.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.1)
            process.send_signal(signal_number)
            code = process.wait(timeout=60)
        finally:
            process.kill()
    records = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert records == [f"quick-{index}" for index in range(3)][:len(records)]
    return records, err.read_text(), code, out


def test_sigterm_stops_a_batch_as_ctrl_c_does_keeping_the_records_written(tiny_checkpoint, tmp_path):
    """`docker stop` or a deleted Kubernetes Job sends SIGTERM: the requests in flight are aborted, the records
    finished before it are in the output, whole, and the exit code is 143 (SIGTERM killed it, the records still in
    the output's buffer lost, its last line cut where the buffer had been written)."""
    _, stderr, code, _ = _stop_a_running_batch(tiny_checkpoint, tmp_path, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, stderr
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr


def test_ctrl_c_stops_a_batch_saying_what_was_written_and_exits_130(tiny_checkpoint, tmp_path):
    """Ctrl-C (SIGINT) in a running batch ended it with nothing said (or a traceback): the requests in flight are
    aborted, the records finished before it are in the output, whole, and one line says how many and where."""
    records, stderr, code, out = _stop_a_running_batch(tiny_checkpoint, tmp_path, signal.SIGINT)
    assert code == 130, stderr
    written = f"{len(records)} record{'s' * (len(records) != 1)}"
    assert f"run-batch: stopped by Ctrl-C; wrote {written} to {out}, those finished before it" in stderr
    assert "Traceback" not in stderr


def test_no_model_with_dummy_weights_does_not_claim_the_trained_demo(capsys, tmp_path):
    """`--load-format dummy` without MODEL draws random weights in glimmer-nano's geometry, but the note said "this is
    the embedded demo model glimmer-nano ...: it calls tools like those it was trained on"; it says the weights are
    random and how to get the trained demo."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(_line("a", "/v1/completions", {"prompt": "x", "max_tokens": 1}) + "\n")
    assert main(["run-batch", "--load-format", "dummy", "-i", str(source), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    note = next(line for line in err.splitlines() if line.startswith("No MODEL given"))
    assert "random weights (--load-format dummy)" in note and "leave out --load-format dummy" in note, note
    assert "calls tools like those it was trained on" not in note


def test_run_batch_renders_a_lines_own_chat_template_under_trust_request_chat_template(tiny_checkpoint, tmp_path):
    """A line with its own `chat_template` is a 400 naming --trust-request-chat-template, as on serve; run-batch
    refused that flag as an unrecognized argument, so the fix the record named could not be applied."""
    template = ("{{ bos_token }}{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|eot|>"
                "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}")
    source = tmp_path / "requests.jsonl"
    source.write_text(_line("own", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "chat_template": template}) + "\n")
    records = {}
    for trusted in (False, True):
        out = tmp_path / f"results-{trusted}.jsonl"
        flags = ["--trust-request-chat-template"] * trusted
        assert main(["run-batch", str(tiny_checkpoint), "-i", str(source), "-o", str(out), "--max-model-len", "2048",
                     *flags]) == 0
        (records[trusted],) = [json.loads(line) for line in out.read_text().splitlines()]
    refused = records[False]["error"]["error"]
    assert refused["param"] == "chat_template" and "--trust-request-chat-template" in refused["message"]
    answered = records[True]["response"]
    # the line's template rendered the prompt (the model's own would have added its system block)
    rendered = "<|begin_of_text|><|start|>user<|message|>hi<|eot|><|start|>assistant"
    assert answered["status_code"] == 200
    assert answered["body"]["usage"]["prompt_tokens"] == len(Tokenizer.from_dir(tiny_checkpoint).encode(rendered))
