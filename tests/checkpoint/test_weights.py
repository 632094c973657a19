"""Strict weight loading across layouts (architecture.md §3, §5, §15.2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from oracle import reference_logits, reference_model
from safetensors.torch import load_file, save_file

from glimmer.checkpoint.weight_layouts import (
    detect_weight_layout,
    interleaved_to_rotate_half,
    rotate_half_to_interleaved,
)
from glimmer.engine.model_loader import load_model
from glimmer.errors import CheckpointError
from glimmer.model.context import ForwardContext
from glimmer.tiny import TinySpec

IDS = list(range(3, 60))


def _logits(path) -> torch.Tensor:
    model = load_model(path, progress=False).model
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(IDS), ForwardContext.without_cache([len(IDS)])))


@pytest.mark.parametrize("layout", ["legacy", "flat", "native"])
def test_every_layout_gives_the_canonical_logits(make_tiny, layout):
    expected = _logits(make_tiny("canonical", seed=7))
    assert torch.equal(_logits(make_tiny(layout, seed=7)), expected)


def test_sharded_checkpoint_with_index_loads_identically(make_tiny):
    assert torch.equal(_logits(make_tiny("canonical", seed=7, num_shards=3)), _logits(make_tiny("canonical", seed=7)))


def test_rope_permutation_follows_the_converter_formula():
    """HF row (c·d/2 + j) = native row (2j + c), per head (§5.4)."""
    heads, head_dim = 3, 8
    native = torch.arange(heads * head_dim, dtype=torch.float32)[:, None].repeat(1, 2)
    hf = interleaved_to_rotate_half(native, heads)
    for h in range(heads):
        for c in range(2):
            for j in range(head_dim // 2):
                assert hf[h * head_dim + c * head_dim // 2 + j, 0] == native[h * head_dim + 2 * j + c, 0]
    assert torch.equal(rotate_half_to_interleaved(hf, heads), native)
    bias = torch.arange(heads * head_dim, dtype=torch.float32)
    assert torch.equal(interleaved_to_rotate_half(bias, heads), hf[:, 0])


def test_legacy_post_attention_layernorm_is_the_pre_feedforward_norm(make_tiny):
    """Legacy names: post_attn_norm = post-attention, post_attention_layernorm = PRE-feedforward (§15.2)."""
    path = make_tiny("legacy", seed=7)
    files = load_file(path / "model.safetensors")
    layer = load_model(path, progress=False).model.model.language_model.layers[2]
    assert torch.equal(layer.pre_feedforward_layernorm.weight, files["model.layers.2.post_attention_layernorm.weight"])
    assert torch.equal(layer.post_attention_layernorm.weight, files["model.layers.2.post_attn_norm.weight"])
    assert torch.equal(layer.post_feedforward_layernorm.weight, files["model.layers.2.post_ffn_norm.weight"])


def _copy_checkpoint(src, dst, edit):
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_mismatches_are_all_listed_in_one_error(make_tiny, tmp_path):
    def damage(t):
        del t["model.language_model.layers.1.mlp.up_proj.weight"]
        t["model.language_model.layers.0.self_attn.extra.weight"] = torch.zeros(2, 2)
        t["model.language_model.layers.3.self_attn.k_proj.weight"] = torch.zeros(5, 64)

    path = _copy_checkpoint(make_tiny(), tmp_path / "bad", damage)
    with pytest.raises(CheckpointError) as err:
        load_model(path, progress=False)
    message = str(err.value)
    assert "missing tensors" in message and "model.language_model.layers.1.mlp.up_proj.weight" in message
    assert "shape [128, 64]" in message
    assert "unexpected tensors" in message and "model.language_model.layers.0.self_attn.extra.weight [2, 2]" in message
    assert "model.language_model.layers.3.self_attn.k_proj.weight: expected shape [32, 64], found [5, 64]" in message


def test_a_mismatch_error_leads_with_the_counts_lists_ten_names_a_kind_and_ends_with_the_fix(make_tiny, tmp_path):
    """QA: another model's weights were one list of every name (thousands of lines) without a fix."""
    def damage(t):
        for name in [n for n in t if n.startswith("model.language_model.layers.1.")]:
            t[name.replace("layers.1.", "blocks.1.")] = t.pop(name)
        t["model.language_model.layers.3.self_attn.k_proj.weight"] = torch.zeros(5, 64)

    path = _copy_checkpoint(make_tiny(), tmp_path / "other", damage)
    with pytest.raises(CheckpointError) as err:
        load_model(path, progress=False)
    lines = str(err.value).splitlines()
    assert lines[0] == (f"the weights in {path} (canonical layout) do not match the config: 12 missing, 12 unexpected, "
                        "1 of the wrong shape")
    assert lines[1:3] == ["  missing tensors (12):", "    model.language_model.layers.1.self_attn.q_proj.weight (for "
                          "model.language_model.layers.1.self_attn.q_proj.weight, shape [64, 64])"]
    assert lines[12:15] == ["    … and 2 more", "  unexpected tensors (12):",
                            "    model.language_model.blocks.1.input_layernorm.weight [64]"]
    assert lines[-3:-1] == ["  shape mismatches (1):", "    model.language_model.layers.3.self_attn.k_proj.weight: "
                            "expected shape [32, 64], found [5, 64]"]
    assert lines[-1].startswith("  fix: the tensor names are another model's or another export layout's")
    assert len(lines) == 28


def test_fused_native_tensor_with_wrong_rows_is_refused(make_tiny, tmp_path):
    def damage(t):
        t["layers.0.attention.qkv_proj.weight"] = t["layers.0.attention.qkv_proj.weight"][:-1]

    src = make_tiny("native", seed=7)
    path = _copy_checkpoint(src, tmp_path / "bad", damage)
    with pytest.raises(CheckpointError, match=r"layers\.0\.attention\.qkv_proj\.weight: expected shape \[192, 64\]"):
        load_model(path, progress=False)


def test_quantized_integer_weights_are_refused(make_tiny, tmp_path):
    def damage(t):
        t["lm_head.weight"] = torch.zeros_like(t["lm_head.weight"], dtype=torch.uint8)

    path = _copy_checkpoint(make_tiny(), tmp_path / "bad", damage)
    with pytest.raises(CheckpointError) as err:
        load_model(path, progress=False)
    assert "unsupported dtypes" in str(err.value) and "lm_head.weight: dtype U8" in str(err.value)
    assert "shape mismatches" not in str(err.value)


def test_fp8_weights_are_reported_as_an_unsupported_dtype(make_tiny, tmp_path):
    def damage(t):
        t["lm_head.weight"] = t["lm_head.weight"].to(torch.float8_e4m3fn)

    path = _copy_checkpoint(make_tiny(), tmp_path / "fp8", damage)
    with pytest.raises(CheckpointError, match=r"unsupported dtypes \(Glimmer loads BF16, F16, F32, F64; quantized "
                                              r"int8/fp8 weights are not supported.*\n +lm_head.weight: dtype F8_E4M3"):
        load_model(path, progress=False)


def test_nan_and_infinite_weights_are_refused_naming_the_tensor(make_tiny, tmp_path):
    """A damaged checkpoint would load and answer wrong (every logit NaN); it is refused, naming the tensor."""
    name = "model.language_model.layers.1.mlp.down_proj.weight"

    def damage(t):
        t[name][3, 5] = float("nan")
        t[name][0, 0] = float("inf")
        t["model.language_model.layers.0.input_layernorm.weight"][2] = float("-inf")

    path = _copy_checkpoint(make_tiny(), tmp_path / "nan", damage)
    with pytest.raises(CheckpointError) as err:
        load_model(path, progress=False)
    message = str(err.value)
    assert "model.language_model.layers.0.input_layernorm.weight" in message  # the first, in load order
    assert "holds 0 NaN and 1 infinite value(s)" in message and "so do 1 more: " + name in message
    assert "damaged" in message


def test_weights_past_float16_range_are_refused_as_float16_and_load_as_bfloat16(make_tiny, tmp_path):
    """1e5 fits bfloat16 and float32 but is infinite as float16: refused at that dtype, naming the fix."""
    name = "model.language_model.layers.0.mlp.up_proj.weight"

    def damage(t):
        t[name][1, 1] = 1e5

    path = _copy_checkpoint(make_tiny(), tmp_path / "big", damage)
    with pytest.raises(CheckpointError, match=rf"{name}.*values up to 1e\+05, past the largest torch\.float16 "
                                              r"\(6\.55e\+04\).*load with dtype bfloat16 or float32"):
        load_model(path, dtype=torch.float16, progress=False)
    loaded = load_model(path, dtype=torch.bfloat16, progress=False).model
    assert loaded.state_dict()[name][1, 1] == torch.tensor(1e5, dtype=torch.bfloat16)  # kept, rounded


def test_float64_values_past_every_compute_dtype_are_called_damaged(make_tiny, tmp_path):
    name = "model.language_model.layers.0.mlp.up_proj.weight"

    def damage(t):
        t[name] = t[name].double()
        t[name][0, 0] = 1e300

    path = _copy_checkpoint(make_tiny(), tmp_path / "huge", damage)
    with pytest.raises(CheckpointError, match=r"past the largest torch\.float32.*no dtype Glimmer computes in holds "
                                              r"them: the checkpoint is damaged"):
        load_model(path, dtype=torch.float32, progress=False)


def test_vision_config_without_vision_weights_loads_text_only(make_tiny, tmp_path):
    path = make_tiny("canonical", vision=True, seed=7)

    def drop_vision(t):
        for name in [n for n in t if n.startswith("model.vision")]:
            del t[name]

    stripped = _copy_checkpoint(path, tmp_path / "textonly", drop_vision)
    loaded = load_model(stripped, progress=False)
    assert loaded.config.vision is None
    assert any("no vision weights" in w for w in loaded.config.warnings)


def test_partial_vision_weights_are_an_error_not_text_only(make_tiny, tmp_path):
    def drop_one(t):
        del t["model.vision_tower.ln_post.weight"]

    path = _copy_checkpoint(make_tiny("canonical", vision=True, seed=7), tmp_path / "partial", drop_one)
    with pytest.raises(CheckpointError, match="model.vision_tower.ln_post.weight"):
        load_model(path, progress=False)


def test_unknown_and_mixed_weight_layouts_are_refused():
    with pytest.raises(CheckpointError, match="unrecognized weight layout"):
        detect_weight_layout(["transformer.h.0.attn.c_attn.weight"])
    with pytest.raises(CheckpointError, match="mixes weight layouts"):
        detect_weight_layout(["model.language_model.norm.weight", "model.layers.0.mlp.up_proj.weight"])


def test_missing_weights_file_is_a_clear_error(make_tiny, tmp_path):
    target = tmp_path / "noweights"
    target.mkdir()
    (target / "config.json").write_text((make_tiny() / "config.json").read_text())
    with pytest.raises(CheckpointError, match="no weights found"):
        load_model(target, progress=False)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
@pytest.mark.parametrize("allow_pickle", [False, True])
def test_a_weights_file_that_is_a_directory_is_named_not_offered_random_weights(make_tiny, tmp_path, name,
                                                                                allow_pickle):
    """It was "no weights found: expected model.safetensors, ...; to run this config with random weights, pass
    --load-format dummy", though the weights' name is there, as a directory: the advice ran the model on random
    weights."""
    target = tmp_path / "folder-weights"
    shutil.copytree(make_tiny(), target)
    (target / "model.safetensors").unlink()
    (target / name).mkdir()
    with pytest.raises(CheckpointError) as err:
        load_model(target, progress=False, allow_pickle=allow_pickle)
    assert f"{target}: {name} is a directory, not a weights file" in str(err.value), str(err.value)
    assert "dummy" not in str(err.value)


def test_index_naming_a_missing_shard_is_a_clear_error(make_tiny, tmp_path):
    src = make_tiny("canonical", seed=7, num_shards=2)
    dst = tmp_path / "broken"
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.startswith("model-00002"):
            (dst / f.name).write_bytes(f.read_bytes())
    with pytest.raises(CheckpointError, match="names shard 'model-00002-of-00002.safetensors', which does not exist"):
        load_model(dst, progress=False)


def test_shards_merged_into_one_file_beside_their_old_index_name_the_stale_index(make_tiny, tmp_path):
    """QA: shards merged into model.safetensors (the tensors all there) with the index left beside it were refused
    only as "names shard …, which does not exist", which sent the user looking for a download that was not missing."""
    src = make_tiny("canonical", seed=7, num_shards=2)
    merged = {}
    for f in src.iterdir():
        if f.name.startswith("model-0"):
            merged |= load_file(f)
        else:
            shutil.copy(f, tmp_path / f.name)
    save_file(merged, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"names shard 'model-0000\d-of-00002.safetensors', which does not exist; "
                       r"model.safetensors is here: if it holds the shards' tensors, remove the stale "
                       r"model.safetensors.index.json"):
        load_model(tmp_path, progress=False)
    (tmp_path / "model.safetensors.index.json").unlink()
    loaded = load_model(tmp_path, progress=False).model.state_dict()  # the fix named: the merged file loads
    assert all(torch.equal(loaded[name], tensor) for name, tensor in merged.items())


def test_index_naming_a_shard_that_is_a_directory_says_so(make_tiny, tmp_path):
    # it was refused as a shard that does not exist
    import shutil

    dst = tmp_path / "dir-shard"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), dst)
    (dst / "model-00002-of-00002.safetensors").unlink()
    (dst / "model-00002-of-00002.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="names shard 'model-00002-of-00002.safetensors', which is a directory, "
                                              "not a file"):
        load_model(dst, progress=False)


NOT_A_WEIGHT_MAP = ['{"metadata": {}}', "[]", '{"weight_map": ["model.safetensors"]}']


@pytest.mark.parametrize("index", NOT_A_WEIGHT_MAP)
def test_an_index_without_a_weight_map_object_says_what_it_needs(make_tiny, tmp_path, index):
    """An index with no weight_map, or that is no object, was reported as "'weight_map'" or "list indices must be
    integers or slices, not str"."""
    import shutil

    dst = tmp_path / "no-map"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), dst)
    (dst / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=r'model\.safetensors\.index\.json is not a valid index: it needs a '
                                              r'"weight_map" object that maps each tensor name to its shard file'):
        load_model(dst, progress=False)


@pytest.mark.parametrize("index", NOT_A_WEIGHT_MAP)
def test_a_pickle_index_without_a_weight_map_object_says_what_it_needs(tmp_path, index):
    from glimmer.checkpoint.pickle_files import pickle_files

    (tmp_path / "pytorch_model.bin.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=r'pytorch_model\.bin\.index\.json is not a valid index: it needs a '
                                              r'"weight_map" object'):
        pickle_files(tmp_path)


def test_an_index_with_an_empty_weight_map_is_refused_naming_it(make_tiny, tmp_path):
    """QA: every shard was left out as not named by the index, then refused as an unrecognized weight layout with
    no tensor to show."""
    import shutil

    from glimmer.checkpoint.pickle_files import pickle_files

    dst = tmp_path / "empty-map"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), dst)
    (dst / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')
    message = r'index\.json is not a valid index: its "weight_map" is empty, so it names no shard; download'
    with pytest.raises(CheckpointError, match=r"model\.safetensors\." + message):
        load_model(dst, progress=False)
    (tmp_path / "pytorch_model.bin.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin\." + message):
        pickle_files(tmp_path)


def test_a_shard_that_is_a_broken_link_is_refused_naming_its_target(make_tiny, tmp_path):
    """QA: a Hugging Face cache whose blob is gone leaves a link to nothing; the index's shard is refused by it."""
    import shutil

    checkpoint = tmp_path / "cache-snapshot"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), checkpoint)
    (checkpoint / "model-00002-of-00002.safetensors").unlink()
    (checkpoint / "model-00002-of-00002.safetensors").symlink_to("../../blobs/0123abcd")
    with pytest.raises(CheckpointError, match=r"names shard 'model-00002-of-00002\.safetensors', which is a symbolic "
                                              r"link to \.\./\.\./blobs/0123abcd, a file that does not exist .*: "
                                              r"download the checkpoint again"):
        load_model(checkpoint, progress=False)


def test_without_an_index_a_broken_link_is_refused_not_read_as_a_smaller_model(make_tiny, tmp_path):
    """QA: text and vision tensors in two files, the vision one a broken link: it was skipped without a word, and the
    checkpoint loaded as a text-only model (a warning said the config's vision tower had no weights)."""
    checkpoint = tmp_path / "split-by-tower"
    source = make_tiny("canonical", vision=True)
    checkpoint.mkdir()
    for f in source.iterdir():
        if f.suffix != ".safetensors":
            (checkpoint / f.name).write_bytes(f.read_bytes())
    tensors = load_file(source / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "vision" not in k}, str(checkpoint / "language.safetensors"))
    (checkpoint / "vision.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(CheckpointError, match=rf"^{checkpoint}/vision\.safetensors, a file of the checkpoint, is a "
                                              rf"symbolic link to {tmp_path}/gone\.safetensors, a file that does not "
                                              "exist"):
        load_model(checkpoint, progress=False)


def test_a_broken_link_the_index_does_not_name_is_left_out_with_a_warning_saying_so(make_tiny, tmp_path, caplog):
    import shutil

    checkpoint = tmp_path / "stray-link"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), checkpoint)
    (checkpoint / "consolidated.safetensors").symlink_to("/nonexistent/blob")
    with caplog.at_level("WARNING", logger="glimmer.checkpoint.safetensors_files"):
        assert torch.equal(_logits(checkpoint), _logits(make_tiny("canonical", seed=7)))
    assert (f"{checkpoint}: ignoring consolidated.safetensors: model.safetensors.index.json does not name it, and it "
            "is a broken symbolic link (to /nonexistent/blob, which does not exist); remove it") in caplog.text
    (checkpoint / "consolidated.safetensors").unlink()
    (checkpoint / "consolidated.safetensors").symlink_to("consolidated.safetensors")  # a loop: its target is there
    caplog.clear()
    with caplog.at_level("WARNING", logger="glimmer.checkpoint.safetensors_files"):
        _logits(checkpoint)
    assert ("is a broken symbolic link (to consolidated.safetensors, which leads into a loop of symbolic links); "
            "remove it") in caplog.text


def test_a_safetensors_file_the_index_does_not_name_is_left_out_with_a_warning(make_tiny, tmp_path, caplog, capsys):
    """QA: a consolidated copy beside indexed shards (Mistral-style repositories ship one) or a shard the index
    forgot was left out without a word; it still is left out, with a warning naming it (inspect reports it too)."""
    import shutil

    from glimmer.cli import main

    checkpoint = tmp_path / "with-stray"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), checkpoint)
    shutil.copy(make_tiny("canonical", seed=3) / "model.safetensors", checkpoint / "consolidated.safetensors")
    with caplog.at_level("WARNING", logger="glimmer.checkpoint.safetensors_files"):
        assert torch.equal(_logits(checkpoint), _logits(make_tiny("canonical", seed=7)))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings and all(w == warnings[0] for w in warnings)
    assert warnings[0].startswith(f"{checkpoint}: ignoring consolidated.safetensors: model.safetensors.index.json "
                                  "does not name it")
    assert main(["inspect", str(checkpoint), "--json"]) == 0
    assert warnings[0] in json.loads(capsys.readouterr().out)["warnings"]


def test_without_an_index_other_files_beside_model_safetensors_are_left_out_with_a_warning(make_tiny, tmp_path,
                                                                                            caplog):
    import shutil

    checkpoint = tmp_path / "single-and-more"
    shutil.copytree(make_tiny("canonical", seed=7), checkpoint)
    shutil.copy(make_tiny("canonical", seed=3) / "model.safetensors", checkpoint / "model-old.safetensors")
    with caplog.at_level("WARNING", logger="glimmer.checkpoint.safetensors_files"):
        assert torch.equal(_logits(checkpoint), _logits(make_tiny("canonical", seed=7)))
    assert f"{checkpoint}: ignoring model-old.safetensors: without model.safetensors.index.json, model.safetensors " \
           "alone is the checkpoint" in caplog.text


def _shards_without_index(make_tiny, tmp_path, num_shards: int = 3):
    import shutil

    checkpoint = tmp_path / "no-index"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=num_shards), checkpoint)
    (checkpoint / "model.safetensors.index.json").unlink()
    return checkpoint


def test_without_an_index_every_safetensors_file_is_one_checkpoint(make_tiny, tmp_path, caplog):
    checkpoint = _shards_without_index(make_tiny, tmp_path)
    with caplog.at_level("INFO", logger="glimmer.checkpoint.safetensors_files"):
        assert torch.equal(_logits(checkpoint), _logits(make_tiny("canonical", seed=7)))
    assert "reading its 3 *.safetensors files as one checkpoint (model-00001-of-00003.safetensors" in caplog.text
    assert "WARNING" not in caplog.text


def test_without_an_index_a_numbered_series_short_of_a_shard_is_refused(make_tiny, tmp_path):
    """A shard left out would load as a smaller model (a vision shard's absence as a text-only model)."""
    checkpoint = _shards_without_index(make_tiny, tmp_path)
    (checkpoint / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"holds 2 of the 3 shards model-\*-of-00003\.safetensors and no "
                                              r"model\.safetensors\.index\.json; missing: "
                                              r"model-00002-of-00003\.safetensors; download the missing shards"):
        load_model(checkpoint, progress=False)


def test_without_an_index_a_tensor_in_two_files_is_refused_with_the_fix(make_tiny, tmp_path):
    import shutil

    checkpoint = _shards_without_index(make_tiny, tmp_path, num_shards=2)
    shutil.copy(make_tiny("canonical", seed=7) / "model.safetensors", checkpoint / "consolidated.safetensors")
    with pytest.raises(CheckpointError, match=r"appears in both consolidated\.safetensors and model-0000[12]-of-00002"
                                              r"\.safetensors: .*remove the file that does not belong, or add the "
                                              r"model\.safetensors\.index\.json that names the shards"):
        load_model(checkpoint, progress=False)


PEAK_RSS_SCRIPT = """
import gc, sys, threading, time, torch
from glimmer.engine.model_loader import load_model

def anonymous_bytes():
    # RssAnon: this process's own memory, without the pages of files it maps (the mapped checkpoint's pages count in
    # VmRSS and VmHWM for as long as the mapping lives, and how many of them stay resident is up to the kernel)
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

def peak_growth(load):
    # the peak of this process's own memory while `load()` runs, over the memory it held before, in model sizes
    gc.collect()
    before = anonymous_bytes()
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], anonymous_bytes())
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    model, kept = load()
    done.set()
    watcher.join()
    after = max(peak[0], anonymous_bytes())
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    assert size > 80 << 20
    return (after - before) / size

def load(copy):
    model = load_model(sys.argv[1], progress=False).model
    return model, [p.detach().clone() for p in model.parameters()] if copy else []

# a first load imports what loading needs (about 70 MB of the process's own memory, whatever the model's size);
# with glibc's mmap threshold fixed by the caller, its freed tensors go back to the system at once, the plain
# measured load's among them before the load that copies its weights is measured
load_model(sys.argv[1], progress=False)
print(peak_growth(lambda: load(copy=False)), peak_growth(lambda: load(copy=True)))
"""


def peak_growths_while_loading(path) -> tuple[float, float]:
    """The peak growth of a process's own memory while it loads the checkpoint, in model sizes: a plain load, then
    one that keeps a copy of the weights on purpose (one process, its imports and first load left out of both)."""
    # a fixed mmap threshold keeps glibc from raising it as blocks are freed, so a freed tensor leaves the process
    # instead of staying in its heap and counting as used
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    out = subprocess.run([sys.executable, "-c", PEAK_RSS_SCRIPT, str(path)], capture_output=True, text=True,
                         check=True, env=env)
    plain, copied = map(float, out.stdout.split())
    return plain, copied


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak from /proc (Linux)")
def test_peak_memory_while_loading_stays_near_the_model_size(make_tiny):
    """Weights are memory-mapped and copied one tensor at a time (no second full copy in memory).

    The peak of the process's own (anonymous) memory, sampled every half millisecond while loading, counts the model
    once; a second full copy of the weights anywhere in the load would add one model size on top (copying 100 MB
    takes far longer than a sample's interval). The same measure with such a copy made on purpose shows that it can
    see one. The mapped file's pages are left out: how many stay resident is the kernel's choice, and counting them
    (VmHWM) put the plain load anywhere from 1.7 to 2.1 model sizes. The memory a first load takes for its imports
    is left out too (about 70 MB, half this model).
    """
    spec = TinySpec(hidden_size=512, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=8,
                    num_key_value_heads=2, head_dim=64)
    path = make_tiny(spec=spec, seed=1)
    growth, with_a_copy = peak_growths_while_loading(path)
    assert growth < 1.3, growth
    assert with_a_copy > growth + 0.8, (growth, with_a_copy)


def test_inspect_reports_layouts_counts_and_warnings(make_tiny, capsys):
    from glimmer.cli import main

    assert main(["inspect", str(make_tiny("native", seed=7)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config_layout"] == "vendor"
    assert report["weight_layout"] == "native"
    assert report["rope_layout"].startswith("interleaved")
    assert report["parameters"]["total"] == report["parameters"]["text backbone (incl. embedding)"] + \
        report["parameters"]["lm_head"]
    assert report["warnings"] == []


def test_cli_reports_a_bad_checkpoint_without_a_traceback(tmp_path, capsys):
    from glimmer.cli import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glimmer: error: ConfigError") and "Traceback" not in err


@pytest.mark.parametrize("layout", ["flat", "native"])
def test_vision_weights_in_every_layout_give_the_canonical_features(make_tiny, layout):
    """Including the native q/k (weights and biases) RoPE permutation of the vision tower (§5.3-5.4)."""
    pixels = torch.randn(1 * 6 * 10, 2 * 3 * 14 * 14, generator=torch.Generator().manual_seed(0))
    grid = torch.tensor([[1, 6, 10]])

    def features(path):
        model = load_model(path, progress=False).model
        with torch.no_grad():
            return torch.cat(model.encode_vision(pixels, grid))

    assert torch.equal(features(make_tiny(layout, vision=True, seed=7)),
                       features(make_tiny("canonical", vision=True, seed=7)))


def test_make_tiny_cli_writes_a_loadable_checkpoint(tmp_path, capsys):
    from glimmer.cli import main

    assert main(["make-tiny", str(tmp_path / "t"), "--layout", "native", "--vision", "--shards", "2"]) == 0
    assert "native-layout checkpoint with vision" in capsys.readouterr().out
    names = sorted(p.name for p in (tmp_path / "t").iterdir())
    assert "model.safetensors.index.json" in names and "chat_template.jinja" in names
    assert load_model(tmp_path / "t", progress=False).config.has_vision


@pytest.mark.parametrize(("options", "given"), [(["--vision"], "(--vision)"),
                                                (["--preset", "30b", "--config-only"], "(--preset 30b)")])
def test_make_tiny_refuses_vision_in_the_text_only_legacy_layout(tmp_path, capsys, options, given):
    """With --preset 30b it asked to use another layout "with --vision", a flag not given."""
    from glimmer.cli import main

    assert main(["make-tiny", str(tmp_path / "t"), "--layout", "legacy", *options]) == 2
    err = capsys.readouterr().err
    assert "is text-only, and " in err and f"{given} has a vision tower; use --layout canonical, flat or native" in err


def test_a_stray_rotary_inv_freq_buffer_is_ignored(make_tiny, tmp_path):
    def add_inv_freq(t):
        t["model.language_model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)

    path = _copy_checkpoint(make_tiny(), tmp_path / "inv-freq", add_inv_freq)
    assert torch.equal(_logits(path), _logits(make_tiny()))


@pytest.mark.parametrize("shard", ["../../outside.safetensors", "/tmp/outside.safetensors", "sub/../../x.safetensors"])
def test_index_naming_a_shard_outside_the_checkpoint_is_refused(make_tiny, tmp_path, shard):
    import shutil

    dst = tmp_path / "a" / "b" / "escaping"
    shutil.copytree(make_tiny("canonical", seed=7, num_shards=2), dst)
    outside = (dst / shard).resolve() if not shard.startswith("/") else tmp_path / "abs.safetensors"
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(dst / "model-00002-of-00002.safetensors", outside)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    index["weight_map"] = {n: (str(outside) if shard.startswith("/") else shard) if f.startswith("model-00002") else f
                           for n, f in index["weight_map"].items()}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        load_model(dst, progress=False)


def test_pickle_index_naming_a_shard_outside_the_checkpoint_is_refused(tmp_path):
    from glimmer.checkpoint.pickle_files import pickle_files

    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"w": "../outside.bin"}}))
    with pytest.raises(CheckpointError, match=r"names shard '\.\./outside\.bin', outside the checkpoint directory"):
        pickle_files(tmp_path)


def test_a_stale_index_that_omits_tensors_its_shards_hold_reads_them_as_transformers_does(make_tiny, tmp_path,
                                                                                          caplog):
    """QA: an index that did not list the vision tensors its shard held loaded a text-only model ("the checkpoint
    has no vision weights"), where transformers, which reads every tensor of the shards an index names, loads the
    vision tower."""
    import shutil

    checkpoint = tmp_path / "stale-index"
    shutil.copytree(make_tiny("canonical", vision=True, num_shards=2), checkpoint)
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if "vision" not in k}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    with caplog.at_level("WARNING", logger="glimmer.checkpoint.safetensors_files"):
        loaded = load_model(checkpoint, progress=False)
    assert loaded.config.vision is not None
    whole = load_model(make_tiny("canonical", vision=True), progress=False).model.state_dict()
    assert all(torch.equal(tensor, whole[name]) for name, tensor in loaded.model.state_dict().items())
    assert f"{checkpoint}/model.safetensors.index.json does not list 73 tensor(s) its shards hold: " in caplog.text
    assert "as transformers reads every tensor of the shards an index names (a stale index: regenerate it)" \
        in caplog.text


def test_a_tensor_a_shard_holds_that_the_index_maps_to_another_shard_is_refused(make_tiny, tmp_path):
    import shutil

    checkpoint = tmp_path / "two-copies"
    shutil.copytree(make_tiny("canonical", num_shards=2), checkpoint)
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    name, shard = next((k, v) for k, v in index["weight_map"].items() if v == "model-00002-of-00002.safetensors")
    first = checkpoint / "model-00001-of-00002.safetensors"
    tensors = load_file(first)
    tensors[name] = load_file(checkpoint / shard)[name]
    save_file(tensors, str(first))
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' is in both model-00001-of-00002\.safetensors and "
                                              rf"{shard}, and .* maps it to {shard}: two copies of a weight"):
        load_model(checkpoint, progress=False)


def _tied_variant(make_tiny, dst, tie_key, drop_lm_head):
    """The tiny vision checkpoint with `tie_key` ("tie_word_embeddings" at the top level or in text_config) set to
    true, and transformers' model of it: transformers is the judge of which lm_head the checkpoint means."""
    from transformers import MuseGlimmerForConditionalGeneration

    def edit(tensors):
        if drop_lm_head:
            del tensors["lm_head.weight"]

    path = _copy_checkpoint(make_tiny("canonical", vision=True, seed=7), dst, edit)
    raw = json.loads((path / "config.json").read_text())
    (raw["text_config"] if tie_key == "text_config" else raw)["tie_word_embeddings"] = True
    (path / "config.json").write_text(json.dumps(raw))
    return path, MuseGlimmerForConditionalGeneration.from_pretrained(path).eval()


def _reference_logits(reference) -> torch.Tensor:
    with torch.no_grad():
        return reference(input_ids=torch.tensor([IDS])).logits[0]


def test_the_top_level_tie_ties_lm_head_to_the_embeddings_as_transformers_saves_it(make_tiny, tmp_path):
    """transformers ties a muse_glimmer model's lm_head by the top-level tie_word_embeddings and saves no
    lm_head.weight then; such a checkpoint was refused as missing lm_head.weight."""
    path, reference = _tied_variant(make_tiny, tmp_path / "tied", "top", drop_lm_head=True)
    assert reference.lm_head.weight.data_ptr() == reference.model.language_model.embed_tokens.weight.data_ptr()
    loaded = load_model(path, progress=False)
    assert loaded.config.text.tie_word_embeddings and loaded.config.warnings == ()
    assert (_logits(path) - _reference_logits(reference)).abs().max().item() < 1e-4


def test_a_true_text_config_tie_is_ignored_as_transformers_ignores_it(make_tiny, tmp_path):
    """transformers does not tie by text_config.tie_word_embeddings (it keeps and saves the checkpoint's own
    lm_head); such a checkpoint was refused for an unexpected lm_head.weight."""
    path, reference = _tied_variant(make_tiny, tmp_path / "text-tie", "text_config", drop_lm_head=False)
    assert reference.lm_head.weight.data_ptr() != reference.model.language_model.embed_tokens.weight.data_ptr()
    loaded = load_model(path, progress=False)
    assert not loaded.config.text.tie_word_embeddings
    assert any("text_config.tie_word_embeddings=true is ignored" in w and "set tie_word_embeddings=true to tie" in w
               for w in loaded.config.warnings)
    assert (_logits(path) - _reference_logits(reference)).abs().max().item() < 1e-4


def test_tied_config_with_a_stored_lm_head_uses_it_as_the_reference_does(make_tiny, tmp_path):
    """transformers 5.23 loads a stored lm_head.weight even when tie_word_embeddings is true (it ties only a head
    the checkpoint lacks, verified with from_pretrained): the same tensors untied. Glimmer refused such a
    checkpoint as holding another model's tensor."""
    untied = make_tiny()
    path = tmp_path / "tied"
    shutil.copytree(untied, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    tensors = load_file(path / "model.safetensors")
    assert not torch.equal(tensors["lm_head.weight"], tensors["model.language_model.embed_tokens.weight"])
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    ours = load_model(path, progress=False).model
    ids = list(range(5, 30))
    with torch.no_grad():
        got = ours.compute_logits(ours(torch.tensor(ids), ForwardContext.without_cache([len(ids)])))
    assert (got - reference_logits(reference_model(untied), ids)).abs().max().item() < 1e-4


def test_a_tensor_of_a_dtype_without_a_known_size_takes_its_size_from_the_safetensors_header(tmp_path):
    """F8_E8M0 (MXFP4's scales) is not in the dtype-size table: num_bytes raised a bare KeyError; the header's
    data_offsets give its length."""
    from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint

    tmp_path.joinpath("model").mkdir()
    save_file({"a.weight_scale": torch.zeros(4, 8, dtype=torch.float8_e8m0fnu),
               "a.weight": torch.zeros(3, 5, dtype=torch.bfloat16)}, str(tmp_path / "model" / "model.safetensors"))
    tensors = SafetensorsCheckpoint(tmp_path / "model").tensors
    assert (tensors["a.weight_scale"].num_bytes, tensors["a.weight"].num_bytes) == (32, 30)


def test_a_tensor_of_an_unknown_dtype_without_a_stored_length_is_refused_naming_the_dtype(tmp_path):
    """A pickled drafter's tensor carries torch's dtype name where the table has none (torch.int8), and no header
    length: its size is refused naming the dtype, not a bare KeyError."""
    from glimmer.checkpoint.safetensors_files import TensorInfo

    info = TensorInfo("d.weight", (2, 3), "torch.int8", tmp_path / "drafter.pt")
    with pytest.raises(CheckpointError, match=r"tensor 'd\.weight' in .*drafter\.pt: its dtype torch\.int8 has no "
                                              "known size in bytes"):
        _ = info.num_bytes
