"""Speculative decoding through the server: the same replies and usage, metrics for what verifies, and
`glimmer serve --speculative-config` refusing a bad configuration before it starts."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import openai
import pytest
from server_support import PINNED_DATE, live_server

from glimmer import SamplingParams
from glimmer.engine.async_engine import AsyncEngine
from glimmer.engine.llm_engine import EngineConfig
from glimmer.engine.proposers import ReplayProposer, cycling_acceptance
from glimmer.server.metrics import ServerMetrics
from glimmer.tiny import TinyDrafterSpec, write_tiny_drafter

MESSAGES = [{"role": "user", "content": "Count with me: one, two, three."}]


@pytest.fixture(scope="module")
def drafter(make_tiny, tmp_path_factory):
    return write_tiny_drafter(tmp_path_factory.mktemp("drafter"), make_tiny(), spec=TinyDrafterSpec())


def _reply(live) -> tuple[str | None, object]:
    client = openai.OpenAI(base_url=live.base_url, api_key="unused", max_retries=0)
    response = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=20, temperature=0,
                                              extra_body={"chat_template_kwargs": PINNED_DATE, "ignore_eos": True})
    return response.choices[0].message.content, response.usage


def test_replies_usage_and_metrics_with_speculation(make_tiny, drafter, same_cpu_kernels):
    with live_server(make_tiny()) as plain:
        expected_reply, expected_usage = _reply(plain)
    config = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 4, "draft_policy": "always"}
    with live_server(make_tiny(), engine_options={"speculative_config": config}) as live:
        reply, usage = _reply(live)
        samples = live.wait_for_idle()
    assert reply == expected_reply
    assert (usage.prompt_tokens, usage.completion_tokens) == (expected_usage.prompt_tokens,
                                                              expected_usage.completion_tokens)
    assert samples["glimmer_generation_tokens_total"] == usage.completion_tokens
    drafts = samples["glimmer_spec_decode_num_drafts_total"]
    assert drafts > 0 and samples["glimmer_spec_decode_num_draft_tokens_total"] <= 4 * drafts
    assert samples["glimmer_spec_decode_num_accepted_tokens_total"] >= 0
    assert samples["glimmer_spec_decode_acceptance_length_count"] == drafts
    assert samples['glimmer_spec_decode_acceptance_length_bucket{le="+Inf"}'] == drafts
    assert samples['glimmer_kv_blocks_used{group="draft"}'] == 0


def test_a_scrape_reads_the_spec_decode_counters_of_one_moment(make_tiny, drafter):
    """A scrape read each counter as it wrote it out, so a verification the engine thread recorded mid-scrape showed
    more accepted tokens than proposed ones, and a histogram count other than the drafts."""
    config = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 4}
    engine = AsyncEngine(EngineConfig(str(make_tiny()), progress=False, kv_cache_memory=8 << 20,
                                      speculative_config=config))
    try:
        speculator = engine.engine.speculator
        speculator.record_verification(4, 1)
        samples = {}
        for family in ServerMetrics(engine, "tiny").registry.collect():
            samples.update((sample.name, sample.value) for sample in family.samples)
            if family.name == "glimmer_spec_decode_num_draft_tokens":
                speculator.record_verification(4, 4)  # the engine thread, between two counters of the scrape
    finally:
        engine.shutdown()
    assert samples["glimmer_spec_decode_num_drafts_total"] == 1
    assert samples["glimmer_spec_decode_num_draft_tokens_total"] == 4
    assert samples["glimmer_spec_decode_num_accepted_tokens_total"] == 1
    assert samples["glimmer_spec_decode_acceptance_length_count"] == 1
    assert samples["glimmer_spec_decode_acceptance_length_sum"] == 2
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):  # under vLLM's names, for its dashboards
        assert samples[f"vllm:spec_decode_{name}_total"] == samples[f"glimmer_spec_decode_{name}_total"]


def test_inter_token_latency_is_one_gap_per_step_however_many_tokens_its_verification_gave(make_tiny, drafter):
    """A verification that accepts proposals gives its completion several tokens in one step, each a delta of its
    own: every one after the first was observed as a gap of 0 s, so inter-token latency counted tokens, not steps,
    and its quantiles fell with the acceptance. vLLM observes one gap per request and step (IterationStats), as
    `on_token_gap` says."""
    config = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 4, "draft_policy": "always"}
    engine = AsyncEngine(EngineConfig(str(make_tiny()), progress=False, kv_cache_memory=8 << 20,
                                      speculative_config=config))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)

    async def tokens(request_id: str) -> list[int]:
        return [t for delta in [d async for d in engine.generate(request_id, [5, 77, 130, 42], params)]
                for t in delta.token_ids]

    try:
        known = asyncio.run(tokens("first"))
        speculator, inner = engine.engine.speculator, engine.engine.speculator.proposer
        speculator.proposer = ReplayProposer(lambda seq: known, cycling_acceptance(4),
                                             engine.engine.model_config.text.vocab_size, 4, inner=inner)
        steps_with_tokens = []
        step = engine.engine.step

        def counted_step():
            deltas = step()
            steps_with_tokens.extend({d.request_id for d in deltas if d.token_ids} & {"second"})
            return deltas

        engine.engine.step = counted_step
        gaps = []
        engine.on_token_gap(gaps.append)
        assert asyncio.run(tokens("second")) == known
    finally:
        engine.shutdown()
    assert len(steps_with_tokens) < len(known) - 10  # the verifications accepted runs of proposals
    assert len(gaps) == len(steps_with_tokens) - 1


def test_serve_refuses_a_bad_speculative_config_before_starting(make_tiny):
    result = subprocess.run([sys.executable, "-m", "glimmer.cli", "serve", str(make_tiny()), "--speculative-config",
                             '{"method": "medusa", "model": "x"}'], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "speculative_config.method='medusa' is not supported; use one of ['dflash']" in result.stderr
