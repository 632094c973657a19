"""vLLM's SageMaker entry point: SageMaker sends every inference request to `POST /invocations`, which runs it as a
chat completion when the body has `messages` and as a completion when it has `prompt`, as vLLM does."""

from __future__ import annotations

import json

from fastapi import Request
from fastapi.responses import Response
from starlette.types import Message

from glimmer.protocol.duplicate_keys import refuse_duplicate_keys
from glimmer.server.body import read_body
from glimmer.server.chat import create_chat_completion
from glimmer.server.completions import create_completion
from glimmer.server.context import ServingContext
from glimmer.server.errors import APIError

_ROUTE_FIELDS = ("messages", "prompt")
"""The fields that choose the route: a chat completion for a body with `messages`, a completion for one with
`prompt`."""


async def invoke(request: Request, context: ServingContext) -> Response:
    """The chat completion or completion the body asks for. Raises APIError (400) for a body not JSON or with neither
    `messages` nor `prompt`, and what `read_body` raises."""
    body = await read_body(request, context)
    kind = "an /invocations body is a JSON object: a chat completion request (with `messages`) or a completion " \
           "request (with `prompt`)"
    try:
        fields = json.loads(body)
    except ValueError as error:
        raise APIError(400, f"the request body is not valid JSON ({error}); {kind}") from None
    except RecursionError:  # nested past Python's parser (the /v1 routes refuse it at 200 levels)
        raise APIError(400, "the request body: objects and arrays nest too deeply for the server's JSON parser; "
                            f"flatten them; {kind}") from None
    if not isinstance(fields, dict):
        raise APIError(400, kind)
    # null is an unset field, as on every route (schemas.drop_nulls): a client typing the body as the union of both
    # requests sends the other one's field as null, which the route taken would refuse as a field it does not know
    unset = [name for name in _ROUTE_FIELDS if name in fields and fields[name] is None]
    if unset:
        refuse_duplicate_keys(body)  # read again below from Python's parse, which keeps a key's last value
        fields = {name: value for name, value in fields.items() if name not in unset}
        body = json.dumps(fields).encode()
    if "messages" in fields:
        return await create_chat_completion(_with_body(request, body), context)
    if "prompt" in fields:
        return await create_completion(_with_body(request, body), context)
    raise APIError(400, kind)


def _with_body(request: Request, body: bytes) -> Request:
    """`request` whose body, already read, is read again; then it receives as the original (a disconnect)."""
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return Request(request.scope, receive)
