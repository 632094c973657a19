"""Prefix-cache keys: SHA-256 chains (now) against Python's `hash((parent, chunk, media))` (before), same run.

    python bench/prefix_hash.py [--model DIR] [--repeats 5] [--prompts 16] [--prefix-tokens 256]

On a shared CPU machine, OMP_NUM_THREADS=1 keeps torch's threads from spinning against other load.

1. Hashing cost: the keys of a fresh 8,192-token prompt, in microseconds per 1K prompt tokens, for the old key
   function (verbatim) and for `KVCacheManager.update_block_hashes`; then the cost per generated token of
   keeping a sequence's keys current at that length (the old code rebuilt the whole token list every step).
2. End to end: `LLM.generate` with prefix caching on, prompts sharing a prefix, in tokens/s (prompt +
   generated) per wall-clock second and per CPU second of this process (steadier on a shared machine), with the
   old key function substituted for `block_key` and with the new one, alternating on fresh engines; prints the
   median, the spread of the repeats and the ratio. Hit verification (a compare of the
   block's stored token bytes) runs in both modes. Without --model it uses a tiny random checkpoint.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable

import torch

from glimmer import LLM, SamplingParams
from glimmer.checkpoint.formats import open_checkpoint
from glimmer.checkpoint.resolve import resolve_checkpoint
from glimmer.cli import count, positive_count
from glimmer.engine import kv_cache_manager
from glimmer.engine.kv_cache_manager import FULL, KVCacheLayout, KVCacheManager
from glimmer.engine.sequence import Sequence
from glimmer.errors import GlimmerError
from glimmer.tiny import write_tiny_checkpoint

BLOCK_SIZE = 16
CLOCKS = {"wall-clock": time.perf_counter, "CPU": time.process_time}


def old_update_block_hashes(seq: Sequence, bs: int = BLOCK_SIZE) -> None:
    """The key computation this issue replaced, verbatim."""
    tokens = seq.all_token_ids
    while (len(seq.block_hashes) + 1) * bs <= len(tokens):
        i = len(seq.block_hashes)
        parent = seq.block_hashes[-1] if seq.block_hashes else 0
        chunk = tuple(tokens[i * bs : (i + 1) * bs])
        seq.block_hashes.append(hash((parent, chunk, seq.multimodal_hashes_in(i * bs, (i + 1) * bs))))


def old_block_key(parent: object, tokens: bytes, media_keys: tuple[bytes, ...]) -> int:
    """The old key function in the new call shape, for the end-to-end comparison."""
    return hash((parent, tokens, tuple(media_keys)))


def _sequence(tokens: list[int]) -> Sequence:
    return Sequence("bench", list(tokens), SamplingParams(), frozenset(), len(tokens) + 10_000)


def _spread(values: list[float]) -> str:
    median = statistics.median(values)
    return f"{median:10.1f}  (min {min(values):.1f}, max {max(values):.1f}; spread ±{_half_range(values):.1%})"


def _half_range(values: list[float]) -> float:
    return (max(values) - min(values)) / 2 / statistics.median(values)


def hashing_cost(repeats: int) -> None:
    tokens = torch.randint(0, 200_000, (8192,), generator=torch.Generator().manual_seed(0)).tolist()
    kv = KVCacheManager(KVCacheLayout(block_size=BLOCK_SIZE, num_pages=1, pages_per_block={FULL: 1},
                                      sliding_window=BLOCK_SIZE))

    def per_1k(update: Callable[[Sequence], None]) -> list[float]:
        times = timeit.repeat(lambda: update(_sequence(tokens)), number=20, repeat=repeats)
        return [t / 20 / (len(tokens) / 1000) * 1e6 for t in times]

    old, new = per_1k(old_update_block_hashes), per_1k(kv.update_block_hashes)
    print(f"1. keys of a fresh {len(tokens):,}-token prompt, block size {BLOCK_SIZE}, µs per 1K prompt tokens:")
    print(f"   old hash((parent, chunk, media)): {_spread(old)}")
    print(f"   new SHA-256 chain:                {_spread(new)}")
    print(f"   new / old: {statistics.median(new) / statistics.median(old):.2f}")

    def per_token(update: Callable[[Sequence], None]) -> list[float]:
        results = []
        for _ in range(repeats):
            seq = _sequence(tokens)
            update(seq)
            start = time.perf_counter()
            for t in range(1024):
                seq.output_token_ids.append(t)
                update(seq)
            results.append((time.perf_counter() - start) / 1024 * 1e6)
        return results

    old, new = per_token(old_update_block_hashes), per_token(kv.update_block_hashes)
    print("   keeping keys current while generating 1,024 tokens after it, µs per generated token:")
    print(f"   old: {_spread(old)}")
    print(f"   new: {_spread(new)}")


def _prompts(count: int, prefix_tokens: int, tail_tokens: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 480, (prefix_tokens,), generator=generator).tolist()
    return [prefix + torch.randint(0, 480, (tail_tokens,), generator=generator).tolist() for _ in range(count)]


def end_to_end(model: str, args: argparse.Namespace) -> None:
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = _prompts(args.prompts, args.prefix_tokens, args.tail_tokens, seed=1)
    total_tokens = sum(map(len, prompts)) + len(prompts) * args.max_tokens
    new_block_key = kv_cache_manager.block_key
    rates: dict[tuple[str, str], list[float]] = {(mode, clock): [] for mode in ("old", "new") for clock in CLOCKS}
    outputs: dict[str, list[list[int]]] = {}
    hit_rates: dict[str, float] = {}
    for run in range(args.repeats + 1):  # run 0 warms up and is not counted
        for mode in ("old", "new") if run % 2 else ("new", "old"):
            kv_cache_manager.block_key = old_block_key if mode == "old" else new_block_key
            try:
                llm = LLM(model, progress=False, max_num_batched_tokens=args.max_num_batched_tokens)
                start = {clock: read() for clock, read in CLOCKS.items()}
                results = llm.generate(prompts, params)
                elapsed = {clock: read() - start[clock] for clock, read in CLOCKS.items()}
            finally:
                kv_cache_manager.block_key = new_block_key
            outputs[mode] = [r.token_ids for r in results]
            hit_rates[mode] = llm.engine.kv.prefix_cache_hit_rate()
            if run:
                for clock in CLOCKS:
                    rates[mode, clock].append(total_tokens / elapsed[clock])
    assert outputs["old"] == outputs["new"], "the two key functions gave different outputs"
    print(f"2. LLM.generate, prefix caching on: {args.prompts} prompts of {args.prefix_tokens} shared + "
          f"{args.tail_tokens} own tokens, {args.max_tokens} generated each; {args.repeats} runs per mode, "
          f"alternating, fresh engine each run; prefix-cache hit rate old {hit_rates['old']:.2f}, new "
          f"{hit_rates['new']:.2f}; outputs identical in both modes. Tokens (prompt + generated) per:")
    for clock in CLOCKS:
        for mode in ("old", "new"):
            print(f"   {clock} second, {mode}: {_spread(rates[mode, clock])}")
        ratio = statistics.median(rates["new", clock]) / statistics.median(rates["old", clock])
        noise = max(_half_range(rates["old", clock]), _half_range(rates["new", clock]))
        print(f"   {clock} second, new / old: {ratio:.3f}  (run-to-run spread ±{noise:.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: a tiny random one)")
    parser.add_argument("--repeats", type=positive_count, default=5)
    parser.add_argument("--prompts", type=positive_count, default=16)
    token_span = count(0, "a token count")  # -1 ended in torch.randint's RuntimeError
    parser.add_argument("--prefix-tokens", type=token_span, default=256, help="tokens every prompt shares")
    parser.add_argument("--tail-tokens", type=token_span, default=32, help="tokens of each prompt's own")
    parser.add_argument("--max-tokens", type=positive_count, default=16)
    parser.add_argument("--max-num-batched-tokens", type=positive_count, default=None)
    args = parser.parse_args()
    if args.prefix_tokens + args.tail_tokens == 0:
        parser.error("argument --tail-tokens: the prompts would be empty: give --prefix-tokens or --tail-tokens 1 or "
                     "more")
    if args.model is not None:
        try:  # its config and tokenizer before the hashing figures: a wrong --model ended in a stack trace after them
            model = str(resolve_checkpoint(args.model))
            open_checkpoint(model, weights=False)
        except GlimmerError as error:
            parser.error(f"argument --model: {error}")
    hashing_cost(args.repeats)
    if args.model is not None:
        end_to_end(model, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        end_to_end(str(write_tiny_checkpoint(tmp)), args)


if __name__ == "__main__":
    main()
