"""The soft-capped logits (glimmer/model/kernels/logits.py): the C kernel against its torch reference (odd sizes,
saturated tanh, a one-row vocabulary), and the dispatcher's choice: the C kernel only for float32 CPU rows up to the
count the caller names."""

from __future__ import annotations

import pytest
import torch

from glimmer.model.kernels import cpu, logits
from glimmer.model.kernels.logits import (
    probe_cpu,
    softcapped_logits,
    softcapped_logits_cpu,
    softcapped_logits_torch,
)

pytestmark = pytest.mark.skipif(cpu.library() is None, reason="no C compiler builds the CPU kernels here")


@pytest.mark.parametrize("rows", [1, 3, 8, 9])
@pytest.mark.parametrize("vocab,hidden", [(1, 16), (2, 5), (33, 37), (1000, 64)])
@pytest.mark.parametrize("multiplier,cap", [(1.0, 30.0), (2.5, 1.5)])  # the second saturates tanh
def test_the_c_kernel_computes_the_reference(rows, vocab, hidden, multiplier, cap):
    generator = torch.Generator().manual_seed(rows * vocab)
    h = torch.randn(rows, hidden, generator=generator)
    weight = torch.randn(vocab, hidden, generator=generator) / hidden**0.5
    want = softcapped_logits_torch(h, weight, multiplier, cap)
    torch.testing.assert_close(softcapped_logits_cpu(h, weight, multiplier, cap), want, rtol=1e-5, atol=1e-5)


def test_the_c_kernel_takes_float32_cpu_rows_up_to_the_count_named(monkeypatch):
    calls = []
    real = logits.softcapped_logits_cpu
    monkeypatch.setattr(logits, "softcapped_logits_cpu",
                        lambda *args, **kwargs: calls.append(args[0].shape[0]) or real(*args, **kwargs))
    h, weight = torch.randn(4, 16), torch.randn(10, 16)
    softcapped_logits(h, weight, 1.0, 30.0, c_rows=4)
    softcapped_logits(h, weight, 1.0, 30.0, c_rows=3)  # more rows than named
    softcapped_logits(h, weight, 1.0, 30.0)  # none named
    softcapped_logits(h.bfloat16(), weight.bfloat16(), 1.0, 30.0, c_rows=8)
    monkeypatch.setenv("GLIMMER_KERNELS", "torch")
    softcapped_logits(h, weight, 1.0, 30.0, c_rows=8)
    assert calls == [4]


def test_the_load_time_probe_catches_a_kernel_that_computes_nothing():
    class Broken:
        @staticmethod
        def glimmer_logits(*args):
            return None

    assert probe_cpu(cpu.library()) is None
    assert probe_cpu(Broken()) == "softcapped_logits"


def test_the_fused_softcap_is_chosen_only_without_autograd_and_for_the_probed_dtype(monkeypatch):
    """The dispatch alone (the kernel's bits are tests/model/test_kernels_cuda.py's): a product autograd records,
    or one an autocast returned in another dtype than the probed one, keeps torch's ops."""
    monkeypatch.setattr(logits, "use_triton", lambda *tensors: True)
    monkeypatch.setattr(logits, "_exact", {(0, torch.bfloat16, 1.0, 30.0): True})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(logits, "fused_softcap_exact", lambda *key: logits._exact.get(key, False))  # no GPU to probe
    fused = []
    reference = logits.softcap_torch
    monkeypatch.setattr(logits, "softcap_triton_", lambda x, m, c: fused.append(x.dtype) or reference(x, m, c))
    h, weight = torch.randn(2, 8).bfloat16(), torch.randn(5, 8).bfloat16()
    assert logits.fused_softcap_runs(h, weight, 1.0, 30.0)
    assert not logits.fused_softcap_runs(h, weight.requires_grad_(), 1.0, 30.0)
    with torch.no_grad():
        assert logits.fused_softcap_runs(h, weight, 1.0, 30.0)
    weight = weight.detach()
    assert not logits.fused_softcap_runs(h.half(), weight.half(), 1.0, 30.0)  # found inexact (here: unprobed)
    want = softcapped_logits_torch(h, weight, 1.0, 30.0)
    assert torch.equal(softcapped_logits(h, weight, 1.0, 30.0), want) and fused == [torch.bfloat16]
    monkeypatch.setattr(logits, "linear", lambda x, w: torch.nn.functional.linear(x, w).half())  # as an autocast
    assert torch.equal(softcapped_logits(h, weight, 1.0, 30.0), logits.softcap_torch(
        torch.nn.functional.linear(h, weight).half(), 1.0, 30.0)) and fused == [torch.bfloat16]
