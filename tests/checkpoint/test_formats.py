"""Which reader opens a checkpoint, and the safety rules: pickle only on request and only through
torch.load(weights_only=True); checkpoint code never executed, with a warning (README "Checkpoints")."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import shutil

import pytest
import torch
from gguf_export import canonical_state

from glimmer.checkpoint.formats import is_config_only, open_checkpoint
from glimmer.cli import main
from glimmer.engine.model_loader import load_model
from glimmer.errors import CheckpointError, ConfigError
from glimmer.model.context import ForwardContext

IDS = list(range(3, 40))
SIDE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json", "chat_template.jinja")


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(IDS), ForwardContext.without_cache([len(IDS)])))


@pytest.fixture
def pickle_checkpoint(tiny_checkpoint, tmp_path):
    out = tmp_path / "pickled"
    out.mkdir()
    for name in SIDE_FILES:
        shutil.copy(tiny_checkpoint / name, out / name)
    torch.save(canonical_state(tiny_checkpoint), out / "pytorch_model.bin")
    return out


def test_pickle_weights_are_refused_without_allow_pickle(pickle_checkpoint, capsys):
    with pytest.raises(CheckpointError, match="pickle weights only.*--allow-pickle.*weights_only=True"):
        load_model(pickle_checkpoint, progress=False)
    assert main(["inspect", str(pickle_checkpoint)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_allowed_pickle_weights_load_like_the_safetensors(tiny_checkpoint, pickle_checkpoint):
    loaded = load_model(pickle_checkpoint, progress=False, allow_pickle=True)
    assert torch.equal(logits(loaded.model), logits(load_model(tiny_checkpoint, progress=False).model))
    assert open_checkpoint(pickle_checkpoint, allow_pickle=True).format == "pickle"


def test_a_folder_named_like_safetensors_weights_does_not_hide_the_pickle_weights_beside_it(tiny_checkpoint,
                                                                                             pickle_checkpoint):
    """A `model.safetensors/` folder beside a real pytorch_model.bin took the safetensors path and was refused as
    "no weights found"."""
    (pickle_checkpoint / "model.safetensors").mkdir()
    loaded = load_model(pickle_checkpoint, progress=False, allow_pickle=True)
    assert torch.equal(logits(loaded.model), logits(load_model(tiny_checkpoint, progress=False).model))


class _RunsCode:
    def __reduce__(self):
        return (print, ("pickle code ran",))


@dataclasses.dataclass
class TrainingArguments:  # stands in for transformers' class, which a Trainer pickles into training_args.bin
    learning_rate: float = 2e-5


def _save_training_state(directory) -> None:
    """What transformers' Trainer writes beside a fine-tuned model's weights (save_model) and into its checkpoint-N
    folders: none of it weights, training_args.bin an object weights_only refuses."""
    torch.save(TrainingArguments(), directory / "training_args.bin")
    torch.save({"state": {}, "param_groups": [{"lr": 2e-5}]}, directory / "optimizer.pt")
    torch.save({"last_epoch": 3}, directory / "scheduler.pt")
    torch.save({"python": 1, "cpu": torch.zeros(4)}, directory / "rng_state.pth")


def test_a_trainers_training_state_beside_pickle_weights_is_left_out(tiny_checkpoint, pickle_checkpoint):
    """training_args.bin was read as a weight file: the load failed, refused by weights_only, though transformers
    and vLLM load such a fine-tuned model."""
    _save_training_state(pickle_checkpoint)
    loaded = load_model(pickle_checkpoint, progress=False, allow_pickle=True)
    assert torch.equal(logits(loaded.model), logits(load_model(tiny_checkpoint, progress=False).model))


def test_a_config_beside_training_state_alone_is_config_only(tiny_checkpoint, tmp_path):
    out = tmp_path / "no-weights"
    out.mkdir()
    for name in SIDE_FILES:
        shutil.copy(tiny_checkpoint / name, out / name)
    _save_training_state(out)
    assert is_config_only(out)


def test_a_pickle_that_would_run_code_is_refused_even_when_allowed(pickle_checkpoint, capsys):
    (pickle_checkpoint / "pytorch_model.bin").write_bytes(pickle.dumps({"x": _RunsCode()}))
    with pytest.raises(CheckpointError, match="weights_only=True") as err:
        load_model(pickle_checkpoint, progress=False, allow_pickle=True)
    assert "pickle code ran" not in capsys.readouterr().out
    assert "False" not in str(err.value) and "trust" not in str(err.value)  # no advice to unpickle it anyway


@pytest.mark.parametrize(("content", "problem"), [
    (b"hello world\n", "is not a PyTorch weights file: it begins b'hello world\\n'"),  # was a bare KeyError: 101
    (b"<!DOCTYPE html><html>Not Found</html>", "is not a PyTorch weights file: it begins b'<!DOCTYPE html><'"),
    (b"\0" * 4096, "is not a PyTorch weights file"),  # was torch's advice to load it with weights_only=False
    (b"", "is empty (0 bytes)"),  # was "not a readable PyTorch weights file: " and nothing after it
    (b"\x80\x02", "not a readable PyTorch weights file: the file ends early (EOFError)"),
    (b"\x80\x02h\x65", "not a readable PyTorch weights file: KeyError: 101"),  # was the KeyError's stack trace
])
def test_a_pickle_weights_file_that_is_no_torch_file_is_refused_in_one_line_naming_it(pickle_checkpoint, capsys,
                                                                                        content, problem):
    """An error page, a text or a cut-short download saved as pytorch_model.bin was "refused by
    torch.load(weights_only=True), which only admits tensors and plain containers: Unsupported operand 60", as if it
    held code, or a KeyError's stack trace from `glimmer inspect` and LLM(...)."""
    weights = pickle_checkpoint / "pytorch_model.bin"
    weights.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        load_model(pickle_checkpoint, progress=False, allow_pickle=True)
    assert str(err.value).startswith(str(weights)) and problem in str(err.value), str(err.value)
    assert "weights_only=True), which only admits" not in str(err.value)
    capsys.readouterr()
    assert main(["--log-level", "ERROR", "inspect", "--allow-pickle", str(pickle_checkpoint)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("glimmer: error: CheckpointError: ") and problem in error and "\n" not in error, error


def test_checkpoint_code_is_ignored_with_a_warning(tiny_checkpoint, tmp_path):
    out = tmp_path / "with-code"
    shutil.copytree(tiny_checkpoint, out)
    marker = tmp_path / "executed"
    (out / "modeling_muse.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"auto_map": {"AutoModel": "modeling_muse.Model"}}))
    opened = open_checkpoint(out)
    warnings = " ".join(opened.config.warnings)
    assert "modeling_muse.py" in warnings and "auto_map" in warnings and "never" in warnings
    load_model(opened, progress=False)
    assert not marker.exists()


def test_mmproj_is_refused_for_a_directory(tiny_checkpoint):
    with pytest.raises(CheckpointError, match="--mmproj.*GGUF models only"):
        open_checkpoint(tiny_checkpoint, mmproj=tiny_checkpoint / "config.json")


def test_a_file_that_is_not_gguf_is_refused(tiny_checkpoint):
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        open_checkpoint(tiny_checkpoint / "tokenizer.json")


def _legacy_weights_with_config(make_tiny, tmp_path, **config_fields):
    """The flat tiny config (plus `config_fields`) beside the same weights in the legacy HF layout."""
    from glimmer.checkpoint.config_layouts import load_config
    from glimmer.checkpoint.weight_layouts import LEGACY
    from glimmer.tiny import save_weights, to_weight_layout

    source = make_tiny("flat")
    out = tmp_path / "legacy-named"
    out.mkdir()
    for name in SIDE_FILES:
        shutil.copy(source / name, out / name)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | config_fields))
    save_weights(to_weight_layout(canonical_state(source), load_config(source), LEGACY), out)
    return out


def test_rope_flag_that_contradicts_the_weight_names_is_refused(make_tiny, tmp_path, capsys):
    checkpoint = _legacy_weights_with_config(make_tiny, tmp_path, rope_is_neox_style=False)
    with pytest.raises(CheckpointError, match=r"rope_is_neox_style=false says the q/k rows are interleaved.*legacy "
                                              r"weight layout, whose RoPE layout is rotate-half"):
        load_model(checkpoint, progress=False)
    assert main(["inspect", str(checkpoint)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rope_is_neox_style" in err[0]


def test_rope_flag_that_agrees_with_the_weight_names_loads(make_tiny, tmp_path):
    checkpoint = _legacy_weights_with_config(make_tiny, tmp_path, rope_is_neox_style=True)
    assert open_checkpoint(checkpoint).rope_layout == "rotate-half"
    assert open_checkpoint(make_tiny("native")).weight_layout == "native"  # its vendor config says false


def test_a_directory_holding_only_a_gguf_points_at_the_file(tiny_checkpoint, tmp_path, capsys):
    from gguf_export import export_text_gguf

    folder = tmp_path / "only-gguf"
    folder.mkdir()
    export_text_gguf(tiny_checkpoint, folder / "x.gguf")
    with pytest.raises(CheckpointError, match=r"no config\.json but holds the GGUF file x\.gguf.*pass the file itself"):
        open_checkpoint(folder)
    assert main(["inspect", str(folder)]) == 2
    assert "x.gguf" in capsys.readouterr().err


def test_a_gguf_repository_with_an_mmproj_points_at_the_model_file_and_the_mmproj_for_images(make_tiny, tmp_path):
    """QA: a directory as llama.cpp's multimodal GGUF repositories ship one (the model in each quantization beside
    mmproj-F16.gguf) was refused suggesting its first file by name, the mmproj, as the model: following it gave "this
    is a vision projector (mmproj) file"."""
    from gguf_export import export_mmproj_gguf, export_text_gguf

    checkpoint = make_tiny("canonical", vision=True)
    folder = tmp_path / "muse-glimmer-gguf"
    folder.mkdir()
    export_mmproj_gguf(checkpoint, folder / "mmproj-muse-glimmer-f16.gguf")
    export_text_gguf(checkpoint, folder / "muse-glimmer-f32.gguf")
    with pytest.raises(CheckpointError) as err:
        open_checkpoint(folder)
    assert str(err.value) == (
        f"{folder} has no config.json but holds the GGUF files mmproj-muse-glimmer-f16.gguf, muse-glimmer-f32.gguf; "
        f"a GGUF is a whole model: pass the file itself (e.g. {folder / 'muse-glimmer-f32.gguf'}), with "
        f"{folder / 'mmproj-muse-glimmer-f16.gguf'} as --mmproj / mmproj= for images")
    opened = open_checkpoint(folder / "muse-glimmer-f32.gguf", mmproj=folder / "mmproj-muse-glimmer-f16.gguf")
    assert opened.config.vision is not None


def _header_only_gguf(path, architecture: str):
    """A GGUF file of `architecture` with no tensors: all the directory's refusal reads of it."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(("files", "holds", "hint"), [
    ({"mmproj-x.gguf": "clip"}, "a vision projector (mmproj-x.gguf)",
     "with {folder}/mmproj-x.gguf as --mmproj / mmproj= for images"),
    ({"assistant.gguf": "dflash"}, "a DFlash drafter (assistant.gguf)",
     "with the drafter as the model of --speculative-config / speculative_config="),
], ids=["mmproj", "drafter"])
def test_a_directory_holding_only_a_projector_or_drafter_gguf_asks_for_the_models_file(tmp_path, files, holds, hint):
    """Review: with no model's file it suggested the projector (or drafter) itself as the model ("pass the file itself
    (e.g. only/mmproj-x.gguf), with --mmproj only/mmproj-x.gguf for images"), which then said it is no model."""
    folder = tmp_path / "only"
    folder.mkdir()
    for name, architecture in files.items():
        _header_only_gguf(folder / name, architecture)
    with pytest.raises(CheckpointError) as err:
        open_checkpoint(folder)
    assert str(err.value) == (f"{folder} has no config.json and holds only {holds}, no model's GGUF file: pass the "
                              f"model's GGUF file, {hint.format(folder=folder)}")


def test_a_directory_with_a_config_and_only_a_gguf_points_at_the_file_not_at_random_weights(tiny_checkpoint,
                                                                                              tmp_path):
    """QA: a config.json beside the GGUF (as some GGUF repositories ship) gave "no weights found ... pass
    --load-format dummy", which would serve random weights."""
    from gguf_export import export_text_gguf

    folder = tmp_path / "config-and-gguf"
    folder.mkdir()
    shutil.copy(tiny_checkpoint / "config.json", folder / "config.json")
    export_text_gguf(tiny_checkpoint, folder / "x.gguf")
    with pytest.raises(CheckpointError, match=r"has no safetensors or pickle weights but holds the GGUF file x\.gguf; "
                                              r"a GGUF is a whole model: pass the file itself") as err:
        open_checkpoint(folder)
    assert "dummy" not in str(err.value)


def test_a_config_only_directory_suggests_dummy_weights(tmp_path, capsys):
    out = tmp_path / "config-only"
    assert main(["make-tiny", str(out), "--config-only"]) == 0
    with pytest.raises(CheckpointError, match="no weights found") as refused:
        load_model(out, progress=False)
    assert "--load-format dummy" in str(refused.value)  # `glimmer inspect` has no such flag: it inspects it as is
    assert load_model(out, progress=False, load_format="dummy").weight_layout == "dummy"


@pytest.mark.parametrize("file", ["config.json", "generation_config.json", "tokenizer_config.json"])
@pytest.mark.parametrize(("text", "problem"), [
    pytest.param('{"model_type": ' + "9" * 5000 + "}", "integer string conversion", id="integer-of-5000-digits"),
    pytest.param("[" * 100_000, "recursion", id="nested-past-the-recursion-limit"),
])
def test_a_json_file_python_cannot_parse_is_one_line_of_error(tiny_checkpoint, tmp_path, capsys, file, text, problem):
    """JSON that Python's parser refuses with ValueError or RecursionError, not JSONDecodeError, was a traceback from
    `glimmer inspect` and `LLM(...)`."""
    out = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, out)
    (out / file).write_text(text)
    assert main(["--log-level", "ERROR", "inspect", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("glimmer: error: ") and f"{file} is not valid JSON" in error, error
    assert problem in error and "\n" not in error


@pytest.mark.parametrize("index", ["model.safetensors.index.json", "pytorch_model.bin.index.json"])
def test_an_index_nested_past_the_recursion_limit_is_refused_naming_it(tiny_checkpoint, pickle_checkpoint, tmp_path,
                                                                       index):
    out = tmp_path / "model"
    shutil.copytree(tiny_checkpoint if index.startswith("model") else pickle_checkpoint, out)
    (out / index).write_text("[" * 100_000)  # Python's parser raises RecursionError, not JSONDecodeError
    with pytest.raises(CheckpointError, match=f"{index} is not a valid .*index: maximum recursion depth"):
        open_checkpoint(out, allow_pickle=True)


def test_a_pickle_shard_that_is_a_broken_link_is_refused_naming_its_target(pickle_checkpoint, tmp_path):
    """QA: beside the shards a broken link was passed over (no weights at all: "no weights found ... run it with
    random weights"); it is refused, with or without --allow-pickle."""
    (pickle_checkpoint / "pytorch_model.bin").unlink()
    (pickle_checkpoint / "pytorch_model.bin").symlink_to(tmp_path / "gone.bin")
    for allow_pickle in (False, True):
        with pytest.raises(CheckpointError, match=rf"pytorch_model\.bin, a file of the checkpoint, is a symbolic link "
                                                  rf"to {tmp_path}/gone\.bin, a file that does not exist"):
            open_checkpoint(pickle_checkpoint, allow_pickle=allow_pickle)


def test_an_mmproj_that_is_a_broken_link_names_its_target(tiny_checkpoint, tmp_path):
    from gguf_export import export_text_gguf

    model = export_text_gguf(tiny_checkpoint, tmp_path / "model.gguf")
    (tmp_path / "mmproj.gguf").symlink_to(tmp_path / "gone.gguf")
    with pytest.raises(CheckpointError, match=rf"mmproj\.gguf is a symbolic link to {tmp_path}/gone\.gguf, a file that "
                                              "does not exist"):
        open_checkpoint(model, mmproj=tmp_path / "mmproj.gguf")


def test_a_pickle_index_that_is_a_broken_link_is_refused_naming_its_target(pickle_checkpoint):
    """A broken pytorch_model.bin.index.json was taken as absent: every *.bin file was read without it."""
    (pickle_checkpoint / "pytorch_model.bin.index.json").symlink_to("../../blobs/0123abcd")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin\.index\.json is a symbolic link to \.\./\.\./blobs"):
        open_checkpoint(pickle_checkpoint, allow_pickle=True)


def test_a_peft_adapter_passed_as_the_model_is_refused_saying_to_merge_it(tmp_path):
    """An adapter folder (adapter_config.json, adapter_model.safetensors) was "config.json: not found; a checkpoint
    directory must contain config.json", which says nothing of what the folder is or what to do with it."""
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    with pytest.raises(ConfigError, match=r"adapter_config\.json says this is a PEFT \(LoRA\) adapter, which Glimmer "
                                          r"does not apply: merge it into its base model"):
        open_checkpoint(adapter)


def test_a_folder_holding_the_checkpoint_further_down_names_it(tiny_checkpoint, tmp_path):
    """A Hugging Face cache's model folder (models--owner--name) passed for its snapshot."""
    snapshot = tmp_path / "models--owner--name" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_checkpoint, snapshot)
    with pytest.raises(ConfigError, match=re.escape(f"did you mean {snapshot}?")):
        open_checkpoint(tmp_path / "models--owner--name")
