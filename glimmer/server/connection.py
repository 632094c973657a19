"""The server's HTTP connections: uvicorn's protocol, with a time limit on waiting for a client's request bytes.

uvicorn closes a keep-alive connection left idle after a response (5 s), but waits without end for a request that
has not arrived: a connection that sends nothing, part of a request line or headers (slowloris), or a body that
stalls held its socket, and for a body its request's handler, until the client left. Enough of them take every file
descriptor the process may open, and the server accepts no one else.

The limit applies only while the server waits for the client's bytes, never while it answers: a request's head
(line and headers) must be whole within `read_timeout_s` of the connection opening or the previous response ending
(as nginx's client_header_timeout), and its body must come within `read_timeout_s` of the head, each 64 KiB of it
earning `read_timeout_s` more. A body that stalls is cut as nginx's client_body_timeout cuts it, and so is one
trickled a byte at a time (a slow POST), which a pause between two reads never reaches; an upload of 4 MiB may take
64 times the timeout. A generation or a stream of any length is not limited, nor is a body the server itself has
stopped reading (uvicorn's flow control, until the handler takes what came). What is left of a refused body (a 413)
counts as waiting for the next request, so a client cannot keep the server reading and discarding it forever.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import time
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.protocols.http.h11_impl import H11Protocol

from glimmer.errors import ConfigError
from glimmer.server.errors import error_body
from glimmer.server.settings import DEFAULT_REQUEST_READ_TIMEOUT_S

logger = logging.getLogger(__name__)

BODY_BYTES_PER_TIMEOUT = 64 << 10
"""Each this many bytes of a body earn its client another read timeout."""

REQUEST_TIMED_OUT = "glimmer.request_timed_out"
"""Set (True) in the scope of a request whose body did not come in time, once its `408` is written: its handler sees
only a disconnect, and the server's request counter must not take the 408 for a client that left (499)."""

_HEAD = "head"  # waiting for a request's line and headers (or for the rest of a refused body)
_BODY = "body"  # waiting for the body of a request whose handler runs


def _closing_error_response(status: str, message: str, code: str) -> bytes:
    """A whole response (`status` its status line's code and reason) with an OpenAI-style error body, written by the
    connection itself before it closes, where no handler answers."""
    body = json.dumps(error_body(message, "invalid_request_error", code=code)).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode() + body


def _request_timeout_response(read_timeout_s: float) -> bytes:
    """The whole `408 Request Timeout` written before the connection closes (RFC 9110 §15.5.9)."""
    return _closing_error_response(
        "408 Request Timeout",
        f"the request did not arrive in time: the server waits {read_timeout_s:g} s for a request's line and "
        f"headers, and for its body {read_timeout_s:g} s more per 64 KiB; send the whole request without pausing",
        "request_timeout")


INVALID_HTTP_RESPONSE = _closing_error_response(
    "400 Bad Request",
    "the request is not valid HTTP/1.1 (a malformed request line or header, a Content-Length that is no number or "
    "is given twice, a body's chunked framing broken, or a request head over the server's size limit); the "
    "connection is closed",
    "invalid_http_request")
"""The answer to bytes uvicorn's parser cannot read as a request, where uvicorn writes a plain-text one."""


class ReadTimeout:
    """Mixed into uvicorn's HTTP protocol (its h11 or httptools one, which keep a request's state alike, in `cycle`):
    closes a connection whose client keeps the server waiting for request bytes longer than `read_timeout_s` (module
    docstring), answering `408 Request Timeout` where part of a request came. It also answers bytes uvicorn cannot
    parse as a request with an OpenAI-style 400 in place of uvicorn's plain-text one (`send_400_response`), so
    every connection the server serves, timed or not, gets that answer."""

    read_timeout_s = DEFAULT_REQUEST_READ_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._waiting_for: str | None = None
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_deadline = 0.0  # the event loop's time
        self._request_begun = False
        self._body_bytes = 0
        self._timing = True
        self._held = False  # the server held the request up when the timer last fired
        super().connection_made(transport)
        self._watch_reading(received=0)

    def data_received(self, data: bytes) -> None:
        self._timed(self._note_request_bytes)
        super().data_received(data)
        self._watch_reading(received=len(data))

    def on_response_complete(self) -> None:
        super().on_response_complete()  # which starts a pipelined request already received
        self._watch_reading(received=0)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes its parser cannot read as a request (`msg`, "Invalid HTTP request received.",
        uvicorn has logged), as INVALID_HTTP_RESPONSE, an OpenAI-style body where uvicorn's is plain text; then the
        connection closes, as uvicorn closes it. Where an answer is under way no other can follow: it is only closed.
        A uvicorn keeping its request state under other names answers as plain uvicorn does (_serve_untimed)."""
        try:
            cycle = getattr(self, "cycle", None)
            try:
                answering = cycle is None or cycle.response_complete or not cycle.response_started
            except AttributeError as error:
                _serve_untimed(self, error)
                answering = True
            if answering:
                self.transport.write(INVALID_HTTP_RESPONSE)
        finally:
            self.transport.close()

    def _timed(self, step: Any, *args: Any) -> None:
        """step(*args), a part of the timeout's bookkeeping, unless this connection is served untimed; it becomes so
        where the step finds uvicorn's request state under other names (_serve_untimed)."""
        if self._timing:
            try:
                step(*args)
            except AttributeError as error:
                _serve_untimed(self, error)

    def _note_request_bytes(self) -> None:
        """Bytes came while waiting for a head: a request has begun (unless they are a refused body's rest)."""
        if self._waiting_for == _HEAD and not self._draining_refused_body():
            self._request_begun = True

    def _draining_refused_body(self) -> bool:
        """Whether the bytes coming are the rest of a body the handler answered without reading it all."""
        return self.cycle is not None and self.cycle.response_complete and self.cycle.more_body

    def _now_waiting_for(self) -> str | None:
        if self.cycle is None or self.cycle.response_complete:
            return _HEAD
        return _BODY if self.cycle.more_body else None  # None: the handler has the whole request and answers

    def _watch_reading(self, *, received: int) -> None:
        self._timed(self._follow_reading, received)

    def _follow_reading(self, received: int) -> None:
        waiting_for = self._now_waiting_for()
        if waiting_for != self._waiting_for:
            self._stop_timer()
            self._waiting_for, self._request_begun, self._body_bytes, self._held = waiting_for, False, 0, False
            if waiting_for is not None:
                self._start_timer(self.loop.time() + self.read_timeout_s)
        elif waiting_for == _BODY and received:
            blocks_before = self._body_bytes // BODY_BYTES_PER_TIMEOUT
            self._body_bytes += received
            earned = self._body_bytes // BODY_BYTES_PER_TIMEOUT - blocks_before
            if earned:
                self._stop_timer()
                self._start_timer(self._read_deadline + earned * self.read_timeout_s)

    def _server_holds_request(self) -> bool:
        """Whether the server, not the client, holds the request up: it stopped reading (uvicorn's flow control,
        until the handler takes what came), or, for a body, its handler has not yet asked a client that expects
        `100 Continue` to send it, or has begun answering (a 408 written then would land inside the answer)."""
        if self.flow.read_paused:
            return True
        return self._waiting_for == _BODY and (self.cycle.waiting_for_100_continue or self.cycle.response_started)

    def _start_timer(self, deadline: float) -> None:
        self._read_deadline = deadline
        self._read_timer = self.loop.call_at(deadline, self._read_timed_out)

    def _stop_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        self._timed(self._close_timed_out)

    def _close_timed_out(self) -> None:
        if self.transport.is_closing() or self.transport.get_protocol() is not self:  # closed, or a WebSocket now
            return
        held = self._server_holds_request()
        if held or self._held:  # the server's wait, or one that ended since the last look: the client's time is whole
            self._held = held
            self._start_timer(self.loop.time() + self.read_timeout_s)
            return
        if self._waiting_for == _BODY or self._request_begun:
            self.transport.write(_request_timeout_response(self.read_timeout_s))
        if self._waiting_for == _BODY:  # the handler waiting for the body learns that it will not come
            self.cycle.scope[REQUEST_TIMED_OUT] = True
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()


_unknown_uvicorn_logged = False


def _serve_untimed(protocol: Any, error: AttributeError) -> None:
    """Serve `protocol`'s connection without the timeout: its uvicorn keeps the request state under other names
    than uvicorn 0.29–0.55 do (logged once), which must not fail every connection."""
    global _unknown_uvicorn_logged
    protocol._timing = False
    protocol._stop_timer()
    if not _unknown_uvicorn_logged:
        _unknown_uvicorn_logged = True
        logger.warning("this uvicorn's HTTP protocol keeps its request state differently (%s): connections are served "
                       "without --request-read-timeout, and a stalled client holds its connection until it leaves",
                       error)


def read_timeout_protocol(read_timeout_s: float, *, h11: bool = False) -> type[asyncio.Protocol]:
    """uvicorn's `http` protocol class for connections that time out after `read_timeout_s` seconds of waiting
    for request bytes (uvicorn.Config(http=...)), built on the protocol uvicorn picks (httptools where it is
    installed, else h11), or on h11's with `h11` (whose limits uvicorn.Config's h11_* options set: httptools has
    none of them). Raises ConfigError unless it is a number of seconds above 0."""
    if not 0 < read_timeout_s < math.inf:
        raise ConfigError(f"request_read_timeout_s={read_timeout_s!r} is not a time; give a number of seconds above 0")
    base = H11Protocol if h11 else AutoHTTPProtocol
    return type("ReadTimeoutProtocol", (ReadTimeout, base), {"read_timeout_s": read_timeout_s})


def tcp_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (an IPv6 address for a host with a colon) for the server to listen on; raises
    OSError where the address is taken or invalid.

    Its protocol is named (IPPROTO_TCP, not 0): asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections
    whose socket names it, and an accepted socket takes its listener's. Left 0, a small write that followed another
    not yet acknowledged waited for the client's delayed ACK: on a keep-alive connection a stream's first chunks came
    about 40 ms late, in one burst (Linux)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                             socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError:
        listener.close()
        raise
    return listener


def server_url(scheme: str, host: str, port: int) -> str:
    """`scheme://host:port`, an IPv6 address in brackets."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def raise_open_file_limit() -> None:
    """Raise the process's soft limit on open files to its hard limit (as vLLM does at startup), logging it once:
    each client connection takes a file descriptor, and at the common soft limit of 1024 as many idle connections
    left the server unable to accept another (accept() fails with EMFILE until one closes)."""
    try:
        import resource
    except ImportError:  # (Windows has no such limit)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as error:  # macOS refuses more than its kern.maxfilesperproc
        logger.warning("could not raise the open-file limit (RLIMIT_NOFILE) from %d to %d (%s): the server accepts "
                       "no more than about %d connections at once; raise it with `ulimit -n` before starting it",
                       soft, wanted, error, soft)
    else:
        logger.info("raised the open-file limit (RLIMIT_NOFILE) from %d to %d: one file descriptor per connection",
                    soft, wanted)


ACCEPT_FAILURE_LOG_INTERVAL_S = 60.0
_ACCEPT_FAILURE = "socket.accept() out of system resource"  # asyncio's message (selector_events.py)


def log_accept_failures_briefly(loop: asyncio.AbstractEventLoop) -> None:
    """Make `loop` log a connection it could not accept for want of file descriptors in one line, at most once a
    minute. asyncio logs each failure with its traceback, and tries again up to the listen backlog's 2,048 times in
    one go (python/cpython#151615): 12,000 lines (5 MB) a second while the limit was reached."""
    last_logged = -math.inf
    suppressed = 0

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        nonlocal last_logged, suppressed
        if context.get("message") != _ACCEPT_FAILURE:
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - last_logged < ACCEPT_FAILURE_LOG_INTERVAL_S:
            suppressed += 1
            return
        also = f" ({suppressed} more failures since the last report)" if suppressed else ""
        logger.error("cannot accept connections: %s%s; every open connection holds a file descriptor; new clients "
                     "wait until some close (raise the limit with `ulimit -n`)", context.get("exception"), also)
        last_logged, suppressed = now, 0

    loop.set_exception_handler(handle)
