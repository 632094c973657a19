"""The scheduler's admission on a GPU whose KV cache cannot hold a load: `bench/kv_pages.py` measured on the model.

`bench/gpu_30b.py`'s 256 x 1K-in/256-out load on the released 30B geometry (dummy bf16 weights) with the KV cache
pinned to a size (by default 7.2 GiB, about what an H100 80GB keeps after the 53 GB of weights), run twice in one
process on fresh prompts: with the scheduler's admission, which keeps room for the running requests' expected growth,
and, as the baseline, admitting whatever fits at the moment (the scheduler before that reserve, and vLLM's policy).
Prints each run's output rate and preemptions, and their ratio.

    python bench/gpu_kv_admission.py
    python bench/gpu_kv_admission.py --kv-gib 5 --json out.json    # the printed figures written there too
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_30b import fresh_prompts, run_engine  # noqa: E402

from glimmer import LLM  # noqa: E402
from glimmer.cli import number, positive_count  # noqa: E402
from glimmer.tiny import write_tiny_checkpoint  # noqa: E402

RATIO = "growth reserve / whatever fits"


class Admission(NamedTuple):
    """One admission's run of the load: its output rate, seconds and the preemptions it made."""
    output_tokens_per_s: float
    seconds: float
    preemptions: int


def figures(device: str, kv_gib: float, pages: int, requests: int, max_tokens: int,
            admissions: dict[str, Admission]) -> dict:
    """What --json writes: the run's settings, each admission's rate, seconds and preemptions to the places printed,
    and the ratio of the growth reserve's rate to whatever fits'."""
    results: dict = {"device": device, "kv_gib": kv_gib, "pages": pages, "requests": requests, "max_tokens": max_tokens}
    for name, run in admissions.items():
        results[name] = {"output_tokens_per_s": round(run.output_tokens_per_s, 1), "seconds": round(run.seconds, 1),
                         "preemptions": run.preemptions}
    reserve, fits = admissions["growth reserve"], admissions["whatever fits"]
    results[RATIO] = round(reserve.output_tokens_per_s / fits.output_tokens_per_s, 2)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # -1 went to the engine, to be refused once the 30B's engine was being built
    parser.add_argument("--kv-gib", type=number("a size in GiB", above=0, hint=", such as 7.2"), default=7.2,
                        help="the KV cache's size in GiB (default 7.2)")
    parser.add_argument("--requests", type=positive_count, default=256,
                        help="requests of 1K prompt tokens (default 256)")
    parser.add_argument("--max-tokens", type=positive_count, default=256,
                        help="tokens each request generates (default 256)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_kv_admission.py needs a CUDA GPU")
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp) / "glimmer-30b", preset="30b", config_only=True)
        start = time.perf_counter()
        llm = LLM(str(path), dtype="bfloat16", load_format="dummy", progress=False, max_model_len=34 * 1024,
                  max_num_seqs=args.requests, kv_cache_memory=int(args.kv_gib * 2**30))
        print(f"device: {torch.cuda.get_device_name()}; loaded in {time.perf_counter() - start:.1f} s; "
              f"KV cache {args.kv_gib} GiB: {llm.engine.kv_layout.describe()}", flush=True)
        run_engine(llm, fresh_prompts(64, 1024, 2), 4)  # compiles and graphs, untimed
        scheduler = llm.engine.scheduler
        admissions = {}
        for seed, (name, reserve) in enumerate((("growth reserve", True), ("whatever fits", False)), start=300):
            if not reserve:
                # the admission before the reserve
                scheduler._expected_growth = lambda seq, held_end: [0] * len(scheduler.kv.page_pools)
            before = scheduler.num_preemptions
            result = run_engine(llm, fresh_prompts(args.requests, 1024, seed), args.max_tokens)
            run = admissions[name] = Admission(result["output_tokens_per_s"], result["seconds"],
                                               scheduler.num_preemptions - before)
            print(f"{name}: output {run.output_tokens_per_s:,.1f} tok/s in {run.seconds:.1f} s, "
                  f"preemptions {run.preemptions}", flush=True)
        results = figures(torch.cuda.get_device_name(), args.kv_gib, llm.engine.kv_layout.num_pages, args.requests,
                          args.max_tokens, admissions)
        print(f"{RATIO}: {results[RATIO]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
