"""Turn a batch of next-token logits into tokens, each row under its own sampling parameters.

Order per row (as vLLM): logit bias, penalties, min_tokens masking, the grammar's token bitmask, then greedy
argmax, or temperature → min-p → top-k → top-p (on what min-p and top-k left) → a draw. Draws use one generator
per seeded request, so a seeded request samples the same tokens whatever else shares its batch. Logprobs come
from the model's raw distribution.

Everything stays on the logits' device, and the host waits for the GPU once, to read the chosen tokens
(and their logprobs): every decision that depends on the parameters is taken on the host from them.
In a row of a 16-bit model, top-k up to 1,024 takes its candidates from `topk`, and top-p and larger top-k
count how many tokens carry each 16-bit logit (`glimmer.model.kernels.pattern_counts`), with the few logits its
penalties or logit bias moved off their 16-bit values taken apart and merged in (up to MAX_MOVED of them): no
sort of the vocabulary. Rows of float32 models with a top-p, and rows whose penalties may move more, sort it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from glimmer.engine.sampling_params import SamplingParams
from glimmer.model.kernels.pattern_counts import (
    cumsum_rows,
    pattern_counts,
    pattern_counts_and_moved,
    pattern_ranks,
    pattern_thresholds,
)


@dataclass(eq=False)
class PenaltyIds:
    """The ids a sequence's penalties read, kept across its steps, so that a step's work on the host follows the
    ids appended since the last rather than all of them: the output's as a growing int64 array, filled from
    `committed` (the sequence's own list of output ids, which only grows), and the prompt's ids within the
    vocabulary on the device, copied there once per device and vocabulary."""

    committed: list[int]
    _outputs: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    _filled: int = 0
    _prompts: dict[tuple[torch.device, int], torch.Tensor] = field(default_factory=dict)

    def outputs(self, ids: list[int]) -> np.ndarray:
        """`ids` as an int64 array: the committed ids (filled in since the last call) and whatever `ids` holds past
        them (tokens proposed for verification, which are not kept)."""
        n = len(self.committed)
        if n < self._filled:  # (the list only grows; a shorter one is refilled, not trusted)
            self._filled = 0
        if n > len(self._outputs):
            grown = np.empty(max(n, 2 * len(self._outputs), 64), dtype=np.int64)
            grown[:self._filled] = self._outputs[:self._filled]
            self._outputs = grown
        if n > self._filled:
            self._outputs[self._filled:n] = self.committed[self._filled:n]
            self._filled = n
        if len(ids) == n:
            return self._outputs[:n]
        return np.concatenate([self._outputs[:n], np.fromiter(ids[n:], dtype=np.int64, count=len(ids) - n)])

    def prompt_on(self, prompt: np.ndarray, vocab: int, device: torch.device) -> torch.Tensor:
        """The prompt's ids in [0, vocab) on `device`, copied once."""
        key = (device, vocab)
        if key not in self._prompts:
            self._prompts[key] = _in_vocabulary_on(prompt, vocab, device)
        return self._prompts[key]


@dataclass
class SamplingRow:
    """What the sampler needs to know about one sequence."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    # ids that may not be sampled yet (stop ids while fewer than min_tokens were generated)
    banned_ids: tuple[int, ...] = ()
    # the tokenizer's ids: logit rows from here on (a vocabulary padded to a multiple) are no token and are never
    # sampled; their logprobs stay in the raw distribution, as the reference computes it
    token_count: int | None = None
    # the prompt's ids as an int64 array, made once per sequence (`Sequence.prompt_id_array`); None: from prompt_ids
    prompt_ids_array: np.ndarray | None = None
    # the sequence's penalty ids kept across steps (`Sequence.penalty_ids`); None: made from the lists each step
    penalty_ids: PenaltyIds | None = None

    def prompt_array(self) -> np.ndarray:
        if self.prompt_ids_array is None:
            self.prompt_ids_array = np.fromiter(self.prompt_ids, dtype=np.int64, count=len(self.prompt_ids))
        return self.prompt_ids_array

    def output_array(self) -> np.ndarray:
        if self.penalty_ids is not None:
            return self.penalty_ids.outputs(self.output_ids)
        return np.fromiter(self.output_ids, dtype=np.int64, count=len(self.output_ids))

    def prompt_on(self, vocab: int, device: torch.device) -> torch.Tensor:
        """The prompt's ids in [0, vocab) on `device`: the copy `penalty_ids` keeps, else copied now."""
        if self.penalty_ids is not None:
            return self.penalty_ids.prompt_on(self.prompt_array(), vocab, device)
        return _in_vocabulary_on(self.prompt_array(), vocab, device)

    def penalized_ids_bound(self) -> int:
        """At most how many (row, id) its penalties touch: the output's ids and the pending token, and the prompt's
        where the repetition penalty reads them (0 without a penalty)."""
        if not self.params.uses_penalties:
            return 0
        prompt = len(self.prompt_ids) if self.prompt_ids_array is None else len(self.prompt_ids_array)
        return len(self.output_ids) + 1 + (prompt if self.params.repetition_penalty != 1 else 0)


@dataclass
class TokenLogprobs:
    """The chosen token's logprob and the top alternatives (id → logprob), most likely first."""

    token_id: int
    logprob: float
    top: dict[int, float]
    rank: int | None = None  # `token_ranks`: tokens at least as likely, itself included (padding rows never count)


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def _on(device: torch.device, host: torch.Tensor) -> torch.Tensor:
    """A small host tensor on `device`, copied without waiting for the GPU: through pinned memory on a GPU (from
    pageable memory the driver may stage the copy only once the stream's queued work, the step's forward, is done,
    and the host, which launches a step ahead of the one it reads, would stall there)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _in_vocabulary_on(ids: np.ndarray, vocab: int, device: torch.device) -> torch.Tensor:
    """The ids of `ids` in [0, vocab) as a device tensor, copied without waiting for the GPU."""
    return _on(device, torch.from_numpy(ids[(ids >= 0) & (ids < vocab)]))


def _ids_on(device: torch.device, ids: list[int] | set[int]) -> torch.Tensor:
    """A host list as a device index tensor, copied without waiting for the GPU."""
    return _on(device, torch.tensor(list(ids), dtype=torch.int64))


def _id_tensor(arrays: list[np.ndarray], vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ids of several rows as one (row, id) index pair on `device`: each array's ids in [0, vocab), tagged
    with the array's position."""
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    owners = np.repeat(np.arange(len(arrays), dtype=np.int64), lengths)
    valid = (ids >= 0) & (ids < vocab)
    if not valid.all():
        ids, owners = ids[valid], owners[valid]
    return _on(device, torch.from_numpy(owners)), _on(device, torch.from_numpy(ids))


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow], pending: torch.Tensor | None = None) -> None:
    """The repetition, frequency and presence penalties of every row that has one, as vLLM applies them, in place,
    on the ids they touch only (the output's and, where a repetition penalty reads them, the prompt's), in a few
    tensor operations per run of rows: no work per row on the device and nothing the size of the vocabulary.
    `pending`: (M,) a token per row chosen on the device that the host has not appended yet (a step launched
    ahead, lookahead.py); it counts as the row's last output token.

    Each touched (row, id) is gathered, penalized and written back; an id touched twice (a repeated output or prompt
    id) is written twice with the same value. The arithmetic per logit is that of penalizing every logit of the
    rows (repetition, then minus frequency × count + presence), so each touched logit gets the same bits; an
    untouched one, which that would only multiply by 1 and take 0 off, keeps its own (-0.0 included). Rows go in
    runs of at most PENALTY_PAIRS touched ids (a row alone past it), so the temporaries stay bounded however many
    rows read long prompts (speculative verification: k + 1 rows a sequence, each reading its prompt)."""
    run: list[int] = []
    pairs = 0
    for i, row in enumerate(rows):
        if not row.params.uses_penalties:
            continue
        touched = row.penalized_ids_bound()
        if run and pairs + touched > PENALTY_PAIRS:
            _penalize(logits, rows, run, pending)
            run, pairs = [], 0
        run.append(i)
        pairs += touched
    if run:
        _penalize(logits, rows, run, pending)


# penalized rows are worked on in runs of at most this many touched ids (about 70 bytes of temporaries each)
PENALTY_PAIRS = 1 << 22


def _penalize(logits: torch.Tensor, rows: list[SamplingRow], index: list[int], pending: torch.Tensor | None) -> None:
    """`_apply_penalties` of rows[i] for i in `index` (each with a penalty)."""
    vocab, device, dtype = logits.shape[1], logits.device, logits.dtype
    penalized = [rows[i] for i in index]
    where = _ids_on(device, index)
    owners, ids = _id_tensor([row.output_array() for row in penalized], vocab, device)  # owners: positions in `index`
    if pending is not None:
        owners = torch.cat([owners, torch.arange(len(index), device=device)])
        ids = torch.cat([ids, pending[where]])
    output_keys = owners * vocab + ids  # (row, id) as one integer

    def per_row(field: str) -> tuple[bool, torch.Tensor]:
        floats = [getattr(row.params, field) for row in penalized]
        return any(floats), _on(device, torch.tensor(floats, dtype=dtype))

    repeating = [j for j, row in enumerate(penalized) if row.params.repetition_penalty != 1]
    if repeating:  # the prompt's ids too, for the rows that read them
        prompt_owners, prompt_ids = _prompt_ids(penalized, repeating, vocab, device)
        owners, ids = torch.cat([owners, prompt_owners]), torch.cat([ids, prompt_ids])
    targets = (where[owners], ids)
    values = logits[targets]
    if repeating:
        _, repetition = per_row("repetition_penalty")
        penalty = repetition[owners]
        values = torch.where(values > 0, values / penalty, values * penalty)
    any_frequency, frequency = per_row("frequency_penalty")
    any_presence, presence = per_row("presence_penalty")
    if any_frequency or any_presence:
        # how often each touched id is among its row's output ids: a search in their sorted keys
        ordered, touched = output_keys.sort().values, owners * vocab + ids
        count = (torch.searchsorted(ordered, touched, right=True) - torch.searchsorted(ordered, touched)).to(dtype)
        values = values - (count * frequency[owners] + (count > 0).to(dtype) * presence[owners])
    logits[targets] = values


def _prompt_ids(rows: list[SamplingRow], which: list[int], vocab: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt ids in [0, vocab) of rows[j] for j in `which`, as an (owner j, id) pair on `device`, from the
    copies the rows' `penalty_ids` keep there (no work on the host that follows the prompts' length)."""
    kept = [rows[j].prompt_on(vocab, device) for j in which]
    lengths = [len(t) for t in kept]
    owners = torch.repeat_interleave(_ids_on(device, which), _ids_on(device, lengths), output_size=sum(lengths))
    return owners, torch.cat(kept)


# beyond this many candidates per row, a full sort is as cheap as topk
MAX_TOPK_CANDIDATES = 1024
# a row whose penalties and bias may move more logits than this sorts (their own sort nears the vocabulary's)
MAX_MOVED = 32768


def _filter(logits: torch.Tensor, rows: list[SamplingRow], keys: torch.Tensor | None = None,
            moved: bool = True) -> torch.Tensor:
    """min-p, top-k, then top-p (on the distribution the first two left, renormalized), as vLLM applies them to
    temperature-scaled logits; filtered entries become -inf.

    Each filter is a threshold on the row's logits: min-p keeps the tokens within -log(min_p) of the largest
    logit, top-k those at least the k-th largest, top-p those at least the last token of the shortest run of
    the most likely tokens whose mass reaches top_p. A token tied with the last one kept is kept too, whatever
    order a sort put the ties in (as vLLM's top-k keeps them).

    `keys`: the model's 16-bit logits of these rows, or None. Where they are given, a row with a top-p or a top-k
    over MAX_TOPK_CANDIDATES takes its thresholds from how many tokens carry each 16-bit value
    (`_thresholds_by_count`): a row whose logits were made of them by the temperature and -inf alone from the
    counts alone, one whose penalties or logit bias may have moved some (`moved_bound`, at most MAX_MOVED) from
    the counts of the rest and the moved logits merged; the other rows from their top candidates (`topk`) or a
    sort (`_thresholds_by_order`). Which way a row goes depends on the row alone, so its kept set does not depend
    on the rows beside it. `moved=False`: no penalty or bias was applied to these logits, whatever the rows ask
    (the drafter's proposals), so every row counts its logits as they are."""
    vocab = logits.shape[1]
    device = logits.device
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]
    by_k, by_p = any(k < vocab for k in ks), any(r.params.top_p < 1 for r in rows)
    by_min_p = any(r.params.min_p > 0 for r in rows)
    if not (by_k or by_p or by_min_p):
        return logits
    floor = torch.full((len(rows),), float("-inf"), dtype=logits.dtype, device=device)
    if by_min_p:
        # below min_p times the most likely token's probability: more than -log(min_p) below its logit
        min_p = _on(device, torch.tensor([r.params.min_p for r in rows], dtype=logits.dtype))
        floor = torch.maximum(floor, logits.amax(dim=-1) + torch.log(min_p))
    if by_k or by_p:
        counted, merged, ordered = [], [], []
        bounds = [moved_bound(r) if moved else 0 for r in rows]
        for i, (k, r) in enumerate(zip(ks, rows, strict=True)):
            if not (k < vocab or r.params.top_p < 1):
                continue
            if keys is not None and bounds[i] <= MAX_MOVED and (r.params.top_p < 1 or MAX_TOPK_CANDIDATES < k < vocab):
                (merged if bounds[i] else counted).append(i)
            else:
                ordered.append(i)
        merged_capacity = max((bounds[i] for i in merged), default=0)
        for group, find in ((counted, partial(_thresholds_by_count, capacity=0)),
                            (merged, partial(_thresholds_by_count, capacity=merged_capacity)),
                            (ordered, _thresholds_by_order)):
            if len(group) == len(rows):
                floor = find(logits, keys, rows, ks, floor)
            elif group:
                index = _ids_on(device, group)
                floor[index] = find(logits[index], None if keys is None else keys[index], [rows[i] for i in group],
                                    [ks[i] for i in group], floor[index])
    return logits.masked_fill(logits < floor[:, None], float("-inf"))


def moved_bound(row: SamplingRow) -> int:
    """At most how many of this row's logits its logit bias and penalties moved off the model's (scaled by the
    temperature, with -inf written over some): the biased ids, the output's (and a pending token's) where a
    penalty reads them, the prompt's where the repetition penalty does. 0: the logits are the model's."""
    return len(row.params.logit_bias or ()) + row.penalized_ids_bound()


def _thresholds_by_order(logits: torch.Tensor, keys: torch.Tensor | None, rows: list[SamplingRow], ks: list[int],
                         floor: torch.Tensor) -> torch.Tensor:
    """`floor` raised by top-k and top-p from the rows' most likely tokens in order: the top candidates (`topk`)
    when no row needs more than MAX_TOPK_CANDIDATES of them, else a sort of the vocabulary."""
    vocab = logits.shape[1]
    device = logits.device
    width = max(ks)  # every row here has a top-k (k < vocab) or a top-p (k = vocab: the whole order)
    if width <= MAX_TOPK_CANDIDATES:
        ordered, order = logits.topk(width, dim=-1)
    else:
        ordered, order = logits.sort(dim=-1, descending=True)
    if any(k < vocab for k in ks):
        top_k = _on(device, torch.tensor([min(k, ordered.shape[1]) for k in ks]))
        kth = ordered.gather(1, (top_k - 1)[:, None])[:, 0]
        has_k = _on(device, torch.tensor([k < vocab for k in ks]))
        floor = torch.where(has_k, torch.maximum(floor, kth), floor)
    if any(r.params.top_p < 1 for r in rows):
        floor = torch.maximum(floor, _top_p_floor(logits, ordered, order, floor, rows))
    return floor


def _top_p_floor(logits: torch.Tensor, ordered: torch.Tensor, order: torch.Tensor, floor: torch.Tensor,
                 rows: list[SamplingRow]) -> torch.Tensor:
    """Each row's top-p threshold (-inf for a row without top-p): the smallest of its most likely tokens
    (`ordered` descending, their ids `order`) up to and including the first whose cumulative mass reaches top_p,
    in the distribution of the tokens at least `floor` (what min-p and top-k kept), renormalized. That
    distribution is a softmax over the whole vocabulary (`ordered` may hold only the top candidates), row by row,
    so a row's threshold does not depend on the rows beside it."""
    top_p = _on(logits.device, torch.tensor([r.params.top_p for r in rows], dtype=logits.dtype))
    kept = torch.softmax(logits.masked_fill(logits < floor[:, None], float("-inf")), dim=-1)
    mass = cumsum_rows(kept.gather(1, order))
    reached = mass >= top_p[:, None]
    last = torch.where(reached.any(dim=-1), reached.to(torch.int8).argmax(dim=-1), ordered.shape[1] - 1)
    threshold = ordered.gather(1, last[:, None])[:, 0]
    return torch.where(top_p < 1, threshold, float("-inf"))


def _thresholds_by_count(logits: torch.Tensor, keys: torch.Tensor, rows: list[SamplingRow], ks: list[int],
                         floor: torch.Tensor, capacity: int) -> torch.Tensor:
    """`floor` raised by top-k and top-p, found from how many tokens carry each 16-bit logit
    (`glimmer.model.kernels.pattern_counts`) instead of an order of the tokens; `capacity`: at most how many
    logits of a row were moved off their 16-bit values (0: none was)."""
    device, vocab = logits.device, logits.shape[1]
    temps = _on(device, torch.tensor([r.params.temperature for r in rows]))
    moved = None
    if capacity:
        counts, moved = pattern_counts_and_moved(keys, logits, temps, capacity)
    else:
        counts = pattern_counts(keys, logits)
    top_k = _on(device, torch.tensor([k if k < vocab else vocab + 1 for k in ks])) if any(
        k < vocab for k in ks) else None
    top_p = _on(device, torch.tensor([r.params.top_p for r in rows], dtype=logits.dtype)) if any(
        r.params.top_p < 1 for r in rows) else None
    return pattern_thresholds(counts, pattern_ranks(keys.dtype, device)[1], temps, floor, top_k, top_p, moved)


def padding_start(rows: list[SamplingRow], vocab: int) -> int:
    """The first logit column that is no token of the rows' tokenizer (`vocab` when none is padding)."""
    return min((r.token_count for r in rows if r.token_count is not None), default=vocab)


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(M, ceil(V/32)) int32, bit j of word w allowing id 32w+j (llguidance's layout) → (M, V) bool."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def _apply_logit_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    for i, row in enumerate(rows):
        if row.params.logit_bias:
            ids, biases = zip(*row.params.logit_bias.items(), strict=True)
            logits[i, _ids_on(logits.device, list(ids))] += _on(logits.device, torch.tensor(biases, dtype=logits.dtype))


def _apply_allowed_token_ids(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """-inf for every id a row's `allowed_token_ids` leaves out (vLLM applies it to the biased, penalized logits)."""
    for i, row in enumerate(rows):
        if row.params.allowed_token_ids:
            keep = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
            keep[_ids_on(logits.device, row.params.allowed_token_ids)] = True
            logits[i].masked_fill_(~keep, float("-inf"))


def constrain(logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: torch.Tensor | None = None,
              pending: torch.Tensor | None = None, in_place: bool = False, penalties: bool = True) -> torch.Tensor:
    """Logit bias, penalties, allowed ids, banned ids, the vocabulary's padding rows and the grammar's bitmask
    applied to float logits (a copy when any applies, unless `in_place`: the caller's own copy, a widening, may be
    changed), in vLLM's order: the bias first, then the penalties. `pending`: see `_apply_penalties`.
    `penalties=False`: all but the penalties (the drafter's proposals, whose earlier tokens are not chosen yet)."""
    padding_from = padding_start(rows, logits.shape[1])
    if padding_from < logits.shape[1] or any((penalties and r.params.uses_penalties) or r.banned_ids
                                             or r.params.logit_bias or r.params.allowed_token_ids for r in rows):
        if not in_place:
            logits = logits.clone()
        _apply_logit_bias(logits, rows)
        if penalties:
            _apply_penalties(logits, rows, pending)
        _apply_allowed_token_ids(logits, rows)
        for i, row in enumerate(rows):
            if row.banned_ids:
                logits[i, _ids_on(logits.device, row.banned_ids)] = float("-inf")
        logits[:, padding_from:] = float("-inf")
    if token_bitmask is not None:
        allowed = unpack_token_bitmask(token_bitmask.to(logits.device, non_blocking=True), logits.shape[1])
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits


def widen(logits: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """`logits` as float32, and whether that is a copy (of 16-bit logits), which `constrain` may change in place;
    float32 logits are the caller's own tensor."""
    widened = logits.float()
    return widened, widened is not logits


def sampling_probs(logits: torch.Tensor, rows: list[SamplingRow], keys: torch.Tensor | None = None,
                   moved: bool = True) -> torch.Tensor:
    """The distribution each (non-greedy) row samples from: temperature, then min-p, top-k, top-p. `keys` and
    `moved`: see `_filter`."""
    temps = _on(logits.device, torch.tensor([r.params.temperature for r in rows]))
    return torch.softmax(_filter(logits / temps[:, None], rows, keys, moved), dim=-1)


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of (unnormalized, non-negative) `probs`, each from its generator (`generators`, one per
    row; rows may share one).

    Exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p / sum(p). The generator most rows share
    (the engine's one for unseeded requests) fills the whole noise tensor in one launch; every other row is then
    drawn from its own, so a seeded row's noise depends only on its generator.

    A draw of exactly 0 (about 2**-53 per element) is raised to the dtype's smallest normal number: p / 0 was
    inf, or NaN for a token filtered out (p = 0), which argmax takes as the largest, so a filtered token could
    win. Every other draw, and so every seeded result without a zero, is unchanged.
    """
    noise = torch.empty_like(probs)
    shared, rows_sharing = _most_shared(generators)
    if rows_sharing > 1:
        noise.exponential_(generator=shared)
    for j, generator in enumerate(generators):
        if rows_sharing == 1 or generator is not shared:
            noise[j].exponential_(generator=generator)
    return (probs / noise.clamp_min_(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)


# torch's CPU generator seeds mt19937 with the low 32 bits of the seed only
CPU_SEED_RANGE = 2**32


def seeded_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` seeded with `seed`, an integer in [-2**63, 2**64) (SamplingParams.seed + i, or the
    engine's seed), whose stream differs from those of the seeds near it.

    CUDA's Philox generator takes all 64 bits of a seed; the CPU's mt19937 keeps only the low 32, so on the CPU 5,
    5 + 2**32 and 5 + 2**63 drew the same tokens. There a seed outside [0, 2**32) is mixed into 32 bits first
    (splitmix64's finalizer over its 64-bit two's complement), and a seed inside keeps the stream it always had.
    """
    if device.type == "cpu" and not 0 <= seed < CPU_SEED_RANGE:
        seed = _splitmix64(seed % 2**64) >> 32
    return torch.Generator(device).manual_seed(seed)


def _splitmix64(value: int) -> int:
    """splitmix64's output function (Steele, Lea, Flood 2014): a bijection of [0, 2**64) whose every output bit
    depends on every input bit."""
    mask = 2**64 - 1
    value = (value + 0x9E3779B97F4A7C15) & mask
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & mask
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & mask
    return value ^ (value >> 31)


def _most_shared(generators: list[torch.Generator | None]) -> tuple[torch.Generator | None, int]:
    """The generator most rows use (None: torch's default) and how many rows use it."""
    counts: dict[int, list] = {}
    for generator in generators:
        counts.setdefault(id(generator), [generator, 0])[1] += 1
    generator, count = max(counts.values(), key=lambda entry: entry[1], default=(None, 0))
    return generator, count


def chosen_logprobs(
    raw_logprobs: torch.Tensor, tokens: torch.Tensor, ks: list[int | None], token_count: int | None = None
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """The tokens, and each row's chosen-token logprob, rank and top-k alternatives (None where k is None), in one
    read of the device."""
    fields = logprob_tensors(raw_logprobs, tokens, ks, token_count)
    token_list, *host = (t.tolist() for t in (tokens, *fields))
    return token_list, token_logprobs(token_list, *host, ks)


def logprob_tensors(raw_logprobs: torch.Tensor, tokens: torch.Tensor, ks: list[int | None],
                    token_count: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the device: each row's chosen-token logprob, its top max(ks) + 1 logprobs and their ids (`ranked_top`
    takes k of them), and the chosen token's rank (`token_ranks`). Alternatives and ranks come from the tokenizer's
    ids only (the first `token_count` columns): the rows a vocabulary is padded with are no token, though their
    logprobs stay in the raw distribution."""
    chosen = raw_logprobs.gather(1, tokens[:, None])[:, 0]
    real = raw_logprobs if token_count is None else raw_logprobs[:, :token_count]
    top_values, top_ids = real.topk(min(max(k or 0 for k in ks) + 1, real.shape[1]), dim=-1)
    return chosen, top_values, top_ids, token_ranks(real, chosen[:, None])


def token_ranks(logprobs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Each row's rank of its token of logprob `chosen` (one column): vLLM's, the number of tokens at least as likely,
    the token included (vllm/v1/sample/ops/logprobs.py), so 1 for the only most likely token and, among tokens of
    equal logprob, the last place of their run (four tied for the first place are each of rank 4)."""
    return (logprobs >= chosen).sum(dim=-1)


def token_logprobs(tokens: list[int], chosen: list[float], top_values: list[list[float]], top_ids: list[list[int]],
                   ranks: list[int], ks: list[int | None]) -> list[TokenLogprobs | None]:
    """`logprob_tensors`' fields, read to the host, as one entry per row (None where k is None)."""
    out: list[TokenLogprobs | None] = [None] * len(ks)
    for i, k in enumerate(ks):
        if k is None:
            continue
        top = ranked_top(tokens[i], chosen[i], ranks[i], top_ids[i][:k + 1], top_values[i][:k + 1], k)
        out[i] = TokenLogprobs(token_id=tokens[i], logprob=chosen[i], top=top, rank=ranks[i])
    return out


def ranked_top(token_id: int, logprob: float, rank: int, ids: list[int], values: list[float],
               k: int) -> dict[int, float]:
    """The `k` most likely alternatives, from `ids` (the k + 1 most likely, as topk gives them), with the token at
    its `rank` (`token_ranks`) where that is at most k. Among tokens of equal logprob topk's order, and which of them
    it keeps at its end, is arbitrary: the token sampled (or scored) comes last among its equals, so that its rank
    is its place in `top` (and in vLLM's dict of them) and the tokens before it are those at least as likely. The
    (k + 1)-th is the one that takes its place where a tie ranks it past k though topk kept it."""
    top = [(t, v) for t, v in zip(ids, values, strict=True) if t != token_id]
    if rank <= k:
        top.insert(rank - 1, (token_id, logprob))
    return dict(top[:k])


def sample(logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: torch.Tensor | None = None) -> SampleResult:
    """logits: (M, V), one row per sequence that needs a token this step.

    token_bitmask: (M, ceil(V/32)) int32 of the ids each row may sample (all bits set for a free row), or None.
    """
    tokens, fields = sample_on_device(logits, rows, token_bitmask)
    return sample_result([t.tolist() for t in (tokens, *fields)], rows)


def sample_on_device(logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: torch.Tensor | None = None,
                     pending: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """`sample` without reading the device: the chosen tokens, and `logprob_tensors`' fields when a row asks
    for logprobs (else none). `pending`: see `_apply_penalties`."""
    ks = [r.params.logprobs for r in rows]
    if token_bitmask is None and all(k is None for k in ks) and all(plain_greedy(r) for r in rows):
        return greedy_tokens(logits, rows), ()
    tokens = choose_tokens(logits, rows, token_bitmask, pending)
    if all(k is None for k in ks):
        return tokens, ()
    logits = logits.float()
    return tokens, logprob_tensors(torch.log_softmax(logits, dim=-1), tokens, ks, padding_start(rows, logits.shape[1]))


def sample_result(host: list[list], rows: list[SamplingRow]) -> SampleResult:
    """`sample_on_device`'s tensors, read to the host (tokens first), as a SampleResult."""
    tokens, *fields = host
    ks = [r.params.logprobs for r in rows]
    return SampleResult(token_ids=tokens,
                        logprobs=token_logprobs(tokens, *fields, ks) if fields else [None] * len(rows))


def plain_greedy(row: SamplingRow) -> bool:
    """A greedy row that nothing but the vocabulary's padding constrains (no bias, penalty, allowed or banned id)."""
    p = row.params
    return p.greedy and not (p.uses_penalties or row.banned_ids or p.logit_bias or p.allowed_token_ids)


def greedy_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """`choose_tokens` of `plain_greedy` rows without a grammar: the argmax of the logits in their own dtype (a
    widening to float32 keeps their order) over the tokenizer's ids, read in place. The same tokens, without the
    float32 copy, the clone and the -inf fill of the padding rows (at 256 rows of the 30B's vocabulary, 0.3 GB of
    memory traffic a step)."""
    return logits[:, :padding_start(rows, logits.shape[1])].argmax(dim=-1)


def choose_tokens(logits: torch.Tensor, rows: list[SamplingRow], token_bitmask: torch.Tensor | None = None,
                  pending: torch.Tensor | None = None) -> torch.Tensor:
    """The chosen token of each row, as a device tensor (nothing is read back): what `sample` reads. `logits`
    in the model's dtype or float32; `pending`: see `_apply_penalties`."""
    widened, copied = widen(logits)
    constrained = constrain(widened, rows, token_bitmask, pending, in_place=copied)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    if not random_rows:
        return constrained.argmax(dim=-1)
    tokens = torch.empty(len(rows), dtype=torch.int64, device=constrained.device)
    if greedy:
        greedy_index = _ids_on(constrained.device, greedy)
        tokens[greedy_index] = constrained[greedy_index].argmax(dim=-1)
    sub_rows = [rows[i] for i in random_rows]
    every_row = len(random_rows) == len(rows)
    index = None if every_row else _ids_on(constrained.device, random_rows)
    keys = None
    if logits.dtype in (torch.bfloat16, torch.float16):
        keys = logits if every_row else logits[index]  # `_filter` counts them for rows with a top-p
    chosen = draw(sampling_probs(constrained if every_row else constrained[index], sub_rows, keys),
                  [r.generator for r in sub_rows])
    if every_row:
        return chosen
    tokens[index] = chosen
    return tokens


def scored_token_logprobs(logits: torch.Tensor, token_ids: list[int], k: int,
                          token_count: int | None = None) -> list[TokenLogprobs]:
    """Logprobs of given tokens (prompt scoring): row i's distribution, raw as for sampled tokens, evaluated at
    `token_ids[i]`, with its rank and `k` most likely alternatives among the tokenizer's ids (the first
    `token_count` columns, as `logprob_tensors`)."""
    raw = torch.log_softmax(logits.float(), dim=-1)
    real = raw if token_count is None else raw[:, :token_count]
    targets = torch.tensor(token_ids, dtype=torch.int64, device=raw.device)
    chosen = raw.gather(1, targets[:, None])
    ranks = token_ranks(real, chosen).tolist()
    values, ids = real.topk(min(k + 1, real.shape[1]), dim=-1)
    tops = [dict(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
    logprobs = chosen.squeeze(1).tolist()
    return [TokenLogprobs(token_id=t, logprob=lp, top=ranked_top(t, lp, rank, list(top), list(top.values()), k),
                          rank=rank)
            for t, lp, top, rank in zip(token_ids, logprobs, tops, ranks, strict=True)]
