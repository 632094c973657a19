"""A client's own request id, as vLLM takes it: the `X-Request-Id` header, else the body's `request_id`.

An empty header or `request_id` is none sent: the server makes the id, as for a request without one (vLLM would name
the response `chatcmpl-`, the same for every such request; a proxy that forwards an unset variable sends one empty).

The response's id is built on it (`chatcmpl-<id>`, `cmpl-<id>`), so that a gateway's logs and the client's meet. The
engine's id adds a random suffix: two requests in flight with one client id (a retry, a proxy's constant) must not
share the engine's bookkeeping, as vLLM's frontend makes its ids unique too.
"""

from __future__ import annotations

import re
import uuid

from fastapi import Request

from glimmer.errors import RequestError
from glimmer.server.errors import header_as_sent

HEADER = "X-Request-Id"
MADE_ID = "glimmer_made_request_id"
"""The scope state key under which --enable-request-id-headers keeps the id it made for a request that sent none: a
body's `request_id` replaces it, there and in the response's header."""
CLIENT_HEADER_COUNT = "glimmer_client_header_count"
"""The scope state key under which --enable-request-id-headers keeps how many header fields the client sent, before
it replaced an empty X-Request-Id or added one: the header count limit counts the client's alone."""
MAX_CHARS = 256
# visible ASCII, with inner spaces: it goes into response ids, log lines and (--enable-request-id-headers) a header
_PRINTABLE = re.compile(r"[!-~](?:[ -~]*[!-~])?")


RESPONSES_ROUTES = ("input_tokens", "compact")
"""The routes of their own under /v1/responses/ (POST /v1/responses/input_tokens and /compact), which no stored
response's id can be."""


def client_request_id(raw_request: Request, body_id: str | None) -> str | None:
    """The client's id: the header's, else the body's `request_id`, else None (a header --enable-request-id-headers
    made, or an empty one, counts as none). Raises RequestError for one sent twice, too long, or not visible ASCII."""
    sent = [value for value in raw_request.headers.getlist(HEADER) if value]
    body_id = body_id or None
    if len(sent) > 1:
        raise RequestError(f"the request has {len(sent)} {HEADER} headers; send exactly one", param=HEADER)
    state = raw_request.scope.get("state", {})
    if sent and not (body_id is not None and state.get(MADE_ID) == sent[0]):
        return _checked(sent[0], HEADER, shown=header_as_sent(sent[0]))
    if body_id is None:
        return sent[0] if sent else None
    return _body_id(raw_request, body_id)


def response_id(raw_request: Request, body_id: str | None) -> str:
    """The id of a Responses request's response, as vLLM's: the body's `request_id` as sent, else `resp_` and the id
    --enable-request-id-headers made, else a new one. The `X-Request-Id` header names no response (vLLM's ignores it):
    a response is stored by its id, which a proxy's constant header would give every response. Raises RequestError for
    a `request_id` too long, not visible ASCII, or no URL path segment of its own (`GET /v1/responses/{id}` fetches it
    by one)."""
    if body_id:
        if "/" in _checked(body_id, "request_id") or body_id in (".", ".."):
            raise RequestError(f"request_id: {body_id!r} cannot name a stored response: `GET /v1/responses/{{id}}` "
                               "could not fetch it (a URL reads '/' as a path's separator, '.' and '..' as "
                               "directories); send one without '/'", param="request_id")
        if body_id in RESPONSES_ROUTES:
            raise RequestError(f"request_id: {body_id!r} cannot name a stored response: /v1/responses/{body_id} is a "
                               "route of its own, which `GET` and `DELETE /v1/responses/{id}` would not reach; send "
                               "another id", param="request_id")
        return _body_id(raw_request, body_id)
    return f"resp_{raw_request.scope.get('state', {}).get(MADE_ID) or uuid.uuid4().hex}"


def _body_id(raw_request: Request, body_id: str) -> str:
    """The body's `request_id`, checked; with --enable-request-id-headers it replaces the id made for the response's
    `X-Request-Id`, which then names the id the response is named by."""
    chosen = _checked(body_id, "request_id")
    state = raw_request.scope.get("state", {})
    if MADE_ID in state:
        state[MADE_ID] = chosen
    return chosen


def is_acceptable_id(header_values: list[str]) -> bool:
    """Whether the `X-Request-Id` header's values (Latin-1 text, as the server reads them) are an id the server takes:
    exactly one, passing `_checked` (`client_request_id` refuses any other)."""
    if len(header_values) != 1:
        return False
    try:
        _checked(header_values[0], HEADER)
    except RequestError:
        return False
    return True


def _checked(value: str, name: str, shown: str | None = None) -> str:
    """`value`; RequestError naming `name` and quoting `shown` (the value as the client wrote it, `value` by default)
    for one not visible ASCII, else for one too long (a header's length counted right only then: outside ASCII, its
    characters are its UTF-8 bytes as Latin-1 reads them)."""
    if not _PRINTABLE.fullmatch(value):
        raise RequestError(f"{name}: {value if shown is None else shown!r} is not an id of visible ASCII characters "
                           "(spaces inside only); send one such as a UUID, or leave it out for the server's own",
                           param=name)
    if len(value) > MAX_CHARS:
        raise RequestError(f"{name}: {len(value):,} characters; send at most {MAX_CHARS}", param=name)
    return value


def engine_request_id(response_id: str) -> str:
    """The engine's id of the request answered as `response_id`: unique among those in flight whatever the client's
    id, and starting with the response's id, so that a log line names the request a client knows."""
    return f"{response_id}-{uuid.uuid4().hex[:12]}"
