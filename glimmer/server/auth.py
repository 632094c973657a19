"""The API key check: `Authorization: Bearer KEY` on every /v1 route when the server has a key."""

from __future__ import annotations

import hmac

from fastapi import Request

from glimmer.server.errors import APIError


def check_api_key(request: Request, api_key: str | None) -> None:
    """Raises APIError 401 unless the request carries the server's key (or the server has none)."""
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise APIError(401, "missing API key; send it as `Authorization: Bearer KEY`", code="invalid_api_key")
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(401, "incorrect API key", code="invalid_api_key")
