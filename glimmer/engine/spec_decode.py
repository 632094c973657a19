"""Speculative decoding, the engine's part: configuration, proposing after a step, counting what verifies.

With `speculative_config={"method": "dflash", "model": DIR, "num_speculative_tokens": 15}` each decode step
scores, for every sequence of the batch at once, its last token followed by the tokens proposed for it.
Verification (`rejection_sampler.py`) keeps the longest acceptable run plus one token from the target, so a
step yields 1 … k + 1 tokens per sequence and the output is what decoding without speculation gives (greedy:
token for token; sampling: the same distribution). After the step the proposer reads the target's hidden
states at the positions the step committed and proposes tokens for the next step; `draft_policy.py`
decides how many, 0 where speculation cannot pay.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glimmer.checkpoint.config import DrafterConfig
from glimmer.default_model import embedded_model_dir
from glimmer.engine.draft_context import CommittedContext
from glimmer.engine.draft_policy import DraftPolicy
from glimmer.engine.model_runner import StepLogits
from glimmer.engine.proposers import Proposer
from glimmer.engine.scheduler import ScheduledStep
from glimmer.engine.sequence import Sequence
from glimmer.errors import ConfigError

SPECULATIVE_METHODS = ("dflash",)
DRAFT_POLICIES = ("adaptive", "always")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's `speculative_config`, validated.

    method: "dflash" (the Muse Glimmer assistant); absent or None: "dflash", as vLLM infers a method from the drafter
        (the drafter's config must still be a DFlash drafter's).
    model: the drafter: an HF `muse_glimmer_assistant` directory, a native head.pt (or its directory) or a Hub id
        (owner/name, fetched when the engine loads it), as a string or a path object (kept as a string).
    num_speculative_tokens: the most tokens proposed per sequence and step (default and maximum: the
        drafter's block_size − 1).
    draft_policy: "adaptive" (measure acceptance and step times; propose fewer or none where it cannot
        pay; also None) or "always" (the maximum every step).
    disable_by_batch_size: no speculation in steps with more decoding sequences than this.
    """

    method: str | None
    model: str
    num_speculative_tokens: int | None = None
    draft_policy: str | None = "adaptive"  # None: the default, kept as "adaptive"
    disable_by_batch_size: int | None = None

    @classmethod
    def parse(cls, value: SpeculativeConfig | Mapping[str, Any] | str) -> SpeculativeConfig:
        """From a mapping or a JSON object string (the CLI's --speculative-config); ConfigError on any bad key."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"speculative_config is not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(value, Mapping):
            raise ConfigError(f"speculative_config must be a JSON object / dict, got {type(value).__name__}")
        if value.get("method") is not None:  # before the keys: vLLM's other methods take keys and no model
            _check_method(value["method"])
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(value) - known, key=str)  # a Python dict's keys may be of any type
        if unknown:
            raise ConfigError(f"speculative_config has unknown key(s) {unknown}; allowed: {sorted(known)}")
        if "model" not in value:
            raise ConfigError("speculative_config needs 'model' (e.g. {\"method\": \"dflash\", \"model\": "
                              "\"/path/to/Muse-Glimmer-30B-assistant\"})")
        return cls(**{"method": None, **value})

    def __post_init__(self) -> None:
        if self.method is None:  # vLLM infers the method from the drafter; DFlash is the one Glimmer has
            object.__setattr__(self, "method", SPECULATIVE_METHODS[0])
        _check_method(self.method)
        if isinstance(self.model, os.PathLike):  # as LLM(model=...) takes one
            object.__setattr__(self, "model", os.fspath(self.model))
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("speculative_config.model must name the drafter (a directory or a head.pt file)")
        for key in _COUNTS:
            object.__setattr__(self, key, _whole_number(getattr(self, key)))
        n = self.num_speculative_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(f"speculative_config.num_speculative_tokens={n!r} must be an integer >= 1{_NOT_FRACTION}")
        if self.draft_policy is None:  # as num_speculative_tokens and disable_by_batch_size take null: the default
            object.__setattr__(self, "draft_policy", "adaptive")
        if self.draft_policy not in DRAFT_POLICIES:
            raise ConfigError(f"speculative_config.draft_policy={self.draft_policy!r} is not one of "
                              f"{list(DRAFT_POLICIES)}")
        b = self.disable_by_batch_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ConfigError(f"speculative_config.disable_by_batch_size={b!r} must be an integer >= 1{_NOT_FRACTION}")

    def proposed_tokens(self, drafter: DrafterConfig) -> int:
        """The most tokens proposed per sequence and step with `drafter`: num_speculative_tokens, else all its
        block holds. Raises ConfigError where num_speculative_tokens asks for more than the block holds."""
        most = drafter.num_draft_tokens
        k = self.num_speculative_tokens or most
        if k > most:
            raise ConfigError(f"speculative_config.num_speculative_tokens={k} exceeds what the drafter proposes per "
                              f"step: its block_size is {drafter.block_size}, so at most {most}")
        return k

    def drafter_path(self) -> Path | None:
        """Where the drafter's files are: `model` as a path, else the embedded drafter it names (by the name
        served); None when neither exists."""
        path = Path(self.model).expanduser()
        return path if path.exists() else embedded_model_dir(self.model)


_COUNTS = ("num_speculative_tokens", "disable_by_batch_size")  # vLLM's int fields among the keys
_NOT_FRACTION = " (a whole number: 4.0 is taken as 4)"


def _whole_number(value: object) -> object:
    """An integral float as its int, as vLLM's config (a pydantic dataclass, lax) takes 4.0 for an int field: JSON
    writers emit numbers as floats. Anything else as it is, for the caller's check (4.5 is refused)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _check_method(method: object) -> None:
    if method not in SPECULATIVE_METHODS:
        raise ConfigError(f"speculative_config.method={method!r} is not supported; use one of "
                          f"{list(SPECULATIVE_METHODS)} with the model's DFlash drafter as 'model'")


def check_verification_budget(max_num_batched_tokens: int, num_speculative_tokens: int) -> None:
    """ConfigError unless a step's token budget holds one sequence's verification: its last token and the
    num_speculative_tokens proposed after it."""
    if max_num_batched_tokens < num_speculative_tokens + 1:
        raise ConfigError(f"max_num_batched_tokens={max_num_batched_tokens} cannot hold one sequence's verification "
                          f"step (1 + num_speculative_tokens = {num_speculative_tokens + 1} tokens); raise it or lower "
                          "num_speculative_tokens")


@dataclass
class SpecDecodeStats:
    """Counters for /metrics: verifications, proposed and accepted tokens, and how many tokens each
    verification emitted (acceptance length: accepted + 1, before stop handling).

    The engine thread records while the server's thread scrapes: a scrape reads a `snapshot()`, taken under the
    lock `record` holds, so that its counters agree with each other (accepted ≤ proposed, the histogram's count
    equal to the verifications)."""

    max_draft_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    acceptance_lengths: list[int] = field(default_factory=list)  # index L: verifications that emitted L tokens
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.acceptance_lengths = [0] * (self.max_draft_tokens + 2)

    def record(self, num_proposed: int, num_accepted: int) -> None:
        with self._lock:
            self.num_drafts += 1
            self.num_draft_tokens += num_proposed
            self.num_accepted_tokens += num_accepted
            self.acceptance_lengths[num_accepted + 1] += 1

    def snapshot(self) -> SpecDecodeStats:
        """A copy of the counters as of one moment, which later verifications leave as it is."""
        with self._lock:
            out = SpecDecodeStats(self.max_draft_tokens, self.num_drafts, self.num_draft_tokens,
                                  self.num_accepted_tokens)
            out.acceptance_lengths = list(self.acceptance_lengths)
        return out

    @property
    def mean_acceptance_length(self) -> float:
        return (self.num_accepted_tokens + self.num_drafts) / self.num_drafts if self.num_drafts else 0.0


class SpeculativeDecoder:
    """Owns the proposer and the draft policy; the engine calls it after verifying a step."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_draft_tokens: int,
                 target_layer_ids: tuple[int, ...]):
        self.config = config
        self.proposer = proposer
        self.max_draft_tokens = max_draft_tokens
        self.target_layer_ids = target_layer_ids
        self.policy = DraftPolicy(max_draft_tokens, adaptive=config.draft_policy == "adaptive",
                                  disable_by_batch_size=config.disable_by_batch_size)
        self.stats = SpecDecodeStats(max_draft_tokens)
        self._step_drafts = 0  # tokens proposed per sequence for the step being run
        self._staged = False  # the running step's committed positions were handed over (stage_context)

    def context_complete_through(self, seq: Sequence) -> int:
        """How many leading positions of `seq` have their keys/values in every group, the drafter's included
        (a step without proposals leaves the drafter's for later: draft_context.py)."""
        pending = self.proposer.first_pending(seq)
        return seq.num_computed_tokens if pending is None else pending

    def complete_full_blocks(self, seq: Sequence, block_size: int) -> None:
        """`seq` ends: write its drafter context now if a full block of its computed positions waits for it (no
        later step would), so that the block goes to the prefix cache like those completed earlier."""
        pending = self.proposer.first_pending(seq)
        if pending is not None and pending < seq.num_computed_tokens // block_size * block_size:
            self.proposer.write_pending()

    def release(self, seq: Sequence) -> None:
        """`seq` finished or was preempted: drop what the proposer keeps of it."""
        self.proposer.release(seq)

    def record_verification(self, num_proposed: int, num_accepted: int) -> None:
        if num_proposed:
            self.stats.record(num_proposed, num_accepted)
            self.policy.observe_verification(num_proposed, num_accepted)

    def stage_context(self, step: ScheduledStep, output: StepLogits) -> None:
        """Hand a step without proposals its committed positions now, while the device computes it (their
        hidden states are the step's outputs, read in stream order): with nothing to verify every scheduled
        token is committed, so the proposer's bookkeeping — keeping them pending, or writing them when a
        sequence has a block's worth — need not wait for the sampled tokens. `after_step` then proposes only."""
        self._staged = False
        if any(step.num_spec_tokens):
            return
        context = self._committed(step, step.num_new_tokens, output, counted=False)
        if context.seqs:
            self.proposer.propose(context, [])
        self._staged = True

    @staticmethod
    def _committed(step: ScheduledStep, committed: list[int], output: StepLogits, counted: bool) -> CommittedContext:
        """The positions the step committed: `committed[i]` of step.seqs[i], which end at its num_computed_tokens
        if they are `counted` there already, else start there."""
        starts, counts, rows, seqs = [], [], [], []
        row = 0
        for seq, n, count in zip(step.seqs, step.num_new_tokens, committed, strict=True):
            if count:
                seqs.append(seq)
                starts.append(seq.num_computed_tokens - count if counted else seq.num_computed_tokens)
                counts.append(count)
                rows.append(row)
            row += n
        return CommittedContext(seqs, starts, counts, rows, output.hidden)

    def after_step(
        self,
        step: ScheduledStep,
        output: StepLogits,
        committed: list[int],
        decoding: list[Sequence],
        num_running: int,
        started_s: float,
        *,
        proposals: int | None = None,
    ) -> None:
        """Hand the step's committed positions to the proposer (unless `stage_context` did) and get proposals for
        `decoding` (the sequences that sampled and go on; `num_running` sequences run next step); then time the
        step for the policy.

        committed[i]: positions of step.seqs[i] committed this step (they end at its num_computed_tokens).
        proposals: tokens per sequence to propose, when the engine asked the policy already (a step run ahead,
        lookahead.py); else the policy chooses here.
        """
        if self._staged:  # handed over while the device ran the step (stage_context)
            context = CommittedContext([], [], [], [], output.hidden)
        else:
            context = self._committed(step, committed, output, counted=True)
        self._staged = False
        k = (self.policy.choose(num_running) if proposals is None else proposals) if decoding else 0
        requests = []
        for seq in decoding if k else ():
            room = seq.max_total_tokens - seq.num_tokens - 1  # a step emits at most k + 1 tokens
            fitted = self.policy.fit(min(k, room))
            if fitted:
                requests.append((seq, fitted))
        drafts = self.proposer.propose(context, requests) if requests or context.seqs else []
        for (seq, _), draft in zip(requests, drafts, strict=True):
            seq.spec_token_ids = list(draft.token_ids)
            seq.spec_draft_probs = draft.probs
        proposed_next = k if requests else 0
        # the step's time covers verifying its proposals and proposing the next step's: measured in steady state
        steady = self._step_drafts == proposed_next
        all_decode = all(n - step.spec_tokens(i) == 1 for i, n in enumerate(step.num_new_tokens))
        if steady and all_decode and len(output.sampling) == len(step.seqs):
            self.policy.observe_step(len(step.seqs), self._step_drafts, time.perf_counter() - started_s)
        self._step_drafts = proposed_next
