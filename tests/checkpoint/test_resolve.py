"""Resolving what the user typed as the model: a directory or a Hub id (no network in tests)."""

from __future__ import annotations

import re

import pytest

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
