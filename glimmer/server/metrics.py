"""Prometheus metrics of one app, in a registry of its own (several apps can live in one process).

The server counts requests and measures latencies as it serves; the engine's counters and gauges (tokens,
queue, running sequences, KV blocks, prefix-cache hit rate) are read from the engine at scrape time. The figures
vLLM's dashboards read are also exposed under vLLM's names (`vllm:num_requests_running`, ...), labelled `model_name`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from glimmer.engine.async_engine import AsyncEngine, FinishedCompletion

# the server's own latencies (and the gaps between a completion's steps)
_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# vLLM's buckets (vllm/v1/metrics/loggers.py), so its dashboards' quantiles agree: a time to first token of a request
# queued under load, or a long answer's duration, runs to minutes, which buckets ending at 60 s read as 60 s
_VLLM_TIME_TO_FIRST_TOKEN_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                                       7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_VLLM_INTER_TOKEN_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                                       7.5, 10.0, 20.0, 40.0, 80.0)
_VLLM_REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# the server's own time to first token and request duration: every bound they had (a dashboard's quantile or alert
# reads one) and vLLM's past 60 s
_TIME_TO_FIRST_TOKEN_BUCKETS_S = (*_LATENCY_BUCKETS_S, *(le for le in _VLLM_TIME_TO_FIRST_TOKEN_BUCKETS_S if le > 60))
_REQUEST_DURATION_BUCKETS_S = (*_LATENCY_BUCKETS_S, *(le for le in _VLLM_REQUEST_LATENCY_BUCKETS_S if le > 60))
_VLLM_FINISH_REASONS = ("stop", "length", "abort", "error")
# as vLLM counts them (its scheduler, before the stop checks): a measure of the drafter, whose acceptance rate a stop
# would otherwise lower; the tokens delivered are the generation tokens
_ACCEPTED_HELP = ("Proposed tokens the target's verification accepted, those past a stop that ended the output "
                  "included (as vLLM counts them)")


def _vllm_token_buckets(max_model_len: int) -> list[int]:
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_model_len:
                return buckets
            buckets.append(value)
        exponent += 1


class _EngineCollector(Collector):
    def __init__(self, engine: AsyncEngine, model_name: str):
        self._engine = engine
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        counters = engine.metrics
        stats = engine.engine.stats()
        yield CounterMetricFamily("glimmer_prompt_tokens", "Prompt tokens of admitted requests",
                                  value=counters.prompt_tokens)
        yield CounterMetricFamily("glimmer_generation_tokens", "Generated tokens", value=counters.generation_tokens)
        yield CounterMetricFamily("glimmer_preemptions", "Sequences preempted for lack of KV blocks",
                                  value=stats["preemptions"])
        yield GaugeMetricFamily("glimmer_num_requests_waiting", "Sequences waiting to be scheduled",
                                value=stats["waiting"])
        yield GaugeMetricFamily("glimmer_num_requests_running", "Sequences running", value=stats["running"])
        yield GaugeMetricFamily("glimmer_kv_pages_reserved", "KV pages kept for the running sequences' expected growth "
                                "when the last step left the first waiting request waiting (the drafter's blocks "
                                "where only those were short; 0: none waited for that)",
                                value=stats["kv_reserved_pages"])
        yield GaugeMetricFamily("glimmer_kv_growth_ratio", "Share of the tokens a running sequence may still generate "
                                "that admission expects it to (falls while nothing is preempted; 1 after a "
                                "preemption)", value=stats["kv_growth_ratio"])
        used = GaugeMetricFamily("glimmer_kv_blocks_used", "KV cache blocks in use, per attention group",
                                 labels=["group"])
        free = GaugeMetricFamily("glimmer_kv_blocks_free", "KV cache blocks an attention group could take now, were "
                                 "no other group to take any: the model's groups share the free pages (a sliding "
                                 "block takes several, only in a free chunk), so the groups' figures are not to be "
                                 "summed", labels=["group"])
        for group, (in_use, available) in stats["kv_blocks"].items():
            used.add_metric([group], in_use)
            free.add_metric([group], available)
        yield used
        yield free
        yield GaugeMetricFamily("glimmer_prefix_cache_hit_rate", "Prompt blocks found in the prefix cache / looked up",
                                value=stats["prefix_cache_hit_rate"])
        # the rate over a window (rate(hits) / rate(queries)), which the gauge, since the start, cannot give
        yield CounterMetricFamily("glimmer_prefix_cache_queries", "Prompt tokens looked up in the prefix cache, per "
                                  "sequence (n per request; a beam search's prompt once)",
                                  value=stats["prefix_cache_queries"])
        yield CounterMetricFamily("glimmer_prefix_cache_hits", "Prompt tokens found in the prefix cache, per sequence "
                                  "(a request's cached_tokens with n 1)", value=stats["prefix_cache_hits"])
        yield GaugeMetricFamily("glimmer_engine_alive", "1 while the engine thread serves requests",
                                value=1 if engine.is_alive else 0)
        spec = stats.get("spec_decode")
        if spec is not None:
            yield from _spec_decode_metrics(spec)
        yield from self._vllm_metrics(counters, stats)

    def _vllm_metrics(self, counters, stats) -> Iterator[Metric]:
        """The same figures under vLLM's names, which its Grafana dashboard and alerts query."""
        kv_usage = stats["kv_usage"]
        spec = stats.get("spec_decode")
        speculation = () if spec is None else (
            ("vllm:spec_decode_num_drafts", CounterMetricFamily, "Verifications of proposed tokens", spec.num_drafts),
            ("vllm:spec_decode_num_draft_tokens", CounterMetricFamily, "Proposed tokens verified",
             spec.num_draft_tokens),
            ("vllm:spec_decode_num_accepted_tokens", CounterMetricFamily, _ACCEPTED_HELP, spec.num_accepted_tokens))
        for name, family, documentation, value in (*speculation,
                ("vllm:num_requests_running", GaugeMetricFamily, "Sequences running", stats["running"]),
                ("vllm:num_requests_waiting", GaugeMetricFamily, "Sequences waiting to be scheduled",
                 stats["waiting"]),
                ("vllm:kv_cache_usage_perc", GaugeMetricFamily, "KV cache usage, 0 to 1 (the fullest pool's: the "
                 "model's layer groups share one, the drafter has its own)", kv_usage),
                ("vllm:gpu_cache_usage_perc", GaugeMetricFamily, "vllm:kv_cache_usage_perc under vLLM's older name",
                 kv_usage),
                ("vllm:prompt_tokens", CounterMetricFamily, "Prompt tokens of admitted requests, once per "
                 "completion (n per request, as vLLM runs n requests)", counters.prompt_tokens_per_completion),
                ("vllm:generation_tokens", CounterMetricFamily, "Generated tokens", counters.generation_tokens),
                ("vllm:num_preemptions", CounterMetricFamily, "Sequences preempted for lack of KV blocks",
                 stats["preemptions"]),
                ("vllm:prefix_cache_queries", CounterMetricFamily, "Prompt tokens looked up in the prefix cache",
                 stats["prefix_cache_queries"]),
                ("vllm:prefix_cache_hits", CounterMetricFamily, "Prompt tokens found in the prefix cache",
                 stats["prefix_cache_hits"])):
            metric = family(name, documentation, labels=["model_name"])
            metric.add_metric([self._model_name], value)
            yield metric


def _spec_decode_metrics(spec) -> Iterator[Metric]:
    """Speculative decoding: verifications, proposed and accepted tokens, and tokens emitted per verification."""
    yield CounterMetricFamily("glimmer_spec_decode_num_drafts", "Verifications of proposed tokens (one per "
                              "sequence and step)", value=spec.num_drafts)
    yield CounterMetricFamily("glimmer_spec_decode_num_draft_tokens", "Proposed tokens verified",
                              value=spec.num_draft_tokens)
    yield CounterMetricFamily("glimmer_spec_decode_num_accepted_tokens", _ACCEPTED_HELP,
                              value=spec.num_accepted_tokens)
    cumulative, buckets, total = 0, [], 0
    for length, count in enumerate(spec.acceptance_lengths):
        if length:
            cumulative += count
            total += length * count
            buckets.append((str(length), cumulative))
    buckets.append(("+Inf", cumulative))
    yield HistogramMetricFamily("glimmer_spec_decode_acceptance_length", "Accepted proposals + 1 per verification: "
                                "the tokens it emitted, but for a stop inside the run (see the accepted tokens)",
                                buckets=buckets, sum_value=total)


class _HistogramUnderVllmNames(Collector):
    """A histogram under vLLM's names (each the same observations, labelled `model_name`)."""

    def __init__(self, histogram: Histogram, names: list[str], model_name: str):
        self._histogram = histogram
        self._names = names
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        [own] = self._histogram.collect()
        buckets = [(sample.labels["le"], sample.value) for sample in own.samples if sample.name.endswith("_bucket")]
        [total] = [sample.value for sample in own.samples if sample.name.endswith("_sum")]
        for name in self._names:
            metric = HistogramMetricFamily(name, own.documentation, labels=["model_name"])
            metric.add_metric([self._model_name], buckets, sum_value=total)
            yield metric


class ServerMetrics:
    def __init__(self, engine: AsyncEngine, model_name: str):
        """`model_name` labels the metrics exposed under vLLM's names (the first served model name)."""
        self.registry = CollectorRegistry()
        self.requests = Counter("glimmer_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=self.registry)
        self.time_to_first_token = Histogram(
            "glimmer_time_to_first_token_seconds", "From request arrival to its first generated token",
            buckets=_TIME_TO_FIRST_TOKEN_BUCKETS_S, registry=self.registry)
        self.inter_token_latency = Histogram(
            "glimmer_inter_token_latency_seconds", "Between consecutive steps that gave one completion tokens",
            buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.request_latency = Histogram(
            "glimmer_request_duration_seconds", "From request arrival to its last token",
            buckets=_REQUEST_DURATION_BUCKETS_S, registry=self.registry)
        self.unresolved_tool_calls = Counter(
            "glimmer_unresolved_tool_calls", "Tool calls naming no declared tool, passed through (P-NAME-3)",
            registry=self.registry)
        self.tool_choice_unsatisfied = Counter(
            "glimmer_tool_choice_unsatisfied", "Required or named tool_choice requests that ended without a call",
            registry=self.registry)
        self._model_name = model_name
        self.request_success = Counter(
            "vllm:request_success", "Finished requests (completions, n per request) by finish reason",
            ["model_name", "finished_reason"], registry=self.registry)
        for reason in _VLLM_FINISH_REASONS:  # each series from 0, so rate() sees the first one
            self.request_success.labels(model_name, reason)
        token_buckets = _vllm_token_buckets(engine.engine.max_model_len)
        self.request_histograms = {name: Histogram(name, documentation, ["model_name"], buckets=buckets,
                                                   registry=self.registry).labels(model_name)
                                   for name, documentation, buckets in (
            ("vllm:request_prompt_tokens", "Prompt tokens of each finished request", token_buckets),
            ("vllm:request_generation_tokens", "Tokens each finished request generated", token_buckets),
            ("vllm:request_queue_time_seconds", "From a request's arrival to its first step",
             _VLLM_REQUEST_LATENCY_BUCKETS_S),
            ("vllm:request_prefill_time_seconds", "From a request's first step to its first token",
             _VLLM_REQUEST_LATENCY_BUCKETS_S),
            ("vllm:request_decode_time_seconds", "From a request's first token to its last",
             _VLLM_REQUEST_LATENCY_BUCKETS_S),
            # per completion, as vLLM observes them: glimmer_time_to_first_token_seconds and
            # glimmer_request_duration_seconds time each HTTP request from its arrival at the server
            ("vllm:time_to_first_token_seconds", "From a request's arrival at the engine to its first token (one per "
             "completion that generated one, observed as it ends)", _VLLM_TIME_TO_FIRST_TOKEN_BUCKETS_S),
            ("vllm:e2e_request_latency_seconds", "From a request's arrival at the engine to its end (one per "
             "finished completion, aborted and failed ones included)", _VLLM_REQUEST_LATENCY_BUCKETS_S))}
        engine.on_finished(self._finished)
        # the same gaps in vLLM's buckets, under its name and its older one (registered by _HistogramUnderVllmNames)
        self._vllm_inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds", "Between consecutive steps that gave one completion tokens",
            buckets=_VLLM_INTER_TOKEN_LATENCY_BUCKETS_S, registry=None)
        engine.on_token_gap(self.observe_token_gap)
        self.registry.register(_EngineCollector(engine, model_name))
        self.registry.register(_HistogramUnderVllmNames(self._vllm_inter_token_latency, [
            "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"], model_name))

    def observe_token_gap(self, seconds: float) -> None:
        """A step gave a completion tokens `seconds` after its previous one did (on the engine thread)."""
        self.inter_token_latency.observe(seconds)
        self._vllm_inter_token_latency.observe(seconds)

    def _finished(self, record: FinishedCompletion) -> None:
        """One completion ended (on the engine thread): vLLM's per-request figures, those that were measured."""
        self.request_success.labels(self._model_name, record.finish_reason).inc()
        for name, value in (("vllm:request_prompt_tokens", record.num_prompt_tokens),
                            ("vllm:request_generation_tokens", record.num_generation_tokens),
                            ("vllm:request_queue_time_seconds", record.queue_time),
                            ("vllm:request_prefill_time_seconds", record.prefill_time),
                            ("vllm:request_decode_time_seconds", record.decode_time),
                            ("vllm:time_to_first_token_seconds", record.time_to_first_token),
                            ("vllm:e2e_request_latency_seconds", record.e2e_latency)):
            if value is not None:
                self.request_histograms[name].observe(value)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Observes one request's time to first token and its duration (arrival is `time.monotonic()` when the request
    came in). The gaps between a completion's tokens are the engine's to time (`AsyncEngine.on_token_gap`): a
    request read late gets several steps' tokens at once."""

    def __init__(self, metrics: ServerMetrics, arrival: float):
        self._metrics = metrics
        self._arrival = arrival
        self._first_token_seen = False

    def tokens(self, count: int) -> None:
        """A delta of `count` new tokens of one of the request's completions; one of none (a scored prompt's
        logprobs, with max_tokens 0) is no token, so a request that generates nothing has no time to first token."""
        if count and not self._first_token_seen:
            self._first_token_seen = True
            self._metrics.time_to_first_token.observe(time.monotonic() - self._arrival)

    def done(self) -> None:
        self._metrics.request_latency.observe(time.monotonic() - self._arrival)
