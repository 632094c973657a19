"""A DFlash drafter GGUF written the way llama.cpp's converter writes one (MuseGlimmerAssistantModel: renames
only, target_layers + 1) reads back as the HF muse_glimmer_assistant config and state dict — checked by
loading both strictly into transformers' MuseGlimmerAssistantModel (the oracle) — and loads through the
drafter loader exactly as the HF drafter it came from."""

from __future__ import annotations

import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch

from glimmer.checkpoint.gguf_drafter import read_gguf_drafter
from glimmer.errors import CheckpointError

transformers = pytest.importorskip("transformers")

# the tiny drafter of architecture.md §12.3
CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, block_size=4, mask_token_id=500, target_layer_ids=[0, 2], bos_token_id=1, eos_token_id=2,
              pad_token_id=3, sliding_window=8, rms_norm_eps=1e-5, max_position_embeddings=256,
              rope_parameters={"rope_type": "default", "rope_theta": 500000.0})


def write_drafter_gguf(path, state, config, *, extra_tensor: bool = False, extra_keys: dict | None = None,
                       with_pattern: bool = True):
    writer = gguf.GGUFWriter(path, "dflash")
    for key, (value, value_type) in (extra_keys or {}).items():
        writer.add_key_value(key, value, value_type)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_uint32("dflash.block_size", config["block_size"])
    writer.add_array("dflash.target_layers", [t + 1 for t in config["target_layer_ids"]])
    writer.add_sliding_window(config["sliding_window"])
    if with_pattern:
        writer.add_sliding_window_pattern([True] * config["num_hidden_layers"])
    writer.add_uint32("tokenizer.ggml.mask_token_id", config["mask_token_id"])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    renames = {"norm.weight": "output_norm.weight", "encoder.fc.weight": "fc.weight",
               "encoder.output_norm_enc.weight": "enc.output_norm.weight"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, tensor in state.items():
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            stored = f"blk.{i}.{layer[rest.removesuffix('.weight')]}.weight"
        else:
            stored = renames[name]
        writer.add_tensor(stored, tensor.numpy().astype(np.float32))
    if extra_tensor:
        writer.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def reference():
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    torch.manual_seed(0)
    model = MuseGlimmerAssistantModel(MuseGlimmerAssistantConfig(**CONFIG))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter))
    return model


def test_drafter_gguf_gives_the_assistant_config_and_state_dict(reference, tmp_path):
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    drafter = read_gguf_drafter(write_drafter_gguf(tmp_path / "drafter.gguf", state, CONFIG))
    assert drafter.warnings == []
    config, tensors = drafter.config, drafter.tensors
    loaded = {name: tensors.read(name) for name in tensors.names()}
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    rebuilt = MuseGlimmerAssistantConfig(**{k: v for k, v in config.items() if k != "model_type"})
    for field in ("hidden_size", "num_key_value_heads", "head_dim", "block_size", "mask_token_id", "target_layer_ids",
                  "sliding_window", "layer_types", "rope_parameters", "pad_token_id"):
        assert getattr(rebuilt, field) == getattr(reference.config, field), field
    MuseGlimmerAssistantModel(rebuilt).load_state_dict(loaded, strict=True)


def test_a_drafter_with_an_embedding_is_refused(reference, tmp_path):
    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    path = write_drafter_gguf(tmp_path / "d.gguf", state, CONFIG, extra_tensor=True)
    with pytest.raises(CheckpointError) as err:
        read_gguf_drafter(path)
    assert "unexpected tensors (1):\n    token_embd.weight [" in str(err.value)
    assert str(err.value).endswith("fix: a DFlash drafter borrows the target's embedding and LM head and holds no "
                                   "others: load the drafter GGUF published for the model, or convert the Hugging "
                                   "Face checkpoint again with llama.cpp's convert_hf_to_gguf.py")


def test_a_drafter_asking_for_scaled_rope_is_refused_by_its_key(reference, tmp_path):
    """As the target's (test_gguf.py): llama.cpp would scale the drafter's RoPE positions, Glimmer ran them unscaled."""
    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    path = write_drafter_gguf(tmp_path / "d.gguf", state, CONFIG, extra_keys={
        "dflash.rope.scaling.factor": (8.0, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(CheckpointError, match=r"dflash\.rope\.scaling\.factor=8\.0 asks for RoPE positions scaled"):
        read_gguf_drafter(path)


def test_a_drafter_block_count_no_model_has_is_refused_by_its_key_before_its_layers_are_listed(reference, tmp_path):
    """QA: dflash.block_count=10**9 without attention.sliding_window_pattern made a list of 10**9 layer kinds (8 GB)
    before anything was checked. Read in a subprocess under an address-space cap, so the old behaviour fails with a
    MemoryError, not the machine."""
    import resource

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    path = write_drafter_gguf(tmp_path / "d.gguf", state, CONFIG | {"num_hidden_layers": 10**9}, with_pattern=False)
    code = ("import sys\n"
            "from glimmer.checkpoint.gguf_drafter import read_gguf_drafter\n"
            "from glimmer.errors import CheckpointError\n"
            "try:\n"
            "    read_gguf_drafter(sys.argv[1])\n"
            "except CheckpointError as error:\n"
            "    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                            preexec_fn=cap_memory)
    assert "dflash.block_count=1000000000 is more layers than Glimmer builds (at most 4096; the release's drafter " \
           "has 5)" in result.stdout, result.stdout + result.stderr[-2000:]


@pytest.mark.parametrize(("change", "expected"), [
    ({"block_size": 1}, "dflash.block_size=1 is invalid; expected an integer >= 2"),
    ({"max_position_embeddings": 0}, "dflash.context_length=0 is invalid; expected a positive integer"),
    ({"num_key_value_heads": 3}, "dflash.attention.head_count=4 is not a multiple of dflash.attention.head_count_kv=3"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}},
     "dflash.rope.freq_base=0.0 is invalid; expected a positive finite number"),
], ids=["block-size", "context-length", "head-counts", "rope-theta"])
def test_a_bad_drafter_value_is_named_by_its_gguf_key(reference, tmp_path, change, expected):
    """QA: errors about a drafter GGUF's values named config.json's fields (`block_size=1`,
    `max_position_embeddings=0`), which the file does not hold."""
    from glimmer.checkpoint.drafter import open_drafter_checkpoint
    from glimmer.errors import ConfigError

    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    if "num_key_value_heads" in change:  # k and v of 3 heads, so the tensors fit the metadata
        for name in [n for n in state if n.endswith(("k_proj.weight", "v_proj.weight"))]:
            state[name] = torch.zeros(3 * CONFIG["head_dim"], CONFIG["hidden_size"])
    path = write_drafter_gguf(tmp_path / "d.gguf", state, CONFIG | change)
    with pytest.raises(ConfigError) as err:
        open_drafter_checkpoint(path, mask_token_id=lambda: 500)
    assert str(err.value).startswith(f"{path}: {expected}"), str(err.value)


def test_drafter_gguf_keys_glimmer_does_not_read_are_named_in_a_warning(reference, tmp_path):
    """QA: a drafter GGUF's dflash.* keys Glimmer does not read (an expert count, a vocabulary size) were ignored
    without a word, where a model GGUF's muse-glimmer.* ones are named in a warning; the drafter's value_length, which
    the converter writes, is read, and one other than key_length refused as the model's is."""
    from glimmer.checkpoint.drafter import open_drafter_checkpoint

    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    good = open_drafter_checkpoint(write_drafter_gguf(tmp_path / "good.gguf", state, CONFIG), mask_token_id=lambda: 500)
    assert not [w for w in good.config.warnings if "does not read" in w]
    path = write_drafter_gguf(tmp_path / "d.gguf", state, CONFIG, extra_keys={
        "dflash.expert_count": (8, gguf.GGUFValueType.UINT32),
        "dflash.vocab_size": (512, gguf.GGUFValueType.UINT32)})
    warnings = open_drafter_checkpoint(path, mask_token_id=lambda: 500).config.warnings
    assert f"{path}: ignoring metadata keys Glimmer does not read: dflash.expert_count, dflash.vocab_size" in warnings
    other = write_drafter_gguf(tmp_path / "v.gguf", state, CONFIG, extra_keys={
        "dflash.rope.dimension_count": (8, gguf.GGUFValueType.UINT32)})
    with pytest.raises(CheckpointError, match=r"dflash\.rope\.dimension_count=8 differs from attention\.key_length=16"):
        read_gguf_drafter(other)


def test_drafter_gguf_keys_that_took_defaults_are_named_as_the_file_names_them(reference, tmp_path):
    """QA: a drafter GGUF without dflash.attention.sliding_window or tokenizer.ggml.mask_token_id ran with the defaults,
    said in a warning naming config.json's fields, `sliding_window, mask_token_id`, which the file does not have."""
    from test_gguf_hostile import _rewrite

    from glimmer.checkpoint.drafter import open_drafter_checkpoint

    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    full = write_drafter_gguf(tmp_path / "full.gguf", state, CONFIG)
    path = _rewrite(full, tmp_path / "d.gguf", {}, drop=("dflash.attention.sliding_window",
                                                         "tokenizer.ggml.mask_token_id"))
    config = open_drafter_checkpoint(path, mask_token_id=lambda: 500).config
    assert config.warnings == (  # review: in the model GGUF's words, not "absent fields took transformers' defaults"
        f"{path}: metadata keys absent from the GGUF took the reference defaults: dflash.attention.sliding_window, "
        "tokenizer.ggml.mask_token_id",)
    assert (config.sliding_window, config.mask_token_id) == (2048, 500)


def test_a_drafter_gguf_that_does_not_fit_the_target_is_named_with_its_key(make_tiny, tmp_path):
    """QA: "the drafter does not fit the target model: mask_token_id=999 ..." named neither the drafter nor the key
    the GGUF holds the id under."""
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    from glimmer.checkpoint.config_layouts import load_config
    from glimmer.engine.model_loader import load_drafter
    from glimmer.errors import ConfigError

    target = make_tiny()
    torch.manual_seed(0)
    config = CONFIG | {"target_layer_ids": [0, 2], "mask_token_id": 999}
    state = MuseGlimmerAssistantModel(MuseGlimmerAssistantConfig(**config)).state_dict()
    path = write_drafter_gguf(tmp_path / "d.gguf", state, config)
    with pytest.raises(ConfigError) as err:
        load_drafter(path, load_config(target), lambda: 0, progress=False)
    assert str(err.value) == (f"{path}: the drafter does not fit the target model: tokenizer.ggml.mask_token_id=999 "
                              "is outside the target's vocabulary [0, 512)")


def test_a_drafter_is_not_taken_for_a_model(reference, tmp_path):
    from glimmer.engine.model_loader import load_model

    state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    path = write_drafter_gguf(tmp_path / "d.gguf", state, CONFIG)
    with pytest.raises(CheckpointError, match="DFlash drafter GGUF"):
        load_model(path, progress=False)


def test_drafter_loader_reads_a_gguf_like_the_hf_drafter(make_tiny, tmp_path):
    import json

    from safetensors.torch import load_file

    from glimmer.checkpoint.config_layouts import load_config
    from glimmer.checkpoint.drafter import RELEASED_MASK_TOKEN
    from glimmer.engine.model_loader import load_drafter
    from glimmer.engine.tokenizer import Tokenizer
    from glimmer.tiny import write_tiny_drafter

    target = make_tiny()
    hf = write_tiny_drafter(tmp_path / "hf", target, seed=3)
    config = json.loads((hf / "config.json").read_text())
    state = {}
    for shard in sorted(hf.glob("*.safetensors")):
        state |= load_file(shard)
    config.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 500000.0})
    config.setdefault("rms_norm_eps", 1e-5)
    config.setdefault("max_position_embeddings", 131072)
    path = write_drafter_gguf(tmp_path / "drafter.gguf", state, config | {"pad_token_id": 0, "bos_token_id": 0,
                                                                            "eos_token_id": 0})
    tokenizer = Tokenizer.from_dir(target)

    def load(p):
        return load_drafter(p, load_config(target), lambda: tokenizer.require_token_id(RELEASED_MASK_TOKEN),
                            progress=False)

    from_gguf, from_hf = load(path), load(hf)
    assert from_gguf.config == from_hf.config
    for (name, a), (_, b) in zip(from_gguf.model.state_dict().items(), from_hf.model.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name
