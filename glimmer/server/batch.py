"""`glimmer run-batch`: an OpenAI Batch API input file run through the server's own routes, in-process.

Each line of the input, `{"custom_id", "method": "POST", "url", "body"}`, is POSTed to the app `create_app` builds
as an ASGI server calls it, with its body's JSON text as it was in the line: the same validation, chat
rendering, tool-call parsing, structured outputs and error bodies as over HTTP, since it is the same code. Many
requests are in flight at once, so that the engine batches them; the records are written in input order (as vLLM's
run_batch writes them), one OpenAI batch output record a line:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.

A request the server answered 200 has the answer in `response.body` and `error` null. A failed one is written as
vLLM's run_batch writes it: `response.body` null, `response.status_code` the server's status and `error` its OpenAI
error body, `{"error": {"message", "type", "param", "code"}}`. A line that is no request the server could answer (not
JSON, no `custom_id`, a `custom_id` an earlier line has, a method or URL not served, `stream: true`) fails so too, with
status 400 (vLLM's) and `error.error.line` its line; the batch goes on.

A `/v1/responses` line whose `previous_response_id` names the response an earlier line makes (its body's
`request_id`, the id vLLM stores a response under) runs once that line's record is ready, so that the response it
continues is stored; if that line failed, it fails saying so, without running. One naming the response of a later
line (or its own) is an error record: it could only ever run before it.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

from glimmer.protocol.request_normalization import lone_surrogate_error
from glimmer.server.body import UTF8_BYTE_ORDER_MARK, wide_text_encoding
from glimmer.server.errors import INTERNAL_ERROR_MESSAGE, describe_error, error_body
from glimmer.server.schemas import LONE_SURROGATE

BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
"""The endpoints a batch line may name: those Glimmer serves that OpenAI's and vLLM's batch files name."""
# how a compressed file begins (gzip, bzip2, xz and zstd's magic numbers), and the program that decompresses it: no
# UTF-8 JSON text begins so, so that none of such a file's "lines" could run
_COMPRESSED_FILE_STARTS = ((re.compile(rb"\x1f\x8b"), "gzip"), (re.compile(rb"BZh[1-9]1AY&SY"), "bzip2"),
                           (re.compile(rb"\xfd7zXZ\x00"), "xz"), (re.compile(rb"\x28\xb5\x2f\xfd"), "zstd"))
OVERLOADED_RETRY_S = 0.05
"""How long a request the engine's queue refused (429) waits before it is sent again: a batch has no client to retry."""


@dataclass
class BatchLine:
    """One request line of a batch input file: `number` is its line in the file (from 1). A line that cannot run has
    its error record's `error` object; one that can has `url` and the JSON text of its `body`."""

    number: int
    custom_id: str | None
    url: str | None = None
    body: bytes | None = None
    error: dict[str, Any] | None = None
    makes: str | None = None  # the id of the stored response it makes (a /v1/responses body's `request_id`)
    continues: str | None = None  # the `previous_response_id` of a /v1/responses body
    after: int | None = None  # the index (in the lines) of the earlier line whose response it continues


@dataclass
class BatchSummary:
    """How a batch went: records written, how many of them were answered 200, how many failed."""

    written: int = 0
    succeeded: int = 0

    @property
    def failed(self) -> int:
        return self.written - self.succeeded


def parse_batch_input(data: bytes) -> list[BatchLine]:
    """The request lines of a batch input file, blank lines left out; a line that cannot run carries its error
    object (it never stops the others). Raises ValueError for a file in UTF-16 or UTF-32, or compressed (gzip, bzip2,
    xz, zstd), none of whose lines could."""
    wide = wide_text_encoding(data)
    if wide is not None:
        raise ValueError(f"the file is {wide} text, not UTF-8, so none of its lines is JSON a batch runs (PowerShell's "
                         "`>` writes UTF-16); save it as UTF-8, e.g. `Out-File -Encoding utf8`, or `iconv -t UTF-8`")
    compressed = next((name for start, name in _COMPRESSED_FILE_STARTS if start.match(data)), None)
    if compressed is not None:
        raise ValueError(f"the file is {compressed}-compressed, not JSON Lines text, so none of its lines is a "
                         f"request; decompress it first (`{compressed} -dk FILE`), or pipe it in: "
                         f"`{compressed} -dc FILE | glimmer run-batch ... --input-file -`")
    lines = []
    seen: dict[str, int] = {}  # custom_id → the line that named it first
    for number, raw in enumerate(data.split(b"\n"), start=1):
        # as some editors write at a file's start; at a line's, where files so written were joined (`cat a b`): the
        # mark is no part of a line's JSON wherever it is
        raw = raw.removeprefix(UTF8_BYTE_ORDER_MARK)
        if not raw.strip():
            continue
        lines.append(_parse_line(raw, number, seen))
    return _ordered_continuations(lines)


def _ordered_continuations(lines: list[BatchLine]) -> list[BatchLine]:
    """`lines`, each that continues the response an earlier line makes knowing that line (`after`, the latest such
    line before it), one that names the response of itself or a later line an error record. A line so refused still
    counts as the maker of its response: a later line continuing it fails as after any line that failed."""
    made_by = {}  # response id → index of the latest line so far that makes it
    makers = {line.makes: line.number for line in reversed(lines) if line.makes is not None}  # the first line of each
    for index, line in enumerate(lines):
        if line.continues in made_by:
            line.after = made_by[line.continues]
        elif line.continues in makers:
            lines[index] = _line_error(line.number, line.custom_id, "invalid_parameter",
                                       f"body.previous_response_id {line.continues!r} is the response line "
                                       f"{makers[line.continues]} makes (its request_id), which does not come before "
                                       "this line: a line continues only the response of an earlier line, which it "
                                       "runs after", "body.previous_response_id")
        if line.makes is not None:
            made_by[line.makes] = index
    return lines


def _line_error(number: int, custom_id: str | None, code: str, message: str, param: str | None = None) -> BatchLine:
    return BatchLine(number, custom_id, error={"error": {"message": f"line {number}: {message}",
                                                         "type": "invalid_request_error", "param": param, "code": code,
                                                         "line": number}})


def _parse_line(raw: bytes, number: int, seen: dict[str, int]) -> BatchLine:
    try:
        text = raw.decode()
    except UnicodeDecodeError as error:
        return _line_error(number, None, "invalid_json_line", f"not UTF-8 text (byte {error.start + 1}); a batch "
                           "file is JSON Lines in UTF-8")
    try:
        members = _object_members(text)
    except (ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        return _line_error(number, None, "invalid_json_line", f"not a JSON object ({reason}); each line of a batch "
                           'file is one request: {"custom_id": ..., "method": "POST", "url": ..., "body": {...}}')
    values = {key: value for key, (value, _) in members.items()}
    custom_id = values.get("custom_id")
    if custom_id is None:
        return _line_error(number, None, "missing_required_parameter", "custom_id is missing; give each line a "
                           "custom_id, unique in the file, to find its result by", "custom_id")
    if not isinstance(custom_id, str):
        return _line_error(number, None, "invalid_parameter",
                           f"custom_id must be a string, not {json.dumps(custom_id)}", "custom_id")
    if LONE_SURROGATE.search(custom_id):  # the record could not name it: the output is UTF-8 text
        return _line_error(number, None, "invalid_parameter", str(lone_surrogate_error("custom_id")), "custom_id")
    if custom_id in seen:
        return _line_error(number, custom_id, "duplicate_custom_id",
                           f"custom_id {custom_id!r} is line {seen[custom_id]}'s too; give each line a custom_id of "
                           "its own", "custom_id")
    seen[custom_id] = number
    for name in ("method", "url", "body"):
        if values.get(name) is None:
            return _line_error(number, custom_id, "missing_required_parameter", f"{name} is missing", name)
    method, url, body = values["method"], values["url"], values["body"]
    if method != "POST":
        return _line_error(number, custom_id, "invalid_parameter", f"method {json.dumps(method)} is not supported; "
                           'every batch request is "POST"', "method")
    if url not in BATCH_URLS:
        return _line_error(number, custom_id, "invalid_parameter", f"url {json.dumps(url)} is not served here; give "
                           f"one of {', '.join(BATCH_URLS)}", "url")
    if not isinstance(body, dict):
        return _line_error(number, custom_id, "invalid_parameter", f"body must be a JSON object (the request body "
                           f"{url} takes), not a JSON {_json_type(body)}", "body")
    if body.get("stream") is True:
        return _line_error(number, custom_id, "invalid_parameter", "body.stream true is not supported in a batch: "
                           "each result is written whole; leave stream out or false", "body.stream")
    line = BatchLine(number, custom_id, url, members["body"][1].encode())
    if url == "/v1/responses":  # the server checks both; a value it refuses orders nothing
        stored = body.get("store") is not False
        # an empty request_id is none given (the response gets an id of its own); an empty previous_response_id is
        # refused by the server, continuing no line
        line.makes = _nonempty_string(body.get("request_id")) if stored else None
        line.continues = _nonempty_string(body.get("previous_response_id"))
    return line


def _nonempty_string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _object_members(text: str) -> dict[str, tuple[Any, str]]:
    """The members of the JSON object that `text` is, as {name: (value, the value's JSON text)}: a request's body is
    sent to the server as the line has it, so that the server reads what it would over HTTP (a key given twice, which
    it refuses, included). Raises ValueError when `text` is not one JSON object or names a member twice."""
    value = json.loads(text)  # the whole line first, for its own error message
    if not isinstance(value, dict):
        raise ValueError(f"a JSON {_json_type(value)}")
    members: dict[str, tuple[Any, str]] = {}
    position = _WHITESPACE.match(text, text.index("{") + 1).end()
    while text[position] != "}":
        name, position = _DECODER.raw_decode(text, position)
        position = _WHITESPACE.match(text, position).end() + 1  # past the ':'
        start = _WHITESPACE.match(text, position).end()
        member, end = _DECODER.raw_decode(text, start)
        if name in members:
            raise ValueError(f"{name!r} is given twice")
        members[name] = (member, text[start:end])
        position = _WHITESPACE.match(text, end).end()
        if text[position] == ",":
            position = _WHITESPACE.match(text, position + 1).end()
    return members


async def run_batch(app: ASGIApp, lines: list[BatchLine], write: Callable[[dict[str, Any]], None], *,
                    max_in_flight: int, on_done: Callable[[], None] = lambda: None) -> BatchSummary:
    """Run `lines` through `app`, at most `max_in_flight` requests at once, and `write` each line's record in input
    order as soon as the records before it are written; `on_done` is called as each line's record is ready.

    Cancelled (Ctrl-C), it stops as a server's clients leave: the requests in flight see their client disconnect,
    so the engine aborts them, and no record is written after. Cancelling their handlers instead would break them
    mid-generation, each failing as an internal error."""
    summary = BatchSummary()
    records: dict[int, dict[str, Any]] = {}
    limit = asyncio.Semaphore(max_in_flight)
    stop = asyncio.Event()  # set: every request in flight sees its client leave
    failures: list[Exception] = []
    # the record of each line another continues, once ready: its response is stored by then
    continued = {line.after: asyncio.get_running_loop().create_future() for line in lines if line.after is not None}

    def ready(index: int, record: dict[str, Any]) -> None:
        if stop.is_set():
            return
        records[index] = record
        if index in continued:
            continued[index].set_result(record)
        on_done()
        while summary.written in records:
            written = records.pop(summary.written)
            write(written)
            summary.written += 1
            summary.succeeded += written["error"] is None

    async def run(index: int, line: BatchLine) -> None:
        try:
            if line.after is not None:  # it holds its place in flight: the line it waits for is in flight before it
                before = await _unless_stopped(continued[line.after], stop)
                if before is None:
                    return
                if before["error"] is not None:
                    ready(index, _record(line.custom_id, 400, _failed_before(line, lines[line.after])))
                    return
            ready(index, await _answer(app, line, stop))
        except Exception as error:  # writing the record failed (a full disk): the batch stops, saying why
            failures.append(error)
            stop.set()
        finally:
            limit.release()

    tasks: set[asyncio.Task] = set()
    try:
        for index, line in enumerate(lines):
            if line.error is not None:
                ready(index, _record(line.custom_id, 400, line.error))
                continue
            await limit.acquire()  # a task only for a request that may start: a file of millions stays small
            if stop.is_set():
                break
            task = asyncio.ensure_future(run(index, line))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:  # not gather, which would cancel them when cancelled itself
            await asyncio.wait(set(tasks))
    except asyncio.CancelledError:
        stop.set()
        if tasks:
            await asyncio.wait(set(tasks))
        raise
    if failures:
        raise failures[0]
    return summary


async def _unless_stopped(record: asyncio.Future, stop: asyncio.Event) -> dict[str, Any] | None:
    """The record `record` will hold, or None once `stop` is set first."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({record, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    return record.result() if record.done() and not stop.is_set() else None


def _failed_before(line: BatchLine, before: BatchLine) -> dict[str, Any]:
    """The error of `line`, not run: the line whose response it continues failed, so no such response was stored."""
    return _line_error(line.number, line.custom_id, "previous_response_not_found",
                       f"body.previous_response_id {line.continues!r} is the response line {before.number} makes, "
                       f"and line {before.number} failed (see its record), so this line was not run",
                       "body.previous_response_id").error


async def _answer(app: ASGIApp, line: BatchLine, stop: asyncio.Event) -> dict[str, Any]:
    """The record of `line`, answered by `app`; its client leaves when `stop` is set."""
    assert line.url is not None and line.body is not None
    while True:
        try:
            status, content = await _post(app, line.url, line.body, stop)
        except Exception as error:  # the app's middleware answers every exception: this one is logged, as a 500
            status, body = describe_error(error)
            content = json.dumps(body).encode()
        try:
            body = json.loads(content)
        except ValueError:  # no JSON body: a request cut short by `stop`, or an exception no handler saw
            body = error_body(INTERNAL_ERROR_MESSAGE, "internal_error")
        overloaded = status == 429 and (body.get("error") or {}).get("code") == "engine_overloaded"
        if not overloaded or stop.is_set():
            break
        await asyncio.sleep(OVERLOADED_RETRY_S)
    return _record(line.custom_id, status, body)


async def _post(app: ASGIApp, path: str, body: bytes, stop: asyncio.Event) -> tuple[int, bytes]:
    """(status, response body) of a JSON POST of `body` to `path`, made to `app` as an ASGI server makes it: its
    client disconnects once the response is complete, or when `stop` is set."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"host", b"glimmer-run-batch"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 0), "server": ("glimmer-run-batch", 80)}
    status, chunks, body_sent, complete = 500, [], False, asyncio.Event()

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        waits = {asyncio.ensure_future(complete.wait()), asyncio.ensure_future(stop.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                complete.set()

    await app(scope, receive, send)
    return status, b"".join(chunks)


def _record(custom_id: str | None, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """A line's output record: an answer other than 200 is its `error`, its `response` the status alone (vLLM's)."""
    failed = status != 200
    response = {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": None if failed else body}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": response,
            "error": body if failed else None}
