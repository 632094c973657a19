"""What sampling parameters cost at full size: the 30B (random weights, bf16) on one GPU, decode-phase throughput of
a batch under each kind of sampling, as a ratio to greedy decoding measured in the same run.

Batch 64 runs 1K-token prompts, batch 256 runs 256-token prompts (fresh random prompts each time, so the prefix
cache never hides a prefill), 97 new tokens a request. The decode phase is the steps in which every request of
the batch decodes, from the last request's first token to the first request's end (as `gpu_30b.py` counts it).
Each kind runs once on short prompts first, so no kernel compiles inside a timed run. Requests carry no seed
except in the last kind.

    python bench/gpu_sampling.py [--batches 64 256] [--kinds "top_p 0.95" ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_30b import fresh_prompts, run_engine  # noqa: E402

from glimmer import LLM  # noqa: E402
from glimmer.cli import positive_count  # noqa: E402
from glimmer.tiny import write_tiny_checkpoint  # noqa: E402

NEW_TOKENS = 97
KINDS = {
    "greedy": dict(temperature=0),
    "temperature 0.8": dict(temperature=0.8),
    "top_p 0.95": dict(temperature=0.8, top_p=0.95),
    "top_k 50": dict(temperature=0.8, top_k=50),
    "top_k 20, top_p 0.8": dict(temperature=0.7, top_k=20, top_p=0.8),
    "min_p 0.05": dict(temperature=0.8, min_p=0.05),
    "penalties": dict(temperature=0.8, top_p=0.95, repetition_penalty=1.1, frequency_penalty=0.5,
                      presence_penalty=0.5),
    "greedy, 5 logprobs": dict(temperature=0, logprobs=5),
    "temperature 0.8, seeded": dict(temperature=0.8, seeded=True),
}


def decode_rate(llm: LLM, prompts: list[list[int]], kind: dict) -> float:
    """Decode-phase tokens per second of `prompts` under one kind of sampling (`seeded`: a seed per request, each
    then drawing from a generator of its own; unseeded requests share the engine's)."""
    fields = {k: v for k, v in kind.items() if k != "seeded"}
    return run_engine(llm, prompts, NEW_TOKENS,
                      lambda i: {**fields, "seed": i} if kind.get("seeded") else fields)["decode_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=positive_count, nargs="+", default=[64, 256])
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS),
                        help="the kinds to run (greedy, the baseline, always runs)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    kinds = {name: kind for name, kind in KINDS.items() if name == "greedy" or name in args.kinds}
    if not torch.cuda.is_available():
        sys.exit("gpu_sampling.py needs a CUDA GPU")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp) / "g30", preset="30b", config_only=True)
        llm = LLM(str(path), dtype="bfloat16", load_format="dummy", progress=False, max_model_len=34 * 1024,
                  max_num_seqs=max(args.batches))
        for batch in args.batches:
            length = 1024 if batch <= 64 else 256
            rates = {}
            for k, (name, kind) in enumerate(kinds.items()):
                decode_rate(llm, fresh_prompts(batch, 64, 5 + k), kind)  # compiles what this kind needs
                rates[name] = decode_rate(llm, fresh_prompts(batch, length, 100 + 13 * k + batch), kind)
                print(f"batch {batch:3d}  {name:24s} {rates[name]:8.0f} tok/s  {rates[name] / rates['greedy']:.3f} "
                      "of greedy", flush=True)
            results[str(batch)] = rates
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
