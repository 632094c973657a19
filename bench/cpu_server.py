"""What the HTTP server adds per token on the CPU: `glimmer serve` against the engine alone, in the same run.

    python bench/cpu_server.py [--max-tokens 128] [--streams 8] [--rounds 3]

Starts `glimmer serve` as a user does (a subprocess with the CLI's defaults, serving the embedded glimmer-nano on
the CPU) and loads the same model in this process with `LLM` (its defaults: float32 on the CPU). Each round, for
fresh prompts of the same words (a request that makes the model reason for as long as it is let: a stream of text
chunks up to max_tokens):

- one streamed chat completion (temperature 0, ignore_eos), with and without `stream_options.include_usage`, timed
  as each chunk that carries text arrives; and the same messages rendered, tokenized and stepped through the engine
  (`LLMEngine.step`, the loop `LLM.generate` runs), timed as each token comes out. Time to first token: from the
  request's send to its first chunk (the role chunk, which the server sends once the first token is out: the text
  comes some tokens later, after the reply's header), and from rendering to the first token on the engine's side;
- `--streams` concurrent streaming clients against `LLM.generate` of the same prompts: output tokens/s.

Prints the medians over the rounds, and the server's figures as ratios to the engine's. Inter-token latency is
the median gap between chunks (or tokens) and the mean gap (first to last over the tokens between); a chunk of
several tokens (a client slower than the engine gets them coalesced) shows in the mean, not the median.

Then the share of a token's time spent outside the model's forward (Python: scheduling, step inputs, sampling,
detokenizing, and on the server's side the protocol parser, the chunk's JSON, the HTTP layers and the hand-off
between the engine thread and the event loop): the forward is the model's call and its logits, timed in this
process's engine (a single stream's median decode step; under load, all of `LLM.generate`'s forward time over its
output tokens), and the time outside it is each figure's time a token less that forward time. The server runs the
same model on the same machine, so the engine's decode step stands for its own in the single-stream figures; under
load the prefills differ between the processes, so only `LLM.generate`'s share is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
from serve_process import ServeProcess  # noqa: E402

from glimmer.cli import positive_count  # noqa: E402
from glimmer.default_model import default_model_dir  # noqa: E402
from glimmer.engine.llm import LLM  # noqa: E402
from glimmer.engine.sampling_params import SamplingParams  # noqa: E402

TEMPLATE_KWARGS = {"current_date": "2026-01-01"}  # the server and the engine render the same prompt on any day


class ForwardClock:
    """Seconds `LLM`'s model spends in its forward and logits (the model's call and `compute_logits`), per call."""

    def __init__(self, llm: LLM):
        self.seconds: list[float] = []
        model = llm.engine.runner.model
        for name in ("forward", "compute_logits"):
            setattr(model, name, self._timed(getattr(model, name)))

    def _timed(self, method):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - start)
        return timed

    def take(self) -> list[float]:
        """The calls' seconds since the last take: a step's forward and its logits, in turn."""
        seconds, self.seconds = self.seconds, []
        return seconds


@dataclass
class Stream:
    """One stream's timings: seconds from the start to the first token, the gaps after it, and its tokens."""

    ttft_s: float
    gaps_s: list[float]
    tokens: int

    @property
    def mean_gap_s(self) -> float:
        return sum(self.gaps_s) / (self.tokens - 1)


def messages_for(number: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Tell me a long story about dragon number {number}."}]


@contextlib.contextmanager
def glimmer_serve() -> Iterator[str]:
    """`glimmer serve` with the CLI's defaults on a free port: yields its URL once it answers /health."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    server = ServeProcess(["-m", "glimmer.cli", "serve"], env=env)
    try:
        yield server.wait_until_serving(timeout_s=300)
    finally:
        server.stop(signal.SIGTERM)


def stream_chat(client: httpx.Client, url: str, number: int, max_tokens: int, include_usage: bool) -> Stream:
    """A streamed chat completion timed at each chunk whose delta carries text (reasoning, content or a call)."""
    body = {"model": "glimmer-nano", "messages": messages_for(number), "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "chat_template_kwargs": TEMPLATE_KWARGS}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    arrivals: list[float] = []
    first_chunk = tokens = finish = None
    start = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first_chunk = first_chunk or time.perf_counter()
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                    arrivals.append(time.perf_counter())
                finish = choice["finish_reason"] or finish
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if tokens is None:  # without usage: ignore_eos runs to max_tokens unless the server ended the choice sooner
        if finish != "length":
            raise RuntimeError(f"the stream ended with {finish!r} before max_tokens; choose other prompts")
        tokens = max_tokens
    return Stream(first_chunk - start, [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)], tokens)


def engine_stream(llm: LLM, clock: ForwardClock, number: int, max_tokens: int) -> tuple[Stream, float, float]:
    """The same request stepped through the engine: rendered, tokenized, added, and timed at each token; and the
    median seconds of a decode step's forward and of its time outside the forward (its first step, the prefill,
    left out)."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    ids = prompt_ids(llm, number)
    engine.add_request(f"bench-{number}", ids, params)
    arrivals: list[float] = []
    clock.take()
    forwards: list[float] = []
    outside: list[float] = []
    while engine.has_unfinished_requests:
        stepped = time.perf_counter()
        deltas = engine.step()
        now = time.perf_counter()
        arrivals += [now for delta in deltas if delta.token_ids]
        forwards.append(sum(clock.take()))
        outside.append(now - stepped - forwards[-1])
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return (Stream(arrivals[0] - start, gaps, len(arrivals)), statistics.median(forwards[1:]),
            statistics.median(outside[1:]))


def prompt_ids(llm: LLM, number: int) -> list[int]:
    engine = llm.engine
    text = engine.chat_template.render(messages_for(number), special_tokens=engine.tokenizer.special_tokens,
                                       chat_template_kwargs=TEMPLATE_KWARGS)
    return engine.tokenizer.encode(text)


def server_load(url: str, numbers: list[int], max_tokens: int) -> float:
    """Output tokens/s of one concurrent streaming client per prompt."""
    streams: list[Stream] = []

    def client(number: int) -> None:
        with httpx.Client() as http:
            streams.append(stream_chat(http, url, number, max_tokens, include_usage=True))

    threads = [threading.Thread(target=client, args=(number,)) for number in numbers]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if len(streams) != len(numbers):
        raise RuntimeError("a client failed (see above)")
    return sum(s.tokens for s in streams) / elapsed


def engine_load(llm: LLM, clock: ForwardClock, numbers: list[int], max_tokens: int) -> tuple[float, float]:
    """Output tokens/s of `LLM.generate` of the prompts together, and its forward's seconds per output token."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    clock.take()
    start = time.perf_counter()
    outputs = llm.generate([prompt_ids(llm, number) for number in numbers], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return tokens / elapsed, sum(clock.take()) / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=positive_count, default=128)
    parser.add_argument("--streams", type=positive_count, default=8, help="concurrent clients of the load figure")
    parser.add_argument("--rounds", type=positive_count, default=3)
    args = parser.parse_args()
    with glimmer_serve() as url:
        llm = LLM(str(default_model_dir()), progress=False)
        clock = ForwardClock(llm)
        print(f"glimmer-nano on {llm.engine.device} ({llm.engine.dtype}); {args.max_tokens} tokens a stream, "
              f"{args.rounds} rounds; server: `glimmer serve` with the CLI's defaults")
        figures: dict[str, list[float]] = {}

        def add(name: str, value: float) -> None:
            figures.setdefault(name, []).append(value)

        with httpx.Client() as client:
            stream_chat(client, url, -1, 16, include_usage=True)  # warm-up
            engine_stream(llm, clock, -1, 16)
            for round_number in range(args.rounds):
                # the engine and the server answer the same prompt (each process has its own prefix cache); the
                # request with usage gets another, so that it finds no more of its prompt cached than the first did
                number = round_number * (args.streams + 2)
                for name, prompt, run in (
                        ("engine", number, lambda n: engine_stream(llm, clock, n, args.max_tokens)),
                        ("server", number, lambda n: stream_chat(client, url, n, args.max_tokens, False)),
                        ("server+usage", number + 1, lambda n: stream_chat(client, url, n, args.max_tokens, True))):
                    stream = run(prompt)
                    if name == "engine":
                        stream, forward_s, outside_s = stream
                        add("engine forward", forward_s)
                        add("engine step outside", outside_s)
                    add(f"{name} ttft", stream.ttft_s)
                    add(f"{name} itl median", statistics.median(stream.gaps_s))
                    add(f"{name} itl mean", stream.mean_gap_s)
                numbers = list(range(number + 2, number + 2 + args.streams))
                rate, forward_s = engine_load(llm, clock, numbers, args.max_tokens)
                add("engine load", rate)
                add("engine load forward", forward_s)
                add("server load", server_load(url, numbers, args.max_tokens))

    def median(name: str) -> float:
        return statistics.median(figures[name])

    for what, unit, scale in (("ttft", "ms", 1e3), ("itl median", "ms", 1e3), ("itl mean", "ms", 1e3)):
        engine = median(f"engine {what}")
        print(f"{what:<11} engine {engine * scale:7.2f} {unit}   " + "   ".join(
            f"{name} {median(f'{name} {what}') * scale:7.2f} {unit} ({median(f'{name} {what}') / engine:.2f})"
            for name in ("server", "server+usage")))
    engine, server = median("engine load"), median("server load")
    print(f"{args.streams} streams: LLM.generate {engine:7.1f} tok/s   server {server:7.1f} tok/s "
          f"({server / engine:.2f})")
    forward, outside = median("engine forward"), median("engine step outside")
    print(f"outside the forward, a token: the forward {forward * 1e3:.3f} ms (a decode step's median); engine step "
          f"{outside * 1e3:.3f} ms ({outside / (forward + outside):.0%} of its step)   " + "   ".join(
              f"{name} {(median(f'{name} itl median') - forward) * 1e3:.3f} ms "
              f"({1 - forward / median(f'{name} itl median'):.0%} of its median gap)"
              for name in ("server", "server+usage")))
    forward = median("engine load forward")
    print(f"outside the forward, {args.streams} streams: LLM.generate's forward {forward * 1e3:.3f} ms an output token "
          f"(its prefills included), outside it {(1 / engine - forward) * 1e3:.3f} ms ({1 - forward * engine:.0%})")


if __name__ == "__main__":
    main()
