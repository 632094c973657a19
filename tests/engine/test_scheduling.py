"""Continuous batching, preemption, prefix caching and the hybrid KV cache (issue 4's engine part)."""

from __future__ import annotations

import pytest
import torch

from glimmer import LLM, BeamSearchParams, SamplingParams, StructuredOutputsParams
from glimmer.engine.kv_cache_manager import FULL, SLIDING
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.errors import ConfigError, RequestError
from glimmer.tiny import TinySpec

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
SPEC = TinySpec(sliding_window=16)


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    return make_tiny(spec=SPEC, seed=21)


def _prompts(count: int = 6) -> list[list[int]]:
    generator = torch.Generator().manual_seed(9)
    return [torch.randint(0, 480, (int(n),), generator=generator).tolist()
            for n in torch.randint(1, 70, (count,), generator=generator)]


@pytest.fixture(scope="module")
def one_at_a_time(checkpoint, same_cpu_kernels_in_module) -> list[list[int]]:
    llm = LLM(str(checkpoint), progress=False, enable_prefix_caching=False)
    return [llm.generate([p], GREEDY)[0].token_ids for p in _prompts()]


def _drive(engine: LLMEngine, arrivals: dict[int, list[tuple[str, list[int]]]], params: SamplingParams = GREEDY
           ) -> dict[str, list[int]]:
    """Step the engine, adding requests at the given step numbers; collect tokens per request."""
    tokens: dict[str, list[int]] = {}
    step = 0
    while arrivals or engine.has_unfinished_requests:
        for request_id, prompt in arrivals.pop(step, []):
            engine.add_request(request_id, prompt, params)
            tokens[request_id] = []
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
        step += 1
    return tokens


def test_requests_joining_at_different_steps_match_one_at_a_time(checkpoint, one_at_a_time, same_cpu_kernels):
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, max_num_batched_tokens=48))
    prompts = _prompts()
    arrivals: dict[int, list[tuple[str, list[int]]]] = {}
    for i, prompt in enumerate(prompts):
        arrivals.setdefault(i * 7, []).append((f"r{i}", prompt))
    tokens = _drive(engine, arrivals)
    assert [tokens[f"r{i}"] for i in range(len(prompts))] == one_at_a_time


def _preempted_in_a_tiny_kv_pool(checkpoint, lookahead: bool = False) -> tuple[LLMEngine, list[list[int]]]:
    """The engine and the tokens of `_prompts()` run together in a pool too small for them, preempting."""
    # 24 pages (a full-attention block takes one, a sliding-window block three) for three running sequences of up
    # to 99 positions each, which need 13 pages each at the end: the pages run out mid-generation. With lookahead, a
    # step launched ahead finds the pages short and lets the scheduler preempt after its read.
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=200_000, max_num_seqs=3,
                                    max_num_batched_tokens=32, max_model_len=160, async_scheduling=lookahead))
    assert engine.kv_layout.num_pages == 24
    prompts = _prompts()
    tokens = _drive(engine, {0: [(f"r{i}", p) for i, p in enumerate(prompts)]})
    assert engine.scheduler.num_preemptions > 0
    assert all(used == 0 for used, _ in engine.kv.usage().values())
    return engine, [tokens[f"r{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("lookahead", [False, True], ids=["sync", "lookahead"])
def test_preemption_under_a_tiny_kv_pool_keeps_outputs_identical(checkpoint, one_at_a_time, lookahead, launches,
                                                                  same_cpu_kernels):
    _, tokens = _preempted_in_a_tiny_kv_pool(checkpoint, lookahead)
    assert bool(launches["steps"]) == lookahead
    assert tokens == one_at_a_time


def test_preemption_keeps_outputs_identical_op_by_op_with_dense_and_packed_weights(checkpoint, op_by_op_cpu_kernels):
    """The comparison above, its engines' decode steps op by op rather than through the C decoder stack, with dense
    weights and with projections packed for oneDNN: `same_cpu_kernels` pins the stack, which left these paths'
    preemption and recompute to the load-time timing's choice."""
    alone = LLM(str(checkpoint), progress=False, enable_prefix_caching=False)
    expected = [alone.generate([p], GREEDY)[0].token_ids for p in _prompts()]
    engine, tokens = _preempted_in_a_tiny_kv_pool(checkpoint)
    text_model = engine.loaded.model.model.language_model
    assert text_model.decoder_stack is None
    assert (text_model.layers[0].self_attn.o_packed is not None) == (op_by_op_cpu_kernels == "packed")
    assert tokens == expected


def test_json_schema_outputs_under_preemption_and_beam_search_in_a_tiny_pool_match_each_request_alone(
        checkpoint, greedy_admission, same_cpu_kernels):
    """A grammar's state lives beside the KV cache: a preempted request recomputes its positions and must go on where
    its grammar stood. A beam search runs each step's beams as one-token requests that find the earlier steps' blocks
    in the prefix cache, here in a pool too small to keep them all (evicted blocks are computed again). The 24-page
    pool of the preemption test above, admission without room kept for growth."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "ids": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
              "required": ["name", "ids"]}
    constrained = SamplingParams(temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=schema))
    beams = BeamSearchParams(beam_width=3, max_tokens=10)
    prompts = _prompts(4)
    alone = LLM(str(checkpoint), progress=False)
    expected_json = [alone.generate([p], constrained)[0].outputs[0].token_ids for p in prompts]
    expected_beams = [[b.tokens for b in alone.beam_search([p], beams)[0].sequences] for p in prompts[:2]]

    tight = LLM(str(checkpoint), progress=False, kv_cache_memory=200_000, max_num_seqs=4, max_num_batched_tokens=32,
                max_model_len=160)
    assert [o.outputs[0].token_ids for o in tight.generate(prompts, constrained)] == expected_json
    assert tight.engine.scheduler.num_preemptions > 0
    assert [[b.tokens for b in r.sequences] for r in tight.beam_search(prompts[:2], beams)] == expected_beams
    assert all(used == 0 for used, _ in tight.engine.kv.usage().values())


def test_the_cpu_default_kv_cache_runs_max_num_seqs_sequences_to_max_model_len_without_preemption(checkpoint):
    # sliding-window layers hold a window plus the block it grows into per sequence, however short the context:
    # a budget sized by positions alone (and split in half between the groups) left the sliding pool short, so
    # eight sequences decoding together were preempted and recomputed over and over (175 steps for 128 tokens)
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, max_num_seqs=8, max_model_len=40))
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    generator = torch.Generator().manual_seed(5)
    for i in range(8):
        engine.add_request(f"r{i}", torch.randint(20, 400, (8,), generator=generator).tolist(), params)
    steps = 0
    while engine.has_unfinished_requests:
        engine.step()
        steps += 1
    assert engine.scheduler.num_preemptions == 0
    assert steps == 32  # one prefill step for all eight, then 31 decode steps of eight


def test_prefix_cache_hits_give_identical_outputs(checkpoint, same_cpu_kernels):
    llm = LLM(str(checkpoint), progress=False)
    shared = list(range(20, 100))  # 80 tokens = 5 full blocks
    first = llm.generate([shared + [7, 8]], GREEDY)[0]
    second = llm.generate([shared + [7, 8]], GREEDY)[0]
    third = llm.generate([shared + [9]], GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 80
    assert third.num_cached_tokens == 80
    assert second.token_ids == first.token_ids
    uncached = LLM(str(checkpoint), progress=False, enable_prefix_caching=False)
    assert third.token_ids == uncached.generate([shared + [9]], GREEDY)[0].token_ids
    assert llm.engine.kv.prefix_cache_hit_rate() > 0


def test_sliding_window_blocks_are_released_as_the_sequence_grows(checkpoint):
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, enable_prefix_caching=False))
    engine.add_request("long", [5] * 10, SamplingParams(temperature=0, max_tokens=300, ignore_eos=True))
    sliding_peak = 0
    full_used = []
    while engine.has_unfinished_requests:
        engine.step()
        usage = engine.kv.usage()
        sliding_peak = max(sliding_peak, usage[SLIDING][0])
        full_used.append(usage[FULL][0])
    window_blocks = SPEC.sliding_window // 16
    assert sliding_peak <= window_blocks + 2  # bounded by the window, not the 310 positions
    assert max(full_used) == -(-309 // 16)  # the full-attention group keeps every position


def test_request_that_cannot_fit_max_model_len_is_rejected_up_front(checkpoint):
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, max_model_len=64))
    with pytest.raises(RequestError) as err:
        engine.add_request("big", list(range(50)), SamplingParams(max_tokens=20))
    assert err.value.param == "max_tokens" and "maximum context length is 64 tokens" in str(err.value)
    assert err.value.code == "context_length_exceeded"


def test_a_kv_cache_too_small_for_one_full_length_sequence_is_refused_at_startup(checkpoint):
    """Every request within max_model_len must be able to run alone, so none can wait forever."""
    with pytest.raises(ConfigError, match="cannot hold one sequence of max_model_len=4096") as err:
        LLMEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=40_000))
    # audit: the fix named only the Python arguments; `glimmer serve` users need the flags
    # and one form per option: "--kv-cache-memory SIZE on the command line, kv_cache_memory= in LLM(...)" was another
    for name in ("--max-model-len 16 / max_model_len=16", "--kv-cache-memory SIZE / kv_cache_memory="):
        assert name in str(err.value), name
    # gpu_memory_utilization sizes no cache given in bytes, nor any on the CPU, and no device memory is to be freed:
    # fixes that change nothing were named
    assert "gpu" not in str(err.value) and "device memory" not in str(err.value)
    # the longest context named holds one sequence in the same bytes (4 pages: a full block and a sliding one)
    assert LLMEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=40_000,
                                  max_model_len=16)).kv_layout.num_pages == 4


def test_a_kv_cache_smaller_than_one_block_is_refused_not_given_a_block_past_it(checkpoint):
    """A block of 128 tokens takes 196,608 bytes over the six sliding-window layers: a 150,000-byte cache holds none
    for them, and the engine allocated one all the same (with block_size=2**24 and the CPU's default 2 GiB, 32 GiB
    in all). The cache would hold the 64 positions' keys and values (131,072 bytes), so the block size is named."""
    with pytest.raises(ConfigError, match=r"the KV cache \(150,000 bytes\) cannot hold one sequence of "
                                          r"max_model_len=64 tokens \(available/needed: \{'pages': \(2, 4\)\}, "
                                          r"a page is 128 positions of 2 layers\); lower block_size=128 \(a block "
                                          r"larger than"):
        LLMEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=150_000, max_model_len=64,
                               block_size=128))
    # 1,000 bytes hold no context whatever the block size: the fix is a larger cache, not a smaller block
    with pytest.raises(ConfigError, match=r"\(available/needed: \{'pages': \(0, 4\)\}, a page is 16 positions of 2 "
                                          r"layers\); lower the context") as err:
        LLMEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=1_000, max_model_len=8))
    assert "block_size" not in str(err.value)


@pytest.mark.parametrize(("kv_cache_memory", "max_model_len", "pages"), [
    # two sliding blocks of three pages and 32 full ones: an even split between the groups gave the windows 6 blocks
    # and the full group 20 of 32; pages counted in whole chunks of three gave 36 of 38
    (312_000, 512, 2 * 3 + 32),
    (66_000, 32, 2 * 3 + 2),  # an even split gave the windows 1 block of 2
])
def test_a_kv_cache_that_holds_one_full_length_sequence_in_every_group_is_not_refused(checkpoint, kv_cache_memory,
                                                                                     max_model_len, pages,
                                                                                     same_cpu_kernels):
    """A budget that holds one sequence at max_model_len in every group was refused where a fixed split between the
    groups left one short; the sequence runs to max_model_len alone."""
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=kv_cache_memory,
                                    max_model_len=max_model_len))
    assert engine.kv_layout.num_pages == pages
    prompt = torch.randint(0, 480, (max_model_len - 8,), generator=torch.Generator().manual_seed(4)).tolist()
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens = _drive(engine, {0: [("long", prompt)]}, params)
    reference = LLM(str(checkpoint), progress=False, enable_prefix_caching=False, max_model_len=max_model_len)
    assert tokens["long"] == reference.generate([prompt], params)[0].token_ids
    assert all(used == 0 for used, _ in engine.kv.usage().values())


@pytest.mark.parametrize("max_num_batched_tokens", [64, 2048, 1 << 20])
def test_the_windows_are_never_sized_past_every_position_of_the_context(checkpoint, max_num_batched_tokens):
    """The sliding-window group was sized for a window per sequence plus one step's chunk of new tokens, even where
    that is more than every position of max_model_len: a budget of 2**20 tokens reserved 65,536 blocks for windows
    that hold at most 8 sequences x 4 blocks, on the CPU (whose default cache is what the sequences need)."""
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, max_model_len=64, max_num_seqs=8,
                                    max_num_batched_tokens=max_num_batched_tokens))
    every_position = 8 * 64 // engine.kv_layout.block_size
    # a full-attention block is one page, a sliding-window block three: every position of every layer is 4 pages
    assert engine.kv_layout.pages_per_block == {FULL: 1, SLIDING: 3}
    assert every_position + 8 * 3 <= engine.kv_layout.num_pages <= every_position * 4


def test_abort_frees_blocks_and_stops_computing(checkpoint):
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False))
    engine.add_request("a", list(range(40)), SamplingParams(max_tokens=200, ignore_eos=True))
    engine.step()
    assert any(used for used, _ in engine.kv.usage().values())
    deltas = engine.abort("a")
    assert [d.finish_reason for d in deltas] == ["abort"]
    assert not engine.has_unfinished_requests
    assert all(used == 0 for used, _ in engine.kv.usage().values())


def test_abort_in_every_state_frees_every_block_and_the_engine_serves_on(checkpoint, one_at_a_time, greedy_admission,
                                                                        same_cpu_kernels):
    """Aborting a request that waits, prefills, was preempted, has finished, was aborted already or never existed:
    the first three end with one 'abort' delta each and give back their blocks; the others are no-ops."""
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=200_000, max_num_seqs=3,
                                    max_num_batched_tokens=32, max_model_len=160))
    prompts = _prompts()
    long = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"run{i}", list(range(100 + i, 160 + i)), long)
    engine.add_request("waiting", prompts[0], GREEDY)
    engine.step()  # a 32-token budget: run0 prefills its first chunk, the others wait
    assert [s.request_id for s in engine.scheduler.running] == ["run0"]
    assert [d.finish_reason for d in engine.abort("waiting")] == ["abort"]
    assert [d.finish_reason for d in engine.abort("run0")] == ["abort"]  # mid-prefill
    # two sequences of up to 140 positions, 15 pages each, in 24 pages: one is preempted (admitted without room to
    # grow: greedy_admission)
    while engine.has_unfinished_requests and not any(s.num_preemptions for s in engine.scheduler.waiting):
        engine.step()
    preempted = next(s for s in engine.scheduler.waiting if s.num_preemptions).request_id
    assert [d.finish_reason for d in engine.abort(preempted)] == ["abort"]
    while engine.has_unfinished_requests:
        engine.step()
    for request_id in ("run1", "run2", preempted, "waiting", "never-added"):  # finished, or aborted, or unknown
        assert engine.abort(request_id) == []
    assert all(used == 0 for used, _ in engine.kv.usage().values())
    assert _drive(engine, {0: [("after", prompts[1])]})["after"] == one_at_a_time[1]
    assert not engine.has_unfinished_requests
    assert all(used == 0 for used, _ in engine.kv.usage().values())


@pytest.mark.parametrize("bad", [[], [-1], [10**9]])
def test_invalid_prompts_are_refused(checkpoint, bad):
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False))
    with pytest.raises(RequestError) as err:
        engine.add_request("bad", bad, SamplingParams())
    assert err.value.param == "prompt"


def test_aborting_one_completion_leaves_the_others_running(checkpoint):
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, enable_prefix_caching=False))
    engine.add_request("n3", list(range(20)), SamplingParams(max_tokens=30, n=3, seed=1, ignore_eos=True))
    engine.step()
    used_before = engine.kv.usage()[FULL][0]
    deltas = engine.abort("n3", index=1)
    assert [(d.index, d.finish_reason) for d in deltas] == [(1, "abort")]
    assert engine.kv.usage()[FULL][0] < used_before
    finished = {}
    while engine.has_unfinished_requests:
        for delta in engine.step():
            assert delta.index != 1
            if delta.finish_reason:
                finished[delta.index] = delta.finish_reason
    assert finished == {0: "length", 2: "length"}


def test_shared_prefixes_under_a_tiny_pool_never_stall_and_match_one_at_a_time(checkpoint, same_cpu_kernels):
    """Prefix-cache hits, chunked prefill and preemption together: every step makes progress."""
    generator = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 480, (40,), generator=generator).tolist()
    prompts = [shared[: int(k)] + torch.randint(0, 480, (int(m),), generator=generator).tolist()
               for k, m in zip(torch.randint(16, 41, (8,), generator=generator),
                               torch.randint(1, 30, (8,), generator=generator), strict=True)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reference = LLM(str(checkpoint), progress=False, enable_prefix_caching=False)
    expected = [reference.generate([p], params)[0].token_ids for p in prompts]
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, kv_cache_memory=200_000, max_num_seqs=4,
                                    max_num_batched_tokens=24, max_model_len=160))
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for _ in range(2000):
        if not engine.has_unfinished_requests:
            break
        for delta in engine.step():
            tokens[delta.request_id].extend(delta.token_ids)
    assert not engine.has_unfinished_requests, "the scheduler stalled"
    assert [tokens[f"r{i}"] for i in range(len(prompts))] == expected
    assert engine.kv.prefix_cache_hit_rate() > 0


def test_an_aborted_completions_final_delta_keeps_its_prefix_cache_hit_and_first_scheduled_time(checkpoint):
    # it said num_cached_tokens=0 and first_scheduled_time=None, so a caller reading the last delta lost both
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False))
    prompt = list(range(100, 150))
    _drive(engine, {0: [("first", prompt)]})
    engine.add_request("again", prompt, SamplingParams(max_tokens=200, ignore_eos=True))
    first = engine.step()[0]
    assert first.num_cached_tokens == 48 and first.first_scheduled_time is not None
    (aborted,) = engine.abort("again")
    assert aborted.finish_reason == "abort"
    assert (aborted.num_cached_tokens, aborted.first_scheduled_time) == (48, first.first_scheduled_time)


def test_changing_a_sampling_params_after_submitting_it_leaves_the_request_as_submitted(checkpoint, same_cpu_kernels):
    # the request read the caller's object at every step: reusing it for the next request (another temperature,
    # logprobs) changed the one running, as vLLM's copy on submission does not
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = LLM(str(checkpoint), progress=False).generate([list(range(30, 60))], params)[0].outputs[0].token_ids
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False))
    engine.add_request("a", list(range(30, 60)), params)
    deltas = engine.step() + engine.step()
    params.temperature, params.logprobs = 2.0, 3
    while engine.has_unfinished_requests:
        deltas += engine.step()
    assert sum((d.token_ids for d in deltas), []) == expected
    assert not any(d.logprobs for d in deltas)


@pytest.mark.parametrize("budget", [1, 2, 16])
def test_decode_steps_batch_as_many_sequences_as_the_token_budget_holds(checkpoint, budget):
    """A decoding sequence takes one token of a step's budget: a budget of 1 runs one sequence a step, of 2 two, of a
    block (16) sixteen; the scheduler serializes nothing the budget could hold (2 x budget one-token prompts run in
    two waves, every step full)."""
    engine = LLMEngine(EngineConfig(str(checkpoint), progress=False, enable_prefix_caching=False,
                                    max_num_seqs=budget, max_num_batched_tokens=budget))
    batch_sizes = []
    schedule = engine.scheduler.schedule

    def recorded():
        step = schedule()
        batch_sizes.append(len(step.seqs))
        return step

    engine.scheduler.schedule = recorded
    tokens = _drive(engine, {0: [(f"r{i}", [10 + i]) for i in range(2 * budget)]},
                    SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert batch_sizes == [budget] * 12 and all(len(t) == 6 for t in tokens.values())


def test_a_token_budget_below_max_num_seqs_is_refused_naming_both():
    """As vLLM's SchedulerConfig: no more than the budget's sequences could ever run at once. Refused before the
    model is looked for."""
    with pytest.raises(ConfigError, match=r"^max_num_batched_tokens=3 is below max_num_seqs=4: .* raise "
                                          r"--max-num-batched-tokens / max_num_batched_tokens= to at least"):
        LLMEngine(EngineConfig("/nonexistent/model/dir", progress=False, max_num_seqs=4, max_num_batched_tokens=3))


def test_a_beam_search_looks_its_prompt_up_in_the_prefix_cache_once(checkpoint):
    """Its steps past the first are requests whose prompts continue tokens the search generated, as a preempted
    sequence re-admitted looks up blocks it wrote: counted, they made a 40-token prompt searched 2 beams wide for 6
    tokens 470 queried tokens, 320 of them hits. The prefix-cache counters count each search's prompt once, as usage's
    cached_tokens does."""
    llm = LLM(str(checkpoint), progress=False)
    prompt = _prompts(1)[0][:1] * 40
    beams = BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True)
    llm.beam_search([{"prompt_token_ids": prompt}], beams)
    kv = llm.engine.kv
    assert (kv.prefix_cache_queried_tokens, kv.prefix_cache_hit_tokens) == (40, 0)
    llm.beam_search([{"prompt_token_ids": prompt}], beams)  # its prompt's two full blocks are found the second time
    assert (kv.prefix_cache_queried_tokens, kv.prefix_cache_hit_tokens) == (80, 32)
    assert llm.engine.stats()["prefix_cache_hit_rate"] == 2 / 4
