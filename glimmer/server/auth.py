"""The API key check: `Authorization: Bearer KEY` on every /v1 route when the server has a key."""

from __future__ import annotations

import hmac

from fastapi import Request

from glimmer.server.errors import APIError


def check_api_key(request: Request, api_key: str | None) -> None:
    """Raises APIError 401 unless the request carries the server's key (or the server has none), in one
    Authorization header."""
    if api_key is None:
        return
    sent = request.headers.getlist("authorization")
    if len(sent) > 1:  # a field sent once (RFC 9110 §11.6.2): which line counts is a guess a proxy may guess otherwise
        raise APIError(401, f"the request has {len(sent)} Authorization headers; send exactly one, "
                            "`Authorization: Bearer KEY`", code="invalid_api_key")
    scheme, _, token = (sent[0] if sent else "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError(401, "missing API key; send it as `Authorization: Bearer KEY`", code="invalid_api_key")
    # a key read from a secret file or variable may end in a newline, which no header can carry (and the token is
    # stripped): compared as it was, no client could ever be let in
    if not hmac.compare_digest(token.strip().encode(), api_key.strip().encode()):
        raise APIError(401, "incorrect API key", code="invalid_api_key")
