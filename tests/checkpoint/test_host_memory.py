"""Weights that cannot fit in host memory are refused before anything is allocated (glimmer.checkpoint.host_memory).

In a container the memory is its cgroup's limit: the tests build a fake /proc and /sys/fs/cgroup in tmp_path."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from glimmer.checkpoint import host_memory
from glimmer.checkpoint.config_layouts import load_config
from glimmer.checkpoint.host_memory import CgroupLimit, HostMemory, read_host_memory
from glimmer.engine import kv_planner
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.engine.model_loader import load_drafter, load_model
from glimmer.errors import ConfigError
from glimmer.tiny import write_tiny_checkpoint, write_tiny_drafter

GIB = 1 << 30
KB_PER_GIB = 1 << 20
V1_UNLIMITED = "9223372036854771712"  # LONG_MAX rounded down to a 4 KiB page: cgroup v1's "no limit"


class FakeHost:
    """What /proc/meminfo, /proc/self/cgroup and the files under /sys/fs/cgroup say, written under `root`."""

    def __init__(self, root: Path):
        self.root = root

    def meminfo(self, mem_kb: int, swap_kb: int = 0) -> None:
        self.write(host_memory.MEMINFO,
                   f"MemTotal:       {mem_kb} kB\nMemFree:        1 kB\nSwapTotal:      {swap_kb} kB\n")

    def own_cgroup(self, text: str | bytes) -> None:
        self.write(host_memory.PROC_SELF_CGROUP, text)

    def cgroup_file(self, path: str, text: str | bytes) -> Path:
        """Writes `path` (relative to /sys/fs/cgroup) and returns where it lies."""
        return self.write(host_memory.CGROUP_ROOT / path, text)

    @staticmethod
    def write(path: Path, text: str | bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return path


@pytest.fixture
def host(monkeypatch, tmp_path) -> FakeHost:
    """A fake host with no /proc or cgroup files yet, in place of this machine's for the rest of the test."""
    monkeypatch.setattr(host_memory, "MEMINFO", tmp_path / "proc" / "meminfo")
    monkeypatch.setattr(host_memory, "PROC_SELF_CGROUP", tmp_path / "proc" / "self" / "cgroup")
    monkeypatch.setattr(host_memory, "CGROUP_ROOT", tmp_path / "sys" / "fs" / "cgroup")
    return FakeHost(tmp_path)


def meta_linear_of_gib(gib: int) -> nn.Module:
    """A float32 model of `gib` GiB of weights on the meta device (nothing is allocated)."""
    return nn.Linear(1 << 15, gib << 13, bias=False, device="meta")


@pytest.mark.parametrize("load_format", ["auto", "dummy"])
def test_weights_larger_than_memory_and_swap_are_refused_before_loading(tiny_checkpoint, host, load_format):
    host.meminfo(mem_kb=64, swap_kb=64)
    with pytest.raises(ConfigError, match=r"need [1-9]\d*\.\d MiB as float32 on the CPU, more than this machine's "
                                          r"0\.1 MiB of memory and swap \(/proc/meminfo.*smaller model.*GPU"):
        load_model(tiny_checkpoint, progress=False, load_format=load_format)


def test_the_weights_refusal_names_its_fixes_as_options_and_as_llm_arguments(tiny_checkpoint, host, tmp_path):
    """Raised from LLM(...), the refusal named only command-line flags (--device cuda, --dtype bfloat16), which the
    Python API has no use for; it names both forms, as the KV cache's refusals do (the drafter's too)."""
    from glimmer import LLM

    fixes = ('or use a GPU with room for it (--device cuda / device="cuda"); --dtype bfloat16 / dtype="bfloat16" '
             'halves it')
    host.meminfo(mem_kb=64, swap_kb=64)
    with pytest.raises(ConfigError) as refused:
        LLM(str(tiny_checkpoint), progress=False, device="cpu")
    assert str(refused.value).endswith(fixes), refused.value
    drafter_dir = write_tiny_drafter(tmp_path / "drafter", tiny_checkpoint)
    with pytest.raises(ConfigError) as refused:
        load_drafter(drafter_dir, load_config(tiny_checkpoint), lambda: 0, progress=False)
    assert str(refused.value).endswith(fixes), refused.value


def test_weights_that_fit_in_memory_plus_swap_load(tiny_checkpoint, host):
    size = host_memory.parameter_bytes(load_model(tiny_checkpoint, progress=False).model)
    host.meminfo(mem_kb=size // 2048, swap_kb=size // 1024)  # memory alone is too small, memory + swap is not
    assert load_model(tiny_checkpoint, progress=False, load_format="dummy").weight_layout == "dummy"


def test_a_drafter_that_fits_alone_but_not_beside_the_model_is_refused_before_it_loads(tiny_checkpoint, host,
                                                                                        tmp_path):
    """The drafter loads once the model has (minutes for the 30B), and its weights were never weighed: beside a model
    that fits, they were materialized past the memory, to the kernel's OOM killer."""
    drafter_dir = write_tiny_drafter(tmp_path / "drafter", tiny_checkpoint)
    config = EngineConfig(str(tiny_checkpoint), progress=False, max_model_len=64,
                          speculative_config={"method": "dflash", "model": str(drafter_dir)})
    engine = LLMEngine(config)  # no /proc/meminfo yet: nothing is checked
    target, drafter = (host_memory.parameter_bytes(m) for m in (engine.loaded.model, engine.drafter.model))
    assert drafter < target
    host.meminfo(mem_kb=(target + drafter) // 1024 - 1)  # room for the model, and for the drafter alone
    with pytest.raises(ConfigError, match=r"^the speculative drafter's weights need \d+\.\d MiB as float32 on the CPU "
                                          r"beside the model's \d+\.\d MiB, more than this machine's .*; serve "
                                          r"without the drafter \(leave out --speculative-config"):
        LLMEngine(config)
    host.meminfo(mem_kb=(target + drafter + engine._kv_budget + kv_planner.CPU_HEADROOM_BYTES) // 1024 + 1)
    assert LLMEngine(config).drafter is not None


def test_a_tied_embedding_counts_once_in_the_weights_weighed(tiny_checkpoint, host, tmp_path):
    """The lm_head a config ties to the embedding was counted beside it on the meta device: a model that fits was
    refused, the size said twice the embedding's too large."""
    tied = Path(shutil.copytree(tiny_checkpoint, tmp_path / "tied"))
    config = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    loaded = load_model(tied, progress=False, load_format="dummy")  # no /proc/meminfo yet: nothing is checked
    assert loaded.model.lm_head.weight is loaded.model.embed_tokens.weight
    weights = host_memory.parameter_bytes(loaded.model)
    host.meminfo(mem_kb=weights // 1024 + 1)  # room for the weights, not for the embedding twice
    assert load_model(tied, progress=False, load_format="dummy").model.lm_head.weight.numel()
    host.meminfo(mem_kb=weights // 1024 - 1)
    with pytest.raises(ConfigError, match=f"need {weights / 2**20:.1f} MiB as float32"):
        load_model(tied, progress=False, load_format="dummy")


def test_unreadable_meminfo_skips_the_check(tiny_checkpoint, host):
    assert read_host_memory() is None
    load_model(tiny_checkpoint, progress=False)


@pytest.mark.parametrize(("own_cgroup", "limit_folder"), [
    ("0::/docker/abc\n", "docker/abc"),  # the host's view of the hierarchy
    ("0::/\n", ""),  # a private cgroup namespace: the mount is the container's own cgroup
    ("0::/docker/abc\n", ""),  # the path from the host's root, the mount the container's own cgroup
])
def test_cgroup_v2_memory_max_is_the_memory(host, own_cgroup, limit_folder):
    host.meminfo(mem_kb=256 * KB_PER_GIB)
    host.own_cgroup(own_cgroup)
    limit = host.cgroup_file(f"{limit_folder}/memory.max".lstrip("/"), f"{16 * GIB}\n")
    assert read_host_memory() == HostMemory(memory_bytes=16 * GIB, swap_bytes=0, host_bytes=256 * GIB,
                                            cgroup_limits=(CgroupLimit(16 * GIB, limit),))


def test_cgroup_v2_max_is_no_limit(host):
    host.meminfo(mem_kb=256 * KB_PER_GIB, swap_kb=8 * KB_PER_GIB)
    host.own_cgroup("0::/docker/abc\n")
    host.cgroup_file("docker/abc/memory.max", "max\n")
    host.cgroup_file("docker/abc/memory.swap.max", "max\n")
    host.cgroup_file("docker/memory.max", "max\n")
    assert read_host_memory() == HostMemory(memory_bytes=256 * GIB, swap_bytes=8 * GIB, host_bytes=264 * GIB)


def test_a_parent_cgroup_limit_smaller_than_its_child_binds(host):
    host.meminfo(mem_kb=256 * KB_PER_GIB)
    host.own_cgroup("0::/kubepods/pod1/abc\n")
    host.cgroup_file("kubepods/pod1/abc/memory.max", f"{16 * GIB}\n")
    parent = host.cgroup_file("kubepods/pod1/memory.max", f"{8 * GIB}\n")
    host.cgroup_file("kubepods/memory.max", f"{32 * GIB}\n")
    memory = read_host_memory()
    assert (memory.memory_bytes, memory.cgroup_limits) == (8 * GIB, (CgroupLimit(8 * GIB, parent),))


@pytest.mark.parametrize(("swap_max", "swap_bytes"), [("0", 0), (str(GIB), GIB), ("max", 64 * GIB)])
def test_cgroup_v2_memory_swap_max_is_the_swap(host, swap_max, swap_bytes):
    host.meminfo(mem_kb=256 * KB_PER_GIB, swap_kb=64 * KB_PER_GIB)
    host.own_cgroup("0::/docker/abc\n")
    host.cgroup_file("docker/abc/memory.max", f"{16 * GIB}\n")
    host.cgroup_file("docker/abc/memory.swap.max", f"{swap_max}\n")
    assert read_host_memory().total_bytes == 16 * GIB + swap_bytes


@pytest.mark.parametrize(("limit", "memsw", "memory_bytes", "swap_bytes"), [
    (str(16 * GIB), None, 16 * GIB, 64 * GIB),
    (V1_UNLIMITED, None, 256 * GIB, 64 * GIB),
    # docker --memory=16g --memory-swap=16g: no swap at all, though the host has 64 GiB of it
    (str(16 * GIB), str(16 * GIB), 16 * GIB, 0),
    (str(16 * GIB), str(20 * GIB), 16 * GIB, 4 * GIB),
    (str(16 * GIB), V1_UNLIMITED, 16 * GIB, 64 * GIB),
])
def test_cgroup_v1_limit_in_bytes_is_the_memory_and_memsw_leaves_the_swap_beside_it(host, limit, memsw, memory_bytes,
                                                                                     swap_bytes):
    host.meminfo(mem_kb=256 * KB_PER_GIB, swap_kb=64 * KB_PER_GIB)
    host.own_cgroup("9:pids:/docker/abc\n4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n")
    host.cgroup_file("memory/docker/abc/memory.limit_in_bytes", f"{limit}\n")
    host.cgroup_file("memory/memory.limit_in_bytes", f"{V1_UNLIMITED}\n")
    if memsw is not None:
        host.cgroup_file("memory/docker/abc/memory.memsw.limit_in_bytes", f"{memsw}\n")
    memory = read_host_memory()
    assert (memory.memory_bytes, memory.swap_bytes) == (memory_bytes, swap_bytes)
    assert ("memory.memsw.limit_in_bytes" in memory.describe()) == (memsw is not None and memsw != V1_UNLIMITED)


CGROUP = "proc/self/cgroup"
MEMORY_MAX = "sys/fs/cgroup/docker/abc/memory.max"
A_FOLDER = None


@pytest.mark.parametrize("files", [
    pytest.param({}, id="no-proc-self-cgroup"),
    pytest.param({CGROUP: A_FOLDER}, id="proc-self-cgroup-a-folder"),
    pytest.param({CGROUP: b"0::/docker/\xff\xfe\n", MEMORY_MAX: str(GIB)}, id="proc-self-cgroup-not-utf8"),
    pytest.param({CGROUP: "nonsense\n::\n0:\n0::docker/abc\n", MEMORY_MAX: str(GIB)}, id="proc-self-cgroup-odd"),
    pytest.param({CGROUP: "0::/docker/abc\n", MEMORY_MAX: A_FOLDER}, id="memory-max-a-folder"),
    pytest.param({CGROUP: "0::/docker/abc\n", MEMORY_MAX: b"\xff\xfe"}, id="memory-max-not-utf8"),
    pytest.param({CGROUP: "0::/docker/abc\n", MEMORY_MAX: "-1\n"}, id="memory-max-negative"),
    pytest.param({CGROUP: "0::/docker/abc\n", MEMORY_MAX: "16G\n"}, id="memory-max-with-a-unit"),
    pytest.param({CGROUP: "0::/docker/abc\n", MEMORY_MAX: ""}, id="memory-max-empty"),
    # a cgroup outside the process's namespace: its path must not lead out of /sys/fs/cgroup
    pytest.param({CGROUP: "0::/../../../escaped\n", "sys/fs/cgroup/memory.max": "max\n",
                  "escaped/memory.max": str(GIB)}, id="path-outside-the-mount"),
])
def test_unreadable_or_odd_cgroup_files_leave_meminfo_alone(host, files):
    host.meminfo(mem_kb=256 * KB_PER_GIB, swap_kb=8 * KB_PER_GIB)
    for path, text in files.items():
        if text is A_FOLDER:
            (host.root / path).mkdir(parents=True)
        else:
            host.write(host.root / path, text)
    assert read_host_memory() == HostMemory(memory_bytes=256 * GIB, swap_bytes=8 * GIB, host_bytes=264 * GIB)


def test_weights_beyond_the_cgroup_limit_are_refused_naming_it(host):
    host.meminfo(mem_kb=256 * KB_PER_GIB)
    host.own_cgroup("0::/docker/abc\n")
    limit = host.cgroup_file("docker/abc/memory.max", f"{8 * GIB}\n")
    model = meta_linear_of_gib(16)
    expected = (f"need 16.0 GiB as float32 on the CPU, more than the 8.0 GiB of memory and swap this process's "
                f"cgroup allows ({limit} = 8.0 GiB; the host has 256.0 GiB); load a smaller model")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        host_memory.check_fits_in_host_memory(model, "cpu", torch.float32)
    limit.write_text("max\n")
    host_memory.check_fits_in_host_memory(model, "cpu", torch.float32)


def test_a_kv_cache_beyond_the_cgroup_limit_less_the_weights_is_refused_naming_it(host):
    host.meminfo(mem_kb=256 * KB_PER_GIB, swap_kb=64 * KB_PER_GIB)
    host.own_cgroup("0::/docker/abc\n")
    memory_limit = host.cgroup_file("docker/abc/memory.max", f"{16 * GIB}\n")
    swap_limit = host.cgroup_file("docker/abc/memory.swap.max", f"{4 * GIB}\n")
    weights = [meta_linear_of_gib(8)]
    expected = (f"kv_cache_memory={16 * GIB:,} bytes is more than the {12 * GIB:,} bytes the weights' 8.0 GiB leave "
                f"of the 20.0 GiB of memory and swap this process's cgroup allows ({memory_limit} = 16.0 GiB, "
                f"{swap_limit} = 4.0 GiB; the host has 320.0 GiB)")
    with pytest.raises(ConfigError, match=re.escape(expected)):
        host_memory.check_kv_cache_fits_in_host_memory(16 * GIB, weights)
    host_memory.check_kv_cache_fits_in_host_memory(12 * GIB, weights)


def test_a_drafter_loaded_alone_that_does_not_fit_is_refused_as_the_drafter(tiny_checkpoint, host, tmp_path):
    """load_drafter without the model beside it (target_model left out) was told the model's refusal ("the model's
    weights need ...; load a smaller model") about the drafter."""
    drafter_dir = write_tiny_drafter(tmp_path / "drafter", tiny_checkpoint)
    host.meminfo(mem_kb=1)
    with pytest.raises(ConfigError, match=r"^the speculative drafter's weights need \d+\.\d MiB as float32 on the CPU, "
                                          r"more than this machine's .*; serve without the drafter .* or use a GPU "
                                          r"with room for it \(--device cuda / device=\"cuda\"\)"):
        load_drafter(drafter_dir, load_config(tiny_checkpoint), lambda: 0, progress=False)


def test_the_cpu_s_default_kv_cache_takes_what_the_weights_leave_and_a_room_for_no_sequence_is_refused(
        tiny_checkpoint, host, caplog):
    """A size given was weighed against the memory the weights leave; the default (up to 2 GiB) was not, so beside
    weights that nearly fill the memory it was allocated, to be killed under load. It is lowered to the room left less
    a margin for the steps, with a warning, where that still holds a sequence, and refused naming the context it
    holds where not."""
    config = EngineConfig(str(tiny_checkpoint), progress=False, max_model_len=64, max_num_seqs=2)
    engine = LLMEngine(config)  # no /proc/meminfo yet: nothing is checked
    weights, default = host_memory.parameter_bytes(engine.loaded.model), engine._kv_budget
    headroom = kv_planner.CPU_HEADROOM_BYTES
    host.meminfo(mem_kb=(weights + default + headroom) // 1024 + 1)
    assert LLMEngine(config)._kv_budget == default
    short = 10 << 10  # room for about half the default, still more than one sequence of 64 tokens needs
    host.meminfo(mem_kb=(weights + default + headroom - short) // 1024)
    with caplog.at_level(logging.WARNING, logger="glimmer.engine.llm_engine"):
        lowered = LLMEngine(config)
    assert default - short - 1024 <= lowered._kv_budget <= default - short
    assert re.search(rf"the CPU's default KV cache \(what max_num_seqs sequences of max_model_len need, 2 GiB at "
                     rf"most: {default:,} bytes for max_num_seqs=2, max_model_len=64\) is lowered to "
                     rf"{lowered._kv_budget:,} bytes: the weights leave [\d,]+ bytes of .*, less 1024 MiB for the "
                     r"steps; give --kv-cache-memory SIZE / kv_cache_memory= to choose its size", caplog.text)
    host.meminfo(mem_kb=(weights + headroom) // 1024 + 1)  # a KiB or so beside the margin: not one page of 64 tokens
    with pytest.raises(ConfigError, match=r"the KV cache \(\d[\d,]* bytes\) cannot hold one sequence of "
                                          r"max_model_len=64 tokens .*lower the context"):
        LLMEngine(config)


def test_serving_the_30b_geometry_on_a_small_cpu_fails_with_one_line(tmp_path):
    memory = read_host_memory()
    if memory is None or memory.total_bytes > 100 << 30:
        pytest.skip("this machine could hold the 30B geometry's float32 weights")
    from serve_process import ServeProcess

    from glimmer.cli import main

    assert main(["make-tiny", str(tmp_path / "t30"), "--preset", "30b", "--config-only"]) == 0
    server = ServeProcess(["-m", "glimmer.cli", "serve", str(tmp_path / "t30"), "--load-format", "dummy", "--device",
                           "cpu"])  # --port 0: not the default 8000, which the Quick start's `glimmer serve` may hold
    try:
        server.process.wait(timeout=300)
    finally:
        output = server.stop()
    assert server.process.returncode == 2, output
    # the log's INFO lines (the tokenizer, read before the weights) and one line of error, no traceback
    errors = [line for line in output.strip().splitlines() if not line.startswith("INFO ")]
    assert len(errors) == 1 and "Traceback" not in output, output
    assert "GiB as float32 on the CPU" in errors[0]


def _nvfp4_checkpoint(tmp_path: Path) -> Path:
    return write_tiny_checkpoint(tmp_path / "nvfp4", quantize="nvfp4")


def _q8_0_gguf(tmp_path: Path) -> Path:
    from gguf import GGMLQuantizationType
    from gguf_export import export_text_gguf

    return export_text_gguf(write_tiny_checkpoint(tmp_path / "tiny"), tmp_path / "tiny.gguf",
                            GGMLQuantizationType.Q8_0)


def _mlx_4_bit_artifact(tmp_path: Path) -> Path:
    pytest.importorskip("mlx.core")
    from gguf_export import canonical_state
    from mlx_export import export_mlx_artifact

    checkpoint = write_tiny_checkpoint(tmp_path / "tiny")
    return export_mlx_artifact(checkpoint, tmp_path / "mlx", canonical_state(checkpoint), bits=4, group_size=32)


def _refused(label: str, stored: str) -> str:
    """The refusal of weights of scheme `label` that need more than the machine's memory once dequantized, `stored`
    on disk."""
    return (rf"^the model's weights need \d+\.\d MiB as float32 on the CPU \(its {label} weights, {stored} on disk, "
            "are dequantized to float32 when they load\\), more than this machine's ")


# the tiny checkpoint's quantized tensors on disk: NVFP4's codes and scales 184,576 bytes (the file 483,632 with the
# unquantized ones), the GGUF's Q8_0 blocks 417,792, MLX's 58 modules of codes, scales and biases 294,912
@pytest.mark.parametrize(("builder", "label", "stored"), [
    (_nvfp4_checkpoint, "NVFP4 W4A16", "0.2 MiB"),
    (_q8_0_gguf, "GGUF Q8_0", "0.4 MiB"),
    (_mlx_4_bit_artifact, "MLX affine 4-bit", "0.3 MiB"),
])
def test_quantized_weights_that_do_not_fit_once_dequantized_are_refused_saying_so(host, tmp_path, builder, label,
                                                                                  stored):
    """An NVFP4 checkpoint of 18 GB on disk was told its weights need 111 GiB, with no word of why, as were a Q8_0
    GGUF and a 4-bit MLX artifact: their quantized weights, dequantized on load, are named by scheme with their size
    on disk."""
    path = builder(tmp_path)
    host.meminfo(mem_kb=1)
    with pytest.raises(ConfigError, match=_refused(label, stored)):
        load_model(path, progress=False)
