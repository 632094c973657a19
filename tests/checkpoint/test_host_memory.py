"""Weights that cannot fit in host memory are refused before anything is allocated (glimmer.checkpoint.host_memory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from glimmer.checkpoint import host_memory
from glimmer.engine.model_loader import load_model
from glimmer.errors import ConfigError


@pytest.fixture
def meminfo(monkeypatch, tmp_path):
    """set(mem_kb, swap_kb): what /proc/meminfo reports, for the rest of the test."""

    def set_meminfo(mem_kb: int, swap_kb: int = 0) -> None:
        path = tmp_path / "meminfo"
        path.write_text(f"MemTotal:       {mem_kb} kB\nMemFree:        1 kB\nSwapTotal:      {swap_kb} kB\n")
        monkeypatch.setattr(host_memory, "MEMINFO", path)

    return set_meminfo


@pytest.mark.parametrize("load_format", ["auto", "dummy"])
def test_weights_larger_than_memory_and_swap_are_refused_before_loading(tiny_checkpoint, meminfo, load_format):
    meminfo(mem_kb=64, swap_kb=64)
    with pytest.raises(ConfigError, match=r"need 0\.0 GiB as float32 on the CPU, more than this machine's 0\.0 GiB "
                                          r"of memory and swap.*smaller model.*GPU"):
        load_model(tiny_checkpoint, progress=False, load_format=load_format)


def test_weights_that_fit_in_memory_plus_swap_load(tiny_checkpoint, meminfo):
    size = host_memory.parameter_bytes(load_model(tiny_checkpoint, progress=False).model)
    meminfo(mem_kb=size // 2048, swap_kb=size // 1024)  # memory alone is too small, memory + swap is not
    assert load_model(tiny_checkpoint, progress=False, load_format="dummy").weight_layout == "dummy"


def test_unreadable_meminfo_skips_the_check(tiny_checkpoint, monkeypatch, tmp_path):
    monkeypatch.setattr(host_memory, "MEMINFO", tmp_path / "absent")
    assert host_memory.host_memory_bytes() is None
    load_model(tiny_checkpoint, progress=False)


def test_serving_the_30b_geometry_on_a_small_cpu_fails_with_one_line(tmp_path):
    if (host_memory.host_memory_bytes() or 1 << 60) > 100 << 30:
        pytest.skip("this machine could hold the 30B geometry's float32 weights")
    cli = [sys.executable, "-m", "glimmer.cli"]
    subprocess.run([*cli, "make-tiny", str(tmp_path / "t30"), "--preset", "30b", "--config-only"], check=True,
                   capture_output=True)
    done = subprocess.run([*cli, "serve", str(tmp_path / "t30"), "--load-format", "dummy", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "GiB as float32 on the CPU" in done.stderr
