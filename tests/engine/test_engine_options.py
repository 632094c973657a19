"""Engine options passed from Python (`LLM(...)`, `EngineConfig`): a wrong type or value is a ConfigError
naming the option before anything loads; sizes may be given as text like the CLI's."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine.config_checks import parse_size
from glimmer.engine.llm_engine import EngineConfig
from glimmer.errors import ConfigError, UnsupportedArgumentError


@pytest.mark.parametrize(("option", "value", "message"), [
    ("max_num_seqs", "8", "max_num_seqs='8' must be a positive integer"),
    ("max_num_seqs", 0, "max_num_seqs=0 must be a positive integer"),
    ("max_num_batched_tokens", True, "max_num_batched_tokens=True must be a positive integer"),
    ("max_model_len", 1.5, "max_model_len=1.5 must be a positive integer"),
    ("block_size", "16", "block_size='16' must be a positive integer"),
    ("block_size", 24, "block_size=24 must be a positive integer, a power of two"),
    ("kv_cache_memory", "lots", "kv_cache_memory: 'lots' is not a size"),
    # None was said to be "a share of free device memory", which the CPU's default is not
    ("kv_cache_memory", -5, "kv_cache_memory=-5 must be a positive number of bytes or a size such as '8GiB' \\(or "
                            "None: on a GPU, what gpu_memory_utilization leaves after the weights; on the CPU, what "
                            "max_num_seqs sequences of max_model_len need, 2 GiB at most\\)"),
    ("kv_cache_memory", 2.5e9, "kv_cache_memory=2500000000.0 must be a positive number of bytes"),
    ("gpu_memory_utilization", "x", "gpu_memory_utilization='x' must be a fraction in \\(0, 1\\]"),
    ("gpu_memory_utilization", 1.5, "gpu_memory_utilization=1.5 must be a fraction"),
    ("enforce_eager", "yes", "enforce_eager='yes' must be True or False"),
    ("enable_prefix_caching", 1, "enable_prefix_caching=1 must be True or False"),
    ("async_scheduling", "on", "async_scheduling='on' must be True, False or None"),
    ("load_format", "npcache", "load_format='npcache' is not supported; use one of \\['auto', 'dummy', "
                               "'safetensors', 'pt', 'gguf'\\]"),
    ("seed", "a", "seed='a' must be an integer"),
    ("seed", 2**64, "seed=18446744073709551616 must be an integer in"),
    ("dtype", 16, "dtype=16 is not supported; pass one of \\['bfloat16', 'float16', 'float32'\\], 'auto'"),
    ("dtype", "", "dtype='' is empty; pass 'bfloat16', 'float16' or 'float32', or None"),
    ("device", "", "device='' is empty; pass 'cpu', 'cuda' or 'cuda:N', or None"),
    ("chat_template", "/nonexistent/template.jinja", "chat_template='/nonexistent/template.jinja' is not a file"),
    ("speculative_config", {"method": "eagle", "model": "x"}, "speculative_config.method='eagle' is not supported"),
    ("speculative_config", "{bad", "speculative_config is not valid JSON"),
    ("speculative_config", {"method": "dflash", "model": "/nonexistent/drafter"},
     "speculative_config.model='/nonexistent/drafter' does not exist; pass the drafter's directory"),
])
def test_a_wrong_option_is_refused_naming_it_before_anything_loads(option, value, message):
    with pytest.raises(ConfigError, match=message):
        LLM("/nonexistent/model/dir", progress=False, **{option: value})  # refused before the model is looked for


@pytest.mark.parametrize("option", ["max_num_seqs", "max_num_batched_tokens", "max_model_len"])
@pytest.mark.parametrize("value", [2**63, 10**400], ids=["2**63", "10**400"])
def test_a_count_past_int64_is_refused_naming_it_before_anything_loads(option, value):
    """10**400 max_num_batched_tokens raised a bare OverflowError while the KV cache was planned; 10**30 max_num_seqs
    was taken, and the first grammar step failed its whole batch ("Overflow when unpacking long long")."""
    with pytest.raises(ConfigError, match=f"{option}={value} must be at most 2\\*\\*63 - 1"):
        LLM("/nonexistent/model/dir", progress=False, **{option: value})


@pytest.mark.parametrize(("option", "value", "message"), [
    ("max_media_bytes", 0, "max_media_bytes=0 must be a size of at least 1 byte .* or None for 64 MiB"),
    ("max_media_bytes", 1.5e6, "max_media_bytes=1500000.0 must be a size of at least 1 byte"),
    ("max_media_bytes", True, "max_media_bytes=True must be a size"),
    ("max_media_bytes", "lots", "max_media_bytes: 'lots' is not a size"),
    ("media_fetch_timeout", 0, "media_fetch_timeout=0 must be a number of seconds above 0, or None for 10"),
    ("media_fetch_timeout", float("nan"), "media_fetch_timeout=nan must be a number of seconds above 0"),
    ("media_fetch_timeout", float("inf"), "media_fetch_timeout=inf must be a number of seconds above 0"),
    ("media_fetch_timeout", "10", "media_fetch_timeout='10' must be a number of seconds above 0"),
    ("allowed_local_media_path", "/tmp", "allowed_local_media_path='/tmp' must be a list of directories; pass "
                                         "\\['/tmp'\\] for one"),
    ("allowed_local_media_path", ["/nonexistent/images"], "allowed_local_media_path: '/nonexistent/images' is not "
                                                          "an existing directory"),
    ("allowed_local_media_path", [""], "allowed_local_media_path: '' is blank .* which names no directory meant"),
    ("allowed_local_media_path", ["  "], "allowed_local_media_path: '  ' is blank .* which names no directory meant"),
    ("allowed_media_domains", "images.internal", "allowed_media_domains='images.internal' must be a list of host "
                                                 "names; pass \\['images.internal'\\] for one"),
    ("allowed_media_domains", [5], "allowed_media_domains: 5 is not a host name"),
    ("allow_remote_media", "no", "allow_remote_media='no' must be True or False"),
])
def test_a_wrong_media_option_is_refused_naming_it_before_anything_loads(option, value, message):
    """The media options of `glimmer serve` under the same names; a string for a list was taken a character at a
    time (allowed_media_domains='images.internal' allowed the hosts 'i', 'm', ...), 'no' allowed remote media."""
    with pytest.raises(ConfigError, match=message):
        LLM("/nonexistent/model/dir", progress=False, **{option: value})


def test_media_size_and_time_limits_are_taken_as_serve_takes_them(tiny_checkpoint, tmp_path):
    """--max-media-bytes and --media-fetch-timeout had no LLM(...) argument: a Python caller could not bound them."""
    llm = LLM(str(tiny_checkpoint), progress=False, max_media_bytes="16MiB", media_fetch_timeout=2.5,
              allowed_local_media_path=[tmp_path], allowed_media_domains=("Images.Internal.",))
    policy = llm.media_policy
    assert (policy.max_bytes, policy.timeout_s, policy.allowed_local_paths, policy.allowed_domains) == (
        16 * 2**20, 2.5, (tmp_path.resolve(),), ("images.internal",))
    assert LLM(str(tiny_checkpoint), progress=False, max_media_bytes=1000).media_policy.max_bytes == 1000


def test_vllms_none_for_enable_prefix_caching_is_its_default_on():
    """vLLM's engine argument defaults to None, which turns the prefix cache on; it was refused as not True or False."""
    assert EngineConfig(model="m", enable_prefix_caching=None).enable_prefix_caching is True
    assert EngineConfig(model="m", enable_prefix_caching=False).enable_prefix_caching is False


def test_vllms_none_for_block_size_is_its_default_16():
    """vLLM's engine argument defaults to None, the platform's block size (16 on CUDA); it was refused as not a
    positive integer."""
    assert EngineConfig(model="m", block_size=None).block_size == EngineConfig(model="m").block_size == 16
    assert EngineConfig(model="m", block_size=32).block_size == 32


@pytest.mark.parametrize("model", [None, 123, "", "  ", b"/models/x"])
def test_a_missing_or_mistyped_model_is_refused_as_required_not_looked_up(model):
    """LLM(None) was looked for as a directory named 'None'."""
    with pytest.raises(ConfigError, match=rf"^model={re.escape(repr(model))}: required; pass a checkpoint directory"):
        LLM(model, progress=False)


def test_a_path_object_names_the_model(tiny_checkpoint):
    assert LLM(Path(tiny_checkpoint), progress=False).generate("a", SamplingParams(max_tokens=1))[0].outputs


def test_sizes_as_text_are_bytes_as_on_the_command_line(tiny_checkpoint):
    assert EngineConfig(model="m", kv_cache_memory="1.5GiB").kv_cache_memory == 1.5 * 2**30
    assert EngineConfig(model="m", kv_cache_memory="512MB").kv_cache_memory == 512 * 10**6
    llm = LLM(str(tiny_checkpoint), progress=False, kv_cache_memory="64MiB")
    assert llm.engine.config.kv_cache_memory == 64 * 2**20
    assert [parse_size(t) for t in ("8GiB", "100", "2kb")] == [8 * 2**30, 100, 2000]
    with pytest.raises(ValueError, match="is not a size"):
        parse_size("8 gigs")


def test_a_kv_cache_larger_than_memory_is_a_config_error_before_allocating(tiny_checkpoint, monkeypatch):
    """An allocator's traceback (or an OOM kill under load) otherwise: the request is weighed against memory and
    swap less the weights, with the numbers and the option to change."""
    import glimmer.checkpoint.host_memory as host_memory

    memory = host_memory.HostMemory(memory_bytes=64 << 20, swap_bytes=0, host_bytes=64 << 20)
    monkeypatch.setattr(host_memory, "read_host_memory", lambda: memory)
    with pytest.raises(ConfigError, match=r"kv_cache_memory=104,857,600 bytes is more than the [\d,]+ bytes the "
                                          r"weights' \d+\.\d MiB leave of this machine's 64\.0 MiB of memory and swap "
                                          r"\(/proc/meminfo MemTotal \+ SwapTotal\); give the KV cache less "
                                          r"\(--kv-cache-memory"):
        LLM(str(tiny_checkpoint), progress=False, kv_cache_memory="100MiB")
    assert LLM(str(tiny_checkpoint), progress=False, kv_cache_memory="8MiB").engine.kv_layout.num_pages


def test_a_max_model_len_past_the_models_is_refused_before_the_weights_load(tiny_checkpoint, monkeypatch):
    """config.json gives the limit: a 30B model's weights take minutes to load, and were loaded before the refusal."""
    import glimmer.engine.llm_engine as llm_engine

    def load_model(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(llm_engine, "load_model", load_model)
    with pytest.raises(ConfigError, match=r"max_model_len=4097 must be between 2 and the model's 4096"):
        LLM(str(tiny_checkpoint), progress=False, max_model_len=4097)


def test_a_generation_config_field_refused_is_refused_before_the_weights_load(tiny_checkpoint, tmp_path, monkeypatch):
    """generation_config.json was read once the weights had loaded (minutes for the 30B) and been prepared, so a
    temperature written as a string was refused only then."""
    import glimmer.engine.llm_engine as llm_engine

    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, model)
    generation = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**generation, "temperature": "0.7"}))

    def load_model(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(llm_engine, "load_model", load_model)
    with pytest.raises(ConfigError, match=r"generation_config\.json: temperature='0\.7' is invalid; expected a number"):
        LLM(str(model), progress=False)


def test_gpu_memory_utilization_on_the_cpu_says_it_does_nothing_there(tiny_checkpoint, caplog):
    default = LLM(str(tiny_checkpoint), progress=False).engine.kv_layout.num_pages
    assert "gpu_memory_utilization" not in caplog.text
    assert LLM(str(tiny_checkpoint), progress=False, gpu_memory_utilization=0.1).engine.kv_layout.num_pages == default
    assert ("gpu_memory_utilization=0.1 sizes the KV cache on a GPU only; on the CPU give --kv-cache-memory SIZE / "
            "kv_cache_memory= instead") in caplog.text


def test_start_up_logs_the_maximum_concurrency_beside_the_kv_cache(tiny_checkpoint, caplog):
    """vLLM logs "Maximum concurrency for N tokens per request: X.XXx" once the KV cache is sized; Glimmer logged
    the cache's pages alone. Twice the cache holds twice the sequences of max_model_len."""
    caplog.set_level("INFO", logger="glimmer.engine.llm_engine")
    held = {}
    for size in (1, 2):
        caplog.clear()
        LLM(str(tiny_checkpoint), progress=False, kv_cache_memory=f"{size}MiB", max_model_len=64)
        found = re.findall(r"Maximum concurrency for 64 tokens per request: (\d+\.\d\d)x", caplog.text)
        assert len(found) == 1, caplog.text
        held[size] = float(found[0])
    assert held[1] >= 1 and abs(held[2] - 2 * held[1]) < 0.02


def test_a_defaulted_token_budget_is_raised_to_max_num_seqs_and_logged(tiny_checkpoint, caplog):
    """max_num_seqs=3000 on the CPU ran at most 2048 sequences a step (the default budget, each decoding sequence
    taking a token of it), silently; vLLM picks a default budget that fits max_num_seqs, and so does Glimmer."""
    caplog.set_level("INFO", logger="glimmer.engine.llm_engine")
    llm = LLM(str(tiny_checkpoint), progress=False, max_num_seqs=3000, kv_cache_memory="8MiB", max_model_len=64)
    assert llm.engine.scheduler_config.max_num_batched_tokens == 3000
    assert "max_num_batched_tokens=3000 (max_num_seqs; the CPU's default is 2048)" in caplog.text
    caplog.clear()
    default = LLM(str(tiny_checkpoint), progress=False, max_num_seqs=8, kv_cache_memory="8MiB", max_model_len=64)
    assert default.engine.scheduler_config.max_num_batched_tokens == 2048 and "max_num_batched_tokens" not in \
        caplog.text
    given = LLM(str(tiny_checkpoint), progress=False, max_num_seqs=3000, max_num_batched_tokens=4096,
                kv_cache_memory="8MiB", max_model_len=64)
    assert given.engine.scheduler_config.max_num_batched_tokens == 4096


def test_a_defaulted_max_num_seqs_is_lowered_to_a_token_budget_given_below_it_and_logged(tiny_checkpoint, caplog):
    """max_num_batched_tokens=32 alone on the CPU kept the default 64 sequences, silently, though a step could never
    hold more than 32 decoding sequences' tokens; vLLM refuses a budget below max_num_seqs, and Glimmer still does
    where both are given."""
    caplog.set_level("INFO", logger="glimmer.engine.llm_engine")
    llm = LLM(str(tiny_checkpoint), progress=False, max_num_batched_tokens=32, kv_cache_memory="8MiB",
              max_model_len=64)
    assert (llm.engine.scheduler_config.max_num_seqs, llm.engine.scheduler_config.max_num_batched_tokens) == (32, 32)
    assert "max_num_seqs=32 (max_num_batched_tokens; the CPU's default is 64)" in caplog.text
    caplog.clear()
    above = LLM(str(tiny_checkpoint), progress=False, max_num_batched_tokens=128, kv_cache_memory="8MiB",
                max_model_len=64)
    assert above.engine.scheduler_config.max_num_seqs == 64 and "max_num_seqs" not in caplog.text
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens=32 is below max_num_seqs=64"):
        LLM(str(tiny_checkpoint), progress=False, max_num_seqs=64, max_num_batched_tokens=32, kv_cache_memory="8MiB",
            max_model_len=64)


@pytest.mark.parametrize(("variable", "value"), [("GLIMMER_KERNELS", "triton"), ("GLIMMER_KERNELS", "off"),
                                                 ("GLIMMER_PDL", "false-ish"), ("GLIMMER_PDL", "2"),
                                                 ("GLIMMER_GEMM", "cublaslt"), ("GLIMMER_GEMM", "0")])
def test_a_kernel_switch_that_is_not_a_setting_is_refused_naming_it(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"{variable}='{value}' is not a setting"):
        LLM("/nonexistent/model/dir", progress=False)  # before the model is looked for


@pytest.mark.parametrize(("variable", "value", "forced", "pdl", "tuned"), [
    ("GLIMMER_KERNELS", "torch", True, True, False), ("GLIMMER_KERNELS", " Torch ", True, True, False),
    ("GLIMMER_KERNELS", "auto", False, True, True), ("GLIMMER_KERNELS", "", False, True, True),
    ("GLIMMER_PDL", "0", False, False, True), ("GLIMMER_PDL", "off", False, False, True),
    ("GLIMMER_PDL", "FALSE", False, False, True), ("GLIMMER_PDL", "1", False, True, True),
    ("GLIMMER_PDL", "on", False, True, True),
    ("GLIMMER_GEMM", "cublas", False, True, False), ("GLIMMER_GEMM", " CUBLAS", False, True, False),
    ("GLIMMER_GEMM", "tuned", False, True, True), ("GLIMMER_GEMM", "auto", False, True, True),
])
def test_kernel_switch_settings(monkeypatch, variable, value, forced, pdl, tuned):
    from glimmer.model.kernels.support import dependent_launch_allowed, gemm_tuning_allowed, references_forced

    for name in ("GLIMMER_KERNELS", "GLIMMER_PDL", "GLIMMER_GEMM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    assert (references_forced(), dependent_launch_allowed(), gemm_tuning_allowed()) == (forced, pdl, tuned)


def test_an_unknown_keyword_is_refused_naming_it_and_the_options():
    with pytest.raises(TypeError, match="max_num_seq: LLM has no argument 'max_num_seq'; did you mean 'max_num_seqs'"):
        LLM("/nonexistent/model/dir", progress=False, max_num_seq=4)


@pytest.mark.parametrize("typo,meant", [("dtyp", "dtype"), ("devices", "device"),
                                        ("allowed_local_media_pth", "allowed_local_media_path"),
                                        ("allow_remote_medias", "allow_remote_media"),
                                        ("generation_configs", "generation_config")])
def test_a_misspelled_keyword_of_llm_itself_names_it(typo, meant):
    """LLM's own keywords (not EngineConfig fields) are offered and listed too: they were missing from both."""
    with pytest.raises(UnsupportedArgumentError, match=f"did you mean {meant!r}") as caught:
        LLM("/nonexistent/model/dir", progress=False, **{typo: None})
    listed = str(caught.value).split("its arguments are ", 1)[1].split(", ")
    assert {"dtype", "device", "allowed_local_media_path", "allow_remote_media", "allowed_media_domains",
            "generation_config", "max_num_seqs"} <= set(listed)


@pytest.mark.parametrize("name,value,advice", [
    ("tensor_parallel_size", 2, "one device"), ("trust_remote_code", "yes", "never runs"),
    ("tokenizer", "/elsewhere", "model's directory"), ("quantization", "awq", "by its format"),
    ("hf_overrides", {"max_position_embeddings": 4}, "never patched"), ("revision", "main", "--revision"),
    ("download_dir", "/data/models", "HF_HUB_CACHE"), ("max_logprobs", 50, "fixed at vLLM's default, 20"),
    ("enable_lora", True, "LoRA adapters are not supported"), ("logprobs_mode", "processed_logprobs", "model's own"),
    ("task", "embed", "generative models only"), ("compilation_config", {"level": 0}, "enforce_eager=True"),
    ("distributed_executor_backend", "ray", "one device"), ("hf_token", "hf_abc", "HF_TOKEN"),
    ("ignore_patterns", ["*.safetensors"], "top folder"), ("ignore_patterns", "consolidated*", "top folder"),
    ("tokenizer_pool_size", -1, "0 or more"), ("swap_space", -4, "0 or more"),
    ("swap_space", float("nan"), "0 or more"),
    ("max_seq_len_to_capture", -1, "a positive integer"), ("max_seq_len_to_capture", 0, "a positive integer"),
])
def test_a_vllm_engine_argument_glimmer_lacks_is_refused_naming_what_to_do(name, value, advice):
    # vLLM's first line, LLM(model, tensor_parallel_size=..., trust_remote_code=True), was a bare TypeError
    with pytest.raises(UnsupportedArgumentError, match=f"{name}: an argument of vLLM's LLM .*{advice}") as caught:
        LLM("/nonexistent/model/dir", progress=False, **{name: value})
    assert caught.value.param == name and isinstance(caught.value, TypeError)


@pytest.mark.parametrize("name,value,fix", [
    ("distributed_executor_backend", "ray", "leave it out, or 'mp' or 'uni'"),
    ("enable_expert_parallel", True, "leave it out")])
def test_a_vllm_engine_argument_that_is_not_a_count_is_not_told_to_be_1(name, value, fix):
    """distributed_executor_backend='ray' and enable_expert_parallel=True were told to be left out "or 1", which
    neither takes (and `--distributed-executor-backend 1` is refused in turn)."""
    with pytest.raises(UnsupportedArgumentError) as caught:
        LLM("/nonexistent/model/dir", progress=False, **{name: value})
    assert str(caught.value).endswith(fix) and "or 1" not in str(caught.value)


def test_a_tokenizer_naming_the_models_directory_another_way_is_taken(tiny_checkpoint, monkeypatch):
    """tokenizer= is the model itself however the path is written: LLM(Path(dir), tokenizer=str(dir)), or
    `glimmer serve ./model --tokenizer ./model/`, were refused as another tokenizer."""
    monkeypatch.chdir(tiny_checkpoint.parent)
    path, name = tiny_checkpoint, tiny_checkpoint.name
    for model, tokenizer in [(path, str(path)), (name, f"./{name}/"), (str(path), name)]:
        LLM(model, progress=False, tokenizer=tokenizer)
    with pytest.raises(UnsupportedArgumentError, match="model's directory"):
        LLM(tiny_checkpoint, progress=False, tokenizer=str(tiny_checkpoint.parent))


def test_a_tokenizer_naming_the_embedded_models_directory_is_taken():
    """LLM("glimmer-nano", tokenizer=DIR), DIR the embedded model's directory, was refused as another tokenizer."""
    from glimmer.default_model import default_model_dir

    LLM("glimmer-nano", progress=False, kv_cache_memory="8MiB", tokenizer=str(default_model_dir()))
    with pytest.raises(UnsupportedArgumentError, match="model's directory"):
        LLM("glimmer-nano", progress=False, tokenizer="glimmer-nano-dflash")


def test_vllm_engine_arguments_that_change_nothing_are_taken(tiny_checkpoint):
    llm = LLM(str(tiny_checkpoint), progress=False, tensor_parallel_size=1, trust_remote_code=True,
              tokenizer=str(tiny_checkpoint), quantization=None, kv_cache_dtype="auto", swap_space=4,
              enable_chunked_prefill=True, disable_log_stats=True, max_seq_len_to_capture=8192,
              # common in vLLM scripts, and refused as misspellings before
              max_logprobs=20, enable_lora=False, distributed_executor_backend="mp", compilation_config=None,
              served_model_name="my-model", logprobs_mode="raw_logprobs", mm_processor_kwargs=None,
              download_dir=None, task="generate", enable_sleep_mode=False, skip_tokenizer_init=False)
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids


def test_vllm_engine_arguments_at_their_defaults_are_taken_and_others_refused_saying_why(tiny_checkpoint):
    """vLLM's LLM(...) takes these (older scripts pass disable_async_output_proc; scheduling_policy='fcfs' is its
    default); they were refused as misspellings ("did you mean 'model'?" for model_impl)."""
    llm = LLM(str(tiny_checkpoint), progress=False, scheduling_policy="fcfs", disable_async_output_proc=True,
              max_parallel_loading_workers=2, model_impl="auto", config_format="hf",
              # vLLM's default patterns (a Llama checkpoint's second copy in original/), and its tokenizer workers
              ignore_patterns=["original/**/*"], tokenizer_pool_size=4)
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids
    with pytest.raises(UnsupportedArgumentError, match="^scheduling_policy: .*first come, first served"):
        LLM(str(tiny_checkpoint), progress=False, scheduling_policy="priority")
    with pytest.raises(UnsupportedArgumentError, match="^model_impl: .*its own Muse Glimmer model"):
        LLM(str(tiny_checkpoint), progress=False, model_impl="transformers")


def test_vllms_compilation_and_prefill_arguments_are_taken_where_they_change_no_output(tiny_checkpoint):
    """vLLM's optimization_level, cuda_graph_sizes, max_cudagraph_capture_size and max_num_partial_prefills were
    refused as misspellings."""
    llm = LLM(str(tiny_checkpoint), progress=False, optimization_level=3, cuda_graph_sizes=[1, 2, 4],
              max_cudagraph_capture_size=512, max_num_partial_prefills=1)
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids
    with pytest.raises(UnsupportedArgumentError, match="^optimization_level: .*enforce_eager=True"):
        LLM(str(tiny_checkpoint), progress=False, optimization_level=0)


def test_vllms_compilation_level_as_an_int_is_taken_where_it_changes_no_output(tiny_checkpoint):
    """vLLM's LLM takes compilation_config=3 for {"level": 3}: it was refused, with a message saying that level 3
    changes nothing."""
    llm = LLM(str(tiny_checkpoint), progress=False, compilation_config=3)
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids
    for level in (0, 4, True, 3.0):
        with pytest.raises(UnsupportedArgumentError, match="^compilation_config: .*enforce_eager=True"):
            LLM("/nonexistent/model/dir", progress=False, compilation_config=level)
    with pytest.raises(UnsupportedArgumentError, match="^max_num_partial_prefills: .*leave it out or 1"):
        LLM(str(tiny_checkpoint), progress=False, max_num_partial_prefills=2)


def test_vllms_attention_and_loading_arguments_are_taken_where_they_change_no_output(tiny_checkpoint):
    """vLLM's attention_backend, disable_cascade_attn, use_tqdm_on_load, prefix_caching_hash_algo, ... were refused
    as misspellings; disable_sliding_window=True, which would change the model, is refused saying so."""
    llm = LLM(str(tiny_checkpoint), progress=False, attention_backend="FLASH_ATTN", disable_cascade_attn=True,
              use_tqdm_on_load=False, prefix_caching_hash_algo="sha256", disable_sliding_window=False,
              enable_prompt_embeds=False, calculate_kv_scales=False, enable_eplb=False, kv_transfer_config=None,
              max_long_partial_prefills=1, long_prefill_token_threshold=0, logits_processors=None)
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids
    with pytest.raises(UnsupportedArgumentError, match="^disable_sliding_window: .*would change its outputs"):
        LLM(str(tiny_checkpoint), progress=False, disable_sliding_window=True)


def test_vllms_lora_pooling_and_structured_outputs_arguments_are_taken_where_they_change_nothing(tiny_checkpoint):
    """vLLM's LoRA options beside enable_lora, its pooling options, guided_decoding_backend, structured_outputs_config
    and reasoning_parser were refused as misspellings of another argument ("did you mean 'max_logprobs'?" for
    max_loras), with no word of what Glimmer does instead."""
    llm = LLM(str(tiny_checkpoint), progress=False, max_lora_rank=64, max_loras=4, max_cpu_loras=8,
              fully_sharded_loras=True, lora_dtype="bfloat16", convert="none", pooler_config=None,
              override_pooler_config={}, guided_decoding_backend="auto",
              structured_outputs_config={"backend": "guidance"}, reasoning_parser="")
    assert llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids
    for name, value, fix in [
            ("convert", "embed", "generative models only"),
            ("pooler_config", {"pooling_type": "MEAN"}, "generative models only"),
            ("guided_decoding_backend", "xgrammar", "compiles every constraint with llguidance"),
            ("structured_outputs_config", {"backend": "outlines"}, "compiles every constraint with llguidance"),
            ("reasoning_parser", "deepseek_r1", "LLM.generate constrains the raw text from its start")]:
        with pytest.raises(UnsupportedArgumentError, match=rf"^{name}: an argument of vLLM's LLM .*{fix}"):
            LLM("/nonexistent/model/dir", progress=False, **{name: value})


def test_vllms_kv_cache_memory_bytes_sizes_the_kv_cache(tiny_checkpoint):
    """vLLM's LLM(kv_cache_memory_bytes=N) was refused as a misspelling ("did you mean 'kv_cache_memory'?")."""
    llm = LLM(str(tiny_checkpoint), progress=False, kv_cache_memory_bytes=8 << 20)
    assert llm.engine.config.kv_cache_memory == 8 << 20
    with pytest.raises(ConfigError, match="kv_cache_memory and kv_cache_memory_bytes .* are both given"):
        LLM(str(tiny_checkpoint), progress=False, kv_cache_memory="8MiB", kv_cache_memory_bytes=8 << 20)
    with pytest.raises(UnsupportedArgumentError, match="^num_gpu_blocks_override: .*sizes the KV cache in bytes, not "
                                                       "blocks: give --kv-cache-memory SIZE / kv_cache_memory=, N"):
        LLM(str(tiny_checkpoint), progress=False, num_gpu_blocks_override=64)


def test_vllms_load_format_naming_the_checkpoints_format_reads_it_and_another_is_refused(tiny_checkpoint,
                                                                                        same_cpu_kernels):
    """vLLM scripts pass load_format="safetensors"; it was refused ("use one of ['auto', 'dummy']")."""
    params = SamplingParams(max_tokens=3, temperature=0)
    auto = LLM(str(tiny_checkpoint), progress=False).generate([1, 2, 3], params)[0].outputs[0].token_ids
    named = LLM(str(tiny_checkpoint), progress=False, load_format="safetensors")
    assert named.generate([1, 2, 3], params)[0].outputs[0].token_ids == auto
    for load_format, weights in (("pt", "pickle"), ("gguf", "gguf")):
        with pytest.raises(ConfigError, match=rf"^load_format='{load_format}' reads {weights} weights, but "
                                              rf"{re.escape(str(tiny_checkpoint))} holds safetensors weights"):
            LLM(str(tiny_checkpoint), progress=False, load_format=load_format)


def test_a_cuda_device_is_named_as_given_when_cuda_is_absent(monkeypatch):
    """QA: --device cuda:9 was reported as device='cuda'."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"device='cuda:9' was requested but CUDA is not available here"):
        EngineConfig(model="m", device="cuda:9").resolved_device()


def test_a_cuda_device_past_the_machines_count_is_refused_naming_the_ones_there(monkeypatch):
    """QA: a device ordinal the machine lacks reached torch, which fails deep in loading (invalid device ordinal)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"device='cuda:2' was requested but this machine has 2 CUDA device\(s\), "
                                          r"cuda:0 to cuda:1"):
        EngineConfig(model="m", device="cuda:2").resolved_device()
    assert EngineConfig(model="m", device="cuda:1").resolved_device() == torch.device("cuda:1")
