"""GGUF checkpoints (architecture.md §15.2): tiny safetensors checkpoints written as GGUF with gguf.GGUFWriter
following llama.cpp's converter (gguf_export.py), read back through Glimmer's public loaders.

Float types are exact: the loaded parameters give bitwise-identical logits (the +1-folded norms unfold to
the very 1 + w the model forms). Quantized types are checked against each quantizer's own bound, in units
of the quantization step of the weight's (sub-)block read from the packed bytes (STEP_BOUND): half a step
for the rounding quantizers; one step for Q4_0 / Q5_0, whose levels −8..7 (−16..15) are scaled to the
largest magnitude so a value of the opposite sign clips at the last level; and a little over half where
gguf stores the block scale (and offset) in float16 after choosing the levels (≤ 127·2⁻¹¹ of a step).
The loaded weights come through Glimmer's reader (dequantize, then un-permute q/k, in canonical order).
(Logits are not compared for quantized files: a tiny random model is chaotic — weight noise of Q8_0's size
moves its logits by ~0.5 — so only the weights carry a meaningful bound.)
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf_export import block_steps, canonical_state, export_text_gguf

from glimmer.checkpoint.formats import open_checkpoint
from glimmer.checkpoint.gguf_file import GGUFFile
from glimmer.checkpoint.gguf_model import read_gguf_model
from glimmer.checkpoint.tiny_tokenizer import TRAINING_CORPUS
from glimmer.checkpoint.weight_layouts import interleaved_to_rotate_half
from glimmer.engine.llm import LLM
from glimmer.engine.model_loader import load_model
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import CheckpointError
from glimmer.model.context import ForwardContext
from glimmer.tiny import TinySpec, write_tiny_checkpoint

IDS = list(range(3, 70))
K_SPEC = TinySpec(hidden_size=256, intermediate_size=512, num_hidden_layers=4, head_dim=64, sliding_window=16)
# what a GGUF loads is checked here, not which CPU kernels run it: the kernels an engine's load would time are fixed
# (conftest.py)
pytestmark = pytest.mark.usefixtures("same_cpu_kernels")


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(IDS), ForwardContext.without_cache([len(IDS)])))


@pytest.fixture(scope="module")
def f32_gguf(tiny_checkpoint, tmp_path_factory) -> Path:
    return export_text_gguf(tiny_checkpoint, tmp_path_factory.mktemp("gguf") / "model-f32.gguf")


@pytest.fixture(scope="module")
def vision_ggufs(make_tiny, tmp_path_factory) -> tuple[Path, Path]:
    """(the model GGUF, its mmproj GGUF) of the tiny vision checkpoint, F32; a test that changes one copies it."""
    from gguf_export import export_mmproj_gguf

    checkpoint = make_tiny("canonical", vision=True)
    directory = tmp_path_factory.mktemp("vision-gguf")
    return (export_text_gguf(checkpoint, directory / "model.gguf"),
            export_mmproj_gguf(checkpoint, directory / "mmproj.gguf"))


@pytest.fixture(scope="module")
def llms(tiny_checkpoint, f32_gguf, same_cpu_kernels_in_module) -> tuple[LLM, LLM]:
    """(from the safetensors directory, from its F32 GGUF), their kernels fixed as the module's tests' are (a
    module-scoped fixture is set up before the tests' own `same_cpu_kernels`)."""
    return LLM(str(tiny_checkpoint)), LLM(str(f32_gguf))


def test_f32_gguf_gives_the_safetensors_logits_exactly(tiny_checkpoint, f32_gguf):
    from_gguf = load_model(f32_gguf, progress=False)
    assert torch.equal(logits(from_gguf.model), logits(load_model(tiny_checkpoint, progress=False).model))
    assert from_gguf.weight_layout == "gguf"  # the file's own names, as inspect reports them


def test_a_split_gguf_gives_the_whole_files_logits_exactly(f32_gguf, tmp_path):
    """Tensors in either part of a gguf-split file are read from their own part (the hostile cases cover broken
    splits)."""
    from test_gguf_hostile import split_in_two

    first, second = split_in_two(f32_gguf, tmp_path / "split")
    file = GGUFFile(second)
    assert file.path == first and file.parts == (first, second) and set(file.tensors) == set(GGUFFile(f32_gguf).tensors)
    assert torch.equal(logits(load_model(second, progress=False).model),
                       logits(load_model(f32_gguf, progress=False).model))


@pytest.mark.parametrize("dtype, qtype", [(torch.bfloat16, Q.BF16), (torch.float16, Q.F16)])
def test_half_precision_gguf_equals_the_same_precision_checkpoint(tmp_path, dtype, qtype):
    checkpoint = write_tiny_checkpoint(tmp_path / "ck", seed=4, dtype=dtype)
    path = export_text_gguf(checkpoint, tmp_path / "m.gguf", qtype)
    file = GGUFFile(path)
    assert {file.tensors[n].type_name for n in ("token_embd.weight", "blk.0.attn_q.weight")} == {qtype.name}
    assert torch.equal(logits(load_model(path, progress=False).model),
                       logits(load_model(checkpoint, progress=False).model))


def test_greedy_tokens_and_stop_ids_match_the_safetensors_checkpoint(llms):
    """Through LLM: same tokens; stops are eos + eot, never eom (P-TOK-2); template from the metadata."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    from_dir, from_gguf = llms
    prompt = "The lighthouse keeper wrote"
    assert from_gguf.generate(prompt, params)[0].outputs[0].token_ids == \
        from_dir.generate(prompt, params)[0].outputs[0].token_ids
    tokenizer = from_gguf.get_tokenizer()
    stops = from_gguf.engine.generation_defaults.stop_token_ids
    assert stops == (tokenizer.token_to_id("<|end_of_text|>"), tokenizer.token_to_id("<|eot|>"))
    assert stops == from_dir.engine.generation_defaults.stop_token_ids
    assert from_gguf.engine.chat_template.source == from_dir.engine.chat_template.source


def test_vllm_quantization_gguf_is_taken_for_a_gguf_only(f32_gguf, tiny_checkpoint):
    """QA: vLLM's quantization="gguf" (`--quantization gguf`), which vLLM takes with a GGUF model (it sets it itself),
    was refused "leave it out", though the README takes a vLLM argument whose value changes nothing, as it takes
    "compressed-tensors" with such a checkpoint; with another checkpoint it is still refused."""
    from glimmer.cli import _VLLM_SERVE_OPTIONS, UsageError, _check_vllm_options, build_parser
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS
    from glimmer.errors import UnsupportedArgumentError

    llm = LLM(str(f32_gguf), quantization="gguf")
    assert llm.generate([IDS[:8]], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids
    _check_vllm_options(build_parser().parse_args(["serve", str(f32_gguf), "--quantization", "gguf"]),
                        _VLLM_SERVE_OPTIONS, VLLM_ONLY_LLM_ARGUMENTS)
    with pytest.raises(UnsupportedArgumentError, match=r"quantization: .*or 'gguf' with a GGUF model"):
        LLM(str(tiny_checkpoint), quantization="gguf")
    with pytest.raises(UsageError, match=r"--quantization gguf: .*or 'gguf' with a GGUF model"):
        _check_vllm_options(build_parser().parse_args(["serve", str(tiny_checkpoint), "--quantization", "gguf"]),
                            _VLLM_SERVE_OPTIONS, VLLM_ONLY_LLM_ARGUMENTS)


def test_tokenizer_round_trip_is_identical_to_the_safetensors_tokenizer(tiny_checkpoint, llms):
    expected = Tokenizer.from_dir(tiny_checkpoint)
    rebuilt = llms[1].get_tokenizer()
    specials = "<|begin_of_text|><|start|>assistant<|message|>hi<|eom|><|eot|><|patch|><|end_of_text|>"
    corpus = [TRAINING_CORPUS, specials, "  leading spaces\n\n\ttabs 12345 ÿ😀 ½", specials + TRAINING_CORPUS[:300]]
    for text in corpus:
        for add_special in (False, True):
            ids = expected.encode(text, add_special_tokens=add_special)
            assert rebuilt.encode(text, add_special_tokens=add_special) == ids
            assert rebuilt.decode(ids) == expected.decode(ids)
    assert rebuilt.vocab_size == expected.vocab_size
    assert rebuilt.tokenizer.all_special_ids == expected.all_special_ids
    assert rebuilt.special_tokens == expected.special_tokens
    assert [rebuilt.token_bytes(i) for i in range(expected.vocab_size)] == \
        [expected.token_bytes(i) for i in range(expected.vocab_size)]



@pytest.mark.parametrize("add_bos", [True, False])
def test_add_eos_token_appends_eos_to_a_prompt_as_llama_cpp_does(f32_gguf, tmp_path, add_bos):
    """QA: tokenizer.ggml.add_eos_token=true was ignored without a word; llama.cpp and transformers append EOS to a
    prompt tokenized with its special tokens when the file says so (a chat prompt, rendered, gets none)."""
    from test_gguf_hostile import _rewrite

    path = _rewrite(f32_gguf, tmp_path / "add-eos.gguf", {"tokenizer.ggml.add_bos_token": add_bos},
                    add={"tokenizer.ggml.add_eos_token": (True, gguf.GGUFValueType.BOOL)})
    tokenizer = LLM(str(path)).get_tokenizer()
    plain = tokenizer.encode("The sea", add_special_tokens=False)
    expected = [tokenizer.bos_token_id] * add_bos + plain + [tokenizer.eos_token_id]
    assert tokenizer.encode("The sea", add_special_tokens=True) == expected

CLASSIC = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
K_QUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
STEP_BOUND = {Q.Q8_0: 0.57, Q.Q4_0: 1.07, Q.Q5_0: 1.07, Q.Q4_1: 0.6, Q.Q5_1: 0.6} | dict.fromkeys(K_QUANTS, 0.5)


@pytest.fixture(scope="module")
def k_checkpoint(make_tiny) -> Path:
    return make_tiny(spec=K_SPEC, seed=5)


@pytest.mark.parametrize("qtype", CLASSIC + K_QUANTS, ids=lambda q: q.name)
def test_quantized_weights_are_within_half_a_step_of_the_originals(make_tiny, k_checkpoint, tmp_path, qtype):
    checkpoint = k_checkpoint if qtype in K_QUANTS else make_tiny(seed=5)
    path = export_text_gguf(checkpoint, tmp_path / f"m-{qtype.name}.gguf", qtype)
    reader = gguf.GGUFReader(path)
    stored = {t.name: t for t in reader.tensors}
    model = load_model(path, progress=False).model
    loaded = model.state_dict()
    original = canonical_state(checkpoint)
    config = model.config.text
    assert stored["blk.0.attn_q.weight"].tensor_type == qtype  # rows of 64 or 256 values: no fallback
    checked = 0
    for name, tensor in original.items():
        layer = name.split(".")[3] if ".layers." in name else None
        short = name.rsplit(".", 2)[-2]
        source = {"embed_tokens": "token_embd.weight", "lm_head": "output.weight"}.get(short)
        source = source or {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
                            "gate_proj": "attn_gate" if "self_attn" in name else "ffn_gate", "up_proj": "ffn_up",
                            "down_proj": "ffn_down"}.get(short)
        if source is None or tensor.dim() != 2:
            continue
        raw = stored[source if layer is None else f"blk.{layer}.{source}.weight"]
        step = torch.from_numpy(block_steps(raw.data, raw.tensor_type)).reshape(tensor.shape)
        if short in ("q_proj", "k_proj"):
            heads = config.num_attention_heads if short == "q_proj" else config.num_key_value_heads
            step = interleaved_to_rotate_half(step, heads)
        assert ((loaded[name] - tensor).abs() <= STEP_BOUND[raw.tensor_type] * step + 1e-7).all(), name
        checked += 1
    assert checked == 2 + 8 * config.num_hidden_layers  # every matrix: the embedding, lm_head and 8 per layer


def test_a_nan_weight_is_refused_naming_the_files_own_tensor_too(tiny_checkpoint, tmp_path):
    """The canonical name leads to the model's code, the file's own name (`blk.2.ffn_up.weight`) to the bytes: a
    Q8_0 block whose float16 scale is NaN dequantizes to 32 NaN."""
    good = export_text_gguf(tiny_checkpoint, tmp_path / "q8.gguf", Q.Q8_0)
    tensor = next(t for t in gguf.GGUFReader(good).tensors if t.name == "blk.2.ffn_up.weight")
    data = bytearray(good.read_bytes())
    data[tensor.data_offset : tensor.data_offset + 2] = np.float16("nan").tobytes()  # the first block's scale
    damaged = tmp_path / "q8-nan.gguf"
    damaged.write_bytes(data)
    with pytest.raises(CheckpointError) as err:
        load_model(damaged, progress=False)
    assert str(err.value).startswith(
        "parameter model.language_model.layers.2.mlp.up_proj.weight (checkpoint tensor "
        f"'model.language_model.layers.2.mlp.up_proj.weight', stored as 'blk.2.ffn_up.weight' in {damaged}) holds 32 "
        "NaN and 0 infinite value(s)")


def test_a_nan_weight_of_a_split_gguf_names_the_part_that_holds_it(tiny_checkpoint, tmp_path):
    """Every tensor was said to be in the first part, whatever part held it: a NaN in part 2 of 2 sent the user to
    download part 1 again."""
    from test_gguf_hostile import split_in_two

    first, second = split_in_two(export_text_gguf(tiny_checkpoint, tmp_path / "q8.gguf", Q.Q8_0), tmp_path / "split")
    tensor = next(t for t in gguf.GGUFReader(second).tensors if t.name.endswith("ffn_up.weight"))
    data = bytearray(second.read_bytes())
    data[tensor.data_offset : tensor.data_offset + 2] = np.float16("nan").tobytes()  # the first block's scale
    second.write_bytes(data)
    with pytest.raises(CheckpointError) as err:
        load_model(first, progress=False)
    layer = tensor.name.split(".")[1]
    assert str(err.value).startswith(
        f"parameter model.language_model.layers.{layer}.mlp.up_proj.weight (checkpoint tensor "
        f"'model.language_model.layers.{layer}.mlp.up_proj.weight', stored as '{tensor.name}' in {second}) holds 32 "
        "NaN and 0 infinite value(s)")


def test_a_tensor_of_the_wrong_shape_is_reported_once(f32_gguf, tmp_path):
    """A tensor the file has, in the wrong shape, is a shape problem, not also an unexpected tensor."""
    from test_gguf_hostile import _rewrite

    up = next(t for t in gguf.GGUFReader(f32_gguf).tensors if t.name == "blk.0.ffn_up.weight")
    transposed = _rewrite(f32_gguf, tmp_path / "transposed.gguf", {},
                          replace_tensors={up.name: (np.ascontiguousarray(up.data.T), up.tensor_type)})
    with pytest.raises(CheckpointError) as err:
        load_model(transposed, progress=False)
    assert str(err.value).splitlines()[:3] == [
        f"{transposed}: the tensors do not match the metadata: 1 of the wrong shape", "  shape mismatches (1):",
        "    blk.0.ffn_up.weight: expected shape [128, 64], found [64, 128]"]


_STRING, _FLOAT = gguf.GGUFValueType.STRING, gguf.GGUFValueType.FLOAT32


@pytest.mark.parametrize(("scaling", "refusal"), [
    ({"rope.scaling.type": ("linear", _STRING), "rope.scaling.factor": (4.0, _FLOAT)},
     "muse-glimmer.rope.scaling.factor=4.0 asks for RoPE positions scaled by 1/4.0, which Glimmer does not run"),
    ({"rope.scale_linear": (2.0, _FLOAT)}, "muse-glimmer.rope.scale_linear=2.0 asks for RoPE positions scaled"),
    ({"rope.scaling.type": ("yarn", _STRING), "rope.scaling.factor": (1.0, _FLOAT)},
     "muse-glimmer.rope.scaling.type='yarn' is not supported"),
], ids=["linear", "legacy-linear", "yarn"])
def test_a_gguf_asking_for_scaled_rope_is_refused_by_its_key(f32_gguf, tmp_path, scaling, refusal):
    """llama.cpp scales RoPE positions by what these keys say; Glimmer read none of them and ran such a file unscaled,
    a silently other model (a config.json asking for scaling is refused)."""
    from test_gguf_hostile import _rewrite

    path = _rewrite(f32_gguf, tmp_path / "scaled.gguf", {}, add={f"muse-glimmer.{k}": v for k, v in scaling.items()})
    with pytest.raises(CheckpointError) as err:
        load_model(path, progress=False)
    assert str(err.value).startswith(f"{path}: {refusal}")
    assert str(err.value).endswith("Muse Glimmer's RoPE is unscaled ('default'): use a GGUF converted without RoPE "
                                   "scaling")


def test_a_gguf_whose_rope_scaling_keys_scale_nothing_loads(f32_gguf, tmp_path):
    """What converters write for plain RoPE: type none or linear, a factor of 1 or 0 (llama.cpp's "unset")."""
    from test_gguf_hostile import _rewrite

    path = _rewrite(f32_gguf, tmp_path / "unscaled.gguf", {}, add={
        "muse-glimmer.rope.scaling.type": ("linear", _STRING), "muse-glimmer.rope.scaling.factor": (1.0, _FLOAT),
        "muse-glimmer.rope.scale_linear": (0.0, _FLOAT)})
    assert torch.equal(logits(load_model(path, progress=False).model),
                       logits(load_model(f32_gguf, progress=False).model))


@pytest.mark.parametrize(("key", "value", "refusal"), [
    ("attn_logit_softcapping", (50.0, _FLOAT), "attn_logit_softcapping=50.0 is not supported; Muse Glimmer has no "
                                               "attention-logit softcapping"),
    ("attention.causal", (False, gguf.GGUFValueType.BOOL), "attention.causal=False is not supported; Muse Glimmer "
                                                           "has no bidirectional attention"),
], ids=["attention-softcap", "bidirectional"])
def test_a_gguf_key_asking_for_a_feature_muse_glimmer_lacks_is_refused_by_its_key(f32_gguf, tmp_path, key, value,
                                                                                 refusal):
    """QA: llama.cpp caps the attention logits where attn_logit_softcapping is set; Glimmer ignored the key without a
    word and ran the file uncapped, where config.json's attn_logit_softcapping (and use_bidirectional_attention) is
    refused."""
    from test_gguf_hostile import _rewrite

    path = _rewrite(f32_gguf, tmp_path / "feature.gguf", {}, add={f"muse-glimmer.{key}": value})
    with pytest.raises(CheckpointError) as err:
        read_gguf_model(path)
    assert str(err.value) == f"{path}: muse-glimmer.{refusal}: remove the key or convert the Hugging Face " \
                             "checkpoint again with llama.cpp's convert_hf_to_gguf.py"


def test_gguf_keys_glimmer_does_not_read_are_named_in_a_warning(f32_gguf, tmp_path):
    """QA: muse-glimmer.expert_count and the like were ignored without a word, where config.json's unknown keys are
    named in a warning; the keys for features left off (a softcap of 0, causal attention) are read silently."""
    from test_gguf_hostile import _rewrite

    assert not [w for w in read_gguf_model(f32_gguf).config.warnings if "does not read" in w]  # the converter's
    path = _rewrite(f32_gguf, tmp_path / "unread.gguf", {}, add={
        "muse-glimmer.expert_count": (8, gguf.GGUFValueType.UINT32),
        "muse-glimmer.attn_logit_softcapping": (0.0, _FLOAT),
        "muse-glimmer.attention.causal": (True, gguf.GGUFValueType.BOOL),
        "muse-glimmer.shared_kv_layers": (2, gguf.GGUFValueType.UINT32)})
    assert f"{path}: ignoring metadata keys Glimmer does not read: muse-glimmer.expert_count, " \
           "muse-glimmer.shared_kv_layers" in read_gguf_model(path).config.warnings


def test_a_tool_use_chat_template_other_than_the_default_is_refused_for_chat(f32_gguf, tmp_path):
    """llama.cpp's converter writes a checkpoint's named templates as tokenizer.chat_template.NAME, and llama.cpp
    renders a chat with tools with tokenizer.chat_template.tool_use (as transformers does); Glimmer rendered it with
    the default, without a word. One equal to the default is read."""
    from test_gguf_hostile import _rewrite

    key = "tokenizer.chat_template.tool_use"
    default = GGUFFile(f32_gguf).string("tokenizer.chat_template")
    other = _rewrite(f32_gguf, tmp_path / "tool-use.gguf", {}, add={
        key: ("{{ bos_token }}<|start|>assistant", gguf.GGUFValueType.STRING)})
    llm = LLM(str(other))
    assert llm.generate("hi", SamplingParams(max_tokens=1))[0].outputs[0].token_ids  # completions need no template
    with pytest.raises(CheckpointError, match=rf"'tool_use' chat template \({other} \({key}\)\)"):
        llm.chat([{"role": "user", "content": "hi"}])
    same = _rewrite(f32_gguf, tmp_path / "same.gguf", {}, add={key: (default, gguf.GGUFValueType.STRING)})
    assert LLM(str(same)).chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1))


@pytest.mark.parametrize(("period", "full_layers"), [(4, [3, 7]), (3, [2, 5]), (0, [])])
def test_a_sliding_window_period_gives_llama_cpps_layer_types(f32_gguf, tmp_path, period, full_layers):
    """llama.cpp's muse-glimmer loader reads attention.sliding_window_pattern as a period before it tries the bool
    array (set_swa_pattern: the last of every `period` layers is full attention); Glimmer refused the period as
    "expected an array of bools", so a file llama.cpp runs did not load."""
    from test_gguf_hostile import _rewrite

    key = "muse-glimmer.attention.sliding_window_pattern"
    path = _rewrite(f32_gguf, tmp_path / f"period-{period}.gguf", {}, drop=(key,),
                    add={key: (period, gguf.GGUFValueType.UINT32)})
    text = load_model(path, progress=False).config.text
    assert [i for i, kind in enumerate(text.layer_types) if kind == "full_attention"] == full_layers
    assert text.rope_layers == tuple(kind == "sliding_attention" for kind in text.layer_types)  # RoPE where it slides
    if period == 4:  # the tiny model's own pattern: the same model as the bool array gives
        assert torch.equal(logits(load_model(path, progress=False).model),
                           logits(load_model(f32_gguf, progress=False).model))


@pytest.mark.parametrize("window", [16.5, float("nan")], ids=["fraction", "nan"])
def test_a_sliding_window_that_is_not_an_integer_is_refused_naming_the_key(f32_gguf, tmp_path, window):
    """llama.cpp reads attention.sliding_window as a UINT32; Glimmer read any number and cut it to an integer, so a
    window of 16.5 ran as 16, a silently other model, and a NaN failed with a bare ValueError."""
    from test_gguf_hostile import _rewrite

    key = "muse-glimmer.attention.sliding_window"
    path = _rewrite(f32_gguf, tmp_path / "float-window.gguf", {}, drop=(key,), add={key: (window, _FLOAT)})
    with pytest.raises(CheckpointError) as err:
        load_model(path, progress=False)
    assert str(err.value) == f"{path}: metadata {key} is FLOAT32, expected an integer"


@pytest.mark.parametrize(("change", "refusal"), [
    ({"muse-glimmer.final_logit_softcapping": 0.0},
     "muse-glimmer.final_logit_softcapping=0.0 is invalid; expected a positive finite number"),
    ({"muse-glimmer.attention.layer_norm_rms_epsilon": float("inf")},
     "muse-glimmer.attention.layer_norm_rms_epsilon=inf is invalid; expected a positive finite number"),
    ({"muse-glimmer.attention.head_count_kv": 3},
     "muse-glimmer.attention.head_count=4 is not a multiple of muse-glimmer.attention.head_count_kv=3"),
], ids=["softcap", "eps", "heads"])
def test_an_invalid_metadata_value_is_named_by_its_gguf_key(f32_gguf, tmp_path, change, refusal):
    """QA: a value the config refuses was named by the config.json field it became (text_config.final_logit_softcapping,
    text_config.num_attention_heads), which a GGUF does not have, not by the metadata key that holds it."""
    from test_gguf_hostile import _rewrite

    path = _rewrite(f32_gguf, tmp_path / "invalid.gguf", change)
    with pytest.raises(CheckpointError) as err:
        read_gguf_model(path)
    assert str(err.value).startswith(f"{path}: the metadata describes an invalid model: {refusal}")
    assert "text_config" not in str(err.value)


def test_an_invalid_mmproj_metadata_value_is_named_by_its_gguf_key(vision_ggufs, tmp_path):
    """QA: as the model's, an mmproj's value the vision config refuses was named vision_config.layer_norm_eps."""
    from test_gguf_hostile import _rewrite

    model, projector = vision_ggufs
    key = "clip.vision.attention.layer_norm_epsilon"
    mmproj = _rewrite(projector, tmp_path / "bad-mmproj.gguf", {key: 0.0})
    with pytest.raises(CheckpointError) as err:
        read_gguf_model(model, mmproj)
    assert str(err.value) == (f"{mmproj}: the metadata describes an invalid vision tower: {key}=0.0 is invalid; "
                              "expected a positive finite number")


@pytest.mark.parametrize(("change", "names"), [
    ({"muse-glimmer.embedding_length": 2**21, "muse-glimmer.feed_forward_length": 2**21},
     ("muse-glimmer.feed_forward_length", "muse-glimmer.embedding_length")),
], ids=["mlp"])
def test_metadata_sizes_that_make_a_weight_no_checkpoint_holds_are_named_by_their_gguf_keys(f32_gguf, tmp_path,
                                                                                           change, names):
    """Review: the sizes were named as config.json's formula (intermediate_size × hidden_size) and the fix was to use
    the config.json published with the weights, neither of which a GGUF has."""
    from test_gguf_hostile import _rewrite

    path = _rewrite(f32_gguf, tmp_path / "huge.gguf", change)
    with pytest.raises(CheckpointError) as err:
        read_gguf_model(path)
    message = str(err.value)
    assert message.startswith(f"{path}: the metadata describes an invalid model: text_config sizes make a weight of "
                              f"{names[0]} × {names[1]} (the MLP) = 4398046511104 elements"), message
    assert "config.json" not in message and "hidden_size" not in message
    assert "convert_hf_to_gguf.py" in message


def test_an_mmproj_head_size_the_rotary_embedding_cannot_split_is_named_by_its_gguf_keys(vision_ggufs, tmp_path):
    """Review: the error named head_dim, hidden_size and num_attention_heads, config.json's names the file lacks."""
    from test_gguf_hostile import _rewrite

    model, projector = vision_ggufs
    mmproj = _rewrite(projector, tmp_path / "bad-mmproj.gguf", {"clip.vision.attention.head_count": 16})
    hidden = int(GGUFFile(mmproj).number("clip.vision.embedding_length"))
    with pytest.raises(CheckpointError) as err:
        read_gguf_model(model, mmproj)
    assert str(err.value) == (
        f"{mmproj}: the metadata describes an invalid vision tower: clip.vision.embedding_length={hidden} / "
        f"clip.vision.attention.head_count=16 gives heads of {hidden // 16}, not a multiple of 4 as the 2-D axial "
        "rotary embedding needs")


def test_sampling_defaults_glimmer_does_not_read_are_named_in_one_warning(f32_gguf, tmp_path, caplog):
    """llama.cpp's converter writes general.sampling.penalty_repeat (its penalty over the last penalty_last_n tokens,
    not transformers' repetition_penalty) and the like; Glimmer left them out without a word, where the muse-glimmer.*
    keys it does not read are named in a warning."""
    from test_gguf_hostile import _rewrite

    path = _rewrite(f32_gguf, tmp_path / "penalty.gguf", {}, add={
        "general.sampling.penalty_repeat": (1.1, _FLOAT),
        "general.sampling.penalty_last_n": (64, gguf.GGUFValueType.INT32)})
    with caplog.at_level("WARNING", logger="glimmer.checkpoint.gguf_tokenizer"):
        llm = LLM(str(path))
    warned = [r.getMessage() for r in caplog.records if "sampling defaults Glimmer does not read" in r.getMessage()]
    assert warned == [f"{path}: ignoring sampling defaults Glimmer does not read (llama.cpp's own samplers; set them "
                      "in each request where Glimmer has one): general.sampling.penalty_last_n, "
                      "general.sampling.penalty_repeat"]
    assert "repetition_penalty" not in llm.engine.generation_defaults.sampling_defaults()


@pytest.mark.parametrize(("field", "value", "key"), [("temperature", -1.0, "general.sampling.temp"),
                                                     ("top_p", 0.0, "general.sampling.top_p"),
                                                     ("min_p", 1.5, "general.sampling.min_p"),
                                                     ("top_k", -2, "general.sampling.top_k")])
def test_a_bad_sampling_default_is_named_by_its_gguf_key(tiny_checkpoint, tmp_path, capsys, field, value, key):
    """QA: a bad general.sampling.temp was reported as `temperature`, a name the GGUF does not hold."""
    import json
    import shutil

    from glimmer.cli import main

    source = tmp_path / "bad-sampling"
    shutil.copytree(tiny_checkpoint, source)
    generation = json.loads((source / "generation_config.json").read_text())
    (source / "generation_config.json").write_text(json.dumps(generation | {field: value}))
    path = export_text_gguf(source, tmp_path / "bad-sampling.gguf")
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"ConfigError: {path}: {key}={value!r} is invalid; expected " in err and f" {field}=" not in err

@pytest.mark.parametrize(("value", "value_type"), [(600, gguf.GGUFValueType.UINT32), (-1, gguf.GGUFValueType.INT32),
                                                  (511, gguf.GGUFValueType.UINT32)], ids=["past-the-vocabulary",
                                                                                          "negative", "a-padding-row"])
def test_a_bad_eot_id_is_named_by_its_gguf_key(f32_gguf, tmp_path, capsys, value, value_type):
    """QA: tokenizer.ggml.eot_token_id was not checked as the other ids are: past the vocabulary it was reported as
    generation_config's `eos_token_id`, negative as `eos_token_id=[485, -1]`, and on one of the converter's padding
    rows (a token the model never writes) it was taken, so turns never stopped at <|eot|>."""
    from test_gguf_hostile import _rewrite

    from glimmer.cli import main

    path = _rewrite(f32_gguf, tmp_path / "bad-eot.gguf", {}, drop=("tokenizer.ggml.eot_token_id",),
                    add={"tokenizer.ggml.eot_token_id": (value, value_type)})
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"CheckpointError: {path}: tokenizer.ggml.eot_token_id={value} is not a token of tokenizer.ggml.tokens" \
        in err and "eos_token_id=" not in err


def test_an_eom_stop_id_is_dropped_with_a_warning_naming_the_gguf_keys(f32_gguf, tmp_path, caplog):
    from test_gguf_hostile import _rewrite

    eom = GGUFFile(f32_gguf).metadata["tokenizer.ggml.eom_token_id"]
    path = _rewrite(f32_gguf, tmp_path / "eot-is-eom.gguf", {"tokenizer.ggml.eot_token_id": eom})
    with caplog.at_level("WARNING", logger="glimmer.checkpoint.generation_config"):
        stops = LLM(str(path)).engine.generation_defaults.stop_token_ids
    assert eom not in stops
    assert (f"{path} tokenizer.ggml.eos_token_id and tokenizer.ggml.eot_token_id lists <|eom|> (id {eom}) as a stop "
            "token; ignoring it") in caplog.text


def test_inspect_reports_a_gguf(f32_gguf, capsys):
    import json

    from glimmer.cli import main

    assert main(["inspect", str(f32_gguf)]) == 0
    out = capsys.readouterr().out
    assert "format:          gguf" in out and "F32 ×" in out and "interleaved" in out
    assert "weight layout:   gguf\n" in out  # QA: "canonical", the names the reader hands on, not the file's
    assert main(["inspect", str(f32_gguf), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["weight_layout"] == "gguf"


def test_quantization_bounds_are_not_vacuous():
    """The packers really lose precision (a zero-error bound check would prove nothing)."""
    from gguf_export import K_PACKERS

    x = np.random.default_rng(0).standard_normal((2, 512)).astype(np.float32)
    for qtype, pack in K_PACKERS.items():
        error = np.abs(gguf.quants.dequantize(pack(x), qtype) - x)
        assert 0.01 < error.max() <= 0.5 * block_steps(pack(x), qtype).max()


def test_mmproj_encodes_images_like_the_safetensors_tower_and_refuses_videos(make_tiny, tmp_path):
    from gguf_export import export_mmproj_gguf
    from PIL import Image

    from glimmer.errors import RequestError

    checkpoint = make_tiny(vision=True, seed=6)
    model_file = export_text_gguf(checkpoint, tmp_path / "m.gguf")
    mmproj = export_mmproj_gguf(checkpoint, tmp_path / "mmproj.gguf")
    reference = load_model(checkpoint, progress=False).model
    loaded = load_model(model_file, mmproj=mmproj, progress=False).model
    # an image: one frame duplicated into both temporal slabs (§4.1), in (t, c, py, px) rows
    vision = reference.config.vision
    frame = torch.randn(16, 3 * vision.patch_size**2, generator=torch.Generator().manual_seed(0))
    pixels, grid = torch.cat([frame, frame], dim=1), torch.tensor([[1, 4, 4]])
    with torch.no_grad():
        expected, got = reference.encode_vision(pixels, grid)[0], loaded.encode_vision(pixels, grid)[0]
    # the summed slabs change only the float32 summation order of the patch embedding
    assert (got - expected).abs().max() < 1e-5 * expected.abs().max()
    assert loaded.config.image_token_id == reference.config.image_token_id

    llm = LLM(str(model_file), mmproj=str(mmproj))
    image = Image.new("RGB", (60, 40), (200, 30, 90))
    out = llm.generate({"prompt": "Look: <|patch|>", "multi_modal_data": {"image": image}},
                       SamplingParams(max_tokens=3, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 3
    with pytest.raises(RequestError, match="safetensors"):
        llm.generate({"prompt": "<|video|>", "multi_modal_data": {"video": [image, image]}})


def test_an_mmproj_path_under_the_home_directory_is_expanded_as_the_models_is(make_tiny, tmp_path, monkeypatch):
    """LLM("~/m.gguf") read the model, but mmproj="~/mmproj.gguf" was refused: "No such file or directory"."""
    from gguf_export import export_mmproj_gguf

    checkpoint = make_tiny(vision=True, seed=6)
    export_text_gguf(checkpoint, tmp_path / "m.gguf")
    export_mmproj_gguf(checkpoint, tmp_path / "mmproj.gguf")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert open_checkpoint(tmp_path / "m.gguf", mmproj="~/mmproj.gguf").config.has_vision


def test_a_gguf_with_mmproj_stops_decoding_a_request_s_images_at_the_context(make_tiny, tmp_path):
    """README: a request's media stop decoding once they need more tokens than the context. A GGUF with --mmproj
    decoded every image first (its media processor had no context bound), so the corrupt second image here was
    reported, not the first image's tokens that the context cannot hold: its 54 <|patch|> tokens and its two
    markers, 56."""
    from gguf_export import export_mmproj_gguf
    from PIL import Image

    from glimmer.multimodal import MediaLimitError

    checkpoint = make_tiny(vision=True, seed=6)
    model_file = export_text_gguf(checkpoint, tmp_path / "m.gguf")
    llm = LLM(str(model_file), mmproj=str(export_mmproj_gguf(checkpoint, tmp_path / "mmproj.gguf")),
              max_model_len=40, progress=False, kv_cache_memory=16 << 20)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8))
    with pytest.raises(MediaLimitError, match=r"^This model's maximum context length is 40 tokens \(max_model_len\), "
                                              r"but the images and videos need at least 56 tokens together"):
        llm.generate({"prompt": "Look: <|patch|> <|patch|>", "multi_modal_data": {"image": [image, b"not an image"]}},
                     SamplingParams(max_tokens=3))


def test_glimmer_serve_a_gguf_with_mmproj(make_tiny, tmp_path):
    """`glimmer serve model.gguf --mmproj FILE` as a user runs it: an image chat answers, a video is HTTP 400."""
    import base64
    import io
    import signal

    import httpx
    from gguf_export import export_mmproj_gguf
    from PIL import Image
    from serve_process import ServeProcess

    checkpoint = make_tiny(vision=True, seed=6)
    model_file = export_text_gguf(checkpoint, tmp_path / "tiny.gguf", Q.Q8_0)
    mmproj = export_mmproj_gguf(checkpoint, tmp_path / "mmproj.gguf")
    server = ServeProcess(["-m", "glimmer.cli", "serve", str(model_file), "--mmproj", str(mmproj), "--max-model-len",
                           "1024", "--kv-cache-memory", "32MiB"])
    try:
        server_url = server.wait_until_serving()
        buffer = io.BytesIO()
        Image.new("RGB", (56, 56), (10, 200, 30)).save(buffer, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        body = {"model": "tiny.gguf", "max_tokens": 3, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]}
        reply = httpx.post(f"{server_url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
        body["messages"][0]["content"][1] = {"type": "video_url", "video_url": {"url": _video_data_url(tmp_path)}}
        refused = httpx.post(f"{server_url}/v1/chat/completions", json=body, timeout=120)
        assert refused.status_code == 400 and "safetensors" in refused.json()["error"]["message"]
        assert refused.json()["error"]["param"] == "messages[0].content[1]"
    finally:
        server.stop(signal.SIGINT, timeout_s=30)


def _video_data_url(tmp_path) -> str:
    """4 lossless frames (Matroska/FFV1), as a client uploads a video."""
    import base64

    import av

    path = tmp_path / "clip.mkv"
    with av.open(str(path), "w", format="matroska") as output:
        stream = output.add_stream("ffv1", rate=4)
        stream.height, stream.width, stream.pix_fmt = 56, 56, "bgr0"
        for value in range(4):
            frame = np.full((56, 56, 3), 60 * value, dtype=np.uint8)
            output.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        output.mux(stream.encode())
    return "data:video/x-matroska;base64," + base64.b64encode(path.read_bytes()).decode()


def test_sampling_defaults_come_from_general_sampling_keys_like_generation_config(tiny_checkpoint, tmp_path):
    import json
    import shutil

    source = tmp_path / "sampled"
    shutil.copytree(tiny_checkpoint, source)
    generation = json.loads((source / "generation_config.json").read_text())
    (source / "generation_config.json").write_text(json.dumps(generation | {"temperature": 0.3, "top_k": 5,
                                                                            "top_p": 0.9, "min_p": 0.05}))
    path = export_text_gguf(source, tmp_path / "sampled.gguf")
    assert GGUFFile(path).metadata["general.sampling.top_k"] == 5
    defaults = [LLM(str(model)).engine.generation_defaults.sampling_defaults() for model in (source, path)]
    assert defaults[0] == defaults[1] == {"temperature": 0.3, "top_p": 0.9, "top_k": 5, "min_p": 0.05}


def test_mmproj_tensors_that_do_not_match_its_metadata_are_all_listed_with_the_fix(vision_ggufs, tmp_path):
    """QA: an mmproj's missing and stray tensors were one line, "; "-joined, with no fix."""

    model, projector = vision_ggufs
    good = gguf.GGUFReader(projector)
    writer = gguf.GGUFWriter(tmp_path / "bad-mmproj.gguf", "clip")
    for field in good.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in good.tensors:
        if tensor.name != "mm.1.weight":
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.add_tensor("v.blk.9.extra.weight", good.tensors[0].data, raw_dtype=good.tensors[0].tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError) as err:
        load_model(model, mmproj=tmp_path / "bad-mmproj.gguf", progress=False)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{tmp_path / 'bad-mmproj.gguf'}: the tensors do not match the metadata: 1 missing, 1 unexpected"
    assert lines[1:3] == ["  missing tensors (1):", "    mm.1.weight (shape [48, 48])"]
    assert lines[3] == "  unexpected tensors (1):" and lines[4].startswith("    v.blk.9.extra.weight [")
    assert lines[5].startswith("  fix: the tensor names are not the ones llama.cpp's converter writes")


@pytest.mark.parametrize(("key", "value", "value_type", "problem"), [
    ("clip.vision.image_mean", [0.5, 0.5], gguf.GGUFValueType.ARRAY, "expected three finite numbers (R, G, B)"),
    ("clip.vision.image_std", [0.0, 0.5, 0.5], gguf.GGUFValueType.ARRAY, "each positive"),
    ("clip.vision.image_max_pixels", 100, gguf.GGUFValueType.UINT32,
     "expected at least one merged patch, (patch_size · spatial_merge_size)² = 784 pixels"),
], ids=["mean-of-two", "std-zero", "max-pixels-under-a-patch"])
def test_bad_mmproj_preprocessing_metadata_is_refused_naming_the_file_and_key(vision_ggufs, tmp_path, key, value,
                                                                             value_type, problem):
    """QA: these passed the mmproj's reading and were refused later as `preprocessor config: image_mean=...` or
    `max_image_tokens=0`, naming neither the file nor a key it holds."""

    model, projector = vision_ggufs
    good = gguf.GGUFReader(projector)
    bad = tmp_path / "bad-mmproj.gguf"
    writer = gguf.GGUFWriter(bad, "clip")
    for field in good.fields.values():
        if not field.name.startswith("GGUF.") and field.name not in ("general.architecture", key):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    sub_type = gguf.GGUFValueType.FLOAT32 if value_type == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(key, value, value_type, sub_type=sub_type)
    for tensor in good.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError) as err:
        load_model(model, mmproj=bad, progress=False)
    assert str(err.value).startswith(f"{bad}: {key}={value} is invalid; ") and problem in str(err.value)


def test_mmproj_preprocessing_keys_it_lacks_take_the_reference_values_in_one_warning(vision_ggufs, tmp_path):
    """QA: an mmproj without clip.vision.image_mean / image_std (which llama.cpp's clip loader requires) normalized
    images with the reference's 0.5 / 0.5 without a word, where an absent image_max_pixels is named in a warning."""
    from test_gguf_hostile import _rewrite

    from glimmer.multimodal.settings import MediaSettings, load_media_settings

    model, good = vision_ggufs
    assert not [w for w in read_gguf_model(model, good).config.warnings if w.startswith(str(good))]  # all written
    mmproj = _rewrite(good, tmp_path / "bare-mmproj.gguf", {}, drop=(
        "clip.vision.image_mean", "clip.vision.image_std", "clip.vision.image_max_pixels"))
    loaded = read_gguf_model(model, mmproj)
    file = GGUFFile(mmproj)  # review: the pixel key's value was a token count, "<4096 tokens an image>"
    merged_patch = (file.integer("clip.vision.patch_size") * file.integer("clip.vision.spatial_merge_size")) ** 2
    assert [w for w in loaded.config.warnings if w.startswith(str(mmproj))] == [
        f"{mmproj}: metadata keys absent from the mmproj took the reference values: "
        "clip.vision.image_mean=[0.5, 0.5, 0.5], clip.vision.image_std=[0.5, 0.5, 0.5], "
        f"clip.vision.image_max_pixels={4096 * merged_patch} (4096 tokens an image)"]
    settings = load_media_settings(loaded.preprocessor_config)
    assert (settings.image_mean, settings.image_std, settings.max_image_tokens) == (
        MediaSettings().image_mean, MediaSettings().image_std, MediaSettings().max_image_tokens)


def test_mmproj_keys_glimmer_does_not_read_are_named_in_a_warning(vision_ggufs, tmp_path):
    """QA: an mmproj's clip.* keys Glimmer does not read (a window-attention layer list, a minimum image size, another
    activation) were ignored without a word, where the model GGUF's muse-glimmer.* ones are named in a warning."""
    from test_gguf_hostile import _rewrite

    model, good = vision_ggufs
    assert not [w for w in read_gguf_model(model, good).config.warnings if w.startswith(str(good))]  # all read
    mmproj = _rewrite(good, tmp_path / "more-mmproj.gguf", {}, add={
        "clip.vision.wa_layer_indexes": ([0, 1], gguf.GGUFValueType.ARRAY),
        "clip.vision.image_min_pixels": (3136, gguf.GGUFValueType.UINT32),
        "clip.has_audio_encoder": (False, gguf.GGUFValueType.BOOL)})
    assert [w for w in read_gguf_model(model, mmproj).config.warnings if w.startswith(str(mmproj))] == [
        f"{mmproj}: ignoring metadata keys Glimmer does not read: clip.has_audio_encoder, "
        "clip.vision.image_min_pixels, clip.vision.wa_layer_indexes"]


@pytest.mark.parametrize(("key", "value"), [("clip.use_silu", True), ("clip.use_gelu", False)],
                         ids=["silu", "not-gelu"])
def test_an_mmproj_asking_for_another_activation_is_refused_by_its_key(vision_ggufs, tmp_path, key, value):
    """Review: clip.use_silu=true (llama.cpp's SiLU MLP) was named as an unread key and the tower ran with GELU, a
    silently other model; Muse Glimmer's vision tower uses exact GELU (architecture.md, vision_config.hidden_act)."""
    from test_gguf_hostile import _rewrite

    model, projector = vision_ggufs
    mmproj = _rewrite(projector, tmp_path / "act-mmproj.gguf", {},
                      add={key: (value, gguf.GGUFValueType.BOOL)})
    with pytest.raises(CheckpointError) as err:
        read_gguf_model(model, mmproj)
    assert str(err.value) == (f"{mmproj}: {key}={value} is not supported; Muse Glimmer's vision tower uses exact "
                              "GELU: remove the key or convert the Hugging Face checkpoint again with llama.cpp's "
                              "convert_hf_to_gguf.py")


def test_an_mmproj_stating_gelu_loads_without_a_warning(vision_ggufs, tmp_path):
    """Review: clip.use_gelu=true, which a converter writes and which is what Glimmer runs, was warned about as an
    unread key."""
    from test_gguf_hostile import _rewrite

    model, projector = vision_ggufs
    mmproj = _rewrite(projector, tmp_path / "gelu-mmproj.gguf", {},
                      add={"clip.use_gelu": (True, gguf.GGUFValueType.BOOL),
                           "clip.use_silu": (False, gguf.GGUFValueType.BOOL)})
    loaded = read_gguf_model(model, mmproj)
    assert loaded.config.vision is not None
    assert not [w for w in loaded.config.warnings if w.startswith(str(mmproj))]


def test_an_mmproj_given_as_the_model_or_a_model_as_the_mmproj_names_both_forms_of_the_option(vision_ggufs):
    """Raised from LLM(...), where there are no flags, the refusals named --mmproj alone; they name LLM's mmproj= beside
    it, as the empty mmproj's refusal does."""
    model, mmproj = vision_ggufs
    with pytest.raises(CheckpointError) as as_model:
        LLM(str(mmproj), progress=False)
    assert str(as_model.value).endswith("this is a vision projector (mmproj) file; pass the model GGUF as the model "
                                        "and this file with --mmproj / mmproj="), as_model.value
    with pytest.raises(CheckpointError) as as_mmproj:
        LLM(str(model), mmproj=str(model), progress=False)
    assert "--mmproj / mmproj= expects a vision projector GGUF" in str(as_mmproj.value), as_mmproj.value


@pytest.mark.parametrize("mmproj", ["", "  ", Path("")], ids=["empty", "blank", "empty-path"])
def test_an_empty_mmproj_path_is_refused_as_empty(f32_gguf, capsys, mmproj):
    """QA: mmproj="" (`mmproj=os.environ.get("MMPROJ", "")`, `--mmproj ""`) was read as the current directory, ".:
    cannot be read: [Errno 21] Is a directory: '.'", and a blank one as a file named by its spaces, where an empty
    dtype or device is refused as empty; review: Path("") (which is Path(".")) still was, as a CheckpointError where an
    empty dtype or device is a ConfigError."""
    from glimmer.cli import main
    from glimmer.errors import ConfigError

    refusal = "--mmproj / mmproj= is empty; pass the vision projector GGUF's path, or leave it out for text only"
    with pytest.raises(ConfigError) as err:
        LLM(str(f32_gguf), mmproj=mmproj)
    assert str(err.value) == refusal
    with pytest.raises(ConfigError) as err:
        open_checkpoint(f32_gguf, mmproj=mmproj)
    assert str(err.value) == refusal
    if isinstance(mmproj, str):  # the command line's `--mmproj ""`
        assert main(["inspect", str(f32_gguf), "--mmproj", mmproj]) == 2
        assert refusal in capsys.readouterr().err


def test_an_image_sent_to_a_gguf_without_mmproj_is_refused_naming_mmproj(f32_gguf, tiny_checkpoint):
    """QA: an image sent to a GGUF loaded without --mmproj was refused as sent to a model with no vision tower, not
    saying that a GGUF's vision tower is the separate mmproj file; a safetensors checkpoint's refusal does not."""
    from PIL import Image

    from glimmer.engine.async_engine import AsyncEngine
    from glimmer.engine.llm_engine import EngineConfig
    from glimmer.errors import RequestError
    from glimmer.server.chat_prompt import build_chat_prompt
    from glimmer.server.context import ServingContext
    from glimmer.server.schemas import ChatCompletionRequest
    from glimmer.server.settings import ServerSettings

    image = {"prompt": "Look: <|patch|>", "multi_modal_data": {"image": Image.new("RGB", (8, 8))}}
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [part]}]})
    for checkpoint, named in ((f32_gguf, True), (tiny_checkpoint, False)):
        with pytest.raises(RequestError, match="no vision tower") as raised:
            LLM(str(checkpoint)).generate(image)
        assert ("pass it with --mmproj / mmproj=" in str(raised.value)) is named
        engine = AsyncEngine(EngineConfig(model=str(checkpoint), progress=False, kv_cache_memory=8 << 20))
        try:
            with pytest.raises(RequestError, match="no vision tower") as raised:
                build_chat_prompt(chat, ServingContext.create(engine, ServerSettings(served_model_names=("m",))))
        finally:
            engine.shutdown()
        assert ("a GGUF's vision tower is a separate mmproj file" in str(raised.value)) is named


def test_a_git_lfs_pointer_in_place_of_a_gguf_is_named_with_the_fix(tmp_path):
    """QA: a .gguf cloned without git-lfs (its pointer file in place of the weights) was refused as "wrong magic
    b'vers'", not saying the file was never downloaded or how to fetch it."""
    pointer = tmp_path / "Muse-Glimmer-30B-Q4_K_M.gguf"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 18556727520\n")
    with pytest.raises(CheckpointError) as raised:
        load_model(pointer, progress=False)
    assert str(raised.value) == (f"{pointer}: not a GGUF file: it is a Git LFS pointer to a file of 18,556,727,520 "
                                 "bytes, which was never downloaded: fetch it with `git lfs pull` in its repository "
                                 "(or download the file with `hf download`)")
