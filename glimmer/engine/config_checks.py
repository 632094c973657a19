"""Checks of the engine options a Python caller passes (`LLM(...)`, `EngineConfig`): a wrong type or value is
a ConfigError naming the option and what it takes, before anything loads, never a TypeError from deep inside
the engine or an option silently taken for something else."""

from __future__ import annotations

import math
import os
import re
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

from glimmer.checkpoint.config import MAX_SIZE
from glimmer.checkpoint.formats import COMPRESSED_TENSORS, GGUF, PICKLE, SAFETENSORS
from glimmer.checkpoint.resolve import is_hub_id
from glimmer.default_model import DEFAULT_DRAFTER_NAME
from glimmer.engine.kv_planner import CPU_DEFAULT_KV_SIZING
from glimmer.engine.sampling_params import SEED_RANGE
from glimmer.engine.spec_decode import SpeculativeConfig, check_verification_budget
from glimmer.errors import ConfigError, option_and_keyword
from glimmer.model.kernels.support import check_environment
from glimmer.multimodal.settings import MediaFetchPolicy

if TYPE_CHECKING:
    from glimmer.engine.llm_engine import EngineConfig

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
               "gib": 2**30, "tib": 2**40}

VLLM_LOAD_FORMATS = {"safetensors": SAFETENSORS, "pt": PICKLE, "gguf": GGUF}
"""vLLM's load formats that name a weight format: a checkpoint in that format is read as "auto" reads it, and one in
another format is refused (as vLLM finds no weights of the format it was told)."""
LOAD_FORMATS = ("auto", "dummy", *VLLM_LOAD_FORMATS)


def parse_size(text: str) -> int:
    """Bytes from '8GiB', '512MB', '1.5gib' or a plain number of bytes; ValueError if `text` is not a size."""
    match = re.fullmatch(r"\s*([0-9]{0,20}\.?[0-9]{1,20})\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size; use e.g. 8GiB, 512MiB or a number of bytes")
    value = Fraction(match.group(1)) * _SIZE_UNITS[unit]  # exact: 1.1GB is 1,100,000,000 bytes, not 1.1e9 ± rounding
    if value.denominator != 1:  # '1.5' bytes would silently become 1
        raise ValueError(f"{text!r} is not a whole number of bytes; use e.g. 1.5GiB or 1536MiB")
    return int(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def media_fetch_policy(allowed_local_media_path: object = None, allow_remote_media: object = False,
                       allowed_media_domains: object = None, max_media_bytes: object = None,
                       media_fetch_timeout: object = None) -> MediaFetchPolicy:
    """The media policy of `LLM(...)`'s media arguments, named and bounded as `glimmer serve`'s media flags are
    (`--allowed-local-media-path`, ..., `--max-media-bytes`, `--media-fetch-timeout`); a size may be given as text
    (max_media_bytes='16MiB'). Raises ConfigError naming the argument: a string where a list belongs (each of its
    characters was taken for a directory or a host), a directory that does not exist, a size or a time that is no
    number above 0."""
    for name, values, what in (("allowed_local_media_path", allowed_local_media_path, "directories"),
                               ("allowed_media_domains", allowed_media_domains, "host names")):
        if isinstance(values, str | os.PathLike):
            raise ConfigError(f"{name}={values!r} must be a list of {what}; pass [{values!r}] for one")
        if values is not None and not isinstance(values, list | tuple):
            raise ConfigError(f"{name}={values!r} must be a list of {what} (or None for none)")
    for directory in allowed_local_media_path or ():
        if isinstance(directory, str | os.PathLike):
            MediaFetchPolicy.create([directory])  # refuses a blank one, which Path reads as the working directory
        if not isinstance(directory, str | os.PathLike) or not Path(directory).expanduser().is_dir():
            raise ConfigError(f"allowed_local_media_path: {directory!r} is not an existing directory; give the "
                              "directories whose images and videos prompts may name")
    for host in allowed_media_domains or ():
        if not isinstance(host, str):
            raise ConfigError(f"allowed_media_domains: {host!r} is not a host name; give names like "
                              "images.internal or 10.0.0.5")
    if not isinstance(allow_remote_media, bool):
        raise ConfigError(f"allow_remote_media={allow_remote_media!r} must be True or False")
    limits: dict[str, int | float] = {}
    if isinstance(max_media_bytes, str):
        try:
            max_media_bytes = parse_size(max_media_bytes)
        except ValueError as exc:
            raise ConfigError(f"max_media_bytes: {exc}") from None
    if max_media_bytes is not None:
        if not _is_int(max_media_bytes) or max_media_bytes < 1:
            raise ConfigError(f"max_media_bytes={max_media_bytes!r} must be a size of at least 1 byte (a number of "
                              f"bytes or text such as '16MiB'), or None for {MediaFetchPolicy.max_bytes >> 20} MiB")
        limits["max_bytes"] = max_media_bytes
    if media_fetch_timeout is not None:
        if isinstance(media_fetch_timeout, bool) or not isinstance(media_fetch_timeout, int | float) \
                or not 0 < media_fetch_timeout < math.inf:  # (nan too)
            raise ConfigError(f"media_fetch_timeout={media_fetch_timeout!r} must be a number of seconds above 0, or "
                              f"None for {MediaFetchPolicy.timeout_s:g}")
        limits["timeout_s"] = float(media_fetch_timeout)
    return MediaFetchPolicy.create(allowed_local_media_path, allow_remote=allow_remote_media,
                                   allowed_domains=allowed_media_domains, **limits)


def check_engine_config(config: EngineConfig) -> None:
    """Raise ConfigError for the first option of `config` of the wrong type or out of range; a size given as
    text (kv_cache_memory='8GiB') is turned into bytes, and a speculative_config into a SpeculativeConfig."""
    check_environment()  # GLIMMER_KERNELS / _PDL / _GEMM: a typo is an error here, not a silent default later
    if not isinstance(config.model, (str, os.PathLike)) or not str(config.model).strip():
        raise ConfigError(f"model={config.model!r}: required; pass a checkpoint directory, a .gguf file or a "
                          "Hugging Face Hub id (a string or an os.PathLike)")
    for name, types in (("dtype", str), ("device", str), ("chat_template", (str, os.PathLike)),
                        ("mmproj", (str, os.PathLike))):
        value = getattr(config, name)
        if value is not None and not isinstance(value, types):
            raise ConfigError(f"{name}={value!r} must be a string or None")
    # an empty name (`dtype=os.environ.get("DTYPE", "")`) is no choice, and was taken for the default as None is
    if config.dtype == "":
        raise ConfigError("dtype='' is empty; pass 'bfloat16', 'float16' or 'float32', or None ('auto') for the "
                          "device's default")
    if config.device == "":
        raise ConfigError("device='' is empty; pass 'cpu', 'cuda' or 'cuda:N', or None for the default (cuda when "
                          "available)")
    if config.chat_template is not None and not Path(config.chat_template).expanduser().is_file():
        raise ConfigError(f"chat_template={str(config.chat_template)!r} is not a file; pass the path of a Jinja "
                          "template file (or None for the checkpoint's own template)")
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        value = getattr(config, name)
        if value is not None and (not _is_int(value) or value < 1):
            raise ConfigError(f"{name}={value!r} must be a positive integer (or None for the default)")
        if value is not None and value > MAX_SIZE:  # the engine's tensors and step sizes are int64
            raise ConfigError(f"{name}={value!r} must be at most 2**63 - 1 (torch's int64)")
    seqs, budget = config.max_num_seqs, config.max_num_batched_tokens
    if seqs is not None and budget is not None and budget < seqs:  # as vLLM's SchedulerConfig refuses it
        raise ConfigError(f"max_num_batched_tokens={budget} is below max_num_seqs={seqs}: a decoding sequence takes "
                          f"a token of a step's budget, so no more than {budget} could ever run at once; raise "
                          f"{option_and_keyword('--max-num-batched-tokens')} to at least max_num_seqs, or lower "
                          f"{option_and_keyword('--max-num-seqs')}")
    if not _is_int(config.block_size) or config.block_size < 1 or config.block_size & (config.block_size - 1):
        raise ConfigError(f"block_size={config.block_size!r} must be a positive integer, a power of two (16 is the "
                          "default)")
    if isinstance(config.kv_cache_memory, str):
        try:
            config.kv_cache_memory = parse_size(config.kv_cache_memory)
        except ValueError as exc:
            raise ConfigError(f"kv_cache_memory: {exc}") from None
    if config.kv_cache_memory is not None and (not _is_int(config.kv_cache_memory) or config.kv_cache_memory <= 0):
        raise ConfigError(f"kv_cache_memory={config.kv_cache_memory!r} must be a positive number of bytes or a size "
                          "such as '8GiB' (or None: on a GPU, what gpu_memory_utilization leaves after the weights; on "
                          f"the CPU, {CPU_DEFAULT_KV_SIZING})")
    utilization = config.gpu_memory_utilization
    if isinstance(utilization, bool) or not isinstance(utilization, (int, float)) or not 0 < utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization={utilization!r} must be a fraction in (0, 1]")
    for name in ("enable_prefix_caching", "enforce_eager", "allow_pickle", "progress"):
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"{name}={getattr(config, name)!r} must be True or False")
    if config.async_scheduling is not None and not isinstance(config.async_scheduling, bool):
        raise ConfigError(f"async_scheduling={config.async_scheduling!r} must be True, False or None (on with CUDA)")
    if config.load_format not in LOAD_FORMATS:
        raise ConfigError(f"load_format={config.load_format!r} is not supported; use one of {list(LOAD_FORMATS)}")
    if not _is_int(config.seed) or not SEED_RANGE[0] <= config.seed < SEED_RANGE[1]:
        raise ConfigError(f"seed={config.seed!r} must be an integer in [-2**63, 2**64)")
    if config.speculative_config is not None:
        config.speculative_config = SpeculativeConfig.parse(config.speculative_config)
        drafter = config.speculative_config.model
        if config.speculative_config.drafter_path() is None and not is_hub_id(drafter):
            raise ConfigError(f"speculative_config.model={drafter!r} does not exist; pass the drafter's directory, its "
                              f"head.pt or .gguf file, a Hugging Face Hub id (owner/name), or "
                              f"{DEFAULT_DRAFTER_NAME!r} (the embedded drafter)")
        k = config.speculative_config.num_speculative_tokens
        if k is not None and config.max_num_batched_tokens is not None:  # else known once the drafter is read
            check_verification_budget(config.max_num_batched_tokens, k)


def check_weight_format(load_format: str, found: str, path: Path) -> None:
    """Raises ConfigError where `load_format` names a weight format (vLLM's "safetensors", "pt", "gguf") other than
    `found`, the format of the checkpoint at `path`."""
    expected = VLLM_LOAD_FORMATS.get(load_format)
    if expected == SAFETENSORS and found == COMPRESSED_TENSORS:  # safetensors files of packed weights, as vLLM reads
        return
    if expected is not None and expected != found:
        raise ConfigError(f"load_format={load_format!r} reads {expected} weights, but {path} holds {found} weights; "
                          "leave load_format out ('auto') to read them")
