"""Resolving what the user typed as the model: a directory or a Hub id (no network in tests)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from glimmer.checkpoint.resolve import resolve_checkpoint
from glimmer.errors import CheckpointError


def test_existing_directory_is_used_as_is(tmp_path):
    assert resolve_checkpoint(tmp_path) == tmp_path


def test_a_file_is_refused_with_the_fix(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="pass the checkpoint directory"):
        resolve_checkpoint(file)


def test_offline_hub_id_fails_with_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(CheckpointError, match="could not be downloaded|could not download") as err:
        resolve_checkpoint("meta-models/Muse-Glimmer-30B")
    assert "meta-models/Muse-Glimmer-30B" in str(err.value)


def test_neither_path_nor_hub_id_is_refused():
    with pytest.raises(CheckpointError, match="neither an existing directory nor a Hugging Face Hub id"):
        resolve_checkpoint("/no/such/dir/../x y")


def test_a_model_path_that_is_a_broken_link_names_its_target(tmp_path):
    """QA: a .gguf link into a Hugging Face cache whose blob is gone was called "neither an existing directory nor a
    Hugging Face Hub id"."""
    link = tmp_path / "model.gguf"
    link.symlink_to("../blobs/0123abcd")
    with pytest.raises(CheckpointError, match=r"model path .*model\.gguf is a symbolic link to \.\./blobs/0123abcd, "
                                              r"a file that does not exist .*: download the checkpoint again"):
        resolve_checkpoint(link)


def _huggingface_hub_commands() -> set[str]:
    from importlib.metadata import distribution

    return {entry.name for entry in distribution("huggingface_hub").entry_points if entry.group == "console_scripts"}


def test_offline_hub_id_names_a_download_command_huggingface_hub_installs(monkeypatch, tmp_path):
    """QA: the message said `huggingface-cli download`, a command huggingface_hub 1.0 removed (`hf` replaced it)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint("meta-models/Muse-Glimmer-30B")
    command = re.search(r"`(\S+) download meta-models/Muse-Glimmer-30B`", str(err.value))
    assert command is not None, str(err.value)
    assert command.group(1) in _huggingface_hub_commands()


@pytest.mark.parametrize("argument", ["download_dir", "revision", "hf_token"])
def test_vllm_download_arguments_name_commands_huggingface_hub_installs(argument):
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS

    instead = VLLM_ONLY_LLM_ARGUMENTS[argument].instead
    commands = re.findall(r"\((\S+) (?:download|auth|login)", instead)
    assert commands, instead
    assert set(commands) <= _huggingface_hub_commands(), instead


def _serve_as_hub(monkeypatch, repo: Path, tmp_path: Path) -> list[dict]:
    """snapshot_download answers every Hub id from the files of `repo`, filtered by allow_patterns and
    ignore_patterns as the Hub client filters a repository's listing; returns the calls it received."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    calls: list[dict] = []

    def snapshot_download(repo_id, *, revision=None, allow_patterns=None, ignore_patterns=None, tqdm_class=None):
        calls.append({"allow_patterns": allow_patterns, "ignore_patterns": ignore_patterns})
        snapshot = tmp_path / "hub" / repo_id / "snapshot"
        names = [p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()]
        for name in filter_repo_objects(names, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns):
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(repo / name, snapshot / name)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_a_hub_repository_of_pickle_weights_loads_with_allow_pickle(monkeypatch, tmp_path, tiny_checkpoint,
                                                                    same_cpu_kernels):
    """With allow_pickle the download fetched the safetensors files alone: a repository of pytorch_model.bin was
    refused as having no weights ("pass --load-format dummy"), though the flag was given for it."""
    from gguf_export import canonical_state

    from glimmer import LLM, SamplingParams

    repo = tmp_path / "repo"
    shutil.copytree(tiny_checkpoint, repo, ignore=shutil.ignore_patterns("*.safetensors*"))
    torch.save(canonical_state(tiny_checkpoint), repo / "pytorch_model.bin")
    torch.save({"state": {}, "param_groups": []}, repo / "optimizer.pt")  # a Trainer's upload: never downloaded
    _serve_as_hub(monkeypatch, repo, tmp_path)
    greedy = SamplingParams(max_tokens=4, temperature=0)
    pickled = LLM("owner/pickled", allow_pickle=True, device="cpu").generate(["Hello"], greedy)
    assert not (tmp_path / "hub" / "owner" / "pickled" / "snapshot" / "optimizer.pt").exists()
    expected = LLM(str(tiny_checkpoint), device="cpu").generate(["Hello"], greedy)
    assert pickled[0].outputs[0].token_ids == expected[0].outputs[0].token_ids


def test_a_hub_pickle_fallback_downloads_no_intermediate_checkpoints(monkeypatch, tmp_path):
    """The training-state patterns were bare file names, which the Hub client matches against the whole path: a
    Trainer's upload had every `checkpoint-N/` folder (its weights, optimizer and RNG states) downloaded, though
    the loader reads the top-level weight files alone."""
    repo = tmp_path / "repo"
    (repo / "checkpoint-500").mkdir(parents=True)
    (repo / "config.json").write_text("{}")
    for name in ("pytorch_model.bin", "checkpoint-500/pytorch_model.bin", "checkpoint-500/optimizer.pt",
                 "checkpoint-500/rng_state.pth", "checkpoint-500/training_args.bin", "checkpoint-500/config.json"):
        (repo / name).write_bytes(b"pickled")
    _serve_as_hub(monkeypatch, repo, tmp_path)
    snapshot = resolve_checkpoint("owner/trained", allow_pickle=True)
    assert (snapshot / "pytorch_model.bin").is_file()
    assert not (snapshot / "checkpoint-500").exists()


def test_a_hub_download_fetches_nothing_below_the_top_level(monkeypatch, tmp_path, tiny_checkpoint):
    """`*.safetensors` (and `*.json`, `*.model`) is matched against the whole path: a Trainer's upload had every
    `checkpoint-N/` (and `last-checkpoint/`) folder's weights and trainer_state.json downloaded beside the model's,
    and a repository's original/tokenizer.model too, though the loaders read the top-level files alone. Neither a
    model's download, its config-only one nor inspect's fetches them; the model still loads and answers as from its
    directory."""
    from glimmer import LLM, SamplingParams
    from glimmer.checkpoint.resolve import inspected_checkpoint

    repo = tmp_path / "repo"
    shutil.copytree(tiny_checkpoint, repo)
    for folder in ("checkpoint-500", "last-checkpoint", "checkpoint-500/nested"):
        (repo / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_checkpoint / "model.safetensors", repo / folder / "model.safetensors")
        (repo / folder / "trainer_state.json").write_text("{}")
    (repo / "original").mkdir()
    (repo / "original" / "tokenizer.model").write_bytes(b"sentencepiece")
    _serve_as_hub(monkeypatch, repo, tmp_path)
    snapshot = resolve_checkpoint("owner/trained")
    assert (snapshot / "model.safetensors").is_file()
    for fetched in (snapshot, resolve_checkpoint("owner/config-only", weights=False)):
        assert (fetched / "config.json").is_file()
        assert [p.relative_to(fetched).as_posix() for p in fetched.rglob("*") if p.parent != fetched] == []
    with inspected_checkpoint("owner/trained") as (inspected, _):
        assert [p.relative_to(inspected).as_posix() for p in inspected.rglob("*") if p.parent != inspected] == []
    greedy = SamplingParams(max_tokens=4, temperature=0)
    got = LLM("owner/trained", device="cpu").generate(["Hello"], greedy)
    expected = LLM(str(tiny_checkpoint), device="cpu").generate(["Hello"], greedy)
    assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids


def test_a_hub_repository_with_safetensors_downloads_no_pickle_weights(monkeypatch, tmp_path, tiny_checkpoint):
    repo = tmp_path / "repo"
    shutil.copytree(tiny_checkpoint, repo)
    (repo / "pytorch_model.bin").write_bytes(b"a second copy of the weights")
    calls = _serve_as_hub(monkeypatch, repo, tmp_path)
    snapshot = resolve_checkpoint("owner/both", allow_pickle=True)
    assert (snapshot / "model.safetensors").is_file() and not (snapshot / "pytorch_model.bin").exists()
    assert len(calls) == 1


def test_a_download_its_caller_stopped_waiting_for_fetches_no_more_files(monkeypatch):
    """The Hub download runs in a thread its caller waits for, so that a signal's exception (Ctrl-C in a script
    loading `LLM("owner/name")`) leaves at once; the download then went on fetching every file of the snapshot behind
    its back, where run in the caller's thread the Hub client cancelled the files not yet started. Its bar of files
    now stops it as the files in progress end. (The caller's wait is interrupted as a signal's exception would: its
    `Future.result` raises KeyboardInterrupt once the first file is being fetched.)"""
    import threading
    from concurrent.futures import Future

    import huggingface_hub

    from glimmer.checkpoint import resolve

    fetching, caller_left = threading.Event(), threading.Event()
    fetched: list[int] = []
    outcome: list[BaseException] = []

    class InterruptedWait(Future):
        def result(self, timeout=None):
            assert fetching.wait(60)
            raise KeyboardInterrupt

    def snapshot_download(repo_id, *, revision=None, allow_patterns=None, ignore_patterns=None, tqdm_class=None):
        with tqdm_class(total=5, disable=True) as bar:  # as the Hub client counts files: one update as each ends
            try:
                for number in range(5):
                    fetched.append(number)
                    fetching.set()
                    assert caller_left.wait(60)
                    bar.update(1)
            except BaseException as error:
                outcome.append(error)
                raise
        return "/nonexistent"

    monkeypatch.setattr(resolve, "Future", InterruptedWait)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    try:
        with pytest.raises(KeyboardInterrupt):
            resolve_checkpoint("owner/name")
    finally:
        caller_left.set()
    for thread in threading.enumerate():
        if thread.name == "glimmer-hub-download":
            thread.join(60)
    assert fetched == [0], fetched
    assert [type(error).__name__ for error in outcome] == ["DownloadAbandoned"]
