"""/metrics against what the responses say: the real server, a scripted model (server_support.ScriptedRunner)."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from server_support import live_server

from glimmer.engine.async_engine import AsyncEngine, FinishedCompletion
from glimmer.engine.llm_engine import EngineConfig
from glimmer.server.metrics import RequestTimer, ServerMetrics


def _grew(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0) - before.get(name, 0)


def test_under_a_root_path_requests_count_by_their_endpoint(make_tiny):
    """Behind --root-path uvicorn hands the app paths that start with it (`/api/version`), as ASGI has them: every
    request was counted as endpoint `other`, and a 404's hints were lost."""
    async def get(path: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=server.app, root_path="/api")  # the scope uvicorn makes
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.get("/api" + path)

    name = 'glimmer_requests_total{endpoint="/version",status="200"}'
    with live_server(make_tiny(), scripted=True) as server:
        before = server.metrics()
        assert asyncio.run(get("/version")).status_code == 200
        assert _grew(before, server.metrics(), name) == 1
        assert asyncio.run(get("/models")).json()["error"]["message"] == (
            "Invalid URL (GET /api/models); this server serves /api/v1/models: give the client a base URL ending in "
            "/v1 (http://HOST:PORT/api/v1)")


def test_the_page_files_count_as_endpoint_static(make_tiny):
    """Inside the page files' mount a request's root path is the mount's (`/static`), and the endpoint was read from it
    once the response was out: the page's own files counted as `other`, and a file not there named as a route
    (`/static/health`, `/static/v1/models`) as a 404 of that route, `/health` 404s on a dashboard."""
    name = 'glimmer_requests_total{{endpoint="{}",status="{}"}}'
    with live_server(make_tiny(), scripted=True) as server:
        before = server.metrics()
        assert httpx.get(server.url + "/static/chat.js").status_code == 200
        for path in ("/static/health", "/static/v1/models"):
            assert httpx.get(server.url + path).status_code == 404
        after = server.metrics()
    assert _grew(before, after, name.format("/static", 200)) == 1
    assert _grew(before, after, name.format("/static", 404)) == 2
    assert _grew(before, after, name.format("/health", 404)) == _grew(before, after, name.format("other", 200)) == 0


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


def test_a_beam_search_counts_as_its_choices_not_as_each_steps_one_token_requests(make_tiny):
    """Beam search runs each step's beams as one-token requests on the engine: /metrics counted every one as a
    finished request (`length`) with its prompt (the request's, then its beam's tokens), so a search of 2 beams and 3
    tokens added 5 finished requests and 7 times its prompt tokens where its response had 2 choices."""
    model = 'model_name="tiny"'
    with live_server(make_tiny(), scripted=True) as server:
        before = server.wait_for_idle()
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        reasons: dict[str, int] = {}
        for path, body in (("/completions", {"prompt": ["x y", "a b c"]}),
                           ("/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
            answer = httpx.post(server.base_url + path, timeout=30, json={
                "model": "tiny", "max_tokens": 4, "n": 2, "use_beam_search": True, "ignore_eos": True, **body}).json()
            for field in usage:
                usage[field] += answer["usage"][field]
            for choice in answer["choices"]:
                reasons[choice["finish_reason"]] = reasons.get(choice["finish_reason"], 0) + 1
        after = server.wait_for_idle()
    assert sum(reasons.values()) == 6
    for reason in ("stop", "length", "abort", "error"):
        assert _grew(before, after, f'vllm:request_success_total{{finished_reason="{reason}",{model}}}') == \
            reasons.get(reason, 0), reason
    assert _grew(before, after, "glimmer_prompt_tokens_total") == usage["prompt_tokens"]
    # under vLLM's name, once per choice, as the completions' vllm:request_prompt_tokens are
    assert _grew(before, after, f"vllm:prompt_tokens_total{{{model}}}") == 2 * usage["prompt_tokens"] == \
        _grew(before, after, f"vllm:request_prompt_tokens_sum{{{model}}}")
    assert _grew(before, after, "glimmer_generation_tokens_total") == usage["completion_tokens"]
    assert _grew(before, after, f"vllm:request_generation_tokens_sum{{{model}}}") == usage["completion_tokens"]
    # no gap between tokens, as vLLM's steps of one-token requests have none (the README says so)
    for name in (f"vllm:inter_token_latency_seconds_count{{{model}}}", "glimmer_inter_token_latency_seconds_count"):
        assert name in after and _grew(before, after, name) == 0, name
    # each search's prompt is looked up in the prefix cache once, not again with each step's beams
    assert _grew(before, after, "glimmer_prefix_cache_queries_total") == usage["prompt_tokens"]
    assert _grew(before, after, f"vllm:prefix_cache_queries_total{{{model}}}") == usage["prompt_tokens"]
    for name in ("prompt_tokens", "generation_tokens", "queue_time_seconds", "prefill_time_seconds",
                 "decode_time_seconds"):
        assert _grew(before, after, f"vllm:request_{name}_count{{{model}}}") == 6, name


def test_a_beam_search_the_client_leaves_counts_its_beams_as_aborted(make_tiny):
    model = 'model_name="tiny"'
    with live_server(make_tiny(), scripted=True) as server:
        server.engine.engine.runner.step_delay_s = 0.02
        before = server.wait_for_idle()
        try:
            httpx.post(server.base_url + "/completions", timeout=httpx.Timeout(30, read=0.5), json={
                "model": "tiny", "prompt": "x y", "max_tokens": 500, "n": 3, "use_beam_search": True,
                "ignore_eos": True})
        except httpx.ReadTimeout:
            pass
        after = server.wait_for_idle()
        prompt_tokens = httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": "x y"}).json()["count"]
    assert _grew(before, after, f'vllm:request_success_total{{finished_reason="abort",{model}}}') == 3
    assert _grew(before, after, f'vllm:request_success_total{{finished_reason="length",{model}}}') == 0
    assert _grew(before, after, "glimmer_prompt_tokens_total") == prompt_tokens  # once, not once per step


def test_vllms_time_to_first_token_and_e2e_latency_count_each_completion_as_its_finished_requests_do(make_tiny):
    """vLLM observes time to first token and e2e latency per completion (n per request, each prompt of a list), in
    the loop that counts vllm:request_success_total: they were the server's per-HTTP-request histograms under vLLM's
    names, so a request of n 3 added 3 finished requests and 1 e2e latency, and an aborted one none."""
    model = 'model_name="tiny"'
    with live_server(make_tiny(), scripted=True) as server:
        before = server.wait_for_idle()
        for body in ({"prompt": "x y", "n": 3, "max_tokens": 4}, {"prompt": ["x y", "a b c"], "max_tokens": 2},
                     {"prompt": "x y", "max_tokens": 0, "echo": True}):
            response = httpx.post(server.base_url + "/completions", timeout=30,
                                  json={"model": "tiny", "ignore_eos": True, **body})
            assert response.status_code == 200, response.text
        server.engine.engine.runner.step_delay_s = 0.02
        with httpx.stream("POST", server.base_url + "/completions", timeout=30, json={
                "model": "tiny", "prompt": "x y", "max_tokens": 500, "ignore_eos": True, "stream": True}) as stream:
            # the client leaves once its first token came: its completion ends aborted
            next(line for line in stream.iter_lines() if line.startswith("data: {"))
        after = server.wait_for_idle()
        x_y, a_b_c = (httpx.post(server.url + "/tokenize", json={"model": "tiny", "prompt": prompt}).json()["count"]
                      for prompt in ("x y", "a b c"))
    # vLLM runs a request of n 3 as 3 requests, each counting its prompt: vllm:prompt_tokens_total counted it once
    assert _grew(before, after, f"vllm:prompt_tokens_total{{{model}}}") == 6 * x_y + a_b_c == \
        _grew(before, after, f"vllm:request_prompt_tokens_sum{{{model}}}")
    assert _grew(before, after, "glimmer_prompt_tokens_total") == 4 * x_y + a_b_c  # the requests' usage.prompt_tokens
    finished = sum(_grew(before, after, f'vllm:request_success_total{{finished_reason="{reason}",{model}}}')
                   for reason in ("stop", "length", "abort", "error"))
    assert finished == 7
    assert _grew(before, after, f"vllm:e2e_request_latency_seconds_count{{{model}}}") == finished
    # every completion but the echo of max_tokens 0 generated a token
    assert _grew(before, after, f"vllm:time_to_first_token_seconds_count{{{model}}}") == 6
    # the server's own figures time each HTTP request answered
    assert _grew(before, after, "glimmer_request_duration_seconds_count") == 3
    assert _grew(before, after, "glimmer_time_to_first_token_seconds_count") == 3


def test_latencies_of_minutes_fall_in_finite_buckets(make_tiny):
    """The latency histograms ended at 60 s, so a request of 90 s (a long answer, a queue under load) fell in +Inf
    alone and histogram_quantile read every such quantile as 60 s. vLLM's time to first token buckets reach 2,560 s,
    its request latencies 7,680 s."""
    engine = AsyncEngine(EngineConfig(str(make_tiny()), progress=False, kv_cache_memory=8 << 20))
    try:
        metrics = ServerMetrics(engine, "tiny")
        timer = RequestTimer(metrics, arrival=time.monotonic() - 90)
        timer.tokens(1)
        timer.done()
        engine.record_finished(2, [FinishedCompletion("length", 2, 1, queue_time=0.0, prefill_time=90.0,
                                                      decode_time=0.0, time_to_first_token=90.0, e2e_latency=90.0)])
        names = ("glimmer_time_to_first_token_seconds", "glimmer_request_duration_seconds",
                 "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_prefill_time_seconds")
        deadline = time.monotonic() + 10
        # the engine thread observes the completion's histograms one by one, a scrape may come between two
        while not all((buckets := _bucket_counts(metrics))[name][-1][1] for name in names):
            assert time.monotonic() < deadline, "the engine thread did not record the finished completion"
            time.sleep(0.01)
    finally:
        engine.shutdown()
    for name in names:
        finite = [le for le, count in buckets[name] if le != float("inf") and count == 1]
        assert finite and 90 <= min(finite) <= 240, (name, buckets[name])


def _bucket_counts(metrics: ServerMetrics) -> dict[str, list[tuple[float, float]]]:
    """Each histogram's (upper bound, cumulative count) pairs, +Inf last."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.setdefault(family.name, []).append((float(sample.labels["le"]), sample.value))
    return buckets


_OLD_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def test_the_servers_latency_histograms_keep_their_buckets_below_a_minute(make_tiny):
    """glimmer_time_to_first_token_seconds and glimmer_request_duration_seconds took vLLM's buckets to reach minutes,
    and lost bounds a dashboard's quantiles and alerts read (the request duration every one below 0.3 s, time to first
    token le 0.0025, 0.025, 0.05, 30 and 60): they keep every earlier bound and add vLLM's past 60 s."""
    engine = AsyncEngine(EngineConfig(str(make_tiny()), progress=False, kv_cache_memory=8 << 20))
    try:
        counts = _bucket_counts(ServerMetrics(engine, "tiny"))
        bounds = {name: [le for le, _ in pairs] for name, pairs in counts.items()}
    finally:
        engine.shutdown()
    assert bounds["glimmer_time_to_first_token_seconds"] == [*_OLD_LATENCY_BUCKETS_S, 80.0, 160.0, 640.0, 2560.0,
                                                             float("inf")]
    assert bounds["glimmer_request_duration_seconds"] == [*_OLD_LATENCY_BUCKETS_S, 120.0, 240.0, 480.0, 960.0, 1920.0,
                                                          7680.0, float("inf")]
    # vLLM's own names keep vLLM's buckets (vllm/v1/metrics/loggers.py), which its dashboards' quantiles assume
    assert bounds["vllm:time_to_first_token_seconds"] == [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
        160.0, 640.0, 2560.0, float("inf")]


def test_vllms_inter_token_latency_is_in_vllms_buckets(make_tiny):
    """vllm:inter_token_latency_seconds and its older name vllm:time_per_output_token_seconds were exposed in the
    server's buckets (0.001 s to 60 s), so a dashboard's le="0.075" or le="80" series, which vLLM's buckets have, was
    not there; they are in vLLM's (vllm/v1/metrics/loggers.py), counting the same gaps as
    glimmer_inter_token_latency_seconds, which keeps its own."""
    engine = AsyncEngine(EngineConfig(str(make_tiny()), progress=False, kv_cache_memory=8 << 20))
    try:
        metrics = ServerMetrics(engine, "tiny")
        metrics.observe_token_gap(0.07)
        counts = _bucket_counts(metrics)
    finally:
        engine.shutdown()
    vllm_buckets = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0, float("inf")]
    for name in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"):
        assert [le for le, _ in counts[name]] == vllm_buckets, name
        assert dict(counts[name])[0.05] == 0 and dict(counts[name])[0.075] == 1, counts[name]
    assert [le for le, _ in counts["glimmer_inter_token_latency_seconds"]] == [*_OLD_LATENCY_BUCKETS_S, float("inf")]
    assert dict(counts["glimmer_inter_token_latency_seconds"])[0.1] == 1
