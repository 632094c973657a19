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
A sequence whose next token is its last by `max_tokens` gets no row. Draws stay in order: a seeded
sequence has its own generator, and the successor's draw comes after the running step's, as without
lookahead (unseeded sequences share the engine's generator, whose draws follow the steps as they run).

Only steps whose every row is a plain decode run ahead: no grammar (it needs the host's view of the tokens
before the next step samples), no proposed tokens to verify, and no request waiting that could
join the batch (the scheduler admits it once the running step is read). With speculative decoding, a step
runs ahead while the draft policy proposes nothing for it (drafts are made from the tokens); its drafter
context is staged from the device's hidden states at launch. Anything else runs the step synchronously, as
before. Logprobs are computed with the tokens and read back with them. Penalties count the token on its way
(the successor's input, on the device) as the row's last output token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glimmer.engine.model_runner import StepLogits
from glimmer.engine.sampler import SampleResult, SamplingRow, sample_result
from glimmer.engine.scheduler import ScheduledStep
from glimmer.engine.sequence import Sequence


def runs_ahead(seq: Sequence) -> bool:
    """Whether `seq`'s decode rows can be sampled before the host has read its previous token. Not a sequence that
    samples nothing, whose last prompt token can be a one-token step (a prompt of one token, or a prefix-cache hit
    or prefill chunk leaving one): the host finishes it unsampled (`_emit`). Nor one with a bad word of several
    tokens, whose ban at a step depends on the token before it, not read yet."""
    position = seq.num_computed_tokens
    return (
        not seq.samples_nothing
        and seq.controller is None
        and all(len(ids) == 1 for ids in seq.bad_word_ids)
        and not any(item.overlaps(position, position + 1) for item in seq.multimodal)
    )


@dataclass
class LaunchedStep:
    """A decode step on the device whose tokens (and logprobs) the host has not read yet."""

    step: ScheduledStep
    output: StepLogits  # what the runner returned (the drafter's context reads its hidden states)
    rows: list[SamplingRow]  # how each sequence sampled (which logprobs it asked for)
    tokens: torch.Tensor  # (B,) the chosen tokens, on the step's device
    host: list[torch.Tensor]  # the tokens, then the logprob fields, in host memory once `ready` fires
    ready: torch.cuda.Event | None  # None on the CPU: they are there already
    launched_s: float  # perf_counter when it was launched (the draft policy times steps)

    @classmethod
    def start(cls, step: ScheduledStep, output: StepLogits, rows: list[SamplingRow], tokens: torch.Tensor,
              logprob_fields: tuple[torch.Tensor, ...], launched_s: float) -> LaunchedStep:
        """Queue the copies of `tokens` and `logprob_fields` (`sample_on_device`'s) to pinned host memory
        behind the step's work; nothing waits here."""
        if not tokens.is_cuda:
            return cls(step, output, rows, tokens, [tokens, *logprob_fields], None, launched_s)
        host = []
        for tensor in (tokens, *logprob_fields):
            copy = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            copy.copy_(tensor, non_blocking=True)
            host.append(copy)
        ready = torch.cuda.Event()
        ready.record()
        return cls(step, output, rows, tokens, host, ready, launched_s)

    def read(self) -> SampleResult:
        """The tokens (one per sequence of the step) and their logprobs; waits for this step alone, not for the
        ones launched after it."""
        if self.ready is not None:
            self.ready.synchronize()
        return sample_result([tensor.tolist() for tensor in self.host], self.rows)

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
