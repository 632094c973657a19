"""How many tokens to propose per sequence for the next step — 0 turns speculation off for that step.

Verifying k proposed tokens costs the target k more tokens per sequence. At batch 1 the target is bound by
reading its weights, so they are nearly free; in a large batch the target is bound by arithmetic and they
cost what they compute. The adaptive policy weighs that with two measurements:

- acceptance: a_j, the rate at which proposed token j is accepted when tokens 1 … j−1 were (an
  exponential moving average per position, starting optimistic at 1, taken as non-increasing in j since
  deep positions are rarely measured). With k tokens a sequence gains E(k) = 1 + Σ_{i≤k} Π_{j≤i} a_j tokens
  per step.
- step time: T(b, k), an exponential moving average of the wall time of whole decode steps (target, drafter,
  sampling, bookkeeping) with a batch of b sequences (in power-of-two buckets) and k proposed tokens each.

It picks the k (from a short menu up to the maximum) with the most tokens per second, E(k) · b / T(b, k),
when that beats not proposing by at least `SPEEDUP_MARGIN` (measurements are noisy, and where speculation
pays little it must not risk being slower); a choice not yet measured at this batch bucket is tried first.
A step's time covers verifying this step's proposals and proposing the next step's, so a step is measured
only when both are the same choice (steady state). While speculation is off, a step now and
then still proposes (the best k > 0), so that acceptance keeps being measured: every `PROBE_INTERVAL`-th
step, or rarer where a probe step costs more, so that probing costs at most `PROBE_OVERHEAD` of the time.
The "always" policy proposes the maximum every step (reproducible runs; measurements).
"""

from __future__ import annotations

import math

PROBE_INTERVAL = 16
PROBE_OVERHEAD = 0.02
SPEEDUP_MARGIN = 0.05
_EMA = 0.1
_MIN_SAMPLES = 2  # measured steps before a choice is compared (its first step, a warm-up, is not counted)


def _bucket(batch: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(batch, 1))))


class DraftPolicy:
    def __init__(self, max_draft_tokens: int, *, adaptive: bool = True, disable_by_batch_size: int | None = None):
        self.max_draft_tokens = max_draft_tokens
        self.adaptive = adaptive
        self.disable_by_batch_size = disable_by_batch_size
        self.choices = tuple(sorted({0, *(k for k in (1, 2, 4, 8) if k < max_draft_tokens), max_draft_tokens}))
        self.acceptance = [1.0] * (max_draft_tokens + 1)  # index j: draft j (1-based)
        self._time: dict[tuple[int, int], tuple[float, int]] = {}  # (bucket, k) → (EMA seconds, samples)
        self._warmed_up: set[tuple[int, int]] = set()
        self._steps_off = 0

    def fit(self, most: int) -> int:
        """The largest choice not above `most` (near max_tokens a sequence can use fewer tokens): steps keep
        to a few shapes, each a CUDA graph of its own."""
        return max(k for k in self.choices if k <= max(most, 0))

    def expected_tokens(self, k: int) -> float:
        total, run, rate = 1.0, 1.0, 1.0
        for j in range(1, k + 1):
            # rates of deep positions are measured rarely (only after every earlier token was accepted) and keep
            # their optimistic start: no position is taken to be accepted more readily than an earlier one
            rate = min(rate, self.acceptance[j])
            run *= rate
            total += run
        return total

    def choose(self, batch: int) -> int:
        """Proposed tokens per sequence for a step of `batch` decoding sequences."""
        if self.disable_by_batch_size is not None and batch > self.disable_by_batch_size:
            return 0
        if not self.adaptive:
            return self.max_draft_tokens
        bucket = _bucket(batch)
        for k in self.choices:
            if self._time.get((bucket, k), (0.0, 0))[1] < _MIN_SAMPLES:
                return k
        rate = {k: self.expected_tokens(k) / self._time[(bucket, k)][0] for k in self.choices}
        best = max(rate, key=rate.get)
        if best and rate[best] > rate[0] * (1 + SPEEDUP_MARGIN):
            self._steps_off = 0
            return best
        self._steps_off += 1
        probe = max((k for k in self.choices if k), key=rate.get)
        extra = self._time[(bucket, probe)][0] / self._time[(bucket, 0)][0] - 1
        if self._steps_off % max(PROBE_INTERVAL, math.ceil(extra / PROBE_OVERHEAD)) == 0:
            return probe
        return 0

    def observe_verification(self, num_proposed: int, num_accepted: int) -> None:
        """One sequence's verification: tokens 1 … num_accepted accepted, the next (if proposed) rejected."""
        for j in range(1, min(num_accepted + 1, num_proposed) + 1):
            hit = 1.0 if j <= num_accepted else 0.0
            self.acceptance[j] += _EMA * (hit - self.acceptance[j])

    def observe_step(self, batch: int, k: int, seconds: float) -> None:
        """The wall time of a decode step of `batch` sequences that each verified k proposed tokens."""
        key = (_bucket(batch), k)
        if key not in self._warmed_up:  # the first such step may capture graphs or grow the allocator
            self._warmed_up.add(key)
            return
        mean, samples = self._time.get(key, (seconds, 0))
        weight = max(_EMA, 1 / (samples + 1))  # a plain mean until the moving average takes over
        self._time[key] = (mean + weight * (seconds - mean), samples + 1)
