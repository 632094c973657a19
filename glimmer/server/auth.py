"""The API key check: `Authorization: Bearer KEY` on every /v1 route when the server has a key."""

from __future__ import annotations

import functools
import hmac

from fastapi import Request

from glimmer.server.errors import APIError
from glimmer.server.settings import api_keys

# the whitespace HTTP allows around a header's value and between its scheme and token (RFC 9110 §5.6.3), no more:
# str.strip() also takes U+0085 and U+00A0, which as Latin-1 are bytes ending a key's last character sent as UTF-8
# (à is C3 A0)
_OWS = " \t"


def check_api_key(request: Request, api_key: str | tuple[str, ...] | None) -> None:
    """Raises APIError 401 unless the request carries the server's key, or one of its keys (or the server has none),
    in one Authorization header."""
    keys = _key_bytes(api_keys(api_key))
    if not keys:
        return
    sent = request.headers.getlist("authorization")
    if len(sent) > 1:  # a field sent once (RFC 9110 §11.6.2): which line counts is a guess a proxy may guess otherwise
        raise APIError(401, f"the request has {len(sent)} Authorization headers; send exactly one, "
                            "`Authorization: Bearer KEY`", code="invalid_api_key")
    if not sent or not sent[0].strip(_OWS):
        raise APIError(401, "missing API key; send it as `Authorization: Bearer KEY`", code="invalid_api_key")
    scheme, _, token = sent[0].strip(_OWS).partition(" ")
    token = token.strip(_OWS)
    if scheme.lower() != "bearer" or not token:
        # the header's value is never echoed: it may be the key itself, sent without its scheme
        raise APIError(401, "the Authorization header is not `Bearer KEY` (the key alone, another scheme or "
                            "`Bearer` without a key); send the key as `Authorization: Bearer KEY`",
                       code="invalid_api_key")
    # a header arrives as Latin-1: a key outside ASCII sent as UTF-8 (curl) is its bytes as they came, one sent as
    # Latin-1 (a browser's fetch, `requests`) the text they spell
    sent_forms = (token.encode("latin-1"), token.encode())
    # every key is compared in both forms, so the time taken tells nothing of which one came close
    matches = [hmac.compare_digest(sent, key) for key in keys for sent in sent_forms]
    if not any(matches):
        raise APIError(401, "incorrect API key", code="invalid_api_key")


@functools.lru_cache(maxsize=8)
def _key_bytes(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    """The server's keys as a request's token is compared with them, made once rather than on every request: stripped,
    as a key read from a secret file or variable may end in a newline, which no header can carry (and the token is
    stripped: compared as it was, no client could ever be let in), and in UTF-8."""
    return tuple(key.strip().encode() for key in keys)
