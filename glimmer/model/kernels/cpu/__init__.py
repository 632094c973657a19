"""C kernels for the CPU's decode step (`ops.c`, `decoder_stack.c`), compiled at first use and called through ctypes.

A decode step of a small model on the CPU is mostly small torch ops: a norm is some ten of them, QK-norm with
RoPE and the cache store tens more, each 2–15 µs of dispatch around a few hundred floats of work, against
projections that stream the weights in a few milliseconds. `ops.c` does each of those groups in one call: the
residual norms, QK-norm + RoPE + cache store, decode attention over the paged cache in place, and SiLU·mul.
`decoder_stack.c` runs a float32 decode step's whole stack of decoder layers, products included, in one call
(`kernels/decoder_stack.py`).

The system C compiler (`CC`, else `cc`, `gcc` or `clang`) builds both once per source, compiler and CPU into
the user's cache (`$XDG_CACHE_HOME/glimmer/cpu-kernels`, else `~/.cache/...`; where that cannot be written or is
mounted noexec, a private directory of the temporary one); `-march=native` and OpenMP are used
where the compiler takes them. After loading, every function is checked against its torch reference on a random
probe. Where there is no compiler, the build or the probe fails, or `GLIMMER_KERNELS=torch`, every op runs its
torch reference (the CPU path before these kernels existed): slower, never different beyond float32 rounding.
Only float32 runs here; other dtypes take the references.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib
import logging
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from glimmer.model.kernels.support import references_forced

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("ops.c", "decoder_stack.c")]
HEADERS = [Path(__file__).with_name("common.h")]
BASE_FLAGS = ["-O3", "-shared", "-fPIC", "-ffp-contract=off"]
# tried in order; the first the compiler builds is used (clang for Arm, Apple's included, takes -mcpu=native where it
# refuses -march=native: without either the products are built for the baseline Armv8 and run far slower)
OPTIONAL_FLAGS = [["-march=native", "-fopenmp"], ["-march=native"], ["-mcpu=native", "-fopenmp"], ["-mcpu=native"],
                  ["-fopenmp"], []]
COMPILE_TIMEOUT_S = 120

_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
SIGNATURES = {
    "glimmer_residual_norm": (None, [_P, _P, _P, _F, _P, _F, _I64, _I64, _P, _P, _INT]),
    "glimmer_qk_norm_rope_store": (_INT, [_P, _I64, _I64, _I64, _I64, _I64, _F, _F, _P, _P, _P, _P, _I64, _P, _P,
                                          _INT]),
    "glimmer_decode_attention": (_INT, [_P, _I64, _I64, _I64, _I64, _P, _P, _I64, _I64, _P, _I64, _P, _P, _I64, _F,
                                        _P, _I64, _P, _INT]),
    "glimmer_silu_mul": (None, [_P, _I64, _I64, _P, _INT]),
    "glimmer_decode_layers": (_INT, [_P, _P, _I64, _P, _P, _INT]),
    "glimmer_linear": (None, [_P, _I64, _P, _P, _I64, _I64, _P, _INT]),
    "glimmer_logits": (None, [_P, _I64, _P, _I64, _I64, _F, _F, _P, _INT, _I64]),
}


def runs(*tensors: torch.Tensor) -> bool:
    """Whether the C kernels take an op on these tensors: all float32 on the CPU, the kernels built, and
    GLIMMER_KERNELS not `torch`."""
    for t in tensors:
        if t.dtype != torch.float32 or t.device.type != "cpu":
            return False
    return not references_forced() and library() is not None  # (the forced reference never builds them)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, built or found in the cache; None (logged once) where they cannot run here."""
    if os.name != "posix":
        logger.info("CPU kernels: C kernels are built on POSIX systems only; the CPU runs the torch path")
        return None
    compiler = _compiler()
    if compiler is None:
        logger.warning("CPU kernels: no C compiler (set CC, or install gcc or clang); the CPU runs the torch path, "
                       "which is slower at decode")
        return None
    try:
        path = _build(compiler)
        lib = ctypes.CDLL(str(path))
        for name, (restype, argtypes) in SIGNATURES.items():
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
    except (OSError, subprocess.SubprocessError, AttributeError) as error:
        logger.warning("CPU kernels: could not build or load %s with %s (%s); the CPU runs the torch path",
                       " and ".join(s.name for s in SOURCES), " ".join(compiler), error)
        return None
    failure = _probe(lib)
    if failure is not None:
        logger.warning("CPU kernels: %s disagrees with its torch reference on a probe (%s); the CPU runs the "
                       "torch path", path, failure)
        return None
    logger.info("CPU kernels: loaded %s", path)
    return lib


def pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def threads() -> int:
    return torch.get_num_threads()


BARRIER_SPIN_NS = 50_000
"""How long a thread of the decoder stack spins at a barrier between phases before it sleeps (`team_wait` in
cpu/decoder_stack.c). A quiet step's threads meet within microseconds; one whose partner another process has
descheduled stops taking the partner's core after this."""
WAIT_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
"""The OpenMP runtimes' settings of how long a waiting thread spins (libgomp reads the first two, LLVM's and Intel's
runtimes the first and last)."""


def barrier_spin_ns(environ: Mapping[str, str] = os.environ) -> int:
    """BARRIER_SPIN_NS for the stack's barriers; -1 (the OpenMP runtime's own barrier) where the user set one of
    WAIT_POLICY_VARIABLES, which the runtime honours."""
    if any(environ.get(name, "").strip() for name in WAIT_POLICY_VARIABLES):
        return -1
    return BARRIER_SPIN_NS


def _compiler() -> list[str] | None:
    """The compiler command: `CC` (split as a shell would: `ccache gcc` works), else cc, gcc or clang."""
    configured = os.environ.get("CC", "").strip()
    if configured:
        try:
            command = shlex.split(configured)
        except ValueError as error:  # an unclosed quote, a trailing backslash
            logger.warning("CPU kernels: CC=%r cannot be split as a shell would (%s); trying cc, gcc and clang",
                           configured, error)
        else:
            found = shutil.which(command[0])
            if found:
                return [found, *command[1:]]
            if os.path.dirname(command[0]) and os.path.exists(command[0]):  # a path: which() does not search PATH
                logger.warning("CPU kernels: CC=%r names %s, which is not a program this user may run (a folder, "
                               "or a file without execute permission: chmod +x it); trying cc, gcc and clang",
                               configured, command[0])
            else:
                logger.warning("CPU kernels: CC=%r names no program on PATH; trying cc, gcc and clang", configured)
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def _cache_dir() -> Path | None:
    """The user's cache directory; None where there is none: no XDG_CACHE_HOME, no HOME and a user the password
    database does not know (a container's arbitrary user id), for which Path.home() raises RuntimeError."""
    try:
        root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:
        return None
    return Path(root) / "glimmer" / "cpu-kernels"


def _machine_identity() -> str:
    """What `-march=native` depends on: the architecture and the CPU's model and feature flags (Linux's
    /proc/cpuinfo, macOS's sysctl: a home directory moved to another Mac brings its cache along, and a library built
    for the old CPU's instructions would kill the process on the new one)."""
    parts = [platform.system(), platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo") as f:
            parts += sorted({line.strip() for line in f if line.startswith(("model name", "flags", "Features"))})
    except OSError:
        if platform.system() == "Darwin":
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                parts.append(subprocess.run(["/usr/sbin/sysctl", "machdep.cpu.brand_string", "hw.optional"],
                                            capture_output=True, text=True, timeout=30).stdout)
    return "\n".join(parts)


def _build(compiler: list[str]) -> Path:
    """The shared library for this source, compiler and machine: from the cache, else compiled into it (written
    under a temporary name and renamed, so processes building at once never load a partial file). Its name carries
    its digest, checked before it is loaded: a file cut short (a crash before its blocks reached the disk) would
    fail to load on every start, or kill the process inside its code, instead of being built again. One that does
    not load (a runtime it linked is gone) is built again too."""
    source = b"\0".join(path.read_bytes() for path in [*SOURCES, *HEADERS])
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, " ".join(compiler).encode(), version.encode(),
                                     _machine_identity().encode(),
                                     repr((BASE_FLAGS, OPTIONAL_FLAGS)).encode()])).hexdigest()[:24]
    directory = _writable_cache_dir()
    for cached in sorted(directory.glob(f"ops-{key}-*.so")):
        if cached.name != f"ops-{key}-{_digest(cached)}.so":
            logger.warning("CPU kernels: %s is not the library built there (cut short or changed since); building it "
                           "again", cached)
        else:
            try:
                ctypes.CDLL(str(cached))
                return cached
            except OSError as error:  # a library it links is gone since (clang's OpenMP runtime, libomp-dev removed)
                logger.warning("CPU kernels: %s does not load (%s); building it again", cached, error)
        with contextlib.suppress(OSError):
            cached.unlink()
    errors = []
    for extra in OPTIONAL_FLAGS:
        fd, partial = tempfile.mkstemp(dir=directory, suffix=".so.partial")
        os.close(fd)
        try:
            result = subprocess.run([*compiler, *BASE_FLAGS, *extra, *map(str, SOURCES), "-o", partial, "-lm"],
                                    capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            reason = _reason(result.stderr)
            if result.returncode == 0:
                _load_in_a_child(partial)  # a flag set may build what cannot load: zig cc's -fopenmp links no runtime
                target = directory / f"ops-{key}-{_digest(Path(partial))}.so"
                os.replace(partial, target)
                logger.info("CPU kernels: built %s with %s", target, " ".join([*BASE_FLAGS, *extra]))
                return target
        except OSError as error:
            reason = str(error)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        errors.append(reason)
    raise OSError(f"the compiler failed with every flag set: {errors[-1]}")


def _load_in_a_child(library_path: str) -> None:
    """Load a freshly built library in a child Python first; OSError with the child's reason where that fails. Some
    fail with an error (zig cc's -fopenmp links no OpenMP runtime), others end the process that loads them: a CC
    carrying -fsanitize=address builds one whose runtime exits the process ('ASan runtime does not come first')."""
    try:
        result = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", library_path],
                                capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except OSError:  # no interpreter to start (an embedded Python's sys.executable is empty): only this process tries
        ctypes.CDLL(library_path)
        return
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise OSError(f"{library_path} does not load: {lines[-1] if lines else f'exit status {result.returncode}'}")


def _reason(stderr: str) -> str:
    """A failed build's first line that says what went wrong (gcc's last one, `collect2: error: ld returned 1 exit
    status`, follows the reason: a full disk, a missing library), else its last line."""
    lines = stderr.strip().splitlines()
    reasons = [line for line in lines if re.search(r"error|fail|cannot", line, re.IGNORECASE)]
    return (reasons or lines or ["(no message)"])[0 if reasons else -1]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


NOEXEC = "is on a file system mounted noexec, from which no library loads"


def _mounted_noexec(directory: Path) -> bool:
    """Whether `directory` is on a file system mounted noexec (a hardened /home or /tmp, a container volume): a
    library built there fails to load ('failed to map segment from shared object'), with every flag set."""
    return bool(os.statvfs(directory).f_flag & getattr(os, "ST_NOEXEC", 0))


def _writable_cache_dir() -> Path:
    """The user's cache directory; where it cannot be written or is mounted noexec, a directory of the temporary one
    that only this user can write (a library found in a directory others can write could be anyone's code: it is
    loaded). OSError where the temporary one is mounted noexec too."""
    directory = _cache_dir()
    problem = "cannot be written"
    if directory is not None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            tempfile.NamedTemporaryFile(dir=directory, delete=True).close()
            if not _mounted_noexec(directory):
                return directory
            problem = NOEXEC
        except OSError:
            pass
    wanted = directory or "the user's cache (there is no home directory)"
    shared = Path(tempfile.gettempdir()) / f"glimmer-cpu-kernels-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        shared.mkdir(mode=0o700)
    if _mounted_noexec(shared):
        raise OSError(f"{wanted} {problem}, and {shared} {NOEXEC}; set XDG_CACHE_HOME (or TMPDIR) to a directory on a "
                      "file system mounted with exec")
    info = shared.lstat()
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077:
        logger.info("CPU kernels: %s %s; caching in %s", wanted, problem, shared)
        return shared
    private = Path(tempfile.mkdtemp(prefix="glimmer-cpu-kernels-"))  # not ours, or open to others: this process only
    logger.warning("CPU kernels: %s %s and %s is not a private directory of this user; building in %s for this "
                   "process", wanted, problem, shared, private)
    return private


def _probe(lib: ctypes.CDLL) -> str | None:
    """Run each kernel once against its torch reference on random inputs; None when all agree."""
    try:
        for op in ("residual_norm", "qk_norm_rope", "paged_attention", "silu_mul", "decoder_stack", "logits"):
            # (the kernels package exports functions of these names: the modules are reached by import_module)
            failure = importlib.import_module(f"glimmer.model.kernels.{op}").probe_cpu(lib)
            if failure is not None:
                return failure
    except RuntimeError as error:
        return str(error)
    return None
