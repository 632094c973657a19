"""Helpers shared by the server tests: a live server on a loopback port, `glimmer serve` in a subprocess
(`ServeProcess`, from `serve_process`, which the benches import alone), and a scripted token source.

`live_server` starts the real stack — engine thread, FastAPI app, uvicorn — on a free port. With a
`ScriptedRunner` only the neural network is replaced: the scheduler, KV cache, sampler, detokenizer,
protocol parser and HTTP layers stay real.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from serve_process import ServeProcess as ServeProcess  # re-exported: the tests import them from here
from serve_process import ServerDidNotStart as ServerDidNotStart
from serve_process import free_port as free_port
from serve_process import wait_for_health as wait_for_health

from glimmer.engine.async_engine import AsyncEngine
from glimmer.engine.call_length import fewest_call_tokens
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.engine.model_runner import StepLogits
from glimmer.engine.scheduler import ScheduledStep
from glimmer.protocol import normalize_tools
from glimmer.protocol.tokens import EOT
from glimmer.server.app import create_app
from glimmer.server.background import BackgroundServer
from glimmer.server.settings import ServerSettings

MODEL = "tiny"
PINNED_DATE = {"current_date": "2026-01-01"}  # P-TMPL-3: tests pin the date

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time in a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}

_AGENT_WEATHER_CALL = (' to=self<|message|>I should look the weather up.<|eom|>'
                       '<|start|>assistant to=get_weather<|message|><atem:function_calls>\n'
                       '<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris</atem:parameter>\n'
                       '</atem:invoke>\n</atem:function_calls><|eot|>')
# Turns for the Responses and agent tests. The first key found in the prompt wins: tool results come before the
# questions that led to them.
AGENT_SCRIPTS = {
    "[sunny-result]": " to=self<|message|>The tool says sunny.<|eom|><|start|>assistant to=user<|message|>"
                      "It is sunny in Paris.<|eot|>",
    "[weather]": _AGENT_WEATHER_CALL,
    "[greet]": " to=self<|message|>The user greets me.<|eom|><|start|>assistant to=user<|message|>Hello there!<|eot|>",
}


def spelled_text(tokens: list[str]) -> str:
    """The text legacy completions `logprobs.tokens` spell: a `bytes:\\xNN…` token (OpenAI's spelling of a piece of
    a character) stands for its bytes; bytes that are no UTF-8 read U+FFFD, as in the choice's text."""
    data = b"".join(bytes.fromhex(token[len("bytes:"):].replace("\\x", "")) if token.startswith("bytes:")
                    else token.encode() for token in tokens)
    return data.decode(errors="replace")


@dataclass
class LiveServer:
    url: str
    engine: AsyncEngine
    app: Any

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}."""
        samples = {}
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def wait_for_idle(self, timeout_s: float = 10.0) -> dict[str, float]:
        """Poll /metrics until no sequence runs or waits and no KV block is in use, in two samples in a row; returns
        the second. The engine thread frees an aborted request's sequence and blocks before it hands out the final
        delta that counts the completion (vllm:request_success_total): a sample taken between the two looked idle
        with the abort not yet counted."""
        deadline = time.monotonic() + timeout_s
        idle_before = False
        while True:
            samples = self.metrics()
            busy = [k for k, v in samples.items() if v and re.match(
                r"glimmer_(kv_blocks_used|num_requests_running|num_requests_waiting)\b", k)]
            if (not busy and idle_before) or time.monotonic() > deadline:
                return samples
            idle_before = not busy
            time.sleep(0.05)


@contextlib.contextmanager
def live_server(checkpoint: Path, *, scripted: bool = False, max_waiting_requests: int = 1024,
                engine_options: dict[str, Any] | None = None, request_read_timeout_s: float = 30.0,
                generation_config: str = "auto", **settings: Any) -> Iterator[LiveServer]:
    config = EngineConfig(**{"model": str(checkpoint), "progress": False, "kv_cache_memory": 32 << 20,
                             "max_model_len": 2048, "max_num_seqs": 64, **(engine_options or {})})
    engine = AsyncEngine(config, max_waiting_requests=max_waiting_requests, generation_config=generation_config)
    try:
        if scripted:
            engine.engine.runner = ScriptedRunner(engine.engine)
        app = create_app(engine, ServerSettings(served_model_names=(MODEL, "tiny-alias"), **settings))
        with BackgroundServer(app, request_read_timeout_s=request_read_timeout_s) as server:
            yield LiveServer(server.url, engine, app)
    finally:
        engine.shutdown()


@contextlib.contextmanager
def agent_server(checkpoint: Path, **settings: Any) -> Iterator[LiveServer]:
    """A scripted `live_server` that follows AGENT_SCRIPTS: the agent tests' server (settings as live_server's)."""
    with live_server(checkpoint, scripted=True, **settings) as live:
        for key, transcript in AGENT_SCRIPTS.items():
            live.engine.engine.runner.add(key, transcript)
        yield live


class ScriptedRunner:
    """Stands in for `ModelRunner`: the next-token logits prefer what given transcripts say comes next.

    `add(key, *texts)` registers transcripts (protocol text, tokenized with the checkpoint's tokenizer) for
    every request whose prompt contains `key`. A sequence's preferences are the next tokens of the transcripts
    its output still agrees with, the first transcript most (logit 100, then 90, …); with none left it
    prefers `<|eot|>`. Under greedy sampling the output follows the first transcript the token controller
    (if any) lets it follow: a transcript listed second is the model's fallback when the first is steered off.
    `add_per_choice(key, *texts)` gives each completion of such a request (`n`) its own transcript instead.
    """

    def __init__(self, engine: LLMEngine):
        self.tokenizer = engine.tokenizer
        self.vocab_size = engine.model_config.text.vocab_size
        self.eot_id = self.tokenizer.require_token_id(EOT)
        self.prompts: list[str] = []
        self._scripts: dict[str, list[list[int]]] = {}
        self._per_choice: dict[str, list[list[int]]] = {}
        self._by_sequence: dict[tuple[str, int], list[list[int]]] = {}
        self.step_delay_s = 0.0  # a step's time: a client then reads as fast as tokens come (no deltas merged)

    def add(self, key: str, *texts: str) -> None:
        self._scripts[key] = [self.tokenizer.encode(text) for text in texts]

    def add_per_choice(self, key: str, *texts: str) -> None:
        """Completion i of every request whose prompt contains `key` follows `texts[i]` alone."""
        self._per_choice[key] = [self.tokenizer.encode(text) for text in texts]

    def add_ids(self, key: str, *transcripts: list[int]) -> None:
        """`add` with transcripts of token ids, for tokens no text encodes to (a special token spelled as text)."""
        self._scripts[key] = [list(ids) for ids in transcripts]

    def _transcripts(self, seq) -> list[list[int]]:
        ident = (seq.request_id, seq.index)
        if ident not in self._by_sequence:
            prompt = self.tokenizer.decode(seq.prompt_token_ids)
            self.prompts.append(prompt)
            found = [[ids[seq.index]] for key, ids in self._per_choice.items() if key in prompt]
            found += [ids for key, ids in self._scripts.items() if key in prompt]
            self._by_sequence[ident] = found[0] if found else []
        return self._by_sequence[ident]

    def execute(self, step: ScheduledStep) -> StepLogits:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        sampling = [i for i in range(len(step.seqs)) if step.samples(i)]
        logits = torch.zeros(len(sampling), self.vocab_size)
        for row, i in enumerate(sampling):
            seq = step.seqs[i]
            output = seq.output_token_ids
            preference = 100.0
            preferred = False
            for ids in self._transcripts(seq):
                if len(ids) > len(output) and ids[:len(output)] == output:
                    token = ids[len(output)]
                    logits[row, token] = max(float(logits[row, token]), preference)
                    preferred = True
                preference -= 10.0
            if not preferred:
                logits[row, self.eot_id] = 100.0
        return StepLogits(logits, sampling, {})


def fewest_forced_call_tokens(server: LiveServer, tools: list[dict[str, Any]]) -> int:
    """The fewest tokens of a reply holding a call of one of `tools` (chat's or /v1/responses' flat declarations): a
    forced call's smallest max_tokens the server takes (a smaller one is a 400)."""
    return fewest_call_tokens(normalize_tools(tools), server.engine.engine.tokenizer)
