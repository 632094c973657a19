"""A checkpoint's side file that is a broken symbolic link (a Hugging Face cache whose blob is gone) is refused naming
the link and its target, never taken as a file the checkpoint does without (broken_links.py)."""

from __future__ import annotations

import re
import shutil

import pytest

from glimmer.cli import main


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                  "special_tokens_map.json"])
def test_a_side_file_that_is_a_broken_link_is_refused_naming_its_target(tiny_checkpoint, tmp_path, capsys, name):
    """QA: a broken generation_config.json was "not found" (stop ids and sampling defaults from config.json instead),
    a broken tokenizer_config.json or special_tokens_map.json passed over, config.json and tokenizer.json "not
    found"."""
    checkpoint = tmp_path / "snapshot"
    shutil.copytree(tiny_checkpoint, checkpoint)
    (checkpoint / name).unlink()
    (checkpoint / name).symlink_to("../../blobs/0123abcd")
    assert main(["inspect", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert f"{checkpoint / name} is a symbolic link to ../../blobs/0123abcd, a file that does not exist" in err
    assert "download the checkpoint again" in err


@pytest.mark.parametrize(("name", "loop"), [
    ("model.safetensors", ["model.safetensors"]),  # a link to itself
    ("model.safetensors", ["other.bin", "model.safetensors"]),  # two links pointing at each other
    ("config.json", ["config.json"]),
])
def test_a_file_that_is_a_loop_of_links_is_refused_as_a_loop_not_a_missing_download(tiny_checkpoint, tmp_path, capsys,
                                                                                     name, loop):
    """It was "a symbolic link to model.safetensors, a file that does not exist (a Hugging Face cache whose blob was
    deleted, or a download cut short)", though the link's target is there: a link leading back to it."""
    checkpoint = tmp_path / "snapshot"
    shutil.copytree(tiny_checkpoint, checkpoint)
    (checkpoint / name).unlink()
    (checkpoint / name).symlink_to(loop[0])
    for link, target in zip(loop, loop[1:], strict=False):
        (checkpoint / link).symlink_to(target)
    assert main(["--log-level", "ERROR", "inspect", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert str(checkpoint / name) in err, err
    assert f"is a symbolic link to {loop[0]}, which leads into a loop of symbolic links" in err, err
    assert "does not exist" not in err and "\n" not in err.strip()


def test_a_chat_template_that_is_a_broken_link_is_not_replaced_by_another(tiny_checkpoint, tmp_path, capsys):
    """QA: a broken chat_template.jinja fell through to tokenizer_config.json's template, rendering every prompt
    with another template; it is now the reason there is no template."""
    import json

    checkpoint = tmp_path / "snapshot"
    shutil.copytree(tiny_checkpoint, checkpoint)
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": "{{ 'other' }}"}))
    (checkpoint / "chat_template.jinja").unlink()
    (checkpoint / "chat_template.jinja").symlink_to(tmp_path / "gone.jinja")
    assert main(["inspect", str(checkpoint), "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any(f"chat_template.jinja is a symbolic link to {tmp_path}/gone.jinja" in w for w in warnings), warnings


def test_a_shard_index_that_is_a_broken_link_is_refused_naming_its_target(make_tiny, tmp_path, capsys):
    """QA: a broken model.safetensors.index.json was taken as absent and every *.safetensors file read without it (a
    stale model.safetensors beside the shards alone, with a warning)."""
    checkpoint = tmp_path / "snapshot"
    shutil.copytree(make_tiny(num_shards=2), checkpoint)
    (checkpoint / "model.safetensors.index.json").unlink()
    (checkpoint / "model.safetensors.index.json").symlink_to("../../blobs/0123abcd")
    assert main(["inspect", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert f"{checkpoint / 'model.safetensors.index.json'} is a symbolic link to ../../blobs/0123abcd" in err


def test_a_chat_template_file_that_is_a_directory_is_not_replaced_by_another(tiny_checkpoint, tmp_path, capsys):
    """QA: a directory named chat_template.jinja was passed over for tokenizer_config.json's template, as a broken
    link was, rendering every prompt with another template."""
    import json

    checkpoint = tmp_path / "snapshot"
    shutil.copytree(tiny_checkpoint, checkpoint)
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": "{{ 'other' }}"}))
    (checkpoint / "chat_template.jinja").unlink()
    (checkpoint / "chat_template.jinja").mkdir()
    assert main(["inspect", str(checkpoint), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chat_template"]["origin"] is None
    assert any(f"{checkpoint / 'chat_template.jinja'} is not a file" in w for w in report["warnings"]), report


def _lfs_pointer(path) -> None:
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 17209920\n")


@pytest.mark.parametrize("name", ["tokenizer.json", "pytorch_model.bin", "generation_config.json"])
def test_a_git_lfs_pointer_in_place_of_a_file_is_named_with_the_fix(tiny_checkpoint, tmp_path, capsys, name):
    """A repository cloned without git-lfs: tokenizer.json was "not a valid tokenizers file: expected value at line 1
    column 1", pytorch_model.bin "refused by torch.load(weights_only=True)" as if it ran code, a JSON file "not valid
    JSON" (safetensors and GGUF files already said what they were)."""
    checkpoint = tmp_path / "clone"
    shutil.copytree(tiny_checkpoint, checkpoint)
    if name == "pytorch_model.bin":
        (checkpoint / "model.safetensors").unlink()
    _lfs_pointer(checkpoint / name)
    assert main(["inspect", str(checkpoint), "--allow-pickle"]) == 2
    err = capsys.readouterr().err
    assert (f"{checkpoint / name} is a Git LFS pointer to a file of 17,209,920 bytes, which was never downloaded: "
            "fetch it with `git lfs pull` in its repository (or download the file with `hf download`)") in err, err


def test_a_git_lfs_pointer_in_place_of_a_shard_index_is_named_with_the_fix(make_tiny, tmp_path, capsys):
    """It was "not a valid index: Expecting value: line 1 column 1 (char 0)"."""
    index = "model.safetensors.index.json"
    checkpoint = tmp_path / "clone"
    shutil.copytree(make_tiny(num_shards=2), checkpoint)
    _lfs_pointer(checkpoint / index)
    assert main(["--log-level", "ERROR", "inspect", str(checkpoint), "--allow-pickle"]) == 2
    err = capsys.readouterr().err
    assert f"{checkpoint / index} is a Git LFS pointer to a file of 17,209,920 bytes, which was never downloaded" in err
    assert "Expecting value" not in err


def test_a_git_lfs_pointer_in_place_of_the_chat_template_is_named_with_the_fix(tiny_checkpoint, tmp_path, capsys):
    """Its text was taken for the template: refused as "fails its check: the chat template's generation prompt must be
    exactly '<|start|>assistant'; a probe prompt ends '...size 17209920'", blaming the template."""
    from glimmer import LLM
    from glimmer.errors import CheckpointError

    checkpoint = tmp_path / "clone"
    shutil.copytree(tiny_checkpoint, checkpoint)
    _lfs_pointer(checkpoint / "chat_template.jinja")
    pointer = f"{checkpoint / 'chat_template.jinja'} is a Git LFS pointer to a file of 17,209,920 bytes"
    with pytest.raises(CheckpointError, match=re.escape(pointer)):
        LLM(str(checkpoint), progress=False).chat([{"role": "user", "content": "hi"}])
    assert main(["--log-level", "ERROR", "inspect", str(checkpoint)]) == 0  # as any template serve cannot read
    out = capsys.readouterr().out
    assert pointer in out and "generation prompt" not in out

