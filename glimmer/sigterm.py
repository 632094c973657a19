"""SIGTERM while the `glimmer` command starts: recorded from its first line, before glimmer.cli and what it imports
load, and given to the command once it is known (imports nothing but `signal`, so that it is in place at once)."""

from __future__ import annotations

import signal


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
