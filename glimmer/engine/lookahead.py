"""Lookahead: the next decode step is launched before the host reads the tokens of the one running.

A synchronous decode step leaves the GPU idle while the host reads the sampled tokens, appends them, plans
the next step and lays out its inputs (2–4 ms a step at batch 64–256 on the 30B model). With lookahead, a
decode step's successor is planned and launched while the step still runs: every sequence of the step
gets one more token whose input is the token the step chooses, copied on the device (`ModelRunner.execute`'s
`input_ids`); the host then reads the first step's tokens while the GPU computes the second. The GPU
always has the next step queued.

What the host does not know yet when it launches the successor is decided when it reads: a sequence the
running step ends (a stop id, a stop string, an abort) has a row in the successor that is dropped unread
(its keys/values land in blocks it frees afterwards, overwritten only by later work on the same stream).
A sequence whose next token is its last by `max_tokens` gets no row. Draws stay in order: each sequence
has its own generator, and the successor's draw comes after the running step's, as without lookahead.

Only steps whose every row is a plain decode run ahead: no grammar, penalties or logprobs (those need the
host's view of the tokens before the next step samples), no speculative decoding, and no request waiting
that could join the batch (the scheduler admits it once the running step is read). Anything else runs the
step synchronously, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glimmer.engine.scheduler import ScheduledStep
from glimmer.engine.sequence import Sequence


def runs_ahead(seq: Sequence) -> bool:
    """Whether `seq`'s decode rows can be sampled before the host has read its previous token."""
    params = seq.params
    position = seq.num_computed_tokens
    return (
        seq.controller is None
        and not params.uses_penalties
        and params.logprobs is None
        and not any(item.overlaps(position, position + 1) for item in seq.multimodal)
    )


@dataclass
class LaunchedStep:
    """A decode step on the device whose tokens the host has not read yet."""

    step: ScheduledStep
    tokens: torch.Tensor  # (B,) the chosen tokens, on the step's device
    host_tokens: torch.Tensor  # their copy in pinned host memory, complete once `ready` fires
    ready: torch.cuda.Event | None  # None on the CPU: the tokens are there already

    @classmethod
    def start(cls, step: ScheduledStep, tokens: torch.Tensor) -> LaunchedStep:
        """Queue the copy of `tokens` to the host behind the step's work (nothing waits here)."""
        if not tokens.is_cuda:
            return cls(step, tokens, tokens, None)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return cls(step, tokens, host, ready)

    def read(self) -> list[int]:
        """The chosen tokens, one per sequence of the step; waits for this step alone, not for later ones."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host_tokens.tolist()

    def input_ids_for(self, successor: ScheduledStep) -> torch.Tensor:
        """The successor's input tokens on the device: those this step chose for the same sequences."""
        rows = {id(seq): i for i, seq in enumerate(self.step.seqs)}
        index = [rows[id(seq)] for seq in successor.seqs]
        if index == list(range(len(self.step.seqs))):
            return self.tokens
        positions = torch.tensor(index, dtype=torch.int64)
        if self.tokens.is_cuda:
            positions = positions.pin_memory().to(self.tokens.device, non_blocking=True)
        return self.tokens[positions]
