"""Packaged MLX artifacts (architecture.md §15.2), written with `mlx` itself and read by Glimmer: float
artifacts give the safetensors checkpoint's logits exactly; quantized ones give exactly mlx's own
dequantization (up to float32 rounding) and stay within its quantizer's bound — one step (the group's scale)
of the original weight: mx.quantize snaps the group's larger-magnitude extreme onto a level, so values near
the other extreme can be up to a step off (measured: 0.98 steps at most, 1% of values beyond half a step)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf_export import canonical_state

from glimmer.checkpoint.mlx import dequantize_affine
from glimmer.engine.llm import LLM
from glimmer.engine.model_loader import load_model
from glimmer.engine.sampling_params import SamplingParams
from glimmer.errors import CheckpointError
from glimmer.model.context import ForwardContext

mx = pytest.importorskip("mlx.core")
from mlx_export import export_mlx_artifact  # noqa: E402 - needs mlx

IDS = list(range(3, 70))


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(IDS), ForwardContext.without_cache([len(IDS)])))


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate-half", "interleaved"])
def test_float_artifact_gives_the_safetensors_logits_exactly(tiny_checkpoint, tmp_path, interleaved):
    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint),
                                   interleaved=interleaved)
    assert torch.equal(logits(load_model(artifact, progress=False).model),
                       logits(load_model(tiny_checkpoint, progress=False).model))


def test_a_nested_artifact_reads_the_pairing_flag_in_its_text_config(tiny_checkpoint, tmp_path, caplog):
    """The nested schema keeps the text model's facts in text_config, where a weights directory's flag is read too
    (formats.py); the MLX reader looked at the top level only, so interleaved q/k rows flagged there were read as
    rotate-half, a silently wrong model, while a warning said the key was ignored."""
    from glimmer.checkpoint.config_layouts import config_to_dict, load_config

    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint),
                                   interleaved=True)
    config = config_to_dict(load_config(tiny_checkpoint), "canonical") | {"muse_glimmer_mlx_format": 1}
    config["text_config"]["rope_is_neox_style"] = False
    (artifact / "config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING"):
        loaded = load_model(artifact, progress=False).model
    assert torch.equal(logits(loaded), logits(load_model(tiny_checkpoint, progress=False).model))
    assert "rope_is_neox_style" not in caplog.text
    (artifact / "config.json").write_text(json.dumps(config | {"rope_is_neox_style": True}))
    with pytest.raises(CheckpointError, match=r"rope_is_neox_style=True and text_config\.rope_is_neox_style=False "
                                              r"disagree on the q/k RoPE pairing"):
        load_model(artifact, progress=False)


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_artifact_matches_mlx_dequantization(tiny_checkpoint, tmp_path, bits):
    state = canonical_state(tiny_checkpoint)
    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", state, bits=bits, group_size=32)
    loaded = load_model(artifact, progress=False).model.state_dict()
    weights = mx.load(str(artifact / "model.safetensors"))
    heads, d = 4, 16
    for layer in (0, 5):
        module = f"model.layers.{layer}.self_attn.q_proj"
        mlx_rows = torch.tensor(mx.dequantize(weights[module + ".weight"], weights[module + ".scales"],
                                              weights[module + ".biases"], group_size=32, bits=bits).tolist())
        scales = torch.tensor(weights[module + ".scales"].tolist()).repeat_interleave(32, dim=1)
        for part, name in ((0, "q_proj"), (1, "gate_proj")):
            canonical = f"model.language_model.layers.{layer}.self_attn.{name}.weight"
            expected = mlx_rows.reshape(heads, 2, d, -1)[:, part].reshape(heads * d, -1)
            step = scales.reshape(heads, 2, d, -1)[:, part].reshape(heads * d, -1)
            assert (loaded[canonical] - expected).abs().max() < 1e-6
            assert ((loaded[canonical] - state[canonical]).abs() <= step.abs() + 1e-6).all()
    params = SamplingParams(max_tokens=4, temperature=0.0)
    assert len(LLM(str(artifact)).generate("The sea", params)[0].outputs[0].token_ids) == 4


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_every_bit_width_dequantizes_exactly_as_mlx(bits, group_size):
    """3, 5 and 6-bit codes straddle the uint32 words; float32 scales leave no rounding to differ in."""
    weights = mx.random.normal((16, 384), key=mx.random.key(bits))
    packed, scales, biases = mx.quantize(weights, group_size=group_size, bits=bits)
    expected = torch.tensor(mx.dequantize(packed, scales, biases, group_size=group_size, bits=bits).tolist())
    loaded = dequantize_affine(torch.tensor(np.array(packed)), torch.tensor(np.array(scales)),
                               torch.tensor(np.array(biases)), group_size, bits)
    assert torch.equal(loaded, expected)


PEAK_RSS_SCRIPT = """
import torch
from pathlib import Path
from glimmer.checkpoint.mlx import dequantize_affine

def kib(field):
    return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith(field + ":"))

rows, columns, bits, group = 4096, 4096, 4, 64
packed = torch.randint(-2**31, 2**31 - 1, (rows, columns * bits // 32), dtype=torch.int32).view(torch.uint32)
scales, biases = torch.rand(rows, columns // group, dtype=torch.bfloat16), torch.rand(rows, columns // group,
                                                                                      dtype=torch.bfloat16)
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from here, past the imports' own peak
before = kib("VmRSS")
out = dequantize_affine(packed, scales, biases, group, bits)
print(before * 1024, kib("VmHWM") * 1024, out.numel() * out.element_size())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak resident size from /proc")
def test_dequantizing_needs_little_memory_beside_the_output():
    """The codes were unpacked a bit per byte and widened to int32 all at once: 6 (4-bit) to 11 (8-bit) times the
    float32 output beside it, 32 GB for the 30B's 4-bit embedding alone, enough to kill a load on a machine that
    holds the model (README: peak memory stays near the model's size); rows are now unpacked a block at a time."""
    out = subprocess.run([sys.executable, "-c", PEAK_RSS_SCRIPT], capture_output=True, text=True, check=True)
    before, peak, size = map(int, out.stdout.split())
    assert size <= peak - before < 1.6 * size, (peak - before, size)  # the output is written: at least its size


def test_other_format_versions_are_refused_with_regenerate(tiny_checkpoint, tmp_path, capsys):
    from glimmer.cli import main

    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint), version=2)
    with pytest.raises(CheckpointError, match="muse_glimmer_mlx_format=2.*regenerate the artifact"):
        load_model(artifact, progress=False)
    assert main(["inspect", str(artifact)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "regenerate the artifact" in lines[0]


def test_inspect_reports_an_mlx_artifact(tiny_checkpoint, tmp_path, capsys):
    from glimmer.cli import main

    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint), bits=4)
    assert main(["inspect", str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "format:          mlx" in out and "affine 4-bit g32" in out
    assert "weight layout:   mlx\n" in out  # QA: "canonical", the names the reader hands on, not the artifact's
    assert main(["inspect", str(artifact), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_layout"] == "mlx"


@pytest.mark.parametrize("bits", [None, 4], ids=["float", "4-bit"])
def test_an_artifact_whose_config_lost_its_format_key_is_refused_naming_the_key(tiny_checkpoint, tmp_path, capsys,
                                                                                 bits):
    """QA: read as the legacy export its names resemble, it failed as a list of shape mismatches and unexpected
    scales/biases; it is one error naming the missing key and what shows the weights to be an artifact's."""
    from glimmer.cli import main

    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint), bits=bits)
    config = json.loads((artifact / "config.json").read_text())
    (artifact / "config.json").write_text(json.dumps({k: v for k, v in config.items()
                                                      if k != "muse_glimmer_mlx_format"}))
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    message = str(err.value)
    assert message.startswith(f"{artifact / 'config.json'} has no muse_glimmer_mlx_format, but the weights are a "
                              "packaged MLX artifact's (")
    assert "model.layers.0.self_attn.q_proj.weight with 128 rows" in message and "\n" not in message
    assert ("MLX affine quantization tensors lm_head.scales / .biases and 57 more modules" in message) == (bits == 4)
    assert 'add "muse_glimmer_mlx_format": 1 to it' in message
    assert main(["inspect", str(artifact)]) == 2
    assert "has no muse_glimmer_mlx_format" in capsys.readouterr().err


def _edited_artifact(tiny_checkpoint, directory, edit, **export):
    from safetensors.torch import load_file, save_file

    artifact = export_mlx_artifact(tiny_checkpoint, directory, canonical_state(tiny_checkpoint), **export)
    tensors = load_file(artifact / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(artifact / "model.safetensors"))
    return artifact


@pytest.mark.parametrize("bits", [None, 4])
def test_a_tied_artifact_without_lm_head_loads_as_the_tied_checkpoint(tiny_checkpoint, tmp_path, bits):
    """mlx-lm saves no lm_head for a model whose config ties it to the embedding; such an artifact was refused as
    incomplete (lm_head.weight missing), though the same model loads from safetensors."""
    import shutil

    from safetensors.torch import load_file, save_file

    def drop_lm_head(tensors):
        for name in [n for n in tensors if n.startswith("lm_head.")]:
            del tensors[name]

    artifact = _edited_artifact(tiny_checkpoint, tmp_path / "mlx", drop_lm_head, bits=bits)
    config = json.loads((artifact / "config.json").read_text())
    (artifact / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    model = load_model(artifact, progress=False).model
    assert model.lm_head.weight is model.embed_tokens.weight
    if bits is None:  # the tied safetensors checkpoint: same config, the same weights less lm_head
        tied = tmp_path / "tied"
        shutil.copytree(tiny_checkpoint, tied)
        config = json.loads((tied / "config.json").read_text())
        (tied / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
        tensors = load_file(tied / "model.safetensors")
        drop_lm_head(tensors)
        save_file(tensors, str(tied / "model.safetensors"))
        assert torch.equal(logits(model), logits(load_model(tied, progress=False).model))
    else:
        weights = mx.load(str(artifact / "model.safetensors"))
        module = "model.embed_tokens"
        expected = mx.dequantize(weights[module + ".weight"], weights[module + ".scales"], weights[module + ".biases"],
                                 group_size=32, bits=bits)
        assert (model.lm_head.weight - torch.tensor(expected.tolist())).abs().max() < 1e-6


@pytest.mark.parametrize(("bits", "stored"), [(None, torch.int8), (4, torch.float32)], ids=["int8-weight",
                                                                                          "float-codes"])
def test_a_tensor_of_a_dtype_the_packing_does_not_use_is_refused(tiny_checkpoint, tmp_path, bits, stored):
    """QA: an unquantized weight stored as int8 (no scales) was loaded as the float of its codes, a silent wrong
    model; quantized codes must be uint32 words and weights, norms, scales and biases floats."""
    name = "model.layers.0.mlp.up_proj.weight"

    def retype(tensors):
        tensors[name] = tensors[name].to(stored) if bits is None else tensors[name].view(stored)

    artifact = _edited_artifact(tiny_checkpoint, tmp_path / "mlx", retype, bits=bits)
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    lines = str(err.value).splitlines()
    assert lines[0] == (f"the weights in {artifact} (packaged MLX artifact) do not match the config: 1 of an "
                        "unsupported type")
    assert lines[2] == f"    {name}: dtype {'I8' if bits is None else 'F32'}"
    assert lines[-1].startswith("  fix: regenerate the artifact")


def test_missing_and_stray_tensors_are_all_listed_with_the_fix(tiny_checkpoint, tmp_path):
    """QA: only the first missing tensor was named, in one line without a fix."""
    def rename(tensors):
        for name in [n for n in tensors if n.startswith("model.layers.1.")]:
            tensors[name.replace("layers.1.", "blocks.1.")] = tensors.pop(name)

    artifact = _edited_artifact(tiny_checkpoint, tmp_path / "mlx", rename)
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    lines = str(err.value).splitlines()
    assert lines[0].endswith("do not match the config: 11 missing, 11 unexpected")
    assert "  missing tensors (11):" in lines and "  unexpected tensors (11):" in lines
    assert "    model.blocks.1.mlp.up_proj.weight [128, 64]" in lines
    assert lines[-1].startswith("  fix: the tensor names are not a packaged Muse Glimmer MLX artifact's")


@pytest.mark.parametrize(("bits", "damaged", "stored"), [
    (4, "model.layers.1.mlp.up_proj.scales", "model.layers.1.mlp.up_proj.weight"),
    (4, "model.layers.1.mlp.up_proj.biases", "model.layers.1.mlp.up_proj.weight"),
    (None, "model.layers.1.post_ffn_norm.weight", "model.layers.1.post_ffn_norm.weight"),
], ids=["scales", "biases", "float-norm"])
def test_a_nan_is_refused_naming_the_artifacts_own_tensor(tiny_checkpoint, tmp_path, bits, damaged, stored):
    """A NaN was reported under the canonical name alone, which the artifact does not hold, 'in' its directory; and
    a quantized module's under neither its codes nor the scales or biases that hold it. The artifact's own names lead
    to the bytes, as a GGUF's do."""
    def poison(tensors):
        values = tensors[damaged].clone()
        values.view(-1)[0] = float("nan")
        tensors[damaged] = values

    artifact = _edited_artifact(tiny_checkpoint, tmp_path / "mlx", poison, bits=bits)
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    message, file = str(err.value), artifact / "model.safetensors"
    canonical = ("model.language_model.layers.1.mlp.up_proj.weight" if bits else
                 "model.language_model.layers.1.post_feedforward_layernorm.weight")
    assert message.startswith(f"parameter {canonical} (checkpoint tensor '{canonical}', stored as '{stored}' in "
                              f"{file}) holds {32 if bits else 1} NaN and 0 infinite value(s)"), message
    if bits:
        assert f", computed from '{damaged}' (in {file}), which holds 1 NaN and 0 infinite value(s) among 256;" \
            in message
    else:
        assert "computed from" not in message


@pytest.mark.parametrize("dropped", [("scales",), ("biases",), ("scales", "biases")])
def test_a_quantized_module_missing_its_scales_or_biases_names_them(tiny_checkpoint, tmp_path, dropped):
    """Without its scales, a module's packed codes were taken for a float weight of the wrong shape, and the error
    blamed config.json for describing another size of model."""
    module = "model.layers.0.mlp.up_proj"

    def drop(tensors):
        for part in dropped:
            tensors.pop(f"{module}.{part}")

    artifact = _edited_artifact(tiny_checkpoint, tmp_path / "mlx", drop, bits=4)
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    lines = str(err.value).splitlines()
    assert lines[0].endswith(f"do not match the config: {len(dropped)} missing"), lines[0]
    assert lines[2:2 + len(dropped)] == [f"    {module}.{part} (shape [128, 2])" for part in dropped]
    assert lines[-1].startswith("  fix: the artifact is incomplete")


def test_a_bit_width_that_is_not_an_integer_is_refused_naming_it(tiny_checkpoint, tmp_path):
    """QA: `"bits": 4.0` (a config.json edited or written by another tool) passed the check, 4.0 == 4, and loading
    failed in the unpacking with a bare TypeError (unsupported operand type(s) for <<: 'int' and 'float')."""
    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint), bits=4)
    config = json.loads((artifact / "config.json").read_text())
    config["quantization"]["bits"] = bits = 4.0
    (artifact / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    assert str(err.value) == (f"{artifact / 'config.json'}: quantization.bits={bits!r} is invalid; MLX affine "
                              "quantization uses [2, 3, 4, 5, 6, 8]")


@pytest.mark.parametrize(("edit", "refusal"), [
    ({"bits": 7}, "quantization_config.bits=7 is invalid; MLX affine quantization uses [2, 3, 4, 5, 6, 8]"),
    ({"bits": 8}, "config.json's quantization_config says bits=8, group_size=32; restore the artifact's config.json "
                  "as packaged (its \"quantization_config\")"),
], ids=["bits", "other-packing"])
def test_a_quantization_given_as_quantization_config_is_named_so(tiny_checkpoint, tmp_path, edit, refusal):
    """QA: an artifact whose config.json holds mlx-lm's quantization as "quantization_config" alone (a tool that kept
    only the Hugging Face name) was refused naming "quantization", a key the file does not have."""
    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint), bits=4,
                                   group_size=32)
    config = json.loads((artifact / "config.json").read_text())
    config["quantization_config"] = config.pop("quantization") | edit
    (artifact / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    assert refusal in str(err.value)
    assert "quantization." not in str(err.value).replace("quantization_config.", "")


def test_a_module_quantized_in_another_mode_is_refused_naming_its_mode(tiny_checkpoint, tmp_path):
    """mlx-lm's mixed recipes may give a module its own mode; an mxfp4 module (codes with e8m0 scales and no biases)
    was reported as a quantized module missing its biases, "the artifact is incomplete: copy it again"."""
    module = "model.layers.0.mlp.up_proj"

    def to_mxfp4(tensors):
        affine = [mx.array(tensors[f"{module}.{part}"].numpy()) for part in ("weight", "scales", "biases")]
        weight = mx.dequantize(*affine, group_size=32, bits=4)
        packed, scales = mx.quantize(weight, group_size=32, bits=4, mode="mxfp4")
        del tensors[f"{module}.biases"]
        tensors[f"{module}.weight"] = torch.tensor(np.array(packed))
        tensors[f"{module}.scales"] = torch.tensor(np.array(scales))

    artifact = _edited_artifact(tiny_checkpoint, tmp_path / "mlx", to_mxfp4, bits=4)
    config = json.loads((artifact / "config.json").read_text())
    config["quantization"][module] = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    (artifact / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    assert f"quantization.{module}.mode='mxfp4' is not supported; Glimmer reads MLX's affine quantization" \
        in str(err.value)


@pytest.mark.parametrize(("edit", "module", "key", "said"), [
    ({"group_size": 64}, "model.embed_tokens", "quantization", "bits=4, group_size=64"),
    ({"bits": 8}, "model.embed_tokens", "quantization", "bits=8, group_size=32"),
    ({"model.layers.0.mlp.up_proj": {"group_size": 32, "bits": 2}}, "model.layers.0.mlp.up_proj",
     "quantization.model.layers.0.mlp.up_proj", "bits=2, group_size=32"),
], ids=["group-size", "bits", "a-module-override"])
def test_a_quantization_config_other_than_the_packing_names_both(tiny_checkpoint, tmp_path, edit, module, key, said):
    """QA: a config.json whose quantization differs from the stored codes (a config copied from another artifact)
    listed every module's scales or codes as the wrong shape, with the fix "config.json describes another size of
    model"; it is one error naming the module, what its tensors hold and what the config says."""
    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint), bits=4,
                                   group_size=32)
    config = json.loads((artifact / "config.json").read_text())
    config["quantization"] |= edit
    (artifact / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    assert str(err.value) == (f"{artifact}: {module} holds 4-bit codes in groups of 32, but config.json's {key} "
                              f"says {said}; restore the artifact's config.json as packaged (its \"quantization\"), "
                              "or regenerate the artifact")


@pytest.mark.parametrize("override", ["4bit", 4, True, [4, 64]])
def test_a_module_override_that_is_not_an_object_or_false_is_refused(tiny_checkpoint, tmp_path, override):
    """mlx-lm writes a module's own quantization as an object (or false: left whole); any other value there was
    ignored, the module read with the default's group size and bits."""
    artifact = _edited_artifact(tiny_checkpoint, tmp_path / "mlx", lambda tensors: None, bits=4)
    config = json.loads((artifact / "config.json").read_text())
    module = "model.layers.0.mlp.up_proj"
    for key in ("quantization", "quantization_config"):
        if key in config:
            config[key][module] = override
    (artifact / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_model(artifact, progress=False)
    assert f"quantization.{module}={override!r} is invalid; a module's override is an object" in str(err.value)


def test_weights_that_are_a_git_lfs_pointer_are_named_with_the_fix(tiny_checkpoint, tmp_path):
    """QA: an artifact cloned without git-lfs (a pointer file in place of model.safetensors) was refused as the
    safetensors library's "header too large", not saying the weights were never downloaded or how to fetch them."""
    artifact = export_mlx_artifact(tiny_checkpoint, tmp_path / "mlx", canonical_state(tiny_checkpoint), bits=4)
    weights = artifact / "model.safetensors"
    weights.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 2306867\n")
    with pytest.raises(CheckpointError) as raised:
        load_model(artifact, progress=False)
    assert str(raised.value) == (f"cannot read safetensors file {weights}: it is a Git LFS pointer to a file of "
                                 "2,306,867 bytes, which was never downloaded: fetch it with `git lfs pull` in its "
                                 "repository (or download the file with `hf download`)")
