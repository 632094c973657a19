"""bench/soak.py measures what the server generated: its token counts and time to first token include reasoning."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import sys
from pathlib import Path

import httpx
from server_support import AGENT_SCRIPTS, MODEL, PINNED_DATE, live_server

SOAK_PATH = Path(__file__).parents[2] / "bench" / "soak.py"


def _soak_module(monkeypatch):
    spec = importlib.util.spec_from_file_location("soak_bench", SOAK_PATH)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_chat_streams_reasoning_tokens_count_as_output_and_start_the_ttft(make_tiny, monkeypatch):
    soak = _soak_module(monkeypatch)
    monkeypatch.setattr(soak, "MODEL_NAME", MODEL)
    args = argparse.Namespace(prompt_words=8, max_tokens=40, disconnect_rate=0.0)
    # a seed whose request is a chat long enough for the scripted reasoning and some of the answer
    seed = next(seed for seed in range(1000)
                if (lambda path, body: path == "/v1/chat/completions" and body["max_tokens"] >= 20)(
                    *soak.request_body(random.Random(seed), args)))
    with live_server(make_tiny(), scripted=True) as live:
        live.engine.engine.runner.add(PINNED_DATE["current_date"], AGENT_SCRIPTS["[greet]"])
        before = live.metrics()["glimmer_generation_tokens_total"]
        tally = soak.Tally()

        async def run() -> None:
            async with httpx.AsyncClient(base_url=live.url, timeout=60) as http:
                await soak.one_request(http, random.Random(seed), args, tally)

        asyncio.run(run())
        generated = live.metrics()["glimmer_generation_tokens_total"] - before
    assert tally.completed == 1 and not tally.failed, tally
    assert generated >= 20
    assert tally.output_tokens == generated
    assert len(tally.ttfts_s) == 1 and tally.ttfts_s[0] <= tally.latencies_s[0]
