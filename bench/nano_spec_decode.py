"""DFlash speculative decoding with the embedded glimmer-nano and its drafter, against decoding without it.

    python bench/nano_spec_decode.py [--device cpu|cuda] [--prompts 64] [--single 16] [--max-tokens 256]

Prompts are the first turns of held-out evaluation conversations (`glimmer.train_nano.evaluate`: unseen
tool names), rendered as the server renders them. Both engines decode greedily in the same process: first
the baseline (no speculation), then `speculative_config={"method": "dflash", ...}` with the embedded drafter
proposing 15 tokens every step. It prints, for a batch of all prompts and for `--single` prompts one at a
time, output tokens/s of each and the speed-up, the drafter's mean acceptance length (tokens emitted per
verification: accepted drafts + 1), and whether the outputs are identical token for token (greedy
speculative decoding must not change them).
"""

from __future__ import annotations

import argparse
import logging
import time

from glimmer.cli import positive_count
from glimmer.default_model import default_drafter_dir, default_model_dir
from glimmer.engine.llm import LLM
from glimmer.engine.sampling_params import SamplingParams
from glimmer.errors import ConfigError
from glimmer.train_nano.evaluate import held_out_conversations, prompt_text

KV_CACHE_BYTES = 1 << 30


def timed(llm: LLM, prompts: list[str], params: SamplingParams, one_at_a_time: bool) -> tuple[list[list[int]], float]:
    start = time.perf_counter()
    if one_at_a_time:
        outputs = [llm.generate([prompt], params)[0] for prompt in prompts]
    else:
        outputs = llm.generate(prompts, params)
    return [o.token_ids for o in outputs], time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=positive_count, default=64)
    parser.add_argument("--single", type=positive_count, default=None,
                        help="prompts decoded one at a time (default: 16, or --prompts where fewer)")
    parser.add_argument("--max-tokens", type=positive_count, default=256)
    args = parser.parse_args()
    if args.single is None:
        args.single = min(16, args.prompts)
    elif args.single > args.prompts:  # the row would decode --prompts of them, labelled --single
        parser.error(f"argument --single: {args.single} prompts one at a time are more than --prompts {args.prompts}: "
                     f"give at most {args.prompts}")
    logging.basicConfig(level=logging.WARNING)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    # two engines in one process: each gets a KV cache of its own size, not a share of free device memory;
    # no prefix cache, so that no timed prompt finds its prefill done by the warm-up or the batch row
    memory = {"kv_cache_memory": KV_CACHE_BYTES, "enable_prefix_caching": False}
    try:  # the first engine: of what the command line gives it, only the device can be refused
        baseline = LLM(str(default_model_dir()), device=args.device, progress=False, **memory)
    except ConfigError as error:
        parser.error(f"argument --device: {error}")
    conversations = held_out_conversations(args.prompts)
    prompts = [prompt_text(baseline, c, c.messages[: c.last_user_index + 1]) for c in conversations]
    speculative = LLM(str(default_model_dir()), device=args.device, progress=False, **memory, speculative_config={
        "method": "dflash", "model": str(default_drafter_dir()), "num_speculative_tokens": 15,
        "draft_policy": "always"})
    print(f"glimmer-nano on {args.device}, greedy, up to {args.max_tokens} new tokens; drafter proposes 15 per step")
    print(f"{'':26s}{'baseline tok/s':>16s}{'dflash tok/s':>14s}{'speed-up':>10s}{'acceptance':>12s}{'identical':>11s}")
    for label, batch, one_at_a_time in ((f"batch of {args.prompts}", prompts, False),
                                        (f"one at a time ({args.single})", prompts[: args.single], True)):
        timed(baseline, batch[:2], params, one_at_a_time)  # warm-up
        timed(speculative, batch[:2], params, one_at_a_time)
        before = speculative.engine.stats()["spec_decode"]  # a snapshot: later verifications leave it as it is
        expected, baseline_s = timed(baseline, batch, params, one_at_a_time)
        got, speculative_s = timed(speculative, batch, params, one_at_a_time)
        after = speculative.engine.stats()["spec_decode"]
        drafts, accepted = after.num_drafts - before.num_drafts, after.num_accepted_tokens - before.num_accepted_tokens
        acceptance = (accepted + drafts) / drafts if drafts else float("nan")
        tokens = sum(len(t) for t in expected)
        print(f"{label:26s}{tokens / baseline_s:16.1f}{sum(len(t) for t in got) / speculative_s:14.1f}"
              f"{baseline_s / speculative_s:9.2f}×{acceptance:12.2f}{str(got == expected):>11s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
