"""A client that keeps the server waiting for its request's bytes is disconnected (glimmer/server/connection.py): no
one can hold a connection (and a file descriptor, and for a body a handler) forever by sending part of a request,
while answers and streams of any length are never cut. And `glimmer serve` (a subprocess started with a low limit on
open files) raises that limit, and logs in one line the connections it still cannot accept. Real sockets against
live servers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from server_support import MODEL, ServeProcess, live_server

from glimmer.errors import ConfigError
from glimmer.server.background import BackgroundServer
from glimmer.server.connection import BODY_BYTES_PER_TIMEOUT, read_timeout_protocol

READ_TIMEOUT_S = 1.0
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
WAIT_S = 30.0  # far longer than READ_TIMEOUT_S: reaching it means the server never gave up on the client


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny(), scripted=True, request_read_timeout_s=READ_TIMEOUT_S) as live:
        yield live


def _connect(server) -> socket.socket:
    return socket.create_connection((httpx.URL(server.url).host, httpx.URL(server.url).port), timeout=WAIT_S)


def _read_until_closed(connection: socket.socket) -> bytes:
    """What the server writes until it closes the connection; socket.timeout after WAIT_S without it closing."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def _assert_408(received: bytes) -> None:
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and b"connection: close" in head
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and f"waits {READ_TIMEOUT_S:g} s" in error["message"]


def _still_serves(server) -> None:
    reply = httpx.post(server.base_url + "/chat/completions", timeout=WAIT_S, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert reply.status_code == 200


@pytest.mark.parametrize("sent", [HEAD, b"POST /v1/chat/comp"], ids=["headers", "request-line"])
def test_a_request_head_that_stalls_gets_408_and_its_connection_closes(server, sent):
    with _connect(server) as connection:
        connection.sendall(sent)
        _assert_408(_read_until_closed(connection))
    _still_serves(server)


def _trickled(connection: socket.socket, byte: bytes) -> bytes:
    """Send `byte` every 0.1 s until the server closes the connection; what it answered (nothing where it reset the
    connection, closing with a byte unread). Fails the test if it never closes."""
    connection.settimeout(0.1)
    received = b""
    for _ in range(int(WAIT_S / 0.1)):
        try:
            connection.sendall(byte)
            chunk = connection.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return received
        received += chunk
        if not chunk:
            return received
    pytest.fail(f"the server read a trickle for {WAIT_S} s")


def test_a_head_trickled_a_byte_at_a_time_is_cut_counting_from_its_start(server):
    """Each byte resets no clock: the head must be whole within the timeout, however steadily it trickles."""
    with _connect(server) as connection:
        connection.sendall(b"GET /health HTTP/1.1\r\n")
        received = _trickled(connection, b"X")  # a header's name, never a complete head
    assert received == b"" or received.startswith(b"HTTP/1.1 408 ")


def test_a_body_trickled_a_byte_at_a_time_is_cut_though_it_never_pauses_for_long(server):
    """A slow POST: a pause between two reads never reaches the timeout, but 64 KiB of body earn the next one."""
    with _connect(server) as connection:
        connection.sendall(HEAD + b"Content-Length: 100000\r\n\r\n")
        received = _trickled(connection, b" ")
    assert received == b"" or received.startswith(b"HTTP/1.1 408 ")
    _still_serves(server)


def test_a_body_that_stalls_gets_408_and_the_server_serves_on(server):
    with _connect(server) as connection:
        connection.sendall(HEAD + b"Content-Length: 1000\r\n\r\n{\"model\": ")
        _assert_408(_read_until_closed(connection))
    _still_serves(server)


def _request_counts(server) -> dict[str, float]:
    """glimmer_requests_total by its labels, less /metrics' own requests."""
    return {name: value for name, value in server.metrics().items()
            if name.startswith("glimmer_requests_total{") and 'endpoint="/metrics"' not in name}


def test_a_body_that_stalls_counts_as_408_not_as_a_client_that_left(server):
    """The server gave up on the body and answered 408; its handler saw a disconnect, which counted as 499."""
    key = 'glimmer_requests_total{endpoint="/v1/chat/completions",status="%s"}'
    before = _request_counts(server)
    with _connect(server) as connection:
        connection.sendall(HEAD + b"Content-Length: 1000\r\n\r\n{\"model\": ")
        _assert_408(_read_until_closed(connection))
    deadline = time.monotonic() + WAIT_S  # the handler ends, and is counted, after the connection closed
    while (after := _request_counts(server)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)} == {
        key % 408: 1}


@pytest.mark.parametrize("sent", [HEAD, b"POST /v1/chat/comp"], ids=["headers", "request-line"])
def test_a_request_head_that_stalls_is_not_counted(server, sent):
    """No handler ran: /metrics counts the requests the app received (README)."""
    before = _request_counts(server)
    with _connect(server) as connection:
        connection.sendall(sent)
        _assert_408(_read_until_closed(connection))
    time.sleep(READ_TIMEOUT_S / 4)
    assert _request_counts(server) == before


@pytest.mark.parametrize("sent", [
    HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    HEAD + b"Content-Length: -1\r\n\r\n{}",
    HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    HEAD + b"a header without a colon\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
], ids=["two-lengths", "negative-length", "chunk-framing", "header-line", "tls-hello"])
def test_bytes_that_are_no_http_request_get_an_openai_style_400_and_the_server_serves_on(server, sent):
    """uvicorn answered them itself with a plain-text 400 ("Invalid HTTP request received.")."""
    with _connect(server) as connection:
        connection.sendall(sent)
        received = _read_until_closed(connection)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"content-type: application/json" in head, received
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_http_request" and "not valid HTTP/1.1" in error["message"]
    assert error["type"] == "invalid_request_error"
    _still_serves(server)


def test_a_connection_that_sends_nothing_is_closed_without_a_response(server):
    with _connect(server) as connection:
        assert _read_until_closed(connection) == b""


def test_the_rest_of_a_refused_body_is_not_read_past_the_timeout(server):
    """A chunked body past the size limit is answered 413, and the server read and discarded the rest for as long
    as the client sent it (20 GB in 20 s on loopback)."""
    with _connect(server) as connection:
        connection.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
        deadline = time.monotonic() + WAIT_S
        with pytest.raises(OSError):  # reset, or the pipe broken, once the server closes
            while time.monotonic() < deadline:
                connection.sendall(chunk)
    _still_serves(server)


def test_a_large_body_sent_slowly_is_read_whole_while_each_64_kib_comes_within_the_timeout(server):
    pieces = [b" " * BODY_BYTES_PER_TIMEOUT] * 5 + [json.dumps({  # JSON may begin with white space
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()]
    with _connect(server) as connection:
        connection.sendall(HEAD + f"Content-Length: {sum(map(len, pieces))}\r\nConnection: close\r\n\r\n".encode())
        for piece in pieces:  # altogether far longer than the timeout, each piece in half of it
            time.sleep(READ_TIMEOUT_S / 2)
            connection.sendall(piece)
        assert len(pieces) * READ_TIMEOUT_S / 2 > 2 * READ_TIMEOUT_S
        assert _read_until_closed(connection).startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.parametrize("stream", [False, True], ids=["answer", "stream"])
def test_an_answer_that_takes_longer_than_the_timeout_is_not_cut(server, stream):
    """The limit is on waiting for the client's request, never on the server's answer."""
    runner = server.engine.engine.runner
    runner.step_delay_s = READ_TIMEOUT_S / 10
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
                "ignore_eos": True, "stream": stream}
        started = time.monotonic()
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=WAIT_S) as reply:
            text = reply.read().decode()
        assert time.monotonic() - started > 2 * READ_TIMEOUT_S
    finally:
        runner.step_delay_s = 0.0
    assert reply.status_code == 200
    if stream:
        assert text.rstrip().endswith("data: [DONE]")
    else:
        assert json.loads(text)["usage"]["completion_tokens"] == 40


def _late_app() -> FastAPI:
    """An app whose handlers keep the request waiting on themselves for longer than the timeout."""
    app = FastAPI()

    @app.post("/late-read")
    async def late_read(request: Request) -> dict[str, int]:
        await asyncio.sleep(3 * READ_TIMEOUT_S)
        return {"read": len(await request.body())}

    @app.post("/answer-unread")
    async def answer_unread() -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            for _ in range(6):
                yield b"line\n"
                await asyncio.sleep(READ_TIMEOUT_S / 2)
        return StreamingResponse(lines())

    return app


def test_a_client_waiting_for_100_continue_is_not_cut_while_the_handler_reads_its_body_late():
    """The client sends its body only once asked (`Expect: 100-continue`), and the server asks when its handler
    first reads it: until then the wait is the server's. It got 408 after the timeout without being asked."""
    with BackgroundServer(_late_app(), request_read_timeout_s=READ_TIMEOUT_S) as live, \
            socket.create_connection((live.host, live.port), timeout=WAIT_S) as connection:
        connection.sendall(b"POST /late-read HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n"
                           b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
        assert connection.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
        connection.sendall(b"hello")
        received = _read_until_closed(connection)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b'{"read":5}')


def test_an_answer_begun_before_the_body_is_read_is_not_cut_by_a_408_written_into_it():
    with BackgroundServer(_late_app(), request_read_timeout_s=READ_TIMEOUT_S) as live, \
            socket.create_connection((live.host, live.port), timeout=WAIT_S) as connection:
        connection.sendall(b"POST /answer-unread HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n"
                           b"Connection: close\r\n\r\n")
        received = _read_until_closed(connection)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and b"408" not in received
    assert received.count(b"line\n") == 6 and received.endswith(b"0\r\n\r\n")


def _nagle_is_off(transport: asyncio.BaseTransport) -> bool:
    return transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_the_server_writes_each_chunk_at_once_on_a_keep_alive_connection():
    """Nagle's algorithm is off (TCP_NODELAY) on the server's connections: on, a streamed chunk written while the one
    before it was unacknowledged waited for the client's delayed ACK, so on a keep-alive connection a stream's first
    chunks came about 40 ms late, in one burst."""
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"pong": True}

    with BackgroundServer(app) as live, socket.create_connection((live.host, live.port), timeout=WAIT_S) as client:
        client.sendall(b"GET /ping HTTP/1.1\r\nHost: test\r\n\r\n")
        assert client.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")  # accepted, and kept alive
        connections = list(live._server.server_state.connections)
        assert len(connections) == 1 and _nagle_is_off(connections[0].transport)


def test_the_listener_glimmer_serve_binds_gives_connections_with_nagle_off():
    """`glimmer serve` listens on a socket of its own (bound before the model loads): asyncio, which uvicorn serves
    it with, turns Nagle's algorithm off only on connections whose socket names the TCP protocol."""
    from glimmer.cli import _bind

    async def accept_one() -> bool:
        loop = asyncio.get_running_loop()
        accepted: asyncio.Future[asyncio.BaseTransport] = loop.create_future()

        class Accept(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.set_result(transport)

        listener = _bind("127.0.0.1", 0)
        async with await loop.create_server(Accept, sock=listener):
            _, writer = await asyncio.open_connection(*listener.getsockname())
            transport = await asyncio.wait_for(accepted, WAIT_S)
            nagle_off = _nagle_is_off(transport)
            transport.close()
            writer.close()
        return nagle_off

    assert asyncio.run(accept_one())


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf")])
def test_a_read_timeout_that_is_no_time_is_refused_naming_the_field(seconds):
    with pytest.raises(ConfigError, match="request_read_timeout_s=.* is not a time"):
        read_timeout_protocol(seconds)


def test_a_uvicorn_keeping_its_request_state_under_other_names_serves_untimed(make_tiny, monkeypatch, caplog):
    """The timeout reads uvicorn's protocol state (its request cycle's `more_body` and the like); a uvicorn that
    renamed one must not fail every connection: it serves as plain uvicorn does, logged once."""
    import glimmer.server.connection as connection

    monkeypatch.setattr(connection, "_unknown_uvicorn_logged", False)
    # as if this uvicorn's request cycle had renamed more_body
    monkeypatch.setattr(connection.ReadTimeout, "_now_waiting_for",
                        lambda self: None if self.cycle is None else self.cycle.body_expected)
    with caplog.at_level("WARNING", logger="glimmer.server.connection"), \
            live_server(make_tiny(), scripted=True, request_read_timeout_s=READ_TIMEOUT_S) as live:
        _still_serves(live)
        _still_serves(live)
        stalled = _connect(live)
        stalled.sendall(HEAD)
        stalled.settimeout(3 * READ_TIMEOUT_S)
        with pytest.raises(socket.timeout):  # untimed: the server waits on, as plain uvicorn does
            stalled.recv(1)
        stalled.close()
        _still_serves(live)
    warnings = [r for r in caplog.records if "without --request-read-timeout" in r.getMessage()]
    assert len(warnings) == 1 and "body_expected" in warnings[0].getMessage()


class _Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("state", ["no-cycle-attribute", "cycle-fields-renamed"])
def test_a_uvicorn_keeping_its_request_state_under_other_names_still_answers_unreadable_bytes_and_closes(
        state, monkeypatch):
    """The 400 for bytes uvicorn cannot parse read `self.cycle` and its fields directly: under other names it raised
    AttributeError before closing the connection, which stayed open with no answer."""
    import glimmer.server.connection as connection

    monkeypatch.setattr(connection, "_unknown_uvicorn_logged", False)
    protocol = object.__new__(read_timeout_protocol(READ_TIMEOUT_S))
    protocol.transport, protocol._timing, protocol._read_timer = _Transport(), True, None
    if state == "cycle-fields-renamed":
        protocol.cycle = object()
    protocol.send_400_response("Invalid HTTP request received.")
    assert protocol.transport.closed
    assert protocol.transport.written.startswith(b"HTTP/1.1 400 Bad Request\r\n")


resource = pytest.importorskip("resource")  # (not on Windows, which has no such limit)
LOW_FILE_LIMIT = 256
IDLE_CONNECTIONS = 400  # more than LOW_FILE_LIMIT


@contextlib.contextmanager
def _serve_with_file_limit(checkpoint: Path, *, hard: int) -> Iterator[tuple[int, ServeProcess]]:
    """`glimmer serve` started with a soft limit of LOW_FILE_LIMIT open files (and `hard` as its hard limit): yields
    its port and its ServeProcess, whose output is complete once this is left."""
    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_FILE_LIMIT, hard))

    server = ServeProcess(["-m", "glimmer.cli", "serve", str(checkpoint), "--kv-cache-memory", "32MiB",
                           "--disable-uvicorn-access-log"], preexec_fn=limit_files)
    try:
        yield urlsplit(server.wait_until_serving()).port, server
    finally:
        server.stop(signal.SIGTERM)


def _health_status(port: int) -> int | None:
    """/health's status, or None when the server did not answer within a few seconds."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
    except httpx.TransportError:
        return None


def _idle_connections(port: int) -> contextlib.ExitStack:
    connections = contextlib.ExitStack()
    for _ in range(IDLE_CONNECTIONS):
        connections.enter_context(socket.create_connection(("127.0.0.1", port), timeout=WAIT_S))
    time.sleep(1)  # the server accepts them (those it can)
    return connections


def test_serve_raises_its_soft_open_file_limit_so_idle_connections_do_not_lock_others_out(tiny_checkpoint):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < 4 * IDLE_CONNECTIONS:
        pytest.skip(f"the hard limit on open files ({hard}) leaves no room to raise the soft limit")
    with _serve_with_file_limit(tiny_checkpoint, hard=hard) as (port, server), _idle_connections(port):
        assert _health_status(port) == 200
    assert f"raised the open-file limit (RLIMIT_NOFILE) from {LOW_FILE_LIMIT} to" in server.output


def test_connections_refused_for_want_of_file_descriptors_are_logged_in_one_line(tiny_checkpoint):
    """asyncio logged each accept() that failed with EMFILE with its traceback, thousands of times a second."""
    with _serve_with_file_limit(tiny_checkpoint, hard=LOW_FILE_LIMIT) as (port, server):
        with _idle_connections(port):
            assert _health_status(port) is None  # no descriptor left to accept it with
        assert _health_status(port) == 200  # served again once connections close
    text = server.output
    assert text.count("Too many open files") == 1
    assert "cannot accept connections: [Errno 24] Too many open files" in text
