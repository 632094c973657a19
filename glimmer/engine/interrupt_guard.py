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
    another LLM) leaves it to that one."""

    def __init__(self) -> None:
        self._noted = False
        self._previous: object = None

    def __enter__(self) -> InterruptsBetweenSteps:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._note)
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self._noted:  # the second Ctrl-C: the step it waits on may never end
            raise KeyboardInterrupt
        self._noted = True

    def check(self) -> None:
        """Raises the KeyboardInterrupt of a SIGINT noted since the last check."""
        if self._noted:
            self._noted = False
            raise KeyboardInterrupt

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._previous = None
        if exc_type is None:
            self.check()  # a SIGINT in the call's last step: raised as it would have been, once the call is whole
