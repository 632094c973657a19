"""`python -m glimmer.train_nano OUT_DIR`: regenerate the corpus and retrain the nano model and its drafter.

Writes OUT_DIR/glimmer-nano (the target checkpoint) and OUT_DIR/glimmer-nano-dflash (the drafter), plus
loss curves as CSV. The shipped files come from the default recipe (`nano`, seed 0) on one H200, where a run
takes about seven and a half minutes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from glimmer.train_nano.pipeline import DRAFTER_DIR, TARGET_DIR, CorpusTooSmall, train_all
from glimmer.train_nano.recipe import RECIPES, Recipe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m glimmer.train_nano", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path,
                        help="where to write glimmer-nano/, glimmer-nano-dflash/ and the loss curves")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="nano",
                        help="nano: the shipped model's recipe (one GPU, minutes); micro: the whole pipeline at a "
                             "toy size, on a CPU in seconds (default nano)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes generating the corpus (default: the CPU count, at most 16)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the corpus, the tokenizer and both trainings (default: the recipe's, 0)")
    parser.add_argument("--conversations", type=int, default=None,
                        help="conversations in the training corpus (default: the recipe's; nano 128,000)")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="tokens per optimizer step, padding included (lower it when memory is short)")
    parser.add_argument("--target-steps", type=int, default=None, help="optimizer steps of the target")
    parser.add_argument("--drafter-steps", type=int, default=None, help="optimizer steps of the drafter")
    parser.add_argument("--drafter-conversations", type=int, default=None,
                        help="the drafter trains on the corpus's first conversations, this many")
    parser.add_argument("--target", type=Path, default=None,
                        help="a trained target checkpoint: train only a drafter for it (its tokenizer, its corpus)")
    return parser


# the counts a run takes, by option: each at least this (a step count of 0 keeps the initialized weights)
_LEAST = {"workers": 1, "conversations": 1, "batch_tokens": 1, "target_steps": 0, "drafter_steps": 0,
          "drafter_conversations": 1}
SEED_LIMIT = 2**64  # torch's generators take seeds below it; numpy's none below 0


def _count_problem(args: argparse.Namespace) -> str | None:
    """A count or seed out of range: none would train (a corpus of 0 conversations ended in a numpy traceback, a
    drafter of 0 waited for a batch forever, a negative seed was numpy's ValueError after the tokenizer)."""
    for dest, least in _LEAST.items():
        value = getattr(args, dest)
        if value is not None and value < least:
            return f"--{dest.replace('_', '-')} {value}: give {'a count of at least 1' if least else '0 or more'}"
    if args.seed is not None and not 0 <= args.seed < SEED_LIMIT:
        return f"--seed {args.seed}: give a seed from 0 to 2**64 - 1"
    conversations = _recipe(args).conversations
    if args.target is None and args.drafter_conversations is not None and args.drafter_conversations > conversations:
        return (f"--drafter-conversations {args.drafter_conversations} is more than the corpus's {conversations} "
                "conversations (--conversations): the drafter trains on the corpus's first conversations; give at "
                "most as many")
    return None


def _recipe(args: argparse.Namespace) -> Recipe:
    """The recipe a run trains with: `--recipe`'s, with the counts and seed the command line gives."""
    overrides = {key: value for key, value in (("seed", args.seed), ("conversations", args.conversations),
                                               ("batch_tokens", args.batch_tokens),
                                               ("target_steps", args.target_steps),
                                               ("drafter_steps", args.drafter_steps),
                                               ("drafter_conversations", args.drafter_conversations))
                 if value is not None}
    return replace(RECIPES[args.recipe], **overrides)


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with a count, --target or --device, found before minutes of corpus generation (and before
    train_all creates a mistyped --target as an empty directory)."""
    count_problem = _count_problem(args)
    if count_problem is not None:
        return count_problem
    # the directories the run creates (mkdir's FileExistsError traceback where a file holds the name)
    created = [args.out_dir, *(args.out_dir / name for name in (TARGET_DIR, DRAFTER_DIR)
                               if name != TARGET_DIR or args.target is None)]
    taken = next((path for path in created if path.exists() and not path.is_dir()), None)
    if taken is not None:
        return (f"OUT_DIR {args.out_dir}: {taken} is a file, where the run writes a directory; give another OUT_DIR "
                "or move the file")
    if args.target is not None:
        # they size the target's training, which --target skips (its corpus is --drafter-conversations long)
        unused = [option for option, value in (("--conversations", args.conversations),
                                               ("--target-steps", args.target_steps)) if value is not None]
        if unused:
            return (f"--target trains only a drafter; leave out {' and '.join(unused)} (the target's training), or "
                    "give --drafter-conversations and --drafter-steps")
        missing = [name for name in ("config.json", "tokenizer.json") if not (args.target / name).is_file()]
        if missing:
            return (f"--target {args.target} is not a trained target checkpoint (it has no {' or '.join(missing)}); "
                    "give the glimmer-nano directory an earlier run wrote, OUT/glimmer-nano")
    if args.device is not None:
        import torch

        try:
            device = torch.device(args.device)
        except RuntimeError:
            return f"--device {args.device} is not a device; give cpu, cuda or cuda:N"
        if device.type not in ("cpu", "cuda"):
            return f"--device {args.device} is not supported; give cpu or cuda"
        if device.type == "cuda" and not torch.cuda.is_available():
            return f"--device {args.device}: CUDA is not available here; give --device cpu, or leave --device out"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = _argument_problem(args)
    if problem is not None:
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stdout)
    try:
        train_all(_recipe(args), args.out_dir, device=args.device, workers=args.workers,
                  target=args.target)
    except CorpusTooSmall as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
