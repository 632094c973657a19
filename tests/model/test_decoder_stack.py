"""The C decoder stack (glimmer/model/kernels/decoder_stack.py) against its torch reference, the same layers op by op
through each op's reference: ragged decode batches across block and window boundaries, tables that start past
position 0, poisoned unused cache slots, batches past the product's eight-row blocks, odd widths, biases, captured
layers; its product alone against F.linear; indices refused before anything is written; which steps it takes."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from glimmer.model.context import ForwardContext
from glimmer.model.kernels import cpu
from glimmer.model.kernels.decoder_stack import (
    DecoderStack,
    StackShape,
    TeamSize,
    decoder_stack_torch,
    probe_cpu,
    random_stack,
    stack_linear,
)
from glimmer.model.kernels.logits import softcapped_logits_cpu
from glimmer.model.layers import RotaryTable

sys.path.insert(0, str(Path(__file__).parent))
from paged_cases import make_case  # noqa: E402

pytestmark = pytest.mark.skipif(cpu.library() is None, reason="no C compiler builds the CPU kernels here")
CLOSE = dict(rtol=1e-4, atol=1e-4)  # float32 rounding through two layers: the products sum in another order

# (context, 1) per sequence: first tokens, block (16) and window boundaries on both sides, long contexts
DECODE_BATCHES = {
    "one": [(40, 1)],
    "first_token": [(0, 1), (3, 1)],
    "block_edges": [(15, 1), (16, 1), (31, 1), (32, 1), (47, 1)],
    "nine_rows": [(n, 1) for n in (5, 70, 16, 33, 1, 64, 17, 48, 90)],  # past the eight rows of a product pass
    "seventeen_rows": [(3 * n + 1, 1) for n in range(17)],
}
LAYERS = [("sliding", 16, True), ("full", None, False), ("sliding", 16, True)]  # a NoPE full layer between


def _step(lengths, shape: StackShape, window: int, seed: int):
    """A decode step over both KV groups with one cache per layer: clean (zeros where nothing was written, for the
    reference) and poisoned (NaN there, for the stack, so a read of one shows)."""
    cases = {name: make_case(lengths, num_q_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                             head_dim=shape.head_dim, sliding_window=window if name == "sliding" else None,
                             seed=seed + i)
             for i, name in enumerate(("full", "sliding"))}
    ctx = cases["full"].ctx
    ctx.groups = {name: case.group for name, case in cases.items()}
    clean = {i: (cases[name].key_cache.clone(), cases[name].value_cache.clone())
             for i, (name, _, _) in enumerate(LAYERS)}
    poisoned = {i: (cases[name].poisoned_key_cache.clone(), cases[name].poisoned_value_cache.clone())
                for i, (name, _, _) in enumerate(LAYERS)}
    rotary = RotaryTable(shape.head_dim, 10000.0)(ctx.positions, torch.float32)
    inputs = torch.randn(len(lengths), shape.hidden_size, generator=torch.Generator().manual_seed(seed))
    return ctx, clean, poisoned, rotary, inputs


def _run(stack: DecoderStack, ctx: ForwardContext, caches, rotary, inputs, reference: bool):
    ctx.kv_caches, ctx.captured = caches, {}
    out = decoder_stack_torch(stack, inputs, rotary, ctx) if reference else stack(inputs, rotary, ctx)
    return out, dict(ctx.captured)


@pytest.mark.parametrize("batch", sorted(DECODE_BATCHES))
@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (8, 1)])
def test_the_stack_computes_what_its_reference_does(batch, heads):
    shape = StackShape(hidden_size=48, num_heads=heads[0], num_kv_heads=heads[1], head_dim=16, intermediate_size=40,
                       qk_norm_eps=1e-6, qk_scale_factor=0.8)
    stack = random_stack(shape, LAYERS, torch.Generator().manual_seed(1))
    ctx, clean, poisoned, rotary, inputs = _step(DECODE_BATCHES[batch], shape, window=16, seed=2)
    ctx.capture_layers = (0, 2)
    want, want_captured = _run(stack, ctx, clean, rotary, inputs, reference=True)
    got, got_captured = _run(stack, ctx, poisoned, rotary, inputs, reference=False)
    torch.testing.assert_close(got, want, **CLOSE)
    assert got_captured.keys() == want_captured.keys() == {0, 2}
    for layer in (0, 2):
        torch.testing.assert_close(got_captured[layer], want_captured[layer], **CLOSE)
    for layer, (key_cache, value_cache) in poisoned.items():  # this step's keys and values written where they go
        torch.testing.assert_close(key_cache.nan_to_num(0.0), clean[layer][0], **CLOSE)
        torch.testing.assert_close(value_cache.nan_to_num(0.0), clean[layer][1], **CLOSE)


@pytest.mark.parametrize("batch", ["one", "nine_rows"])
def test_rows_longer_than_a_products_chunk(batch):
    """Inputs past 512 floats run a chunk at a time through several weight-row pairs (hidden 520, intermediate 1,100:
    every product and the fused gate|up one, a partial last chunk and a tail no vector holds)."""
    shape = StackShape(hidden_size=520, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=1100,
                       qk_norm_eps=1e-6, qk_scale_factor=0.8)
    stack = random_stack(shape, LAYERS, torch.Generator().manual_seed(5), biases=True)
    ctx, clean, poisoned, rotary, inputs = _step(DECODE_BATCHES[batch], shape, window=16, seed=6)
    want, _ = _run(stack, ctx, clean, rotary, inputs, reference=True)
    got, _ = _run(stack, ctx, poisoned, rotary, inputs, reference=False)
    torch.testing.assert_close(got, want, **CLOSE)


def test_odd_widths_biases_and_windows_that_cut_blocks():
    """Widths no vector or weight-row pair divides, biases on every projection, a window of 33 over 16-blocks."""
    shape = StackShape(hidden_size=37, num_heads=6, num_kv_heads=3, head_dim=10, intermediate_size=19,
                       qk_norm_eps=1e-5, qk_scale_factor=1.0)
    layers = [(name, 33 if window else None, rope) for name, window, rope in LAYERS]
    stack = random_stack(shape, layers, torch.Generator().manual_seed(3), biases=True)
    ctx, clean, poisoned, rotary, inputs = _step([(n, 1) for n in (2, 33, 34, 50, 66)], shape, window=33, seed=4)
    want, _ = _run(stack, ctx, clean, rotary, inputs, reference=True)
    got, _ = _run(stack, ctx, poisoned, rotary, inputs, reference=False)
    torch.testing.assert_close(got, want, **CLOSE)


def test_results_do_not_depend_on_the_thread_count():
    """Each output is summed by one thread in a fixed order, so one thread and several give the same bits."""
    shape = StackShape(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                       qk_norm_eps=1e-6, qk_scale_factor=1.0)
    stack = random_stack(shape, LAYERS, torch.Generator().manual_seed(5))
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, max(2, threads)):
            torch.set_num_threads(count)
            ctx, _, poisoned, rotary, inputs = _step(DECODE_BATCHES["nine_rows"], shape, window=16, seed=6)
            results.append(_run(stack, ctx, poisoned, rotary, inputs, reference=False)[0])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


def test_results_do_not_depend_on_how_the_barriers_wait(monkeypatch):
    """The step's own barrier, spinning or sleeping at every wait (spin 0), orders the phases as the OpenMP runtime's
    does (-1): the same bits, at two threads or more."""
    shape = StackShape(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                       qk_norm_eps=1e-6, qk_scale_factor=1.0)
    stack = random_stack(shape, LAYERS, torch.Generator().manual_seed(5))
    hidden, weight = torch.randn(3, 64), torch.randn(29, 64)
    threads = torch.get_num_threads()
    results = []
    try:
        torch.set_num_threads(max(2, threads))
        for spin_ns in (-1, 0, cpu.BARRIER_SPIN_NS):
            monkeypatch.setattr(cpu, "barrier_spin_ns", lambda spin_ns=spin_ns: spin_ns)
            stack.team = TeamSize()  # (spin 0's sleeps would send the next step to one thread)
            ctx, _, poisoned, rotary, inputs = _step(DECODE_BATCHES["nine_rows"], shape, window=16, seed=6)
            results.append((_run(stack, ctx, poisoned, rotary, inputs, reference=False)[0],
                             softcapped_logits_cpu(hidden, weight, 1.0, 30.0)))
    finally:
        torch.set_num_threads(threads)
    for stack_out, logits_out in results[1:]:
        assert torch.equal(stack_out, results[0][0]) and torch.equal(logits_out, results[0][1])


SLEEPY = TeamSize.SLEEPY_WAITS


def _steps(team: TeamSize, available: int, count: int, *, sleeps: int, rows: int = 4, seconds: float = 1.0,
           one_thread_seconds: float = 1.0) -> list[int]:
    """Run `count` steps of `rows` through `team`: the threads each ran on (a one-thread step takes
    `one_thread_seconds`, another `seconds`, and sleeps `sleeps` times)."""
    ran = []
    for _ in range(count):
        threads = team.threads(available)
        ran.append(threads)
        team.record(threads, sleeps if threads > 1 else 0, rows, one_thread_seconds if threads == 1 else seconds)
    return ran


def test_sleepy_steps_send_the_next_steps_to_one_thread_where_one_measures_faster(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    team = TeamSize(alone_steps=5)
    assert team.last is None and team.threads(2) == 2
    for sleeps in (SLEEPY - 1, SLEEPY, 0, SLEEPY):  # none two in a row
        team.record(2, sleeps, 4, 1.0)
        assert team.threads(2) == 2
    team.record(2, SLEEPY, 4, 1.0)  # the second in a row: two steps alone measure one thread
    assert _steps(team, 2, 2, sleeps=0, one_thread_seconds=0.5) == [1, 1]
    assert _steps(team, 2, 4, sleeps=0) == [1, 1, 1, 2] and team.last == 2  # 5 alone in all, then all, to look
    assert _steps(team, 2, 2, sleeps=58) == [2, 2]  # two sleepy looks
    assert team.threads(2) == team.last == 1  # the logits run on as many


def test_one_thread_measured_slower_keeps_all_threads_and_probes_less_and_less_often(monkeypatch):
    """Where waits sleep on a quiet machine (threads waiting for slower cores), one thread loses its probe: all threads
    run on, and the hold-off before the next probe doubles up to 64 times alone_steps."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    team = TeamSize(alone_steps=4)
    ran = _steps(team, 8, 2 + 2 + 4 + 2 + 2 + 8 + 2 + 2, sleeps=58, seconds=1.0, one_thread_seconds=3.0)
    assert ran == [8, 8, 1, 1] + [8] * 4 + [8, 8, 1, 1] + [8] * 8 + [8, 8, 1, 1]
    hold_offs = []
    for _ in range(10):
        hold_offs.append(team.hold_off)
        _steps(team, 8, team.hold_off + 4, sleeps=58, seconds=1.0, one_thread_seconds=3.0)
    assert hold_offs[:3] == [16, 32, 64] and hold_offs[-1] == 64 * 4
    assert team.threads(8) == 8


def test_a_probe_wins_again_after_a_lost_one_and_the_hold_off_starts_over(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    team = TeamSize(alone_steps=4)
    _steps(team, 2, 4, sleeps=58, one_thread_seconds=3.0)  # lost: hold-off 4, then 8
    _steps(team, 2, 4, sleeps=58)  # the hold-off
    assert _steps(team, 2, 4, sleeps=58, seconds=2.0) == [2, 2, 1, 1]  # now loaded: one thread wins
    assert _steps(team, 2, 3, sleeps=0) == [1, 1, 2]
    _steps(team, 2, 4, sleeps=58, one_thread_seconds=3.0)  # lost again: from alone_steps, not the doubled one
    assert team.hold_off == 4


def test_no_probe_compares_steps_of_different_batches(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    team = TeamSize(alone_steps=4)
    for rows in (4, 5, 6):  # sleepy steps, but never two in a row of one batch
        team.record(2, 58, rows, 1.0)
        assert team.threads(2) == 2
    team.record(2, 58, 6, 1.0)
    assert team.threads(2) == 1
    team.record(1, 0, 7, 0.1)  # the batch changed during the probe: nothing learned
    assert team.threads(2) == 1
    team.record(1, 0, 7, 0.1)
    assert team.threads(2) == 2 and team.alone_left == 0 and team.hold_off == TeamSize.INCONCLUSIVE_HOLD_OFF


def test_a_batch_changing_every_few_steps_keeps_few_steps_probing(monkeypatch):
    """Sleepy steps whose batch changes right after each pair of them: every probe compares across a change. Without
    a hold-off after such a probe, half the steps ran on one thread (two sleepy, two probing, again)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    team = TeamSize()
    ran = []
    for step in range(3000):
        threads = team.threads(8)
        ran.append(threads)
        team.record(threads, 58 if threads > 1 else 0, 4 + step // 3 % 2, 1.0)
    assert ran.count(1) / len(ran) <= 2 / (2 + 2 + TeamSize.INCONCLUSIVE_HOLD_OFF) + 0.01


def test_the_thread_count_the_user_set_is_kept_under_load(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    team = TeamSize()
    assert _steps(team, 2, 6, sleeps=58, one_thread_seconds=0.1) == [2] * 6


def test_the_stack_runs_its_steps_on_the_threads_its_team_size_gives(monkeypatch):
    """A step's barrier sleeps reach TeamSize, and the next step runs on the count it gives."""
    shape = StackShape(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                       qk_norm_eps=1e-6, qk_scale_factor=1.0)
    stack = random_stack(shape, LAYERS, torch.Generator().manual_seed(5))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu, "threads", lambda: 2)
    monkeypatch.setattr(cpu, "barrier_spin_ns", lambda: 0)  # every wait of a two-thread step sleeps
    recorded = []
    real_record = stack.team.record
    monkeypatch.setattr(stack.team, "record", lambda *step: recorded.append(step) or real_record(*step))
    for _ in range(3):
        ctx, _, poisoned, rotary, inputs = _step(DECODE_BATCHES["nine_rows"], shape, window=16, seed=6)
        _run(stack, ctx, poisoned, rotary, inputs, reference=False)
    *two_threads, one_thread = recorded
    rows = inputs.shape[0]
    assert all(threads == 2 and sleeps >= TeamSize.SLEEPY_WAITS and n == rows and seconds > 0
               for threads, sleeps, n, seconds in two_threads)
    assert one_thread[:3] == (1, 0, rows) and one_thread[3] > 0  # the probe's first step, timed


def test_waits_after_the_attention_phase_do_not_count_as_sleeps(monkeypatch):
    """The attention phase's items (a sequence's key head) may be fewer than the threads, or of uneven contexts: a
    thread with none left waits at its barrier on a quiet machine, and counting that wait sent batch-1 decode at a long
    context to one thread. At 8 threads with every wait sleeping (spin 0), a step reports at most 7 sleeps at each of
    its other barriers (two before the layers, six a layer)."""
    shape = StackShape(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96,
                       qk_norm_eps=1e-6, qk_scale_factor=1.0)
    stack = random_stack(shape, LAYERS, torch.Generator().manual_seed(5))
    monkeypatch.setattr(cpu, "threads", lambda: 8)
    monkeypatch.setattr(cpu, "barrier_spin_ns", lambda: 0)
    recorded = []
    for _ in range(3):
        stack.team = TeamSize()
        real_record = stack.team.record
        monkeypatch.setattr(stack.team, "record", lambda *step, real_record=real_record:
                            recorded.append(step) or real_record(*step))
        ctx, _, poisoned, rotary, inputs = _step(DECODE_BATCHES["nine_rows"], shape, window=16, seed=6)
        _run(stack, ctx, poisoned, rotary, inputs, reference=False)
    assert all(threads == 8 and sleeps <= 7 * (2 + 6 * len(LAYERS)) for threads, sleeps, *_ in recorded), recorded


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
@pytest.mark.parametrize("out_features,in_features", [(1, 7), (2, 5), (3, 16), (33, 37), (256, 512), (33, 1100)])
def test_the_stacks_product_is_f_linear(rows, out_features, in_features):
    generator = torch.Generator().manual_seed(rows * out_features)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(out_features, in_features, generator=generator) / in_features**0.5
    bias = torch.randn(out_features, generator=generator)
    torch.testing.assert_close(stack_linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stack_linear(x, weight, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the prefetch choice is x86's")
@pytest.mark.parametrize("flags,locality", [(["-march=znver3"], "3"), (["-march=znver3", "-mavx512f"], "2"),
                                            (["-march=skylake-avx512"], "2")])
def test_the_products_prefetch_into_l2_where_the_core_keeps_hints_there(flags, locality):
    """Zen 3 and earlier AMD cores fill L1 with every prefetch hint (4 KB ahead into L1); a Zen 4, which GCC before 13
    names znver3 under -march=native with AVX-512 on, prefetches into L2 as Intel's cores do (its products were 1.5
    times as slow with the L1 hints)."""
    source = Path(cpu.__file__).with_name("decoder_stack.c")
    result = subprocess.run([*cpu._compiler(), *flags, "-dM", "-E", str(source)], capture_output=True, text=True,
                            timeout=60)
    if result.returncode:
        pytest.skip(f"the compiler does not take {flags}")
    defines = dict(line.split()[1:3] for line in result.stdout.splitlines() if line.startswith("#define PREFETCH_"))
    assert defines["PREFETCH_LOCALITY"] == locality


def test_indices_outside_the_caches_are_refused_with_nothing_written():
    shape = StackShape(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24,
                       qk_norm_eps=1e-6, qk_scale_factor=1.0)
    stack = random_stack(shape, LAYERS, torch.Generator().manual_seed(7))
    for corrupt, message in [
        (lambda ctx: ctx.groups["full"].slot_mapping.__setitem__(1, 10**6), "sequence 1's cache slot"),
        (lambda ctx: ctx.groups["sliding"].block_tables.__setitem__((0, 0), -1), "sequence 0's cache slot"),
        (lambda ctx: ctx.seq_lens.__setitem__(1, 500), "sequence 1's cache slot or block table"),
    ]:
        ctx, _, poisoned, rotary, inputs = _step([(20, 1), (3, 1)], shape, window=16, seed=8)
        corrupt(ctx)
        before = {layer: tuple(t.clone() for t in caches) for layer, caches in poisoned.items()}
        with pytest.raises(IndexError, match=message):
            _run(stack, ctx, poisoned, rotary, inputs, reference=False)
        for layer, caches in poisoned.items():
            unchanged = zip(caches, before[layer], strict=True)
            assert all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in unchanged)


def test_it_takes_float32_decode_steps_over_every_layers_cache_only():
    shape = StackShape(hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=8, intermediate_size=24,
                       qk_norm_eps=1e-6, qk_scale_factor=1.0)
    stack = random_stack(shape, LAYERS, torch.Generator().manual_seed(9))
    ctx, _, poisoned, _, inputs = _step([(20, 1), (3, 1)], shape, window=16, seed=10)
    ctx.kv_caches = poisoned
    assert stack.takes(inputs, ctx)
    assert not stack.takes(inputs.bfloat16(), ctx)
    assert not stack.takes(inputs.t().contiguous().t(), ctx)  # strided rows
    ctx.kv_caches = {layer: caches for layer, caches in poisoned.items() if layer != 1}
    assert not stack.takes(inputs, ctx)  # a layer without its cache (a cache-less forward has none)
    prefill = make_case([(0, 5), (3, 1)], num_q_heads=2, num_kv_heads=1, head_dim=8).ctx
    prefill.kv_caches, prefill.groups = poisoned, ctx.groups
    assert not stack.takes(torch.randn(6, 32), prefill)  # a prefill chunk: several tokens of one sequence


def test_the_load_time_probe_catches_a_stack_that_computes_nothing():
    class Broken:
        def __getattr__(self, name):
            return getattr(cpu.library(), name)

        @staticmethod
        def glimmer_decode_layers(*args):
            return 0  # "succeeds" without writing the output

    assert probe_cpu(cpu.library()) is None
    assert probe_cpu(Broken()) == "decoder_stack"


@pytest.mark.parametrize("rows", [4, 8, 9, 17])
@pytest.mark.parametrize("in_features", [512, 37, 1100])
def test_a_rows_sums_do_not_depend_on_the_rows_beside_it(rows, in_features):
    """A pass sums up to eight rows at once, reducing their accumulators together from four rows up (and rows longer
    than 512 a chunk at a time through several weight rows); each row's sums are the same bits as when it is
    multiplied alone."""
    generator = torch.Generator().manual_seed(rows + in_features)
    x = torch.randn(rows, in_features, generator=generator)
    weight = torch.randn(66, in_features, generator=generator) / in_features**0.5
    together = stack_linear(x, weight)
    for r in range(rows):
        assert torch.equal(together[r], stack_linear(x[r : r + 1], weight)[0]), r
