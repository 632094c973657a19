"""vLLM's SageMaker entry point: SageMaker sends every inference request to `POST /invocations`, which runs it as a
chat completion when the body has `messages` and as a completion when it has `prompt`, as vLLM does."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from glimmer.server.body import read_body
from glimmer.server.chat import answer_chat_completion
from glimmer.server.completions import answer_completion
from glimmer.server.context import ServingContext
from glimmer.server.errors import APIError
from glimmer.server.schemas import ChatCompletionRequest, CompletionRequest, RequestBody, declared_fields, parse_body


async def invoke(request: Request, context: ServingContext) -> Response:
    """The chat completion or completion the body asks for. Raises APIError (400) for a body not JSON or with neither
    `messages` nor `prompt`, what `read_body` raises and what the route taken raises."""
    arrival = time.monotonic()
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
    # null is an unset field, as on every route (schemas.drop_nulls), and a client typing the body as the union of
    # both requests sends each field of the other one as null, which the route taken would refuse as a field it does
    # not know: such a null is no field sent (one of a field the route knows keeps its meaning; one neither request
    # knows, a typo, is refused as the /v1 routes refuse it). The body read is
    # validated as it came, not written again without them: its size is checked, and JSON written again differs (é
    # escaped in 6 bytes, 1e300 in 300)
    if fields.get("messages") is not None:
        return await answer_chat_completion(request, context, parse_body(
            ChatCompletionRequest, body, _other_requests_nulls(fields, ChatCompletionRequest, CompletionRequest)),
            arrival)
    if fields.get("prompt") is not None:
        return await answer_completion(request, context, parse_body(
            CompletionRequest, body, _other_requests_nulls(fields, CompletionRequest, ChatCompletionRequest)),
            arrival)
    raise APIError(400, kind)


def _other_requests_nulls(fields: dict[str, Any], taken: type[RequestBody], other: type[RequestBody]) -> list[str]:
    """The top-level fields of the body sent as null that `other` declares and `taken` does not."""
    of_other_alone = declared_fields(other) - declared_fields(taken)
    return [name for name, value in fields.items() if value is None and name in of_other_alone]
