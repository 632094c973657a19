"""Engine options passed from Python (`LLM(...)`, `EngineConfig`): a wrong type or value is a ConfigError
naming the option before anything loads; sizes may be given as text like the CLI's."""

from __future__ import annotations

import pytest

from glimmer import LLM
from glimmer.engine.config_checks import parse_size
from glimmer.engine.llm_engine import EngineConfig
from glimmer.errors import ConfigError


@pytest.mark.parametrize(("option", "value", "message"), [
    ("max_num_seqs", "8", "max_num_seqs='8' must be a positive integer"),
    ("max_num_seqs", 0, "max_num_seqs=0 must be a positive integer"),
    ("max_num_batched_tokens", True, "max_num_batched_tokens=True must be a positive integer"),
    ("max_model_len", 1.5, "max_model_len=1.5 must be a positive integer"),
    ("block_size", None, "block_size=None must be a positive integer"),
    ("kv_cache_memory", "lots", "kv_cache_memory: 'lots' is not a size"),
    ("kv_cache_memory", -5, "kv_cache_memory=-5 must be a positive number of bytes"),
    ("kv_cache_memory", 2.5e9, "kv_cache_memory=2500000000.0 must be a positive number of bytes"),
    ("gpu_memory_utilization", "x", "gpu_memory_utilization='x' must be a fraction in \\(0, 1\\]"),
    ("gpu_memory_utilization", 1.5, "gpu_memory_utilization=1.5 must be a fraction"),
    ("enforce_eager", "yes", "enforce_eager='yes' must be True or False"),
    ("enable_prefix_caching", 1, "enable_prefix_caching=1 must be True or False"),
    ("async_scheduling", "on", "async_scheduling='on' must be True, False or None"),
    ("load_format", "pt", "load_format='pt' is not supported; use one of \\['auto', 'dummy'\\]"),
    ("seed", "a", "seed='a' must be an integer"),
    ("dtype", 16, "dtype=16 must be a string or None"),
])
def test_a_wrong_option_is_refused_naming_it_before_anything_loads(option, value, message):
    with pytest.raises(ConfigError, match=message):
        LLM("/nonexistent/model/dir", progress=False, **{option: value})  # refused before the model is looked for


def test_sizes_as_text_are_bytes_as_on_the_command_line(tiny_checkpoint):
    assert EngineConfig(model="m", kv_cache_memory="1.5GiB").kv_cache_memory == 1.5 * 2**30
    assert EngineConfig(model="m", kv_cache_memory="512MB").kv_cache_memory == 512 * 10**6
    llm = LLM(str(tiny_checkpoint), progress=False, kv_cache_memory="64MiB")
    assert llm.engine.config.kv_cache_memory == 64 * 2**20
    assert [parse_size(t) for t in ("8GiB", "100", "2kb")] == [8 * 2**30, 100, 2000]
    with pytest.raises(ValueError, match="is not a size"):
        parse_size("8 gigs")
