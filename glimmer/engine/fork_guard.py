"""An engine runs only in a process that did not fork from one that had loaded an engine.

Loading and running a model start threads that fork does not copy: torch's OpenMP team (which the C decoder stack
computes on too), the grammar worker and llguidance's pool. A forked child that runs a model waits for them for
ever: the first matrix product in a child of a process whose OpenMP team had started hangs (torch's libgomp), so
an `LLM` used in a `multiprocessing` child of the default start method on Linux ("fork"), or a new one loaded there,
never answered. The child's first call raises `EngineForkedError` instead, naming the start method that works.
"""

from __future__ import annotations

import os

from glimmer.errors import EngineForkedError

_model_started = False  # whether this process (or the one it forked from) has reached loading a model
_forked_from: int | None = None  # the pid of the process that had, where this one is a fork of it


def _after_fork_in_child() -> None:
    global _forked_from
    if _model_started and _forked_from is None:  # a grandchild names the process that had loaded it
        _forked_from = os.getppid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_forked(what: str) -> None:
    """Raises EngineForkedError, saying that `what` ("LLM.generate", "loading an engine") cannot run here, when this
    process is a fork of one that had loaded an engine."""
    if _forked_from is None:
        return
    raise EngineForkedError(
        f"{what} cannot run in this process ({os.getpid()}): it was forked from process {_forked_from}, which had "
        "loaded a Glimmer engine, and the threads a model runs on (torch's OpenMP team, the grammar worker) do not "
        "survive fork, so it would wait for them for ever; start the process with "
        "multiprocessing.get_context('spawn') (or 'forkserver') and load the LLM in it, sending it prompts and "
        "SamplingParams")


def mark_model_started() -> None:
    """Record that this process's engine load has reached the model: the weights' load starts torch's OpenMP team
    (and on a GPU a CUDA context), so from here its forked children refuse to run an engine, whether this load goes
    on to succeed or not. A load refused before (a wrong path or option, a checkpoint or max_model_len refused)
    started no thread and touched no device, and leaves forks free to load one."""
    global _model_started
    _model_started = True
