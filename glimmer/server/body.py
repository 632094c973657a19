"""Reading a request body with a size limit, before any JSON is parsed (HTTP 413 beyond it)."""

from __future__ import annotations

from fastapi import Request

from glimmer.server.errors import APIError


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body is larger than the server's limit of {max_bytes} bytes",
                    code="request_too_large")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused as soon as it is known to exceed `max_bytes`: by its Content-Length, or while it
    streams in (chunked uploads carry no length)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise APIError(400, f"Content-Length {declared!r} is not a number")
        if int(declared) > max_bytes:
            raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)
