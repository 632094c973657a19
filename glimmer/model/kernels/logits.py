"""The logits of final hidden states: cap · tanh(multiplier · (h · lm_headᵀ) / cap), in the model dtype and in this
order (architecture.md §2.7, §14.9).

On the CPU in float32, where the engine bound the C decoder stack, as many rows as its decode steps take (a decode
step's, or a prefill's last rows) run in one C call (`glimmer_logits` in cpu/decoder_stack.c: the decoder stack's own
product, then the soft-capping): the
five torch ops of the reference cost some hundred microseconds a step there, most of it finding their code and
data evicted by the weights the step streamed. Sums run in another order than torch's, so results agree to float32
rounding.

On a GPU in bfloat16 or float16, the product (`linear`) is followed by one Triton kernel doing the four elementwise
ops in place, each rounded as torch rounds it: the reference's four kernels read and write the (rows, vocab) logits
four times (at 256 rows of the 30B's 202,048 ids, 0.8 GB a step). The kernel's input to each op is a 16-bit value,
so it is checked against the reference on every 16-bit input, bit for bit, once per GPU, dtype and constants
(`fused_softcap_exact`, before any CUDA graph capture); where any bit differs, the reference runs. float32 and
everything else run the reference.
"""

from __future__ import annotations

import functools
import logging

import torch

from glimmer.model.kernels import cpu
from glimmer.model.kernels.linear import linear
from glimmer.model.kernels.support import launch_options, use_triton

logger = logging.getLogger(__name__)

SOFTCAP_BLOCK = 4096
FUSED_DTYPES = (torch.bfloat16, torch.float16)
_exact: dict[tuple[int, torch.dtype, float, float], bool] = {}


def softcapped_logits(hidden: torch.Tensor, weight: torch.Tensor, multiplier: float, cap: float,
                      c_rows: int = 0, c_threads: int | None = None) -> torch.Tensor:
    """hidden (N, H) → logits (N, V); `c_rows`: at most this many rows run the C kernel (0: never), on `c_threads`
    threads (None: torch's count)."""
    if 0 < hidden.shape[0] <= c_rows and cpu_supports(hidden, weight):
        return softcapped_logits_cpu(hidden, weight, multiplier, cap, threads=c_threads)
    if not fused_softcap_runs(hidden, weight, multiplier, cap):
        return softcapped_logits_torch(hidden, weight, multiplier, cap)
    logits = linear(hidden, weight)
    if logits.dtype != hidden.dtype:  # an autocast changed the product's dtype: the probe was of another
        return softcap_torch(logits, multiplier, cap)
    return softcap_triton_(logits, multiplier, cap)


def softcapped_logits_torch(hidden: torch.Tensor, weight: torch.Tensor, multiplier: float, cap: float) -> torch.Tensor:
    return softcap_torch(linear(hidden, weight), multiplier, cap)


def softcap_torch(logits: torch.Tensor, multiplier: float, cap: float) -> torch.Tensor:
    """The reference's four ops after its product, each rounded to the logits' dtype."""
    logits = logits * multiplier
    logits = logits / cap
    logits = torch.tanh(logits)
    return logits * cap


def fused_softcap_runs(hidden: torch.Tensor, weight: torch.Tensor, multiplier: float, cap: float) -> bool:
    """Whether the Triton soft-cap follows the product: CUDA, a 16-bit dtype, no autograd recording (the kernel
    writes in place and has no backward), and the kernel found exact for it (probed here unless a CUDA graph is
    being captured, where an unprobed kernel leaves the reference to run)."""
    if not (use_triton(hidden, weight) and hidden.dtype in FUSED_DTYPES and weight.dtype == hidden.dtype):
        return False
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return False
    key = (hidden.device.index or 0, hidden.dtype, float(multiplier), float(cap))
    if key not in _exact and torch.cuda.is_current_stream_capturing():
        return False
    return fused_softcap_exact(*key)


def fused_softcap_exact(device_index: int, dtype: torch.dtype, multiplier: float, cap: float) -> bool:
    """Whether the Triton soft-cap gives the reference's bits on every value of `dtype` (NaNs compare as NaNs),
    on this GPU with these constants; measured once, then remembered. The model runner asks before it captures
    graphs. A kernel that fails to compile or run counts as inexact (a warning says why)."""
    key = (device_index, dtype, float(multiplier), float(cap))
    if key not in _exact:
        every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)
        every = every.to(torch.device("cuda", device_index))
        want = softcap_torch(every, multiplier, cap)
        try:
            got = softcap_triton_(every.clone(), multiplier, cap)
            torch.cuda.synchronize(every.device)
        except Exception as exc:  # Triton's or the driver's refusal, whichever form it takes
            logger.warning("the fused soft-cap does not run on this GPU (%s: %s); the logits keep torch's ops",
                           type(exc).__name__, exc)
            _exact[key] = False
            return False
        same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
        _exact[key] = bool(same.all())
        if not _exact[key]:
            logger.warning("the fused soft-cap differs from torch's ops on %d of the %s values (multiplier %s, cap "
                           "%s) on this GPU; the logits keep torch's ops", int((~same).sum()), dtype, multiplier, cap)
    return _exact[key]


def softcap_triton_(logits: torch.Tensor, multiplier: float, cap: float) -> torch.Tensor:
    """cap · tanh(multiplier · logits / cap) in place on contiguous CUDA logits; returns them."""
    from glimmer.model.kernels.jit import logits as impl

    count = logits.numel()
    if count:
        multiplier32, inv_cap, cap32 = float32_constants(multiplier, cap)
        impl.softcap[(-(-count // SOFTCAP_BLOCK),)](logits, count, multiplier32, inv_cap, cap32, BLOCK=SOFTCAP_BLOCK,
                                                    num_warps=8, **launch_options(logits))
    return logits


@functools.cache
def float32_constants(multiplier: float, cap: float) -> tuple[float, float, float]:
    """(multiplier, 1 / cap, cap) as torch's kernels take them from host scalars: each in float32, the reciprocal
    computed in float32. Worked out once per model, not on every eager step's logits."""
    as_float = torch.tensor([multiplier, 1.0, cap], dtype=torch.float32)
    return as_float[0].item(), (as_float[1] / as_float[2]).item(), as_float[2].item()


def cpu_supports(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    return (hidden.dim() == 2 and hidden.is_contiguous() and weight.is_contiguous()
            and weight.shape[1] == hidden.shape[1] and cpu.runs(hidden, weight))


def softcapped_logits_cpu(hidden: torch.Tensor, weight: torch.Tensor, multiplier: float, cap: float,
                          lib=None, threads: int | None = None) -> torch.Tensor:
    lib = cpu.library() if lib is None else lib
    out = hidden.new_empty((hidden.shape[0], weight.shape[0]))
    lib.glimmer_logits(hidden.data_ptr(), hidden.shape[0], weight.data_ptr(), weight.shape[0], weight.shape[1],
                       multiplier, cap, out.data_ptr(), cpu.threads() if threads is None else threads,
                       cpu.barrier_spin_ns())
    return out


def probe_cpu(lib) -> str | None:
    """The C kernel against the reference (cpu.library's load-time check): odd sizes, saturated tanh."""
    generator = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 37, generator=generator), torch.randn(29, 37, generator=generator)
    for multiplier, cap in ((1.0, 30.0), (0.5, 2.0)):
        got = softcapped_logits_cpu(hidden, weight, multiplier, cap, lib=lib)
        if not torch.allclose(got, softcapped_logits_torch(hidden, weight, multiplier, cap), rtol=1e-5, atol=1e-5):
            return "softcapped_logits"
    return None
