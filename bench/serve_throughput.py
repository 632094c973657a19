"""Serving throughput: N concurrent streaming chat clients against the server, versus sequential generation.

    python bench/serve_throughput.py [--model DIR] [--clients 16] [--requests 64] [--max-tokens 64]

Starts the server in-process on a loopback port (or uses --url), sends `--requests` streaming chat requests
from `--clients` concurrent clients (every request generates exactly --max-tokens tokens: ignore_eos), and
prints requests/s, output tokens/s, time to first token and inter-token latency percentiles. Then it runs the
same prompts one at a time through `LLM.generate` in this process and prints the server's speed-up over
that sequential baseline. Token arrival times come from the streamed logprobs (one entry per token), so ITL
is per token even when a chunk carries several. Without --model it uses the embedded glimmer-nano demo model;
with --url, --model names the checkpoint that server serves (the baseline's model), and is required.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx

from glimmer.checkpoint.formats import open_checkpoint
from glimmer.checkpoint.resolve import resolve_checkpoint
from glimmer.cli import parse_size, positive_count
from glimmer.default_model import default_model_dir
from glimmer.engine.async_engine import AsyncEngine
from glimmer.engine.llm import LLM
from glimmer.engine.llm_engine import EngineConfig
from glimmer.engine.sampling_params import SamplingParams
from glimmer.errors import GlimmerError
from glimmer.server.app import create_app
from glimmer.server.background import BackgroundServer
from glimmer.server.settings import ServerSettings

MODEL_NAME = "bench"
SYSTEM = "You are a helpful assistant. Answer in detail."


@dataclass
class RequestTiming:
    start: float
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.start

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]


def messages_for(i: int, prompt_words: int) -> list[dict[str, str]]:
    words = " ".join(f"word{(i * 7 + k) % 97}" for k in range(prompt_words))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Request {i}: {words}"}]


async def one_request(http: httpx.AsyncClient, i: int, args: argparse.Namespace) -> RequestTiming:
    body = {"model": MODEL_NAME, "messages": messages_for(i, args.prompt_words), "max_tokens": args.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "logprobs": True,
            "chat_template_kwargs": {"current_date": "2026-01-01"}}
    timing = RequestTiming(time.perf_counter())
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            now = time.perf_counter()
            for choice in chunk["choices"]:
                if choice.get("logprobs"):
                    timing.token_times.extend(now for _ in choice["logprobs"]["content"])
    return timing


async def run_clients(url: str, args: argparse.Namespace) -> tuple[list[RequestTiming], float]:
    pending = iter(range(args.requests))
    results: list[RequestTiming] = []

    async def client(http: httpx.AsyncClient) -> None:
        for i in pending:
            results.append(await one_request(http, i, args))

    limits = httpx.Limits(max_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await one_request(http, -1, args)  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(args.clients)))
        return results, time.perf_counter() - start


def sequential_baseline(model: str, args: argparse.Namespace) -> tuple[int, float]:
    llm = LLM(model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
              kv_cache_memory=args.kv_cache_memory, progress=False)
    template, tokenizer = llm.engine.chat_template, llm.engine.tokenizer
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=0)
    prompts = [tokenizer.encode(template.render(messages_for(i, args.prompt_words),
                                                special_tokens=tokenizer.special_tokens,
                                                chat_template_kwargs={"current_date": "2026-01-01"}))
               for i in range(args.baseline_requests)]
    llm.generate([prompts[0]], params)  # warm-up
    start = time.perf_counter()
    tokens = sum(len(llm.generate([ids], params)[0].token_ids) for ids in prompts)
    return tokens, time.perf_counter() - start


def percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a"
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return "  ".join(f"p{p} {cuts[p - 1] * 1000:8.2f} ms" for p in (50, 90, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint (default: the embedded tiny demo model)")
    parser.add_argument("--url", default=None, help="benchmark a running server instead (served as 'bench')")
    parser.add_argument("--clients", type=positive_count, default=16)
    parser.add_argument("--requests", type=positive_count, default=64)
    parser.add_argument("--max-tokens", type=positive_count, default=64)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--baseline-requests", type=positive_count, default=8,
                        help="prompts for the sequential baseline")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--kv-cache-memory", type=parse_size, default=None, metavar="SIZE",
                        help="KV cache size, e.g. 8GiB (default: the engine's)")
    args = parser.parse_args()
    if args.url and not args.model:
        parser.error("argument --url: give --model too, the checkpoint that server serves: the sequential baseline "
                     "runs it in this process")
    logging.basicConfig(level=logging.ERROR)  # a random model's output makes the parser warn a lot
    model = args.model or str(default_model_dir())
    # the checkpoint and the engine's settings before any request: with --url the baseline loads them after the load
    try:
        open_checkpoint(resolve_checkpoint(model), weights=False)
    except GlimmerError as error:
        parser.error(f"argument --model: {error}")
    try:
        config = EngineConfig(model=model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
                              max_num_seqs=args.max_num_seqs, kv_cache_memory=args.kv_cache_memory, progress=False)
        config.resolved_dtype(config.resolved_device())
    except GlimmerError as error:
        parser.error(str(error))

    if args.url:
        try:
            results, elapsed = asyncio.run(run_clients(args.url, args))
        except httpx.HTTPError as error:  # no server there, or one that refuses the requests (a 404: not 'bench')
            reason = str(error).partition("\n")[0]  # a status error's second line is a link to MDN
            sys.exit(f"serve_throughput.py: a request to {args.url} failed: {type(error).__name__}: {reason}")
    else:
        engine = AsyncEngine(config)
        try:
            app = create_app(engine, ServerSettings(served_model_names=(MODEL_NAME,)))
            with BackgroundServer(app) as server:
                results, elapsed = asyncio.run(run_clients(server.url, args))
            device = f"{engine.engine.device} ({engine.engine.dtype})"
        finally:
            engine.shutdown()
    output_tokens = sum(len(r.token_times) for r in results)
    server_rate = output_tokens / elapsed
    print(f"model {model}" + ("" if args.url else f" on {device}"))
    print(f"{len(results)} requests, {args.clients} concurrent clients, {args.max_tokens} output tokens each")
    print(f"requests/s        {len(results) / elapsed:10.2f}")
    print(f"output tokens/s   {server_rate:10.1f}")
    print(f"TTFT              {percentiles([r.ttft for r in results])}")
    print(f"ITL               {percentiles([gap for r in results for gap in r.gaps])}")
    tokens, seconds = sequential_baseline(model, args)
    print(f"sequential LLM.generate ({args.baseline_requests} requests): {tokens / seconds:10.1f} output tokens/s")
    print(f"server / sequential: {server_rate / (tokens / seconds):.2f}x")


if __name__ == "__main__":
    main()
