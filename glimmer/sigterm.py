"""SIGTERM in the `glimmer` command: recorded from its first line, before glimmer.cli and what it imports load, and
given to the command once it is known (SigtermRecord), then raised as Terminated where the command heeds it
(SigtermWatch). Imports nothing but `signal`, `sys` and `typing`, so that the record is in place at once."""

from __future__ import annotations

import signal
import sys
from typing import Any


class SigtermRecord:
    """SIGTERM's handler until the command takes it over: it only notes that SIGTERM came. Without it, a SIGTERM in
    the command's first moments (its imports, its argument parsing) killed `glimmer serve` (status 143) where it
    promises status 0, and a container's PID 1, which ignores a signal without a handler, went on to load and serve
    after `docker stop`."""

    def __init__(self) -> None:
        self.arrived = False

    def __call__(self, signum: int, frame: object) -> None:
        self.arrived = True


def record_sigterm() -> None:
    """Install a SigtermRecord as SIGTERM's handler (the command finds it there: take_over_sigterm)."""
    signal.signal(signal.SIGTERM, SigtermRecord())


def take_over_sigterm(handler: object) -> tuple[object, bool]:
    """Make `handler` SIGTERM's handler (a function, signal.SIG_DFL or signal.SIG_IGN). Returns the handler to give
    SIGTERM back to after it, the one found or, in place of a SigtermRecord, whose job is then done, SIG_DFL; and
    whether that record noted a SIGTERM, which came as much as one now. The record is read once `handler` is in place,
    so that no SIGTERM falls between the two."""
    found = signal.signal(signal.SIGTERM, handler)
    if isinstance(found, SigtermRecord):
        return signal.SIG_DFL, found.arrived
    return found, False


def give_back_sigterm() -> None:
    """For a command that does not heed SIGTERM: the default handler again in place of a SigtermRecord, and a SIGTERM
    it noted raised again, which ends the process as it would have at once. Does nothing where no record is the
    handler (`glimmer.cli.main` called directly, as by `python -m glimmer.cli` and the tests)."""
    if isinstance(signal.getsignal(signal.SIGTERM), SigtermRecord):
        _, arrived = take_over_sigterm(signal.SIG_DFL)
        if arrived:
            signal.raise_signal(signal.SIGTERM)


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so that `glimmer serve` shuts its engine down and exits 0. A
    BaseException, as KeyboardInterrupt is: the loading code's `except Exception` (a Hub download's) must not take it
    for a failure of its own."""


class SigtermWatch:
    """SIGTERM is noted from this watch's creation and raises Terminated from `arm()` until `stop()`. uvicorn shuts
    down gracefully on SIGTERM and then raises the signal again to the handler it found: the default one would kill
    the process (status 143) before the engine is shut down, where SIGTERM should end `glimmer serve` as cleanly as
    Ctrl-C does (status 0). Until armed a SIGTERM is only noted: raised while the watch was being set up, before the
    `try` that reports it, it came out of `glimmer.cli.main` as a traceback (status 1).

    `check()` raises Terminated if SIGTERM came at all: a signal handled while the main thread runs a weakref
    callback or finalizer (an import lock's, as the loading code imports) raises where Python drops the exception as
    unraisable, printing its traceback, and the server went on to serve."""

    def __init__(self) -> None:
        self.arrived = self._armed = self._stopped = False
        self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        self._previous, noted_at_start = take_over_sigterm(self._terminated)
        self.arrived = self.arrived or noted_at_start

    def arm(self) -> None:
        """From now on a SIGTERM raises Terminated where it lands; one noted before raises it now."""
        self._armed = True
        self.check()

    def _terminated(self, signum: int, frame: Any) -> None:
        self.arrived = True
        if self._armed:
            raise Terminated()

    def _unraisable(self, report: Any) -> None:
        if not isinstance(report.exc_value, Terminated):  # a dropped Terminated is raised again by `check`
            self._previous_hook(report)

    def check(self) -> None:
        if self.arrived:
            raise Terminated()

    def stop(self) -> None:
        """Give SIGTERM and unraisable exceptions back to the handlers found (once; later calls do nothing)."""
        if not self._stopped:
            self._stopped = True
            signal.signal(signal.SIGTERM, self._previous)
            sys.unraisablehook = self._previous_hook
