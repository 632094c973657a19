"""The adaptive draft policy: how many tokens to propose, from measured acceptance and step times."""

from __future__ import annotations

import random

from glimmer.engine.draft_policy import PROBE_INTERVAL, PROBE_OVERHEAD, DraftPolicy


def _simulate(policy: DraftPolicy, batch: int, acceptance: float, step_time, steps: int = 200) -> list[int]:
    """Run the policy against a model world: each proposed token is accepted with probability `acceptance`
    (a seeded generator), a step of b sequences with k proposed tokens takes step_time(b, k) seconds."""
    world = random.Random(0)
    chosen = []
    for _ in range(steps):
        k = policy.choose(batch)
        chosen.append(k)
        for _ in range(batch if k else 0):
            accepted = 0
            while accepted < k and world.random() < acceptance:
                accepted += 1
            policy.observe_verification(k, accepted)
        policy.observe_step(batch, k, step_time(batch, k))
    return chosen


def memory_bound(batch: int, k: int) -> float:
    """A large model at small batches: reading the weights dominates; tokens are almost free."""
    return 0.013 + 0.00002 * batch * (1 + k) + (0.002 if k else 0)


def compute_bound(batch: int, k: int) -> float:
    """Large batches: every token costs its arithmetic (at 64 sequences a step of 16 tokens each costs 4.6x a
    step of one)."""
    return 0.010 + 0.00005 * batch * (1 + k)


def test_probes_cost_at_most_one_percent_where_a_proposing_step_is_expensive():
    def expensive_drafter(batch: int, k: int) -> float:
        return compute_bound(batch, k) + (0.02 if k else 0)  # a probe step costs ~2.7x a plain one

    for world in (compute_bound, expensive_drafter):
        chosen = _simulate(DraftPolicy(15), 64, 0.0, world, steps=600)[100:]
        overhead = sum(world(64, k) - world(64, 0) for k in chosen) / (len(chosen) * world(64, 0))
        assert any(chosen) and overhead <= PROBE_OVERHEAD + 0.003


def test_with_nothing_accepted_speculation_goes_off_and_is_probed_now_and_then():
    policy = DraftPolicy(15)
    chosen = _simulate(policy, 4, 0.0, memory_bound)
    settled = chosen[60:]
    assert policy.acceptance[1] < 0.05
    assert settled.count(0) >= len(settled) * (PROBE_INTERVAL - 1) / PROBE_INTERVAL - 1
    assert any(settled)  # the probes


def test_when_tokens_are_almost_free_it_proposes_the_most():
    policy = DraftPolicy(15)
    chosen = _simulate(policy, 1, 0.9, memory_bound)
    assert chosen[60:].count(15) > 0.9 * len(chosen[60:])


def test_in_a_compute_bound_batch_it_proposes_fewer():
    policy = DraftPolicy(15)
    chosen = _simulate(policy, 64, 0.75, compute_bound)
    settled = chosen[60:]
    assert all(0 < k < 15 for k in settled)
    assert _simulate(DraftPolicy(15), 64, 0.2, compute_bound)[60:].count(0) > 100  # and none when few pass


def test_the_first_step_of_a_choice_is_a_warm_up_and_not_measured():
    policy = DraftPolicy(4)
    policy.observe_step(8, 2, 100.0)  # e.g. a CUDA graph captured
    policy.observe_step(8, 2, 1.0)
    policy.observe_step(8, 2, 1.0)
    assert policy._time[(8, 2)] == (1.0, 2)


def test_disable_by_batch_size_and_the_always_policy():
    assert DraftPolicy(5, disable_by_batch_size=8).choose(9) == 0
    always = DraftPolicy(5, adaptive=False)
    for _ in range(3):
        always.observe_verification(5, 0)
    assert always.choose(100) == 5



def test_a_gain_within_the_margin_of_noise_leaves_speculation_off():
    """Every k > 0 would be 3% faster than none (here exactly; measured, such a gain is within the noise): not
    worth the risk of being slower, so only probes propose."""

    def marginal(batch: int, k: int) -> float:
        return 0.010 * (1 + k) / 1.03 if k else 0.010  # every proposed token accepted: 1 + k tokens per step

    chosen = _simulate(DraftPolicy(15), 1, 1.0, marginal, steps=400)
    assert sum(1 for k in chosen[100:] if k) <= 300 / PROBE_INTERVAL + 1


def test_deep_positions_are_not_taken_as_more_acceptable_than_earlier_ones():
    policy = DraftPolicy(15)
    for _ in range(50):  # nothing accepted: only the first position is ever measured
        policy.observe_verification(15, 0)
    assert policy.acceptance[1] < 0.01 and policy.acceptance[2] == 1.0
    assert policy.expected_tokens(15) < 1.01


def test_with_nothing_accepted_exploration_measures_only_the_smallest_choice():
    """A choice that cannot pay even at the cost of a cheaper measured one is never tried: exploring k = 15 in a
    compute-bound batch would cost several steps' worth for nothing."""
    for world, batch in ((compute_bound, 64), (memory_bound, 1)):
        policy = DraftPolicy(15)
        chosen = _simulate(policy, batch, 0.0, world, steps=300)
        assert set(chosen) == {0, 1}
        assert {k for _, k in policy._time} == {0, 1}


def test_a_choice_skipped_while_acceptance_was_low_is_tried_once_it_could_pay():
    policy = DraftPolicy(15)
    assert set(_simulate(policy, 1, 0.0, memory_bound, steps=100)) == {0, 1}
    later = _simulate(policy, 1, 0.95, memory_bound, steps=400)  # the probes see acceptance rise
    assert later[-100:].count(15) > 90
