"""When the Triton kernels run (glimmer/model/kernels/support.py)."""

from __future__ import annotations

import torch

from glimmer.model.kernels import support


def test_cuda_without_triton_is_a_warning_naming_the_cuda_extra(monkeypatch):
    """Without Triton every CUDA op took its plain-torch reference and decode steps ran without CUDA graphs (several
    times slower), and nothing said so."""
    monkeypatch.delenv("GLIMMER_KERNELS", raising=False)
    monkeypatch.setattr(support, "triton_importable", lambda: False)
    warning = support.triton_missing_warning(torch.device("cuda", 0))
    assert warning is not None and 'pip install -e ".[cuda]"' in warning and "CUDA graphs" in warning
    assert support.triton_missing_warning(torch.device("cpu")) is None  # the CPU never needs it
    monkeypatch.setenv("GLIMMER_KERNELS", "torch")  # the references asked for: nothing is missing
    assert support.triton_missing_warning(torch.device("cuda")) is None


def test_cuda_with_triton_is_no_warning(monkeypatch):
    monkeypatch.delenv("GLIMMER_KERNELS", raising=False)
    monkeypatch.setattr(support, "triton_importable", lambda: True)
    assert support.triton_missing_warning(torch.device("cuda")) is None
