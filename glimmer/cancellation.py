"""Stopping work a caller no longer waits for: a flag the caller sets and the work checks between steps.

Preparing a request (fetching and decoding media, tokenizing) runs on a worker thread, which cannot be
interrupted from outside. The server hands that work a `CancelToken` and cancels it when the client
disconnects; the work calls `check()` between its steps (each media item, each video frame, each downloaded
chunk) and stops there with `Cancelled`. Pure Python, like `glimmer.errors`: any layer may use it.
"""

from __future__ import annotations

import threading

from glimmer.errors import GlimmerError


class Cancelled(GlimmerError):
    """The caller cancelled the work (its client went away); nothing is wrong with the request."""


class CancelToken:
    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        """Ask the work to stop at its next check (thread-safe)."""
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raises Cancelled if the work has been cancelled."""
        if self._event.is_set():
            raise Cancelled("the request was cancelled")

