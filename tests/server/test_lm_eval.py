"""lm-evaluation-harness's `local-completions` model scores a local multiple-choice task through the server.

The harness runs as a user runs it (`python -m lm_eval run`), offline (HF offline variables, a local tokenizer
path, the task and its data shipped beside this file). Each choice's loglikelihood it reports must equal the
reference model's for the tokens the harness sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from oracle import reference_logits, reference_model
from server_support import live_server

pytest.importorskip("lm_eval")

TASK_DIR = Path(__file__).parent / "lm_eval_task"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _run_harness(base_url: str, tokenizer: Path, out: Path, cache: Path) -> subprocess.CompletedProcess:
    model_args = (f"model=tiny,base_url={base_url}/completions,tokenizer_backend=huggingface,tokenizer={tokenizer},"
                  "tokenized_requests=True,num_concurrent=1,max_retries=1")
    command = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
               "--tasks", "glimmer_tiny_choice", "--include_path", str(TASK_DIR), "--output_path", str(out),
               "--log_samples"]
    env = {**os.environ, **OFFLINE, "HF_DATASETS_CACHE": str(cache / "datasets"), "HF_HOME": str(cache / "hf")}
    return subprocess.run(command, env=env, cwd=TASK_DIR, capture_output=True, text=True, timeout=600)


def test_local_completions_scores_a_loglikelihood_task_with_the_models_numbers(make_tiny, tmp_path, monkeypatch):
    checkpoint = make_tiny()
    with live_server(checkpoint) as server:
        done = _run_harness(server.base_url, checkpoint, tmp_path / "out", tmp_path / "cache")
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert 0 <= results["results"]["glimmer_tiny_choice"]["acc,none"] <= 1
    samples = [json.loads(line) for line in next((tmp_path / "out").rglob("samples_*.jsonl")).read_text().splitlines()]
    assert len(samples) == 3

    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    harness = LocalCompletionsAPI(base_url="http://127.0.0.1:9/v1/completions", tokenizer=str(checkpoint),
                                  tokenizer_backend="huggingface", tokenized_requests=True)
    reference = reference_model(checkpoint)
    for sample in samples:
        for arguments, response in zip(sample["arguments"].values(), sample["resps"], strict=True):
            context, continuation = harness._encode_pair(arguments["arg_0"], arguments["arg_1"])
            logprobs = torch.log_softmax(reference_logits(reference, context + continuation), dim=-1)
            expected = sum(logprobs[len(context) - 1 + i, token].item() for i, token in enumerate(continuation))
            assert abs(float(response[0][0]) - expected) < 1e-3
