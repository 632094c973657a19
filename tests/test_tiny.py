"""The tiny checkpoint writer: a directory written again holds only the new checkpoint's weights."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from glimmer.checkpoint.drafter import NATIVE_FILE
from glimmer.engine.model_loader import load_model
from glimmer.errors import ConfigError
from glimmer.tiny import SEED_LIMIT, check_seed, remove_weight_files, write_tiny_checkpoint, write_tiny_drafter


def test_writing_over_a_sharded_checkpoint_leaves_only_the_new_weights(tmp_path):
    write_tiny_checkpoint(tmp_path, num_shards=3)
    write_tiny_checkpoint(tmp_path, seed=5)
    assert sorted(p.name for p in tmp_path.glob("model*")) == ["model.safetensors"]
    loaded = load_model(tmp_path, progress=False).model.state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in load_file(tmp_path / "model.safetensors").items())


def test_a_config_only_checkpoint_written_over_one_with_weights_has_none(tmp_path):
    write_tiny_checkpoint(tmp_path)
    write_tiny_checkpoint(tmp_path, config_only=True)
    assert not list(tmp_path.glob("*.safetensors"))


def test_a_canonical_drafter_written_over_a_native_one_drops_its_head_pt(tiny_checkpoint, tmp_path):
    write_tiny_drafter(tmp_path, tiny_checkpoint, layout="native")
    assert (tmp_path / NATIVE_FILE).is_file()
    write_tiny_drafter(tmp_path, tiny_checkpoint, layout="canonical")  # head.pt would be found first
    assert not (tmp_path / NATIVE_FILE).exists() and (tmp_path / "model.safetensors").is_file()


def test_only_weight_files_are_removed(tmp_path):
    for name in ("model.safetensors", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                 NATIVE_FILE, "notes.txt", "config.json", "weights.pt", "model.safetensors.index.json.bak"):
        (tmp_path / name).write_text("")
    (tmp_path / "dir.safetensors").mkdir()
    removed = remove_weight_files(tmp_path)
    assert sorted(p.name for p in removed) == sorted(["model.safetensors", "model-00001-of-00002.safetensors",
                                                      "model.safetensors.index.json", NATIVE_FILE])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "dir.safetensors",
                                                          "model.safetensors.index.json.bak", "notes.txt", "weights.pt"]


@pytest.mark.parametrize("seed", [-1, SEED_LIMIT, 10**23])
def test_a_seed_a_torch_generator_cannot_take_is_refused(seed):
    with pytest.raises(ConfigError, match=f"seed={seed} \\(--seed\\) is out of range"):
        check_seed(seed)
    torch.Generator().manual_seed(SEED_LIMIT - 1)  # the largest seed allowed is one torch takes
    check_seed(SEED_LIMIT - 1)


@pytest.mark.parametrize(("options", "words"), [({"num_shards": 0}, "at least 1"), ({"num_shards": -2}, "at least 1"),
                                                ({"num_shards": 2, "config_only": True}, "does not apply")])
def test_shard_counts_that_would_be_ignored_are_refused_before_writing(tmp_path, options, words):
    with pytest.raises(ConfigError, match=words):
        write_tiny_checkpoint(tmp_path / "t", **options)
    assert not (tmp_path / "t").exists()


def test_more_shards_than_tensors_are_refused_before_writing_anything(tmp_path, capsys):
    from glimmer.cli import main

    assert main(["make-tiny", str(tmp_path / "t"), "--shards", "1000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "num_shards=1000 (--shards) is more than the" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "t").exists()
    # over an earlier checkpoint, with --force: refused, and the earlier one is still whole
    earlier = write_tiny_checkpoint(tmp_path / "earlier")
    files = {p.name: p.read_bytes() for p in earlier.iterdir()}
    assert main(["make-tiny", str(earlier), "--force", "--shards", "1000"]) == 2
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == files


def test_every_shard_holds_a_tensor(tmp_path):
    # 99 tensors in 60 shards: a ceil-sized split (2 per shard) left the last ten shards empty
    out = write_tiny_checkpoint(tmp_path / "t", num_shards=60)
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) == 60 and all(load_file(shard) for shard in shards)
    load_model(out, progress=False)
