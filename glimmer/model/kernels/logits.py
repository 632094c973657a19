"""The logits of final hidden states: cap · tanh(multiplier · (h · lm_headᵀ) / cap), in the model dtype and in this
order (architecture.md §2.7, §14.9).

On the CPU in float32, where the engine bound the C decoder stack, as many rows as its decode steps take (a decode
step's, or a prefill's last rows) run in one C call (`glimmer_logits` in cpu/decoder_stack.c: the decoder stack's own
product, then the soft-capping): the
five torch ops of the reference cost some hundred microseconds a step there, most of it finding their code and
data evicted by the weights the step streamed. Sums run in another order than torch's, so results agree to float32
rounding. Everything else, GPUs included, runs the reference (whose product is `linear`, the GEMV on a GPU).
"""

from __future__ import annotations

import torch

from glimmer.model.kernels import cpu
from glimmer.model.kernels.linear import linear


def softcapped_logits(hidden: torch.Tensor, weight: torch.Tensor, multiplier: float, cap: float,
                      c_rows: int = 0) -> torch.Tensor:
    """hidden (N, H) → logits (N, V); `c_rows`: at most this many rows run the C kernel (0: never)."""
    if 0 < hidden.shape[0] <= c_rows and cpu_supports(hidden, weight):
        return softcapped_logits_cpu(hidden, weight, multiplier, cap)
    return softcapped_logits_torch(hidden, weight, multiplier, cap)


def softcapped_logits_torch(hidden: torch.Tensor, weight: torch.Tensor, multiplier: float, cap: float) -> torch.Tensor:
    logits = linear(hidden, weight)
    logits = logits * multiplier
    logits = logits / cap
    logits = torch.tanh(logits)
    return logits * cap


def cpu_supports(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    return (hidden.dim() == 2 and hidden.is_contiguous() and weight.is_contiguous()
            and weight.shape[1] == hidden.shape[1] and cpu.runs(hidden, weight))


def softcapped_logits_cpu(hidden: torch.Tensor, weight: torch.Tensor, multiplier: float, cap: float,
                          lib=None) -> torch.Tensor:
    lib = cpu.library() if lib is None else lib
    out = hidden.new_empty((hidden.shape[0], weight.shape[0]))
    lib.glimmer_logits(hidden.data_ptr(), hidden.shape[0], weight.data_ptr(), weight.shape[0], weight.shape[1],
                       multiplier, cap, out.data_ptr(), cpu.threads())
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
