"""/metrics against what the responses say: the real server, a scripted model (server_support.ScriptedRunner)."""

from __future__ import annotations

import threading
import time

import httpx
from server_support import live_server


def _grew(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0) - before.get(name, 0)


def test_inter_token_latency_counts_each_step_when_the_server_reads_the_tokens_late(make_tiny):
    """A server busy elsewhere finds several steps' tokens waiting and reads them as one delta: inter-token latency
    was observed once for them all (one gap as long as all of theirs), so its count fell short of the tokens and its
    quantiles rose with the server's load, not the engine's pace. vLLM times each step's tokens as the engine made
    them."""
    with live_server(make_tiny(), scripted=True) as server:
        server.engine.engine.runner.step_delay_s = 0.02

        async def hold_the_event_loop() -> None:  # a handler that blocks the server's event loop a while
            time.sleep(0.4)

        server.app.add_api_route("/hold", hold_the_event_loop)
        before = server.wait_for_idle()
        answer = {}
        request = threading.Thread(target=lambda: answer.update(httpx.post(server.base_url + "/completions", json={
            "model": "tiny", "prompt": "x y", "max_tokens": 40, "ignore_eos": True}, timeout=30).json()))
        request.start()
        deadline = time.monotonic() + 30
        while server.engine.metrics.generation_tokens - before["glimmer_generation_tokens_total"] < 3:
            assert time.monotonic() < deadline, "the request generated no tokens"
            time.sleep(0.005)
        assert httpx.get(server.url + "/hold", timeout=30).status_code == 200
        request.join()
        after = server.wait_for_idle()
    assert answer["usage"]["completion_tokens"] == 40
    for name in ("glimmer_inter_token_latency_seconds_count",
                 'vllm:inter_token_latency_seconds_count{model_name="tiny"}'):
        assert _grew(before, after, name) == 39, name
