"""The host time an agent's chat request spends before the model's first forward, against a short prefill.

    python bench/agent_request.py [--tools 50] [--messages 100] [--rounds 5] [--turns 8]

An agent sends the same long context with every turn: tens of tools whose parameters nest objects, arrays, enums
and anyOf, a history of reasoning, tool calls (ATEM, protocol.md §3) and tool results, at times a response_format
json_schema, streamed. Everything the server does before the first forward (the body's validation, the tools'
schema checks, rendering, tokenizing, the turn's grammar, the prefix-cache lookup and scheduling) is added to each
turn's time to first token. Serving the embedded glimmer-nano on the CPU in this process (the FastAPI app behind
uvicorn on a loopback port, as the server tests run it):

- short prefill: a one-message chat (about 40 prompt tokens), streamed with max_tokens 1; its first forward's
  seconds are the baseline every figure is a ratio to, measured in each round beside the others;
- host phases of a large agent request (`--tools`, `--messages`; it need not fit the model's 4,096 tokens, nothing
  runs it): the body parsed and validated (`parse_body`), then the prompt built (`build_chat_prompt`), split into the
  tools' normalization and schema checks, rendering (normalization, template), tokenizing and the turn's grammar;
  with and without a response_format json_schema;
- per tool: the prompt of `--tools` tools and two messages less that of no tools, over the tools, against a no-tool
  request's whole host time;
- agent turns through the server: a conversation of 4 tools that grows by a tool call and its result each turn
  (`--turns`, up to the context), streamed with max_tokens 1. From the request's send to its first forward's start
  (the engine's clock), against that forward's own seconds: the prefix cache leaves it only the turn's new tail.

Each figure is the median over `--rounds` rounds; the variants are interleaved within a round, so a load that comes
and goes on a shared machine falls on all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from glimmer.cli import positive_count  # noqa: E402
from glimmer.default_model import default_model_dir  # noqa: E402
from glimmer.engine.async_engine import AsyncEngine  # noqa: E402
from glimmer.engine.llm_engine import EngineConfig  # noqa: E402
from glimmer.server import chat_prompt  # noqa: E402
from glimmer.server.app import create_app  # noqa: E402
from glimmer.server.background import BackgroundServer  # noqa: E402
from glimmer.server.context import ServingContext  # noqa: E402
from glimmer.server.schemas import ChatCompletionRequest, parse_body  # noqa: E402
from glimmer.server.settings import ServerSettings  # noqa: E402

MODEL = "glimmer-nano"
TEMPLATE_KWARGS = {"current_date": "2026-01-01"}  # the same prompt on any day


def tool(index: int) -> dict[str, Any]:
    """A tool of nested parameters, as coding agents declare them: enums, bounds, an array of objects, an anyOf."""
    filters = {"type": "array", "items": {"type": "object", "properties": {
        "field": {"type": "string", "description": "The field to compare."},
        "op": {"type": "string", "enum": ["eq", "ne", "lt", "gt", "contains"]},
        "value": {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]}},
        "required": ["field", "op"]}}
    parameters = {"type": "object", "properties": {
        "path": {"type": "string", "description": f"The file or folder that tool_{index} works on."},
        "mode": {"type": "string", "enum": ["read", "write", "append"]},
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
        "options": {"type": "object", "properties": {"recursive": {"type": "boolean"}, "depth": {"type": "integer"},
                                                     "filters": filters}},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
        "target": {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"id": {"type": "integer"}}}]},
    }, "required": ["path"]}
    return {"type": "function", "function": {"name": f"tool_{index}", "parameters": parameters,
                                             "description": f"Tool number {index} of the agent's workspace."}}


def history(messages: int, tools: int, seed: int = 0) -> list[dict[str, Any]]:
    """A system prompt, a task, then (reasoning and a tool call, its result) pairs up to `messages` messages."""
    rng = random.Random(seed)
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent. Read before you write. " * 8},
        {"role": "user", "content": "The test suite fails on main; find the cause and fix it."}]
    while len(conversation) < messages:
        number = len(conversation) // 2
        name = f"tool_{rng.randrange(max(tools, 1))}"
        arguments = {"path": f"src/module_{number}.py", "mode": "read", "limit": 50,
                     "options": {"recursive": False, "filters": [{"field": "name", "op": "eq", "value": number}]}}
        conversation.append({"role": "assistant", "content": None,
                             "reasoning_content": "This module may cause the failure; I read it. " * rng.randint(1, 4),
                             "tool_calls": [{"id": f"call_{number}", "type": "function",
                                             "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        conversation.append({"role": "tool", "tool_call_id": f"call_{number}", "name": name,
                             "content": f"{number}: def handler(request):\n    return respond(request)\n"
                             * rng.randint(1, 6)})
    return conversation[:messages]


def agent_request(tools: int, messages: int, *, json_schema: bool = False) -> dict[str, Any]:
    body = {"model": MODEL, "messages": history(messages, tools), "tools": [tool(i) for i in range(tools)],
            "stream": True, "max_tokens": 1, "chat_template_kwargs": TEMPLATE_KWARGS}
    if json_schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "verdict", "schema": tool(0)["function"]["parameters"]}}
    return body


class PhaseClock:
    """Seconds spent in named functions of `chat_prompt` (and the tokenizer's encode) while it is entered."""

    def __init__(self, context: ServingContext):
        self.seconds: dict[str, float] = defaultdict(float)
        self._context = context

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        names = {"tools": "normalize_tools", "render": "render_conversation", "grammar": "turn_controller_factory"}
        originals = {name: getattr(chat_prompt, name) for name in names.values()}
        tokenizer = self._context.tokenizer
        for phase, name in names.items():
            setattr(chat_prompt, name, self._timed(phase, originals[name]))
        tokenizer.encode = self._timed("tokenize", tokenizer.encode)
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(chat_prompt, name, original)
            del tokenizer.encode

    def _timed(self, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start
        return timed


def host_phases(context: ServingContext, body: dict[str, Any]) -> dict[str, float]:
    """Seconds of each phase before the engine for one request body: parsed, then its prompt built."""
    raw = json.dumps(body).encode()
    clock = PhaseClock(context)
    start = time.perf_counter()
    request = parse_body(ChatCompletionRequest, raw)
    parsed = time.perf_counter()
    with clock.timing():
        chat_prompt.build_chat_prompt(request, context)
    built = time.perf_counter()
    return {"parse": parsed - start, **clock.seconds, "prompt": built - parsed, "host": built - start}


class ForwardClock:
    """(start, seconds) of each call of the model's forward, on the engine's thread."""

    def __init__(self, engine: AsyncEngine):
        self.calls: list[tuple[float, float]] = []
        model = engine.engine.runner.model
        forward = model.forward

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.calls.append((start, time.perf_counter() - start))
        model.forward = timed


def first_forward(client: httpx.Client, url: str, clock: ForwardClock, body: dict[str, Any]
                  ) -> tuple[float, float, int, int]:
    """(seconds from send to the first forward's start, that forward's seconds, prompt tokens, of them cached) of one
    streamed request."""
    clock.calls.clear()
    usage: dict[str, Any] = {}
    sent = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", timeout=600,
                       json={**body, "stream_options": {"include_usage": True}}) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.read().decode()}")
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"]["message"])
                usage = chunk.get("usage") or usage
    start, seconds = clock.calls[0]
    return start - sent, seconds, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tools", type=positive_count, default=50)
    parser.add_argument("--messages", type=positive_count, default=100)
    parser.add_argument("--rounds", type=positive_count, default=5)
    parser.add_argument("--turns", type=positive_count, default=8)
    args = parser.parse_args()

    engine = AsyncEngine(EngineConfig(model=str(default_model_dir()), progress=False))
    app = create_app(engine, ServerSettings(served_model_names=(MODEL,)))
    context: ServingContext = app.state.context
    clock = ForwardClock(engine)
    short = {"model": MODEL, "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
             "stream": True, "max_tokens": 1, "chat_template_kwargs": TEMPLATE_KWARGS}
    bodies = {"agent": agent_request(args.tools, args.messages),
              "agent + json_schema": agent_request(args.tools, args.messages, json_schema=True),
              "tools, 2 messages": agent_request(args.tools, 2), "no tools, 2 messages": agent_request(0, 2)}
    turn_tools = 4
    turns = [agent_request(turn_tools, 2 + 2 * turn) for turn in range(args.turns)]
    results: dict[str, list[float]] = defaultdict(list)  # seconds, and (" x") ratios to the round's short prefill
    phases: dict[str, dict[str, list[tuple[float, float]]]] = {name: defaultdict(list) for name in bodies}
    try:
        with BackgroundServer(app) as server, httpx.Client() as client:
            for body in (short, *bodies.values()):  # warm-up: the template, caches as a running server has them
                first_forward(client, server.url, clock, short) if body is short else host_phases(context, body)
            for round_number in range(args.rounds):
                prefill = statistics.median(first_forward(client, server.url, clock, short)[1] for _ in range(3))
                results["short prefill"].append(prefill)
                for name, body in bodies.items():
                    for phase, seconds in host_phases(context, body).items():
                        phases[name][phase].append((seconds, seconds / prefill))
                for turn, body in enumerate(turns):  # a new conversation each round: its first turn prefills all
                    system = dict(body["messages"][0])
                    system["content"] = f"Round {round_number}. {system['content']}"
                    host, forward, prompt_tokens, cached = first_forward(
                        client, server.url, clock, {**body, "messages": [system, *body["messages"][1:]]})
                    if turn:
                        for name, value in (("turn host", host), ("turn forward", forward),
                                            ("turn host x", host / prefill), ("turn host x forward", host / forward),
                                            ("turn prompt", prompt_tokens), ("turn cached", cached)):
                            results[name].append(value)
    finally:
        engine.shutdown()

    def median(name: str) -> float:
        return statistics.median(results[name])

    def phase(name: str, part: str) -> tuple[float, float]:
        return (statistics.median(seconds for seconds, _ in phases[name][part]),
                statistics.median(ratio for _, ratio in phases[name][part]))

    print(f"short prefill (one-message chat, first forward): {median('short prefill') * 1e3:.2f} ms  [baseline]")
    print(f"\nhost phases of one request ({args.tools} tools, {args.messages} messages; ms, x the round's short "
          "prefill):")
    for name, timings in phases.items():
        cells = "  ".join(f"{part} {phase(name, part)[0] * 1e3:.2f} ({phase(name, part)[1]:.2f}x)" for part in timings)
        print(f"  {name}: {cells}")
    (with_tools, with_ratio), (without, without_ratio) = phase("tools, 2 messages", "host"), phase(
        "no tools, 2 messages", "host")
    per_tool = (with_tools - without) / args.tools
    print(f"\nper tool: {per_tool * 1e3:.3f} ms = {per_tool / without:.2f}x a no-tool request's host time "
          f"({without * 1e3:.2f} ms), {(with_ratio - without_ratio) / args.tools:.3f}x the short prefill")
    print(f"\nagent turns ({turn_tools} tools, 4-{2 + 2 * (args.turns - 1)} messages, median prompt "
          f"{median('turn prompt'):.0f} tokens, {median('turn cached'):.0f} of them prefix cached): send to first "
          f"forward {median('turn host') * 1e3:.2f} ms = {median('turn host x forward'):.2f}x the turn's first "
          f"forward ({median('turn forward') * 1e3:.2f} ms), {median('turn host x'):.2f}x the short prefill")

if __name__ == "__main__":
    main()
