"""Errors as OpenAI-style bodies: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

Every exception a request can raise maps to one status here. Errors Glimmer raises on purpose carry their
own message (it names the field and the fix); anything else is an internal error: logged with its traceback
on the server, answered with a generic 500 that reveals nothing of the code.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi.responses import JSONResponse

from glimmer.engine.async_engine import (
    EngineDeadError,
    EngineOverloadedError,
    EngineShuttingDownError,
    EngineStepError,
)
from glimmer.errors import GlimmerError, RequestError, ServiceBusyError, ToolChoiceUnsatisfiedError
from glimmer.protocol import ChatTemplateError

logger = logging.getLogger(__name__)

INTERNAL_ERROR_MESSAGE = "internal server error; the server log has the details"


class APIError(GlimmerError):
    """An error the HTTP layer itself decides (auth, size limit, unknown model, …)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.type = type
        self.param = param
        self.code = code


def header_as_sent(value: str) -> str:
    """A header's value as the client wrote it, for an error to quote: its bytes come as Latin-1 text, which spells
    UTF-8 (curl's, a proxy's) as other characters (`café` as 'cafÃ©'); bytes that are no UTF-8 stay as Latin-1 reads
    them."""
    data = value.encode("latin-1")
    try:
        return data.decode()
    except UnicodeDecodeError:
        return value


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    if param is not None and len(param) > _QUOTED_LIMIT:
        param = f"{param[:_QUOTED_LIMIT // 2]}… ({len(param):,} characters)"
    return {"error": {"message": shortened(message), "type": type, "param": param, "code": code}}


_QUOTED_LIMIT = 200
# a quoted value, as repr and json.dumps write one: an apostrophe in a word ("call's") neither opens nor closes it
_LONG_QUOTED = re.compile(rf"(?<!\w)(?:'(?:[^'\\]|\\.){{{_QUOTED_LIMIT},}}'"
                          rf"|\"(?:[^\"\\]|\\.){{{_QUOTED_LIMIT},}}\")(?!\w)")
_LONG_WORD = re.compile(rf"[^\s'\"]{{{_QUOTED_LIMIT},}}")
_MESSAGE_LIMIT = 4_000


def shortened(message: str) -> str:
    """`message` with every quoted value, and every run without spaces, longer than 200 characters cut to its start
    and its length, and what is still over 4,000 characters cut in its middle. An error names a request's field and
    quotes its value: a value of a megabyte (a model's name, a role, an unknown field's name) came back whole, and
    in `param` again."""
    if len(message) <= _QUOTED_LIMIT:
        return message
    message = _LONG_QUOTED.sub(lambda m: f"{m[0][:61]}…{m[0][0]} ({len(m[0]) - 2:,} characters)", message)
    message = _LONG_WORD.sub(lambda m: f"{m[0][:60]}… ({len(m[0]):,} characters)", message)
    if len(message) <= _MESSAGE_LIMIT:
        return message
    return f"{message[:_MESSAGE_LIMIT // 2]} … ({len(message):,} characters) … {message[-_MESSAGE_LIMIT // 4:]}"


def describe_error(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(HTTP status, OpenAI error body) for an exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc.status, error_body(str(exc), exc.type, exc.param, exc.code)
    if isinstance(exc, ChatTemplateError):
        return 400, error_body(str(exc), "invalid_request_error", "messages", "chat_template_error")
    if isinstance(exc, ServiceBusyError):
        return 503, error_body(str(exc), "service_unavailable", exc.param, exc.code)
    if isinstance(exc, RequestError):
        return 400, error_body(str(exc), "invalid_request_error", exc.param, exc.code)
    if isinstance(exc, EngineShuttingDownError):
        return 503, error_body(str(exc), "service_unavailable", None, "shutting_down")
    if isinstance(exc, EngineOverloadedError):
        return 429, error_body(f"the server is overloaded: {exc}", "overloaded_error", None, "engine_overloaded")
    if isinstance(exc, ToolChoiceUnsatisfiedError):
        return 500, error_body(str(exc), "tool_choice_unsatisfied", "tool_choice")
    if isinstance(exc, EngineDeadError | EngineStepError):
        logger.error("request failed: %s", exc)
        return 500, error_body(str(exc), "internal_error")
    if isinstance(exc, GlimmerError):
        logger.error("request failed: %s: %s", type(exc).__name__, exc)
        return 500, error_body(f"{type(exc).__name__}: {exc}", "internal_error")
    logger.error("internal error while serving a request", exc_info=exc)
    return 500, error_body(INTERNAL_ERROR_MESSAGE, "internal_error")


# headers HTTP asks of these statuses: how to authenticate (RFC 9110 §15.5.2), when to come back (§10.2.3)
_STATUS_HEADERS = {401: {"WWW-Authenticate": "Bearer"}, 429: {"Retry-After": "1"}, 503: {"Retry-After": "1"}}


def error_response(exc: BaseException) -> JSONResponse:
    """The error's response. A 500 says `x-should-retry: false`, which the openai SDKs honour (they retry a 500 twice
    unless told not to): every 500 of Glimmer's comes of the request itself, which a retry sends to the same code
    again, rerunning its work each time: a forced call the same request would miss again, a step that failed, which
    would likely fail again, its batch-mates' requests with it (three failed steps in a row stop the engine,
    async_engine.MAX_CONSECUTIVE_STEP_FAILURES), a stopped engine no retry finds alive, an internal error (a bug) met
    on its way. What a retry can mend is a 429 (a full queue) or a 503 (shutting down), which stay retried."""
    status, body = describe_error(exc)
    headers = dict(_STATUS_HEADERS.get(status, {}))
    if status == 500:
        headers["x-should-retry"] = "false"
    return JSONResponse(body, status_code=status, headers=headers or None)
