"""Per-token cost of grammar-constrained decoding against unconstrained decoding, in the same run.

    python bench/constrained.py [--model DIR] [--batches 1,64] [--max-tokens 64] [--hidden-size 64 --layers 8]
    python bench/constrained.py --preset 30b      # the released geometry and vocabulary, dummy weights (GPU)

For each batch size, times `LLM.generate` of `--max-tokens` and of twice as many tokens for every sequence (the
difference is decode alone: prefill and request set-up cancel out), free and constrained by a JSON schema (an array
of objects that cannot end within the budget, so both runs generate the same number of tokens). Prints the time per
decode step of each, the overhead ratio, and how long filling the batch's grammar bitmask took per step (the engine
fills it on a worker thread while the model runs, so the overhead can be smaller than the fill time). Without
--model it writes a random tiny checkpoint (sizes from --hidden-size / --layers) with the tiny test tokenizer, whose
vocabulary is small: a real checkpoint's masks cost more per row. `--preset 30b` writes the released geometry with a
tokenizer of the release's 202,048 ids and loads random weights on the device (about 60 GB in bfloat16).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from glimmer import LLM, SamplingParams, StructuredOutputsParams
from glimmer.cli import count, positive_count, positive_counts
from glimmer.engine.grammar import GrammarMasks
from glimmer.errors import GlimmerError
from glimmer.tiny import TinySpec, write_tiny_checkpoint

SCHEMA = {
    "type": "array", "minItems": 100000,
    "items": {"type": "object", "properties": {"name": {"type": "string"}, "count": {"type": "integer"},
                                               "ok": {"type": "boolean"}, "tags": {"type": "array",
                                                                                   "items": {"type": "string"}}},
              "required": ["name", "count", "ok"]},
}
PROMPT = "List the items as JSON:"
MAX_MODEL_LEN = 1024
PROMPT_ROOM = 64  # positions kept for PROMPT's tokens, 23 characters, in any tokenizer


class _TimedMasks(GrammarMasks):
    """GrammarMasks that records how long each fill takes."""

    seconds: list[float] = []

    def fill(self, controllers):
        start = time.perf_counter()
        bitmask = super().fill(controllers)
        _TimedMasks.seconds.append(time.perf_counter() - start)
        return bitmask


def timed_generate(llm: LLM, batch: int, max_tokens: int, structured: StructuredOutputsParams | None) -> float:
    params = [SamplingParams(max_tokens=max_tokens, ignore_eos=True, seed=i, structured_outputs=structured)
              for i in range(batch)]
    start = time.perf_counter()
    outputs = llm.generate([PROMPT] * batch, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outputs), "a sequence ended early"
    return elapsed


def run(llm: LLM, batch: int, max_tokens: int, structured: StructuredOutputsParams | None) -> float:
    """Seconds per decode step for `batch` sequences: the time of `2 * max_tokens` tokens less that of `max_tokens`
    (the same prompts, prefill and request set-up in both), over `max_tokens`."""
    short = timed_generate(llm, batch, max_tokens, structured)
    long = timed_generate(llm, batch, 2 * max_tokens, structured)
    return (long - short) / max_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint directory (default: a random tiny checkpoint)")
    parser.add_argument("--batches", type=positive_counts, default=[1, 64])
    parser.add_argument("--max-tokens", type=positive_count, default=64)
    # the tiny model's 4 heads take a quarter of it each, a head size even (rotary embeddings) and 16 or more (the
    # tiny config's qk_scale_factor, 3.87, must be below √head_dim): a multiple of 8, 64 or more
    parser.add_argument("--hidden-size", type=count(64, "a tiny model's hidden size", step=8), default=64)
    parser.add_argument("--layers", type=positive_count, default=8)
    parser.add_argument("--repeats", type=positive_count, default=2)
    parser.add_argument("--preset", choices=("tiny", "30b"), default="tiny")
    args = parser.parse_args()
    most_tokens = (MAX_MODEL_LEN - PROMPT_ROOM) // 2
    if args.max_tokens > most_tokens:  # a sequence cut by the context ended in run's AssertionError
        parser.error(f"argument --max-tokens: {args.max_tokens} does not fit: a run generates twice --max-tokens after "
                     f"its prompt within {MAX_MODEL_LEN:,} positions; give at most {most_tokens}")
    logging.basicConfig(level=logging.WARNING)
    batches = args.batches
    with tempfile.TemporaryDirectory() as scratch:
        model, load_format = args.model, "auto"
        if model is None and args.preset == "30b":
            model = str(write_tiny_checkpoint(Path(scratch), preset="30b", config_only=True))
            load_format = "dummy"
        elif model is None:
            spec = TinySpec(hidden_size=args.hidden_size, intermediate_size=2 * args.hidden_size,
                            num_hidden_layers=args.layers, head_dim=args.hidden_size // 4)
            model = str(write_tiny_checkpoint(Path(scratch), spec=spec))
        try:
            llm = LLM(model, progress=False, max_num_seqs=max(batches), max_model_len=MAX_MODEL_LEN,
                      load_format=load_format)
        except GlimmerError as error:
            if args.model is None:  # a checkpoint this script wrote
                raise
            parser.error(f"argument --model: {error}")
        llm.engine._grammar_masks = _TimedMasks(llm.engine.model_config.text.vocab_size, max(batches))
        structured = StructuredOutputsParams(json=SCHEMA)
        print(f"device {llm.engine.device}, vocab {llm.engine.model_config.text.vocab_size}, "
              f"{args.max_tokens} tokens per sequence, best of {args.repeats}")
        run(llm, 2, 4, structured)  # warm-up: compile paths, thread pools
        for batch in batches:
            for structured_or_not in (None, structured):  # capture this batch's CUDA graphs, compile the grammar
                timed_generate(llm, batch, 2 * args.max_tokens, structured_or_not)
            free = min(run(llm, batch, args.max_tokens, None) for _ in range(args.repeats))
            _TimedMasks.seconds.clear()
            constrained = min(run(llm, batch, args.max_tokens, structured) for _ in range(args.repeats))
            fill_ms = 1000 * sum(_TimedMasks.seconds) / max(len(_TimedMasks.seconds), 1)
            print(f"batch {batch:3d}: free {1000 * free:8.3f} ms/step, constrained {1000 * constrained:8.3f} ms/step, "
                  f"overhead {100 * (constrained / free - 1):+6.1f}%  (mask fill {fill_ms:.3f} ms/step)")


if __name__ == "__main__":
    main()
