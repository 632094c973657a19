"""The FastAPI app: routes, the API key, error bodies, request metrics, and the chat page at `/`.

`create_app(engine, settings)` builds an app around an `AsyncEngine` that the caller owns (starts and shuts
down). Everything per-app — template, the metrics registry — lives in a `ServingContext`,
so several apps can run in one process.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import Match, Mount, get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import glimmer
from glimmer.engine.async_engine import AsyncEngine
from glimmer.errors import GlimmerError
from glimmer.server.auth import check_api_key
from glimmer.server.chat import create_chat_completion
from glimmer.server.completions import create_completion
from glimmer.server.connection import REQUEST_TIMED_OUT
from glimmer.server.context import ServingContext
from glimmer.server.errors import APIError, error_body, error_response
from glimmer.server.invocations import invoke
from glimmer.server.metrics import ServerMetrics
from glimmer.server.request_id import CLIENT_HEADER_COUNT, MADE_ID, RESPONSES_ROUTES, is_acceptable_id
from glimmer.server.request_id import HEADER as REQUEST_ID_HEADER
from glimmer.server.responses import (
    cancel_response,
    count_input_tokens,
    create_response,
    delete_response,
    get_response,
    list_input_items,
    refuse_compaction,
)
from glimmer.server.settings import ServerSettings
from glimmer.server.streaming import ClientDisconnected
from glimmer.server.tokenize import detokenize, tokenize

logger = logging.getLogger(__name__)

_ENDPOINTS = ("/", "/v1/chat/completions", "/v1/completions", "/v1/responses",
              *(f"/v1/responses/{route}" for route in RESPONSES_ROUTES), "/v1/models", "/tokenize", "/detokenize",
              "/health", "/ping", "/invocations", "/version", "/metrics")
_STORED_RESPONSE_ROUTES = ("input_items", "cancel")  # /v1/responses/{id}/...
_CLIENT_CLOSED_REQUEST = 499
STATIC_DIR = Path(__file__).parent / "static"
"""The chat page served at `/` (plain HTML, CSS and JavaScript; no build step)."""
# The page runs only its own script and talks only to its own server: a model's output or a tool result that some
# later change let through as HTML still runs nothing, and no other site can frame the page (which holds the API key)
# to click it; images are the data: URLs of the files a user attaches.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'self'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Accept-Ranges": "none",  # _WholeFile
}


def _without_range(scope: Scope) -> Scope:
    """`scope` without its Range header: the page's files are sent whole, as RFC 9110 §14.2 lets a server answer any
    Range. Starlette answered one it could not read (`bytes=abc`, or `items=0-1`, whose unit §14.2 has a server
    ignore) with a plain-text 400, and one past the file's end with an empty 416, where every other error here is an
    OpenAI-style body; files of a few kilobytes need no parts."""
    return {**scope, "headers": [(name, value) for name, value in scope["headers"] if name != b"range"]}


class _SentWhole:
    """Mixed into a Starlette ASGI app that sends files (a response, a static mount): each is sent whole
    (`_without_range`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(_without_range(scope), receive, send)  # type: ignore[misc]


class _WholeFile(_SentWhole, FileResponse):
    """A file of the page, sent whole."""


class _PageFiles(_SentWhole, StaticFiles):
    """The page's static files, with PAGE_HEADERS, each sent whole."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_HEADERS)
        return response


def create_app(engine: AsyncEngine, settings: ServerSettings) -> FastAPI:
    """Raises CheckpointError (no chat template) or ConfigError (a template that breaks the protocol)."""
    context = ServingContext.create(engine, settings)
    # no /docs or /redoc pages; the OpenAPI document describes the guarded API, so it is served behind its key (vLLM
    # leaves it open beside /v1, a gap its security guide documents)
    # no redirect from a path with a trailing slash to its route (Starlette's 307): a POST client that follows none
    # (curl without -L) got no answer, and behind a proxy its Location may be a URL the client cannot reach; such a
    # path is a 404 naming the route (`_unknown_route`), as OpenAI answers an unknown URL
    app = FastAPI(title="Glimmer", version=glimmer.__version__, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)
    app.state.context = context
    app.include_router(_v1_router(context))
    app.include_router(_tokenizer_router(context))
    app.include_router(_sagemaker_router(context))

    page = (STATIC_DIR / "index.html").read_text()  # read once, for the page with a root path's <base>

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def chat_page(request: Request) -> Response:
        root_path = _root_path(request.scope)
        if not root_path:
            return _WholeFile(STATIC_DIR / "index.html", headers=PAGE_HEADERS)
        # the page's URLs are relative to the page; behind a proxy that strips --root-path, `/glimmer` (no slash)
        # reaches this route as `/glimmer/` does, and a browser would resolve them against `/`, outside the prefix
        base = f'<head>\n  <base href="{html.escape(root_path)}/">'
        return HTMLResponse(page.replace("<head>", base, 1), headers=PAGE_HEADERS)

    app.mount("/static", _PageFiles(directory=STATIC_DIR), name="static")

    async def health() -> Response:
        if not engine.is_alive:
            return JSONResponse(error_body("the engine has stopped", "internal_error"), status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        if settings.metrics_require_api_key:
            check_api_key(request, settings.api_key)
        return Response(context.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def version() -> Response:
        return JSONResponse({"version": glimmer.__version__})

    _get_and_head(app, "/health", health)
    # vLLM's SageMaker probe: /health by another name, and SageMaker may POST it
    _get_and_head(app, "/ping", health)
    app.add_api_route("/ping", health, methods=["POST"], include_in_schema=False)
    _get_and_head(app, "/version", version)  # open, as /health is and as vLLM serves it
    _get_and_head(app, "/metrics", metrics)

    @app.api_route("/openapi.json", methods=["GET", "HEAD"], include_in_schema=False)
    async def openapi(request: Request) -> Response:
        check_api_key(request, settings.api_key)
        document = app.openapi()
        # behind --root-path the paths are reached under it, which the document says in `servers`, as FastAPI's own
        # /openapi.json (and so vLLM's) says it: a client generated from it called the paths without the prefix
        if root_path := _root_path(request.scope):
            document = {**document, "servers": [{"url": root_path}, *document.get("servers", [])]}
        return JSONResponse(document)

    @app.exception_handler(GlimmerError)
    async def glimmer_error(request: Request, exc: GlimmerError) -> Response:
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else None
        message, headers = str(exc.detail), exc.headers
        if exc.status_code == 404 and exc.detail == "Not Found":
            message = _unknown_route(request)
        elif exc.status_code == 405 and (allowed := ", ".join(_allowed_methods(app, request.scope))):
            message = f"Method not allowed ({_request_line(request)}); this route takes {allowed}"
            if get_route_path(_app_scope(request.scope)) == "/v1/chat/completions":  # the SDK's chat.completions.list
                message += f"; {_NO_STORED_CHAT_COMPLETIONS}"
            headers = {**(headers or {}), "Allow": allowed}
        return JSONResponse(error_body(message, "invalid_request_error", None, code),
                            status_code=exc.status_code, headers=headers)

    @app.exception_handler(ClientDisconnected)
    async def client_gone(request: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=_CLIENT_CLOSED_REQUEST)

    # the last added is the outermost: the generic 500 and the 431 for too many headers are made inside
    # CORSMiddleware, so they carry the CORS headers every other response does (Starlette's own ServerErrorMiddleware
    # sits outside all of them, and a browser page cannot read a response without them); the request id goes on
    # outside CORSMiddleware, which answers a preflight itself
    app.add_middleware(_InternalErrors)
    app.add_middleware(_RefuseWebSockets)
    if settings.max_header_count is not None:
        app.add_middleware(_HeaderCountLimit, max_header_count=settings.max_header_count)
    if settings.allowed_origins:  # off by default: browsers then refuse other sites' pages the responses
        # any request header, as vLLM allows: the OpenAI JS SDK sends X-Stainless-* (and OpenAI-Organization, ...) on
        # every request, and no header can stand in for the API key, which is what guards the routes; DELETE for
        # `DELETE /v1/responses/{id}` (the SDK's responses.delete); X-Request-Id, x-should-retry and Retry-After
        # exposed to the page's script, which a browser otherwise hides them from (the OpenAI SDKs read the first as
        # a response's `_request_id`, and obey the others when they decide whether and when to retry: errors.py)
        app.add_middleware(_Cors, allow_origins=list(settings.allowed_origins),
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["*"],
                           expose_headers=[REQUEST_ID_HEADER, "x-should-retry", "Retry-After"])
    if settings.request_id_headers:
        app.add_middleware(_RequestIdHeaders)
    app.add_middleware(_RequestAccounting, metrics=context.metrics)
    return app


def _unknown_route(request: Request) -> str:
    """A 404's message for a path no route serves: the URL, as OpenAI's says it, and where this server serves it when
    the client's base URL lacks its /v1 (`http://HOST:PORT` for `http://HOST:PORT/v1`, a common slip) or has it twice
    (`/v1/v1/chat/completions`), or when a route served beside /v1 (vLLM's /tokenize, /health, ...) was asked for
    under it (the base URL joined to it). The URLs it gives are under --root-path, where the client reaches the
    server."""
    scope = _app_scope(request.scope)
    root, path = _root_path(scope), get_route_path(scope)
    message = f"Invalid URL ({_request_line(request)})"
    at_root = path.removeprefix("/v1")
    # a route with a parameter too (/v1/models/{model}, /v1/responses/{id}/input_items); not a path with a trailing
    # slash, which a route's parameter may take ("/v1/models/") but no route serves
    trailing_slash = path != "/" and path.endswith("/")
    if not trailing_slash and _serves(request.app, scope, f"/v1{path}"):
        message += f"; this server serves {root}/v1{path}: give the client a base URL ending in /v1 " \
                   f"(http://HOST:PORT{root}/v1)"
    elif path.startswith("/v1/v1/") and not trailing_slash and _serves(request.app, scope, at_root):
        # a base URL with /v1 to a client that adds its own
        message += f"; this server serves {root}{at_root}: give the client a base URL ending in one /v1 " \
                   f"(http://HOST:PORT{root}/v1)"
    elif path.startswith("/v1/") and at_root != "/" and at_root in _ENDPOINTS:
        message += f"; this server serves {root}{at_root} at the root, beside /v1, as vLLM does " \
                   f"(http://HOST:PORT{root}{at_root})"
    elif trailing_slash and _serves(request.app, scope, path.rstrip("/")):
        message += f"; this server serves {root}{path.rstrip('/')}: drop the trailing slash"
    elif path.startswith("/v1/chat/completions/"):  # the SDK's chat.completions.retrieve, update, delete, messages
        message += f"; {_NO_STORED_CHAT_COMPLETIONS}"
    return message


# OpenAI keeps a chat completion made with `store: true` for its stored-completion routes; Glimmer takes the field
# and keeps none, so those routes are not misconfigured clients but a feature it does not have
_NO_STORED_CHAT_COMPLETIONS = ("Glimmer keeps no chat completions (`store` is accepted and changes nothing): send "
                               "the messages again to continue a conversation, or use /v1/responses, which stores "
                               "responses")


def _app_scope(scope: Scope) -> Scope:
    """`scope` as the app took it in. The 404 of a page file not there comes from inside the page files' mount, whose
    scope has the mount's root path (`/static`, the path its own after it), and the mount as its endpoint, which
    `_allowed_methods` takes for a page file at any path (a page file that is there is served with a trailing slash
    too); the app's root path is its `app_root_path`, as Starlette's `Request.base_url` takes it."""
    app_scope = {key: value for key, value in scope.items() if key != "endpoint"}
    app_scope["root_path"] = scope.get("app_root_path", scope.get("root_path", ""))
    return app_scope


def _serves(app: FastAPI, app_scope: Scope, route_path: str) -> bool:
    """Whether a route takes `route_path` (a path under --root-path) by some method; `app_scope` is `_app_scope`'s."""
    return bool(_allowed_methods(app, {**app_scope, "path": app_scope["root_path"] + route_path}))  # the raw path


def _root_path(scope: Scope) -> str:
    """The --root-path a proxy serves the API under, without a trailing slash ("" for none)."""
    return scope.get("root_path", "").rstrip("/")


def _request_line(request: Request) -> str:
    """`METHOD /path` of a request as the client sent it, under --root-path, for an error's message."""
    return f"{request.method} {_root_path(request.scope)}{get_route_path(request.scope)}"


_HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """The methods the routes of a request's path take, for a 405's `Allow` header (RFC 9110 §15.5.6: all of them):
    Starlette's names only the first route's, and GET and HEAD, or /ping's POST, are routes of their own here. The
    mounted page files take GET and HEAD, stated here: the `Allow` of Starlette's StaticFiles 405 is not set in every
    Starlette version. /v1/responses/compact and /input_tokens take POST alone: the `{response_id}` routes that match
    them too refuse them (`_not_a_stored_response`)."""
    if get_route_path(scope).removeprefix("/v1/responses/") in RESPONSES_ROUTES:
        return ["POST"]
    if isinstance(scope.get("endpoint"), _PageFiles):  # the mount's scope: its path is the file's, under /static
        return ["GET", "HEAD"]  # StaticFiles serves these alone
    routes = [route for route in app.router.routes if not isinstance(route, Mount)]
    return [method for method in _HTTP_METHODS
            if any(route.matches({**scope, "method": method})[0] == Match.FULL for route in routes)]


def _behind_the_api_key(context: ServingContext) -> list[Any]:
    """The router dependency that answers 401 unless the request carries the server's key."""
    def authorized(request: Request) -> None:
        check_api_key(request, context.settings.api_key)

    return [Depends(authorized)]


def _v1_router(context: ServingContext) -> APIRouter:
    router = APIRouter(prefix="/v1", dependencies=_behind_the_api_key(context))

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await create_chat_completion(request, context)

    @router.post("/completions")
    async def completions(request: Request) -> Response:
        return await create_completion(request, context)

    @router.post("/responses")
    async def responses(request: Request) -> Response:
        return await create_response(request, context)

    async def stored_response(response_id: str, request: Request) -> Response:
        _not_a_stored_response(response_id)
        return get_response(response_id, request, context)

    _get_and_head(router, "/responses/{response_id}", stored_response)

    @router.delete("/responses/{response_id}")
    async def forget_response(response_id: str, request: Request) -> Response:
        _not_a_stored_response(response_id)
        return delete_response(response_id, request, context)

    @router.post("/responses/compact")
    async def compact() -> Response:
        return refuse_compaction()

    @router.post("/responses/input_tokens")
    async def response_input_tokens(request: Request) -> Response:
        return await count_input_tokens(request, context)

    async def response_input_items(response_id: str, request: Request) -> Response:
        return list_input_items(response_id, request, context)

    _get_and_head(router, "/responses/{response_id}/input_items", response_input_items)

    @router.post("/responses/{response_id}/cancel")
    async def cancel(response_id: str, request: Request) -> Response:
        return cancel_response(response_id, request, context)

    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(context, name)
                                                          for name in context.settings.served_model_names]})

    _get_and_head(router, "/models", models)

    async def model(model: str) -> Response:
        served = context.settings.served_model_names
        # `/v1/models/`, the list's path, or `/v1/models/tiny/` a served model's, with a trailing slash: answered as
        # every such path is. A model id may hold "/", so only a path naming no served model but for its slash.
        if not model or (model not in served and model.endswith("/") and model.rstrip("/") in served):
            raise HTTPException(404)
        return JSONResponse(_model_card(context, context.check_model(model)))

    _get_and_head(router, "/models/{model:path}", model)

    return router


def _not_a_stored_response(response_id: str) -> None:
    """Raises HTTPException(405) for the name of a route of its own under /v1/responses (GET /v1/responses/compact):
    `{response_id}` matches it too, and answered 404 "no stored response 'compact'" for a method that route does not
    take."""
    if response_id in RESPONSES_ROUTES:
        raise HTTPException(405)


def _tokenizer_router(context: ServingContext) -> APIRouter:
    """vLLM's /tokenize and /detokenize, at the root as vLLM serves them, behind the API key as /v1 is."""
    router = APIRouter(dependencies=_behind_the_api_key(context))

    @router.post("/tokenize")
    async def tokenize_route(request: Request) -> Response:
        return await tokenize(request, context)

    @router.post("/detokenize")
    async def detokenize_route(request: Request) -> Response:
        return await detokenize(request, context)

    return router


def _sagemaker_router(context: ServingContext) -> APIRouter:
    """vLLM's SageMaker entry point, POST /invocations (beside /ping), behind the API key as /v1 is."""
    router = APIRouter(dependencies=_behind_the_api_key(context))

    @router.post("/invocations")
    async def invocations(request: Request) -> Response:
        return await invoke(request, context)

    return router


def _get_and_head(router: FastAPI | APIRouter, path: str, endpoint: Callable[..., Any]) -> None:
    """GET `path`, and HEAD as GET (load balancers probe with HEAD), in the OpenAPI document once: the two methods of
    one route would share its operationId, which the OpenAPI specification requires unique (client generators
    refuse such a document)."""
    router.add_api_route(path, endpoint, methods=["GET"])
    router.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)


def _model_card(context: ServingContext, name: str) -> dict:
    """vLLM's model card: `root` is the checkpoint the server was started with, `parent` the base model of an adapter
    (none here), `permission` OpenAI's old permission object with vLLM's values (clients written for vLLM read
    `root` and `max_model_len`; some parse `permission` as a list)."""
    permission = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": context.created,
                  "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                  "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                  "group": None, "is_blocking": False}
    return {"id": name, "object": "model", "created": context.created, "owned_by": "glimmer",
            "root": os.fspath(context.engine.engine.config.model), "parent": None,
            "max_model_len": context.engine.engine.max_model_len, "permission": [permission]}


class _HttpMiddleware:
    """An ASGI middleware that handles HTTP requests (`http`) and passes every other scope (lifespan, websocket) on
    as it came."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class _RefuseWebSockets:
    """Answers a WebSocket handshake, which no route here takes (an OpenAI Realtime client's, say), with an
    OpenAI-style 400 (RFC 6455 §4.2.2) where the server can send one (ASGI's websocket.http.response extension);
    Starlette only closed it, which uvicorn sends as a bodiless 403. Other scopes pass on as they came."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(error_body(
            f"this server takes no WebSocket connections (asked at {_root_path(scope)}{get_route_path(scope)}): its "
            "API is plain HTTP requests, a reply streamed as server-sent events with `stream: true`",
            "invalid_request_error", code="websocket_not_supported")).encode()
        await send({"type": "websocket.http.response.start", "status": 400, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})


class _InternalErrors(_HttpMiddleware):
    """Turns an unexpected exception into a generic 500 (logged here with its traceback; the client never sees one).
    One raised after the response started can only be logged: the status line is sent."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def send_and_watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        except Exception as exc:
            if started:
                logger.error("internal error after the response started", exc_info=exc)
            else:
                await error_response(exc)(scope, receive, send)


class _Cors(CORSMiddleware):
    """Starlette's CORS handling, a preflight it refuses answered with an OpenAI-style 400 (Starlette's body is plain
    text, "Disallowed CORS origin") carrying the CORS headers Starlette's carries."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        refused = bytes(response.body).decode().removeprefix("Disallowed CORS ")
        headers = {name: value for name, value in response.headers.items()
                   if name.startswith("access-control-") or name == "vary"}
        message = (f"CORS preflight refused: the {refused} it asks for (Origin, Access-Control-Request-*) "
                   "is not allowed; the server allows the origins --allowed-origins names, the methods GET, POST and "
                   "DELETE, and any headers")
        return JSONResponse(error_body(message, "invalid_request_error", code="cors_preflight_refused"),
                            status_code=response.status_code, headers=headers)


class _HeaderCountLimit(_HttpMiddleware):
    """vLLM's --h11-max-header-count: a request with more header fields is answered 431 before any route reads it
    (thousands of small headers cost the server time in every middleware and route that looks one up); the
    middlewares outside it (request accounting, the request id, CORS) each look up one header. The X-Request-Id
    header --enable-request-id-headers made for a request that sent none is not the client's, and is not counted; an
    empty one it replaced is the client's, and is. A CORS preflight is answered by the CORS middleware, outside this
    one, so the limit does not apply to it."""

    def __init__(self, app: ASGIApp, max_header_count: int):
        super().__init__(app)
        self.max_header_count = max_header_count

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        count = scope.get("state", {}).get(CLIENT_HEADER_COUNT, len(scope["headers"]))
        if count <= self.max_header_count:
            await self.app(scope, receive, send)
            return
        await error_response(APIError(431, f"the request has {count} header fields, more than the server's limit of "
                                           f"{self.max_header_count} (--h11-max-header-count)",
                                      code="request_header_fields_too_large"))(scope, receive, send)


class _RequestIdHeaders(_HttpMiddleware):
    """vLLM's --enable-request-id-headers: every response carries `X-Request-Id`, the request's, or one made here
    when it sent none, which the request then carries on (a completion's id is built on it, as on a client's).
    An id the server refuses (not request_id.is_acceptable_id) is not reflected: the response carries one made for
    it, as a header 5,000 characters long or of bytes outside ASCII, echoed, would reach the client's logs and
    proxies. The made one is kept as for a request that sent none, so a route that takes no header id (/v1/responses)
    is named by it; a route that takes the header's still refuses the client's (400)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = REQUEST_ID_HEADER.lower().encode()
        sent_ids = [value for key, value in scope["headers"] if key == name and value]
        state: dict[str, Any] = {}
        if sent_ids and is_acceptable_id([value.decode("latin-1") for value in sent_ids]):
            request_id = sent_ids[0]
        elif sent_ids:  # made as for none sent; the header stays, for a route that reads it to refuse (400)
            request_id = uuid.uuid4().hex.encode()
            state = {**scope.get("state", {}), MADE_ID: request_id.decode()}
            scope = {**scope, "state": state}
        else:  # made here (an empty header is none); a body's `request_id` replaces it
            request_id = uuid.uuid4().hex.encode()
            state = {**scope.get("state", {}), MADE_ID: request_id.decode()}
            headers = [*(header for header in scope["headers"] if header[0] != name), (name, request_id)]
            state[CLIENT_HEADER_COUNT] = len(scope["headers"])
            scope = {**scope, "headers": headers, "state": state}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                sent = state[MADE_ID].encode() if MADE_ID in state else request_id
                message = {**message, "headers": [*message.get("headers", []), (name, sent)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class _RequestAccounting(_HttpMiddleware):
    """Counts requests by endpoint and status.

    A request whose client left before its response was complete counts as 499, whatever status line was sent:
    a stream cut short after its `200` as well as a non-streaming request that answered 499 to nobody. So does an
    upload whose chunked framing breaks: the connection answers that one itself (connection.INVALID_HTTP_RESPONSE)
    and closes, and the app, which could not answer anyway, sees the same disconnect as from a client that left.
    A request whose body did not come within the read timeout counts as 408: the connection layer wrote that answer
    and closed, and the handler saw the same disconnect (connection.REQUEST_TIMED_OUT tells them apart). One whose
    head did not come in time reached no handler and is not counted (nor is its endpoint known).
    A request whose handler is cancelled before its response is complete (uvicorn's graceful-shutdown timeout) counts
    as 500, as uvicorn answers it or cuts its stream, its `200` status line sent or not.
    A browser's CORS preflight (OPTIONS with Access-Control-Request-Method) counts as endpoint `preflight`: it asks
    whether it may call the endpoint and calls nothing, so it must not add to that endpoint's 200s or 400s."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        super().__init__(app)
        self.metrics = metrics

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        # before the app routes it: routing into the page files' mount sets the scope's root path to the mount's
        # (`/static`), which read `/static/chat.js` as `/chat.js` (endpoint `other`) and `/static/health` as `/health`
        endpoint = _endpoint(scope)
        status = 500  # where no response starts here, ServerErrorMiddleware (or uvicorn) answers 500
        finishing = False  # the response's last message is on its way
        client_left = False

        async def receive_and_watch() -> Message:
            nonlocal client_left
            message = await receive()
            # once the last message is sent the server reports a disconnect to every receive: that one is no exit
            if message["type"] == "http.disconnect" and not finishing:
                client_left = True
            return message

        async def send_and_record(message: Message) -> None:
            nonlocal status, finishing
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finishing = True
            await send(message)

        try:
            await self.app(scope, receive_and_watch, send_and_record)
        except asyncio.CancelledError:
            if not finishing:  # cut short: uvicorn answers 500, or closes a connection whose `200` went out
                status = 500
            raise
        finally:
            if scope.get(REQUEST_TIMED_OUT):
                recorded = 408
            else:
                recorded = _CLIENT_CLOSED_REQUEST if client_left else status
            self.metrics.requests.labels(endpoint, str(recorded)).inc()


def _endpoint(scope: Scope) -> str:
    path = get_route_path(scope)  # under --root-path, uvicorn's path starts with it (as ASGI has it)
    if scope["method"] == "OPTIONS" and any(name == b"access-control-request-method" for name, _ in scope["headers"]):
        return "preflight"
    if path in _ENDPOINTS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    if path.startswith("/v1/responses/"):  # a token count or a page of input items is no fetch of the response
        after_id = path.split("/")[4:]  # "", "v1", "responses", the id, then the route's rest
        if len(after_id) == 1 and after_id[0] in _STORED_RESPONSE_ROUTES:
            return f"/v1/responses/{{id}}/{after_id[0]}"
        return "/v1/responses/{id}"
    if path.startswith("/static/"):
        return "/static"
    return "other"

