"""The CPU engine's thread count in a container with a CPU quota (`glimmer/engine/cpu_threads.py`)."""

from __future__ import annotations

import pytest
import torch

from glimmer.engine import cpu_threads
from glimmer.engine.cpu_threads import cgroup_cpu_limit, fit_threads_to_cpu_quota, omp_num_threads_set
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.errors import ConfigError


def _cgroup(root, version: int, quota: str, period: str = "100000"):
    if version == 2:
        (root / "cpu.max").write_text(f"{quota} {period}\n")
    else:
        (root / "cpu").mkdir()
        (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text(f"{period}\n")
    return root


@pytest.mark.parametrize(("version", "quota", "limit"), [
    (2, "200000", 2), (2, "150000", 2), (2, "20000", 1), (2, "max", None),
    (1, "300000", 3), (1, "50000", 1), (1, "-1", None),
])
def test_the_cgroup_quota_is_read_as_whole_cpus_rounded_up(tmp_path, version, quota, limit):
    assert cgroup_cpu_limit(_cgroup(tmp_path, version, quota)) == limit


def test_no_cgroup_files_is_no_limit(tmp_path):
    assert cgroup_cpu_limit(tmp_path) is None


def _proc_cgroup(tmp_path, text: str):
    (tmp_path / "proc_self_cgroup").write_text(text)
    return tmp_path / "proc_self_cgroup"


def _v2_quota(root, path: str, quota: str):
    folder = root.joinpath(*path.strip("/").split("/"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.max").write_text(f"{quota} 100000\n")


@pytest.fixture
def fs(tmp_path):
    (tmp_path / "fs").mkdir()
    return tmp_path / "fs"


def test_a_nested_v2_cgroups_own_quota_counts(tmp_path, fs):
    """A systemd service with CPUQuota=200% found `max` at the root and ran a thread per host core."""
    _v2_quota(fs, "/", "max")
    _v2_quota(fs, "/system.slice", "max")
    _v2_quota(fs, "/system.slice/glimmer.service", "200000")
    assert cgroup_cpu_limit(fs, _proc_cgroup(tmp_path, "0::/system.slice/glimmer.service\n")) == 2


def test_an_ancestors_quota_limits_the_cgroups_below_it(tmp_path, fs):
    _v2_quota(fs, "/kubepods/pod1", "300000")
    _v2_quota(fs, "/kubepods/pod1/ctr", "max")
    _v2_quota(fs, "/kubepods", "800000")
    assert cgroup_cpu_limit(fs, _proc_cgroup(tmp_path, "0::/kubepods/pod1/ctr\n")) == 3
    _v2_quota(fs, "/kubepods/pod1/ctr", "100000")  # the tightest on the path, wherever it is
    assert cgroup_cpu_limit(fs, _proc_cgroup(tmp_path, "0::/kubepods/pod1/ctr\n")) == 1


def test_max_all_the_way_up_is_no_limit(tmp_path, fs):
    for path in ("/", "/a", "/a/b"):
        _v2_quota(fs, path, "max")
    assert cgroup_cpu_limit(fs, _proc_cgroup(tmp_path, "0::/a/b\n")) is None


def test_a_nested_v1_cpu_cgroups_quota_counts(tmp_path, fs):
    _cgroup(fs, 1, "-1")
    folder = fs / "cpu" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("150000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    proc = _proc_cgroup(tmp_path, "4:memory:/docker/abc\n3:cpuacct:/elsewhere\n2:cpu,cpuacct:/docker/abc\n")
    assert cgroup_cpu_limit(fs, proc) == 2


@pytest.mark.parametrize("proc_text", [
    None, "", "garbage\n", "0::relative/path\n", "0::/../outside\n", "0::/no/such/cgroup\n",
])
def test_a_missing_or_malformed_proc_self_cgroup_falls_back_to_the_root(tmp_path, fs, proc_text):
    _cgroup(fs, 2, "200000")
    _v2_quota(tmp_path, "/outside", "100000")
    proc = tmp_path / "missing" if proc_text is None else _proc_cgroup(tmp_path, proc_text)
    assert cgroup_cpu_limit(fs, proc) == 2


@pytest.fixture
def two_threads(monkeypatch):
    """torch runs 2 threads for the test (as a host with more cores than the quota would) and its count after."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_cpu_engine_runs_no_more_threads_than_the_containers_quota(tmp_path, monkeypatch, two_threads, make_tiny):
    """torch sized its pool by the host's cores: a container allowed 1 CPU ran a thread per core, throttled."""
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", _cgroup(tmp_path, 2, "100000"))
    LLMEngine(EngineConfig(model=str(make_tiny()), device="cpu", kv_cache_memory=8 << 20, progress=False))
    assert torch.get_num_threads() == 1


def test_omp_num_threads_or_a_larger_quota_leaves_the_thread_count(tmp_path, monkeypatch, two_threads):
    fit_threads_to_cpu_quota(_cgroup(tmp_path, 2, "400000"))
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    fit_threads_to_cpu_quota(tmp_path)
    assert torch.get_num_threads() == 2
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    fit_threads_to_cpu_quota(tmp_path)
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "4,", "0,2", "2 1", "0x2"])
def test_an_omp_num_threads_openmp_ignores_is_refused_not_taken_for_a_choice(tmp_path, monkeypatch, two_threads,
                                                                             make_tiny, value):
    """libgomp warns of such a value and runs a thread per core; the engine took it for the operator's count and left
    the cgroup's quota unapplied."""
    monkeypatch.setattr(cpu_threads, "CGROUP_ROOT", _cgroup(tmp_path, 2, "100000"))
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(ConfigError, match=r"OMP_NUM_THREADS=.* is not a thread count: .*unset it"):
        LLMEngine(EngineConfig(model=str(make_tiny()), device="cpu", kv_cache_memory=8 << 20, progress=False))
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(("value", "set_"), [("4", True), (" 2 , 1", True), ("+3", True), ("08", True), ("", False),
                                             ("  ", False)])
def test_omp_num_threads_is_read_as_openmp_reads_it(value, set_):
    assert omp_num_threads_set({"OMP_NUM_THREADS": value}) is set_


def test_a_blank_omp_num_threads_leaves_the_quota_applied(tmp_path, monkeypatch, two_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", " ")
    fit_threads_to_cpu_quota(_cgroup(tmp_path, 2, "100000"))
    assert torch.get_num_threads() == 1
