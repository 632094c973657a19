"""`glimmer serve` and `glimmer chat` as a user runs them (subprocesses), and their options."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from glimmer.cli import build_parser
from glimmer.default_model import DEFAULT_MODEL_NAME


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    """An environment with an empty user cache: the embedded model is read in place, nothing is written."""
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path_factory.mktemp("xdg-cache"))}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_options_parse():
    args = build_parser().parse_args(["serve", "/models/glimmer", "--port", "9000", "--served-model-name", "a", "b",
                                      "--api-key", "k", "--max-model-len", "4096", "--max-num-seqs", "8",
                                      "--dtype", "bfloat16", "--device", "cpu", "--max-request-bytes", "2048"])
    assert (args.model, args.host, args.port, args.served_model_name, args.api_key) == (
        "/models/glimmer", "127.0.0.1", 9000, ["a", "b"], "k")
    assert (args.max_model_len, args.max_num_seqs, args.dtype, args.device, args.max_request_bytes) == (
        4096, 8, "bfloat16", "cpu", 2048)
    assert build_parser().parse_args(["serve"]).model is None


def test_serve_without_a_model_serves_the_default_and_says_so(cache_env):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "glimmer.cli", "serve", "--port", str(port),
                                "--max-model-len", "2048", "--kv-cache-memory", "50MiB", "--require-cache-salt"],
                               env=cache_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120  # imports alone can take a minute on a loaded machine
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert [m["id"] for m in models["data"]] == [DEFAULT_MODEL_NAME]
        unsalted = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        assert unsalted.status_code == 400 and unsalted.json()["error"]["param"] == "cache_salt"
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=30)[0]
    assert "embedded demo model glimmer-nano" in output
    assert f"http://127.0.0.1:{port}/v1" in output
    assert process.returncode == 0
    assert not any(Path(cache_env["XDG_CACHE_HOME"]).iterdir())


def test_chat_in_process_with_the_default_model(cache_env):
    result = subprocess.run([sys.executable, "-m", "glimmer.cli", "chat", "--max-tokens", "80", "--no-color",
                             "--max-model-len", "2048", "--kv-cache-memory", "50MiB"],
                            input="Hello!\n/exit\n", env=cache_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "embedded demo model glimmer-nano" in result.stdout
    assert "What can I do for you?" in result.stdout or "How can I help you today?" in result.stdout
    assert "error" not in result.stdout


def test_a_bad_model_is_one_clear_line_and_exit_code_2(cache_env, tmp_path):
    result = subprocess.run([sys.executable, "-m", "glimmer.cli", "serve", str(tmp_path / "missing")],
                            env=cache_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "glimmer: error: CheckpointError" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("text", "expected"), [("8GiB", 8 << 30), ("512MiB", 512 << 20), ("1.5gib", 3 << 29),
                                                ("1000", 1000), ("2GB", 2 * 10**9)])
def test_sizes_parse(text, expected):
    from glimmer.cli import parse_size

    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8 parsecs", "", "GiB", "-1GiB"])
def test_bad_sizes_are_refused(text):
    import argparse

    from glimmer.cli import parse_size

    with pytest.raises(argparse.ArgumentTypeError, match="is not a size"):
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


def test_a_missing_or_invalid_tools_file_is_one_line(capsys, tmp_path):
    _fails_with_one_line(capsys, ["chat", "--url", "http://127.0.0.1:9", "--tools", str(tmp_path / "missing.json")],
                         "missing.json", "No such file")
    (tmp_path / "bad.json").write_text("{not json")
    _fails_with_one_line(capsys, ["chat", "--tools", str(tmp_path / "bad.json")], "not valid JSON")
    (tmp_path / "nameless.json").write_text('[{"type": "function", "function": {}}]')
    _fails_with_one_line(capsys, ["chat", "--tools", str(tmp_path / "nameless.json")], "name")


def test_an_unreachable_url_is_one_line_and_a_failure(capsys):
    _fails_with_one_line(capsys, ["chat", "--url", f"http://127.0.0.1:{free_port()}"], "cannot reach")


def test_a_busy_port_is_reported_before_the_model_loads(capsys, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # the model does not exist either: the port is checked first
        _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(port)], f":{port}", "--port")


def test_make_tiny_refuses_a_non_empty_directory_without_force(capsys, tmp_path):
    from glimmer.cli import main

    (tmp_path / "notes.txt").write_text("keep me")
    _fails_with_one_line(capsys, ["make-tiny", str(tmp_path)], "not empty", "--force")
    assert main(["make-tiny", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "config.json").exists() and (tmp_path / "notes.txt").exists()


def test_a_missing_checkpoint_is_one_line(capsys, tmp_path):
    _fails_with_one_line(capsys, ["inspect", str(tmp_path / "missing")], "missing")
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(free_port())], "missing")


def test_a_kernel_switch_that_is_not_a_setting_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("GLIMMER_KERNELS", "fast")
    _fails_with_one_line(capsys, ["serve", str(tmp_path / "missing"), "--port", str(free_port())],
                         "GLIMMER_KERNELS='fast'", "'torch'")
