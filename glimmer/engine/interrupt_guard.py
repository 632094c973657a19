"""Ctrl-C held to a moment where the engine's bookkeeping is whole.

`LLM.generate` steps the engine in the caller's thread, and Python raises KeyboardInterrupt at whatever line the
main thread runs when SIGINT comes: inside freeing a sequence's KV blocks (its count of blocks in use lowered, the
block's reference not yet released) or taking one (the block off the free list, not yet held), the block was lost
to every later call of that LLM, or counted twice. While a call queues and steps its requests, the first SIGINT is
only noted, and raised as KeyboardInterrupt where the call looks (after a request is queued, after a step); a second
one, for a step that does not end, raises at once, as Python would.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType


class InterruptsBetweenSteps:
    """A context manager that holds SIGINT's KeyboardInterrupt to `check()`. It takes SIGINT over only in the main
    thread (the only one Python delivers signals to) and only from Python's own handler: a handler of the caller's
    is left to do as it does, and a call nested in one that holds SIGINT (a progress bar's callable that generates on
    another LLM) reads that one's note at its own checks."""

    def __init__(self) -> None:
        self._noted = False
        self._previous: object = None
        self._holder = self  # the guard whose handler notes SIGINT: this one, or the one this call is nested in

    def __enter__(self) -> InterruptsBetweenSteps:
        if threading.current_thread() is not threading.main_thread():
            return self
        handler = signal.getsignal(signal.SIGINT)
        if getattr(handler, "__func__", None) is InterruptsBetweenSteps._note:
            self._holder = handler.__self__  # type: ignore[union-attr]
        elif handler is signal.default_int_handler:
            try:
                self._previous = signal.signal(signal.SIGINT, self._note)
            except ValueError:  # a subinterpreter's main thread may not set handlers: SIGINT is left as it is
                pass
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._noted:  # the second Ctrl-C: the step it waits on may never end
            raise KeyboardInterrupt
        self._noted = True

    def _take_note(self) -> bool:
        noted, self._holder._noted = self._holder._noted, False
        return noted

    def check(self) -> None:
        """Raises the KeyboardInterrupt of a SIGINT noted since the last check."""
        if self._take_note():
            raise KeyboardInterrupt

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._previous = None
        # a SIGINT noted in the call's last step, or in a step that raised something else (a request refused, a
        # grammar's failure that a loop over prompts catches), is raised as it would have been, once the call is whole
        if (exc_type is None or not issubclass(exc_type, KeyboardInterrupt)) and self._take_note():
            raise KeyboardInterrupt from exc
