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


def test_the_side_stream_is_one_per_gpu_and_the_current_gpus_for_a_device_without_an_index(monkeypatch):
    """Simulated on the CPU (the streams are stand-ins): `"cuda"` names the current GPU, as torch.cuda.Stream takes
    it, and every call for one GPU gets the same stream (cuBLAS keeps a workspace per stream it ran on)."""
    made = []
    monkeypatch.setattr(support.torch.cuda, "Stream", lambda index: made.append(index) or object())
    monkeypatch.setattr(support.torch.cuda, "current_device", lambda: 1)
    support._side_stream.cache_clear()
    try:
        plain = support.side_stream(torch.device("cuda"))
        assert support.side_stream(torch.device("cuda", 1)) is plain
        assert support.side_stream(torch.device("cuda", 0)) is not plain
        assert made == [1, 0]
    finally:
        support._side_stream.cache_clear()
