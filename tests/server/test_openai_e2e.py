"""End to end: the real server on a loopback port, the random tiny checkpoint, the official `openai` SDK."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from server_support import PINNED_DATE, TIME_TOOL, WEATHER_TOOL, fewest_forced_call_tokens, live_server

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]
EXTRA = {"chat_template_kwargs": PINNED_DATE}


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "lookahead"])
def server(make_tiny, request):
    # with async scheduling (CUDA's default) decode steps run ahead of the host (engine/lookahead.py): the
    # whole API, disconnects and aborts included, must behave the same
    with live_server(make_tiny(), engine_options={"async_scheduling": request.param}) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def test_chat_completion_has_the_openai_shape_and_usage(client):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0,
                                              extra_body=EXTRA)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert response.model == "tiny"
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    usage = response.usage
    assert 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens_details.reasoning_tokens >= 0
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_greedy_generation_is_deterministic_and_truncation_says_length(client):
    def ask():
        return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=7, temperature=0,
                                              extra_body={**EXTRA, "ignore_eos": True})

    first, second = ask(), ask()
    assert first.choices[0].message == second.choices[0].message
    assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 7


def test_streaming_chat_ends_with_finish_reason_usage_and_done(server, client):
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body=EXTRA))
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 10
    raw = httpx.post(server.base_url + "/chat/completions", timeout=30, json={
        "model": "tiny", "messages": MESSAGES, "max_tokens": 3, "stream": True, **EXTRA})
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_streamed_text_equals_the_non_streamed_text(client):
    request = dict(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0, extra_body=EXTRA)
    whole = client.chat.completions.create(**request).choices[0].message
    content, reasoning = [], []
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            reasoning.append(choice.delta.model_extra.get("reasoning_content") or "")
    assert ("".join(content) or None) == whole.content
    assert ("".join(reasoning) or None) == whole.model_extra["reasoning_content"]


def test_declared_tools_with_auto_choice_give_a_well_formed_response(client):
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER_TOOL, TIME_TOOL],
                                              max_tokens=64, temperature=0, extra_body=EXTRA)
    choice = response.choices[0]
    for call in choice.message.tool_calls or []:
        assert call.id.startswith("call_")
        json.loads(call.function.arguments)
    if choice.message.tool_calls and choice.finish_reason != "length":
        assert choice.finish_reason == "tool_calls"


def test_named_choice_on_a_random_model_gives_that_call_or_says_max_tokens_cut_it(client):
    # a random model may reason until max_tokens: then no call was written, and the response is a 500 of type
    # tool_choice_unsatisfied saying so (P-REQ-4), never a success without calls. The city is an enum here: a free
    # string ends only where the model spells `</atem:parameter>` itself (a value may hold other closing tags,
    # P-ATEM-2), which a random model does not do within max_tokens
    named = {"type": "function", "function": {"name": "get_weather"}}
    weather = json.loads(json.dumps(WEATHER_TOOL))
    weather["function"]["parameters"]["properties"]["city"]["enum"] = ["Paris", "Oslo"]
    called = 0
    for seed in range(3):
        for thinking_token_budget in (0, None):
            try:
                response = client.chat.completions.create(
                    model="tiny", messages=MESSAGES, tools=[weather, TIME_TOOL], tool_choice=named, max_tokens=48,
                    seed=seed, extra_body={**EXTRA, "thinking_token_budget": thinking_token_budget})
            except openai.InternalServerError as error:
                assert error.body["type"] == "tool_choice_unsatisfied"
                assert "cut short by max_tokens" in error.body["message"]
                continue
            choice = response.choices[0]
            assert choice.message.content is None
            assert choice.finish_reason in ("tool_calls", "length")  # the grammar admits only calls of get_weather
            assert {call.function.name for call in choice.message.tool_calls} == {"get_weather"}
            assert all(json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
                       for call in choice.message.tool_calls if choice.finish_reason == "tool_calls")
            called += 1
    assert called


def test_an_unsatisfied_tool_choice_is_not_retried_by_the_sdk(server):
    """The 500 of a forced call cut short by max_tokens would come again: the SDK's default two retries ran the whole
    generation three times. `x-should-retry: false` tells the SDKs not to."""
    sent = []
    http = httpx.Client(event_hooks={"request": [sent.append]})
    retrying = openai.OpenAI(base_url=server.base_url, api_key="unused", http_client=http)  # default max_retries
    named = {"type": "function", "function": {"name": "get_weather"}}
    with pytest.raises(openai.InternalServerError) as raised:
        retrying.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice=named,
                                         max_tokens=fewest_forced_call_tokens(server, [WEATHER_TOOL]),
                                         temperature=0, extra_body=EXTRA)
    assert raised.value.body["type"] == "tool_choice_unsatisfied"
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert len(sent) == 1


def test_n_logprobs_seed_and_model_alias(client):
    response = client.chat.completions.create(model="tiny-alias", messages=MESSAGES, max_tokens=5, n=2, seed=7,
                                              logprobs=True, top_logprobs=3, extra_body=EXTRA)
    assert response.model == "tiny-alias"
    assert [c.index for c in response.choices] == [0, 1]
    for choice in response.choices:
        assert all(len(entry.top_logprobs) == 3 and entry.logprob <= 0 for entry in choice.logprobs.content)
        # the answer's tokens only: their bytes spell the content
        spelled = b"".join(bytes(entry.bytes) for entry in choice.logprobs.content)
        assert spelled.decode(errors="replace") == (choice.message.content or "")
    assert sum(len(c.logprobs.content) for c in response.choices) <= response.usage.completion_tokens


def test_models_lists_every_served_name(client):
    assert [model.id for model in client.models.list().data] == ["tiny", "tiny-alias"]
    assert client.models.retrieve("tiny-alias").id == "tiny-alias"


def test_a_model_card_has_vllms_fields_root_the_checkpoint_and_one_permission(server, client, make_tiny):
    listed = httpx.get(server.base_url + "/models").json()["data"]
    retrieved = httpx.get(server.base_url + "/models/tiny-alias").json()
    for card in (*listed, retrieved):
        assert card["object"] == "model" and card["owned_by"] == "glimmer" and card["max_model_len"] == 2048
        assert card["root"] == str(make_tiny()) and card["parent"] is None
        [permission] = card["permission"]
        assert permission["object"] == "model_permission" and permission["id"].startswith("modelperm-")
        assert permission["allow_sampling"] and permission["allow_logprobs"] and permission["organization"] == "*"
    assert client.models.retrieve("tiny").model_extra["root"] == str(make_tiny())  # the SDK keeps it


def test_a_model_given_as_a_path_is_listed_with_its_root_as_text(make_tiny):
    # EngineConfig takes any os.PathLike; a Path in the card was a 500 (JSON has no Path)
    with live_server(make_tiny(), engine_options={"model": make_tiny()}) as live:
        response = httpx.get(live.base_url + "/models")
    assert response.status_code == 200 and response.json()["data"][0]["root"] == str(make_tiny())


def test_health(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_completions_from_text_and_token_ids(server, client):
    text = client.completions.create(model="tiny", prompt="The lighthouse keeper", max_tokens=6, temperature=0,
                                     logprobs=2)
    choice = text.choices[0]
    assert text.object == "text_completion" and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == 6 and len(choice.logprobs.top_logprobs[0]) == 2
    assert choice.logprobs.text_offset[0] == 0
    ids = server.engine.engine.encode_prompt("The lighthouse keeper")
    same = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    assert same.choices[0].text == choice.text
    assert same.usage.prompt_tokens == len(ids)


def test_completions_batch_and_stream(client):
    batch = client.completions.create(model="tiny", prompt=["one", "two"], max_tokens=3, n=2, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text  # greedy: both completions of prompt 0 agree
    assert batch.usage.completion_tokens == 12
    pieces = {}
    for chunk in client.completions.create(model="tiny", prompt=["one", "two"], max_tokens=3, temperature=0,
                                           stream=True):
        for choice in chunk.choices:
            pieces[choice.index] = pieces.get(choice.index, "") + choice.text
    assert pieces == {0: batch.choices[0].text, 1: batch.choices[2].text}


def test_completions_stop_strings_end_the_text(client):
    free = client.completions.create(model="tiny", prompt="The lighthouse keeper", max_tokens=12, temperature=0)
    text = free.choices[0].text
    stop = text[4:6]
    stopped = client.completions.create(model="tiny", prompt="The lighthouse keeper", max_tokens=12,
                                        temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[:text.index(stop)]
    assert stopped.choices[0].stop_reason == stop and free.choices[0].stop_reason is None  # vLLM's field
    streamed = [c.choices[0] for c in client.completions.create(model="tiny", prompt="The lighthouse keeper",
                                                                 max_tokens=12, temperature=0, stop=[stop],
                                                                 stream=True)]
    assert streamed[-1].finish_reason == "stop" and streamed[-1].stop_reason == stop


def test_a_seed_gives_the_same_text_on_repeat_calls_streamed_or_not_beside_other_requests(client, server):
    """Seeded completions and chats (n = 2, top-p, penalties, logit bias, a JSON grammar): run again, concurrently
    with unseeded and greedy requests and a stream its client leaves, streamed or not, each choice has the text
    (and reasoning) it had alone, and the two choices differ."""
    completion = dict(model="tiny", prompt="Once upon a time", max_tokens=12, temperature=1.0, top_p=0.9, seed=11,
                      n=2, extra_body={"ignore_eos": True})
    chat = dict(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0.8, seed=12, n=2, presence_penalty=0.5,
                logit_bias={"40": 2}, response_format={"type": "json_object"}, extra_body=EXTRA)

    def said(part) -> tuple[str, str]:
        """A completion choice's text, or a chat message's (or delta's) content and reasoning."""
        if hasattr(part, "text"):
            return part.text, ""
        return part.content or "", getattr(part, "reasoning_content", None) or ""

    async def texts(api, kwargs: dict, stream: bool) -> list[tuple[str, str]]:
        if not stream:
            return [said(getattr(c, "message", c)) for c in (await api.create(**kwargs)).choices]
        parts = [("", ""), ("", "")]
        async for chunk in await api.create(**kwargs, stream=True):
            for c in chunk.choices:
                text, reasoning = said(getattr(c, "delta", c))
                parts[c.index] = (parts[c.index][0] + text, parts[c.index][1] + reasoning)
        return parts

    async def left(aclient: openai.AsyncOpenAI) -> None:
        stream = await aclient.completions.create(model="tiny", prompt="x y", max_tokens=200, temperature=1,
                                                  stream=True, extra_body={"ignore_eos": True})
        async for _ in stream:
            break
        await stream.close()

    async def run() -> list[list[str]]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as aclient:
            seeded = [texts(api, kwargs, stream) for api, kwargs in ((aclient.completions, completion),
                                                                      (aclient.chat.completions, chat))
                      for stream in (False, True)]
            others = [aclient.completions.create(model="tiny", prompt="z " * i, max_tokens=20, temperature=i % 2)
                      for i in range(1, 5)]
            return (await asyncio.gather(*seeded, *others, left(aclient)))[:4]

    expected_completion = [said(c) for c in client.completions.create(**completion).choices]
    expected_chat = [said(c.message) for c in client.chat.completions.create(**chat).choices]
    assert len(set(expected_completion)) == 2 and len(set(expected_chat)) == 2
    assert asyncio.run(run()) == [expected_completion] * 2 + [expected_chat] * 2

def test_32_concurrent_streams_all_complete(server):
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str | None, int]:
        finish, count = None, 0
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=16, seed=i,
            stream=True, stream_options={"include_usage": True}, extra_body=EXTRA)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage:
                count = chunk.usage.completion_tokens
        return finish, count

    async def run():
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(run())
    assert len(results) == 32
    assert all(finish in ("stop", "length") and 0 < count <= 16 for finish, count in results)
    assert server.wait_for_idle()['glimmer_kv_blocks_used{group="full"}'] == 0


def _disconnect_after(server, request: dict, lines: int) -> tuple[dict, dict]:
    """Stream `request`, read `lines` SSE lines, close the connection; the metrics then and once idle."""
    with httpx.Client(timeout=30) as http, http.stream("POST", server.base_url + "/chat/completions",
                                                       json=request) as response:
        assert response.status_code == 200
        stream = response.iter_lines()
        for _ in range(lines):
            next(stream)
        during = server.metrics()
    # the connection is closed here, long before the request's max_tokens
    assert during['glimmer_kv_blocks_used{group="full"}'] > 0
    after = server.wait_for_idle()
    assert after['glimmer_kv_blocks_used{group="full"}'] == after['glimmer_kv_blocks_used{group="sliding"}'] == 0
    assert after["glimmer_num_requests_running"] == 0
    assert after["glimmer_generation_tokens_total"] - during["glimmer_generation_tokens_total"] < 1000
    return during, after


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server):
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1500, "stream": True,
               "ignore_eos": True, **EXTRA}
    _, after = _disconnect_after(server, request, lines=3)
    generated = after["glimmer_generation_tokens_total"]
    time.sleep(0.3)
    assert server.metrics()["glimmer_generation_tokens_total"] == generated  # the engine stopped computing


def test_a_client_that_disconnects_from_a_continued_echoed_stream_frees_its_blocks(server):
    # the continued-message and echo paths (their own parser start and first chunk) cancel like any stream
    messages = [*MESSAGES, {"role": "assistant", "content": "Once upon"}]
    request = {"model": "tiny", "messages": messages, "max_tokens": 1500, "stream": True, "ignore_eos": True,
               "continue_final_message": True, "echo": True, **EXTRA}
    _disconnect_after(server, request, lines=4)


def test_a_client_that_leaves_is_counted_as_499_whether_it_streams_or_not(server):
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1500, "ignore_eos": True, **EXTRA}
    key = 'glimmer_requests_total{endpoint="/v1/chat/completions",status="%s"}'
    before = server.metrics()
    with httpx.Client(timeout=30) as http, http.stream("POST", server.base_url + "/chat/completions",
                                                       json={**request, "stream": True}) as response:
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
    with pytest.raises(httpx.ReadTimeout):  # far sooner than 1500 tokens
        httpx.post(server.base_url + "/chat/completions", json=request, timeout=httpx.Timeout(30, read=0.3))
    after = server.wait_for_idle()
    assert after.get(key % 499, 0) - before.get(key % 499, 0) == 2
    assert after.get(key % 200, 0) == before.get(key % 200, 0)


def test_metrics_expose_requests_tokens_latencies_and_cache(server, client):
    for _ in range(2):  # the second finds the first's prompt blocks cached (run alone, too)
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, extra_body=EXTRA)
    samples = server.metrics()
    assert samples['glimmer_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert samples["glimmer_prompt_tokens_total"] > 0 and samples["glimmer_generation_tokens_total"] > 0
    assert samples["glimmer_time_to_first_token_seconds_count"] >= 1
    assert samples["glimmer_inter_token_latency_seconds_count"] >= 1
    for name in ("glimmer_num_requests_waiting", "glimmer_num_requests_running", "glimmer_prefix_cache_hit_rate",
                 'glimmer_kv_blocks_free{group="full"}', 'glimmer_kv_blocks_used{group="sliding"}'):
        assert name in samples
    assert samples["glimmer_prefix_cache_hit_rate"] > 0  # the same prompt came back


def test_metrics_carry_vllms_names_for_its_dashboards(server, client):
    """vLLM's Grafana dashboard and alerts query vllm:num_requests_running, vllm:kv_cache_usage_perc,
    vllm:time_to_first_token_seconds, ...: none was exposed, so they showed no data."""
    label = '{model_name="tiny"}'
    before = server.metrics()
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, extra_body=EXTRA)
    samples = server.metrics()
    # vLLM counts a prompt once per completion, Glimmer's own counter once per request (the module's earlier n > 1
    # requests set them apart): a request of one completion adds the same to both
    assert (samples["vllm:prompt_tokens_total" + label] - before["vllm:prompt_tokens_total" + label]
            == samples["glimmer_prompt_tokens_total"] - before["glimmer_prompt_tokens_total"] > 0)
    for own, vllm in (("glimmer_num_requests_running", "vllm:num_requests_running"),
                      ("glimmer_num_requests_waiting", "vllm:num_requests_waiting"),
                      ("glimmer_generation_tokens_total", "vllm:generation_tokens_total"),
                      ("glimmer_preemptions_total", "vllm:num_preemptions_total"),
                      ("glimmer_prefix_cache_queries_total", "vllm:prefix_cache_queries_total"),
                      ("glimmer_prefix_cache_hits_total", "vllm:prefix_cache_hits_total"),
                      ("glimmer_inter_token_latency_seconds_count", "vllm:inter_token_latency_seconds_count"),
                      ("glimmer_inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum")):
        assert samples[vllm if "{" in vllm else vllm + label] == samples[own], vllm
    # per finished completion, as vLLM observes them (test_metrics.py checks the counts)
    assert samples["vllm:time_to_first_token_seconds_count" + label] >= 1
    assert samples["vllm:e2e_request_latency_seconds_count" + label] == sum(
        value for name, value in samples.items() if name.startswith("vllm:request_success_total"))
    assert samples["vllm:generation_tokens_total" + label] > 0
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        assert samples[name + label] == 0  # idle: no block in use
    assert samples["glimmer_kv_pages_reserved"] == 0 and 0.1 <= samples["glimmer_kv_growth_ratio"] <= 1
    with httpx.Client(timeout=30) as http, http.stream("POST", server.base_url + "/chat/completions", json={
            "model": "tiny", "messages": MESSAGES, "max_tokens": 1500, "ignore_eos": True, "stream": True,
            **EXTRA}) as response:
        lines = response.iter_lines()
        for _ in range(3):  # past the role chunk: the prompt is in the cache
            next(lines)
        busy = server.metrics()
    # the groups share the cache's pages: a full-attention block is one, a sliding-window block three (the tiny
    # model's 2 full and 6 sliding layers); the full group's free blocks are the free pages
    used = busy['glimmer_kv_blocks_used{group="full"}'] + 3 * busy['glimmer_kv_blocks_used{group="sliding"}']
    total = used + busy['glimmer_kv_blocks_free{group="full"}']
    assert busy["vllm:kv_cache_usage_perc" + label] == used / total > 0
    assert busy["vllm:num_requests_running" + label] == busy["glimmer_num_requests_running"] == 1
    server.wait_for_idle()


def test_metrics_carry_vllms_per_request_figures(server, client):
    """vLLM's dashboard reads finished requests by reason (vllm:request_success_total) and each request's prompt
    and generated tokens and queue, prefill and decode times (vllm:request_*): none was exposed."""
    model = 'model_name="tiny"'
    greedy = {**EXTRA, "ignore_eos": True}
    text = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                          extra_body=greedy).choices[0].message.content
    before = server.wait_for_idle()
    two = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, n=2, extra_body=greedy)
    # a stop string the server matches ends the completion as "stop", not as a client's abort
    stopped = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=64, temperature=0,
                                             stop=[text[len(text) // 2]], extra_body=greedy)
    assert stopped.choices[0].finish_reason == "stop"
    _disconnect_after(server, {"model": "tiny", "messages": MESSAGES, "max_tokens": 1500, "stream": True,
                               **greedy}, lines=4)
    after = server.wait_for_idle()

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    for reason, count in (("length", 2), ("stop", 1), ("abort", 1), ("error", 0)):
        assert grew(f'vllm:request_success_total{{finished_reason="{reason}",{model}}}') == count, reason
        assert f'vllm:request_success_total{{finished_reason="{reason}",{model}}}' in after
    assert grew(f"vllm:request_prompt_tokens_count{{{model}}}") == 4
    # one record per completion (vLLM's, n per request); each of the four had the same prompt
    assert grew(f"vllm:request_prompt_tokens_sum{{{model}}}") == 4 * stopped.usage.prompt_tokens
    assert grew(f"vllm:request_generation_tokens_count{{{model}}}") == 4
    assert grew(f"vllm:request_generation_tokens_sum{{{model}}}") == grew("glimmer_generation_tokens_total") >= \
        two.usage.completion_tokens + stopped.usage.completion_tokens + 3
    for phase in ("queue", "prefill", "decode"):
        assert grew(f"vllm:request_{phase}_time_seconds_count{{{model}}}") == 4, phase
        assert grew(f'vllm:request_{phase}_time_seconds_bucket{{le="+Inf",{model}}}') == 4, phase
        assert grew(f"vllm:request_{phase}_time_seconds_sum{{{model}}}") >= 0, phase
    assert grew(f"vllm:request_decode_time_seconds_sum{{{model}}}") > 0  # several tokens each
    assert f'vllm:request_prompt_tokens_bucket{{le="1.0",{model}}}' in after  # vLLM's 1-2-5 buckets


def test_prefix_cache_counters_add_up_the_requests_prompt_and_cached_tokens(server, client):
    """/metrics had only a hit-rate gauge since the start: no window's rate (vLLM's prefix_cache_queries and _hits
    counters), and nothing to check against the cached_tokens requests were told."""
    before = server.metrics()
    prompt = list(range(210, 291))  # 5 full blocks and one token to compute
    usages = [client.completions.create(model="tiny", prompt=ids, max_tokens=2, temperature=0).usage
              for ids in (prompt, prompt, prompt[:40], prompt + [5] * 20)]
    after = server.metrics()
    cached = sum(usage.prompt_tokens_details.cached_tokens for usage in usages)
    assert cached >= 80 + 32 + 80
    assert after["glimmer_prefix_cache_hits_total"] - before["glimmer_prefix_cache_hits_total"] == cached
    assert (after["glimmer_prefix_cache_queries_total"] - before["glimmer_prefix_cache_queries_total"]
            == sum(usage.prompt_tokens for usage in usages))


def test_a_scored_prompt_that_generates_nothing_has_no_time_to_first_token(server, client):
    before = server.metrics()
    scored = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=0, echo=True, logprobs=1)
    assert scored.usage.completion_tokens == 0
    after = server.metrics()
    for name in ("glimmer_time_to_first_token_seconds_count", "glimmer_inter_token_latency_seconds_count"):
        assert after[name] == before[name], name
    assert after["glimmer_request_duration_seconds_count"] == before["glimmer_request_duration_seconds_count"] + 1


def test_a_client_that_gives_up_on_a_non_streaming_request_aborts_it(server):
    before = server.metrics()["glimmer_generation_tokens_total"]
    request = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1500, "ignore_eos": True, **EXTRA}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/chat/completions", json=request, timeout=0.5)
    after = server.wait_for_idle()
    assert after['glimmer_kv_blocks_used{group="full"}'] == 0
    assert after["glimmer_generation_tokens_total"] - before < 1000


def test_closing_a_streamed_completions_batch_aborts_every_prompt(server):
    request = {"model": "tiny", "prompt": ["one", "two", "three"], "max_tokens": 1500, "stream": True,
               "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", server.base_url + "/completions",
                                                       json=request) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        assert server.metrics()["glimmer_num_requests_running"] == 3
    after = server.wait_for_idle()
    assert after['glimmer_kv_blocks_used{group="full"}'] == 0 and after["glimmer_num_requests_running"] == 0
