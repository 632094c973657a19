"""`glimmer serve` and `glimmer chat` as a user runs them (subprocesses), and their options."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from server_support import ServeProcess, free_port, live_server, wait_for_health

from glimmer.cli import build_parser
from glimmer.default_model import DEFAULT_MODEL_NAME


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    """An environment with an empty user cache: the embedded model is read in place, nothing of it is written (the
    one thing a serve may write there is the CPU kernels' build, glimmer/cpu-kernels)."""
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg-cache"))}


def test_serve_options_parse():
    args = build_parser().parse_args(["serve", "/models/glimmer", "--port", "9000", "--served-model-name", "a", "b",
                                      "--api-key", "k", "--max-model-len", "4096", "--max-num-seqs", "8",
                                      "--dtype", "bfloat16", "--device", "cpu", "--max-request-bytes", "2048"])
    assert (args.model, args.host, args.port, args.served_model_name, args.api_key) == (
        "/models/glimmer", "127.0.0.1", 9000, ["a", "b"], ["k"])
    assert (args.max_model_len, args.max_num_seqs, args.dtype, args.device, args.max_request_bytes) == (
        4096, 8, "bfloat16", "cpu", 2048)
    assert build_parser().parse_args(["serve"]).model is None
    assert build_parser().parse_args(["serve"]).trust_request_chat_template is False
    assert build_parser().parse_args(["serve"]).generation_config == "auto"
    for command in (["serve"], ["chat"], ["run-batch", "-i", "in.jsonl", "-o", "out.jsonl"]):
        assert build_parser().parse_args([*command, "--generation-config", "vllm"]).generation_config == "vllm"


@pytest.mark.parametrize("command", [["serve"], ["run-batch", "-i", "in.jsonl", "-o", "out.jsonl"]])
def test_media_size_and_download_time_limits_reach_the_media_policy(command):
    """An image store slower than 10 s a download, or a server that must take less than 64 MiB an image, had no way
    to say so."""
    from glimmer.cli import _media_policy

    given = build_parser().parse_args([*command, "--allow-remote-media", "--max-media-bytes", "16MiB",
                                       "--media-fetch-timeout", "30"])
    assert (_media_policy(given).max_bytes, _media_policy(given).timeout_s) == (16 << 20, 30.0)
    default = _media_policy(build_parser().parse_args(command))
    assert (default.max_bytes, default.timeout_s) == (64 << 20, 10.0)


@pytest.mark.parametrize(("flags", "enabled"), [([], True), (["--no-enable-prefix-caching"], False),
                                               (["--enable-prefix-caching"], True)])
def test_serve_takes_vllms_prefix_caching_flags(tiny_checkpoint, flags, enabled):
    """vLLM's --[no-]enable-prefix-caching: the server could not turn the prefix cache off (the flags were refused)."""
    from glimmer.cli import _engine_from_args

    args = build_parser().parse_args(["serve", str(tiny_checkpoint), "--kv-cache-memory", "8MiB", *flags])
    engine, _ = _engine_from_args(args)
    try:
        assert engine.engine.kv.enable_prefix_caching is enabled
    finally:
        engine.shutdown()


def test_serve_runs_a_vllm_command_line_whose_vllm_options_change_nothing(tiny_checkpoint):
    """`vllm serve MODEL --tensor-parallel-size 1 --trust-remote-code ...` was refused as unrecognized arguments;
    LLM(...) takes the same arguments by the same rule (VLLM_ONLY_LLM_ARGUMENTS)."""
    from glimmer.cli import _engine_from_args

    args = build_parser().parse_args([
        "serve", str(tiny_checkpoint), "--kv-cache-memory", "8MiB", "--tensor-parallel-size", "1",
        "--trust-remote-code", "--tokenizer", str(tiny_checkpoint), "--kv-cache-dtype", "auto", "--swap-space", "4",
        "--enable-chunked-prefill", "--disable-log-stats", "--max-logprobs", "20", "--task", "generate"])
    engine, _ = _engine_from_args(args)
    engine.shutdown()


def test_serve_takes_vllms_block_size_and_kv_cache_memory_bytes(tiny_checkpoint):
    """`vllm serve MODEL --block-size 32 --kv-cache-memory-bytes N` was refused as unrecognized arguments, though
    LLM(block_size=...) took the block size."""
    from glimmer.cli import _engine_from_args

    args = build_parser().parse_args(["serve", str(tiny_checkpoint), "--block-size", "32",
                                      "--kv-cache-memory-bytes", str(8 << 20)])
    engine, _ = _engine_from_args(args)
    try:
        assert (engine.engine.config.block_size, engine.engine.config.kv_cache_memory) == (32, 8 << 20)
        assert engine.engine.kv.block_size == 32
    finally:
        engine.shutdown()
    assert build_parser().parse_args(["serve"]).block_size is None  # EngineConfig's default, 16


@pytest.mark.parametrize(("flags", "words"), [
    (["--tensor-parallel-size", "2"], ("--tensor-parallel-size 2", "one device")),
    (["--no-enable-chunked-prefill"], ("--no-enable-chunked-prefill", "always chunked")),
    (["--quantization", "awq"], ("--quantization awq", "GGUF, MLX")),
    (["--tokenizer", "other/tokenizer"], ("--tokenizer other/tokenizer", "model's directory")),
    (["--download-dir", "/tmp/x"], ("--download-dir /tmp/x", "hf download")),
    (["--block-size", "24"], ("--block-size 24 is invalid", "power of two")),
    (["--block-size", "0"], ("--block-size 0 is invalid", "power of two")),
    (["--num-gpu-blocks-override", "64"], ("--num-gpu-blocks-override 64", "--kv-cache-memory SIZE")),
    (["--scheduling-policy", "priority"], ("--scheduling-policy priority", "first come, first served")),
    (["--cpu-offload-gb", "4"], ("--cpu-offload-gb 4.0", "not offloaded")),
    (["--enable-expert-parallel"], ("--enable-expert-parallel", "no experts")),
    (["--hf-overrides", '{"rope_theta": 1}'], ('--hf-overrides {"rope_theta": 1}', "config.json is read as it is")),
    (["--revision", "v2"], ("--revision v2", "hf download MODEL --revision R")),
    (["--compilation-config", '{"level": 0}'], ("--compilation-config", "--enforce-eager")),
    (["--compilation-config.level", "0"], ('--compilation-config {"level": 0}', "--enforce-eager")),
    (["-O.level=0"], ('--compilation-config {"level": 0}', "--enforce-eager")),
    (["--compilation-config", "0"], ('--compilation-config {"level": 0}', "--enforce-eager")),
    (["--compilation-config", "4"], ('--compilation-config {"level": 4}', "level (or mode) 1, 2 or 3 alone")),
    (["--compilation-config.backend", "eager"], ("--compilation-config", "level (or mode) 1, 2 or 3 alone")),
    (["--override-generation-config", '{"temperature": 0.5}'], ("--override-generation-config", "sampling fields")),
    (["--enable-lora"], ("--enable-lora", "LoRA adapters are not supported")),
    (["--model-impl", "transformers"], ("--model-impl transformers", "its own Muse Glimmer model")),
    (["-O0"], ("--optimization-level 0", "-O0", "--enforce-eager")),
    (["--cuda-graph-sizes", "0", "8"], ("--cuda-graph-sizes 0 8", "positive integers")),
    (["--max-num-partial-prefills", "4"], ("--max-num-partial-prefills 4", "leave it out or 1")),
    (["--disable-sliding-window"], ("--disable-sliding-window", "would change its outputs")),
    (["--enable-prompt-embeds"], ("--enable-prompt-embeds", "not supported")),
    (["--logits-processors", "my.Processor"], ("--logits-processors my.Processor", "logit_bias")),
    (["--prefix-caching-hash-algo", "md5"], ("--prefix-caching-hash-algo md5", "SHA-256")),
    (["--kv-transfer-config", '{"kv_connector": "X"}'], ("--kv-transfer-config", "disaggregated prefill")),
    (["--ignore-patterns", "original/**/*", "*.pt"], ("--ignore-patterns original/**/* *.pt", "top folder")),
    (["--tokenizer-pool-size", "-1"], ("--tokenizer-pool-size -1", "0 or more")),
    (["--swap-space", "-4"], ("--swap-space -4.0", "0 or more")),
    (["--max-seq-len-to-capture", "-1"], ("--max-seq-len-to-capture -1", "a positive integer")),
])
def test_a_vllm_option_that_would_change_something_is_refused_before_loading(capsys, flags, words):
    # a free port: the Quick start's `glimmer serve` may hold 8000, the default, which is checked first
    _fails_with_one_line(capsys, ["serve", "/no/such/model", "--port", str(free_port()), *flags], *words)


def test_every_vllm_engine_argument_llm_takes_is_a_serve_option_by_the_same_rule():
    """`vllm serve --scheduling-policy fcfs` (and --revision, --hf-overrides, --compilation-config, ...) was refused
    as unrecognized arguments though LLM(scheduling_policy="fcfs") was taken; serve has its own --served-model-name
    and --limit-mm-per-prompt, and takes vLLM's structured outputs options among its serving options."""
    from glimmer.cli import _VLLM_SERVE_OPTIONS
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS

    flags = {flag[2:].replace("-", "_") for flag in _VLLM_SERVE_OPTIONS}
    serves_its_own = {"served_model_name", "limit_mm_per_prompt", "guided_decoding_backend",
                      "structured_outputs_config", "reasoning_parser"}
    assert set(VLLM_ONLY_LLM_ARGUMENTS) - serves_its_own == flags


def test_vllm_engine_options_at_values_that_change_nothing_are_noted():
    from glimmer.cli import _VLLM_SERVE_OPTIONS, _check_vllm_options
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS

    args = build_parser().parse_args([
        "serve", "--scheduling-policy", "fcfs", "--cpu-offload-gb", "0", "--no-enable-expert-parallel",
        "--hf-overrides", "{}", "--compilation-config", "{}", "--mm-processor-kwargs", "{}",
        "--override-generation-config", "{}", "--hf-token", "--logprobs-mode", "raw_logprobs", "--model-impl", "auto",
        "--runner", "generate", "--config-format", "hf", "--max-parallel-loading-workers", "2",
        "--disable-custom-all-reduce", "--no-enable-lora", "--no-enable-sleep-mode", "--no-skip-tokenizer-init",
        "-O3", "--cuda-graph-sizes", "1", "2", "4", "--max-cudagraph-capture-size", "512",
        "--max-num-partial-prefills", "1", "--max-long-partial-prefills", "1", "--long-prefill-token-threshold", "0",
        "--attention-backend", "FLASH_ATTN", "--no-disable-sliding-window", "--disable-cascade-attn",
        "--no-enable-prompt-embeds", "--no-use-tqdm-on-load", "--prefix-caching-hash-algo", "sha256",
        "--no-calculate-kv-scales", "--no-enable-eplb", "--kv-transfer-config", "{}",
        "--ignore-patterns", "original/**/*", "--tokenizer-pool-size", "4"])
    notes = _check_vllm_options(args, _VLLM_SERVE_OPTIONS, VLLM_ONLY_LLM_ARGUMENTS)
    assert len(notes) == 34 and all(" changes nothing here: " in note for note in notes)
    assert "vLLM's --scheduling-policy fcfs changes nothing here: scheduling priorities are not supported" in "\n".join(
        notes)


@pytest.mark.parametrize(("model", "tokenizer"), [([], "glimmer-nano"), ([], "embedded"),
                                                 (["glimmer-nano"], "embedded")])
def test_a_tokenizer_naming_the_embedded_model_is_taken(model, tokenizer):
    """`glimmer serve --tokenizer glimmer-nano` (no MODEL: the embedded model) and `glimmer serve glimmer-nano
    --tokenizer DIR` (DIR its directory) were refused as another tokenizer than the model's."""
    from glimmer.cli import _VLLM_SERVE_OPTIONS, _check_vllm_options
    from glimmer.default_model import default_model_dir
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS

    tokenizer = str(default_model_dir()) if tokenizer == "embedded" else tokenizer
    args = build_parser().parse_args(["serve", *model, "--tokenizer", tokenizer])
    notes = _check_vllm_options(args, _VLLM_SERVE_OPTIONS, VLLM_ONLY_LLM_ARGUMENTS)
    assert notes == [f"vLLM's --tokenizer {tokenizer} changes nothing here: the tokenizer is read from the model's "
                     "directory (tokenizer.json, or a GGUF's own); leave it out"]


def test_a_tokenizer_other_than_the_embedded_model_is_refused_without_model(tiny_checkpoint):
    from glimmer.cli import _VLLM_SERVE_OPTIONS, UsageError, _check_vllm_options
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS

    for tokenizer in (str(tiny_checkpoint), "glimmer-nano-dflash"):
        args = build_parser().parse_args(["serve", "--tokenizer", tokenizer])
        with pytest.raises(UsageError, match="model's directory"):
            _check_vllm_options(args, _VLLM_SERVE_OPTIONS, VLLM_ONLY_LLM_ARGUMENTS)


@pytest.mark.parametrize("command", ["serve", "chat", "run-batch"])
def test_vllm_engine_options_that_change_nothing_are_noted_once_on_stderr(capsys, tmp_path, command):
    """The notes of vLLM's engine options taken (--scheduling-policy fcfs, ...) were computed and dropped: serve,
    chat and run-batch said nothing of them, where the serving options were noted."""
    from glimmer.cli import main

    argv = [command, str(tmp_path / "missing"), "--scheduling-policy", "fcfs", "--swap-space", "4"]
    if command == "serve":
        argv += ["--port", str(free_port())]
    if command == "run-batch":
        batch = tmp_path / "in.jsonl"
        batch.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", '
                         '"messages": [{"role": "user", "content": "hi"}]}}\n')
        argv += ["-i", str(batch), "-o", str(tmp_path / "out.jsonl")]
    assert main(argv) == 2  # the model is missing: the notes come before it is loaded
    captured = capsys.readouterr()
    assert captured.err.count("vLLM's --scheduling-policy fcfs changes nothing here: ") == 1
    assert captured.err.count("vLLM's --swap-space 4.0 changes nothing here: ") == 1
    assert "changes nothing here" not in captured.out


def test_vllms_dotted_keys_of_json_options_are_joined_into_their_objects():
    """`vllm serve -O.level=3 --speculative-config.num_speculative_tokens 4 ...` (vLLM's dotted keys of its JSON
    options) were unrecognized arguments."""
    args = build_parser().parse_args([
        "serve", "-O.level=3", "--speculative-config", '{"method": "dflash", "model": "/drafter"}',
        "--speculative-config.num_speculative_tokens", "4", "--hf-overrides.text_config.rope_theta=1e6",
        "--limit-mm-per-prompt.image", "2", "--default-chat-template-kwargs.current_date", "2030-05-05",
        "--kv-transfer-config.kv_role+", "a,b", "-O3"])
    assert args.compilation_config == {"level": 3} and args.optimization_level == 3
    assert json.loads(args.speculative_config) == {"method": "dflash", "model": "/drafter", "num_speculative_tokens": 4}
    assert args.hf_overrides == {"text_config": {"rope_theta": 1e6}}
    assert args.limit_mm_per_prompt == {"image": 2}
    assert args.default_chat_template_kwargs == {"current_date": "2030-05-05"}
    assert args.kv_transfer_config == {"kv_role": ["a", "b"]}
    chat = build_parser().parse_args(["chat", "--speculative-config.method=dflash", "--compilation-config.mode", "2"])
    assert json.loads(chat.speculative_config) == {"method": "dflash"} and chat.compilation_config == {"mode": 2}


def test_vllms_underscore_spellings_of_options_are_taken():
    """vLLM's parser takes `--max_model_len` for --max-model-len: a vLLM command line spelt so was refused here as
    "unrecognized arguments"."""
    args = build_parser().parse_args([
        "serve", "m", "--max_model_len", "4096", "--served_model_name", "a", "b", "--tensor_parallel_size", "1",
        "--no-enable_prefix_caching", "--speculative_config.num_speculative_tokens", "4",
        "--kv_cache_memory_bytes=1G", "--served_model_name=c"])
    assert (args.max_model_len, args.served_model_name, args.tensor_parallel_size) == (4096, ["a", "b", "c"], 1)
    assert args.enable_prefix_caching is False and json.loads(args.speculative_config) == {"num_speculative_tokens": 4}
    assert args.kv_cache_memory == 1 << 30 and args.kv_cache_memory_flag == "--kv-cache-memory-bytes"
    batch = build_parser().parse_args(["run-batch", "--input_file", "in.jsonl", "--output_file=out.jsonl", "--",
                                       "--my_model"])
    assert (batch.input_file, batch.output_file, batch.model) == ("in.jsonl", "out.jsonl", "--my_model")


def test_vllms_short_options_are_taken_as_their_long_ones(capsys):
    """`vllm serve MODEL -tp 1` (and -pp, -dp, -q, -asc) was refused as "unrecognized arguments"."""
    args = build_parser().parse_args(["serve", "m", "-tp", "1", "-pp", "1", "-dp", "1", "-q", "fp8", "-asc", "1"])
    assert (args.tensor_parallel_size, args.pipeline_parallel_size, args.data_parallel_size, args.quantization,
            args.api_server_count) == (1, 1, 1, "fp8", 1)
    batch = build_parser().parse_args(["run-batch", "-i", "in.jsonl", "-o", "out.jsonl", "-tp", "1"])
    assert batch.tensor_parallel_size == 1
    _fails_with_one_line(capsys, ["serve", "/no/such/model", "-tp", "2"], "--tensor-parallel-size 2: Glimmer runs a "
                                                                          "model on one device")


def test_vllms_config_file_gives_its_options_and_the_command_line_wins(tmp_path):
    """`vllm serve --config config.yaml` was taken as --config-format (argparse's abbreviation), refused for what
    the config format would change."""
    config = tmp_path / "config.yaml"
    config.write_text("model: /models/a\nmax_model_len: 1024\nserved-model-name: [a, b]\nport: 9001\n"
                      "enable-prefix-caching: false\nenforce-eager: true\nhf-overrides: {x: 1}\n"
                      "speculative-config.num_speculative_tokens: 4\napi-key: -k\nseed: null\n")
    args = build_parser().parse_args(["serve", "--config", str(config)])
    assert (args.model_option, args.max_model_len, args.served_model_name, args.port) == ("/models/a", 1024,
                                                                                       ["a", "b"], 9001)
    assert (args.enable_prefix_caching, args.enforce_eager, args.hf_overrides, args.api_key, args.seed) == (
        False, True, {"x": 1}, ["-k"], 0)
    assert json.loads(args.speculative_config) == {"num_speculative_tokens": 4}
    args = build_parser().parse_args(["serve", "--port", "5", "/models/b", f"--config={config}", "--served-model-name",
                                      "c", "--enable-prefix-caching", "--speculative-config.method", "dflash"])
    assert (args.model, args.model_option, args.port, args.served_model_name) == ("/models/b", None, 5, ["c"])
    assert args.enable_prefix_caching is True and args.max_model_len == 1024
    assert json.loads(args.speculative_config) == {"num_speculative_tokens": 4, "method": "dflash"}
    args = build_parser().parse_args(["--log-level", "DEBUG", "serve", "--config", str(config)])
    assert (args.log_level, args.model_option, args.max_model_len) == ("DEBUG", "/models/a", 1024)


@pytest.mark.parametrize("dotted", [["--speculative-config.num_speculative_tokens", "4"], ["--hf-overrides.a", "1"],
                                    ["--compilation-config.level", "3"], ["--limit-mm-per-prompt.image", "2"],
                                    ["-O.level", "3"]])
def test_a_dotted_keys_value_is_no_model_beside_a_config_file(tmp_path, dotted):
    """The dotted key's value was taken for MODEL, so the file's model was left out and the default model served."""
    config = tmp_path / "config.yaml"
    config.write_text("model: ./m\n")
    args = build_parser().parse_args(["serve", "--config", str(config), *dotted])
    assert (args.model, args.model_option) == (None, "./m")


def test_a_dotted_key_of_an_option_that_is_no_json_object_takes_no_value_beside_a_config_file():
    """`--enforce-eager.x ./m` was read as a dotted key, as --hf-overrides.a's is, and took ./m for its value: a dotted
    key is a JSON object option's alone, and argparse refuses any other (unrecognized arguments)."""
    from glimmer.cli import _positional_arguments

    actions = build_parser().commands["serve"]._option_string_actions
    assert _positional_arguments(["--enforce-eager.x", "./m"], actions) == ["./m"]
    assert _positional_arguments(["--max-model-len.x", "./m"], actions) == ["./m"]
    assert _positional_arguments(["--hf-overrides.a", "1", "./m"], actions) == ["./m"]


def test_a_dotted_key_in_a_config_file_yields_to_the_command_lines_whole_object(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("speculative-config.num_speculative_tokens: 3\nhf_overrides.a: 1\n")
    args = build_parser().parse_args(["serve", "m", "--config", str(config), "--speculative-config",
                                      '{"num_speculative_tokens": 2}', "--hf-overrides", '{"b": 2}'])
    assert (json.loads(args.speculative_config), args.hf_overrides) == ({"num_speculative_tokens": 2}, {"b": 2})


@pytest.mark.parametrize("model", [[], ["./m"], ["--", "./m"]])
def test_a_config_files_list_gives_an_option_whose_repeats_replace_all_its_items(tmp_path, model):
    """cuda-graph-sizes: [1, 2, 4] was --cuda-graph-sizes=1 --cuda-graph-sizes=2 --cuda-graph-sizes=4, each repeat
    replacing the last: [4]. An option whose repeats add to it (served-model-name) takes one item a repeat still."""
    config = tmp_path / "config.yaml"
    config.write_text("cuda-graph-sizes: [1, 2, 4]\nserved-model-name: [a, b]\napi-key: [-k]\n")
    args = build_parser().parse_args(["serve", "--config", str(config), *model])
    assert (args.cuda_graph_sizes, args.served_model_name, args.api_key) == ([1, 2, 4], ["a", "b"], ["-k"])
    assert args.model == (model[-1] if model else None)


@pytest.mark.parametrize(("text", "words"), [
    (None, ("--config {path}: No such file or directory",)),
    ("a: [1", ("--config {path} is not YAML",)),
    ("- max-model-len\n", ("--config {path} holds no mapping of option names to values",)),
    ("config: other.yaml\n", ("--config {path} names another --config file",)),
    ("port: 1\n", ("--config is given more than once",)),
    ("max-model-length: 5\n", ("--config {path}: max-model-length names no option of glimmer serve",)),
    ("enforce_eagr: false\n", ("--config {path}: enforce_eagr names no option of glimmer serve",)),
    ("enforce-eagr: true\nport: 1\n", ("--config {path}: enforce-eagr names no option of glimmer serve",)),
    ("seeds: null\n", ("--config {path}: seeds names no option",)),
    ("max-model-len.x: 1\n", ("--config {path}: max-model-len.x names no option of glimmer serve",)),
    ("enforce-eager.x: true\n", ("--config {path}: enforce-eager.x names no option of glimmer serve",)),
    ('{"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "model_type": "llama"}',
     ("--config {path}: architectures names no option of glimmer serve", "a checkpoint's config.json")),
    (b"max-model-len: 5 # caf\xe9\n", ("--config {path} is not UTF-8 text",)),
])
def test_a_config_file_that_gives_no_options_is_one_line(capsys, tmp_path, text, words):
    path = tmp_path / "config.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["serve", "--config", str(path),
                                   *["--config", str(path)] * ("more than once" in words[0])])
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("glimmer: error:"), err
    assert all(word.format(path=path) in err for word in words), err


def test_an_underscore_spelling_of_no_option_is_left_as_typed(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--max_model_length=4096"])
    assert "unrecognized arguments: --max_model_length=4096;" in capsys.readouterr().err


def test_a_joined_dotted_key_goes_before_a_double_dash():
    """Joined after a `--`, the option was read as a positional argument: "unrecognized arguments"."""
    args = build_parser().parse_args(["serve", "--speculative-config.num_speculative_tokens", "4", "--", "/model"])
    assert args.model == "/model" and json.loads(args.speculative_config) == {"num_speculative_tokens": 4}


def test_a_dotted_key_joins_an_own_value_in_its_option_s_other_form():
    """--limit-mm-per-prompt takes `image=4,video=1` as well as JSON: given so, its dotted keys were refused, "not a
    JSON object"."""
    parser = build_parser()
    args = parser.parse_args(["serve", "m", "--limit-mm-per-prompt", "image=4", "--limit-mm-per-prompt.video", "1"])
    assert args.limit_mm_per_prompt == {"image": 4, "video": 1}
    args = parser.parse_args(["chat", "--limit-mm-per-prompt=image=4,video=1", "--limit-mm-per-prompt.image", "2"])
    assert args.limit_mm_per_prompt == {"image": 2, "video": 1}


def test_a_dotted_key_joins_the_value_of_its_option_abbreviated():
    """argparse takes `--hf-overr` for --hf-overrides: the joined keys went after it, replacing its value silently."""
    args = build_parser().parse_args(["serve", "m", "--hf-overr", '{"a": 1}', "--hf-overrides.b", "2",
                                      "--limit-mm=image=4", "--limit-mm-per-prompt.video", "1"])
    assert args.hf_overrides == {"a": 1, "b": 2} and args.limit_mm_per_prompt == {"image": 4, "video": 1}


@pytest.mark.parametrize("flags", [["--compilation-config.level", "3"], ["--compilation-config", "3"],
                                   ["--compilation-config=3"], ["--compilation-config", " 3 "]])
def test_vllms_compilation_level_1_to_3_is_noted_as_changing_nothing(flags):
    """`--compilation-config 3`, vLLM's shorthand for a level alone (as LLM(compilation_config=3) is), was refused
    as no JSON object."""
    from glimmer.cli import _VLLM_SERVE_OPTIONS, _check_vllm_options
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS

    args = build_parser().parse_args(["serve", *flags])
    (note,) = _check_vllm_options(args, _VLLM_SERVE_OPTIONS, VLLM_ONLY_LLM_ARGUMENTS)
    assert note.startswith('vLLM\'s --compilation-config {"level": 3} changes nothing here')


def test_a_compilation_level_alone_takes_dotted_keys_as_its_object_does():
    args = build_parser().parse_args(["serve", "--compilation-config", "2", "--compilation-config.mode", "3"])
    assert args.compilation_config == {"level": 2, "mode": 3}


@pytest.mark.parametrize(("argv", "words"), [
    (["serve", "--speculative-config.num_speculative_tokens"], ("--speculative-config.num_speculative_tokens needs a "
                                                                "value",)),
    (["serve", "--hf-overrides..x", "1"], ("--hf-overrides..x: a key is empty",)),
    (["serve", "--hf-overrides.a", "1", "--hf-overrides.a.b", "2"], ("'a' was given a value, which has no keys",)),
    (["serve", "--speculative-config", "[1]", "--speculative-config.method", "dflash"], (
        "--speculative-config: '[1]' is not a JSON object", "--speculative-config.KEY")),
    (["serve", "--limit-mm-per-prompt", "audio=1", "--limit-mm-per-prompt.image", "2"], (
        "--limit-mm-per-prompt: 'audio': this model takes images and videos only",)),
])
def test_a_dotted_key_that_cannot_be_joined_is_one_line(capsys, argv, words):
    from glimmer.cli import main

    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("glimmer: error:"), err
    assert all(word in err for word in words), err


def test_a_vllm_hf_token_is_refused_without_repeating_it(capsys):
    err = _fails_with_one_line(capsys, ["serve", "/no/such/model", "--port", str(free_port()), "--hf-token",
                                        "hf_secret123"], "--hf-token TOKEN", "HF_TOKEN")
    assert "hf_secret123" not in err


def _self_signed(tmp_path: Path, name: str = "IP:127.0.0.1") -> tuple[Path, Path]:
    """A key and a self-signed certificate issued to `name` (subjectAltName: IP:ADDRESS or DNS:NAME)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    stem = name.replace(":", "-")
    key, cert = tmp_path / f"{stem}-key.pem", tmp_path / f"{stem}-cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", f"/CN={name.split(':', 1)[1]}", "-addext",
                    f"subjectAltName={name}"], check=True, capture_output=True, timeout=60)
    return key, cert


def test_serve_runs_a_vllm_serve_command_line_with_its_serving_options(tiny_checkpoint, tmp_path):
    """`vllm serve MODEL --enable-auto-tool-choice --tool-call-parser ... --dtype auto --ssl-keyfile ...` was refused
    as unrecognized arguments (and `--dtype auto` as an invalid choice). Options whose value changes nothing are
    noted at startup; HTTPS, the root path, uvicorn's log level and access log and the media limits take effect."""
    key, cert = _self_signed(tmp_path)
    trusted = ssl.create_default_context(cafile=str(cert))
    server = ServeProcess([
        "-m", "glimmer.cli", "serve", str(tiny_checkpoint), "--kv-cache-memory",
        "32MiB", "--dtype", "auto", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser",
        "deepseek_r1", "--disable-log-requests", "--max-log-len", "100", "--response-role", "assistant",
        "--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--root-path", "/api",
        "--uvicorn-log-level", "info", "--disable-uvicorn-access-log", "--limit-mm-per-prompt", '{"image": 2}',
        "--allowed-methods", "*", "--allowed-headers", "*"])
    try:
        url = server.wait_until_serving(verify=trusted)
        assert url.startswith("https://127.0.0.1:")
        with pytest.raises(httpx.TransportError):  # HTTPS only
            httpx.get(url.replace("https:", "http:") + "/health", timeout=5)
        reply = httpx.post(f"{url}/v1/completions", verify=trusted, timeout=60,
                           json={"model": tiny_checkpoint.name, "prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 200, reply.text
    finally:
        output = server.stop(signal.SIGTERM)
    assert server.process.returncode == 0, output
    assert "vLLM's --tool-call-parser hermes changes nothing here: tool calls are parsed by the model's own ATEM" \
        in output
    assert "vLLM's --enable-auto-tool-choice changes nothing here" in output
    assert f"API at {url}/v1" in output
    assert "GET /health" not in output and "POST /v1/completions" not in output  # no access log
    assert "(torch.float32)" in output  # --dtype auto: the CPU's default


def test_serve_takes_vllms_h11_limits_refusing_a_head_too_large_or_too_many_headers(tiny_checkpoint):
    """vLLM's --h11-max-incomplete-event-size and --h11-max-header-count were unrecognized arguments."""
    server = ServeProcess(["-m", "glimmer.cli", "serve", str(tiny_checkpoint), "--kv-cache-memory", "32MiB",
                           "--h11-max-incomplete-event-size", "1MiB", "--h11-max-header-count", "8"])
    try:
        url = server.wait_until_serving() + "/health"
        # the server reads a head in pieces (asyncio's 256 KiB): this one outgrows h11's default limit (16 KiB) but
        # not the one given, the next that one
        assert httpx.get(url, headers={"x-note": "a" * 600_000}, timeout=10).status_code == 200
        try:  # uvicorn answers 400 and closes, which may reset the connection before the client reads the answer
            refused = httpx.get(url, headers={"x-note": "a" * 2_000_000}, timeout=10).status_code
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
            refused = "reset"
        assert refused in (400, "reset")
        too_many = httpx.get(url, headers={f"x-extra-{i}": "1" for i in range(4)}, timeout=10)  # httpx sends 5
        assert too_many.status_code == 431
        assert "more than the server's limit of 8 (--h11-max-header-count)" in too_many.json()["error"]["message"]
    finally:
        output = server.stop(signal.SIGTERM)
    assert server.process.returncode == 0, output


def test_serve_requires_client_certificates_with_vllms_ssl_ca_certs_and_ssl_cert_reqs(tiny_checkpoint, tmp_path):
    """`vllm serve ... --ssl-ca-certs CA.pem --ssl-cert-reqs 2` (mutual TLS) was refused as unrecognized arguments;
    now a client without a certificate the CA signed is turned away in the TLS handshake."""
    (tmp_path / "server").mkdir()
    (tmp_path / "client").mkdir()
    key, cert = _self_signed(tmp_path / "server")
    client_key, client_cert = _self_signed(tmp_path / "client")  # self-signed: its own CA
    without = ssl.create_default_context(cafile=str(cert))
    with_certificate = ssl.create_default_context(cafile=str(cert))
    with_certificate.load_cert_chain(str(client_cert), str(client_key))
    server = ServeProcess(["-m", "glimmer.cli", "serve", str(tiny_checkpoint), "--kv-cache-memory", "32MiB",
                           "--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--ssl-ca-certs", str(client_cert),
                           "--ssl-cert-reqs", "2"])
    try:
        url = server.wait_until_serving(verify=with_certificate)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", verify=without, timeout=5)
    finally:
        output = server.stop(signal.SIGTERM)
    assert server.process.returncode == 0, output


def test_a_ca_file_without_client_certificates_asked_for_is_warned_of(capsys, tmp_path):
    """--ssl-ca-certs with --ssl-cert-reqs 0 (the default) verifies no client, as uvicorn and vLLM take it: the server
    started as if it were mutual TLS without a word."""
    from glimmer.cli import _check_client_certificate_options

    key, cert = _self_signed(tmp_path)
    https = ["serve", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--ssl-ca-certs", str(cert)]
    _check_client_certificate_options(build_parser().parse_args(https))
    err = capsys.readouterr().err
    assert err.startswith("glimmer: warning: --ssl-ca-certs") and "--ssl-cert-reqs 2" in err
    _check_client_certificate_options(build_parser().parse_args([*https, "--ssl-cert-reqs", "2"]))
    assert capsys.readouterr().err == ""


def test_client_certificates_asked_for_without_a_ca_or_with_no_ca_file_are_refused(capsys, tmp_path):
    key, cert = _self_signed(tmp_path)
    https = ["serve", "/no/such/model", "--port", str(free_port()), "--ssl-keyfile", str(key), "--ssl-certfile",
             str(cert)]
    _fails_with_one_line(capsys, [*https, "--ssl-cert-reqs", "1"], "--ssl-cert-reqs 1", "add --ssl-ca-certs CA.pem")
    _fails_with_one_line(capsys, [*https, "--ssl-ca-certs", str(tmp_path / "none.pem")], "--ssl-ca-certs",
                         "give a PEM file of CA certificates")


def test_every_vllm_serving_option_given_is_noted_with_what_glimmer_does_instead():
    """The README and --help say each is noted at startup: --response-role assistant and the CORS options given `*`
    (taken at those values alone) changed nothing without a word."""
    from glimmer.cli import _VLLM_SERVING_OPTIONS, _check_vllm_options
    from glimmer.engine.vllm_arguments import VLLM_SERVING_ARGUMENTS

    args = build_parser().parse_args(["serve", "--tool-call-parser", "hermes", "--response-role", "assistant",
                                      "--allowed-methods", "*", "--allowed-headers", "*"])
    notes = _check_vllm_options(args, _VLLM_SERVING_OPTIONS, VLLM_SERVING_ARGUMENTS)
    assert [note.split(" changes nothing here: ")[0] for note in notes] == [
        "vLLM's --tool-call-parser hermes", "vLLM's --response-role assistant", "vLLM's --allowed-methods *",
        "vLLM's --allowed-headers *"]
    assert "replies always come from the assistant role" in notes[1]


@pytest.mark.parametrize(("kwargs", "strength", "variables"), [
    ('{"current_date": "2030-05-05", "enable_thinking": false}', "low", {"current_date": "2030-05-05"}),
    ('{"reasoning_effort": "high"}', "high", {}), ("{}", None, {})])
def test_vllms_default_chat_template_kwargs_become_the_servers_defaults(kwargs, strength, variables):
    """`vllm serve --default-chat-template-kwargs '{"enable_thinking": false}'` was refused unless empty: its
    reasoning variables are the default strength, the others template variables under each request's own."""
    from glimmer.cli import _check_serve_options, _template_defaults

    args = build_parser().parse_args(["serve", "--default-chat-template-kwargs", kwargs])
    _check_serve_options(args)
    assert _template_defaults(args) == {"default_reasoning_strength": strength,
                                        "default_chat_template_kwargs": variables}


def test_vllms_exclude_tools_when_tool_choice_none_is_noted_as_what_glimmer_always_does():
    """`vllm serve --exclude-tools-when-tool-choice-none` was an unrecognized argument; Glimmer leaves the tools out
    of a tool_choice "none" prompt always (P-REQ-3; tests/server/test_chat_prompt.py checks the prompts)."""
    from glimmer.cli import _VLLM_SERVING_OPTIONS, _check_vllm_options
    from glimmer.engine.vllm_arguments import VLLM_SERVING_ARGUMENTS

    args = build_parser().parse_args(["serve", "--exclude-tools-when-tool-choice-none"])
    (note,) = _check_vllm_options(args, _VLLM_SERVING_OPTIONS, VLLM_SERVING_ARGUMENTS)
    assert note.startswith("vLLM's --exclude-tools-when-tool-choice-none changes nothing here: tools are always left "
                           "out of the prompt")


def test_vllms_structured_output_and_content_format_serving_options_are_noted_where_they_change_nothing():
    """`vllm serve --guided-decoding-backend guidance --chat-template-content-format auto ...` was refused as
    unrecognized arguments."""
    from glimmer.cli import _VLLM_SERVING_OPTIONS, _check_vllm_options
    from glimmer.engine.vllm_arguments import VLLM_SERVING_ARGUMENTS

    args = build_parser().parse_args([
        "serve", "--guided-decoding-backend", "auto", "--structured-outputs-config",
        '{"backend": "guidance", "disable_fallback": true}', "--chat-template-content-format", "auto",
        "--disable-frontend-multiprocessing", "--tool-parser-plugin", "parsers.py", "--api-server-count", "1"])
    notes = _check_vllm_options(args, _VLLM_SERVING_OPTIONS, VLLM_SERVING_ARGUMENTS)
    assert [note.split(" changes nothing here: ")[0] for note in notes] == [
        "vLLM's --chat-template-content-format auto", "vLLM's --guided-decoding-backend auto",
        "vLLM's --structured-outputs-config {\"backend\": \"guidance\", \"disable_fallback\": true}",
        "vLLM's --disable-frontend-multiprocessing", "vLLM's --tool-parser-plugin parsers.py",
        "vLLM's --api-server-count 1"]


@pytest.mark.parametrize(("text", "dtype"), [("auto", None), ("half", "float16"), ("float", "float32"),
                                             ("bfloat16", "bfloat16")])
def test_dtype_takes_vllms_names(text, dtype):
    assert build_parser().parse_args(["serve", "--dtype", text]).dtype == dtype


@pytest.mark.parametrize(("flags", "limits"), [
    ([], (16, 2)), (["--limit-mm-per-prompt", '{"image": 4, "video": 0}'], (4, 0)),
    (["--limit-mm-per-prompt", "image=3"], (3, 2)), (["--max-images-per-request", "5"], (5, 2)),
    (["--limit-mm-per-prompt", '{"video": 1}', "--max-videos-per-request", "1"], (16, 1)),
    (["--limit-mm-per-prompt", '{"image": {"count": 3, "width": 512, "height": 512}, "video": {"count": 1, '
      '"num_frames": 32, "width": null}}'], (3, 1)),
    (["--limit-mm-per-prompt", '{"image": 4, "video": {"count": 0}}'], (4, 0)),
    (["--limit-mm-per-prompt.image.count", "5"], (5, 2)),
    (["--limit-mm-per-prompt", '{"image": {"width": 64}}'], (16, 2)),
])
def test_limit_mm_per_prompt_sets_the_media_limits(flags, limits):
    """Newer vLLM's form, `{"image": {"count": 3, "width": 512, ...}}`, sets the count too (its profiling sizes change
    nothing; without a count the default stays): it was refused as "not a count"."""
    from glimmer.cli import _check_serve_options

    args = build_parser().parse_args(["serve", *flags])
    _check_serve_options(args)
    assert (args.max_images_per_request, args.max_videos_per_request) == limits


@pytest.mark.parametrize(("flags", "words"), [
    (["--enable-log-requests"], ("--enable-log-requests", "never logs requests' prompts")),
    (["--response-role", "user"], ("--response-role user", "assistant role")),
    (["--limit-mm-per-prompt", '{"image": 2}', "--max-images-per-request", "3"], ("gives 2 images",
                                                                                   "--max-images-per-request 3")),
    (["--ssl-keyfile", "key.pem"], ("--ssl-certfile is missing",)),
    (["--ssl-keyfile", "/no/key.pem", "--ssl-certfile", "/no/cert.pem"], ("--ssl-keyfile /no/key.pem", "PEM")),
    (["--root-path", "api"], ("--root-path api", "starting with /")),
    (["--request-read-timeout", "0"], ("--request-read-timeout 0 is not a time", "above 0")),
    (["--request-read-timeout", "nan"], ("--request-read-timeout nan is not a time",)),
    (["--media-fetch-timeout", "0"], ("--media-fetch-timeout 0 is not a time", "above 0", "out for 10")),
    (["--media-fetch-timeout", "inf"], ("--media-fetch-timeout inf is not a time",)),
    (["--max-media-bytes", "0"], ("--max-media-bytes 0 is too small", "out for 64 MiB")),
    (["--allowed-methods", "GET", "POST"], ("--allowed-methods GET POST", "GET, POST, DELETE")),
    (["--allowed-headers", "Authorization"], ("--allowed-headers Authorization", "every request header")),
    (["--allow-credentials"], ("--allow-credentials", "never allows credentials")),
    (["--return-tokens-as-token-ids"], ("--return-tokens-as-token-ids", "not supported")),
    (["--chat-template-content-format", "string"], ("--chat-template-content-format string", "as it is given")),
    (["--guided-decoding-backend", "xgrammar"], ("--guided-decoding-backend xgrammar", "llguidance")),
    (["--structured-outputs-config", '{"backend": "outlines"}'], ("--structured-outputs-config", "llguidance")),
    (["--structured-outputs-config", '{"disable_any_whitespace": true}'], ("--structured-outputs-config",
                                                                          "json.dumps")),
    (["--enable-force-include-usage"], ("--enable-force-include-usage", "include_usage")),
    (["--api-server-count", "4"], ("--api-server-count 4", "load balancer")),
    (["--headless"], ("--headless", "inside the server's process")),
    (["--enable-log-outputs"], ("--enable-log-outputs", "never logs")),
    (["--log-config-file", "log.json"], ("--log-config-file log.json", "--log-level")),
    (["--enable-tokenizer-info-endpoint"], ("--enable-tokenizer-info-endpoint", "/tokenize")),
    (["--default-chat-template-kwargs", '{"add_generation_prompt": false}'], ("--default-chat-template-kwargs",
                                                                           "'add_generation_prompt' is no template")),
    (["--default-chat-template-kwargs", '{"reasoning_effort": "huge"}'], ("--default-chat-template-kwargs",
                                                                         "reasoning_effort='huge'")),
    (["--default-chat-template-kwargs", '{"enable_thinking": false}', "--default-reasoning-strength", "high"], (
        "reasoning strength 'low'", "--default-reasoning-strength high", "give one of them")),
    (["--enable-server-load-tracking"], ("--enable-server-load-tracking", "/metrics")),
    (["--enable-ssl-refresh"], ("--enable-ssl-refresh", "restart")),
    (["--h11-max-header-count", "0"], ("--h11-max-header-count 0 would refuse every request",)),
    (["--h11-max-incomplete-event-size", "0"], ("--h11-max-incomplete-event-size 0 would refuse every request",)),
    (["--lora-modules", "sql=/adapters/sql"], ("--lora-modules sql=/adapters/sql", "LoRA adapters are not supported",
                                               "merge")),
    (["--ssl-ca-certs", "ca.pem"], ("--ssl-ca-certs", "over HTTPS only")),
    (["--ssl-cert-reqs", "2"], ("--ssl-cert-reqs 2", "over HTTPS only")),
    (["--ssl-cert-reqs", "3"], ("--ssl-cert-reqs 3 is invalid", "ssl.CERT_*")),
])
def test_a_serving_option_that_would_change_something_is_refused_before_loading(capsys, flags, words):
    _fails_with_one_line(capsys, ["serve", "/no/such/model", *flags], *words)


def test_an_encrypted_ssl_key_is_one_line_saying_so_without_asking_for_its_pass_phrase(capsys, tmp_path):
    """OpenSSL asked for the pass phrase on the terminal (twice: the check, then uvicorn), and without one (a
    supervisor) the refusal said `[Errno 22] Invalid argument`."""
    key, cert = _self_signed(tmp_path)
    encrypted = tmp_path / "encrypted.pem"
    subprocess.run(["openssl", "pkey", "-in", str(key), "-out", str(encrypted), "-aes256", "-passout", "pass:phrase"],
                   check=True, capture_output=True, timeout=60)
    _fails_with_one_line(capsys, ["serve", "/no/such/model", "--ssl-keyfile", str(encrypted), "--ssl-certfile",
                                  str(cert)], f"--ssl-keyfile {encrypted}: the key is encrypted", "openssl pkey")


@pytest.mark.parametrize("argv", [["--log-level", "debug", "serve"], ["serve", "--log-level", "debug"],
                                  ["make-tiny", "out", "--log-level", "DEBUG"]])
def test_log_level_is_taken_before_or_after_the_command(argv):
    assert build_parser().parse_args(argv).log_level == "DEBUG"
    assert build_parser().parse_args(["serve"]).log_level is None  # given nowhere: the command's default


def test_version_prints_the_package_version(capsys):
    import glimmer

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"glimmer {glimmer.__version__}"


def test_python_dash_m_glimmer_is_the_glimmer_command():
    """It failed with `No module named glimmer.__main__; 'glimmer' is a package and cannot be directly executed`."""
    import glimmer

    result = subprocess.run([sys.executable, "-m", "glimmer", "--version"], capture_output=True, text=True,
                            timeout=120)
    assert (result.returncode, result.stdout.strip()) == (0, f"glimmer {glimmer.__version__}"), result.stderr
    result = subprocess.run([sys.executable, "-m", "glimmer", "serve", "--port", "65536"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == (
        "glimmer: error: --port 65536 is not a TCP port; choose one from 1 to 65535, or 0 for a free one")


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["chat", "--help"], ["run-batch", "--help"],
                                  ["make-tiny", "--help"]])
def test_help_imports_no_torch(argv):
    """`glimmer --help` took 2.6 s: the CLI imported torch through `engine.config_checks`, `multimodal/__init__` and
    `server.settings` (which read `MediaFetchPolicy` through `multimodal.sources`). Help and parsing need none of
    it."""
    probe = ("import sys\n"
             "from glimmer.cli import main\n"
             "try:\n"
             f"    main({argv!r})\n"
             "except SystemExit as exit_:\n"
             "    assert exit_.code == 0, exit_.code\n"
             "print('torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: glimmer" in result.stdout and result.stdout.strip().splitlines()[-1] == "False"


def test_serve_without_a_model_serves_the_default_and_says_so(cache_env):
    """With --port 0 (ServeProcess gives it) the system picks a free port, and the line giving the API's URL names the
    port bound (`--port 0` was refused as no TCP port, where uvicorn and the socket API take it to mean any free
    one)."""
    server = ServeProcess(["-m", "glimmer.cli", "serve", "--max-model-len", "2048", "--kv-cache-memory", "50MiB",
                           "--require-cache-salt", "--trust-request-chat-template"], env=cache_env)
    try:
        url = server.wait_until_serving()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and not url.endswith(":0")
        assert f"chat page at {url}/" in server.output
        models = httpx.get(f"{url}/v1/models").json()
        assert [m["id"] for m in models["data"]] == [DEFAULT_MODEL_NAME]
        unsalted = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        assert unsalted.status_code == 400 and unsalted.json()["error"]["param"] == "cache_salt"
        template = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}<|start|>assistant"
        own = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "cache_salt": "s",
            "chat_template": template})
        assert own.status_code == 200, own.text  # the flag reached the server's settings
    finally:
        output = server.stop(signal.SIGINT, timeout_s=30)
    assert "embedded demo model glimmer-nano" in output
    assert server.process.returncode == 0
    written = [p.relative_to(cache_env["XDG_CACHE_HOME"]) for p in Path(cache_env["XDG_CACHE_HOME"]).rglob("*")
               if p.is_file()]
    assert all(path.parts[:2] == ("glimmer", "cpu-kernels") for path in written), written


@pytest.mark.parametrize("shutdown_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_shutdown_signal_stops_the_server_with_status_0(tiny_checkpoint, shutdown_signal):
    """uvicorn raises the SIGTERM it shut down for again: unhandled, that killed the process with status 143
    before the engine was shut down."""
    server = ServeProcess(["-m", "glimmer.cli", "serve", str(tiny_checkpoint), "--kv-cache-memory", "32MiB"])
    try:
        server.wait_until_serving()
    finally:
        output = server.stop(shutdown_signal)
    assert server.process.returncode == 0, output
    assert "Finished server process" in output and "Traceback" not in output


@pytest.mark.parametrize("environment", [{"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_no_color_keeps_ansi_colours_out_of_the_servers_log_on_a_terminal(tiny_checkpoint, environment):
    """uvicorn colours its log whenever stdout is a terminal, and NO_COLOR (no-color.org) was not passed on; nor was
    TERM=dumb, a terminal that shows escape sequences as text (Emacs' shell)."""
    server = ServeProcess(["-m", "glimmer.cli", "serve", str(tiny_checkpoint), "--kv-cache-memory", "32MiB"],
                          env={**os.environ, **environment}, on_terminal=True)
    try:
        server.wait_until_serving()
    finally:
        log = server.stop(signal.SIGINT)
    assert '"GET /health HTTP/1.1" 200' in log and "Finished server process" in log
    assert "\x1b[" not in log


@pytest.mark.parametrize(("no_color", "term", "styled"), [("", "xterm", True), ("1", "xterm", False),
                                                           ("", "dumb", False)])
def test_no_color_keeps_ansi_styles_out_of_an_in_process_chat_on_a_terminal(capsys, monkeypatch, no_color, term,
                                                                            styled):
    """The default model reasons before it answers: its reasoning is dimmed on a terminal, unless NO_COLOR is set
    (it was not read: only --no-color turned the styles off) or TERM=dumb (not read either: such a terminal, Emacs'
    shell, showed the escape sequences as text)."""
    from glimmer.cli import main

    typed = iter(["Hello", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(typed))
    monkeypatch.setenv("NO_COLOR", no_color)
    monkeypatch.setenv("TERM", term)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    quieted = [logging.getLogger(), logging.getLogger("glimmer.protocol")]  # the chat quiets them
    levels = [logger.level for logger in quieted]
    try:
        assert main(["chat", "--max-model-len", "2048", "--kv-cache-memory", "50MiB", "--max-tokens", "8"]) == 0
    finally:
        for logger, level in zip(quieted, levels, strict=True):
            logger.setLevel(level)
    out = capsys.readouterr().out
    assert out and ("\x1b[" in out) is styled


def test_serve_started_with_its_output_closed_serves(tiny_checkpoint):
    """A daemonizer may start it with stdout and stderr closed: Python then has no sys.stderr, and the weights'
    progress bar wrote to None (an AttributeError at load, exit 1, with no line anyone could read)."""
    port = free_port()  # (with its output closed the server cannot say which port --port 0 bound)
    process = subprocess.Popen(["sh", "-c", 'exec "$@" >&- 2>&-', "sh", sys.executable, "-m", "glimmer.cli", "serve",
                                str(tiny_checkpoint), "--port", str(port), "--kv-cache-memory", "32MiB"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(process, url)
        reply = httpx.post(f"{url}/v1/completions", timeout=60,
                           json={"model": tiny_checkpoint.name, "prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 200, reply.text
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    assert process.returncode == 0


def test_serve_listens_on_a_unix_socket_with_vllms_uds_and_removes_it_at_exit(tiny_checkpoint, tmp_path):
    """vLLM's `--uds PATH` was refused as an unrecognized argument. A socket file left by a killed server (nothing
    listens on it) is replaced."""
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))  # closed without listening: a file nothing accepts on
    process = subprocess.Popen([sys.executable, "-m", "glimmer.cli", "serve", str(tiny_checkpoint), "--uds", str(path),
                                "--kv-cache-memory", "32MiB"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://localhost") as client:
            deadline = time.monotonic() + 120
            while True:
                assert process.poll() is None, process.stdout.read()
                with contextlib.suppress(httpx.TransportError):
                    if client.get("/health", timeout=1).status_code == 200:
                        break
                assert time.monotonic() < deadline
                time.sleep(0.2)
            reply = client.post("/v1/completions", timeout=60,
                                json={"model": tiny_checkpoint.name, "prompt": "hi", "max_tokens": 2})
            assert reply.status_code == 200, reply.text
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert f"on the Unix socket {path}" in output and not path.exists()


def test_a_unix_socket_a_server_listens_on_is_refused_before_the_model_loads(capsys, tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as running:
        running.bind(str(path))
        running.listen()
        _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--uds", str(path)],
                             f"--uds {path}: a server is listening on it")
    assert path.exists()


def test_a_uds_path_holding_another_kind_of_file_is_refused_saying_so(capsys, tmp_path):
    """It said `Address already in use`, as if a server were listening there."""
    path = tmp_path / "notes.txt"
    path.write_text("kept")
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--uds", str(path)],
                         f"--uds {path}: a file that is not a socket is there")
    assert path.read_text() == "kept"


def test_a_uds_path_in_a_folder_this_user_cannot_open_is_refused_in_one_line(capsys, tmp_path, monkeypatch):
    """Path.is_socket raised PermissionError there, a traceback (tests run as root, so the refusal is simulated)."""
    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_socket", refuse)
    path = tmp_path / "locked" / "s.sock"
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--uds", str(path)],
                         f"--uds {path}: cannot look there (Permission denied)")


def test_sigterm_while_the_model_loads_stops_the_server_with_status_0(tiny_checkpoint, tmp_path):
    """SIGTERM had no handler until uvicorn ran: it killed a loading server (143), and a container's PID 1, for which
    the kernel ignores a signal without a handler, went on to serve after `docker stop` until it was killed."""
    socket_path = tmp_path / "s.sock"
    process = subprocess.Popen([sys.executable, "-m", "glimmer.cli", "serve", str(tiny_checkpoint), "--uds",
                                str(socket_path), "--kv-cache-memory", "32MiB"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in process.stdout:
            if "glimmer.engine.model_loader: loaded" in line:  # the weights are in; the kernels and template follow
                break
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert "glimmer: stopped by SIGTERM before serving" in output and "Traceback" not in output
    assert not socket_path.exists()


def test_sigterm_before_the_model_loads_stops_the_server_with_status_0(tmp_path):
    """The handler came only after serve's imports (a second or two) and its checks: SIGTERM then killed the server
    (status 143), and a container's PID 1, which ignores a signal without a handler, went on to load and serve."""
    script = ("import signal, sys, glimmer.cli\n"
              "glimmer.cli._check_engine_options = lambda args: signal.raise_signal(signal.SIGTERM)\n"
              "sys.exit(glimmer.cli.main(sys.argv[1:]))\n")
    socket_path = tmp_path / "s.sock"
    result = subprocess.run([sys.executable, "-c", script, "serve", str(tmp_path / "model"), "--uds", str(socket_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "glimmer: stopped by SIGTERM before serving" in result.stderr and "Traceback" not in result.stderr
    assert not socket_path.exists()


_HUB_DOWNLOAD_THAT_NEVER_ENDS = """\
import sys, threading
from concurrent.futures import ThreadPoolExecutor

import huggingface_hub


def snapshot_download(repo_id, **kwargs):  # as the Hub client fetches files: in a `with ThreadPoolExecutor`
    started, never = threading.Barrier(3), threading.Event()

    def fetch(name):
        started.wait()
        never.wait()

    with ThreadPoolExecutor(max_workers=2) as pool:
        fetches = [pool.submit(fetch, f"model-0000{shard}-of-00003.safetensors") for shard in (1, 2, 3)]
        started.wait()
        print("download started", flush=True)
        for fetch in fetches:
            fetch.result()


huggingface_hub.snapshot_download = snapshot_download
sys.exit(__import__("glimmer.cli").cli.main(sys.argv[1:]))
"""


def _serve_downloading_for_ever(socket_path: Path) -> subprocess.Popen:
    """`glimmer serve owner/name --uds socket_path` (_HUB_DOWNLOAD_THAT_NEVER_ENDS), once its download has begun."""
    process = subprocess.Popen([sys.executable, "-c", _HUB_DOWNLOAD_THAT_NEVER_ENDS, "serve", "owner/name", "--uds",
                                str(socket_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               stdin=subprocess.DEVNULL)
    for line in process.stdout:
        if line.startswith("download started"):
            break
    return process


def test_a_unix_socket_a_server_loading_its_model_holds_is_refused_and_left_to_it(capsys, tmp_path):
    """A server binds its --uds socket before its model loads, and was listening on it only once loaded: a second
    server on the path took the file for one a killed server left (nothing accepted on it), removed it and bound its
    own, so the first served on a socket no client could reach, and removed the second's file when it stopped."""
    socket_path = tmp_path / "s.sock"
    loading = _serve_downloading_for_ever(socket_path)
    try:
        held = socket_path.stat().st_ino
        _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--uds", str(socket_path)],
                             f"--uds {socket_path}: a server is listening on it")
        assert socket_path.stat().st_ino == held
    finally:
        loading.send_signal(signal.SIGTERM)
        output = loading.communicate(timeout=120)[0]
    assert loading.returncode == 0, output
    assert not socket_path.exists()


@pytest.mark.parametrize(("signal_name", "status", "said"), [
    ("SIGTERM", 0, "glimmer: stopped by SIGTERM before serving"),
    ("SIGINT", 130, ""),
])
def test_a_signal_while_serve_downloads_the_model_from_the_hub_ends_it_at_once(tmp_path, signal_name, status, said):
    """The signal's exception left the Hub client's `with ThreadPoolExecutor`, whose file threads (not daemons) were
    then waited for: the server stayed up until every file of the model was in, or the supervisor's SIGKILL. The fake
    download never ends, so the server can stop only by leaving it."""
    socket_path = tmp_path / "s.sock"
    process = _serve_downloading_for_ever(socket_path)
    try:
        process.send_signal(getattr(signal, signal_name))
        output = process.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"glimmer serve was still up, waiting for the download, after {signal_name}: "
                    f"{process.communicate()[0]}")
    assert process.returncode == status, output
    assert said in output and "Traceback" not in output
    assert not socket_path.exists()


_SIGNAL_AS_GLIMMER_CLI_BEGINS_TO_IMPORT = """\
import importlib, runpy, signal, sys

how, signal_name = sys.argv[1:3]
del sys.argv[1:3]


class SignalAtImport:  # the signal comes as the entry point imports glimmer.cli (and, through it, jinja2 and the rest)
    def find_spec(self, name, path=None, target=None):
        if name == "glimmer.cli":
            sys.meta_path.remove(self)
            signal.raise_signal(getattr(signal, signal_name))
        return None


sys.meta_path.insert(0, SignalAtImport())
if how == "-m glimmer":
    runpy.run_module("glimmer", run_name="__main__", alter_sys=True)
module, _, function = how.partition(":")  # the installed script's entry point, called as pip's script calls it
sys.exit(getattr(importlib.import_module(module), function)())
"""


@pytest.mark.parametrize(("way", "signal_name", "command", "status", "said"), [
    ("script", "SIGTERM", "serve", 0, "glimmer: stopped by SIGTERM before serving"),
    ("-m glimmer", "SIGTERM", "serve", 0, "glimmer: stopped by SIGTERM before serving"),
    ("script", "SIGTERM", "run-batch", 128 + signal.SIGTERM, "run-batch: stopped by SIGTERM before the batch began"),
    ("script", "SIGINT", "serve", 130, ""),
    ("script", "SIGTERM", "inspect", -signal.SIGTERM, ""),  # a command that does not heed SIGTERM ends at once
])
def test_a_signal_as_the_glimmer_command_imports_its_modules_ends_it_as_one_while_it_loads(
        tmp_path, way, signal_name, command, status, said):
    """The SIGTERM handler came once glimmer.cli was imported and the arguments parsed: a SIGTERM before (a tenth of a
    second or more) killed `glimmer serve` (status 143, where 0 is promised), and a container's PID 1, which ignores a
    signal without a handler, went on to load and serve after `docker stop`; Ctrl-C then printed a traceback."""
    import tomllib

    entry_point = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    how = entry_point["glimmer"] if way == "script" else way
    argv = {"serve": ["serve", str(tmp_path / "model"), "--uds", str(tmp_path / "s.sock")],
            "run-batch": _run_batch_argv(tmp_path), "inspect": ["inspect", str(tmp_path / "model")]}[command]
    result = subprocess.run([sys.executable, "-c", _SIGNAL_AS_GLIMMER_CLI_BEGINS_TO_IMPORT, how, signal_name, *argv],
                            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == status, result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "out.jsonl").exists()


def _run_batch_argv(tmp_path: Path) -> list[str]:
    (tmp_path / "in.jsonl").write_text('{"custom_id": "a", "method": "POST", "url": "/v1/completions", '
                                       '"body": {"model": "m", "prompt": "x"}}\n')
    return ["run-batch", str(tmp_path / "model"), "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]


_SIGTERM_AS_THE_CHECKS_RUN = "glimmer.cli._check_engine_options = lambda args: signal.raise_signal(signal.SIGTERM)\n"
_SIGTERM_DROPPED_AS_THE_MODEL_LOADS = """\
class Engine:
    def shutdown(self):
        print("engine shut down", file=sys.stderr)

class Held:
    pass

def load(args):  # the signal is handled in a weakref callback (an import lock's), where its exception is dropped
    held = Held()
    reference = weakref.ref(held, lambda _: signal.raise_signal(signal.SIGTERM))
    del held
    return Engine(), "tiny"

glimmer.cli._engine_from_args = load
"""


@pytest.mark.parametrize("moment", ["checks", "loading"])
@pytest.mark.parametrize("command", ["run-batch", "chat"])
def test_sigterm_before_or_while_the_model_loads_stops_run_batch_and_chat_with_status_143(tmp_path, command, moment):
    """run-batch and an in-process chat had no SIGTERM handler until a batch ran (chat: none at all): SIGTERM killed
    them, and a container's PID 1, which ignores a signal without a handler, went on to load the model and work."""
    script = ("import signal, sys, weakref, glimmer.cli\n"
              + (_SIGTERM_AS_THE_CHECKS_RUN if moment == "checks" else _SIGTERM_DROPPED_AS_THE_MODEL_LOADS)
              + "sys.exit(glimmer.cli.main(sys.argv[1:]))\n")
    argv = _run_batch_argv(tmp_path) if command == "run-batch" else ["chat", "--no-color"]
    earlier = '{"custom_id": "an earlier run\'s"}\n'
    if command == "run-batch":
        (tmp_path / "out.jsonl").write_text(earlier)
    result = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    stopped = {"run-batch": "run-batch: stopped by SIGTERM before the batch began",
               "chat": "glimmer: chat stopped by SIGTERM"}[command]
    assert stopped in result.stderr and "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    assert ("engine shut down" in result.stderr) == (moment == "loading")
    if command == "run-batch":  # no batch ran: the output file is as it was (it said the records finished were there)
        assert (tmp_path / "out.jsonl").read_text() == earlier


def test_sigterm_handled_in_a_weakref_callback_while_the_model_loads_still_stops_the_server(
        tmp_path, monkeypatch, capsys):
    """A SIGTERM handled while the loading code ran an import lock's weakref callback raised there, where Python drops
    the exception (printing "Exception ignored in ..." and a traceback), and the server went on to serve."""
    import weakref

    import glimmer.cli

    shut_down = []

    class LoadedEngine:
        def shutdown(self) -> None:
            shut_down.append(True)

    class Held:
        pass

    def load_through_a_dropped_sigterm(args):
        held = Held()
        reference = weakref.ref(held, lambda _: signal.raise_signal(signal.SIGTERM))
        del held  # the callback runs here, and so does the handler
        assert reference() is None
        return LoadedEngine(), "tiny"

    monkeypatch.setattr(glimmer.cli, "_engine_from_args", load_through_a_dropped_sigterm)
    assert glimmer.cli.main(["serve", str(tmp_path / "model"), "--uds", str(tmp_path / "s.sock")]) == 0
    captured = capsys.readouterr()
    assert "glimmer: stopped by SIGTERM before serving" in captured.err
    assert "Traceback" not in captured.err and "Exception ignored" not in captured.err
    assert shut_down == [True]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_as_the_watch_takes_it_over_stops_the_server_with_status_0(tmp_path, monkeypatch, capsys):
    """A SIGTERM handled just after the watch's handler was installed, before the watch was set up and before the
    `try` that reports it, raised Terminated out of glimmer.cli.main: a traceback and status 1, where 0 is
    promised."""
    import glimmer.cli
    import glimmer.sigterm

    install = signal.signal

    def install_then_sigterm(signum, handler):
        previous = install(signum, handler)
        if isinstance(getattr(handler, "__self__", None), glimmer.sigterm.SigtermWatch):
            signal.raise_signal(signal.SIGTERM)
        return previous

    hook = sys.unraisablehook
    monkeypatch.setattr(signal, "signal", install_then_sigterm)
    assert glimmer.cli.main(["serve", str(tmp_path / "model"), "--uds", str(tmp_path / "s.sock")]) == 0
    assert "glimmer: stopped by SIGTERM before serving" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and sys.unraisablehook is hook


def test_run_batch_stopped_before_its_output_is_emptied_says_the_output_is_as_it_was(tmp_path, monkeypatch):
    """The output was marked started before it was emptied: a SIGTERM in between said the records finished were in
    the file, which held an earlier run's."""
    import glimmer.cli
    import glimmer.sigterm

    def sigterm_as_the_output_is_looked_at(fd):
        raise glimmer.sigterm.Terminated()

    (tmp_path / "out.jsonl").write_text("an earlier run's\n")
    with glimmer.cli._batch_output(str(tmp_path / "out.jsonl"), "-") as output:
        with monkeypatch.context() as patch, pytest.raises(glimmer.sigterm.Terminated):
            patch.setattr(glimmer.cli.os, "fstat", sigterm_as_the_output_is_looked_at)
            output.start()
        assert not output.started
    assert (tmp_path / "out.jsonl").read_text() == "an earlier run's\n"


def test_chat_in_process_with_the_default_model(chat_in_process):
    code, out, err = chat_in_process(["--max-tokens", "80", "--max-model-len", "2048"], stdin=b"Hello!\n/exit\n",
                                     default_model=True)
    assert code == 0, err
    assert "embedded demo model glimmer-nano" in out
    assert "What can I do for you?" in out or "How can I help you today?" in out
    assert "error" not in out


def test_a_bad_model_is_one_clear_line_and_exit_code_2(cache_env, tmp_path):
    result = subprocess.run([sys.executable, "-m", "glimmer.cli", "serve", str(tmp_path / "missing"), "--port", "0"],
                            env=cache_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "glimmer: error: CheckpointError" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("text", "expected"), [("8GiB", 8 << 30), ("512MiB", 512 << 20), ("1.5gib", 3 << 29),
                                                ("1000", 1000), ("2GB", 2 * 10**9), ("1.1GB", 1_100_000_000),
                                                ("2TiB", 2 << 40), ("0.5KiB", 512)])
def test_sizes_parse(text, expected):
    from glimmer.cli import parse_size

    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8 parsecs", "", "GiB", "-1GiB", "1e3", "nan", "9" * 5000])
def test_bad_sizes_are_refused(text):
    import argparse

    from glimmer.cli import parse_size

    with pytest.raises(argparse.ArgumentTypeError, match="is not a size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["1.5", "0.5b", "1.0001KiB", "1.00000000000000000001KiB"])
def test_a_fraction_of_a_byte_is_refused_not_rounded(text):
    import argparse

    from glimmer.cli import parse_size

    with pytest.raises(argparse.ArgumentTypeError, match="is not a whole number of bytes"):
        parse_size(text)


def _subcommands():
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [("glimmer", parser), *sub.choices.items()]


@pytest.mark.parametrize(("name", "parser"), _subcommands(), ids=lambda value: value if isinstance(value, str) else "")
def test_every_option_has_help_text(name, parser):
    missing = [action.dest for action in parser._actions if not action.help]
    assert missing == [], f"{name}: options without help: {missing}"


def _fails_with_one_line(capsys, argv, *words):
    from glimmer.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("glimmer: error:"), err
    for word in words:
        assert word in err
    return err


@pytest.mark.parametrize(("argv", "words"), [
    ([], ("the following arguments are required: COMMAND", "see glimmer --help")),
    (["serve", "--port", "abc"], ("argument --port: invalid int value: 'abc'", "see glimmer serve --help")),
    (["chat", "--temperature", "hot"], ("argument --temperature", "see glimmer chat --help")),
    (["make-tiny"], ("required: dir", "see glimmer make-tiny --help")),
    (["serve", "--tools", "t.json"], ("unrecognized arguments: --tools", "see glimmer serve --help")),
    (["serve", "--limit-mm-per-prompt", '{"audio": 1}'], ("--limit-mm-per-prompt", "images and videos only")),
    (["serve", "--limit-mm-per-prompt", "{not json"], ("--limit-mm-per-prompt", "not a JSON object")),
    (["serve", "--limit-mm-per-prompt", '{"image": {"count": 2, "num_frames": 8}}'], (
        "--limit-mm-per-prompt: image.num_frames: unknown key", "count, width, height")),
    (["serve", "--limit-mm-per-prompt", '{"video": {"count": -1}}'], (
        "--limit-mm-per-prompt: video.count: -1 is not a count",)),
    (["serve", "--limit-mm-per-prompt", '{"image": {"count": 1, "width": 0}}'], (
        "--limit-mm-per-prompt: image.width: 0 is not a size",)),
    (["serve", "--hf-overrides", "[1]"], ("--hf-overrides", "is not a JSON object")),
    (["serve", "--generation-config", "/models/gen"], ("--generation-config: '/models/gen'", "auto or vllm")),
    (["serve", "--compilation-config", "{not json"], ("--compilation-config", "is not a JSON object", "nor a level")),
    (["serve", "--compilation-config", "3.0"], ("--compilation-config", "is not a JSON object", "nor a level")),
    (["serve", "--dtype", "fp8"], ("--dtype", "auto, half, float")),
    (["serve", "--max-model-len", "auto"], ("--max-model-len: 'auto'", "not supported",
                                            "leave the option out for the model's own context")),
    (["chat", "--max-model-len", "-1"], ("--max-model-len: '-1'", "not supported")),
    (["serve", "--max-model-len", "1.5K"], ("a binary suffix (K, 1,024) takes a whole number", "did you mean 1.5k")),
    (["serve", "--max-num-batched-tokens", "1.2345k"], ("--max-num-batched-tokens: invalid number of tokens",
                                                       "32k (thousands), 32K (1,024s)")),
    (["serve", "--max-model-len", "32x"], ("invalid number of tokens '32x'",)),
    (["serve", "--max-model-len", "\u0661\u0662"], ("invalid number of tokens",)),
])
def test_a_malformed_command_line_is_one_line_pointing_at_the_help(capsys, argv, words):
    """argparse's own errors printed the command's whole usage (34 lines for serve) before the error line."""
    from glimmer.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("glimmer: error:"), err
    for word in words:
        assert word in err


def test_a_missing_or_invalid_tools_file_is_one_line(capsys, tmp_path):
    _fails_with_one_line(capsys, ["chat", "--url", "http://127.0.0.1:9", "--tools", str(tmp_path / "missing.json")],
                         "missing.json", "No such file")
    (tmp_path / "bad.json").write_text("{not json")
    _fails_with_one_line(capsys, ["chat", "--tools", str(tmp_path / "bad.json")], "not valid JSON")
    (tmp_path / "nameless.json").write_text('[{"type": "function", "function": {}}]')
    _fails_with_one_line(capsys, ["chat", "--tools", str(tmp_path / "nameless.json")], "name")


def test_a_tools_file_starting_with_a_utf8_bom_is_read_as_run_batch_reads_its_file(tmp_path):
    """It was refused ("not valid JSON (Unexpected UTF-8 BOM ...)"), where run-batch takes a file a Windows editor
    saved with a BOM."""
    from glimmer.cli import _read_tools

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    path = tmp_path / "tools.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(tools).encode())
    assert _read_tools(str(path)) == tools


def test_an_empty_tools_path_is_refused_not_taken_for_a_chat_without_tools(capsys, tmp_path):
    """`--tools "$TOOLS"` with TOOLS unset read as no --tools: the chat ran, the model told of no tools."""
    err = _fails_with_one_line(capsys, ["chat", str(tmp_path / "missing"), "--tools", ""], "--tools is empty",
                               "leave --tools out")
    assert "missing" not in err  # no model was looked for


def test_an_unreachable_url_is_one_line_and_a_failure(capsys):
    url = f"http://127.0.0.1:{free_port()}/v1"
    _fails_with_one_line(capsys, ["chat", "--url", url], f"cannot reach {url}: ")


def test_an_unreachable_url_says_how_to_fix_it(capsys):
    """It named only the connection error (`Connection refused`), not what to do about it."""
    url = f"http://127.0.0.1:{free_port()}"
    _fails_with_one_line(capsys, ["chat", "--url", url], f"cannot reach {url}: ", "glimmer serve", "address")


def test_chat_with_a_model_the_server_does_not_serve_is_one_line_naming_the_served_ones(capsys, monkeypatch,
                                                                                       tiny_checkpoint):
    monkeypatch.setattr("builtins.input", lambda prompt: pytest.fail("a message was asked for before the check"))
    with live_server(tiny_checkpoint) as server:
        _fails_with_one_line(capsys, ["chat", "--url", server.url, "--served-model", "nope"],
                             f"{server.url} does not serve the model 'nope'; it serves 'tiny', 'tiny-alias'")


@contextlib.contextmanager
def _https_model_list(key: Path, cert: Path) -> Iterator[str]:
    """The URL of an HTTPS server on 127.0.0.1 with `cert` that lists one model, 'm'."""
    import http.server
    import threading

    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = b'{"object": "list", "data": [{"id": "m"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_chat_with_an_https_server_whose_certificate_is_not_trusted_says_how_to_trust_it(capsys, monkeypatch,
                                                                                       tmp_path):
    """A self-signed server (`glimmer serve --ssl-certfile`) was `cannot reach URL: [SSL: CERTIFICATE_VERIFY_FAILED]
    ...; start the server there (`glimmer serve`)`, a server that was running; SSL_CERT_FILE is what trusts it (and
    an address its certificate does not name is fixed by one it does)."""
    from glimmer.cli import main

    key, cert = _self_signed(tmp_path)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.setattr("builtins.input", _typed([]))
    with _https_model_list(key, cert) as url:
        err = _fails_with_one_line(capsys, ["chat", "--url", url], f"{url} sent a certificate this machine does not "
                                   "trust (self-signed certificate)", "SSL_CERT_FILE=")
        assert "start the server" not in err
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # what the message says to do
        assert main(["chat", "--url", url]) == 0
        other_name = url.replace("127.0.0.1", "localhost")  # the certificate names 127.0.0.1 alone
        err = _fails_with_one_line(capsys, ["chat", "--url", other_name], "Hostname mismatch",
                                   "give the server's address by a name (or IP address) its certificate is issued to")
        assert "SSL_CERT_FILE" not in err


def test_chat_with_an_ip_address_a_trusted_certificate_does_not_name_says_to_give_a_name_it_does(capsys, monkeypatch,
                                                                                              tmp_path):
    """A certificate issued to localhost reached as https://127.0.0.1 (OpenSSL's IP address mismatch, verify code 64,
    not the hostname mismatch 62) was told to trust it with SSL_CERT_FILE, which it already was."""
    key, cert = _self_signed(tmp_path, "DNS:localhost")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.setattr("builtins.input", _typed([]))
    with _https_model_list(key, cert) as url:
        err = _fails_with_one_line(capsys, ["chat", "--url", url], "IP address mismatch",
                                   "give the server's address by a name (or IP address) its certificate is issued to")
        assert "SSL_CERT_FILE" not in err


def test_chat_gives_back_stdin_and_stdout_as_it_found_them(capsys, monkeypatch, tmp_path):
    """The chat set stdin's error handler to surrogateescape and stdout's to replace for good, before it checked the
    server: a program running glimmer.cli.main(["chat", ...]) kept them changed after it returned, even with 2."""
    from glimmer.cli import main

    stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr("builtins.input", _typed([]))
    stdout_errors = sys.stdout.errors
    assert main(["chat", "--url", f"http://127.0.0.1:{free_port()}"]) == 2
    assert (sys.stdin.errors, sys.stdout.errors) == ("strict", stdout_errors)
    key, cert = _self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with _https_model_list(key, cert) as url:
        assert main(["chat", "--url", url]) == 0
    assert (sys.stdin.errors, sys.stdout.errors) == ("strict", stdout_errors)
    capsys.readouterr()


def test_chat_in_a_program_that_read_stdin_first_reads_the_rest(capsys, monkeypatch, tmp_path):
    """io refuses to change stdin's error handler once it has been read from: a program that read a line before
    running glimmer.cli.main(["chat", ...]) got an io.UnsupportedOperation traceback. Its stdin is left as it is."""
    from glimmer.cli import main

    stdin = io.TextIOWrapper(io.BytesIO(b"first\n/exit\n"), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert sys.stdin.readline() == "first\n"
    key, cert = _self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with _https_model_list(key, cert) as url:
        assert main(["chat", "--url", url]) == 0
    assert sys.stdin.read() == ""  # the chat read /exit
    capsys.readouterr()


def test_chat_takes_a_base_url_ending_in_v1_as_openai_clients_do(capsys, monkeypatch, tiny_checkpoint):
    from glimmer.cli import main

    monkeypatch.setattr("builtins.input", lambda prompt: "/exit")
    with live_server(tiny_checkpoint) as server:
        assert main(["chat", "--url", server.url + "/v1/", "--served-model", "tiny-alias"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("Type a message;") and captured.err == ""


def test_a_reply_holding_characters_stdouts_encoding_lacks_shows_them_as_question_marks(monkeypatch, tiny_checkpoint):
    """Under PYTHONIOENCODING=ascii, a latin-1 locale or a Windows code page, the first character of a reply that
    stdout's encoding lacks ended the chat in a UnicodeEncodeError traceback, exit 1."""
    from glimmer.cli import main

    stdout = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr("builtins.input", _typed(["[hello] hi"]))
    with live_server(tiny_checkpoint, scripted=True) as server:
        server.engine.engine.runner.add("[hello]", " to=self<|message|>A greeting.<|eom|>"
                                                   "<|start|>assistant to=user<|message|>Caf\u00e9 \u2192 ok<|eot|>")
        code = main(["chat", "--url", server.url, "--no-color", "--temperature", "0"])
    stdout.flush()
    assert code == 0 and b"Caf? ? ok\n" in stdout.buffer.getvalue()


def test_chat_with_a_url_refuses_a_max_tokens_the_servers_context_cannot_hold_before_the_first_message(
        capsys, monkeypatch, tiny_checkpoint):
    """Every message was answered `HTTP 400: prompt (129 tokens) + max_tokens (2048) exceeds max_model_len=2048`."""
    from glimmer.cli import main

    monkeypatch.setattr("builtins.input", lambda prompt: pytest.fail("a message was asked for before the check"))
    with live_server(tiny_checkpoint) as server:  # max_model_len 2048
        _fails_with_one_line(capsys, ["chat", "--url", server.url, "--max-tokens", "2048"],
                             "--max-tokens 2048 would make every message fail", "a context of 2048 tokens",
                             "leaves the prompt room (below 2048)")
        monkeypatch.setattr("builtins.input", lambda prompt: "/exit")
        assert main(["chat", "--url", server.url, "--max-tokens", "2047"]) == 0  # room for a prompt of one token


def test_chat_with_a_url_refuses_a_model_and_engine_options_it_would_ignore(capsys, tmp_path):
    """The server chose its model and engine: a MODEL or --max-model-len beside --url would be silently ignored."""
    _fails_with_one_line(capsys, ["chat", str(tmp_path), "--url", f"http://127.0.0.1:{free_port()}",
                                  "--max-model-len", "100"], "MODEL, --max-model-len would be ignored: leave them out")
    _fails_with_one_line(capsys, ["chat", str(tmp_path), "--url", f"http://127.0.0.1:{free_port()}"],
                         "MODEL would be ignored: leave it out, or leave out --url")


def test_chat_takes_vllms_limit_mm_per_prompt_in_process_and_refuses_it_with_a_url(capsys, tmp_path):
    """`--limit-mm-per-prompt` (serve's) was an unrecognized argument of chat: in-process it is noted (the terminal
    sends text only); with --url the server's limits hold, so it is refused as the engine options are."""
    from glimmer.cli import main

    assert main(["chat", str(tmp_path / "missing"), "--limit-mm-per-prompt", "image=2"]) == 2  # noted, then loading
    assert "vLLM's --limit-mm-per-prompt image=2 changes nothing here: the terminal chat sends text only" in (
        capsys.readouterr().err)
    # the value as given, not the counts read from it: this one was shown as {"image": 4}
    given = '{"image": {"count": 4, "width": 512}, "video": {"num_frames": 8}}'
    assert main(["chat", str(tmp_path / "missing"), "--limit-mm-per-prompt", given]) == 2
    assert f"vLLM's --limit-mm-per-prompt {given} changes nothing here" in capsys.readouterr().err
    _fails_with_one_line(capsys, ["chat", "--url", "http://127.0.0.1:9", "--limit-mm-per-prompt", "image=2"],
                         "--limit-mm-per-prompt would be ignored")


def test_chat_without_a_url_refuses_the_flags_only_a_url_server_reads(capsys, monkeypatch, tmp_path):
    """In-process there is no server to ask for --served-model or to send --api-key to: they would be ignored.
    $GLIMMER_API_KEY alone is not a flag given, and stays the --url default."""
    monkeypatch.setenv("GLIMMER_API_KEY", "from-env")
    _fails_with_one_line(capsys, ["chat", str(tmp_path / "missing"), "--served-model", "foo", "--api-key", "k"],
                         "--served-model, --api-key only apply to a --url server", "leave them out")
    _fails_with_one_line(capsys, ["chat", str(tmp_path / "missing"), "--api-key", "k"],
                         "--api-key only applies to a --url server", "leave it out, or add --url")


def test_serve_answers_to_its_model_named_as_given_as_vllm_serves_it(tiny_checkpoint):
    """`vllm serve /models/x` serves the model as `/models/x`, the name its clients then send: `glimmer serve
    /models/x` served the directory's name alone and answered them 404. As run-batch does, it takes either, the
    directory's name first (the one responses, /v1/models and the metrics' model_name name first)."""
    server = ServeProcess(["-m", "glimmer.cli", "serve", str(tiny_checkpoint), "--kv-cache-memory", "32MiB"])
    try:
        url = server.wait_until_serving()
        reply = httpx.post(f"{url}/v1/completions", timeout=60,
                           json={"model": str(tiny_checkpoint), "prompt": "hi", "max_tokens": 1})
        listed = [card["id"] for card in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]
    finally:
        output = server.stop(signal.SIGTERM)
    assert server.process.returncode == 0, output
    assert reply.status_code == 200, reply.text
    assert listed == [tiny_checkpoint.name, str(tiny_checkpoint)]


def test_a_served_model_name_given_twice_is_refused(capsys):
    _fails_with_one_line(capsys, ["serve", "--served-model-name", "a", "b", "a"],
                         "--served-model-name: 'a' given more than once")
    _fails_with_one_line(capsys, ["serve", "--served-model-name", "a", "--served-model-name", "a"],
                         "--served-model-name: 'a' given more than once")


@pytest.mark.parametrize("command", ["serve", "run-batch"])
@pytest.mark.parametrize(("flag", "dest"), [("--served-model-name", "served_model_name"),
                                            ("--allowed-media-domains", "allowed_media_domains")])
def test_a_list_option_given_twice_keeps_the_values_of_both(command, flag, dest):
    """The flag given again replaced the values before it: `--served-model-name a --served-model-name b` served 'b'
    alone, and clients asking for 'a' got 404; as --api-key and --allowed-local-media-path, it adds to them."""
    batch_files = ["-i", "in.jsonl", "-o", "out.jsonl"] * (command == "run-batch")
    args = build_parser().parse_args([command, "model", *batch_files, flag, "a", "b", flag, "c"])
    assert getattr(args, dest) == ["a", "b", "c"]


@pytest.mark.parametrize(("flag", "dest"), [("--allowed-origins", "allowed_origins"),
                                            ("--allowed-methods", "allowed_methods"),
                                            ("--allowed-headers", "allowed_headers")])
def test_a_cors_option_given_twice_keeps_the_values_of_both(flag, dest):
    args = build_parser().parse_args(["serve", "model", flag, "a", flag, "b", "c"])
    assert getattr(args, dest) == ["a", "b", "c"]


def test_vllms_cors_options_as_vllm_spells_them_one_json_list_each_are_taken():
    """vLLM reads --allowed-origins, --allowed-methods and --allowed-headers as one JSON list each (`vllm serve ...
    --allowed-origins '["https://app.example.com"]' --allowed-headers '["*"]'`): Glimmer took the list as one origin,
    and refused it as "not a web origin" (the headers and methods as values that would change something), so the
    `vllm serve` command line did not run as written."""
    from glimmer.cli import _VLLM_SERVING_OPTIONS, _check_serve_options, _check_vllm_options
    from glimmer.engine.vllm_arguments import VLLM_SERVING_ARGUMENTS

    args = build_parser().parse_args([
        "serve", "model", "--allowed-origins", '["https://app.example.com", "http://localhost:3000"]',
        "--allowed-methods", '["*"]', "--allowed-headers", '["*"]'])
    assert args.allowed_origins == ["https://app.example.com", "http://localhost:3000"]
    _check_serve_options(args)
    notes = _check_vllm_options(args, _VLLM_SERVING_OPTIONS, VLLM_SERVING_ARGUMENTS)
    assert [note.split(" changes nothing here: ")[0] for note in notes] == ["vLLM's --allowed-methods *",
                                                                            "vLLM's --allowed-headers *"]
    mixed = build_parser().parse_args(["serve", "model", "--allowed-origins", '["*"]', "https://app.example.com"])
    assert mixed.allowed_origins == ["*", "https://app.example.com"]


def test_a_busy_port_is_reported_before_the_model_loads(capsys, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # the model does not exist either: the port is checked first
        _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(port)], f":{port}", "--port")


_ANOTHER_SERVER_LISTENS_FIRST = """\
import sys, glimmer.cli
from glimmer.server.connection import tcp_listener

other = tcp_listener("127.0.0.1", 0)  # another `glimmer serve` loading its model: the port bound, not yet listened on
load = glimmer.cli._engine_from_args


def load_while_the_other_gets_ready(args):
    loaded = load(args)
    other.listen()  # the other server was serving first
    return loaded


glimmer.cli._engine_from_args = load_while_the_other_gets_ready
sys.exit(glimmer.cli.main([*sys.argv[1:], "--port", str(other.getsockname()[1])]))
"""


def test_a_port_another_server_listened_on_while_the_model_loaded_is_reported_in_one_line(tiny_checkpoint):
    """A busy port is reported before the model loads, but a server still loading its own model holds its port bound
    and not yet listened on, which a second bind (SO_REUSEADDR, as a restarted server needs) does not refuse: two
    servers started on one port both loaded their models, and the second to be ready died as uvicorn listened, with
    two tracebacks ending `OSError: [Errno 98] Address already in use` and status 1."""
    result = subprocess.run([sys.executable, "-c", _ANOTHER_SERVER_LISTENS_FIRST, "serve", str(tiny_checkpoint),
                             "--kv-cache-memory", "32MiB"], capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("glimmer: error: cannot listen on 127.0.0.1:"), result.stderr
    assert "another server" in last and "--port" in last, last


def test_make_tiny_refuses_a_non_empty_directory_without_force(capsys, tmp_path):
    from glimmer.cli import main

    (tmp_path / "notes.txt").write_text("keep me")
    _fails_with_one_line(capsys, ["make-tiny", str(tmp_path)], "not empty", "--force")
    assert main(["make-tiny", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "config.json").exists() and (tmp_path / "notes.txt").exists()


@pytest.mark.parametrize(("argv", "words"), [
    (["make-tiny", ""], "DIR is empty"),
    (["make-tiny", "drafter", "--drafter-for", ""], "--drafter-for is empty"),
    (["inspect", ""], "MODEL is empty"),
    (["serve", ""], "MODEL is empty"),
    (["chat", " "], "MODEL is empty")])
def test_an_empty_path_argument_is_refused_not_read_as_the_current_directory(capsys, monkeypatch, tmp_path, argv,
                                                                            words):
    """`glimmer make-tiny "$OUT"` with OUT unset wrote a checkpoint into the current directory (with --force, over
    the weights there), and `inspect ""` inspected it; serve and chat refused in LLM's words, `model='': required`."""
    monkeypatch.chdir(tmp_path)
    _fails_with_one_line(capsys, argv, words)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_checkpoint_is_one_line(capsys, tmp_path):
    _fails_with_one_line(capsys, ["inspect", str(tmp_path / "missing")], "missing")
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(free_port())], "missing")


def test_a_kernel_switch_that_is_not_a_setting_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("GLIMMER_KERNELS", "fast")
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(free_port())],
                         "GLIMMER_KERNELS='fast'", "'torch'")


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_is_one_line(capsys, tmp_path, port):
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", port], f"--port {port}", "65535")


@pytest.mark.parametrize("value", ["-1", "0"])
def test_a_queue_that_would_refuse_every_request_is_refused_before_the_model_loads(capsys, tmp_path, value):
    # 0 as well: AsyncEngine answers 429 whenever num_waiting >= max_waiting_requests
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(free_port()),
                                  "--max-waiting-requests", value], f"--max-waiting-requests {value}", "at least 1")


@pytest.mark.parametrize("flag", ["--max-video-frames", "--max-image-pixels", "--max-image-aspect-ratio"])
@pytest.mark.parametrize("command", ["serve", "chat"])
def test_a_media_limit_below_1_is_refused_by_its_flag_before_the_model_loads(capsys, tmp_path, command, flag):
    """--max-video-frames 0 was refused as `max_video_source_frames=0`, a name the user never typed."""
    err = _fails_with_one_line(capsys, [command, str(tmp_path / "missing"), flag, "0"], f"{flag} 0 is invalid",
                               "positive integer")
    assert "max_" not in err and "missing" not in err


@pytest.mark.parametrize(("flags", "words"), [
    (["--max-model-len", "0"], ["--max-model-len 0 is invalid", "positive integer"]),
    (["--max-num-seqs", "-3"], ["--max-num-seqs -3 is invalid", "positive integer"]),
    (["--max-num-batched-tokens", "0"], ["--max-num-batched-tokens 0 is invalid", "positive integer"]),
    (["--kv-cache-memory", "0"], ["--kv-cache-memory 0 is invalid", "positive size"]),
    (["--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization 1.5 is invalid", "(0, 1]"]),
    (["--chat-template", "no-such-template.jinja"], ["--chat-template no-such-template.jinja: no such file",
                                                      "leave it out for the checkpoint's own template"]),
    (["--seed", str(2**64)], [f"--seed {2**64} is out of range", "from -2**63 to 2**64 - 1"]),
    (["--seed", str(-(2**63) - 1)], [f"--seed {-(2**63) - 1} is out of range", "from -2**63 to 2**64 - 1"]),
    (["--device", "mps"], ["--device mps is not supported", "--device cpu or cuda"]),
])
@pytest.mark.parametrize("command", ["serve", "chat"])
def test_an_engine_option_out_of_range_is_refused_by_its_flag_before_the_model_loads(capsys, tmp_path, command,
                                                                                      flags, words):
    """These were refused by EngineConfig's field, `max_model_len=0 must be a positive integer (or None for the
    default)`, `seed=... must be an integer in [-2**63, 2**64)`, `device='mps' is not supported; use 'cpu' or
    'cuda'`: a name and a None the command line never takes."""
    err = _fails_with_one_line(capsys, [command, str(tmp_path / "missing"), *flags], *words)
    assert "None" not in err and "max_" not in err and "chat_template" not in err and "missing" not in err
    assert "seed=" not in err and "device=" not in err


@pytest.mark.parametrize(("flag", "dest"), [("--max-model-len", "max_model_len"),
                                          ("--max-num-batched-tokens", "max_num_batched_tokens")])
@pytest.mark.parametrize(("text", "tokens"), [("4096", 4096), ("32k", 32_000), ("1.5k", 1_500), ("25.6k", 25_600),
                                              ("32K", 32_768), ("1m", 1_000_000), ("1M", 1_048_576)])
def test_token_counts_take_vllms_suffixes(flag, dest, text, tokens):
    """`vllm serve --max-model-len 32k` (vLLM's human-readable numbers) was an argparse error."""
    assert getattr(build_parser().parse_args(["serve", flag, text]), dest) == tokens


@pytest.mark.parametrize("flag", ["--kv-cache-memory-bytes", "--kv-cache-memory"])
@pytest.mark.parametrize(("text", "size"), [("8G", 8 << 30), ("8g", 8 * 10**9), ("512M", 512 << 20),
                                            ("1.5g", 15 * 10**8), ("16k", 16_000), ("8GiB", 8 << 30),
                                            ("8GB", 8 * 10**9), ("4096", 4096)])
def test_a_kv_cache_size_takes_vllms_suffixes(flag, text, size):
    """vLLM reads --kv-cache-memory-bytes as it reads --max-model-len (human_readable_int: 8G is 8 GiB, 8g 8 GB):
    `vllm serve MODEL --kv-cache-memory-bytes 8G` was refused, "'8G' is not a size"."""
    assert build_parser().parse_args(["serve", flag, text]).kv_cache_memory == size


@pytest.mark.parametrize("flag", ["--kv-cache-memory", "--kv-cache-memory-bytes"])
def test_a_kv_cache_size_refused_is_named_by_the_flag_typed(capsys, tmp_path, tiny_checkpoint, flag):
    """vLLM's --kv-cache-memory-bytes is --kv-cache-memory: its errors named --kv-cache-memory, a flag the user had
    not typed."""
    from glimmer.cli import main

    _fails_with_one_line(capsys, ["serve", str(tmp_path), "--port", str(free_port()), flag, "0"],
                         f"{flag} 0 is invalid")
    batch = tmp_path / "in.jsonl"
    batch.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", '
                     '"prompt": "hi"}}\n')
    assert main(["run-batch", str(tiny_checkpoint), "-i", str(batch), "-o", str(tmp_path / "out.jsonl"), flag,
                 "1000TiB"]) == 2  # more than this machine's memory: the engine's error names the flag to lower
    err = capsys.readouterr().err
    assert f"give the KV cache less ({flag} SIZE" in err
    assert "--kv-cache-memory SIZE" not in err or flag == "--kv-cache-memory"


def test_a_max_model_len_beyond_the_models_is_refused_naming_the_flag(capsys, make_tiny):
    """It was `max_model_len=10000000 must be between 2 and the model's ...`: a field the command line never takes,
    and no fix."""
    from glimmer.cli import main

    assert main(["serve", str(make_tiny()), "--device", "cpu", "--port", str(free_port()),
                 "--max-model-len", "10000000"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the weights' progress bar
    assert err.startswith("glimmer: error:") and "--max-model-len" in err and "leave it out" in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
@pytest.mark.parametrize("command", ["serve", "chat"])
def test_a_cuda_device_without_cuda_is_refused_by_the_flag_before_the_model_loads(capsys, tmp_path, command, device):
    """It was `device='cuda' was requested but CUDA is not available here; use device='cpu'`."""
    err = _fails_with_one_line(capsys, [command, str(tmp_path / "missing"), "--device", device],
                               f"--device {device}: CUDA is not available here", "--device cpu")
    assert "device=" not in err and "missing" not in err


@pytest.mark.parametrize(("value", "words"), [("{bad", "not valid JSON"), ("[1]", "must be a JSON object"),
                                               ('{"method": "dflash"}', "needs 'model'")])
@pytest.mark.parametrize("command", ["serve", "chat"])
def test_a_bad_speculative_config_is_one_line_before_the_model_loads(capsys, tmp_path, command, value, words):
    err = _fails_with_one_line(capsys, [command, str(tmp_path / "missing"), "--speculative-config", value],
                               "--speculative-config", words)
    assert "missing" not in err  # the model was never looked for


def test_a_drafter_that_does_not_exist_is_one_line_before_the_model_loads(capsys, tmp_path):
    config = '{"method": "dflash", "model": "/nonexistent/drafter"}'
    err = _fails_with_one_line(capsys, ["chat", str(tmp_path / "missing"), "--speculative-config", config],
                               "speculative_config.model='/nonexistent/drafter' does not exist")
    assert "missing" not in err  # the model was never looked for


@pytest.mark.parametrize("url", ["notaurl", "127.0.0.1:8000", "ftp://127.0.0.1", "http://", "http://[::1",
                                 "http://127.0.0.1:99999"])
def test_a_url_that_is_not_an_http_server_address_is_one_line(capsys, url):
    _fails_with_one_line(capsys, ["chat", "--url", url], "--url", repr(url), "http://127.0.0.1:8000")


@pytest.mark.parametrize("url", ["", "  "])
def test_an_empty_url_is_refused_not_taken_for_an_in_process_chat(capsys, tmp_path, url):
    """`--url "$SERVER"` with SERVER unset read as no --url: the chat loaded the model in-process (the embedded one,
    with no MODEL) and talked to it, not to the server meant."""
    err = _fails_with_one_line(capsys, ["chat", str(tmp_path / "missing"), "--url", url], "--url is empty",
                               "http://127.0.0.1:8000", "leave --url out to load the model in-process")
    assert "missing" not in err  # no model was looked for


@pytest.mark.parametrize("key", ["", "  "])
def test_an_empty_api_key_is_refused_not_replaced_by_the_environments(capsys, monkeypatch, key):
    """`--api-key "$KEY"` with KEY unset sent $GLIMMER_API_KEY instead, a key the user did not name; the openai client
    takes an environment's key only where none is passed (None), and refuses an empty one."""
    monkeypatch.setenv("GLIMMER_API_KEY", "from-the-environment")
    _fails_with_one_line(capsys, ["chat", "--url", "http://127.0.0.1:9", "--api-key", key], "--api-key is empty",
                         "leave --api-key out to send $GLIMMER_API_KEY")


@pytest.mark.parametrize(("option", "value"), [("--max-tokens", "-5"), ("--max-tokens", "0"),
                                               ("--max-tokens", str(2**31)), ("--temperature", "-1"),
                                               ("--temperature", "nan"), ("--temperature", "inf"),
                                               ("--reasoning-effort", "ultra")])
def test_chat_options_the_server_would_refuse_are_one_line_before_the_model_loads(capsys, tmp_path, option, value):
    # the model does not exist: the options are checked first, so nothing loads and no message is sent
    _fails_with_one_line(capsys, ["chat", str(tmp_path / "missing"), option, value], option)


def test_a_reasoning_effort_not_taken_is_named_as_typed(capsys, tmp_path):
    """It read `--reasoning-effort='ultra' is not supported`, a Python spelling of the flag."""
    err = _fails_with_one_line(capsys, ["chat", str(tmp_path / "missing"), "--reasoning-effort", "ultra"],
                               "--reasoning-effort ultra is not supported", "none, minimal, low, medium, high, xhigh")
    assert "=" not in err


def test_chat_options_the_server_takes_pass_the_checks():
    from glimmer.cli import _chat_request_options

    args = build_parser().parse_args(["chat", "--max-tokens", "1", "--temperature", "0", "--reasoning-effort", "HIGH"])
    assert _chat_request_options(args) == {"max_tokens": 1, "temperature": 0.0, "reasoning_effort": "HIGH"}
    assert _chat_request_options(build_parser().parse_args(["chat"])) == {}


def _typed(lines: list[str]):
    """An `input` that reads `lines`, then raises EOFError as at the end of a pipe (or Ctrl-D)."""
    rest = iter(lines)

    def read_line(prompt: str) -> str:
        line = next(rest, None)
        if line is None:
            raise EOFError
        return line

    return read_line


@pytest.fixture
def chat_in_process(capsys, monkeypatch, tiny_checkpoint):
    """chat(args, lines) runs `glimmer chat TINY ARGS` in this process, typing `lines` at a terminal and then /exit
    (piped: `lines` read from a pipe, then its end; `stdin`: these bytes piped in; `default_model`: no MODEL, the
    embedded demo model): (exit code, stdout, stderr). The loggers the chat quiets get their levels back afterwards."""
    from glimmer.cli import main

    quieted = [logging.getLogger(), logging.getLogger("glimmer.protocol")]
    levels = [logger.level for logger in quieted]

    def chat(args: list[str], lines: list[str] = (), *, piped: bool = False, stdin: bytes | None = None,
             default_model: bool = False) -> tuple[int, str, str]:
        if stdin is None:
            monkeypatch.setattr("builtins.input", _typed([*lines] if piped else [*lines, "/exit"]))
            monkeypatch.setattr(sys.stdin, "isatty", lambda: not piped)
        else:  # `stdin` piped in, read by input() as a UTF-8 locale's stdin reads it: strictly
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8", errors="strict"))
        model = [] if default_model else [str(tiny_checkpoint)]
        code = main(["chat", *model, "--kv-cache-memory", "50MiB", "--no-color", *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    yield chat
    for logger, level in zip(quieted, levels, strict=True):
        logger.setLevel(level)


@pytest.mark.parametrize(("args", "words"), [
    (["--max-tokens", "5000"], ["--max-tokens 5000 would make every message fail", "maximum context length is ",
                                "give --max-tokens "]),
    (["--max-model-len", "8"], ["--max-model-len 8 would make every message fail", "characters",
                                "give a larger --max-model-len"]),
    (["--max-model-len", "100"], ["--max-model-len 100 would make every message fail",
                                  "maximum context length is 100 tokens", "give a larger --max-model-len"]),
    (["--max-model-len", "200", "--max-tokens", "100"], ["--max-tokens 100 would make every message fail",
                                                         "or less, or a larger --max-model-len"]),
    (["--max-model-len", "200", "--system", "word " * 100], ["--max-model-len 200", "with the --system prompt",
                                                             "give a larger --max-model-len or a shorter --system"]),
])
def test_in_process_chat_limits_that_refuse_every_message_are_one_line_before_the_first(chat_in_process, args, words):
    """Every turn's prompt holds the chat template (and the --system prompt) before the typed text: a context that
    leaves no reply room even then, or less than --max-tokens, would answer each message with an error."""
    code, out, err = chat_in_process(args, ["Hello"])
    last = err.strip().splitlines()[-1]  # after the weights' progress bar
    assert code == 2 and out == "" and "Traceback" not in err
    assert last.startswith("glimmer: error: ")
    for word in words:
        assert word in last


def _chat_with_empty_stdin(checkpoint: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """`glimmer ARGV CHECKPOINT` (a chat) in a process of its own, whose logging nothing in this one has set up."""
    return subprocess.run([sys.executable, "-m", "glimmer.cli", *argv, str(checkpoint), "--max-tokens", "1",
                           "--kv-cache-memory", "50MiB"], input="", capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def chat_without_log_level(tiny_checkpoint) -> subprocess.CompletedProcess:
    """`glimmer chat TINY` without --log-level, run once for the module: each --log-level case compares with it."""
    return _chat_with_empty_stdin(tiny_checkpoint, ["chat"])


@pytest.mark.parametrize("argv", [["--log-level", "INFO", "chat"], ["chat", "--log-level", "DEBUG"]])
def test_an_in_process_chat_logs_at_the_log_level_given(tiny_checkpoint, chat_without_log_level, argv):
    """The chat quieted the logs to WARNING whatever --log-level said: `--log-level DEBUG` printed nothing."""
    quiet, logged = chat_without_log_level, _chat_with_empty_stdin(tiny_checkpoint, argv)
    assert quiet.returncode == logged.returncode == 0, logged.stderr
    assert "INFO glimmer.engine.llm_engine: engine ready" in logged.stderr
    assert "INFO" not in quiet.stderr and "DEBUG" not in quiet.stderr  # not given: the chat's own WARNING


def test_in_process_chat_limits_that_leave_a_reply_room_are_taken(chat_in_process):
    code, out, _ = chat_in_process(["--max-model-len", "200", "--max-tokens", "8"], ["Hello"])
    assert code == 0 and "error" not in out


def test_in_process_chat_errors_speak_of_no_server(chat_in_process):
    """In-process there is no server the user started: a refused message is the engine's reason alone."""
    code, out, _ = chat_in_process(["--max-model-len", "200", "--max-tokens", "8"], ["word " * 80])
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2
    assert lines[1].startswith("error: This model's maximum context length is 200 tokens (max_model_len), but the "
                               "prompt has ")
    assert lines[1].endswith(" tokens; shorten the messages")


def test_a_piped_chat_whose_messages_failed_exits_1_with_the_errors_on_stderr(chat_in_process):
    """`echo ... | glimmer chat` exited 0 with its messages refused, and the errors among the replies on stdout: a
    script could not tell. The other messages are still answered; the end of the pipe then exits 1."""
    code, out, err = chat_in_process(["--max-model-len", "200", "--max-tokens", "4"], ["word " * 80, "Hello"],
                                     piped=True)
    assert code == 1 and "error:" not in out and out.endswith("[stopped at max_tokens]\n\n")  # Hello's answer
    errors = err.strip().splitlines()[-2:]
    assert errors[0].startswith("error: This model's maximum context length is 200 tokens")
    assert errors[1] == "glimmer chat: 1 message failed (errors above)"


def test_a_piped_chat_whose_messages_were_all_answered_exits_0(chat_in_process):
    code, out, err = chat_in_process(["--max-tokens", "4"], ["Hello", "Hi"], piped=True)
    assert code == 0 and "error:" not in out + err and "failed" not in err


def test_piped_bytes_that_are_not_utf8_are_sent_as_replacement_characters_under_a_utf8_locale(chat_in_process):
    """A UTF-8 locale's stdin (en_US.UTF-8) decodes strictly, where the C locale's and UTF-8 mode's take any byte:
    `printf 'caf\\xe9\\n' | glimmer chat` ended in a UnicodeDecodeError traceback, exit 1, no message answered."""
    code, out, err = chat_in_process(["--max-tokens", "4"], stdin=b"caf\xe9\nHello\n")
    assert code == 0 and "Traceback" not in err and "error" not in out + err
    assert out.count("[stopped at max_tokens]") == 2  # both lines answered


@pytest.mark.parametrize(("stream", "line"), [
    ("stdin", "stdin is closed; the chat reads its messages from stdin: run it at a terminal, or pipe the messages in"),
    ("stdout", "stdout is closed; the chat writes its replies to stdout: run it at a terminal, or send stdout to a "
               "file")])
def test_a_chat_started_with_stdin_or_stdout_closed_is_one_line_before_the_model_loads(capsys, monkeypatch,
                                                                                      tiny_checkpoint, stream, line):
    """Started with it closed (`<&-`, `>&-`, as a daemonizer or a job runner may start it), Python has no such stream:
    the model loaded, then input() raised `RuntimeError: input(): lost sys.stdin`, or sys.stdout.isatty() an
    AttributeError, a traceback, exit 1."""
    from glimmer.cli import main

    monkeypatch.setattr(sys, stream, None)
    monkeypatch.setattr("glimmer.cli._engine_from_args", lambda args: pytest.fail("the model was loaded"))
    assert main(["chat", str(tiny_checkpoint)]) == 2
    assert capsys.readouterr().err == f"glimmer: error: {line}\n"


def test_a_piped_chat_with_a_url_exits_1_where_a_message_failed(capsys, monkeypatch, tiny_checkpoint):
    """As in-process: the server refusing a message exits 1 after the rest, the error on stderr."""
    from glimmer.cli import main

    monkeypatch.setattr("builtins.input", _typed(["word " * 3000, "Hello"]))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with live_server(tiny_checkpoint) as server:
        assert main(["chat", "--url", server.url, "--max-tokens", "4"]) == 1
    captured = capsys.readouterr()
    assert "error:" not in captured.out
    assert captured.err.startswith("error: the server answered HTTP 400: ")
    assert captured.err.endswith("glimmer chat: 1 message failed (errors above)\n")


def test_an_in_process_message_past_4_mib_is_refused_for_the_context_and_the_chat_goes_on(chat_in_process):
    """It was `error: cannot reach http://127.0.0.1:PORT: [Errno 104] Connection reset by peer`: the chat's own
    server dropped a body over the serving default of 4 MiB, and named a server the user never started."""
    code, out, _ = chat_in_process(["--max-model-len", "200", "--max-tokens", "4"], ["x" * (5 << 20), "Hello"])
    lines = out.splitlines()
    assert code == 0 and lines[1].startswith("error: This model's maximum context length is 200 tokens")
    assert "characters, more than that can hold" in lines[1]
    assert "error" not in "".join(lines[2:])  # the next message is answered


def test_an_unknown_command_in_the_chat_lists_the_commands_and_sends_nothing(chat_in_process):
    code, out, _ = chat_in_process(["--max-tokens", "4"], ["/foo bar"])
    assert code == 0
    assert out.splitlines()[1:] == ["unknown command /foo: the commands are /reset, /exit and /quit; start with // to "
                                    "send a message that begins with /"]


def test_make_tiny_into_a_path_under_a_file_is_one_line(capsys, tmp_path):
    (tmp_path / "afile").write_text("")
    _fails_with_one_line(capsys, ["make-tiny", str(tmp_path / "afile" / "sub")], "afile/sub", "Not a directory")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_make_tiny_into_a_path_that_cannot_be_created_is_one_line(capsys):
    _fails_with_one_line(capsys, ["make-tiny", "/proc/glimmer-tiny"], "/proc/glimmer-tiny", "No such file")


@pytest.mark.parametrize("seed", [str(2**64), "99999999999999999999999", "-1"])
def test_make_tiny_refuses_a_seed_out_of_range(capsys, tmp_path, seed):
    _fails_with_one_line(capsys, ["make-tiny", str(tmp_path / "t"), "--seed", seed], f"seed={seed}", "--seed")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("options", [["--shards", "0"], ["--shards", "-2"], ["--shards", "2", "--config-only"]])
def test_make_tiny_refuses_shard_counts_that_would_be_ignored(capsys, tmp_path, options):
    _fails_with_one_line(capsys, ["make-tiny", str(tmp_path / "t"), *options], "--shards")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("options", [["--config-only"], ["--preset", "30b"], ["--vision"], ["--shards", "2"],
                                     ["--preset", "30b", "--config-only"]])
def test_make_tiny_drafter_refuses_options_of_a_model_checkpoint(capsys, tmp_path, tiny_checkpoint, options):
    out = tmp_path / "drafter"
    err = _fails_with_one_line(capsys, ["make-tiny", str(out), "--drafter-for", str(tiny_checkpoint), *options],
                               "--drafter-for")
    assert all(option in err for option in options if option.startswith("--"))
    assert not out.exists()


def test_make_tiny_drafter_for_a_file_asks_for_a_checkpoint_directory(capsys, tmp_path):
    """QA: a GGUF target said "config.json: cannot be read as UTF-8 text ([Errno 20] Not a directory ...)"."""
    target = tmp_path / "m.gguf"
    target.write_bytes(b"GGUF")
    _fails_with_one_line(capsys, ["make-tiny", str(tmp_path / "drafter"), "--drafter-for", str(target)],
                         "--drafter-for needs the target's checkpoint directory", "GGUF targets are not supported")
    assert not (tmp_path / "drafter").exists()


@pytest.mark.parametrize(("layout", "target", "words"), [
    ("legacy", None, ["--layout legacy has no drafter", "give --layout canonical or native with --drafter-for"]),
    ("canonical", "missing", ["--drafter-for ", "missing: no such directory", "the target's checkpoint directory"])])
def test_make_tiny_drafter_refuses_a_layout_or_target_it_cannot_take_naming_the_flag(capsys, tmp_path, tiny_checkpoint,
                                                                                     layout, target, words):
    """They were `drafter layout='legacy' is not one of [...]` and `missing/config.json: not found; a checkpoint
    directory must contain config.json`: an argument the command line never takes, and no flag."""
    target_dir = tmp_path / target if target else tiny_checkpoint
    _fails_with_one_line(capsys, ["make-tiny", str(tmp_path / "drafter"), "--drafter-for", str(target_dir),
                                  "--layout", layout], *words)
    assert not (tmp_path / "drafter").exists()


def test_make_tiny_drafter_for_the_embedded_model_by_its_name(capsys, tmp_path, monkeypatch):
    """`--drafter-for glimmer-nano` was refused as "no such directory", though the name stands for the embedded model
    wherever a model path is taken."""
    from glimmer import LLM
    from glimmer.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["make-tiny", "drafter", "--drafter-for", DEFAULT_MODEL_NAME]) == 0
    assert f"DFlash drafter for {DEFAULT_MODEL_NAME} to drafter" in capsys.readouterr().out
    llm = LLM(DEFAULT_MODEL_NAME, progress=False,  # the drafter fits the target (refused with the numbers if not)
              speculative_config={"method": "dflash", "model": str(tmp_path / "drafter")})
    assert llm.engine.drafter.config.block_size == 16


def test_make_tiny_force_replaces_the_weights_of_an_earlier_checkpoint(capsys, tmp_path):
    from safetensors.torch import load_file

    from glimmer.cli import main
    from glimmer.engine.model_loader import load_model

    out = tmp_path / "st"
    assert main(["make-tiny", str(out), "--shards", "3"]) == 0
    (out / "notes.txt").write_text("keep me")
    assert main(["make-tiny", str(out), "--force", "--seed", "5"]) == 0
    assert sorted(p.name for p in out.glob("model*")) == ["model.safetensors"]
    assert (out / "notes.txt").read_text() == "keep me"
    loaded = load_model(out, progress=False).model.state_dict()
    written = load_file(out / "model.safetensors")
    assert all(torch.equal(loaded[name], tensor) for name, tensor in written.items())


@pytest.mark.parametrize(("flags", "words"), [
    (["--max-request-bytes", "0"], "--max-request-bytes 0 is too small"),  # it used to mean the default, silently
    (["--max-request-bytes", "100"], "--max-request-bytes 100 is too small"),
    (["--max-images-per-request", "-1"], "--max-images-per-request -1 is invalid"),
    (["--max-videos-per-request", "-2"], "--max-videos-per-request -2 is invalid"),
    (["--metrics-require-api-key"], "--metrics-require-api-key needs a key"),
    (["--served-model-name", "a", ""], "--served-model-name: a name is empty"),
    (["--api-key", ""], "--api-key is empty"),  # `--api-key "$KEY"` with KEY unset served with no key
    (["--api-key", "k", "--api-key", " "], "--api-key is empty"),
    (["--host", ""], "--host is empty")])  # `--host "$HOST"` with HOST unset listened on every interface
def test_server_options_are_refused_naming_the_flag_before_the_model_loads(tmp_path, capsys, flags, words,
                                                                           monkeypatch):
    """Refused at once in one line naming the flag typed (they named ServerSettings' field, `max_request_bytes=0`),
    not after loading a checkpoint (the path here does not even exist)."""
    monkeypatch.delenv("GLIMMER_API_KEY", raising=False)
    err = _fails_with_one_line(capsys, ["serve", str(tmp_path / "no-such-model"), "--port", str(free_port()), *flags],
                               words)
    assert "no-such-model" not in err


@pytest.mark.parametrize("flag", ["--served-model-name", "--allowed-origins", "--allowed-media-domains",
                                  "--allowed-methods", "--allowed-headers", "--api-key"])
def test_a_model_after_an_option_of_several_values_is_refused_naming_it(capsys, monkeypatch, tmp_path, flag):
    """`glimmer serve --served-model-name muse MODEL` took MODEL as a second name and served the default model, as
    'muse', without a word; after the other two options it was refused as a bad origin or host."""
    monkeypatch.setattr("glimmer.cli._engine_from_args", lambda args: pytest.fail(f"{args.model} was loaded"))
    (tmp_path / "model").mkdir()
    err = _fails_with_one_line(capsys, ["serve", "--port", str(free_port()), flag, "https://app.example.com",
                                        str(tmp_path / "model")],
                               f"{flag} took the model {tmp_path / 'model'} as one of its values",
                               f"put MODEL first: glimmer serve {tmp_path / 'model'} {flag} ...")
    assert "not a" not in err


def test_a_hub_model_after_the_api_keys_is_refused_naming_it(capsys, monkeypatch):
    """`--api-key` takes several keys, as vLLM's: `glimmer serve --api-key $KEY owner/name` would serve the default
    model behind two keys, one of them the model's id."""
    monkeypatch.setattr("glimmer.cli._engine_from_args", lambda args: pytest.fail(f"{args.model} was loaded"))
    _fails_with_one_line(capsys, ["serve", "--port", str(free_port()), "--api-key", "sk-1", "owner/name"],
                         "--api-key took the model owner/name as one of its values",
                         "put MODEL first: glimmer serve owner/name --api-key ...")


@pytest.mark.parametrize("model", ["glimmer-nano", "glimmer-nano-dflash"])
def test_the_embedded_model_after_the_api_keys_is_refused_naming_it(capsys, monkeypatch, model):
    """`glimmer serve --api-key $KEY glimmer-nano` served the default model, glimmer-nano, behind two keys, one of
    them the model's name, which anyone could then send."""
    monkeypatch.setattr("glimmer.cli._engine_from_args", lambda args: pytest.fail(f"{args.model} was loaded"))
    _fails_with_one_line(capsys, ["serve", "--port", str(free_port()), "--api-key", "sk-1", model],
                         f"--api-key took the model {model} as one of its values",
                         f"put MODEL first: glimmer serve {model} --api-key ...")


@pytest.mark.parametrize(("flags", "words"), [
    (["--served-model-name", ""], "--served-model-name: a name is empty"),
    (["--allowed-origins", ""], "--allowed-origins : not a web origin"),
    (["--allowed-media-domains", ""], "--allowed-media-domains '' is not a host name")])
def test_an_empty_last_value_with_no_model_is_refused_as_empty_not_as_the_model(capsys, monkeypatch, flags, words):
    """`--served-model-name "$NAME"` with NAME unset and no MODEL was refused as having taken "the model " (an empty
    path is the current directory, which exists), telling the user to put a model first that they never gave."""
    monkeypatch.setattr("glimmer.cli._engine_from_args", lambda args: pytest.fail("the model was loaded"))
    err = _fails_with_one_line(capsys, ["serve", "--port", str(free_port()), *flags], words)
    assert "took the model" not in err


@pytest.mark.parametrize("origin", ["notaurl", "app.example.com", "https://app.example.com/", "https://app.example.com/x",
                                    "http://", "http://host:99999"])
def test_an_origin_no_browser_sends_is_one_line_before_the_model_loads(capsys, tmp_path, origin):
    """Audit: `--allowed-origins notaurl` was accepted, and CORS then never matched."""
    err = _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(free_port()),
                                        "--allowed-origins", "*", origin], f"--allowed-origins {origin}",
                               "https://app.example.com")
    assert "missing" not in err  # the model was never looked for


def test_origins_that_browsers_send_are_accepted():
    from glimmer.cli import _is_origin

    assert all(map(_is_origin, ["*", "https://app.example.com", "http://127.0.0.1:8000", "http://[::1]:3000"]))


def test_a_media_directory_that_does_not_exist_is_one_line_before_the_model_loads(capsys, tmp_path):
    """Audit: `--allowed-local-media-path /nonexistent` was accepted, and every local file was then refused."""
    (tmp_path / "media").mkdir()
    (tmp_path / "file.png").write_bytes(b"")
    for directory in (tmp_path / "nonexistent", tmp_path / "file.png"):
        err = _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(free_port()),
                                            "--allowed-local-media-path", str(tmp_path / "media"),
                                            "--allowed-local-media-path", str(directory)],
                                   f"--allowed-local-media-path {directory}", "no such directory")
        assert "missing" not in err


def test_an_empty_media_directory_is_refused_not_read_as_the_working_directory(capsys, tmp_path):
    """`--allowed-local-media-path "$MEDIA_DIR"` with MEDIA_DIR unset gave "", which Path reads as the current
    directory: every image under the server's working directory (all of them, for a service started in /) could be
    read by any request."""
    for blank in ("", "  "):
        err = _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(free_port()),
                                            "--allowed-local-media-path", blank],
                                   f"--allowed-local-media-path {blank!r} is blank", "names no directory meant")
        assert "missing" not in err


@pytest.mark.parametrize("command", [["serve"], ["run-batch", "-i", "in.jsonl", "-o", "out.jsonl"]])
@pytest.mark.parametrize("name", ["http://x", "x:80", "images.internal/path"])
def test_a_media_domain_that_is_no_host_name_is_refused_as_the_other_flags_are(capsys, command, name):
    """It read "glimmer: error: ConfigError: allowed media domain 'http://x' ...", naming the policy's field in the
    engine's words where every other flag's error names the flag as typed."""
    err = _fails_with_one_line(capsys, [*command, "/no/such/model", "--allowed-media-domains", "images.internal",
                                        name], f"--allowed-media-domains {name} is not a host name",
                               "without scheme, port or path")
    assert "ConfigError" not in err


def test_chat_max_tokens_help_says_what_it_bounds_and_whose_default_it_is():
    """It said "most tokens per reply (default: the model's generation_config max_new_tokens ...)": with --url the
    server's default holds, with --generation-config vllm the context's end, and the reasoning counts."""
    chat = dict(_subcommands())["chat"]
    help_text = next(action.help for action in chat._actions if "--max-tokens" in action.option_strings)
    assert "reasoning included" in help_text and "--url, the server's default" in help_text
    assert "--generation-config vllm" in help_text


def test_chat_limit_mm_per_prompt_help_says_it_is_refused_with_a_url():
    """It said "(with --url they are the server's)", read as the flag being passed on to the server; with --url it is
    refused ("--limit-mm-per-prompt would be ignored"), as the README says."""
    chat = dict(_subcommands())["chat"]
    help_text = next(action.help for action in chat._actions if "--limit-mm-per-prompt" in action.option_strings)
    assert "refused with --url" in help_text and "they are the server's" not in help_text


def test_help_gives_the_defaults_users_ask_for():
    """Audit: these options' help left out their defaults; the template option cited an internal requirement id."""
    parser = dict(_subcommands())["serve"]
    helps = {action.option_strings[0]: action.help % {"default": action.default}
             for action in parser._actions if action.option_strings}
    assert "1024" in helps["--max-waiting-requests"]
    assert "256 on CUDA" in helps["--max-num-seqs"] and "64 on the CPU" in helps["--max-num-seqs"]
    assert "8192" in helps["--max-num-batched-tokens"] and "2048" in helps["--max-num-batched-tokens"]
    for option in ("--max-image-pixels", "--max-image-side", "--max-image-aspect-ratio", "--max-video-frame-pixels",
                   "--max-video-frames", "--max-images-per-request", "--max-videos-per-request"):
        assert "default" in helps[option], option
    assert "P-TMPL" not in helps["--chat-template"]
    # it said "a fraction of free device memory", which the CPU's default is not
    assert "2 GiB at most" in helps["--kv-cache-memory"] and "--gpu-memory-utilization" in helps["--kv-cache-memory"]


@pytest.mark.parametrize(("name", "parser"), _subcommands(), ids=lambda value: value if isinstance(value, str) else "")
def test_the_readme_names_every_option(name, parser):
    """`--host`, `--default-reasoning-strength` and chat's `--system`, `--temperature`, ... were only in --help."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    options = [option for action in parser._actions for option in action.option_strings
               if option.startswith("--") and option != "--help"]
    assert [option for option in options if option not in readme] == []


@pytest.mark.parametrize("command", ["serve", "chat"])
def test_vllms_model_option_names_the_model(capsys, tmp_path, command):
    """`vllm serve --model NAME` (vLLM takes it, deprecated, beside the positional MODEL) was refused as an
    unrecognized argument."""
    _fails_with_one_line(capsys, [command, "--model", str(tmp_path / "missing"), "--port", str(free_port())]
                         if command == "serve" else [command, "--model", str(tmp_path / "missing")],
                         "CheckpointError", f"{tmp_path / 'missing'}")


def test_model_and_a_different_model_option_are_refused(capsys, tmp_path):
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "a"), "--model", str(tmp_path / "b")],
                         f"MODEL {tmp_path / 'a'} and --model {tmp_path / 'b'} name two models")


def test_the_model_option_beside_url_is_refused_by_its_name(capsys, tmp_path):
    err = _fails_with_one_line(capsys, ["chat", "--url", "http://127.0.0.1:9", "--model", str(tmp_path)],
                               "--model would be ignored")
    assert "MODEL," not in err


@pytest.mark.parametrize(("flags", "env", "key"), [
    ([], {"VLLM_API_KEY": "vllm-key"}, "vllm-key"),  # a vLLM deployment's key left the server open
    ([], {"GLIMMER_API_KEY": "glimmer-key", "VLLM_API_KEY": "vllm-key"}, "glimmer-key"),
    (["--api-key", "flag-key"], {"GLIMMER_API_KEY": "glimmer-key", "VLLM_API_KEY": "vllm-key"}, ("flag-key",)),
    # vLLM's several keys, any one of which lets a client in: only the last was kept (and `--api-key a b MODEL` took
    # b as the MODEL)
    (["--api-key", "a", "b", "--api-key", "c"], {"GLIMMER_API_KEY": "glimmer-key"}, ("a", "b", "c")),
    ([], {"VLLM_API_KEY": ""}, None)])
def test_serve_requires_vllms_api_key_from_the_environment(monkeypatch, flags, env, key):
    from glimmer.cli import _serve_api_key, build_parser

    for name in ("GLIMMER_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _serve_api_key(build_parser().parse_args(["serve", *flags])) == key


@pytest.mark.parametrize(("env", "named"), [({"GLIMMER_API_KEY": " \n"}, "GLIMMER_API_KEY"),
                                           ({"GLIMMER_API_KEY": "", "VLLM_API_KEY": "\n"}, "VLLM_API_KEY")])
def test_serve_refuses_a_blank_api_key_variable_naming_it(capsys, monkeypatch, tmp_path, env, named):
    """A key variable holding only whitespace (a secret file with its newline alone) was refused after the model loaded,
    as "ConfigError: api_key must not be empty", naming no option the user gave nor the variable."""
    for name in ("GLIMMER_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = _fails_with_one_line(capsys, ["serve", str(tmp_path / "no-such-model"), "--port", str(free_port())],
                               f"${named} is blank (whitespace only)", "unset it to serve without one")
    assert "no-such-model" not in err


@pytest.mark.parametrize(("flags", "env", "named"), [(["--api-key", "sk-ok", "sk-\x01secret"], {}, "--api-key"),
                                                    ([], {"GLIMMER_API_KEY": "sk-\x1bsecret\n"}, "$GLIMMER_API_KEY")])
def test_serve_refuses_a_key_no_client_can_send_naming_where_it_came_from(capsys, monkeypatch, tmp_path, flags, env,
                                                                         named):
    """A key holding a control character, which no header carries, would make every request 401 'incorrect API
    key'. It is refused before the model loads, unquoted."""
    for name in ("GLIMMER_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = _fails_with_one_line(capsys, ["serve", str(tmp_path / "no-such-model"), "--port", str(free_port()), *flags],
                               f"{named} holds a control character")
    assert "no-such-model" not in err and "secret" not in err


def test_serve_takes_a_key_outside_ascii_saying_the_openai_sdk_cannot_send_it(capsys, monkeypatch, tmp_path, caplog):
    """curl, browsers and `requests` send such a key (check_api_key reads UTF-8 and Latin-1); the openai SDK sends
    ASCII header values alone, which the operator is told at start, the key unquoted."""
    for name in ("GLIMMER_API_KEY", "VLLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level(logging.WARNING, logger="glimmer.cli"):
        err = _fails_with_one_line(capsys, ["serve", str(tmp_path / "no-such-model"), "--port", str(free_port()),
                                            "--api-key", "clé"], "no-such-model")
    assert "clé" not in err and "control character" not in err
    warned = [record.getMessage() for record in caplog.records if record.name == "glimmer.cli"]
    assert warned == ["--api-key: an API key holds a character outside ASCII: curl (UTF-8) and browsers or `requests` "
                      "(Latin-1, up to U+00FF) can send it, the openai SDK cannot (it sends ASCII header values "
                      "alone)"]


def test_metrics_require_api_key_takes_vllms_api_key_from_the_environment(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("GLIMMER_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "vllm-key")
    err = _fails_with_one_line(capsys, ["serve", str(tmp_path / "no-such-model"), "--port", str(free_port()),
                                        "--metrics-require-api-key"], "no-such-model")
    assert "--metrics-require-api-key" not in err


# A shutdown signal raised on the event loop's thread while it holds the lock of `lock_site`: uvicorn runs its
# handler there (signal.signal), between any two bytecodes of the code it interrupts
_SIGNAL_WHILE_QUEUEING = """\
import queue, signal, sys, glimmer.cli
from glimmer.engine.async_engine import AsyncEngine

class SignalledQueue(queue.Queue):
    def put(self, item, *args, **kwargs):
        if item[0] == sys.argv[1]:  # in generate() this runs inside _death_lock, and either way in put's mutex
            with self.mutex:
                signal.raise_signal(int(sys.argv[2]))
        super().put(item, *args, **kwargs)

start = AsyncEngine.__init__
def patched(self, *args, **kwargs):
    start(self, *args, **kwargs)
    self._commands = SignalledQueue()
AsyncEngine.__init__ = patched
sys.exit(glimmer.cli.main(sys.argv[3:]))
"""


@pytest.mark.parametrize("shutdown_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", ["add", "abort"])
def test_a_shutdown_signal_while_a_request_is_queued_stops_the_server(tiny_checkpoint, shutdown_signal, command):
    """uvicorn's handler stopped the engine's requests at once, taking the locks of the engine's command queue: a
    signal arriving as the event loop queued a request (or its abort) held them, and the process waited on itself
    forever, alive and no longer serving, until killed."""
    server = ServeProcess(["-c", _SIGNAL_WHILE_QUEUEING, command, str(int(shutdown_signal)), "serve",
                           str(tiny_checkpoint), "--kv-cache-memory", "32MiB", "--served-model-name", "tiny"])
    try:
        url = server.wait_until_serving()
        body = {"model": "tiny", "prompt": "go", "max_tokens": 1900, "ignore_eos": True, "stream": True}
        with contextlib.suppress(httpx.HTTPError), httpx.stream(
                "POST", f"{url}/v1/completions", json=body, timeout=30) as stream:
            lines = stream.iter_lines()
            for _ in range(3):  # a stream's first lines, then the client leaves: the request is aborted
                next(lines, None)
        server.process.wait(timeout=30)  # the signal the script sends stops it
    finally:
        output = server.stop(signal.SIGKILL)
    assert server.process.returncode == 0, output
    assert "Finished server process" in output and "Traceback" not in output
