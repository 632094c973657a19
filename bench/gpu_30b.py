"""Muse Glimmer 30B on one H200: Glimmer against the hardware's own limits, measured in the same run.

Random weights at the released geometry (`glimmer make-tiny --preset 30b --config-only`, loaded with
`load_format="dummy"`), bf16. Every timed run uses fresh random prompts, so the prefix cache never hides a
prefill. Prints, in order:

- floors: device-to-device copy bandwidth; bf16 matmul rate; one decode step's weight matmuls alone (every
  layer's fused projections and the lm_head, in one CUDA graph) at batch 1, 64 and 256;
- transformers' batch-1 decode (its own random init; freed before Glimmer loads);
- Glimmer: batch-1 decode at 1K and 32K context, 64- and 256-way 1K-in/256-out output throughput (against
  the end-to-end ceiling of that load, `end_to_end_ceiling`; and the decode phase alone, against the weight
  matmuls at that batch), time to first token of an 8K prompt;
- the real HTTP server (`glimmer serve --load-format dummy` in a subprocess): single-stream inter-token
  latency and 64-client throughput on the same load as the 64-way engine run;

each figure beside its floor, and a table at the end; then the GPU's SM clock and power through the run
(`nvidia-smi`, once a second): under sustained load an H200 reaches its power cap and lowers its clock, while
the floors are measured in short bursts at full clock. Figures go to --json as well.

    python bench/gpu_30b.py [--skip-transformers] [--skip-server] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glimmer import LLM, SamplingParams  # noqa: E402
from glimmer.engine.lookahead import LaunchedStep  # noqa: E402
from glimmer.model.kernels.support import side_stream  # noqa: E402
from glimmer.tiny import write_tiny_checkpoint  # noqa: E402

sys.path.insert(0, str(ROOT / "tests" / "server"))
from serve_process import ServeProcess, ServerDidNotStart  # noqa: E402  # the tests' server process: --port 0, its URL

VOCAB_TEXT = 200_000  # random prompt ids stay among the base tokens
RESULTS: dict[str, object] = {}


def log(*parts: object) -> None:
    print(*parts, flush=True)


def record(name: str, value: float, unit: str, floor: float | None = None, floor_name: str = "") -> None:
    RESULTS[name] = {"value": round(value, 3), "unit": unit}
    text = f"{name}: {value:,.2f} {unit}"
    if floor:
        RESULTS[name] |= {"floor": round(floor, 3), "ratio": round(value / floor, 3), "floor_name": floor_name}
        text += f"  ({value / floor:.2f} of {floor_name} {floor:,.2f})"
    log(text)


def fresh_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB_TEXT, (count, length), generator=generator).tolist()


def cuda_time(fn, repeats: int = 10) -> float:
    """Median seconds of fn() timed with CUDA events (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return sorted(times)[len(times) // 2]


# ---------------------------------------------------------------------------------------------------------
# floors


def copy_bandwidth() -> float:
    source = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    target = torch.empty_like(source)
    seconds = cuda_time(lambda: target.copy_(source))
    return 2 * source.numel() * source.element_size() / seconds


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    seconds = cuda_time(lambda: a @ b)
    return 2 * 8192**3 / seconds


def weight_matmul_step(weights: list[torch.Tensor], batch: int) -> float:
    """Seconds for one step's weight matmuls alone at `batch` rows, replayed from one CUDA graph."""
    inputs = {w.shape[1]: torch.randn(batch, w.shape[1], device="cuda", dtype=w.dtype) for w in weights}
    graph = torch.cuda.CUDAGraph()
    stream = side_stream(torch.device("cuda"))  # the engine's: a stream of its own would keep a cuBLAS workspace more
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in weights:
            F.linear(inputs[w.shape[1]], w)
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, stream=stream):
        for w in weights:
            F.linear(inputs[w.shape[1]], w)
    seconds = cuda_time(graph.replay, repeats=5)
    del graph
    return seconds


def step_weights(llm: LLM) -> list[torch.Tensor]:
    """The matrices one decode step multiplies by: fused q|k|v|gate, o, fused gate|up, down per layer; lm_head."""
    model = llm.engine.loaded.model
    weights = []
    for layer in model.model.language_model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        weights += [attn.qkvg_weight, attn.o_proj.weight, mlp.gate_up_weight, mlp.down_proj.weight]
    return weights + [model.lm_head.weight]


# ---------------------------------------------------------------------------------------------------------
# transformers


def transformers_decode(path: Path, prompt_len: int = 1024, new_tokens: int = 24) -> float | None:
    try:
        from transformers import AutoConfig, MuseGlimmerForConditionalGeneration
    except ImportError as exc:
        log(f"transformers: not available ({exc})")
        return None
    config = AutoConfig.from_pretrained(path)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = MuseGlimmerForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    log(f"transformers: built {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters "
        f"({torch.cuda.memory_allocated() / 1e9:.1f} GB)")

    def generate(tokens: int, seed: int) -> float:
        ids = torch.tensor(fresh_prompts(1, prompt_len, seed), device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    generate(2, seed=100)  # warm-up
    one = generate(1, seed=101)
    many = generate(new_tokens + 1, seed=102)
    return new_tokens / (many - one)  # the model is freed with this frame


class ClockSampler:
    """`nvidia-smi` sampling the SM clock, power and throttle reasons once a second, in the background."""

    QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"
    SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap

    def __init__(self) -> None:
        try:
            self.process = subprocess.Popen(
                ["nvidia-smi", f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits", "-lms", "1000",
                 "-i", str(torch.cuda.current_device())],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError as exc:
            log(f"clocks: not sampled ({exc})")
            self.process = None

    def summary(self) -> dict[str, float] | None:
        """Over the samples taken under load (power above 300 W): median and lowest SM clock, share at the cap."""
        if self.process is None:
            return None
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return None
        busy = []
        for line in out.splitlines():
            try:
                clock, power, reasons = (field.strip() for field in line.split(","))
                sample = (float(clock), float(power), int(reasons, 16))
            except ValueError:
                continue
            if sample[1] > 300:
                busy.append(sample)
        if not busy:
            return None
        clocks = sorted(clock for clock, _, _ in busy)
        capped = sum(1 for _, _, reasons in busy if reasons & self.SW_POWER_CAP)
        return {"busy_samples": len(busy), "sm_clock_median_mhz": clocks[len(clocks) // 2],
                "sm_clock_min_mhz": clocks[0], "power_max_w": max(power for _, power, _ in busy),
                "share_at_power_cap": capped / len(busy)}


# ---------------------------------------------------------------------------------------------------------
# Glimmer engine


def run_engine(llm: LLM, prompts: list[list[int]], max_tokens: int,
               sampling: Callable[[int], dict] = lambda i: {"temperature": 0}) -> dict[str, float]:
    """Drive the engine as LLM.generate does, timing the first token of each request and the decode phase.
    `sampling(i)`: request i's sampling fields beside max_tokens (greedy by default).

    The decode phase is the steps in which every request decodes: from the step that gives the last request its
    first token to the first step in which a request ends. Its rate counts only the tokens of those steps (the
    tokens early requests make while later prompts are still prefilling, and the last steps, when the batch has
    thinned, are in the output figure only)."""
    engine = llm.engine
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        params = SamplingParams(**sampling(i), max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"bench-{time.monotonic_ns()}-{i}", prompt, params)
    first: dict[str, float] = {}
    steps: list[tuple[float, int, bool]] = []  # (when the step's tokens were read, how many, whether one ended)
    made = 0  # tokens made so far: every request's context is its prompt and these
    contexts: list[int] = []  # the requests' context positions altogether, at each step
    while engine.has_unfinished_requests:
        deltas = engine.step()
        now = time.perf_counter()
        contexts.append(sum(map(len, prompts)) + made)
        made += sum(len(d.token_ids) for d in deltas)
        steps.append((now, sum(len(d.token_ids) for d in deltas), any(d.finish_reason for d in deltas)))
        for delta in deltas:
            first.setdefault(delta.request_id, now)
    end = time.perf_counter()
    produced = sum(tokens for _, tokens, _ in steps)
    prefill_done = max(first.values())
    first_end = next(when for when, _, ended in steps if ended)
    phase = [i for i, (when, _, _) in enumerate(steps) if prefill_done < when <= first_end]
    full = [steps[i][1] for i in phase]
    return {
        "seconds": end - start,
        "output_tokens": produced,
        "output_tokens_per_s": produced / (end - start),
        "ttft_s": min(first.values()) - start,
        "decode_tokens_per_s": sum(full) / (first_end - prefill_done) if full else 0.0,
        "decode_steps": len(full),
        "decode_context_tokens": sum(contexts[i] for i in phase) / len(phase) if phase else 0.0,
        "most_decoding_at_once": max(tokens for _, tokens, _ in steps),
        "decode_step_s": (end - prefill_done) / (max_tokens - 1) if max_tokens > 1 else 0.0,
    }


def host_breakdown(llm: LLM, batch: int, max_tokens: int = 96) -> dict[str, float]:
    """Where a decode step's wall time goes on the host: each engine phase timed around its call (the sampler's
    time includes waiting for the GPU to finish the step, since it reads the tokens). Short prompts, so the
    steps are almost all decode steps."""
    import glimmer.engine.llm_engine as llm_engine

    engine = llm.engine
    spent: dict[str, float] = {}
    calls: dict[str, int] = {}
    originals = []

    def timed(owner, name: str, label: str) -> None:
        original = getattr(owner, name)
        originals.append((owner, name, original))

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start
                calls[label] = calls.get(label, 0) + 1
        setattr(owner, name, wrapper)

    timed(engine.scheduler, "schedule", "schedule")
    timed(engine.runner, "execute", "inputs + launch")
    timed(llm_engine, "sample", "sample (waits for the GPU)")
    timed(LaunchedStep, "read", "read tokens run ahead (waits for the GPU)")
    timed(engine, "_accept_token", "append tokens, token stops")
    timed(engine, "_release_text", "detokenize, stop strings, deltas")
    timed(engine, "step", "whole step")
    try:
        run_engine(llm, fresh_prompts(batch, 16, 70 + batch), max_tokens)
    finally:
        for owner, name, original in reversed(originals):
            if owner is llm_engine or isinstance(owner, type):
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # the bound-method attribute hid the class's
    out = {}
    steps = calls["whole step"]
    log(f"host breakdown at batch {batch} ({steps} steps, async_scheduling={engine.async_scheduling}):")
    for label, seconds in spent.items():
        out[f"host_{label.split()[0].rstrip(',')}_ms_{batch}"] = seconds / steps * 1e3
        log(f"  {label:<36} {seconds / steps * 1e3:7.2f} ms/step")
    RESULTS[f"host_breakdown_{batch}"] = {k: round(v / steps * 1e3, 3) for k, v in spent.items()}
    return out


def end_to_end_ceiling(floors: dict[str, float], batch: int, prompt_len: int, new_tokens: int) -> float:
    """The most output tok/s any schedule could reach on `batch` fresh prompts arriving together: the request
    whose prefill ends last ends it no earlier than all prompts' weight FLOPs at the measured matmul rate (its
    prefill gives its first token), and its other tokens take one decode step each, none shorter than a
    one-row step's weight matmuls. Attention's FLOPs and the decode steps run during the prefills are left out,
    so the true bound is lower."""
    prefill_s = batch * (prompt_len * floors["prompt_token_flops"] + floors["logit_row_flops"]) / floors["matmul_flops"]
    return batch * new_tokens / (prefill_s + (new_tokens - 1) * floors["matmul_step_s_1"])


def kv_read_s(llm: LLM, floors: dict[str, float], batch: int, context_tokens: float) -> float:
    """Seconds a decode step of `batch` sequences holding `context_tokens` positions in all takes at least to read
    their keys and values once at the copy rate (a sliding layer reads its window at most): what the step's
    attention adds to its weight matmuls however well it runs."""
    text = llm.engine.model_config.text
    per_layer = 2 * text.num_key_value_heads * text.head_dim * llm.engine.dtype.itemsize  # a position's K and V
    each = context_tokens / batch
    positions = sum(min(each, text.sliding_window) if kind == "sliding_attention" else each
                    for kind in text.layer_types)
    return batch * positions * per_layer / floors["copy_bytes_per_s"]


def glimmer_engine(path: Path, floors: dict[str, float], quick: bool) -> dict[str, float]:
    started = time.perf_counter()
    llm = LLM(str(path), dtype="bfloat16", load_format="dummy", progress=False, max_model_len=34 * 1024,
              max_num_seqs=256)
    log(f"glimmer: loaded dummy 30B in {time.perf_counter() - started:.1f} s, KV cache: "
        f"{llm.engine.kv_layout.describe()}")
    weights = step_weights(llm)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    floors["weight_gb_per_step"] = weight_bytes / 1e9
    # a prompt token multiplies by every weight but lm_head's (one logit row a prompt): 2 FLOPs a weight
    floors["prompt_token_flops"] = 2 * sum(w.numel() for w in weights[:-1])
    floors["logit_row_flops"] = 2 * weights[-1].numel()
    floors["copy_floor_s"] = weight_bytes / floors["copy_bytes_per_s"]
    for batch in (1, 64, 256):
        floors[f"matmul_step_s_{batch}"] = weight_matmul_step(weights, batch)
        log(f"floor: weight matmuls alone at batch {batch}: {floors[f'matmul_step_s_{batch}'] * 1e3:.2f} ms/step")
    log(f"floor: {weight_bytes / 1e9:.1f} GB of weights per step at the copy rate: "
        f"{floors['copy_floor_s'] * 1e3:.2f} ms ({1 / floors['copy_floor_s']:.1f} tok/s)")
    del weights

    out: dict[str, float] = {}
    # warm-up: compile every kernel specialization and capture the graphs the timed runs use
    run_engine(llm, fresh_prompts(1, 1024, 1), 8)
    run_engine(llm, fresh_prompts(64, 1024, 2), 4)
    if not quick:
        run_engine(llm, fresh_prompts(256, 64, 3), 4)
        run_engine(llm, fresh_prompts(1, 8192, 4), 2)

    result = run_engine(llm, fresh_prompts(1, 1024, 10), 129)
    out["decode_1k_tok_s"] = result["decode_tokens_per_s"]
    out["decode_1k_step_s"] = result["decode_step_s"]
    record("batch-1 decode, 1K context", result["decode_tokens_per_s"], "tok/s", 1 / floors["copy_floor_s"],
           "copy-rate ceiling")

    if not quick:
        result = run_engine(llm, fresh_prompts(1, 32 * 1024, 11), 129)
        out["decode_32k_tok_s"] = result["decode_tokens_per_s"]
        record("batch-1 decode, 32K context", result["decode_tokens_per_s"], "tok/s", out["decode_1k_tok_s"],
               "the 1K figure")

    for batch in (64,) if quick else (64, 256):
        result = run_engine(llm, fresh_prompts(batch, 1024, 20 + batch), 256)
        out[f"batch_{batch}_output_tok_s"] = result["output_tokens_per_s"]
        out[f"batch_{batch}_decode_tok_s"] = result["decode_tokens_per_s"]
        floor = batch / floors[f"matmul_step_s_{batch}"]
        record(f"{batch}-way 1K-in/256-out, output", result["output_tokens_per_s"], "tok/s",
               end_to_end_ceiling(floors, batch, 1024, 256), "end-to-end ceiling")
        out[f"batch_{batch}_decode_steps"] = result["decode_steps"]  # the steps in which all requests decode
        if result["decode_steps"]:
            record(f"{batch}-way, decode phase alone", result["decode_tokens_per_s"], "tok/s", floor,
                   f"matmul floor at batch {batch}")
            kv_s = kv_read_s(llm, floors, batch, result["decode_context_tokens"])
            out[f"batch_{batch}_decode_kv_read_s"] = kv_s
            record(f"{batch}-way, decode phase alone, against matmuls and KV reads", result["decode_tokens_per_s"],
                   "tok/s", batch / (floors[f"matmul_step_s_{batch}"] + kv_s),
                   f"matmul floor plus reading {result['decode_context_tokens'] / batch:.0f} positions' keys and "
                   "values a sequence at the copy rate")
        else:  # a GPU whose KV cache holds fewer requests than the batch: they never all decode in one step
            RESULTS[f"{batch}-way, decode phase alone"] = {"value": None, "unit": "tok/s",
                                                            "most_decoding_at_once": result["most_decoding_at_once"]}
            log(f"{batch}-way, decode phase alone: not reached: at most {result['most_decoding_at_once']} of the "
                f"{batch} requests decoded in one step (KV cache: {llm.engine.kv_layout.describe()})")

    graphs = llm.engine.runner.graphs
    for batch in (b for b in (1, 64, 256) if b in graphs.captured_sizes):
        # the decode step's GPU time alone (graph replay, no host work): the rest of a step is host time
        gpu = cuda_time(lambda b=batch: graphs.replay(b), repeats=5)
        out[f"graph_replay_s_{batch}"] = gpu
        record(f"decode step on the GPU alone (graph replay), batch {batch}", gpu * 1e3, "ms",
               floors[f"matmul_step_s_{batch}"] * 1e3, "weight-matmul step")
    out.update(host_breakdown(llm, 64))
    if quick:
        return out

    ttfts = [run_engine(llm, fresh_prompts(1, 8192, 40 + i), 1)["ttft_s"] for i in range(3)]
    out["ttft_8k_s"] = sorted(ttfts)[1]
    prefill_flops = 8192 * floors["prompt_token_flops"] + floors["logit_row_flops"]
    record("8K-token prompt, time to first token", out["ttft_8k_s"], "s", prefill_flops / floors["matmul_flops"],
           "matmul-rate floor")
    return out  # the engine is freed with this frame


# ---------------------------------------------------------------------------------------------------------
# server


def stream_completion(client, url: str, prompt: list[int], max_tokens: int) -> tuple[list[float], int]:
    """Arrival times of the streamed chunks that carry text, and the completion tokens the usage reports."""
    body = {"model": "glimmer-30b", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    times = []
    tokens = 0
    with client.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0].get("text") is not None:
                    times.append(time.perf_counter())
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    return times, tokens


def server(path: Path, engine_figures: dict[str, float]) -> dict[str, float]:
    import httpx

    server_process = ServeProcess(
        ["-m", "glimmer.cli", "--log-level", "WARNING", "serve", str(path), "--load-format", "dummy",
         "--max-model-len", "4096", "--max-num-seqs", "64", "--served-model-name", "glimmer-30b"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    out: dict[str, float] = {}
    try:
        # ServerDidNotStart if it exits or does not serve in time: main reports it as this section's failure
        url = server_process.wait_until_serving(timeout_s=300)
        with httpx.Client() as client:
            stream_completion(client, url, fresh_prompts(1, 1024, 50)[0], 16)  # warm-up: the batch-1 graph
            warm = [threading.Thread(target=stream_completion, args=(client, url, p, 8))
                    for p in fresh_prompts(64, 16, 52)]  # and the batch-64 one
            for t in warm:
                t.start()
            for t in warm:
                t.join()
            times, _ = stream_completion(client, url, fresh_prompts(1, 1024, 51)[0], 129)
        gaps = sorted(b - a for a, b in zip(times[1:], times[2:], strict=False))
        out["server_itl_s"] = gaps[len(gaps) // 2]
        record("server single-stream inter-token latency (median)", out["server_itl_s"] * 1e3, "ms",
               engine_figures["decode_1k_step_s"] * 1e3, "the engine's decode step")

        def client_run(prompt: list[int], counts: list[int]) -> None:
            with httpx.Client() as client:
                counts.append(stream_completion(client, url, prompt, 256)[1])

        def load(seed: int) -> float:
            counts: list[int] = []
            threads = [threading.Thread(target=client_run, args=(p, counts)) for p in fresh_prompts(64, 1024, seed)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return sum(counts) / (time.perf_counter() - start)

        out["server_64_tok_s"] = load(61)
        record("server, 64 clients 1K-in/256-out, output", out["server_64_tok_s"], "tok/s",
               engine_figures["batch_64_output_tok_s"], "LLM.generate on the same load")
    finally:
        server_process.stop(signal.SIGTERM, timeout_s=30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--quick", action="store_true",
                        help="only what the server comparison needs: 1K batch-1 decode and the 64-way load")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_30b.py needs a CUDA GPU")
    log(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    started = time.perf_counter()
    clocks = ClockSampler()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_checkpoint(Path(tmp) / "glimmer-30b", preset="30b", config_only=True)
        floors = {"copy_bytes_per_s": copy_bandwidth(), "matmul_flops": matmul_rate()}
        log(f"floor: copy bandwidth {floors['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write); "
            f"bf16 matmul {floors['matmul_flops'] / 1e12:.0f} TFLOP/s")
        sections = []
        if not args.skip_transformers and not args.quick:
            sections.append(("transformers", lambda: {"transformers_tok_s": transformers_decode(path)}))
        engine: dict[str, float] = {}
        sections.append(("glimmer", lambda: engine.update(glimmer_engine(path, floors, args.quick)) or engine))
        if not args.skip_server:
            sections.append(("server", lambda: server(path, engine)))
        figures: dict[str, float | None] = {}
        for name, run in sections:
            try:
                figures.update(run())
            except ServerDidNotStart as exc:  # its reason and the end of what it wrote: the whole output and a
                # traceback of the wait would bury them
                log(f"{name}: FAILED: the server did not start: {exc.reason}:\n{exc.output[-3000:]}")
            except Exception as exc:  # one broken section must not lose the others' figures
                log(f"{name}: FAILED: {type(exc).__name__}: {exc}")
                traceback.print_exc()
            gc.collect()  # each section's model goes before the next one loads
            torch.cuda.empty_cache()
        if figures.get("transformers_tok_s") and figures.get("decode_1k_tok_s"):
            record("transformers batch-1 decode, 1K context", figures["transformers_tok_s"], "tok/s")
            ceiling_multiple = 1 / floors["copy_floor_s"] / figures["transformers_tok_s"]
            RESULTS["copy_rate_ceiling_over_transformers"] = round(ceiling_multiple, 3)
            log(f"Glimmer / transformers at batch 1: {figures['decode_1k_tok_s'] / figures['transformers_tok_s']:.1f}x"
                f"  (the copy-rate ceiling is {ceiling_multiple:.1f}x transformers on this GPU and host)")
    RESULTS["floors"] = {k: round(v, 6) for k, v in floors.items()}
    under_load = clocks.summary()
    if under_load is not None:
        RESULTS["clocks_under_load"] = under_load
        log(f"clocks under load ({under_load['busy_samples']} samples above 300 W): SM clock median "
            f"{under_load['sm_clock_median_mhz']:.0f} MHz, lowest {under_load['sm_clock_min_mhz']:.0f}, power up to "
            f"{under_load['power_max_w']:.0f} W, at the power cap in {under_load['share_at_power_cap']:.0%} of them")
    log(f"total {time.perf_counter() - started:.0f} s")
    log(json.dumps(RESULTS, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(RESULTS, indent=1))


if __name__ == "__main__":
    main()
