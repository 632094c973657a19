"""Compressed-tensors NVFP4 W4A16 checkpoints (architecture.md §15.2), quantized here by a reference quantizer written
from the format (compressed-tensors' NVFP4A16: E2M1 codes two a byte, low nibble first, an FP8 E4M3 scale per 16
inputs, a float32 global scale that divides it), split over two shards with packed weights and their scales in
different ones, and read by Glimmer: every weight is the independent dequantization, and the model answers as the
reference (transformers, float32) does on the dequantized weights."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest
import torch
from oracle import reference_greedy, reference_logits, reference_model
from quantized_fixtures import quantize_linears
from safetensors.torch import load_file, save_file

from glimmer.checkpoint.compressed_tensors import dequantize_nvfp4, quantize_nvfp4
from glimmer.checkpoint.formats import open_checkpoint
from glimmer.checkpoint.inspect import inspect_checkpoint
from glimmer.engine.llm import LLM
from glimmer.engine.model_loader import load_model
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.tokenizer import load_checkpoint_tokenizer
from glimmer.errors import CheckpointError, ConfigError, UnsupportedArgumentError
from glimmer.model.context import ForwardContext
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.gate_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")

IDS = list(range(3, 70))
NVFP4_WEIGHTS = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
                 "dynamic": False, "actorder": None, "block_structure": None, "observer": "static_minmax"}
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": NVFP4_WEIGHTS, "input_activations": None,
                                  "output_activations": None, "format": "nvfp4-pack-quantized"}},
    "ignore": ["lm_head", "re:.*vision.*"], "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
    "global_compression_ratio": None, "version": "0.12.2",
}


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight_packed, weight_scale, weight_global_scale, the dequantized weight) of a float weight [out, in]."""
    out, columns = weight.shape
    global_scale = (448.0 * 6.0 / weight.abs().max()).reshape(1).float()
    groups = weight.reshape(out, columns // 16, 16)
    scale = (groups.abs().amax(-1) / 6.0 * global_scale).clamp(max=448.0).to(torch.float8_e4m3fn)
    step = scale.float() / global_scale
    scaled = groups / step.clamp(min=1e-30)[..., None]
    grid = torch.tensor(E2M1)
    index = (scaled.abs()[..., None] - grid).abs().argmin(-1)  # the nearest E2M1 magnitude
    sign = scaled < 0
    codes = (index | (sign.long() << 3)).reshape(out, columns).to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    values = torch.where(sign, -grid[index], grid[index])
    return packed, scale, global_scale, (values * step[..., None]).reshape(out, columns)


def unpack(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """An independent dequantization: each byte through a 256-entry table of its two values (low nibble first)."""
    signed = E2M1 + [-v for v in E2M1]
    table = torch.tensor([[signed[b & 15], signed[b >> 4]] for b in range(256)])
    values = table[packed.long()].reshape(packed.shape[0], -1)
    return values * (scale.float() / global_scale).repeat_interleave(16, dim=1)


def write_nvfp4(source, directory, *, edit=None, config_edit=None):
    """The tiny checkpoint at `source` quantized to NVFP4 in `directory`: two shards, every packed weight in the
    first and every scale in the second (activation scales too, which a W4A16 model drops). Returns the
    dequantized state (canonical names)."""
    directory.mkdir()
    for item in source.iterdir():
        if item.suffix != ".safetensors" and item.name != "model.safetensors.index.json":
            shutil.copy(item, directory / item.name)
    state = {}
    for file in sorted(source.glob("*.safetensors")):
        state.update(load_file(file))
    first, second, dequantized = {}, {}, {}
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and any(module.endswith(linear) for linear in LINEARS):
            packed, scale, global_scale, dequantized[name] = quantize(tensor.float())
            first[f"{module}.weight_packed"] = packed
            second[f"{module}.weight_scale"], second[f"{module}.weight_global_scale"] = scale, global_scale
            second[f"{module}.input_global_scale"] = torch.tensor([3.0])
        else:
            (first if len(first) <= len(second) else second)[name] = tensor
            dequantized[name] = tensor.float()
    if edit is not None:
        edit(first, second)
    save_file(first, str(directory / "model-00001-of-00002.safetensors"))
    save_file(second, str(directory / "model-00002-of-00002.safetensors"))
    index = {name: "model-00001-of-00002.safetensors" for name in first}
    index |= {name: "model-00002-of-00002.safetensors" for name in second}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = copy.deepcopy(QUANTIZATION_CONFIG)
    if config_edit is not None:
        config_edit(config["quantization_config"])
    (directory / "config.json").write_text(json.dumps(config))
    return dequantized


@pytest.fixture(scope="module")
def nvfp4(make_tiny, tmp_path_factory):
    """(the NVFP4 checkpoint, the canonical float32 checkpoint of its dequantized weights)."""
    source = make_tiny(seed=7)
    directory = tmp_path_factory.mktemp("ct") / "nvfp4"
    dequantized = write_nvfp4(source, directory)
    plain = directory.parent / "dequantized"
    shutil.copytree(source, plain)
    save_file({name: tensor.contiguous() for name, tensor in dequantized.items()}, str(plain / "model.safetensors"))
    return directory, plain


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(IDS), ForwardContext.without_cache([len(IDS)])))


def test_packed_weights_and_their_scales_lie_in_different_shards(nvfp4):
    weight_map = json.loads((nvfp4[0] / "model.safetensors.index.json").read_text())["weight_map"]
    module = "model.language_model.layers.7.mlp.down_proj"
    assert weight_map[f"{module}.weight_packed"] != weight_map[f"{module}.weight_scale"]


def test_a_packed_weight_the_index_maps_to_its_scales_shard_is_refused_naming_both_shards(nvfp4, tmp_path):
    directory = tmp_path / "misplaced"
    shutil.copytree(nvfp4[0], directory)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    name = "model.language_model.layers.2.mlp.down_proj.weight_packed"  # in the first shard, its scales in the second
    assert index["weight_map"][name] == "model-00001-of-00002.safetensors"
    index["weight_map"][name] = "model-00002-of-00002.safetensors"
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"maps '{name}' to model-00002-of-00002\.safetensors, but that shard "
                                              r"does not contain it \(it is in model-00001-of-00002\.safetensors\)"):
        load_model(directory, progress=False)


def test_every_weight_is_the_independent_dequantization(nvfp4):
    directory, plain = nvfp4
    loaded = load_model(directory, progress=False).model.state_dict()
    stored = {**load_file(directory / "model-00001-of-00002.safetensors"),
              **load_file(directory / "model-00002-of-00002.safetensors")}
    expected = load_file(plain / "model.safetensors")
    quantized = 0
    for name, tensor in expected.items():
        module = name.removesuffix(".weight")
        if f"{module}.weight_packed" in stored:
            quantized += 1
            independent = unpack(stored[f"{module}.weight_packed"], stored[f"{module}.weight_scale"],
                                 stored[f"{module}.weight_global_scale"])
            assert torch.equal(independent, tensor), name  # the quantizer's values survive packing
        assert torch.equal(loaded[name], tensor), name
    assert quantized == 8 * len(LINEARS)


def test_dequantization_is_compressed_tensors_formula_bit_for_bit():
    """w = e2m1 · (scale / global_scale), the divide first; the low nibble is the first of a byte's two weights."""
    packed = torch.tensor([[0x2F, 0x81] * 8], dtype=torch.uint8)  # codes 15, 2, 1, 8: -6, 1, 0.5, -0
    scale = torch.tensor([[0.375, 448.0]]).to(torch.float8_e4m3fn)
    global_scale = torch.tensor([2688.0 / 0.7])
    got = dequantize_nvfp4(packed, scale, global_scale)
    step = scale.float() / global_scale
    row = torch.tensor([-6.0, 1.0, 0.5, -0.0] * 8).reshape(2, 16) * step.reshape(2, 1)
    assert torch.equal(got, row.reshape(1, 32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_weights_dequantized_where_they_load_are_the_host_dequantization_bit_for_bit(nvfp4, dtype):
    """The loader asks for each weight on its parameter's device; on the host the bits are those of the float32
    host dequantization cast to the model dtype, as the loader cast it before it named the device."""
    directory, _ = nvfp4
    loaded = load_model(directory, dtype=dtype, progress=False).model.state_dict()
    stored = {**load_file(directory / "model-00001-of-00002.safetensors"),
              **load_file(directory / "model-00002-of-00002.safetensors")}
    compared = 0
    for name, tensor in loaded.items():
        if f"{name.removesuffix('.weight')}.weight_packed" in stored:
            module = name.removesuffix(".weight")
            host = dequantize_nvfp4(stored[f"{module}.weight_packed"], stored[f"{module}.weight_scale"],
                                    stored[f"{module}.weight_global_scale"]).to(dtype)
            assert tensor.dtype == dtype and torch.equal(tensor.view(torch.uint8), host.view(torch.uint8)), name
            compared += 1
    assert compared == 8 * len(LINEARS)


def test_a_quantized_weight_is_dequantized_on_the_device_asked_for(nvfp4):
    """The packed codes and scales go to the device and the arithmetic runs there (the meta device stands in for a
    GPU: a tensor computed anywhere else would come back from another device)."""
    directory, _ = nvfp4
    tensors = open_checkpoint(directory).tensors
    name = "model.language_model.layers.0.mlp.down_proj.weight"
    on_meta = tensors.read(name, torch.device("meta"))
    host = tensors.read(name)
    assert on_meta.device.type == "meta" and host.device.type == "cpu"
    assert (on_meta.shape, on_meta.dtype) == (host.shape, host.dtype) == (tuple(tensors.tensors[name].shape),
                                                                           torch.float32)
    plain = "model.language_model.embed_tokens.weight"  # stored as it is: read on the host for the copy to move
    assert tensors.read(plain, torch.device("meta")).device.type == "cpu"


def test_logits_are_the_reference_on_the_dequantized_weights(nvfp4):
    directory, plain = nvfp4
    ours = logits(load_model(directory, progress=False).model)
    assert torch.equal(ours, logits(load_model(plain, progress=False).model))
    expected = reference_logits(reference_model(plain), IDS)
    assert expected.abs().max() > 0.5
    assert (ours - expected).abs().max().item() < 1e-4


def test_greedy_generation_matches_the_reference_and_vllm_quantization_argument_is_taken(nvfp4):
    directory, plain = nvfp4
    llm = LLM(str(directory), quantization="compressed-tensors", progress=False)
    prompt = IDS[:20]
    output = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    assert output.token_ids == reference_greedy(reference_model(plain), prompt, 24, llm.engine.token_count)


@pytest.mark.parametrize("method", ["compressed-tensors", "fp8"])
def test_vllm_quantization_argument_is_refused_for_other_checkpoints(tiny_checkpoint, method):
    with pytest.raises(UnsupportedArgumentError, match=r"quantization: .*compressed-tensors NVFP4"):
        LLM(str(tiny_checkpoint), quantization=method)


def test_serve_takes_vllm_quantization_option_only_for_such_a_checkpoint(nvfp4, tiny_checkpoint):
    from glimmer.cli import _VLLM_SERVE_OPTIONS, UsageError, _check_vllm_options, build_parser
    from glimmer.engine.vllm_arguments import VLLM_ONLY_LLM_ARGUMENTS

    def check(model):
        args = build_parser().parse_args(["serve", str(model), "--quantization", "compressed-tensors"])
        return _check_vllm_options(args, _VLLM_SERVE_OPTIONS, VLLM_ONLY_LLM_ARGUMENTS)

    check(nvfp4[0])  # taken: no UsageError (serve notes only its serving options, not these engine arguments)
    with pytest.raises(UsageError, match="--quantization compressed-tensors: .*compressed-tensors NVFP4 checkpoint"):
        check(tiny_checkpoint)


def test_inspect_reports_the_quantization(nvfp4):
    def meta_model(config):
        with torch.device("meta"):
            return MuseGlimmerForConditionalGeneration(config)

    report = inspect_checkpoint(nvfp4[0], meta_model, load_checkpoint_tokenizer).as_dict()
    assert report["format"] == "compressed-tensors"
    quantization = report["quantization"]
    assert quantization["format"] == "nvfp4-pack-quantized" and "NVFP4 W4A16" in quantization["scheme"]
    assert quantization["quantized_modules"] == 8 * len(LINEARS)
    assert quantization["quantized_module_kinds"] == sorted(LINEARS)
    files = sorted(nvfp4[0].glob("*.safetensors"))
    assert 0 < quantization["quantized_bytes"] < report["checkpoint_bytes"] == sum(f.stat().st_size for f in files)
    assert report["tensor_types"]["NVFP4 g16"] == 8 * len(LINEARS)


def test_glimmer_inspect_prints_the_quantization(nvfp4, capsys):
    from glimmer.cli import main

    assert main(["inspect", str(nvfp4[0])]) == 0
    out = capsys.readouterr().out
    assert "format:          compressed-tensors\n" in out and "weight layout:   canonical\n" in out
    assert "quantization:    NVFP4 W4A16" in out and "64 modules (mlp.down_proj, " in out


def test_glimmer_inspect_prints_the_quantization_of_a_config_alone(nvfp4, tmp_path, capsys):
    from glimmer.cli import main

    shutil.copytree(nvfp4[0], tmp_path / "config-only", ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    assert main(["inspect", str(tmp_path / "config-only")]) == 0
    out = capsys.readouterr().out
    assert "format:          config-only\n" in out
    assert ("quantization:    NVFP4 W4A16: FP4 E2M1 weights" in out
            and "(compressed-tensors, nvfp4-pack-quantized); config only, no weights\n" in out)


def test_vllm_safetensors_load_format_and_dummy_weights_read_it(nvfp4):
    from glimmer.engine.config_checks import check_weight_format

    check_weight_format("safetensors", "compressed-tensors", nvfp4[0])
    with pytest.raises(ConfigError, match="load_format='gguf' reads gguf weights"):
        check_weight_format("gguf", "compressed-tensors", nvfp4[0])
    dummy = load_model(nvfp4[0], load_format="dummy", progress=False)
    assert dummy.config.text == load_model(nvfp4[1], load_format="dummy", progress=False).config.text


def test_mlx_lm_quantization_config_without_the_artifact_key_names_the_key(tiny_checkpoint, tmp_path):
    shutil.copytree(tiny_checkpoint, tmp_path / "mlx")
    config = json.loads((tmp_path / "mlx" / "config.json").read_text())
    config["quantization_config"] = {"group_size": 64, "bits": 4}
    (tmp_path / "mlx" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"quantization_config is mlx-lm's .*muse_glimmer_mlx_format"):
        load_model(tmp_path / "mlx", progress=False)


def test_packed_weights_whose_config_lost_its_quantization_config_name_the_key(nvfp4, tmp_path):
    shutil.copytree(nvfp4[0], tmp_path / "unmarked")
    config = json.loads((tmp_path / "unmarked" / "config.json").read_text())
    del config["quantization_config"]
    (tmp_path / "unmarked" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json has no quantization_config, but the weights are "
                                              r"compressed-tensors packed ones \(model\.language_model\.layers\.0\."
                                              r"mlp\.down_proj\.weight_packed and 63 more"):
        load_model(tmp_path / "unmarked", progress=False)


_LOAD_INSTEAD = (r"which Glimmer does not read: load the unquantized \(bf16\) checkpoint, the compressed-tensors "
                 r"NVFP4 release or a GGUF")
_UNMARKED = r"{}/config\.json has no quantization_config, but the weights are "
_FIRST = r"model\.language_model\.layers\.0\.mlp\.down_proj\."


def _is_linear(name: str) -> bool:
    return name.endswith(".weight") and name.removesuffix(".weight").endswith(LINEARS)


# AutoGPTQ writes its scheme to quantize_config.json (AutoAWQ to quant_config.json), not to config.json; a GPTQ export
# without qzeros (symmetric, the zero point implied) is named with its scales alone. compressed-tensors' other packed
# schemes have their config dropped (restoring it would be refused too), as have its float-quantized (FP8) and
# int-quantized (W8A8) Linears, which keep their name `weight`, in 8 bits, beside a `weight_scale` (DeepSeek-style FP8
# blocks: `weight_scale_inv`) — quantized_fixtures.quantized_tensors writes each.
@pytest.mark.parametrize(("scheme", "settings", "refusal", "absent"), [
    ("gptq", "quantize_config.json", rf"gptq holds GPTQ or AWQ packed weights \({_FIRST}qweight and 63 more, with "
                                     r"their qzeros and scales; quantize_config\.json describes them\), "
                                     rf"{_LOAD_INSTEAD}", None),
    ("awq", "quant_config.json", rf"awq holds GPTQ or AWQ packed weights \({_FIRST}qweight and 63 more, with their "
                                 rf"qzeros and scales; quant_config\.json describes them\), {_LOAD_INSTEAD}", None),
    ("gptq-symmetric", None, rf"gptq-symmetric holds GPTQ or AWQ packed weights \({_FIRST}qweight and 63 more, with "
                             r"their scales\), which Glimmer does not read", "qzeros"),
    ("int4", None, _UNMARKED.format("int4") + rf"compressed-tensors packed ones of another scheme than NVFP4 "
                                              rf"\({_FIRST}weight_packed and 63 more, of dtype I32 where NVFP4 packs "
                                              rf"U8\), {_LOAD_INSTEAD}", "restore the config"),
    ("mxfp4", None, _UNMARKED.format("mxfp4") + rf"compressed-tensors packed ones of another scheme than NVFP4 "
                                                rf"\({_FIRST}weight_packed and 63 more, its weight_scale of dtype U8 "
                                                r"where NVFP4's is F8_E4M3, without the weight_global_scale NVFP4 "
                                                rf"has\), {_LOAD_INSTEAD}", "restore the config"),
    ("fp8", None, _UNMARKED.format("fp8") + rf"8-bit quantized ones \({_FIRST}weight and 63 more, of dtype F8_E4M3 "
                                            rf"beside their weight_scale\), {_LOAD_INSTEAD}", None),
    ("int8", None, _UNMARKED.format("int8") + rf"8-bit quantized ones \({_FIRST}weight and 63 more, of dtype I8 "
                                              rf"beside their weight_scale\), {_LOAD_INSTEAD}", None),
    ("fp8-block", None, _UNMARKED.format("fp8-block") + rf"8-bit quantized ones \({_FIRST}weight and 63 more, of "
                                                        rf"dtype F8_E4M3 beside their weight_scale_inv\), "
                                                        rf"{_LOAD_INSTEAD}", None),
])
def test_quantized_weights_glimmer_does_not_read_are_refused_naming_their_scheme(
        tiny_checkpoint, tmp_path, scheme, settings, refusal, absent):
    shutil.copytree(tiny_checkpoint, tmp_path / scheme)
    quantize_linears(tmp_path / scheme / "model.safetensors", _is_linear, scheme)
    if settings is not None:
        (tmp_path / scheme / settings).write_text(json.dumps({"bits": 4, "group_size": 128}))
    with pytest.raises(CheckpointError, match=refusal) as refused:
        load_model(tmp_path / scheme, progress=False)
    if absent is not None:
        assert absent not in str(refused.value)


def test_make_tiny_quantize_nvfp4_writes_what_the_reference_quantizer_writes(tmp_path):
    from glimmer.cli import main

    assert main(["make-tiny", str(tmp_path / "nvfp4"), "--quantize", "nvfp4", "--seed", "5", "--shards", "2"]) == 0
    assert main(["make-tiny", str(tmp_path / "float"), "--seed", "5"]) == 0
    stored = {**load_file(tmp_path / "nvfp4" / "model-00001-of-00002.safetensors"),
              **load_file(tmp_path / "nvfp4" / "model-00002-of-00002.safetensors")}
    loaded = load_model(tmp_path / "nvfp4", progress=False).model.state_dict()
    quantized = 0
    for name, tensor in load_file(tmp_path / "float" / "model.safetensors").items():
        module = name.removesuffix(".weight")
        if any(module.endswith(linear) for linear in LINEARS):
            quantized += 1
            packed, scale, global_scale, dequantized = quantize(tensor)
            assert torch.equal(stored[f"{module}.weight_packed"], packed), name
            assert torch.equal(stored[f"{module}.weight_scale"].float(), scale.float()), name
            assert torch.equal(stored[f"{module}.weight_global_scale"], global_scale), name
            assert torch.equal(loaded[name], dequantized), name
        else:
            assert name in stored and torch.equal(loaded[name], tensor), name
    assert quantized == 8 * len(LINEARS)


def test_make_tiny_writes_a_drafter_for_a_quantized_target_that_decodes_as_the_target(nvfp4, tmp_path,
                                                                                     same_cpu_kernels):
    from glimmer.cli import main

    directory, _ = nvfp4
    assert main(["make-tiny", str(tmp_path / "drafter"), "--drafter-for", str(directory)]) == 0
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = LLM(str(directory), progress=False).generate([IDS[:20]], params)[0].outputs[0].token_ids
    llm = LLM(str(directory), quantization="compressed-tensors", progress=False,
              speculative_config={"method": "dflash", "model": str(tmp_path / "drafter")})
    assert llm.generate([IDS[:20]], params)[0].outputs[0].token_ids == alone


@pytest.mark.parametrize(("flags", "said"), [(["--layout", "native"], "the native layout (--layout native)"),
                                             (["--config-only"], "config_only (--config-only)")])
def test_make_tiny_quantize_is_refused_where_it_does_not_apply(tmp_path, capsys, flags, said):
    from glimmer.cli import main

    assert main(["make-tiny", str(tmp_path / "out"), "--quantize", "nvfp4", *flags]) == 2
    assert f"quantize='nvfp4' (--quantize) does not apply with {said}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_nvfp4_activations_are_run_as_w4a16_with_a_warning(make_tiny, tmp_path):
    def w4a4(config):
        config["config_groups"]["group_0"]["input_activations"] = dict(NVFP4_WEIGHTS, dynamic="local")

    write_nvfp4(make_tiny(seed=7), tmp_path / "w4a4", config_edit=w4a4)
    loaded = load_model(tmp_path / "w4a4", progress=False)
    assert any("input_activations" in warning and "W4A16" in warning for warning in loaded.config.warnings)


def test_a_dense_sparsity_config_loads_and_a_compressed_one_is_refused(make_tiny, tmp_path):
    # llm-compressor writes compressed-tensors' identity sparsity format for a pruned model whose quantization format
    # cannot hold it sparse: the weights are stored as they are
    def sparsity(format):
        return lambda config: config.update(sparsity_config={
            "format": format, "global_sparsity": 0.5, "ignore": ["lm_head"], "registry_requires_subclass": False,
            "sparsity_structure": "2:4", "targets": ["Linear"]})

    source = make_tiny(seed=7)
    write_nvfp4(source, tmp_path / "dense", config_edit=sparsity("dense"))
    write_nvfp4(source, tmp_path / "plain")
    assert torch.equal(logits(load_model(tmp_path / "dense", progress=False).model),
                       logits(load_model(tmp_path / "plain", progress=False).model))
    write_nvfp4(source, tmp_path / "sparse", config_edit=sparsity("sparse-24-bitmask"))
    with pytest.raises(CheckpointError, match=r"quantization_config\.sparsity_config is set \(sparse weights\)"):
        load_model(tmp_path / "sparse", progress=False)


def test_a_config_whose_format_only_its_groups_name_loads(make_tiny, tmp_path):
    source = make_tiny(seed=7)
    write_nvfp4(source, tmp_path / "grouped", config_edit=lambda config: config.pop("format"))
    write_nvfp4(source, tmp_path / "plain")
    assert torch.equal(logits(load_model(tmp_path / "grouped", progress=False).model),
                       logits(load_model(tmp_path / "plain", progress=False).model))

    def neither(config):
        config.pop("format")
        config["config_groups"]["group_0"].pop("format")

    write_nvfp4(source, tmp_path / "neither", config_edit=neither)
    with pytest.raises(CheckpointError, match=r"config_groups\.group_0\.format=None is not supported"):
        load_model(tmp_path / "neither", progress=False)


def _group(**weights):
    return {"targets": ["Linear"], "weights": dict(NVFP4_WEIGHTS, **weights), "format": "nvfp4-pack-quantized"}


MXFP4 = {"targets": ["Linear"], "format": "mxfp4-pack-quantized",
         "weights": dict(NVFP4_WEIGHTS, group_size=32, strategy="group")}


@pytest.mark.parametrize(("ignore", "shown"), [
    ("lm_head", '"lm_head"'), ({"lm_head": True}, '{"lm_head": true}'), (["lm_head", 3], '["lm_head", 3]'),
    (["lm_head", None], '["lm_head", null]'), (False, "false"),
])
def test_an_ignore_list_that_is_no_list_of_module_names_is_refused_naming_it_as_json(make_tiny, tmp_path, ignore,
                                                                                     shown):
    # compressed-tensors reads `ignore` as a list of names or re: patterns; a string was taken as it stood. The value
    # is shown as config.json has it (null, false), not as Python writes it (None, False)
    write_nvfp4(make_tiny(), tmp_path / "ignore", config_edit=lambda c: c.update(ignore=ignore))
    with pytest.raises(CheckpointError, match=(
            rf"quantization_config\.ignore={re.escape(shown)} is invalid; expected a list of module names or "
            r'"re:" patterns \(such as \["lm_head", "re:\.\*vision\.\*"\]\), or null')):
        load_model(tmp_path / "ignore", progress=False)


@pytest.mark.parametrize(("edit", "said"), [
    (lambda c: c.update(config_groups={"group_0": MXFP4}),
     r"config_groups\.group_0\.format='mxfp4-pack-quantized' is not supported"),
    (lambda c: c.update(config_groups={"group_0": _group(group_size=32, strategy="group")}),
     r"config_groups\.group_0\.weights\.group_size=32 is not supported \(MXFP4"),
    (lambda c: c.update(config_groups={"group_0": _group(), "group_1": MXFP4}),
     r"config_groups mix quantization schemes \(group_0: NVFP4 W4A16\).*group_1\.format='mxfp4-pack-quantized'"),
    (lambda c: c.update(config_groups={"group_1": MXFP4, "group_0": _group()}),
     r"config_groups mix quantization schemes \(group_0: NVFP4 W4A16\).*group_1\.format"),
    (lambda c: c.update(config_groups={"group_0": _group(num_bits=8)}), r"weights\.num_bits=8 is not supported"),
    (lambda c: c.update(config_groups={"group_0": _group(type="int")}), r"weights\.type='int' is not supported"),
    (lambda c: c.update(config_groups={"group_0": _group(strategy="group")}),
     r"weights\.strategy='group' is not supported"),
    (lambda c: c.update(config_groups={"group_0": _group(symmetric=False)}), r"weights\.symmetric=False"),
    (lambda c: c.update(format="pack-quantized"), r"quantization_config\.format='pack-quantized' is not supported"),
    (lambda c: c.update(quant_method="gptq"), r"quantization_config\.quant_method='gptq' is not supported"),
    (lambda c: c.update(kv_cache_scheme={"num_bits": 8, "type": "float"}), r"quantization_config\.kv_cache_scheme"),
    (lambda c: c["config_groups"]["group_0"].update(
        input_activations={"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}),
     r"group_0\.input_activations: FP8 \(8-bit float, strategy 'token'\) is not supported"),
])
def test_other_schemes_are_refused_naming_the_field(make_tiny, tmp_path, edit, said):
    write_nvfp4(make_tiny(seed=7), tmp_path / "other", config_edit=edit)
    with pytest.raises(CheckpointError, match=said):
        load_model(tmp_path / "other", progress=False)


MODULE = "model.language_model.layers.2.mlp.down_proj"


def _drop_scale(first, second):
    del second[f"{MODULE}.weight_scale"]


def _misshape_scale(first, second):
    second[f"{MODULE}.weight_scale"] = second[f"{MODULE}.weight_scale"][:, :-1].contiguous()


def _odd_inputs(first, second):
    first[f"{MODULE}.weight_packed"] = first[f"{MODULE}.weight_packed"][:, :-4].contiguous()


def _float_scale(first, second):
    second[f"{MODULE}.weight_scale"] = second[f"{MODULE}.weight_scale"].float()


def _quantized_head(first, second):
    head = first.pop("lm_head.weight", None)
    head = second.pop("lm_head.weight") if head is None else head
    packed, scale, global_scale, _ = quantize(head.float())
    first["lm_head.weight_packed"] = packed
    second["lm_head.weight_scale"], second["lm_head.weight_global_scale"] = scale, global_scale


def _zero_global_scale(first, second):
    second[f"{MODULE}.weight_global_scale"] = torch.tensor([0.0])


def test_a_nan_scale_is_refused_naming_the_scale_and_its_shard(make_tiny, tmp_path):
    """A NaN in a weight_scale (FP8 E4M3's NaN code, 0x7f) was reported as held by the module's weight_packed, whose
    uint8 codes cannot be NaN, in the shard of the codes, not the one of the scale."""
    def poison(first, second):
        scale = second[f"{MODULE}.weight_scale"].clone()
        scale.view(torch.uint8)[3, 1] = 0x7F
        second[f"{MODULE}.weight_scale"] = scale

    directory = tmp_path / "nan"
    write_nvfp4(make_tiny(seed=7), directory, edit=poison)
    with pytest.raises(CheckpointError) as err:
        load_model(directory, progress=False)
    message = str(err.value)
    assert message.startswith(f"parameter {MODULE}.weight (checkpoint tensor '{MODULE}.weight', stored as "
                              f"'{MODULE}.weight_packed' in {directory / 'model-00001-of-00002.safetensors'}) holds "
                              "16 NaN and 0 infinite value(s) among 8192"), message
    assert (f", computed from '{MODULE}.weight_scale' (in {directory / 'model-00002-of-00002.safetensors'}), which "
            "holds 1 NaN and 0 infinite value(s) among 512; the checkpoint is damaged") in message


@pytest.mark.parametrize("magnitude", [0.0, 1e-37, 1e-44])
def test_an_all_zero_or_all_tiny_weight_quantizes_to_a_finite_global_scale_and_loads_as_zeros(make_tiny, tmp_path,
                                                                                              magnitude):
    """Its largest magnitude, 0 or below float32's smallest normal over 448 · 6, made 448 · 6 / max infinite, which
    the loader refuses as a damaged checkpoint; compressed-tensors writes 1.0 there."""
    weight = torch.full((64, 128), magnitude)
    weight[::2] *= -1
    packed, scale, global_scale = quantize_nvfp4(weight)
    assert torch.isfinite(global_scale).all() and (global_scale > 0).all(), global_scale
    assert torch.equal(dequantize_nvfp4(packed, scale, global_scale), torch.zeros(64, 128))

    def zero_module(first, second):
        first[f"{MODULE}.weight_packed"] = packed
        second[f"{MODULE}.weight_scale"], second[f"{MODULE}.weight_global_scale"] = scale, global_scale

    write_nvfp4(make_tiny(seed=7), tmp_path / "zero", edit=zero_module)
    loaded = load_model(tmp_path / "zero", progress=False).model.state_dict()
    assert torch.equal(loaded[f"{MODULE}.weight"], torch.zeros(64, 128))


@pytest.mark.parametrize(("edit", "said"), [
    (_zero_global_scale, rf"{MODULE}\.weight_global_scale \(in .*model-00002-of-00002\.safetensors\) is 0\.0, but a "
                         r"global scale divides"),
    (_drop_scale, rf"missing tensors \(1\):\n    {MODULE}\.weight_scale \(for {MODULE}, quantized\)"),
    (_misshape_scale, rf"{MODULE}\.weight_scale: expected shape \[64, 8\] \(one scale per 16 of"),
    (_odd_inputs, rf"{MODULE}\.weight_packed: 120 inputs \(2 × 60\) are not a whole number of groups of 16"),
    (_float_scale, rf"{MODULE}\.weight_scale: dtype F32 \(expected F8_E4M3\)"),
    (_quantized_head, r"(?s)unexpected tensors \(3\):\n    lm_head\.weight_packed \[512, 32\]\n.*fix: only the text "
                      r"decoder's Linear layers"),
])
def test_damaged_or_misplaced_quantized_tensors_are_refused_naming_them(make_tiny, tmp_path, edit, said):
    write_nvfp4(make_tiny(seed=7), tmp_path / "damaged", edit=edit)
    with pytest.raises(CheckpointError, match=said):
        load_model(tmp_path / "damaged", progress=False)
