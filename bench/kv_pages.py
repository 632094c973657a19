"""How many requests the released 30B geometry's KV cache runs at once, against what its bytes hold.

The model's full-attention and sliding-window layers take their blocks from one pool of pages (block_pool.py):
a page is 16 positions of 13 layers, a full-attention block one page, a sliding-window block three. This bench
drives the real `Scheduler` and `KVCacheManager` (no model: every scheduled token counts as computed) through
loads on a cache of a given size and prints, for each, the most requests decoding in one step, the preemptions
and the positions computed again, beside the ceiling computed from bytes alone (the cache's pages over the pages
one request needs at its longest), and an output rate with each step priced at an H100's measured floors. Each
load runs twice: with the scheduler's admission (room kept for the running requests' expected growth) and, as
the baseline in the same run, admitting whatever fits at the moment (the scheduler before that reserve, and
vLLM's policy). Loads: `bench/gpu_30b.py`'s 256 x 1K-in/256-out, long contexts (16 x 32K-in/256-out), and a
chat-like one (512 x 1K-in, max_tokens 4096, outputs ending at random, 300 tokens on average).

    python bench/kv_pages.py                 # the H100's 7.2 GiB (after 53 GB of weights) and 40 GiB
    python bench/kv_pages.py --kv-gib 7.2 20
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass

import torch

from glimmer.cli import number
from glimmer.engine.kv_cache_manager import KVCacheLayout, KVCacheManager, PageGeometry, page_geometry
from glimmer.engine.kv_planner import kv_bytes_per_page
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.scheduler import Scheduler, SchedulerConfig
from glimmer.engine.sequence import Sequence
from glimmer.tiny import released_30b_config

BLOCK = 16
GIB = 2**30  # --kv-gib's unit, as bench/gpu_kv_admission.py's --kv-gib and the engine's "GiB" count it
# a step's time on one H100 at its floors (bench/MEASUREMENTS.md, "30B on one H100 80GB"): the weight matmuls at
# batch 1, 64 and 256 (interpolated between), and each prefilled token's 2 x 29.6 GFLOP at 781 TFLOP/s
WEIGHT_STEP_S = ((1, 19.11e-3), (64, 19.78e-3), (256, 22.69e-3))
PREFILL_TOKEN_S = 2 * 29.6e9 / 781e12


def modelled_step_s(rows: int, prefill_tokens: int) -> float:
    (b0, t0), (b1, t1) = next((a, b) for a, b in zip(WEIGHT_STEP_S, WEIGHT_STEP_S[1:], strict=False)
                              if rows <= b[0] or b is WEIGHT_STEP_S[-1])
    weights = t0 + (t1 - t0) * (min(max(rows, b0), b1) - b0) / (b1 - b0)
    return weights + prefill_tokens * PREFILL_TOKEN_S


@dataclass(frozen=True)
class Load:
    name: str
    requests: int
    prompt: int
    max_tokens: int
    mean_output: int | None = None  # outputs end at random (exponential, this mean); None: each runs to max_tokens

    def outputs(self, rng: random.Random) -> list[int]:
        if self.mean_output is None:
            return [self.max_tokens] * self.requests
        return [min(self.max_tokens, max(1, int(rng.expovariate(1 / self.mean_output)))) for _ in range(self.requests)]


LOADS = (Load("256 x 1K-in/256-out", 256, 1024, 256), Load("16 x 32K-in/256-out", 16, 32 * 1024, 256),
         Load("chat: 512 x 1K-in, max_tokens 4096, outputs 300 on average", 512, 1024, 4096, 300))


def run_load(layout: KVCacheLayout, load: Load, reserve: bool) -> dict[str, float]:
    """Drive `load` through the scheduler; `reserve`: the scheduler's admission, else admit whatever fits now."""
    kv = KVCacheManager(layout)  # prefix caching on, the engine's default
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192,
                                          max_model_len=load.prompt + load.max_tokens), kv)
    if not reserve:
        scheduler._expected_growth = lambda seq, held_end: [0] * len(kv.page_pools)
    rng = random.Random(0)
    lengths = load.outputs(rng)
    ends: dict[Sequence, int] = {}
    for i, output in enumerate(lengths):  # fresh prompts: nothing to share
        seq = Sequence(f"r{i}", [rng.randrange(100, 200_000) for _ in range(load.prompt)],
                       SamplingParams(max_tokens=load.max_tokens), frozenset(), load.prompt + load.max_tokens)
        ends[seq] = output
        scheduler.add(seq)
    most_decoding = steps = computed = 0
    modelled = 0.0
    while scheduler.has_work:
        step = scheduler.schedule()
        steps += 1
        decoding = sum(n == 1 for n in step.num_new_tokens)
        most_decoding = max(most_decoding, decoding)
        modelled += modelled_step_s(len(step.seqs), sum(step.num_new_tokens) - decoding)
        for i, (seq, n) in enumerate(zip(step.seqs, step.num_new_tokens, strict=True)):
            sampled = step.samples(i)
            seq.num_computed_tokens += n
            computed += n
            kv.register_computed_blocks(seq)  # as the engine does: a preempted request finds its blocks again
            if sampled:
                seq.output_token_ids.append(7)
                if len(seq.output_token_ids) >= ends[seq]:
                    scheduler.finish(seq)
    needed = sum(load.prompt + output - 1 for output in lengths)  # every position but the last token's, once
    return {"most_decoding": most_decoding, "preemptions": scheduler.num_preemptions, "steps": steps,
            "recomputed": computed / needed - 1, "modelled_tok_s": sum(lengths) / modelled}


def pages_a_request(load: Load, geometry: PageGeometry, sliding_window: int) -> int:
    """The pages one request of `load` holds at its longest: every full-attention block, and the sliding-window
    blocks its window (and the block being written) covers."""
    full = math.ceil((load.prompt + load.max_tokens) / BLOCK)
    sliding = min(full, math.ceil(sliding_window / BLOCK) + 1)
    return full * geometry.pages_per_block["full"] + sliding * geometry.pages_per_block["sliding"]


def largest_request(geometry: PageGeometry, sliding_window: int) -> tuple[Load, int]:
    """The load whose request holds the most pages at its longest, and those pages: a cache of fewer admits no
    request of that load, and its scheduler waits for pages no request will free, the simulation never ending."""
    load = max(LOADS, key=lambda load: pages_a_request(load, geometry, sliding_window))
    return load, pages_a_request(load, geometry, sliding_window)


def pages_in(gib: float, page_bytes: int) -> int:
    """The whole pages a cache of `gib` GiB holds."""
    return int(gib * GIB) // page_bytes


def fullest_load(geometry: PageGeometry, sliding_window: int) -> tuple[Load, int]:
    """The load that holds the most pages with every request at its longest at once, and those pages: a larger cache
    runs every load as that one does (and one of millions of pages ended in a MemoryError)."""
    load = max(LOADS, key=lambda load: load.requests * pages_a_request(load, geometry, sliding_window))
    return load, load.requests * pages_a_request(load, geometry, sliding_window)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-gib", type=number("a size in GiB", hint=", such as 7.2"), nargs="+", default=[7.2, 40.0],
                        help="KV cache sizes in GiB (2^30 bytes), as the engine sizes them after the weights")
    args = parser.parse_args()
    text = released_30b_config().text
    geometry = page_geometry(text)
    page_bytes = kv_bytes_per_page(text, BLOCK, torch.bfloat16)
    load, pages = largest_request(geometry, text.sliding_window)
    smallest_gib = pages * page_bytes / GIB
    fullest, most_pages = fullest_load(geometry, text.sliding_window)
    largest_gib = math.ceil(most_pages * page_bytes / GIB * 100) / 100  # as given: a size up to it holds them
    for gib in args.kv_gib:
        if pages_in(gib, page_bytes) < pages:
            parser.error(f"argument --kv-gib: {gib:g} GiB holds no request of the load {load.name} ({pages:,} pages, "
                         f"{smallest_gib:.2f} GiB, at its longest); give {math.ceil(smallest_gib * 100) / 100:.2f} or "
                         "more")
        if gib > largest_gib:
            parser.error(f"argument --kv-gib: {gib:g} GiB is more than its loads can fill ({most_pages:,} pages, "
                         f"{most_pages * page_bytes / GIB:.2f} GiB: every request of {fullest.name} at its longest); "
                         f"give {largest_gib:.2f} or less: a larger cache runs every load the same")
    print(f"30B geometry: {len(text.full_attention_layers)} full-attention and {len(text.sliding_attention_layers)} "
          f"sliding-window layers (window {text.sliding_window}); a page is {BLOCK} positions of "
          f"{geometry.page_layers} layers, {page_bytes:,} bytes; pages a block: {geometry.pages_per_block}")
    for gib in args.kv_gib:
        pages = pages_in(gib, page_bytes)
        layout = KVCacheLayout(BLOCK, pages, geometry.pages_per_block, text.sliding_window)
        for load in LOADS:
            per_request = pages_a_request(load, geometry, text.sliding_window)
            print(f"{gib:g} GiB ({pages:,} pages), {load.name}: ceiling {min(load.requests, pages // per_request)} "
                  f"at once ({per_request} pages a request at its longest)")
            results = {}
            for reserve in (False, True):
                started = time.perf_counter()
                result = results[reserve] = run_load(layout, load, reserve)
                print(f"  {'growth reserve' if reserve else 'whatever fits':>14}: at most {result['most_decoding']} "
                      f"decoding at once, {result['preemptions']} preemptions, {result['recomputed']:.1%} of the "
                      f"positions computed again, {result['steps']} steps, {result['modelled_tok_s']:,.0f} output "
                      f"tok/s at the H100's floors ({time.perf_counter() - started:.1f} s simulated)")
            ratio = results[True]["modelled_tok_s"] / results[False]["modelled_tok_s"]
            print(f"  growth reserve / whatever fits: {ratio:.2f}")


if __name__ == "__main__":
    main()
