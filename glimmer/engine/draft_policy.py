"""How many tokens to propose per sequence for the next step — 0 turns speculation off for that step.

Verifying k proposed tokens costs the target k more tokens per sequence. At batch 1 the target is bound by
reading its weights, so they are nearly free; in a large batch the target is bound by arithmetic and they
cost what they compute. The adaptive policy weighs that with two measurements:

- acceptance: a_j, the rate at which proposed token j is accepted when tokens 1 … j−1 were (per position a
  mean of its first verifications, then an exponential moving average; optimistic at 1 until measured, and
  taken as non-increasing in j since deep positions are rarely measured). With k tokens a sequence gains
  E(k) = 1 + Σ_{i≤k} Π_{j≤i} a_j tokens per step.
- step time: T(b, k), an exponential moving average of the wall time of whole decode steps (target, drafter,
  sampling, bookkeeping) with a batch of b sequences (in power-of-two buckets) and k proposed tokens each.

It picks the k (from a short menu up to the maximum) with the most tokens per second, E(k) · b / T(b, k),
when that beats not proposing by at least `SPEEDUP_MARGIN` (measurements are noisy, and where speculation
pays little it must not risk being slower). A step's time covers verifying this step's proposals and
proposing the next step's, so a step is measured only when both are the same choice (steady state).

Exploration is bounded: at a batch bucket, not proposing is measured first, then the choices in increasing
k, each only while it could still win: a step with more proposed tokens costs at least what the largest
measured smaller choice costs, so a choice whose E(k) over that time cannot beat the best measured rate by
the margin is not tried (at acceptance ~0 only the smallest, which probes use, is ever measured). As
acceptance rises, a skipped choice becomes worth trying and is measured then.

While speculation is off, a step now and then still proposes (the best k > 0), so that acceptance keeps
being measured: every `PROBE_INTERVAL`-th step, or rarer where a probe step costs more, so that probing
costs at most `PROBE_OVERHEAD` of the time. (A step without proposals costs what a step without
speculation costs: the drafter's context waits for the next proposing step, draft_context.py.)
The "always" policy proposes the maximum every step (reproducible runs; measurements).
"""

from __future__ import annotations

import math

PROBE_INTERVAL = 64
PROBE_OVERHEAD = 0.005
SPEEDUP_MARGIN = 0.05
_EMA = 0.1
_MIN_SAMPLES = 2  # measured steps before a choice is compared (its first step, a warm-up, is not counted)


def _mean_then_ema(mean: float, samples: int, value: float) -> tuple[float, int]:
    """(mean, samples) after one more sample: a plain mean of the first samples, then the moving average."""
    weight = max(_EMA, 1 / (samples + 1))
    return mean + weight * (value - mean), samples + 1


def draft_choices(max_draft_tokens: int) -> tuple[int, ...]:
    """The proposed-token counts a step can verify (0: none), for `max_draft_tokens` at most: the policy's menu
    (each a CUDA graph per batch size of its own: cuda_graphs.py)."""
    return tuple(sorted({0, *(k for k in (1, 2, 4, 8) if k < max_draft_tokens), max_draft_tokens}))


def _bucket(batch: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(batch, 1))))


class DraftPolicy:
    def __init__(self, max_draft_tokens: int, *, adaptive: bool = True, disable_by_batch_size: int | None = None):
        self.max_draft_tokens = max_draft_tokens
        self.adaptive = adaptive
        self.disable_by_batch_size = disable_by_batch_size
        self.choices = draft_choices(max_draft_tokens)
        self.acceptance = [1.0] * (max_draft_tokens + 1)  # index j: draft j (1-based)
        self._acceptance_samples = [0] * (max_draft_tokens + 1)
        self._time: dict[tuple[int, int], tuple[float, int]] = {}  # (bucket, k) → (EMA seconds, samples)
        self._warmed_up: set[tuple[int, int]] = set()
        self._steps_off = 0

    def fit(self, most: int) -> int:
        """The largest choice not above `most` (near max_tokens a sequence can use fewer tokens): steps keep
        to a few shapes, each a CUDA graph of its own."""
        return max(k for k in self.choices if k <= max(most, 0))

    def expected_tokens(self, k: int) -> float:
        return self._expected()[k]

    def _expected(self) -> list[float]:
        """E(k) for k = 0 … max_draft_tokens, in one pass over the positions."""
        out, total, run, rate = [1.0], 1.0, 1.0, 1.0
        for j in range(1, self.max_draft_tokens + 1):
            # rates of deep positions are measured rarely (only after every earlier token was accepted) and keep
            # their optimistic start: no position is taken to be accepted more readily than an earlier one
            rate = min(rate, self.acceptance[j])
            run *= rate
            total += run
            out.append(total)
        return out

    def choose(self, batch: int) -> int:
        """Proposed tokens per sequence for a step of `batch` decoding sequences."""
        if self.disable_by_batch_size is not None and batch > self.disable_by_batch_size:
            return 0
        if not self.adaptive:
            return self.max_draft_tokens
        times = self.step_times(batch)
        if 0 not in times:
            return 0
        expected = self._expected()
        rate = {k: expected[k] / times[k] for k in times}
        best = max(rate, key=rate.get)
        floor = times[0]  # T(b, k) >= T(b, k') for k > k': proposing more never costs less
        for k in self.choices[1:]:
            if k in times:
                floor = times[k]
            elif k == self.choices[1] or expected[k] / floor > rate[best] * (1 + SPEEDUP_MARGIN):
                return k  # not measured yet and could win (the smallest is measured anyway: it is the probe)
        if best and rate[best] > rate[0] * (1 + SPEEDUP_MARGIN):
            self._steps_off = 0
            return best
        self._steps_off += 1
        probe = max((k for k in times if k), key=rate.get)
        extra = times[probe] / times[0] - 1
        if self._steps_off % max(PROBE_INTERVAL, math.ceil(extra / PROBE_OVERHEAD)) == 0:
            return probe
        return 0

    def step_times(self, batch: int) -> dict[int, float]:
        """The measured step time (seconds) of each choice compared at `batch`'s bucket, in increasing k."""
        bucket = _bucket(batch)
        measured = {k: self._time.get((bucket, k), (0.0, 0)) for k in self.choices}
        return {k: seconds for k, (seconds, samples) in measured.items() if samples >= _MIN_SAMPLES}

    def observe_verification(self, num_proposed: int, num_accepted: int) -> None:
        """One sequence's verification: tokens 1 … num_accepted accepted, the next (if proposed) rejected."""
        for j in range(1, min(num_accepted + 1, num_proposed) + 1):
            hit = 1.0 if j <= num_accepted else 0.0
            # the optimistic start counts for no sample
            self.acceptance[j], self._acceptance_samples[j] = _mean_then_ema(
                self.acceptance[j], self._acceptance_samples[j], hit)

    def observe_step(self, batch: int, k: int, seconds: float) -> None:
        """The wall time of a decode step of `batch` sequences that each verified k proposed tokens."""
        key = (_bucket(batch), k)
        if key not in self._warmed_up:  # the first such step may capture graphs or grow the allocator
            self._warmed_up.add(key)
            return
        self._time[key] = _mean_then_ema(*self._time.get(key, (seconds, 0)), seconds)
