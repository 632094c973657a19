"""KV-cache memory of one growing sequence: the hybrid cache against an every-layer-keeps-everything baseline.

Generates one long sequence on a tiny random checkpoint and records, at several lengths, the KV bytes
the engine actually holds (blocks in use per group × bytes per block). The baseline is what the same
blocks would cost if the sliding-window layers kept every position too, measured from the same run.
Then prints the same ratio for the released Muse Glimmer geometry (52 layers, 13 full, window 2048).

    python bench/kv_memory.py
"""

from __future__ import annotations

import argparse
import tempfile

from glimmer.cli import positive_count
from glimmer.engine.kv_cache_manager import FULL, SLIDING
from glimmer.engine.kv_planner import kv_bytes_per_block
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.engine.sampling_params import SamplingParams
from glimmer.errors import ConfigError
from glimmer.tiny import TinySpec, write_tiny_checkpoint


def measure(window: int = 64, lengths: tuple[int, ...] = (32, 64, 128, 512, 1024, 2048)) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(tmp, spec=TinySpec(sliding_window=window))
        engine = LLMEngine(EngineConfig(path, progress=False, enable_prefix_caching=False))
        text = engine.model_config.text
        bs = engine.kv_layout.block_size
        full_bytes = kv_bytes_per_block(text, FULL, bs, engine.dtype)
        sliding_bytes = kv_bytes_per_block(text, SLIDING, bs, engine.dtype)
        engine.add_request("long", [5], SamplingParams(temperature=0, max_tokens=max(lengths) + 1, ignore_eos=True))
        print(f"tiny model: {text.num_hidden_layers} layers ({len(text.full_attention_layers)} full), window {window}")
        print(f"{'positions':>10} {'hybrid KV bytes':>16} {'all-layers KV bytes':>20} {'ratio':>7}")
        position = 1
        pending = sorted(lengths)
        while engine.has_unfinished_requests and pending:
            engine.step()
            position += 1
            if position - 1 == pending[0]:
                pending.pop(0)
                usage = engine.kv.usage()
                hybrid = usage[FULL][0] * full_bytes + usage[SLIDING][0] * sliding_bytes
                baseline = usage[FULL][0] * (full_bytes + sliding_bytes)
                print(f"{position - 1:>10} {hybrid:>16,} {baseline:>20,} {hybrid / baseline:>7.3f}")
        engine.abort("long")


def sequences_that_fit(ratio: float) -> str:
    """How many sequences the hybrid cache holds against an every-layer cache of the same bytes, `ratio` being its
    bytes over that cache's: within the window every layer keeps every position, and no more fit."""
    return "no more sequences fit" if ratio >= 1 else f"{1 / ratio:.2f}x as many sequences fit"


def released_geometry() -> None:
    layers, full, window = 52, 13, 2048
    print("released geometry (per position, relative to keeping every layer):")
    for length in (2048, 8192, 32768, 131072):
        ratio = (full * length + (layers - full) * min(length, window)) / (layers * length)
        print(f"  {length:>7} positions: {ratio:.3f}  ({sequences_that_fit(ratio)})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=positive_count, default=64,
                        help="the tiny model's sliding window (default 64)")
    window = parser.parse_args().window
    try:
        measure(window=window)
    except ConfigError as error:  # the tiny checkpoint's check of the window (past torch's int64), before any line
        parser.error(f"argument --window: {error}")
    released_geometry()
