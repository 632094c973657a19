"""Soak: N streaming clients for M minutes, hanging up at random, against a real `glimmer serve` process.

    python bench/soak.py [--model DIR] [--device cuda] [--clients 256] [--minutes 10] [--disconnect-rate 0.2]

Starts `glimmer serve` as a subprocess on a loopback port (or soaks a running server with --url), first times
one request on the idle server (the baseline), then runs the clients until the time is up: each sends
streaming chat requests (some /v1/completions), and with probability --disconnect-rate hangs up at a random
moment (before the first token or mid-stream). It prints, every --report-s seconds, the requests done so far
and the server's resident memory (RSS, from /proc), and at the end: requests completed, hung up and failed
(any 5xx, transport error or error event counts as failed), end-to-end latency and time to first token
percentiles with their ratio to the idle baseline, output tokens/s, RSS growth since the start, and the state
after drain (running, waiting and KV blocks in use must return to zero; /health must stay 200). Exits 1 if
any request failed or the server did not drain. Without --model it uses the embedded tiny demo model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
from serve_process import ServeProcess, ServerDidNotStart  # noqa: E402

MODEL_NAME = "soak"
BUSY_GAUGES = re.compile(r"glimmer_(num_requests_running|num_requests_waiting|kv_blocks_used)\b")


@dataclass
class Tally:
    completed: int = 0
    hung_up: int = 0
    failed: int = 0
    output_tokens: int = 0
    latencies_s: list[float] = field(default_factory=list)
    ttfts_s: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        self.failed += 1
        self.failures[reason] = self.failures.get(reason, 0) + 1


# every chunk carries the usage so far (vLLM's continuous_usage_stats): the tokens generated, reasoning included,
# which chat logprobs leave out (they cover the answer only)
USAGE_SO_FAR = {"include_usage": True, "continuous_usage_stats": True}


def request_body(rng: random.Random, args: argparse.Namespace) -> tuple[str, dict]:
    words = " ".join(f"w{rng.randint(0, 999)}" for _ in range(rng.randint(4, args.prompt_words)))
    max_tokens = rng.randint(1, args.max_tokens)
    if rng.random() < 0.2:
        return "/v1/completions", {"model": MODEL_NAME, "prompt": words, "max_tokens": max_tokens, "stream": True,
                                   "ignore_eos": True, "logprobs": 0, "stream_options": USAGE_SO_FAR}
    return "/v1/chat/completions", {
        "model": MODEL_NAME, "messages": [{"role": "user", "content": words}], "max_tokens": max_tokens,
        "stream": True, "ignore_eos": True, "temperature": rng.choice([0, 0.7, 1.0]), "logprobs": True,
        "chat_template_kwargs": {"current_date": "2026-01-01"}, "stream_options": USAGE_SO_FAR}


async def one_request(http: httpx.AsyncClient, rng: random.Random, args: argparse.Namespace, tally: Tally) -> None:
    path, body = request_body(rng, args)
    hang_up_after_tokens = None
    if rng.random() < args.disconnect_rate:
        hang_up_after_tokens = rng.randint(0, body["max_tokens"] - 1)  # 0: before the first token
    start = time.perf_counter()
    first = None
    received = 0
    try:
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                tally.fail(f"HTTP {response.status_code}")
                return
            async for line in response.aiter_lines():
                if hang_up_after_tokens is not None and received >= hang_up_after_tokens:
                    tally.hung_up += 1
                    return  # leaving the block closes the connection mid-stream
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    tally.fail(f"error event {event['error'].get('type')}")
                    return
                tokens = (event.get("usage") or {}).get("completion_tokens", received) - received
                if tokens and first is None:
                    first = time.perf_counter()
                received += tokens
                tally.output_tokens += tokens
    except httpx.HTTPError as error:
        tally.fail(type(error).__name__)
        return
    tally.completed += 1
    tally.latencies_s.append(time.perf_counter() - start)
    if first is not None:
        tally.ttfts_s.append(first - start)


async def soak(url: str, args: argparse.Namespace, server_pid: int | None) -> tuple[Tally, float, list[str]]:
    tally = Tally()
    deadline = time.monotonic() + args.minutes * 60
    reports: list[str] = []
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients)

    async def client(http: httpx.AsyncClient, seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            await one_request(http, rng, args, tally)

    async def reporter() -> None:
        started = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(min(args.report_s, max(0.0, deadline - time.monotonic())))
            line = (f"{time.monotonic() - started:7.1f} s  completed {tally.completed:6d}  hung up {tally.hung_up:5d}  "
                    f"failed {tally.failed:4d}  RSS {rss_text(server_pid)}")
            reports.append(line)
            print(line, flush=True)

    async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout_s, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(reporter(), *(client(http, args.seed * 100_003 + i) for i in range(args.clients)))
        return tally, time.perf_counter() - start, reports


def idle_baseline(url: str, args: argparse.Namespace) -> tuple[float, float]:
    """(latency, TTFT) of requests alone on the idle server: the same work without contention."""
    rng = random.Random(args.seed)
    tally = Tally()
    idle_args = argparse.Namespace(**{**vars(args), "disconnect_rate": 0.0})

    async def run() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=args.request_timeout_s) as http:
            for _ in range(args.baseline_requests):
                await one_request(http, rng, idle_args, tally)

    asyncio.run(run())
    if tally.failed or not tally.latencies_s:
        raise SystemExit(f"the idle baseline failed: {tally.failures}")
    return statistics.median(tally.latencies_s), statistics.median(tally.ttfts_s)


def busy_gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and BUSY_GAUGES.match(line):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def drain(url: str, timeout_s: float) -> tuple[dict[str, float], float]:
    """Poll /metrics until nothing runs, waits or holds a KV block; returns the last sample and the wait."""
    start = time.monotonic()
    while True:
        samples = busy_gauges(url)
        if not any(samples.values()) or time.monotonic() - start > timeout_s:
            return samples, time.monotonic() - start
        time.sleep(0.2)


def rss_bytes(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def rss_text(pid: int | None) -> str:
    rss = rss_bytes(pid)
    return "n/a" if rss is None else f"{rss / 2**20:8.1f} MiB"


def percentile_ms(values: list[float], p: int) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1] * 1000


@contextlib.contextmanager
def serve(args: argparse.Namespace):
    """`glimmer serve` in a subprocess on a free port the system picks (`--port 0`, the URL it reports); yields
    (url, pid). What it writes is shown if it does not start."""
    command = ["-m", "glimmer.cli", "--log-level", "WARNING", "serve"]
    command += [args.model] if args.model else []
    command += ["--served-model-name", MODEL_NAME, "--max-model-len", str(args.max_model_len)]
    for flag in ("device", "dtype", "max_num_seqs", "kv_cache_memory"):
        value = getattr(args, flag)
        if value is not None:
            command += [f"--{flag.replace('_', '-')}", str(value)]
    command += args.serve_arg
    server = ServeProcess(command)
    try:
        try:
            url = server.wait_until_serving(timeout_s=args.startup_timeout_s)
        except ServerDidNotStart as error:  # it exited, or did not serve in time
            raise SystemExit(f"the server did not start: {error.reason}:\n{error.output[-4000:]}") from None
        yield url, server.process.pid
    finally:
        server.stop(signal.SIGTERM, timeout_s=30)


# Copies of glimmer.cli.count and number: soak imports no glimmer code, a pure HTTP client that soaks a server
# (--url) with the standard library and httpx alone, the server stack and torch not loaded beside it.
def count(text: str, least: int = 1) -> int:
    """A count an option takes (clients, tokens, requests): a whole number, `least` or more (0 clients waited on
    nothing, 0 tokens ended in randint's ValueError)."""
    number = int(text) if text.strip().isascii() and text.strip().isdigit() else least - 1
    if number < least:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: give a whole number, {least} or more")
    return number


def prompt_words(text: str) -> int:
    """--prompt-words: each prompt takes 4 to this many words."""
    return count(text, least=4)


def duration(text: str) -> float:
    """A span of time an option takes (minutes, seconds): a finite number above 0 (-1 minutes soaked nothing and
    reported an empty run; 0 seconds between reports printed a line every turn of the event loop)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give a number above 0")
    return value


def share(text: str) -> float:
    """--disconnect-rate: the share of requests that hang up, a probability."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:  # NaN fails it too
        raise argparse.ArgumentTypeError(f"{text!r} is not a share: give a number from 0 to 1")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory or Hub id (default: the tiny demo)")
    parser.add_argument("--url", default=None, help="soak a running server instead (it must serve 'soak')")
    parser.add_argument("--server-pid", type=int, default=None, help="with --url: the server's pid, for its RSS")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (passed to glimmer serve)")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--kv-cache-memory", default=None, help="e.g. 8GiB (passed to glimmer serve)")
    parser.add_argument("--serve-arg", action="append", default=[], help="another `glimmer serve` argument")
    parser.add_argument("--clients", type=count, default=16)
    parser.add_argument("--minutes", type=duration, default=1.0)
    parser.add_argument("--max-tokens", type=count, default=64, help="each request asks for 1..this many tokens")
    parser.add_argument("--prompt-words", type=prompt_words, default=64, help="each prompt has 4..this many words")
    parser.add_argument("--disconnect-rate", type=share, default=0.2, help="share of requests that hang up, 0 to 1")
    parser.add_argument("--baseline-requests", type=count, default=8)
    parser.add_argument("--report-s", type=duration, default=10.0, help="seconds between progress lines")
    parser.add_argument("--request-timeout-s", type=duration, default=600.0)
    parser.add_argument("--drain-timeout-s", type=duration, default=60.0)
    parser.add_argument("--startup-timeout-s", type=duration, default=900.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        if args.url:
            url, pid = args.url.rstrip("/"), args.server_pid
        else:
            url, pid = stack.enter_context(serve(args))
        idle_latency, idle_ttft = idle_baseline(url, args)
        rss_start = rss_bytes(pid)
        print(f"soak: {args.clients} clients for {args.minutes} min, disconnect rate {args.disconnect_rate}, "
              f"model {args.model or 'tiny demo'}, device {args.device or 'default'}; RSS at start {rss_text(pid)}")
        tally, elapsed, _ = asyncio.run(soak(url, args, pid))
        state, waited = drain(url, args.drain_timeout_s)
        health = httpx.get(url + "/health", timeout=10).status_code
        rss_end = rss_bytes(pid)

    drained = not any(state.values())
    print(f"requests completed {tally.completed}, hung up {tally.hung_up}, failed {tally.failed} "
          f"{tally.failures or ''}")
    rate = tally.output_tokens / elapsed
    print(f"output tokens/s    {rate:10.1f}  ({tally.output_tokens} tokens in {elapsed:.1f} s)")
    for name, values, idle in (("latency", tally.latencies_s, idle_latency), ("TTFT", tally.ttfts_s, idle_ttft)):
        p50, p99 = percentile_ms(values, 50), percentile_ms(values, 99)
        print(f"{name:8s} p50 {p50:9.1f} ms  p99 {p99:9.1f} ms   idle baseline {idle * 1000:8.1f} ms  "
              f"(p50 / idle {p50 / (idle * 1000):.2f}x, p99 / idle {p99 / (idle * 1000):.2f}x)")
    if rss_start and rss_end:
        print(f"RSS start {rss_start / 2**20:.1f} MiB, end {rss_end / 2**20:.1f} MiB ({rss_end / rss_start:.3f}x)")
    print(f"after drain ({waited:.1f} s): {state}  /health {health}  -> {'drained' if drained else 'NOT DRAINED'}")
    return 0 if tally.failed == 0 and drained and health == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
