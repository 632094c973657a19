"""Stopping work a caller no longer waits for: a flag the caller sets and the work checks between steps.

Preparing a request (fetching and decoding media, tokenizing) runs on a worker thread, which cannot be
interrupted from outside. The server hands that work a `CancelToken` and cancels it when the client
disconnects; the work calls `check()` between its steps (each media item, each video frame, each downloaded
chunk) and stops there with `Cancelled`. Pure Python, like `glimmer.errors`: any layer may use it.
"""

from __future__ import annotations

import threading

from glimmer.errors import GlimmerError

# how often work that waits (a prompt on its downloads, a download's watchdog) looks whether it has been cancelled
CANCEL_CHECK_S = 0.05


class Cancelled(GlimmerError):
    """The caller cancelled the work (its client went away); nothing is wrong with the request."""


class CancelToken:
    def __init__(self, parent: CancelToken | None = None) -> None:
        self._event = threading.Event()
        self._parent = parent

    def child(self) -> CancelToken:
        """A token cancelled with this one, and also on its own (the rest of a request's downloads, once one of them
        has failed it) without cancelling this one."""
        return CancelToken(self)

    def cancel(self) -> None:
        """Ask the work to stop at its next check (thread-safe)."""
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set() or (self._parent is not None and self._parent.cancelled)

    def check(self) -> None:
        """Raises Cancelled if the work has been cancelled."""
        if self.cancelled:
            raise Cancelled("the request was cancelled")

