"""Server-sent events, and what a client that goes away does to its request.

A streaming response is a `StreamingResponse` of `data: {json}` events ending with `data: [DONE]`. When the
client disconnects, the stream is cancelled and its body iterator closed at once, which closes the engine
iterator and so aborts the request: its KV blocks are freed and the engine stops computing for it. A
non-streaming request is run under `until_disconnect`, which does the same, and the work before the engine
(media, tokenizing) runs `in_worker_thread`, which also stops when the client leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from glimmer.cancellation import CancelToken
from glimmer.engine.async_engine import EngineShuttingDownError
from glimmer.server.json_text import one_line_json

T = TypeVar("T")

DONE_EVENT = "data: [DONE]\n\n"
SHUTDOWN_CHECK_INTERVAL_S = 0.1  # how often an upload or a prompt being prepared looks whether the server stops


def sse_event(payload: dict[str, Any], event: str | None = None) -> str:
    """One server-sent event; `event` names it (the Responses API does, chat chunks do not)."""
    data = f"data: {one_line_json(payload, separators=(',', ':'))}\n\n"
    return f"event: {event}\n{data}" if event else data


class ClientDisconnected(Exception):
    """The client went away before its response was ready (HTTP 499 in the metrics)."""


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, content: Any):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # close the body (and the engine iterator inside it) now, not whenever it is garbage-collected
            await self.body_iterator.aclose()  # type: ignore[union-attr]


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (then raises ClientDisconnected)."""
    return await _until_disconnect(request, asyncio.ensure_future(work), None)


async def in_worker_thread(request: Request, function: Callable[[CancelToken], T],
                           threads: CapacityLimiter | None = None) -> T:
    """`function(cancel)` run on a worker thread, off the event loop. If the client disconnects (or the server
    stops the request) first, `cancel` is cancelled, so the work stops at its next check (a thread cannot be
    interrupted), and ClientDisconnected (or CancelledError) is raised once it has. So it is, with
    EngineShuttingDownError (503), when the server begins shutting down: the work (a slow media download) would
    otherwise go on past uvicorn's grace period, whose cancellation cuts the request. `threads`: the pool it runs
    on, anyio's default one (40 threads at once, shared by every request) where None."""
    cancel = CancelToken()
    engine = request.app.state.context.engine
    try:
        work = asyncio.ensure_future(anyio.to_thread.run_sync(function, cancel, limiter=threads))
        return await _until_disconnect(request, asyncio.ensure_future(_unless_closing(
            work, lambda: engine.closing_reason)), cancel.cancel)
    finally:
        cancel.cancel()


async def _unless_closing(work: asyncio.Future[T], closing_reason: Callable[[], str | None]) -> T:
    """`work`'s result; EngineShuttingDownError once the server begins shutting down before it is done."""
    try:
        while not work.done():
            await asyncio.wait({work}, timeout=SHUTDOWN_CHECK_INTERVAL_S)
            reason = closing_reason()
            if not work.done() and reason is not None:
                raise EngineShuttingDownError(reason)
        return work.result()
    finally:
        work.cancel()


async def _until_disconnect(request: Request, task: asyncio.Future[T],
                            on_disconnect: Callable[[], None] | None) -> T:
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # the handler itself is cancelled (the server's shutdown timeout, an ASGI caller): the work stops before
            # the cancellation goes on, so that what the caller closes next (its engine iterators) is not still running
            if on_disconnect is not None:
                on_disconnect()
            await _stopped(task)
            raise
        if task.done():
            return task.result()
        if on_disconnect is not None:
            on_disconnect()
        await _stopped(task)
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()


async def _stopped(task: asyncio.Future) -> None:
    """Cancel `task` and wait until it has ended (its outcome is moot), so that what the caller closes next (its engine
    iterators) is not still running. A cancellation of the caller meanwhile goes on once the task has ended."""
    task.cancel()
    cancelled = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = exc
    if not task.cancelled():
        task.exception()  # retrieved: asyncio would log it as never retrieved
    if cancelled is not None:
        raise cancelled


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
