"""The `glimmer` command: serve, chat, inspect, make-tiny.

Errors Glimmer raises on purpose (bad config, bad checkpoint, bad arguments) are printed as one
clear message and exit code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from glimmer.errors import GlimmerError


def _cmd_inspect(args: argparse.Namespace) -> int:
    import torch

    from glimmer.checkpoint.inspect import inspect_checkpoint
    from glimmer.checkpoint.resolve import resolve_checkpoint
    from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

    def meta_model(config):
        with torch.device("meta"):
            return MuseGlimmerForConditionalGeneration(config)

    report = inspect_checkpoint(resolve_checkpoint(args.model), meta_model)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return 0
    config = report.config
    text = config.text
    print(f"checkpoint:      {args.model}")
    print(f"config layout:   {config.config_layout}")
    print(f"weight layout:   {report.weight_layout}")
    print(f"RoPE layout:     {report.rope_layout}")
    print(f"vision:          {'yes' if config.has_vision else 'no (text-only)'}")
    print(f"layers:          {text.num_hidden_layers} ({len(text.full_attention_layers)} full-attention NoPE at "
          f"{list(text.full_attention_layers)}, {len(text.sliding_attention_layers)} sliding-window RoPE, "
          f"window {text.sliding_window})")
    print("parameters:")
    for label, count in report.parameter_counts.items():
        print(f"  {label:34s} {count:,}")
    print("normalized config:")
    print(json.dumps(config.summary(), indent=2))
    if report.warnings:
        print("warnings:")
        for warning in report.warnings:
            print(f"  - {warning}")
    else:
        print("warnings: none")
    return 0


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    from glimmer.tiny import write_tiny_checkpoint

    path = write_tiny_checkpoint(args.dir, layout=args.layout, vision=args.vision, seed=args.seed,
                                 num_shards=args.shards)
    print(f"wrote a tiny random {args.layout}-layout checkpoint{' with vision' if args.vision else ''} to {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glimmer", description="Run Muse Glimmer models exactly and fast.")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    inspect = sub.add_parser("inspect", help="validate a checkpoint and print its layout, config and sizes")
    inspect.add_argument("model", help="checkpoint directory or Hugging Face Hub id")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.set_defaults(func=_cmd_inspect)

    tiny = sub.add_parser("make-tiny", help="write a small random checkpoint (for tests and demos)")
    tiny.add_argument("dir", help="output directory")
    tiny.add_argument("--layout", default="canonical", choices=["canonical", "legacy", "flat", "native"])
    tiny.add_argument("--vision", action="store_true", help="include a vision tower")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--shards", type=int, default=1, help="number of safetensors shards (with an index)")
    tiny.set_defaults(func=_cmd_make_tiny)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except GlimmerError as exc:
        print(f"glimmer: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        return 0


if __name__ == "__main__":
    sys.exit(main())
