"""Loading a DFlash drafter: both layouts, the strict fit to the target, and clear refusals."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from quantized_fixtures import quantize_linears

from glimmer.checkpoint.config_layouts import load_config
from glimmer.checkpoint.drafter import RELEASED_MASK_TOKEN
from glimmer.engine.model_loader import load_drafter
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import CheckpointError, ConfigError
from glimmer.tiny import write_tiny_drafter


@pytest.fixture(scope="module")
def target(make_tiny):
    return make_tiny()


def _load(path, target):
    tokenizer = Tokenizer.from_dir(target)
    return load_drafter(path, load_config(target), lambda: tokenizer.require_token_id(RELEASED_MASK_TOKEN),
                        progress=False)


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def test_both_layouts_load_the_same_parameters(target, tmp_path):
    hf = _load(write_tiny_drafter(tmp_path / "hf", target, seed=3), target)
    native = _load(write_tiny_drafter(tmp_path / "native", target, layout="native", seed=3), target)
    assert (hf.weight_layout, native.weight_layout) == ("drafter", "drafter-native")
    for (name, a), (_, b) in zip(hf.model.state_dict().items(), native.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_cli_writes_a_drafter_for_a_target(target, tmp_path):
    from glimmer.cli import main

    out = tmp_path / "cli-drafter"
    assert main(["make-tiny", str(out), "--drafter-for", str(target), "--layout", "native"]) == 0
    assert (out / "head.pt").is_file()
    assert _load(out, target).config.block_size == 16  # the release's block, as the README's example needs


def test_the_cli_drafter_runs_the_readme_speculative_example(target, tmp_path):
    from glimmer.cli import main
    from glimmer.engine.llm import LLM

    out = tmp_path / "cli-drafter"
    assert main(["make-tiny", str(out), "--drafter-for", str(target)]) == 0
    llm = LLM(str(target), speculative_config={"method": "dflash", "model": str(out), "num_speculative_tokens": 15})
    assert llm.engine.drafter.config.block_size == 16


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": 96}, "hidden_size=96 but the target's hidden_size is 64"),
        ({"target_layer_ids": [1, 8, 6]}, "name layers [8] but the target has 8 layers"),
        ({"mask_token_id": 512}, "mask_token_id=512 is outside the target's vocabulary [0, 512)"),
        ({"vocab_size": 1000}, "vocab_size=1000 but the target's vocab_size is 512"),
        ({"model_type": "muse_glimmer"}, "is not a DFlash drafter config"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "rope_type='llama3' is not supported"),
        ({"block_size": 1}, "block_size=1 is invalid"),
        ({"layer_types": []}, "layer_types has 0 entries but num_hidden_layers=2"),  # was derived, unlike transformers
        # was an unknown key (a warning), where the target's is refused
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config is present: quantized drafters are "
                                                           "not supported yet"),
    ],
)
def test_a_drafter_that_does_not_fit_is_refused_with_the_numbers(target, tmp_path, changes, message):
    path = write_tiny_drafter(tmp_path / "d", target)
    _edit_config(path, **changes)
    with pytest.raises(ConfigError) as error:
        _load(path, target)
    assert message in str(error.value)


@pytest.mark.parametrize("rope", [
    {"rope_scaling": {"rope_type": "default", "rope_theta": 10000.0}},
    {"rope_scaling": {"type": "default", "rope_theta": 1000.0}},
    {"rope_theta": 2000.0, "rope_scaling": {"rope_type": "default"}},
])
def test_the_legacy_rope_scaling_gives_the_rope_theta_transformers_reads(target, tmp_path, rope):
    """transformers reads `rope_scaling` in place of `rope_parameters` (and `type` as `rope_type`), as it does for the
    target; the drafter took it for an unknown key and ran with the released theta, 500000."""
    from transformers import MuseGlimmerAssistantConfig

    path = write_tiny_drafter(tmp_path / "d", target)
    _edit_config(path, **({"rope_parameters": None} | rope))
    expected = MuseGlimmerAssistantConfig.from_dict(json.loads((path / "config.json").read_text())).rope_parameters
    assert expected["rope_type"] == "default"
    assert _load(path, target).config.rope_theta == expected["rope_theta"]


@pytest.mark.parametrize(("rope", "message"), [
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "rope_scaling.rope_type='linear' is not supported"),
    ({"rope_parameters": {"type": "linear", "factor": 2.0, "rope_theta": 5e5}},
     "rope_parameters.type='linear' is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}, "rope_scaling": {"rope_type": "linear"}},
     "differ; transformers reads only rope_scaling"),
])
def test_a_scaled_rope_in_a_legacy_spelling_is_refused_naming_it(target, tmp_path, rope, message):
    """transformers scales the drafter's positions for these (its rope_parameters end up 'linear'); they loaded
    unscaled, rope_scaling ignored with a warning and `type` not read."""
    path = write_tiny_drafter(tmp_path / "d", target)
    _edit_config(path, **({"rope_parameters": None} | rope))
    with pytest.raises(ConfigError, match=message):
        _load(path, target)


def test_null_target_layer_ids_take_the_default_transformers_takes(target, tmp_path):
    """`target_layer_ids: null` is the reference's own default ([1, 13, 25, 37, 49]), as an absent list is; it was
    refused as no JSON list."""
    from transformers import MuseGlimmerAssistantConfig

    from glimmer.checkpoint.drafter import read_drafter_config

    raw = json.loads((write_tiny_drafter(tmp_path / "d", target) / "config.json").read_text()) | {
        "target_layer_ids": None}
    config = read_drafter_config(raw, source="config.json", mask_token_id=lambda: 5)
    assert list(config.target_layer_ids) == MuseGlimmerAssistantConfig.from_dict(raw).target_layer_ids


def test_a_native_drafter_without_config_json_that_does_not_fit_says_the_released_sizes_were_assumed(target,
                                                                                                       tmp_path):
    """Without config.json beside head.pt the released drafter's sizes are taken; a head.pt of another size was
    refused with the release's numbers (hidden_size=6656) and no word of where they came from or of the fix."""
    path = write_tiny_drafter(tmp_path / "d", target, layout="native")
    (path / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"hidden_size=6656 .*no config\.json beside .*head\.pt: the released "
                                          r"drafter's sizes were assumed; put the drafter's config\.json beside it"):
        _load(path, target)


@pytest.mark.parametrize("layout, flag", [("canonical", False), ("native", True)])
def test_a_rope_is_neox_style_that_contradicts_the_weight_layout_is_refused(target, tmp_path, layout, flag):
    # the tensor names decide the q/k pairing, as for the target (formats.py); a flag that disagrees was ignored
    path = write_tiny_drafter(tmp_path / "d", target, layout=layout)
    _edit_config(path, rope_is_neox_style=flag)
    with pytest.raises(CheckpointError, match=rf"rope_is_neox_style={str(flag).lower()} says the drafter's q/k rows "
                                              rf"are .* but its weights are in the drafter(-native)? layout"):
        _load(path, target)


@pytest.mark.parametrize("layout, flag", [("canonical", True), ("native", False)])
def test_a_rope_is_neox_style_that_matches_the_weight_layout_is_read_silently(target, tmp_path, layout, flag):
    path = write_tiny_drafter(tmp_path / "d", target, layout=layout)
    _edit_config(path, rope_is_neox_style=flag)
    assert _load(path, target).config.warnings == ()


def test_a_rope_is_neox_style_that_is_no_boolean_is_refused(target, tmp_path):
    path = write_tiny_drafter(tmp_path / "d", target)
    _edit_config(path, rope_is_neox_style="false")
    with pytest.raises(ConfigError, match=r"rope_is_neox_style='false' is invalid; expected true or false"):
        _load(path, target)


def test_a_null_quantization_config_is_read_silently(target, tmp_path):
    path = write_tiny_drafter(tmp_path / "d", target)
    config = json.loads((path / "config.json").read_text()) | {"quantization_config": None}
    (path / "config.json").write_text(json.dumps(config))
    assert _load(path, target).config.warnings == ()


@pytest.mark.parametrize(("scheme", "first"), [
    ("nvfp4", r"layers\.0\.mlp\.down_proj\.weight_packed and 13 more"),
    ("gptq", r"layers\.0\.mlp\.down_proj\.qweight and 13 more"),
    ("fp8", r"layers\.0\.mlp\.down_proj\.weight and 13 more, of dtype F8_E4M3 beside their weight_scale"),
])
def test_quantized_weights_without_a_quantization_config_are_refused_as_a_quantized_drafter(
        target, tmp_path, scheme, first):
    path = write_tiny_drafter(tmp_path / "d", target)
    quantize_linears(path / "model.safetensors", lambda name: name.endswith("_proj.weight"), scheme)
    with pytest.raises(CheckpointError, match=(
            rf"holds quantized weights \({first}\) though its config\.json has no quantization_config: quantized "
            r"drafters are not supported yet; use the unquantized \(bf16\) drafter")):
        _load(path, target)


def test_weights_that_do_not_match_the_config_are_refused(target, tmp_path):
    path = write_tiny_drafter(tmp_path / "d", target)
    _edit_config(path, intermediate_size=64)
    with pytest.raises(CheckpointError, match=r"layers\.0\.mlp\.gate_proj\.weight: expected shape \[64, 64\], "
                                              r"found \[96, 64\]"):
        _load(path, target)


def test_a_config_python_cannot_parse_is_a_config_error(target, tmp_path):
    """An integer of over 4,300 digits is valid JSON that Python's parser refuses with a ValueError, not a
    JSONDecodeError: it was a traceback."""
    path = write_tiny_drafter(tmp_path / "d", target)
    (path / "config.json").write_text('{"hidden_size": ' + "9" * 5000 + "}")
    with pytest.raises(ConfigError, match=r"config\.json is not valid JSON: Exceeds the limit"):
        _load(path, target)


def test_absent_mask_token_id_comes_from_the_target_tokenizer(target, tmp_path):
    path = write_tiny_drafter(tmp_path / "d", target)
    _edit_config(path, mask_token_id=None)
    expected = Tokenizer.from_dir(target).token_to_id(RELEASED_MASK_TOKEN)
    assert _load(path, target).config.mask_token_id == expected


def test_native_file_without_config_must_have_the_released_geometry(target, tmp_path):
    path = write_tiny_drafter(tmp_path / "d", target, layout="native")
    (path / "config.json").unlink()
    with pytest.raises(ConfigError, match="hidden_size=6656 but the target's hidden_size is 64"):
        _load(path / "head.pt", target)


def test_a_directory_with_both_head_pt_and_safetensors_is_refused_naming_both(target, tmp_path):
    """The two layouts cannot be compared without reading both in full: head.pt was taken silently."""
    path = write_tiny_drafter(tmp_path / "d", target, layout="native", seed=1)
    other = write_tiny_drafter(tmp_path / "other", target, seed=2)
    (path / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError) as err:
        _load(path, target)
    message = str(err.value)
    assert "head.pt" in message and "model.safetensors" in message and "remove" in message
    assert _load(path / "head.pt", target).weight_layout == "drafter-native"  # the file named is not ambiguous


def test_native_file_with_foreign_content_is_refused(target, tmp_path):
    path = write_tiny_drafter(tmp_path / "d", target, layout="native")
    torch.save({"layers.0.attention.wqkv.weight": torch.zeros(2), "step": 3}, path / "head.pt")
    with pytest.raises(CheckpointError, match="not named tensors: step"):
        _load(path, target)


def test_native_file_is_never_unpickled_beyond_tensors(target, tmp_path):
    path = write_tiny_drafter(tmp_path / "d", target, layout="native")
    torch.save({"w": torch.zeros(2), "extra": _Arbitrary()}, path / "head.pt")
    with pytest.raises(CheckpointError, match="weights_only=True") as err:
        _load(path, target)
    message = str(err.value)
    assert "_Arbitrary was not an allowed global" in message and len(message.splitlines()) == 1
    assert "weights_only` set to `False`" not in message and "add_safe_globals" not in message


class _RunsCode:
    def __reduce__(self):
        return (print, ("drafter pickle code ran",))


def test_a_malicious_head_pt_is_refused_in_one_line_without_unsafe_advice(target, tmp_path, capsys):
    import pickle

    path = write_tiny_drafter(tmp_path / "d", target, layout="native")
    (path / "head.pt").write_bytes(pickle.dumps({"w": _RunsCode()}))
    with pytest.raises(CheckpointError) as err:
        _load(path, target)
    message = str(err.value)
    assert len(message.splitlines()) == 1 and "refused by torch.load(weights_only=True)" in message
    assert "False" not in message and "trust" not in message
    assert "drafter pickle code ran" not in capsys.readouterr().out


@pytest.mark.parametrize(("content", "problem"), [
    (b"<!DOCTYPE html><html>Not Found</html>", "is not a PyTorch weights file: it begins b'<!DOCTYPE html><'"),
    (b"\x80\x02h\x65", "KeyError: 101"),  # was "...: 101"
])
def test_a_head_pt_that_is_no_torch_file_is_refused_naming_it(target, tmp_path, content, problem):
    """An error page saved as head.pt was "refused by torch.load(weights_only=True), which only admits tensors and
    plain containers", as if it held code."""
    path = write_tiny_drafter(tmp_path / "d", target, layout="native")
    (path / "head.pt").write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        _load(path, target)
    assert str(path / "head.pt") in str(err.value) and problem in str(err.value), str(err.value)
    assert "which only admits" not in str(err.value)


class _Arbitrary:
    pass


@pytest.mark.parametrize(("layout", "name"), [("native", "head.pt"), ("native", "config.json"),
                                              ("canonical", "config.json")])
def test_a_drafter_file_that_is_a_broken_link_is_refused_naming_its_target(target, tmp_path, layout, name):
    """A Hugging Face cache whose blob is gone: a broken head.pt was passed over for the HF layout ("no weights found
    ... pass --load-format dummy"), a broken config.json of a native drafter for the released sizes, and of an HF
    one for "holds no DFlash drafter"."""
    out = write_tiny_drafter(tmp_path / "drafter", target, layout=layout)
    (out / name).unlink()
    (out / name).symlink_to("../../blobs/0123abcd")
    with pytest.raises((CheckpointError, ConfigError), match=re.escape(
            f"{out / name} is a symbolic link to ../../blobs/0123abcd, a file that does not exist")):
        _load(out, target)


def test_a_directory_without_a_drafter_is_refused(tmp_path, target):
    with pytest.raises(CheckpointError, match="holds no DFlash drafter") as error:
        _load(tmp_path, target)
    assert str(error.value).startswith(f"speculative_config.model={str(tmp_path)!r}: ")


def test_a_target_weights_file_as_the_drafter_is_refused_naming_the_key_and_every_layout(target):
    """The message named neither the setting at fault nor the GGUF drafters it also takes."""
    weights = target / "model.safetensors"
    with pytest.raises(CheckpointError) as error:
        _load(weights, target)
    message = str(error.value)
    assert message.startswith(f"speculative_config.model={str(weights)!r} is a file but not a drafter's native .pt")
    assert "head.pt or its .gguf file" in message


def test_a_drafter_layer_count_no_model_has_is_refused_before_its_layer_types_are_made(tmp_path):
    """QA: num_hidden_layers=10**9 without layer_types made a list of 10**9 entries (8 GB) before anything was checked.
    Read in a subprocess under an address-space cap, so the old behaviour fails with a MemoryError, not the machine."""
    import resource

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    code = ("from glimmer.checkpoint.drafter import read_drafter_config\n"
            "from glimmer.errors import ConfigError\n"
            "try:\n"
            "    read_drafter_config({'model_type': 'muse_glimmer_assistant', 'num_hidden_layers': 10**9},\n"
            "                        source='d/config.json', mask_token_id=lambda: 500)\n"
            "except ConfigError as error:\n"
            "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            preexec_fn=cap_memory)
    assert result.stdout.startswith("d/config.json: num_hidden_layers=1000000000 is more layers than Glimmer builds "
                                    "(at most 4096"), result.stdout + result.stderr[-2000:]


@pytest.mark.parametrize(("sizes", "shape"), [
    ({"intermediate_size": 2**40}, "intermediate_size × hidden_size (the MLP) = 7318349394477056 elements"),
    ({"hidden_size": 2**20, "num_attention_heads": 2**20, "head_dim": 2**20},
     "num_attention_heads·head_dim × hidden_size (q_proj, o_proj) = 1152921504606846976 elements"),
], ids=["mlp", "attention"])
def test_drafter_sizes_that_make_a_weight_no_checkpoint_holds_are_refused_naming_them(sizes, shape):
    """As the target's text and vision sizes: building the drafter from them failed deep inside torch."""
    from glimmer.checkpoint.drafter import read_drafter_config

    with pytest.raises(ConfigError) as error:
        read_drafter_config({"model_type": "muse_glimmer_assistant", **sizes}, source="d/config.json",
                            mask_token_id=lambda: 500)
    assert str(error.value).startswith(f"d/config.json: drafter config sizes make a weight of {shape}, more than any "
                                       "checkpoint holds (at most 2**40)"), str(error.value)


@pytest.mark.parametrize(("layout", "name"), [("native", "head.pt"), ("native", "config.json"),
                                              ("canonical", "config.json")])
def test_a_drafter_file_that_is_a_directory_is_refused_naming_it(target, tmp_path, layout, name):
    """A directory named head.pt was passed over for the HF layout ("no weights found ... pass --load-format dummy"),
    one named config.json for the released sizes (native) or "holds no DFlash drafter" (HF)."""
    out = write_tiny_drafter(tmp_path / "drafter", target, layout=layout)
    (out / name).unlink()
    (out / name).mkdir()
    with pytest.raises((CheckpointError, ConfigError), match=re.escape(f"{out / name} is not a file")):
        _load(out, target)


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_dtype_field_naming_no_floating_point_dtype_is_named_in_a_warning(target, tmp_path, key):
    """The target's config.json says so of such a field; the drafter's took any value without a word."""
    path = write_tiny_drafter(tmp_path / "d", target)
    _edit_config(path, **{key: "float128"})
    warnings = _load(path, target).config.warnings
    assert any(f"config.json: ignoring {key}='float128': not a torch floating-point dtype name" in w
               for w in warnings), warnings


@pytest.mark.parametrize("layout", ["canonical", "native"])
def test_a_git_lfs_pointer_in_place_of_the_drafters_config_is_named_with_the_fix(target, tmp_path, layout):
    """It was "config.json: cannot be read as JSON (Expecting value: line 1 column 1 (char 0))"."""
    out = write_tiny_drafter(tmp_path / "drafter", target, layout=layout)
    pointer_text = "version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 9\n"
    (out / "config.json").write_text(pointer_text)
    pointer = f"{out / 'config.json'} is a Git LFS pointer to a file of 9 bytes"
    with pytest.raises(ConfigError, match=re.escape(pointer)):
        _load(out, target)


def test_a_git_lfs_pointer_in_place_of_head_pt_is_named_with_the_fix(target, tmp_path):
    """A drafter cloned without git-lfs: its head.pt was "refused by torch.load(weights_only=True)", as if it ran
    code."""
    out = write_tiny_drafter(tmp_path / "drafter", target, layout="native")
    (out / "head.pt").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 9\n")
    pointer = f"{out / 'head.pt'} is a Git LFS pointer to a file of 9 bytes"
    with pytest.raises(CheckpointError, match=re.escape(pointer)):
        _load(out, target)
