"""Reading a JSON request body: its media type first (415 unless uncompressed JSON), then its bytes with a size
limit (413 beyond it) and as UTF-8 (400 for UTF-16, UTF-32 or any other bytes that are not UTF-8; a UTF-8 byte
order mark dropped), before any JSON is parsed.

Requiring `Content-Type: application/json` is also a cross-site guard: a browser sends `text/plain` POSTs to
any origin without asking first, so a page could otherwise submit requests to a server on the visitor's
machine or network.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import Request
from starlette.requests import ClientDisconnect

from glimmer.engine.async_engine import EngineShuttingDownError
from glimmer.server.errors import APIError, header_as_sent
from glimmer.server.streaming import SHUTDOWN_CHECK_INTERVAL_S, ClientDisconnected

if TYPE_CHECKING:
    from glimmer.server.context import ServingContext



def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body is larger than the server's limit of {max_bytes} bytes",
                    code="request_too_large")


def check_json_content_type(request: Request) -> None:
    """Raises APIError 415 unless the request declares a JSON body (`application/json`, any parameters) with no
    content coding: a compressed body would be read as its compressed bytes, or a plain one sent with
    `Content-Encoding: gzip` taken as though the header were not there (RFC 9110 §8.4.1 allows the 415).
    Raises APIError 400 for more than one Content-Type header, which no reading of the request can settle."""
    declared_all = request.headers.getlist("content-type")
    if len(declared_all) > 1:  # a field sent once (RFC 9110 §5.3): which line counts is a guess
        shown = ", ".join(repr(header_as_sent(value)[:60]) for value in declared_all[:4])
        raise APIError(400, f"the request has {len(declared_all)} Content-Type headers ({shown}); send exactly one, "
                            "`Content-Type: application/json`")
    declared = declared_all[0] if declared_all else ""
    if declared.split(";", 1)[0].strip().lower() != "application/json":
        shown = repr(header_as_sent(declared)) if declared else "none"
        raise APIError(415, f"the request body must be JSON sent with `Content-Type: application/json` (got "
                            f"{shown})", code="unsupported_media_type")
    # a list field (RFC 9110 §8.4): several header lines are one list, each coding of which applies
    coding = ", ".join(request.headers.getlist("content-encoding"))
    if any(part.strip().lower() not in ("", "identity") for part in coding.split(",")):
        raise APIError(415, f"the request body must be sent uncompressed (got `Content-Encoding: "
                            f"{header_as_sent(coding)[:40]}`); Glimmer does not decode request bodies",
                       code="unsupported_media_type")


async def read_body(request: Request, context: ServingContext) -> bytes:
    """The body of a JSON request, refused as soon as it is known to exceed the server's `max_request_bytes`: by
    its Content-Length, or while it streams in (chunked uploads carry no length).

    Raises APIError (415, 413, 400), ClientDisconnected when the client leaves during the upload, or
    EngineShuttingDownError (503) when the server begins shutting down before the body is in: a stalled or slow
    upload would otherwise be cut when uvicorn's grace period ends, with a plain-text 500 and a logged traceback.
    """
    check_json_content_type(request)
    upload = asyncio.ensure_future(_read_upload(request, context.settings.max_request_bytes))
    try:
        while not upload.done():
            await asyncio.wait({upload}, timeout=SHUTDOWN_CHECK_INTERVAL_S)
            reason = context.engine.closing_reason
            if not upload.done() and reason is not None:
                raise EngineShuttingDownError(reason)
        return _utf8_text(upload.result())
    finally:
        upload.cancel()


_WIDE_TEXT = ((b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe\x00\x00", "UTF-32"), (b"\xfe\xff", "UTF-16"),
              (b"\xff\xfe", "UTF-16"))
"""Byte order marks of text in UTF-16 or UTF-32 (the longer marks first: UTF-32LE's starts with UTF-16LE's)."""
UTF8_BYTE_ORDER_MARK = b"\xef\xbb\xbf"


def wide_text_encoding(data: bytes) -> str | None:
    """"UTF-16", "UTF-32" (or "UTF-16 or UTF-32" without a byte order mark) for JSON text in those encodings, which
    no UTF-8 reader takes (PowerShell writes UTF-16); None for anything else."""
    wide = next((name for mark, name in _WIDE_TEXT if data.startswith(mark)), None)
    if wide is None and b"\x00" in data[:2]:  # no JSON text starts with a NUL byte: UTF-16 or -32 without a mark
        wide = "UTF-16 or UTF-32"
    return wide


def _utf8_text(body: bytes) -> bytes:
    """`body` without a leading UTF-8 byte order mark, which RFC 8259 §8.1 lets a parser ignore (as Python's json and
    run-batch do). Raises APIError 400 for a body in UTF-16 or UTF-32, or any other that is not UTF-8 (Latin-1 or
    Windows-1252, whose é is the one byte 0xe9): JSON between systems is UTF-8 (RFC 8259 §8.1), and the parsers' own
    errors ("expected value at line 1 column 1", "invalid unicode code point") said nothing of why."""
    wide = wide_text_encoding(body)
    if wide is not None:
        raise APIError(400, f"the request body is {wide} text; send JSON encoded as UTF-8")
    text = body.removeprefix(UTF8_BYTE_ORDER_MARK)
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as error:
        # byte N of the body as sent, its mark included, counted from 1, as run-batch names the byte of a line that
        # is not UTF-8 (batch._parse_line)
        raise APIError(400, f"the request body is not UTF-8 text (byte {len(body) - len(text) + error.start + 1} is "
                            f"{text[error.start]:#04x}); send JSON encoded as UTF-8") from None
    return text


async def _read_upload(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise APIError(400, f"Content-Length {declared!r} is not a number")
        if int(declared) > max_bytes:
            raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:  # an ordinary event, not an internal error
        raise ClientDisconnected() from None
    return b"".join(chunks)
