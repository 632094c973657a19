"""`glimmer inspect` refuses what loading refuses: tokenizer, generation config, and weights of two checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file

from glimmer.cli import main
from glimmer.engine.model_loader import load_model
from glimmer.errors import CheckpointError


def _breakages():
    def no_tokenizer(path):
        (path / "tokenizer.json").unlink()

    def corrupt_tokenizer(path):
        (path / "tokenizer.json").write_text("{not json")

    def hot_temperature(path):
        (path / "generation_config.json").write_text(json.dumps({"temperature": "hot"}))

    def list_generation_config(path):
        (path / "generation_config.json").write_text("[1, 2]")

    return [(no_tokenizer, "CheckpointError", "tokenizer.json not found"),
            (corrupt_tokenizer, "CheckpointError", "not a valid tokenizers file"),
            (hot_temperature, "ConfigError", "temperature='hot'"),
            (list_generation_config, "ConfigError", "must hold a JSON object")]


@pytest.mark.parametrize(("breakage", "error", "words"), _breakages(), ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_inspect_refuses_a_tokenizer_or_generation_config_that_loading_refuses(
        tiny_checkpoint, tmp_path, capsys, breakage, error, words, as_json):
    checkpoint = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, checkpoint)
    breakage(checkpoint)
    assert main(["inspect", str(checkpoint), *(["--json"] if as_json else [])]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1].startswith(f"glimmer: error: {error}: ")
    assert words in captured.err and "Traceback" not in captured.err
    assert "warnings: none" not in captured.out and captured.out == ""


def test_inspect_of_a_sound_checkpoint_reports_no_warnings(tiny_checkpoint, capsys):
    assert main(["inspect", str(tiny_checkpoint)]) == 0
    assert "warnings: none" in capsys.readouterr().out


def test_a_single_file_beside_an_index_of_other_shards_is_refused(make_tiny, tmp_path, capsys):
    """Two checkpoints' weights in one directory (one written over the other): reading either set could silently
    be the wrong model, so loading and inspect both refuse and say which files to remove."""
    checkpoint = tmp_path / "both"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), checkpoint)
    shutil.copy(make_tiny("canonical", seed=3) / "model.safetensors", checkpoint)
    with pytest.raises(CheckpointError, match="holds both model.safetensors and model.safetensors.index.json"):
        load_model(checkpoint, progress=False)
    assert main(["inspect", str(checkpoint)]) == 2
    assert "remove the stale ones" in capsys.readouterr().err


def test_an_index_that_names_the_single_file_is_one_checkpoint(make_tiny, tmp_path):
    checkpoint = tmp_path / "indexed-single"
    shutil.copytree(make_tiny("canonical", seed=7), checkpoint)
    tensors = load_file(checkpoint / "model.safetensors")
    weight_map = dict.fromkeys(tensors, "model.safetensors")
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert load_model(checkpoint, progress=False).config.text.num_hidden_layers == 8
