"""A disconnect storm: clients hang up at random moments, and the server comes through unharmed (issue 8).

Eight clients at once, each picking at random: leave during the upload, right after sending (queued or
prefilling), while a non-streaming answer is being generated, while a stream is flowing, or stay to the end
(those must succeed). Two long generations keep the engine busy all along. Afterwards no request failed
with a 5xx, nothing runs, waits or holds a KV block, and a new request is served.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from reliability_support import assert_healthy, chat_body, open_connection, raw_request, send_and_hang_up
from server_support import live_server
from test_containment import long_streams

OPERATIONS = 160


@pytest.fixture(scope="module")
def server(make_tiny):
    with live_server(make_tiny()) as live:
        yield live


@pytest.fixture(scope="module")
def pressed_server(make_tiny):
    """A KV cache of 26 pages: one sequence of max_model_len (256) and little more, for up to 6 at once."""
    with live_server(make_tiny(), engine_options={"kv_cache_memory": 220_000, "max_model_len": 256, "max_num_seqs": 6,
                                                  "max_num_batched_tokens": 32}) as live:
        yield live


def _body(rng: random.Random, stream: bool) -> tuple[str, bytes]:
    if rng.random() < 0.3:
        prompts = ["one", "two three"] if rng.random() < 0.5 else "story"
        return "/completions", json.dumps({"prompt": prompts, "max_tokens": rng.randint(1, 60), "stream": stream,
                                           "n": rng.randint(1, 3), "seed": rng.randint(0, 9)}).encode()
    return "/chat/completions", json.dumps(chat_body(max_tokens=rng.randint(1, 60), stream=stream, ignore_eos=True,
                                                     n=rng.randint(1, 2))).encode()


def _client(server, seed: int) -> str:
    """One client's visit; returns how it went ('left', or the status of a request that stayed)."""
    rng = random.Random(seed)
    moment = rng.choice(["upload", "queued", "generating", "streaming", "stay", "stay"])
    path, body = _body(rng, stream=moment == "streaming")
    request = raw_request(server.base_url, path, body)
    if moment == "upload":
        cut = rng.randint(0, len(body) - 1)
        send_and_hang_up(server.url, raw_request(server.base_url, path, body[:cut], declared_length=len(body)),
                         after_s=rng.uniform(0, 0.05))
    elif moment == "queued":
        send_and_hang_up(server.url, request, after_s=rng.uniform(0, 0.06))
    elif moment == "generating":
        send_and_hang_up(server.url, request, after_s=rng.uniform(0.05, 0.4))
    elif moment == "streaming":
        send_and_hang_up(server.url, request, after_s=rng.uniform(0, 0.2), read_first=rng.randint(1, 600))
    else:
        with open_connection(server.url) as connection:
            connection.sendall(request)
            response = b""
            while chunk := connection.recv(65536):
                response += chunk
        return response.split(b" ", 2)[1].decode()
    return "left"


def test_clients_hanging_up_at_random_moments_never_harm_the_server(server):
    before = server.metrics()
    with long_streams(server, 2), ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda seed: _client(server, seed), range(OPERATIONS)))
    stayed = [outcome for outcome in outcomes if outcome != "left"]
    assert stayed and set(stayed) == {"200"}, outcomes
    assert_healthy(server)
    after = server.metrics()
    server_errors = {key: value - before.get(key, 0) for key, value in after.items()
                     if key.startswith("glimmer_requests_total") and 'status="5' in key}
    assert not any(server_errors.values()), server_errors
    assert httpx.get(server.url + "/health").status_code == 200


def test_clients_hanging_up_while_requests_are_preempted_or_queued_leave_no_page_held(pressed_server):
    """The storm on a KV cache too small for the load: requests of 1 to 3 completions are preempted and recomputed
    or wait for pages while their clients leave. Those that stay succeed, and afterwards nothing runs or waits, every
    page is free with no reference left (the prefix cache's included) and /metrics says so."""
    server = pressed_server
    before = server.metrics()
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda seed: _client(server, seed), range(60)))
    stayed = [outcome for outcome in outcomes if outcome != "left"]
    assert stayed and set(stayed) == {"200"}, outcomes
    samples = assert_healthy(server)
    assert samples["glimmer_preemptions_total"] > before.get("glimmer_preemptions_total", 0)
    assert samples['vllm:kv_cache_usage_perc{model_name="tiny"}'] == 0
    pages = server.engine.engine.kv.pages
    assert pages.num_free_pages == pages.num_pages and not any(pages.ref_counts)
