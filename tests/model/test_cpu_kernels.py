"""The CPU's C kernels (glimmer/model/kernels/cpu) against their torch references, which stay the oracle: every
kernel on random inputs (ragged decode batches, window and block boundaries, tables starting past position 0,
poisoned unused cache slots, strided inputs, the OpenMP-sized shapes), bad indices refused, the dispatchers'
choices, the build cache, and the fallback where no compiler works."""

from __future__ import annotations

import ctypes
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glimmer.model import kernels
from glimmer.model.kernels import cpu
from glimmer.model.kernels.paged_attention import decode_attention_cpu, paged_attention_torch
from glimmer.model.kernels.qk_norm_rope import HeadLayout, qk_norm_rope_store_cpu, qk_norm_rope_store_torch
from glimmer.model.kernels.residual_norm import NormSpec, residual_norm_cpu, residual_norm_torch
from glimmer.model.kernels.silu_mul import silu_mul_cpu, silu_mul_torch
from glimmer.model.layers import RotaryTable

sys.path.insert(0, str(Path(__file__).parent))
from paged_cases import make_case  # noqa: E402

pytestmark = pytest.mark.skipif(cpu.library() is None, reason="no C compiler builds the CPU kernels here")
CLOSE = dict(rtol=1e-5, atol=1e-5)  # float32 rounding: the kernels sum in another order than torch


def _unoptimized(tmp_path: Path) -> list[str]:
    """The compiler, with -O0 after the build's -O3: the tests of how builds are cached, tried, refused and loaded
    build the real sources in a tenth of the time (an AddressSanitizer build in a twentieth)."""
    wrapper = tmp_path / "unoptimizedcc"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.join(cpu._compiler())} "$@" -O0\n')
    wrapper.chmod(0o755)
    return [str(wrapper)]


@pytest.mark.parametrize("rows,width", [(1, 512), (7, 96), (600, 512)])  # the last runs the OpenMP loop
@pytest.mark.parametrize("first_layer", [False, True])
def test_residual_norm(rows, width, first_layer):
    generator = torch.Generator().manual_seed(rows)
    h = None if first_layer else torch.randn(rows, width, generator=generator) * 3
    residual = torch.randn(rows, width, generator=generator) * 5
    post = None if first_layer else NormSpec(torch.randn(width, generator=generator), 1e-8, 1.0)
    following = NormSpec(torch.randn(width, generator=generator), 1e-6, 0.0 if first_layer else 1.0)
    got_residual, got = residual_norm_cpu(h, residual, post, following)
    want_residual, want = residual_norm_torch(h, residual, post, following)
    torch.testing.assert_close(got_residual, want_residual, **CLOSE)
    torch.testing.assert_close(got, want, **CLOSE)
    if first_layer:
        assert got_residual is residual  # no copy, as the reference


@pytest.mark.parametrize("n", [1, 5, 700])
@pytest.mark.parametrize("rope,q_scale", [(True, 0.7), (False, 1.0), (True, 1.0)])
def test_qk_norm_rope_store(n, rope, q_scale):
    generator = torch.Generator().manual_seed(n)
    layout = HeadLayout(num_heads=8, num_kv_heads=2, head_dim=64)
    width = 2 * (layout.q_size + layout.kv_size)
    qkvg = (torch.randn(n, width + 3, generator=generator) * 3)[:, 3:]  # rows strided, as a view of a wider GEMM
    num_blocks, block_size = -(-n * 2 // 16), 16
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:n]
    rotary = RotaryTable(layout.head_dim, 10000.0)(torch.randint(0, 5000, (n,), generator=generator),
                                                   torch.float32) if rope else None
    shape = (num_blocks, block_size, layout.num_kv_heads, layout.head_dim)
    caches = [torch.full(shape, float("nan")) for _ in range(4)]
    got = qk_norm_rope_store_cpu(qkvg, layout, 1e-6, q_scale, rotary, caches[0], caches[1], slots)
    want = qk_norm_rope_store_torch(qkvg, layout, 1e-6, q_scale, rotary, caches[2], caches[3], slots)
    torch.testing.assert_close(got, want, **CLOSE)
    torch.testing.assert_close(caches[0], caches[2], equal_nan=True, **CLOSE)  # slots not written stay NaN
    assert torch.equal(caches[1].nan_to_num(7.0), caches[3].nan_to_num(7.0))  # values are copied as they are


DECODE_CASES = {
    "ragged": [(0, 1), (15, 1), (16, 1), (40, 1), (130, 1)],  # block boundaries at 16
    "one": [(999, 1)],
    "long": [(3000, 1), (2500, 1)],  # enough work for the OpenMP loop
}


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
@pytest.mark.parametrize("window", [None, 16, 33])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("gated", [True, False])
def test_decode_attention(case, window, heads, gated):
    num_q_heads, num_kv_heads = heads
    c = make_case(DECODE_CASES[case], num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=64,
                  sliding_window=window, seed=len(case))
    gate = torch.randn(c.query.shape[0], num_q_heads * 64 + 5)[:, 5:] if gated else None  # strided, as in the model
    got = decode_attention_cpu(c.query, c.poisoned_key_cache, c.poisoned_value_cache, c.group, c.ctx, window, 0.125,
                               gate)
    want = paged_attention_torch(c.query, c.key_cache, c.value_cache, c.group, c.ctx, window, 0.125, gate)
    assert not got.isnan().any()  # no unused slot was read
    torch.testing.assert_close(got, want, **CLOSE)


def test_silu_mul_with_the_exponentials_tails():
    gate_up = torch.randn(9, 2 * 300, generator=torch.Generator().manual_seed(0)) * 6
    gate_up[0, :6] = torch.tensor([-1e4, 1e4, -90.0, 90.0, -87.4, 0.0])
    torch.testing.assert_close(silu_mul_cpu(gate_up), silu_mul_torch(gate_up), rtol=1e-5, atol=1e-6)
    rows = torch.randn(600, 2 * 512)  # the OpenMP loop
    torch.testing.assert_close(silu_mul_cpu(rows), silu_mul_torch(rows), rtol=1e-5, atol=1e-6)


def test_indices_outside_the_cache_are_refused_not_followed():
    layout = HeadLayout(num_heads=2, num_kv_heads=1, head_dim=8)
    qkvg = torch.randn(2, 2 * (layout.q_size + layout.kv_size))
    key_cache, value_cache = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    with pytest.raises(IndexError, match=r"slot_mapping\[1\] = 8 is outside the KV cache's 8 slots"):
        qk_norm_rope_store_cpu(qkvg, layout, 1e-6, 1.0, None, key_cache, value_cache, torch.tensor([3, 8]))
    assert not key_cache.any() and not value_cache.any()  # nothing written
    c = make_case([(20, 1), (5, 1)], num_q_heads=2, num_kv_heads=1, head_dim=8)
    c.group.block_tables[1, 0] = c.key_cache.shape[0]  # a block id past the pool
    with pytest.raises(IndexError, match="sequence 1's block table does not hold its keys"):
        decode_attention_cpu(c.query, c.key_cache, c.value_cache, c.group, c.ctx, None, 0.3)
    c.ctx.seq_lens[0] = 200  # more positions than the table lists
    with pytest.raises(IndexError, match="sequence 0's block table"):
        decode_attention_cpu(c.query, c.key_cache, c.value_cache, c.group, c.ctx, None, 0.3)


@pytest.mark.parametrize("setting", [{}, {"OMP_WAIT_POLICY": " "}, {"OMP_NUM_THREADS": "2"}])
def test_the_stacks_barriers_spin_a_bounded_time_where_the_user_set_no_wait_policy(setting):
    assert cpu.barrier_spin_ns(setting) == cpu.BARRIER_SPIN_NS > 0


@pytest.mark.parametrize("setting", [{"OMP_WAIT_POLICY": "active"}, {"OMP_WAIT_POLICY": "PASSIVE"},
                                     {"GOMP_SPINCOUNT": "10000"}, {"KMP_BLOCKTIME": "0"}])
def test_a_wait_policy_the_user_set_keeps_the_openmp_runtimes_barrier(setting):
    assert cpu.barrier_spin_ns(setting) == -1


def test_dispatchers_take_the_c_kernels_for_float32_on_the_cpu_only(monkeypatch):
    calls = []
    real = kernels.residual_norm.__globals__["residual_norm_cpu"]
    monkeypatch.setitem(kernels.residual_norm.__globals__, "residual_norm_cpu",
                        lambda *args: calls.append(args) or real(*args))
    spec = NormSpec(torch.randn(32), 1e-6, 1.0)
    kernels.residual_norm(torch.randn(2, 32), torch.randn(2, 32), spec, spec)
    assert len(calls) == 1
    kernels.residual_norm(torch.randn(2, 32).bfloat16(), torch.randn(2, 32).bfloat16(), spec, spec)
    kernels.residual_norm(torch.randn(2, 32).t().contiguous().t(), torch.randn(2, 32), spec, spec)  # strided h
    monkeypatch.setenv("GLIMMER_KERNELS", "torch")
    kernels.residual_norm(torch.randn(2, 32), torch.randn(2, 32), spec, spec)
    assert len(calls) == 1  # bf16, a strided input and the forced reference took the torch path


def test_the_build_is_cached_per_source_compiler_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compiler = _unoptimized(tmp_path)
    first = cpu._build(compiler)
    assert first.parent == tmp_path / "glimmer" / "cpu-kernels" and first.exists()
    stamp = first.stat().st_mtime_ns
    assert cpu._build(compiler) == first and first.stat().st_mtime_ns == stamp  # found, not rebuilt
    assert not list(first.parent.glob("*.partial"))


def test_a_compiler_that_refuses_march_native_builds_for_this_cpu_with_mcpu_native(tmp_path, monkeypatch, caplog):
    """clang for Arm (Apple's, Graviton's) refuses -march=native and takes -mcpu=native: the build tuned for this CPU
    is the second choice there, before the untuned baseline Armv8 one (with OpenMP where it links)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    arm_clang_like = tmp_path / "armcc"
    arm_clang_like.write_text('#!/bin/sh\ncase " $* " in *" -march=native "*)\n'
                              'echo "clang: error: unsupported option \'-march=native\'" >&2; exit 1;; esac\n'
                              f'exec {shlex.join(cpu._compiler())} "$@"\n')
    arm_clang_like.chmod(0o755)
    caplog.set_level("INFO")
    assert ctypes.CDLL(str(cpu._build([str(arm_clang_like)]))).glimmer_silu_mul is not None
    assert "-mcpu=native -fopenmp" in caplog.text and "-march=native" not in caplog.text


def test_without_a_working_compiler_the_cpu_runs_the_torch_path(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")  # "builds" nothing, with every flag set
    assert cpu.library.__wrapped__() is None
    assert "could not build or load ops.c and decoder_stack.c with /bin/false" in caplog.text
    monkeypatch.setattr(cpu, "_compiler", lambda: None)
    assert cpu.library.__wrapped__() is None
    assert "no C compiler" in caplog.text


def test_a_plain_build_without_native_flags_or_openmp_passes_the_probe(tmp_path, monkeypatch):
    """What a compiler without OpenMP (Apple's clang) or without -march=native builds: the same results."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu, "OPTIONAL_FLAGS", [[]])
    lib = cpu.library.__wrapped__()
    assert lib is not None
    gate_up = torch.randn(4, 2 * 700) * 5
    torch.testing.assert_close(silu_mul_cpu(gate_up, lib=lib), silu_mul_torch(gate_up), rtol=1e-5, atol=1e-6)
    nan = torch.full((1, 8), float("nan"))
    assert silu_mul_cpu(nan, lib=lib).isnan().all()  # NaN stays NaN through the exponential


def test_the_forced_reference_never_builds_the_kernels(tmp_path, monkeypatch):
    """GLIMMER_KERNELS=torch, the oracle, must not depend on (or wait for) the C toolchain."""
    monkeypatch.setenv("GLIMMER_KERNELS", "torch")
    monkeypatch.setattr(cpu, "library", lambda: pytest.fail("the forced reference built the kernels"))
    assert not cpu.runs(torch.zeros(2))


def test_cc_may_carry_arguments_and_an_unusable_one_is_reported(monkeypatch, caplog):
    monkeypatch.setenv("CC", "cc -O0")
    assert cpu._compiler()[1:] == ["-O0"]
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert cpu._compiler() is not None and "names no program on PATH" in caplog.text
    monkeypatch.setenv("CC", 'gcc "-O2')  # an unclosed quote: was ValueError out of the engine's load
    assert cpu._compiler() is not None and "cannot be split as a shell would (No closing quotation)" in caplog.text


def test_a_cc_path_that_is_there_but_cannot_run_is_reported_as_such(tmp_path, monkeypatch, caplog):
    """It was reported as naming no program on PATH, though the file or folder named is there."""
    script = tmp_path / "mycc"
    script.write_text("#!/bin/sh\nexec cc \"$@\"\n")
    script.chmod(0o644)
    for named in (script, tmp_path):
        caplog.clear()
        monkeypatch.setenv("CC", f"{named} -O2")
        assert cpu._compiler()[0] != str(named)
        assert f"names {named}, which is not a program this user may run" in caplog.text
        assert "chmod +x" in caplog.text and "no program on PATH" not in caplog.text


def test_a_temporary_cache_directory_others_could_write_is_not_used(tmp_path, monkeypatch):
    """Where the user's cache cannot be written, a library is only looked for in a private directory: one found
    in a directory another user owns or may write could be anyone's code."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_dir))  # unwritable: a file where the directory would go
    monkeypatch.setattr(cpu.tempfile, "gettempdir", lambda: str(tmp_path))
    shared = tmp_path / f"glimmer-cpu-kernels-{os.getuid()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # open to everyone: never used
    chosen = cpu._writable_cache_dir()
    assert chosen != shared and chosen.parent == tmp_path and (chosen.stat().st_mode & 0o077) == 0
    shared.chmod(0o700)
    assert cpu._writable_cache_dir() == shared


def test_a_timed_out_build_leaves_no_partial_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    hanging = tmp_path / "hangcc"
    hanging.write_text('#!/bin/sh\ncase "$1" in --version) echo fake;; *) sleep 30;; esac\n')
    hanging.chmod(0o755)
    monkeypatch.setattr(cpu, "COMPILE_TIMEOUT_S", 1)
    with pytest.raises(subprocess.TimeoutExpired):
        cpu._build([str(hanging)])
    assert not list((tmp_path / "glimmer" / "cpu-kernels").glob("*.partial"))


def test_a_damaged_cached_library_is_built_again_not_loaded(tmp_path, monkeypatch, caplog):
    """A cached library cut short (a crash or power loss before its blocks reached the disk) made every start fail:
    an empty one fell back to the torch path for good, one cut inside its code killed the process (SIGBUS) when
    loaded. It is checked against its digest and built again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = cpu._build(_unoptimized(tmp_path))
    for damaged in (b"", built.read_bytes()[:1000]):
        # a new file under the name: this process has loaded the one built (its build checks it loads), and cutting
        # that inode short would kill the process (SIGBUS) at its next touch of the library's pages, at exit at last
        built.unlink()
        built.write_bytes(damaged)
        rebuilt = cpu._build(_unoptimized(tmp_path))
        assert rebuilt.read_bytes() not in (b"", damaged[:1000])
        assert f"{built} is not the library built there" in caplog.text
        code = f"import ctypes; ctypes.CDLL({str(rebuilt)!r}).glimmer_silu_mul"
        assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0  # loads, not SIGBUS
        built = rebuilt


def test_a_failed_build_reports_the_compilers_reason_not_its_last_line(tmp_path, monkeypatch):
    """gcc ends a failed link with `collect2: error: ld returned 1 exit status`; the reason (a full disk, a missing
    library) is on a line before it, and is what the warning must show."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    linker = tmp_path / "fullcc"
    linker.write_text('#!/bin/sh\ncase "$1" in --version) echo fake;; *)\n'
                      'echo "decoder_stack.c:92:1: warning: unused parameter threads" >&2\n'
                      'echo "/usr/bin/ld: final link failed: No space left on device" >&2\n'
                      'echo "collect2: error: ld returned 1 exit status" >&2; exit 1;; esac\n')
    linker.chmod(0o755)
    with pytest.raises(OSError, match="final link failed: No space left on device"):
        cpu._build([str(linker)])


def test_two_macs_cache_their_own_libraries(monkeypatch):
    """macOS has no /proc/cpuinfo: the CPU's model and features come from sysctl, so a cache moved to a Mac with other
    instructions (Migration Assistant copies ~/.cache) builds anew instead of loading code for the old CPU."""
    def no_cpuinfo(path, *args, **kwargs):
        raise FileNotFoundError(path)

    def sysctl_of(cpu_model):
        def run(command, **kwargs):
            assert command[0].endswith("sysctl")
            return subprocess.CompletedProcess(command, 0, f"machdep.cpu.brand_string: {cpu_model}\n", "")
        return run

    monkeypatch.setattr(cpu, "open", no_cpuinfo, raising=False)
    monkeypatch.setattr(cpu.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(cpu.subprocess, "run", sysctl_of("Intel(R) Xeon(R) W-2140B CPU @ 3.20GHz"))
    avx512_mac = cpu._machine_identity()
    monkeypatch.setattr(cpu.subprocess, "run", sysctl_of("Intel(R) Core(TM) i5-8257U CPU @ 1.40GHz"))
    assert cpu._machine_identity() != avx512_mac


def test_a_flag_set_that_builds_what_cannot_load_gives_way_to_the_next(tmp_path, monkeypatch, caplog):
    """`zig cc -fopenmp` links no OpenMP runtime: the library builds, then fails to load (undefined symbol
    __kmpc_...), and the CPU ran the torch path at every start. The build takes the next flag set instead."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    unresolved = tmp_path / "unresolved.c"
    unresolved.write_text("void __kmpc_absent(void);\nvoid glimmer_parallel(void) { __kmpc_absent(); }\n")
    zig_like = tmp_path / "zigcc"
    zig_like.write_text(f'#!/bin/sh\ncase " $* " in *" -fopenmp "*) set -- "$@" {unresolved};; esac\n'
                        f'exec {shlex.join(_unoptimized(tmp_path))} "$@"\n')
    zig_like.chmod(0o755)
    caplog.set_level("INFO")
    built = cpu._build([str(zig_like)])
    assert ctypes.CDLL(str(built)).glimmer_silu_mul is not None  # loads
    assert "built" in caplog.text and "-fopenmp" not in caplog.text


def test_without_a_home_directory_the_kernels_are_cached_in_a_private_temporary_one(tmp_path, monkeypatch):
    """A container run as a uid the password database lacks, without HOME: Path.home() raises RuntimeError, which
    failed the engine's load instead of caching elsewhere."""
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(cpu.Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(
        RuntimeError("Could not determine home directory."))))
    monkeypatch.setattr(cpu.tempfile, "gettempdir", lambda: str(tmp_path))
    built = cpu._build(_unoptimized(tmp_path))
    assert built.parent == tmp_path / f"glimmer-cpu-kernels-{os.getuid()}"


def _noexec_under(monkeypatch, *roots: Path) -> None:
    """os.statvfs reports the file systems under `roots` mounted noexec (`mount -o noexec`, which a test cannot do)."""
    real = os.statvfs

    def statvfs(path):
        result = real(path)
        if not any(Path(path).is_relative_to(root) for root in roots):
            return result
        fields = list(result)
        fields[8] |= os.ST_NOEXEC  # f_flag
        return os.statvfs_result(fields)

    monkeypatch.setattr(os, "statvfs", statvfs)


@pytest.mark.skipif(not hasattr(os, "ST_NOEXEC"), reason="no noexec mount flag on this system")
def test_a_cache_on_a_noexec_file_system_gives_way_to_the_temporary_directory(tmp_path, monkeypatch, caplog):
    """A library built there fails to load ('failed to map segment from shared object'): every flag set was compiled
    and refused in turn, and the CPU ran the torch path, blamed on the compiler."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(cpu.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    _noexec_under(monkeypatch, tmp_path / "cache")
    caplog.set_level("INFO")
    built = cpu._build(_unoptimized(tmp_path))
    assert built.parent == tmp_path / "tmp" / f"glimmer-cpu-kernels-{os.getuid()}"
    assert ctypes.CDLL(str(built)).glimmer_silu_mul is not None
    assert f"{tmp_path / 'cache' / 'glimmer' / 'cpu-kernels'} is on a file system mounted noexec" in caplog.text


@pytest.mark.skipif(not hasattr(os, "ST_NOEXEC"), reason="no noexec mount flag on this system")
def test_cache_and_temporary_directory_both_noexec_run_the_torch_path_saying_so_without_building(tmp_path,
                                                                                                  monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(cpu.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    _noexec_under(monkeypatch, tmp_path / "cache", tmp_path / "tmp")
    counting = tmp_path / "countcc"
    counting.write_text(f'#!/bin/sh\ncase " $* " in *" -o "*) echo >> {tmp_path / "builds"};; esac\n'
                        f'exec {shlex.join(cpu._compiler())} "$@"\n')
    counting.chmod(0o755)
    monkeypatch.setenv("CC", str(counting))
    assert cpu.library.__wrapped__() is None
    assert not (tmp_path / "builds").exists()
    assert "mounted noexec" in caplog.text and "set XDG_CACHE_HOME (or TMPDIR) to a directory" in caplog.text
    assert "the compiler failed" not in caplog.text


def test_a_library_whose_loading_ends_the_process_is_refused_in_a_child_not_loaded(tmp_path):
    """CC='gcc -fsanitize=address' builds a library whose runtime exits any process that loads it without having been
    loaded first: the engine's process ended at its load (status 1) with ASan's message, where the CPU should run
    the torch path. (In a process of its own, as that process is what ended.)"""
    (tmp_path / "probe.c").write_text("int glimmer_probe(void) { return 1; }\n")
    asan = subprocess.run([*cpu._compiler(), "-fsanitize=address", "-shared", "-fPIC", str(tmp_path / "probe.c"),
                           "-o", str(tmp_path / "probe.so")], capture_output=True)
    if asan.returncode != 0:
        pytest.skip("the compiler builds no AddressSanitizer library here")
    env = {**os.environ, "CC": f"{shlex.join(_unoptimized(tmp_path))} -fsanitize=address",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(Path(cpu.__file__).parents[4])}
    load = "from glimmer.model.kernels import cpu; print('library', cpu.library())"
    done = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "library None" in done.stdout
    assert "does not load: " in done.stderr and "the CPU runs the torch path" in done.stderr
    assert not list((tmp_path / "cache").rglob("*.so*"))


def test_without_an_interpreter_to_start_a_new_build_is_loaded_in_this_process_alone(tmp_path, monkeypatch):
    """An embedded Python (sys.executable empty) cannot load a build in a child: the kernels are built all the same."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu.sys, "executable", "")
    assert ctypes.CDLL(str(cpu._build(_unoptimized(tmp_path)))).glimmer_silu_mul is not None


def test_a_cached_library_whose_runtime_is_gone_is_built_again(tmp_path, monkeypatch):
    """A library built with -fopenmp needs the OpenMP runtime it linked (clang's libomp.so.5, from libomp-dev); once
    that is removed, the cached library fails to load and the CPU ran the torch path at every start. It is built
    again, with the flag sets that still link. (Each start is a process of its own: a process that has loaded a
    library keeps it.)"""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (tmp_path / "rt.c").write_text("int glimmer_runtime(void) { return 1; }\n")
    subprocess.run([*cpu._compiler(), "-shared", "-fPIC", str(tmp_path / "rt.c"), "-o", str(runtime / "libgrt.so")],
                   check=True)
    (tmp_path / "use.c").write_text("int glimmer_runtime(void);\nint glimmer_uses(void) { return glimmer_runtime(); }")
    linking = tmp_path / "ompcc"
    linking.write_text(f'#!/bin/sh\ncase " $* " in *" -fopenmp "*) set -- "$@" {tmp_path / "use.c"} -L{runtime} '
                       f'-Wl,-rpath,{runtime} -lgrt;; esac\nexec {shlex.join(_unoptimized(tmp_path))} "$@"\n')
    linking.chmod(0o755)
    start = ("import ctypes, logging; from glimmer.model.kernels import cpu; logging.basicConfig()\n"
             f"built = cpu._build([{str(linking)!r}]); print(built, hasattr(ctypes.CDLL(str(built)), 'glimmer_uses'))")

    def build():
        done = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=300, check=True)
        path, with_runtime = done.stdout.split()
        return path, with_runtime == "True", done.stderr

    first, with_runtime, _ = build()
    assert with_runtime  # the flag set with -fopenmp, linking the runtime
    (runtime / "libgrt.so").unlink()
    rebuilt, with_runtime, log = build()
    assert rebuilt != first and not with_runtime
    assert f"{first} does not load" in log and "libgrt.so: cannot open shared object file" in log
