"""bench/: each script is run as `python bench/NAME.py`, and `--help` says how without running the benchmark."""

import contextlib
import importlib.util
import io
import json
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


@dataclass
class _Run:
    returncode: int
    stdout: str
    stderr: str


def _run(script: str, *args: str) -> _Run:
    """`python bench/NAME.py ARGS` run in this process, as its `__main__`, for the cases whose argument checks end it
    before any work (a subprocess would import torch again, seconds a case): its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    argv, cwd, path = sys.argv, os.getcwd(), list(sys.path)  # the scripts put their folders on sys.path
    sys.argv = [str(script), *args]
    code: object = 0
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
    finally:
        sys.argv, sys.path[:] = argv, path
        os.chdir(cwd)
    if isinstance(code, str):  # as the interpreter ends on SystemExit("message")
        err.write(code + "\n")
        code = 1
    return _Run(0 if code is None else int(code), out.getvalue(), err.getvalue())


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_help_prints_the_usage_and_runs_nothing(script):
    """`python bench/kv_memory.py --help` ran the benchmark (a model built, a sequence of 2,048 tokens generated)
    and printed its table, not a usage line."""
    done = _run(str(script), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout[:300]


@pytest.mark.parametrize("threads", ["0", "-2", "two"])
def test_cpu_decode_refuses_a_thread_count_that_is_not_one(threads):
    """--threads 0 ran with torch's own count, as if it were left out, and --threads -2 ended in set_num_threads'
    RuntimeError, a stack trace."""
    done = _run(str(ROOT / "bench" / "cpu_decode.py"), "--threads", threads)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument --threads: {threads!r} is not a thread count: give a positive integer" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("size", ["0.3", "0", "-1"])
def test_kv_pages_refuses_a_cache_that_holds_no_request_of_a_load(size):
    """--kv-gib 0.3 (fewer pages than one 32K-in request holds) simulated the 32K load for ever: its scheduler waited
    for pages no request would free; 0 and -1 did the same. The size is in GiB, 2**30 bytes: 2,451 pages of 212,992
    bytes are 0.486 GiB (counted in 10**9 bytes, 0.52, and 0.5 GiB was refused as 0.5 GB)."""
    done = _run(str(ROOT / "bench" / "kv_pages.py"), "--kv-gib", "7.2", size)
    assert done.returncode == 2, done.stderr[-2000:]
    assert (f"argument --kv-gib: {float(size):g} GiB holds no request of the load 16 x 32K-in/256-out (2,451 pages, "
            "0.49 GiB, at its longest); give 0.49 or more") in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(("script", "option", "value", "what"), [
    ("cpu_decode", "--batches", "x", "a list of counts"), ("cpu_decode", "--batches", "1,0", "a list of counts"),
    ("cpu_decode", "--repeats", "0", "a count"), ("cpu_decode", "--new-tokens", "0", "a count"),
    ("constrained", "--batches", "1,x", "a list of counts"), ("constrained", "--repeats", "0", "a count"),
    ("protocol_stream", "--chunk", "0", "a count"), ("protocol_stream", "--repeat", "0", "a count"),
    ("prefix_hash", "--repeats", "0", "a count"), ("prefix_hash", "--prompts", "0", "a count"),
    ("nano_spec_decode", "--prompts", "0", "a count"), ("nano_spec_decode", "--max-tokens", "-1", "a count"),
])
def test_bench_refuses_a_count_that_is_not_one(script, option, value, what):
    """cpu_decode.py --batches x ended in int()'s ValueError, --repeats 0 in min()'s on an empty list after the whole
    run; protocol_stream.py --chunk 0 in range()'s; prefix_hash.py --prompts 0 in a ZeroDivisionError;
    nano_spec_decode.py --prompts 0 printed a table of 0.0 tok/s and a speed-up: each now refuses the option, exit 2."""
    done = _run(str(ROOT / "bench" / f"{script}.py"), option, value)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument {option}: {value!r} is not {what}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scripts run their benchmark where CUDA is available")
@pytest.mark.parametrize("script", ["gpu_30b", "cuda_check", "gpu_kv_admission", "gpu_sampling"])
def test_gpu_bench_without_cuda_says_it_needs_a_gpu(script):
    """gpu_30b.py and cuda_check.py without CUDA ended in torch's AssertionError, "Torch not compiled with CUDA
    enabled", a stack trace."""
    done = _run(str(ROOT / "bench" / f"{script}.py"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr == f"{script}.py needs a CUDA GPU\n"


def test_cpu_decode_counts_identical_outputs_over_every_repeat(monkeypatch):
    """"greedy outputs identical: 1/1" after --repeats 2 counted the last repeat's outputs alone, so a difference in
    an earlier one was never shown. transformers' output of the first timed repeat is made to differ here: every
    repeat counted shows it, 1 of 2; the last alone would say 1/1, and a count that only multiplied 2/2."""
    from transformers import MuseGlimmerForConditionalGeneration

    generate = MuseGlimmerForConditionalGeneration.generate
    calls = []

    def first_repeat_differs(self, *args, **kwargs):
        out = generate(self, *args, **kwargs)
        calls.append(out)
        if len(calls) == 2:  # the first call warms up; the second is the first timed repeat
            out = out.clone()
            out[0, -1] = out[0, -1] + 1
        return out

    monkeypatch.setattr(MuseGlimmerForConditionalGeneration, "generate", first_repeat_differs)
    threads = torch.get_num_threads()
    try:
        done = _run(str(ROOT / "bench" / "cpu_decode.py"), "--batches", "1", "--prompt-tokens", "4", "--new-tokens",
                    "2", "--repeats", "2", "--threads", "1", "--target", "0")
    finally:
        torch.set_num_threads(threads)  # --threads 1 set this process's
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(calls) == 3, done.stdout
    assert "greedy outputs identical: 1/2" in done.stdout, done.stdout


def test_serve_throughput_against_a_url_asks_for_the_servers_model():
    """--url without --model ran the sequential baseline on the embedded glimmer-nano whatever the server served, and
    printed the server's rate over it as its speed-up."""
    done = _run(str(ROOT / "bench" / "serve_throughput.py"), "--url", "http://127.0.0.1:9")
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("argument --url: give --model too, the checkpoint that server serves: the sequential baseline runs it in "
            "this process") in done.stderr


@pytest.mark.parametrize(("script", "option", "value"), [
    ("serve_throughput", "--clients", "0"), ("serve_throughput", "--requests", "0"),
    ("cpu_server", "--rounds", "0"), ("cpu_server", "--streams", "0"),
    ("agent_request", "--rounds", "0"), ("agent_request", "--tools", "-1"),
])
def test_serving_bench_refuses_a_count_that_is_not_one(script, option, value):
    """serve_throughput.py --clients 0 waited for ever on a pool of no connections, --requests 0 printed a speed-up
    of 0.00x; cpu_server.py --rounds 0 and --streams 0 ended in a KeyError and a ZeroDivisionError after starting a
    server; agent_request.py --rounds 0 in a StatisticsError, and --tools -1 ran with 4 tools."""
    done = _run(str(ROOT / "bench" / f"{script}.py"), option, value)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument {option}: {value!r} is not a count: give a whole number, 1 or more" in done.stderr


@pytest.mark.parametrize(("option", "value", "what"), [
    ("--clients", "0", "a count: give a whole number, 1 or more"),
    ("--max-tokens", "0", "a count: give a whole number, 1 or more"),
    ("--baseline-requests", "0", "a count: give a whole number, 1 or more"),
    ("--prompt-words", "3", "a count: give a whole number, 4 or more"),
    ("--minutes", "-1", "a duration: give a number above 0"), ("--report-s", "0", "a duration: give a number above 0"),
    ("--disconnect-rate", "2", "a share: give a number from 0 to 1"),
    ("--disconnect-rate", "nan", "a share: give a number from 0 to 1"),
])
def test_soak_refuses_a_setting_it_cannot_run(option, value, what):
    """soak.py --clients 0 soaked with no client, --minutes -1 for no time, --disconnect-rate 2 hung up every
    request, --max-tokens 0 ended in randint's ValueError after starting a server, --report-s 0 printed a line every
    turn of the event loop: each now refuses the option before starting anything, exit 2."""
    done = _run(str(ROOT / "bench" / "soak.py"), option, value)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument {option}: {value!r} is not {what}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("chars", ["26", "0", "-5", "x"])
def test_protocol_stream_refuses_a_turn_too_short_to_hold_its_tool_call(chars):
    """protocol_stream.py --chars 26 (or 0, or -5) ended in an AssertionError, a stack trace: a third of the turn is
    the tool call's file, which must hold "def total" for the check that the call was read whole."""
    done = _run(str(ROOT / "bench" / "protocol_stream.py"), "--chars", chars)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument --chars: {chars!r} is not a turn length: give a whole number, 27 or more" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("script", "option", "value", "message"), [
    ("kv_memory", "--window", "0", "'0' is not a count: give a whole number, 1 or more"),
    ("nano_spec_decode", "--device", "nope",
     "device='nope' is not a valid torch device; use 'cpu', 'cuda' or 'cuda:N'"),
    ("prefix_hash", "--model", "/nonexistent", "model '/nonexistent' is neither an existing directory nor a Hugging "
                                               "Face Hub id"),
    ("prefix_hash", "--model", "bench", "config.json: not found; a checkpoint directory must contain config.json"),
    ("constrained", "--model", "/nonexistent", "model '/nonexistent' is neither an existing directory nor a Hugging "
                                               "Face Hub id"),
    ("constrained", "--model", "bench", "config.json: not found; a checkpoint directory must contain config.json"),
])
def test_bench_refuses_a_model_device_or_window_it_cannot_load(script, option, value, message):
    """kv_memory.py --window 0 ended in the tiny checkpoint's ConfigError, nano_spec_decode.py --device nope in the
    engine's, prefix_hash.py and constrained.py --model /nonexistent in resolve_checkpoint's CheckpointError
    (prefix_hash after its hashing figures): stack traces; each now names the option on one line before printing a
    figure, exit 2."""
    done = _run(str(ROOT / "bench" / f"{script}.py"), option, value)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{script}.py: error: argument {option}: " in done.stderr and message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_processor_resample_diff_without_torchvision_says_how_to_get_it(monkeypatch):
    """processor_resample_diff.py where torchvision is not installed ended in a ModuleNotFoundError's stack trace."""
    monkeypatch.setitem(sys.modules, "torchvision", None)  # as if not installed: importing it raises
    done = _run(str(ROOT / "bench" / "processor_resample_diff.py"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr == (f"processor_resample_diff.py needs torchvision, which the reference processors resize "
                           f"with: pip install torchvision (>= 0.27, the build for torch {torch.__version__})\n")
    assert done.stdout == ""


def test_kv_memory_says_no_more_sequences_fit_where_the_cache_saves_nothing():
    """kv_memory.py said "(1.0x more sequences fit)" at 2,048 positions, the window, where the hybrid cache costs what
    an every-layer cache does, and rounded the others up (3.9x for 3.82x)."""
    script = runpy.run_path(str(ROOT / "bench" / "kv_memory.py"))  # not as __main__: its measurement is not run
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        script["released_geometry"]()
    lines = out.getvalue().splitlines()
    assert lines[1] == "     2048 positions: 1.000  (no more sequences fit)", lines
    assert lines[2] == "     8192 positions: 0.438  (2.29x as many sequences fit)", lines
    assert lines[4] == "   131072 positions: 0.262  (3.82x as many sequences fit)", lines


@pytest.mark.skipif(torch.cuda.is_available(), reason="the scripts run their benchmark where CUDA is available")
@pytest.mark.parametrize("script", ["cuda_check", "gpu_kv_admission"])
def test_gpu_bench_takes_a_json_path_for_its_figures(script, tmp_path):
    """cuda_check.py and gpu_kv_admission.py had no --json, which gpu_30b.py and gpu_sampling.py take: a run on a
    device machine was refused, "unrecognized arguments: --json", exit 2. (Here, without CUDA, it gets as far as that
    check.)"""
    done = _run(str(ROOT / "bench" / f"{script}.py"), "--json", str(tmp_path / "figures.json"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr == f"{script}.py needs a CUDA GPU\n"


def test_cuda_check_reports_its_speed_figures_from_the_seconds_measured(monkeypatch):
    """cuda_check.py's report, printed and written to --json, was built only on a GPU: here its speed figures come
    from seconds given, each rate to a tenth of a token a second and CUDA graphs' ratio to the reference's."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts tests/ on it
    script = runpy.run_path(str(ROOT / "bench" / "cuda_check.py"))  # not as __main__: nothing is measured
    seconds = {"graphs": (3.0, 0.5), "eager": (4.0, 1.0), "reference": (8.0, 0.8)}
    figures = script["speed_figures"](800_000_000, 64, 256, 128, seconds, 63)
    assert json.loads(json.dumps(figures)) == {
        "model_parameters": 800_000_000, "batch": 64, "prompt_len": 256, "new_tokens": 128,
        "ours_graphs_batch_tokens_per_s": 2730.7, "ours_graphs_single_tokens_per_s": 256.0,
        "ours_eager_batch_tokens_per_s": 2048.0, "ours_eager_single_tokens_per_s": 128.0,
        "graphs_and_eager_tokens_identical": 63,
        "reference_batch_tokens_per_s": 1024.0, "batch_ratio": 2.67,
        "reference_single_tokens_per_s": 160.0, "single_ratio": 1.6,
    }


def test_gpu_kv_admission_writes_each_admissions_figures_as_printed_and_their_ratio(monkeypatch):
    """gpu_kv_admission.py's --json figures were built only on a GPU: here from the runs' measured rates, seconds
    and preemptions, to the places printed, and the ratio of the rates."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts bench/ on it
    script = runpy.run_path(str(ROOT / "bench" / "gpu_kv_admission.py"))  # not as __main__: nothing is measured
    admission = script["Admission"]
    runs = {"growth reserve": admission(5123.456, 12.34, 0), "whatever fits": admission(4000.04, 15.66, 37)}
    figures = script["figures"]("NVIDIA H100 80GB HBM3", 7.2, 36_296, 256, 256, runs)
    assert json.loads(json.dumps(figures)) == {
        "device": "NVIDIA H100 80GB HBM3", "kv_gib": 7.2, "pages": 36_296, "requests": 256, "max_tokens": 256,
        "growth reserve": {"output_tokens_per_s": 5123.5, "seconds": 12.3, "preemptions": 0},
        "whatever fits": {"output_tokens_per_s": 4000.0, "seconds": 15.7, "preemptions": 37},
        "growth reserve / whatever fits": 1.28,
    }


def test_spec_decode_writes_the_figures_it_prints_to_json(tmp_path):
    """spec_decode.py had no --json, which gpu_30b.py and gpu_sampling.py take: its table was to be copied from the
    output by hand. The smallest CPU run writes each row's figures as printed."""
    path = tmp_path / "spec.json"
    threads = torch.get_num_threads()
    try:
        done = _run(str(ROOT / "bench" / "spec_decode.py"), "--preset", "tiny", "--device", "cpu", "--batches", "1",
                    "--prompt-len", "4", "--new-tokens", "4", "--acceptance", "2", "--adaptive-acceptance", "2",
                    "--json", str(path))
    finally:
        torch.set_num_threads(threads)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(path.read_text())["1"]
    rows = {line.split()[1]: line.split() for line in done.stdout.splitlines() if line.startswith("    1 ")}
    assert figures["baseline"] == {"tokens_per_s": float(rows["baseline"][4]), "vs_baseline": 1.0,
                                   "ms_per_step": float(rows["baseline"][6])}
    for mode in ("off", "always", "adaptive"):
        row = figures[mode][rows[mode][2]]  # by the forced acceptance length, as printed
        measured = None if rows[mode][3] == "nan" else float(rows[mode][3])
        assert (row["measured_acceptance"], row["tokens_per_s"], row["vs_baseline"]) == (
            measured, float(rows[mode][4]), float(rows[mode][5])), (mode, row, rows[mode])
        assert f"{row['outputs_identical']}/1 outputs = baseline" in " ".join(rows[mode])
    assert figures["drafter_step_ms"] == float(rows["drafter"][5])


@pytest.mark.parametrize(("args", "message"), [
    (["--prefix-tokens", "-1"], "argument --prefix-tokens: '-1' is not a token count: give a whole number, 0 or more"),
    (["--tail-tokens", "x"], "argument --tail-tokens: 'x' is not a token count: give a whole number, 0 or more"),
    (["--prefix-tokens", "0", "--tail-tokens", "0"],
     "argument --tail-tokens: the prompts would be empty: give --prefix-tokens or --tail-tokens 1 or more"),
    (["--max-num-batched-tokens", "0"], "argument --max-num-batched-tokens: '0' is not a count: give a whole number, "
                                        "1 or more"),
])
def test_prefix_hash_refuses_prompt_shapes_it_cannot_run(args, message):
    """prefix_hash.py --prefix-tokens -1 ended in torch.randint's RuntimeError, 0 and 0 in "the prompt is empty", and
    --max-num-batched-tokens 0 in the engine's ConfigError: stack traces after the hashing figures."""
    done = _run(str(ROOT / "bench" / "prefix_hash.py"), *args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"prefix_hash.py: error: {message}" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(("args", "message"), [
    (["--batches", "1", "0"], "argument --batches: '0' is not a count: give a whole number, 1 or more"),
    (["--prompt-len", "0"], "argument --prompt-len: '0' is not a count: give a whole number, 1 or more"),
    (["--new-tokens", "0"], "argument --new-tokens: '0' is not a count: give a whole number, 1 or more"),
    (["--max-num-batched-tokens", "-8"], "argument --max-num-batched-tokens: '-8' is not a count: give a whole "
                                         "number, 1 or more"),
    (["--acceptance", "0.5"], "argument --acceptance: '0.5' is not an acceptance length: give a number, 1 or more "
                              "(the tokens a verification emits)"),
    (["--adaptive-acceptance", "nan"], "argument --adaptive-acceptance: 'nan' is not an acceptance length: give a "
                                       "number, 1 or more (the tokens a verification emits)"),
    (["--device", "nope"], "device='nope' is not a valid torch device; use 'cpu', 'cuda' or 'cuda:N'"),
])
def test_spec_decode_refuses_settings_it_cannot_run(args, message):
    """spec_decode.py --batches 0 ended in the engine's ConfigError, --prompt-len 0 in "the prompt is empty",
    --device nope in the engine's ConfigError, stack traces; --acceptance 0.5 forced a negative count of correct
    tokens and printed its row."""
    done = _run(str(ROOT / "bench" / "spec_decode.py"), "--preset", "tiny", *args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"spec_decode.py: error: {message}" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(("script", "option", "value", "message"), [
    ("gpu_kv_admission", "--kv-gib", "-1", "'-1' is not a size in GiB: give a number above 0, such as 7.2"),
    ("gpu_kv_admission", "--kv-gib", "inf", "'inf' is not a size in GiB: give a number above 0, such as 7.2"),
    ("gpu_kv_admission", "--requests", "0", "'0' is not a count: give a whole number, 1 or more"),
    ("gpu_kv_admission", "--max-tokens", "0", "'0' is not a count: give a whole number, 1 or more"),
    ("gpu_sampling", "--batches", "0", "'0' is not a count: give a whole number, 1 or more"),
])
def test_gpu_bench_refuses_a_setting_before_it_loads_the_model(script, option, value, message):
    """gpu_kv_admission.py --kv-gib -1 or --requests 0 and gpu_sampling.py --batches 0 passed the parser, for the
    engine to refuse on a GPU in a ConfigError's stack trace, and --max-tokens 0 timed runs of no output; they are
    refused first, on any machine."""
    done = _run(str(ROOT / "bench" / f"{script}.py"), option, value)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{script}.py: error: argument {option}: {message}" in done.stderr


@pytest.mark.parametrize("size", ["2", "8", "60", "68"])
def test_constrained_refuses_a_hidden_size_its_tiny_model_cannot_have(size):
    """constrained.py --hidden-size 2 ended in the tiny checkpoint's ConfigError (head_dim=0), 8 in another
    (qk_scale_factor=3.87 is not below √head_dim), 68 in a third (an odd head_dim), each a stack trace."""
    done = _run(str(ROOT / "bench" / "constrained.py"), "--hidden-size", size)
    assert done.returncode == 2, done.stderr[-2000:]
    assert (f"constrained.py: error: argument --hidden-size: {size!r} is not a tiny model's hidden size: give a "
            "multiple of 8, 64 or more") in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--url", "http://127.0.0.1:9", "--model", "/nonexistent"],
     "argument --model: model '/nonexistent' is neither an existing directory nor a Hugging Face Hub id"),
    (["--device", "nope"], "device='nope' is not a valid torch device; use 'cpu', 'cuda' or 'cuda:N'"),
    (["--max-num-seqs", "0"], "max_num_seqs=0 must be a positive integer"),
])
def test_serve_throughput_refuses_an_engine_it_cannot_build_before_any_request(args, message):
    """serve_throughput.py --url URL --model /nonexistent sent the whole load to URL and ended in a stack trace when
    its sequential baseline loaded the model; --device nope and --max-num-seqs 0 ended in the engine's ConfigError."""
    done = _run(str(ROOT / "bench" / "serve_throughput.py"), *args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"serve_throughput.py: error: {message}" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("target", ["nan", "inf", "-1", "x"])
def test_cpu_decode_refuses_a_target_ratio_that_is_not_one(target):
    """cpu_decode.py --target nan ran the whole benchmark to say "target nanx: NOT met", exit 1, whatever the ratio;
    -1 was met by any."""
    done = _run(str(ROOT / "bench" / "cpu_decode.py"), "--target", target)
    assert done.returncode == 2, done.stderr[-2000:]
    assert (f"argument --target: {target!r} is not a ratio to transformers: give a number, 0 or more, such as 2"
            in done.stderr)


def test_serve_throughput_says_on_one_line_that_a_request_to_its_url_failed():
    """serve_throughput.py --url of a server that is not there ended in httpx's ConnectError, a stack trace."""
    done = _run(str(ROOT / "bench" / "serve_throughput.py"), "--url", "http://127.0.0.1:9", "--model", "glimmer-nano")
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr == ("serve_throughput.py: a request to http://127.0.0.1:9 failed: ConnectError: All connection "
                           "attempts failed\n")
    assert done.stdout == ""


def test_kv_pages_refuses_a_cache_larger_than_its_loads_can_fill():
    """--kv-gib 100000 (500 million pages) ended in a MemoryError's stack trace after allocating what it could; a cache
    past every request of every load at its longest runs them all as that one does."""
    done = _run(str(ROOT / "bench" / "kv_pages.py"), "--kv-gib", "100000")
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("argument --kv-gib: 100000 GiB is more than its loads can fill (361,984 pages, 71.80 GiB: every request "
            "of chat: 512 x 1K-in, max_tokens 4096, outputs 300 on average at its longest); give 71.81 or less: a "
            "larger cache runs every load the same") in done.stderr
    assert done.stdout == ""
    assert "give 71.81 or less" in _run(str(ROOT / "bench" / "kv_pages.py"), "--kv-gib", "71.82").stderr


def test_kv_memory_refuses_a_window_past_torchs_int64():
    """kv_memory.py --window 99999999999999999999 ended in the tiny checkpoint's ConfigError, a stack trace."""
    done = _run(str(ROOT / "bench" / "kv_memory.py"), "--window", "99999999999999999999")
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("kv_memory.py: error: argument --window: text_config.sliding_window=99999999999999999999 is invalid; "
            "expected a positive integer of at most 2**63 - 1") in done.stderr
    assert done.stdout == ""


def test_cpu_decode_refuses_prompts_and_outputs_past_its_models_context():
    """cpu_decode.py --prompt-tokens 5000 ended in the engine's ConfigError for a max_model_len of 5,009, an option
    this script does not have, a stack trace."""
    done = _run(str(ROOT / "bench" / "cpu_decode.py"), "--prompt-tokens", "5000", "--new-tokens", "16")
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("cpu_decode.py: error: argument --prompt-tokens: 5000 prompt and 16 new tokens pass the model's 4,096 "
            "positions: give at most 4,088 together") in done.stderr
    assert done.stdout == ""


def test_constrained_refuses_a_token_count_its_context_cannot_hold():
    """constrained.py --max-tokens 2000 loaded the model, then ended in "AssertionError: a sequence ended early":
    each run generates twice --max-tokens after the prompt, within the engine's 1,024 positions."""
    done = _run(str(ROOT / "bench" / "constrained.py"), "--max-tokens", "2000")
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("constrained.py: error: argument --max-tokens: 2000 does not fit: a run generates twice --max-tokens after "
            "its prompt within 1,024 positions; give at most 480") in done.stderr
    assert done.stdout == ""


def test_nano_spec_decode_refuses_more_single_prompts_than_prompts():
    """nano_spec_decode.py --prompts 4 --single 16 decoded 4 prompts one at a time and labelled the row "one at a time
    (16)"; so did --prompts 4 alone, --single being 16 by default (now 16 or --prompts, where fewer)."""
    done = _run(str(ROOT / "bench" / "nano_spec_decode.py"), "--prompts", "4", "--single", "16")
    assert done.returncode == 2, done.stderr[-2000:]
    assert ("nano_spec_decode.py: error: argument --single: 16 prompts one at a time are more than --prompts 4: give "
            "at most 4") in done.stderr
    assert done.stdout == ""


def test_nano_spec_decode_decodes_every_prompt_one_at_a_time_where_prompts_are_fewer_than_16(monkeypatch, capsys):
    """--single is 16, or --prompts where fewer, by default: --prompts 4 alone decoded its 4 prompts one at a time
    under the label "one at a time (16)". Engines and prompts stubbed: the rows' prompts and labels are the script's."""
    spec = importlib.util.spec_from_file_location("nano_spec_decode", ROOT / "bench" / "nano_spec_decode.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    decoded = []

    def timed(llm, prompts, params, one_at_a_time):
        decoded.append((tuple(prompts), one_at_a_time))
        return [[0]] * len(prompts), 1.0

    stats = {"spec_decode": SimpleNamespace(num_drafts=0, num_accepted_tokens=0)}
    monkeypatch.setattr(script, "LLM", lambda *args, **kwargs: SimpleNamespace(engine=SimpleNamespace(
        stats=lambda: stats)))
    monkeypatch.setattr(script, "held_out_conversations", lambda count: [
        SimpleNamespace(messages=[f"turn {i}"], last_user_index=0) for i in range(count)])
    monkeypatch.setattr(script, "prompt_text", lambda llm, conversation, messages: messages[0])
    monkeypatch.setattr(script, "timed", timed)
    monkeypatch.setattr(sys, "argv", ["nano_spec_decode.py", "--prompts", "4"])
    assert script.main() == 0
    prompts = tuple(f"turn {i}" for i in range(4))
    # each row: a warm-up of two prompts on each engine, then all its prompts on each
    assert [one for one, one_at_a_time in decoded if one_at_a_time] == [prompts[:2], prompts[:2], prompts, prompts]
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [row[:26].strip() for row in rows] == ["batch of 4", "one at a time (4)"]

