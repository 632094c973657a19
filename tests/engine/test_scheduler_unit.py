"""The scheduler and block accounting alone, without a model (every step "computes" what it schedules)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from glimmer.engine.kv_cache_manager import FULL, KVCacheLayout, KVCacheManager
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.scheduler import RATIO_MIN, Scheduler, SchedulerConfig
from glimmer.engine.sequence import Sequence


def _seq(name: str, tokens: list[int], max_total: int) -> Sequence:
    return Sequence(name, tokens, SamplingParams(), frozenset(), max_total)


def _run_step(scheduler: Scheduler) -> list[str]:
    step = scheduler.schedule()
    for i, (seq, n) in enumerate(zip(step.seqs, step.num_new_tokens, strict=True)):
        sampled = step.samples(i)
        seq.num_computed_tokens += n
        scheduler.kv.register_computed_blocks(seq)
        if sampled:
            seq.output_token_ids.append(7)
            if seq.num_tokens >= seq.max_total_tokens:
                scheduler.finish(seq)
    return [s.request_id for s in step.seqs]


def test_a_waiting_sequence_never_holds_cached_blocks_that_block_the_queue():
    """B runs and fills the pool; A, waiting, finds cached prefix blocks but cannot run; B then preempts
    itself and goes back ahead of A. If A kept its cached blocks, B could never fit again: a stall."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=6, pages_per_block={FULL: 1}, sliding_window=64))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv)
    prefix = list(range(100, 108))  # two full blocks
    warm = _seq("warm", prefix + [1], max_total=10)
    scheduler.add(warm)
    while scheduler.has_work:
        _run_step(scheduler)
    b = _seq("B", list(range(200, 215)), max_total=24)  # needs all 6 blocks by the end
    scheduler.add(b)
    _run_step(scheduler)
    a = _seq("A", prefix + list(range(300, 313)), max_total=22)
    scheduler.add(a)
    for _ in range(200):
        if not scheduler.has_work:
            break
        _run_step(scheduler)
    assert not scheduler.has_work, "the scheduler stalled"
    assert b.is_finished and a.is_finished
    assert kv.usage()[FULL] == (0, 6)


def test_the_prefix_cache_hit_rate_counts_a_waiting_sequence_once_not_at_every_retry():
    """A waits behind B, looked up in the cache at every step it cannot run; the hit-rate counted each lookup, so
    the more steps a request waited, the more its cached blocks weighed (the metric followed the queue)."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=6, pages_per_block={FULL: 1}, sliding_window=64))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv)
    lookups: list[str] = []
    acquire = kv.acquire_cached_prefix
    kv.acquire_cached_prefix = lambda seq: lookups.append(seq.request_id) or acquire(seq)
    prefix = list(range(100, 108))  # two full blocks
    scheduler.add(_seq("warm", prefix + [1], max_total=10))
    while scheduler.has_work:
        _run_step(scheduler)
    scheduler.add(_seq("B", list(range(200, 215)), max_total=24))
    _run_step(scheduler)
    a = _seq("A", prefix + list(range(300, 313)), max_total=22)
    scheduler.add(a)
    while scheduler.has_work:
        _run_step(scheduler)
    assert lookups.count("A") > 1 and a.num_preemptions == 0  # A was looked up again while it waited
    (pool,) = kv.pools.values()
    # warm: 2 blocks queried, none found; B: 3, none; A, once: 5, none (B's blocks took the cached prefix's). While
    # A waited, 8 more lookups found some of the prefix and let it go: counted, they made it 6 hits in 50
    assert (pool.cache_queries, pool.cache_hits) == (2 + 3 + 5, 0) and a.num_cached_tokens == 0


def test_try_allocate_is_can_allocate_then_allocate():
    """The scheduler's one-pass allocation answers as can_allocate does and leaves the same blocks as
    allocate, through window releases, shared (cached) blocks and pools running dry."""
    import random

    from glimmer.engine.kv_cache_manager import SLIDING

    rng = random.Random(0)

    def manager() -> KVCacheManager:
        return KVCacheManager(KVCacheLayout(block_size=4, num_pages=36, pages_per_block={FULL: 1, SLIDING: 3},
                                            sliding_window=6))

    one, two = manager(), manager()
    seqs = {kv: [_seq(f"s{i}", list(range(1, 3 + 5 * i)), 80) for i in range(4)] for kv in (one, two)}
    refusals = 0
    for _ in range(300):
        i, n = rng.randrange(4), rng.choice([1, 1, 1, 2, 5, 9])
        a, b = seqs[one][i], seqs[two][i]
        if rng.random() < 0.05:  # finish and restart it: blocks go back to the pools
            one.free(a), two.free(b)
            a.num_computed_tokens = b.num_computed_tokens = 0
            continue
        expected = one.can_allocate(a, n)
        refusals += not expected
        if expected:
            one.allocate(a, n)
        assert two.try_allocate(b, n) == expected
        assert a.blocks == b.blocks
        assert one.usage() == two.usage()
        if expected:
            a.num_computed_tokens += n
            b.num_computed_tokens += n
    assert refusals > 10  # the pools did run dry


def test_sequences_are_found_by_identity_not_by_their_fields():
    """Two completions of one request (n > 1) have equal fields until their index: the scheduler must never
    take one for the other, nor compare whole prompts to tell them apart."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=8, pages_per_block={FULL: 1}, sliding_window=8))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv)
    first, second = _seq("r", [1, 2, 3], 10), _seq("r", [1, 2, 3], 10)
    assert first != second and len({first, second}) == 2
    scheduler.add(first)
    scheduler.add(second)
    scheduler.finish(second)
    assert scheduler.waiting == type(scheduler.waiting)([first]) and not second.blocks


def test_a_cached_prefix_under_pressure_loses_its_tail_blocks_first():
    """The pool evicts the least recently freed blocks first; a finished sequence frees its last block first, so
    each block taken from the cache shortens a cached prefix by one block instead of making it unreachable (a
    hit needs every block from the first on)."""
    prompt = list(range(100, 121))  # five full blocks and one token

    def cached_after_taking(blocks: int) -> int:
        kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=8, pages_per_block={FULL: 1}, sliding_window=64))
        first = _seq("first", prompt, max_total=30)
        kv.allocate(first, 20)
        first.num_computed_tokens = 20
        kv.register_computed_blocks(first)
        kv.free(first)
        kv.allocate(_seq("other", list(range(200, 200 + 4 * blocks)), max_total=40), 4 * blocks)
        return kv.acquire_cached_prefix(_seq("again", prompt, max_total=30))

    # 3 blocks were never used; then 1, 2 and 3 of the cached ones are taken
    assert [cached_after_taking(blocks) for blocks in (3, 4, 5, 6)] == [20, 16, 12, 8]


def test_the_prefix_cache_hit_rate_counts_a_request_once_not_again_when_preempted(greedy_admission):
    """B is preempted for lack of blocks and re-admitted: its second lookup (prompt and generated tokens) found the
    blocks it had just let go, so /metrics reported hits that no request's `cached_tokens` showed, more the more the
    server preempted, on prompts that shared nothing."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=8, pages_per_block={FULL: 1}, sliding_window=64))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv)
    a, b = _seq("A", list(range(100, 109)), max_total=24), _seq("B", list(range(200, 209)), max_total=24)
    scheduler.add(a)
    scheduler.add(b)
    while scheduler.has_work:
        _run_step(scheduler)
    assert b.num_preemptions > 0 and a.is_finished and b.is_finished
    (pool,) = kv.pools.values()
    assert (pool.cache_queries, pool.cache_hits) == (2 + 2, 0) and a.num_cached_tokens == b.num_cached_tokens == 0


def _drive_to_end(scheduler: Scheduler, steps: int = 5000) -> int:
    """Run the scheduler until it has no work; returns the positions computed (recomputation included)."""
    computed = 0
    for _ in range(steps):
        if not scheduler.has_work:
            return computed
        step = scheduler.schedule()
        for i, (seq, n) in enumerate(zip(step.seqs, step.num_new_tokens, strict=True)):
            sampled = step.samples(i)
            seq.num_computed_tokens += n
            computed += n
            scheduler.kv.register_computed_blocks(seq)
            if sampled:
                seq.output_token_ids.append(7)
                if seq.num_tokens >= seq.max_total_tokens:
                    scheduler.finish(seq)
    raise AssertionError("the scheduler stalled")


def test_preemption_and_readmission_are_first_come_first_served_so_later_short_requests_never_starve_a_long_one(
        greedy_admission):
    """A long request, then a short one arriving every other step, in pages for the long one and a short one at
    their full lengths; admitted without room kept for growth, so the shorts are preempted as the long one grows.
    As vLLM's scheduler (FCFS, recompute), after every step no sequence runs while one that arrived before it waits:
    the newest running sequence is the one preempted, and a preempted one goes back ahead of every later arrival.
    So the long request, the oldest, is never preempted and finishes within its own steps, and every short one
    finishes too."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=26, pages_per_block={FULL: 1}, sliding_window=128))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=80), kv)
    long = _seq("long", list(range(10, 18)), max_total=80)  # 20 pages at the end
    arrival = {id(long): 0}
    scheduler.add(long)
    shorts, long_finished_at = [], None
    for step in range(400):
        if not scheduler.has_work:
            break
        if step % 2 == 0 and len(shorts) < 30:
            shorts.append(_seq(f"s{len(shorts)}", list(range(100 + step, 110 + step)), max_total=24))  # 6 pages
            arrival[id(shorts[-1])] = len(arrival)
            scheduler.add(shorts[-1])
        _run_step(scheduler)
        if scheduler.running and scheduler.waiting:
            newest_running = max(arrival[id(seq)] for seq in scheduler.running)
            oldest_waiting = min(arrival[id(seq)] for seq in scheduler.waiting)
            assert newest_running < oldest_waiting, f"step {step}: a request runs while an earlier one waits"
        if long.is_finished and long_finished_at is None:
            long_finished_at = step
    assert not scheduler.has_work and long.is_finished and all(seq.is_finished for seq in shorts)
    # its prefill step and 71 decode steps, one every step: it never waited
    assert long.num_preemptions == 0 and long_finished_at == 71 and scheduler.num_preemptions > 0
    assert kv.pages.num_free_pages == kv.pages.num_pages


@pytest.mark.parametrize("draft_blocks", [None, 4 * 20], ids=["pages", "drafter-blocks-scarcer"])
def test_admission_leaves_room_for_the_running_sequences_to_grow(draft_blocks):
    """32 requests of 40 prompt and 40 generated positions in pages for 9 of them at their full length. Admitting
    whatever fitted at the moment filled the cache with prompts, and a preempted sequence came straight back, prefilled
    and was preempted again as the others grew: 91 preemptions and 64% of the positions computed again. With room
    kept for the expected growth: 1 and 2.4%.

    Speculative decoding's drafter context has a pool of its own, and past the target's sliding window it can hold
    fewer sequences than the target's pages (glimmer-nano with its drafter at 4,096 positions: 3.6 against 8.1). With
    the drafter's blocks for 4 of the requests, admission counted the target's pages only and the drafter's pool
    thrashed (49 preemptions, 42% computed again); room is kept in every pool: 1 and 2.2%."""
    from glimmer.engine.kv_cache_manager import SLIDING

    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=9 * (20 + 3 * 3), pages_per_block={FULL: 1, SLIDING: 3},
                                      sliding_window=8, draft_blocks=draft_blocks))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=64, max_model_len=80), kv)
    for i in range(32):
        scheduler.add(_seq(f"s{i}", list(range(100 * i, 100 * i + 40)), max_total=80))
    computed = _drive_to_end(scheduler)
    assert scheduler.num_preemptions <= 5
    assert computed / (32 * 79) - 1 < 0.10
    assert all(used == 0 for used, _ in kv.usage().values())
    assert kv.pages.num_free_pages == kv.pages.num_pages


def test_a_preemption_makes_admission_reserve_all_expected_growth_and_quiet_steps_relax_it():
    from glimmer.engine import scheduler as scheduling

    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=12, pages_per_block={FULL: 1}, sliding_window=64))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv)
    assert scheduler.growth_ratio == scheduling.RATIO_INITIAL
    scheduler.add(_seq("a", list(range(10, 18)), max_total=40))
    scheduler.schedule()
    assert scheduler.growth_ratio == scheduling.RATIO_INITIAL - scheduling.RATIO_DECAY
    scheduler.growth_ratio = scheduling.RATIO_MIN  # admit as if nothing were expected to grow
    scheduler.add(_seq("b", list(range(20, 28)), max_total=40))
    scheduler.add(_seq("c", list(range(30, 38)), max_total=40))
    _drive_to_end(scheduler)
    assert scheduler.num_preemptions > 0 and scheduler.growth_ratio > 0.9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_cache_that_holds_one_sequence_at_max_model_len_serves_every_request(seed):
    """Pages for exactly one sequence at max_model_len (a last chunk of fewer pages among them), room kept for growth
    as the engine keeps it: requests running to max_model_len, others of one token, prompts sharing prefixes (their
    sliding blocks found as cached chunks), twins of one prompt (n > 1), all arriving at once. Every request
    finishes; at every step no page is in two live blocks but a shared cached one, each block's reference count is
    its holders and the usage fraction lies in [0, 1]; afterwards every page is free and the usage is 0."""
    from glimmer.engine.kv_cache_manager import SLIDING

    rng = random.Random(seed)
    max_len, chunk = 44, 3
    layout = KVCacheLayout(block_size=4, num_pages=0, pages_per_block={FULL: 1, SLIDING: chunk}, sliding_window=6)
    needs = KVCacheManager(layout).blocks_needed_for(max_len)
    num_pages = needs[FULL] + chunk * needs[SLIDING]  # 11 + 3 x 3: a last chunk of two pages
    assert num_pages % chunk
    kv = KVCacheManager(dataclasses.replace(layout, num_pages=num_pages))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=rng.choice([5, 64]),
                                          max_model_len=max_len), kv)
    shared = [rng.randrange(100, 200) for _ in range(max_len)]
    seqs = []
    for i in range(24):
        prompt = shared[: rng.randrange(1, 30)] + [rng.randrange(100, 200) for _ in range(rng.randrange(0, 3))]
        max_total = rng.choice([max_len, len(prompt) + 1, len(prompt) + rng.randrange(1, max_len - len(prompt) + 1)])
        for twin in range(rng.choice([1, 1, 2])):
            seqs.append(_seq(f"s{i}-{twin}", list(prompt), max_total=min(max_total, max_len)))
            scheduler.add(seqs[-1])
    for _ in range(20_000):
        if not scheduler.has_work:
            break
        _run_step(scheduler)
        holders: dict[tuple[str, int], int] = {}
        for seq in scheduler.running:
            for group, held in seq.blocks.items():
                for block in filter(lambda b: b is not None, held):
                    holders[group, block] = holders.get((group, block), 0) + 1
        pages: list[int] = []
        for (group, block), count in holders.items():
            assert kv.pages.ref_counts[block] == count
            pages.extend(range(block, block + kv.pools[group].pages_per_block))
        assert len(pages) == len(set(pages)) == num_pages - kv.pages.num_free_pages
        assert all(page < num_pages for page in pages)  # none in the missing pages of the last chunk
        assert 0 <= kv.usage_fraction() <= 1
    assert not scheduler.has_work and all(seq.is_finished for seq in seqs)
    assert kv.pages.num_free_pages == num_pages and kv.usage_fraction() == 0
    assert all(used == 0 for used, _ in kv.usage().values())


def test_a_request_kept_waiting_for_the_others_growth_says_how_many_pages_were_kept():
    """The reserve can keep a request waiting while pages are free: the scheduler reports the pages it kept
    (`/metrics` glimmer_kv_pages_reserved), and 0 once nothing waits for that reason."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=14, pages_per_block={FULL: 1}, sliding_window=64))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=56), kv)
    scheduler.add(_seq("long", list(range(10, 18)), max_total=56))  # 3 pages after its first step, up to 14
    _run_step(scheduler)
    scheduler.add(_seq("next", list(range(30, 38)), max_total=20))
    _run_step(scheduler)
    assert [s.request_id for s in scheduler.running] == ["long"] and kv.pages.num_free_pages >= 3
    assert scheduler.reserved_pages > 0
    while scheduler.running:
        _run_step(scheduler)
    assert [s.request_id for s in scheduler.running] == [] and scheduler.reserved_pages == 0


@pytest.mark.parametrize("leaving", [["next"], ["long", "next"]])
def test_pages_kept_for_a_request_that_leaves_the_queue_are_no_longer_reported(leaving):
    """A request kept waiting by the reserve that is aborted (its client left) takes the report with it: an engine
    whose every request was aborted takes no more steps, and `/metrics` said pages were kept for nobody, idle."""
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=14, pages_per_block={FULL: 1}, sliding_window=64))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=56), kv)
    seqs = {"long": _seq("long", list(range(10, 18)), max_total=56), "next": _seq("next", list(range(30, 38)),
                                                                                  max_total=20)}
    scheduler.add(seqs["long"])
    _run_step(scheduler)
    scheduler.add(seqs["next"])
    _run_step(scheduler)
    assert scheduler.reserved_pages > 0
    for name in leaving:
        scheduler.finish(seqs[name])
    assert scheduler.reserved_pages == 0
    assert scheduler.has_work == ("long" not in leaving)


class _LaggingDrafter:
    """A drafter whose context is written `lag` positions behind the target's until a sequence ends."""

    def __init__(self, lag: int):
        self.lag = lag
        self.completed: list[str] = []
        self.released: list[str] = []

    def context_complete_through(self, seq: Sequence) -> int:
        return seq.num_computed_tokens - self.lag

    def complete_full_blocks(self, seq: Sequence, block_size: int) -> None:
        self.completed.append(seq.request_id)
        self.lag = 0

    def release(self, seq: Sequence) -> None:
        self.released.append(seq.request_id)


def _scheduler(drafter: _LaggingDrafter | None = None) -> Scheduler:
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=16, pages_per_block={FULL: 1}, sliding_window=64))
    return Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv, drafter)


def test_postprocess_offers_the_computed_blocks_and_retires_what_ended_with_its_blocks_cached():
    scheduler = _scheduler()
    going, ending = _seq("going", list(range(100, 109)), 20), _seq("ending", list(range(200, 211)), 20)
    scheduler.add(going)
    scheduler.add(ending)
    step = scheduler.schedule()
    step.commit(step.num_new_tokens)
    assert (going.num_computed_tokens, ending.num_computed_tokens) == (9, 11)
    ending.output_token_ids.append(7)  # the sampled token completes its third block
    ending.num_computed_tokens += 1  # (as the next step would compute it)
    scheduler.postprocess(step, [ending])
    assert going.num_registered_blocks == 2 and scheduler.running == [going]
    assert ending.is_finished and not ending.blocks
    assert scheduler.kv.acquire_cached_prefix(_seq("again", list(range(200, 211)) + [7, 8], 20)) == 12


def test_postprocess_does_not_complete_the_drafter_context_of_a_failed_request():
    drafter = _LaggingDrafter(lag=2)
    scheduler = _scheduler(drafter)
    seq = _seq("failed", list(range(200, 209)), 20)
    scheduler.add(seq)
    step = scheduler.schedule()
    step.commit(step.num_new_tokens)
    scheduler.postprocess(step, [seq], failed={"failed"})
    assert seq.is_finished and not seq.blocks
    assert drafter.completed == [] and drafter.released == ["failed"]
    assert scheduler.kv.acquire_cached_prefix(_seq("again", list(range(200, 209)), 20)) == 4  # the drafter's 7


def test_blocks_wait_for_the_drafters_context_and_an_ending_sequence_completes_it():
    drafter = _LaggingDrafter(lag=2)
    scheduler = _scheduler(drafter)
    going, ending = _seq("going", list(range(100, 109)), 20), _seq("ending", list(range(200, 209)), 20)
    scheduler.add(going)
    scheduler.add(ending)
    step = scheduler.schedule()
    step.commit(step.num_new_tokens)
    scheduler.postprocess(step, [ending])
    assert going.num_registered_blocks == 1  # 9 computed, the drafter's 7: one full block complete in both
    assert drafter.completed == ["ending"] and drafter.released == ["ending"]
    assert scheduler.kv.acquire_cached_prefix(_seq("again", list(range(200, 209)), 20)) == 8


def test_a_preempted_or_finished_sequence_drops_its_drafter_context():
    drafter = _LaggingDrafter(lag=0)
    kv = KVCacheManager(KVCacheLayout(block_size=4, num_pages=4, pages_per_block={FULL: 1}, sliding_window=64))
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64), kv, drafter)
    scheduler.growth_ratio = RATIO_MIN  # both are admitted into the pool's four pages
    first, second = _seq("first", list(range(100, 106)), 16), _seq("second", list(range(200, 206)), 16)
    scheduler.add(first)
    scheduler.add(second)
    assert scheduler.schedule().seqs == [first, second]
    for seq in (first, second):
        seq.output_token_ids += [1, 2, 3]
        seq.num_computed_tokens = 8  # its two blocks computed: its next token needs a third, which only one can have
    step = scheduler.schedule()
    assert step.preempted == [second] and drafter.released == ["second"]
    scheduler.finish(first)
    assert drafter.released == ["second", "first"]
