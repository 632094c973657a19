"""When a Triton kernel may run: CUDA tensors, Triton importable, and not switched off.

`GLIMMER_KERNELS=torch` makes every dispatcher take its plain-torch reference (for A/B timing and for
bisecting a numerical difference). Triton is imported lazily: CPU installs never need it.

On Hopper and newer GPUs the kernels are launched as programmatic dependent launches: a kernel may be
scheduled while the one before it drains, and waits (`griddepcontrol.wait`) for that one's completion and
memory before it reads or writes anything, so only the launch latency overlaps, never the work. A decode step
at batch 1 is some 600 kernels of a few microseconds each, and the gap between two of them is a large part
of theirs. `GLIMMER_PDL=0` launches them plainly (for A/B timing). Whether the driver takes such launches,
eagerly and inside a captured CUDA graph (programmatic edges in graphs need a CUDA 12.3+ driver), is probed
once per GPU before the first kernel runs; where it does not, kernels launch plainly, with a warning.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from glimmer.errors import ConfigError

logger = logging.getLogger(__name__)


@functools.cache
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


KERNEL_SETTINGS = {"": False, "auto": False, "torch": True}
GEMM_SETTINGS = {"": True, "auto": True, "tuned": True, "cublas": False}
PDL_SETTINGS = {"": True, "1": True, "on": True, "true": True, "yes": True,
                "0": False, "off": False, "false": False, "no": False}


def _switch(name: str, settings: dict[str, bool], meaning: str) -> bool:
    """The setting an environment variable names (case and surrounding spaces ignored); ConfigError naming the
    variable and `meaning` for a value that is not one, never silently the default."""
    raw = os.environ.get(name, "")
    value = settings.get(raw.strip().lower())
    if value is None:
        raise ConfigError(f"{name}={raw!r} is not a setting: {meaning}")
    return value


def references_forced() -> bool:
    """GLIMMER_KERNELS=torch: every op runs its plain-torch reference (no Triton, no packed CPU weights);
    unset or `auto`: the fastest path."""
    return _switch("GLIMMER_KERNELS", KERNEL_SETTINGS, "'torch' runs the plain-torch reference of every op, "
                   "'auto' (or leaving it unset) the fastest kernels")


def dependent_launch_allowed() -> bool:
    """GLIMMER_PDL: unset, 1/on/true/yes allow programmatic dependent launches; 0/off/false/no forbid them."""
    return _switch("GLIMMER_PDL", PDL_SETTINGS, "0 (or off/false/no) launches kernels plainly, 1 (or "
                   "on/true/yes, or leaving it unset) as dependent launches on Hopper+")


def gemm_tuning_allowed() -> bool:
    """GLIMMER_GEMM: unset, `tuned` or `auto` let measured cuBLASLt algorithms replace F.linear (tuned_gemm.py);
    `cublas` keeps every product on cuBLAS's default kernel. GLIMMER_KERNELS=torch keeps them there too."""
    return _switch("GLIMMER_GEMM", GEMM_SETTINGS, "'cublas' keeps every product on cuBLAS's default kernel, 'tuned' "
                   "(or leaving it unset) lets measured cuBLASLt algorithms replace it") and not references_forced()


def check_environment() -> None:
    """Raise ConfigError for a GLIMMER_KERNELS, GLIMMER_PDL or GLIMMER_GEMM value that is not a setting (engine
    start-up)."""
    references_forced()
    dependent_launch_allowed()
    gemm_tuning_allowed()


def triton_missing_warning(device: torch.device) -> str | None:
    """The warning for a CUDA device without Triton (the `cuda` extra), where every op would silently take its
    plain-torch reference and decode steps run without CUDA graphs; None where Triton is importable, the device is
    not CUDA, or GLIMMER_KERNELS=torch asks for the references."""
    if device.type != "cuda" or references_forced() or triton_importable():
        return None
    return ("Triton is not installed: on CUDA every op runs its plain-torch reference and decode steps run without "
            "CUDA graphs, several times slower; pip install -e \".[cuda]\" (or pip install triton)")


def use_triton(*tensors: torch.Tensor) -> bool:
    """Whether the Triton version of an op should run on these tensors."""
    if not all(t.is_cuda for t in tensors):  # first: the CPU's decode step calls this hundreds of times
        return False
    return not references_forced() and triton_importable()


@functools.cache
def multiprocessor_count(device_index: int) -> int:
    if not torch.cuda.is_available():
        return 132  # Triton's interpreter on the CPU (tests): size grids as for an H200
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per GPU that warm-ups, graph captures and timings run on (`device` without an index: the
    current GPU, as `torch.cuda.Stream(device)` takes it). One, not one per call: cuBLAS keeps a workspace (32 MiB on
    Hopper) for every stream it ever ran on until the process ends, so a stream per timed product left 1.05 GiB
    allocated after the 30B's first start measured its 33 product shapes."""
    return _side_stream(cuda_index(device))


def cuda_index(device: torch.device) -> int:
    """The index of the GPU `device` names: the current one where it names none (`"cuda"`)."""
    return torch.cuda.current_device() if device.index is None else device.index


@functools.cache
def _side_stream(device_index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device_index)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def dependent_launch(device_index: int) -> bool:
    """Whether kernels on this GPU launch as programmatic dependent launches (see the module's docstring)."""
    if not dependent_launch_allowed() or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(device_index)[0] < 9:
        return False
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:  # a Triton without grid dependency control
        return False
    failure = dependent_launch_failure(device_index)
    if failure is not None:
        logger.warning("GPU %d does not take programmatic dependent launches (%s); kernels launch plainly",
                       device_index, failure)
        return False
    return True


def dependent_launch_failure(device_index: int) -> str | None:
    """Run two kernels as dependent launches, the second reading the first's output, eagerly and then from a
    captured CUDA graph. None when both work and agree; else what went wrong. Called once per GPU through
    `dependent_launch`, which the model runner resolves before it captures anything (a capture cannot be
    probed from inside another)."""
    from glimmer.model.kernels.jit import silu_mul as impl

    if torch.cuda.is_current_stream_capturing():
        return "first asked during a CUDA graph capture, where it cannot be probed"
    device = torch.device("cuda", device_index)
    try:
        with torch.cuda.device(device):
            gate_up = torch.randn((2, 2048), device=device)
            middle = torch.empty((2, 1024), device=device)
            out = torch.empty((2, 512), device=device)

            def chain() -> None:  # the model's own specialization of the kernel (BLOCK 1024, 4 warps)
                impl.silu_mul[(2, 1)](gate_up, middle, 1024, BLOCK=1024, num_warps=4, PDL=True, launch_pdl=True)
                impl.silu_mul[(2, 1)](middle, out, 512, BLOCK=1024, num_warps=4, PDL=True, launch_pdl=True)

            chain()
            eager = out.clone()
            out.zero_()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain()
            graph.replay()
            torch.cuda.synchronize(device)
            if not torch.equal(out, eager):
                return "a captured graph of dependent launches gave other results than launching them eagerly"
    except Exception as exc:  # the driver's or Triton's refusal, whichever form it takes
        return f"{type(exc).__name__}: {exc}"
    return None


def launch_options(tensor: torch.Tensor) -> dict[str, bool]:
    """The keyword arguments every kernel launch passes: the kernel's PDL switch and Triton's launch flag."""
    pdl = dependent_launch(tensor.device.index or 0)
    return {"PDL": pdl, "launch_pdl": pdl}
