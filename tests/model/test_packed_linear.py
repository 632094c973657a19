"""The CPU's packed projections (glimmer/model/kernels/packed_linear.py) against F.linear, their reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glimmer.model.kernels.linear import linear
from glimmer.model.kernels.packed_linear import PackedLinear, packs

pytestmark = pytest.mark.skipif(not packs("cpu", torch.float32), reason="this torch build has no working oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 8, 37, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_product_agrees_with_f_linear_in_fp32(rows, bias):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=generator)
    b = torch.randn(96, generator=generator) if bias else None
    x = torch.randn(rows, 80, generator=generator)
    got = linear(x, PackedLinear(weight, b))
    torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_packed_product_takes_rows_of_any_leading_shape_and_strided_rows():
    weight = torch.randn(64, 48)
    packed = PackedLinear(weight, None)
    x = torch.randn(2, 5, 48)
    torch.testing.assert_close(packed(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    strided = torch.randn(7, 96)[:, :48]
    torch.testing.assert_close(packed(strided), F.linear(strided, weight), rtol=1e-5, atol=1e-5)


def test_packed_product_agrees_with_f_linear_in_bf16():
    if not packs("cpu", torch.bfloat16):
        pytest.skip("no bf16 oneDNN on this CPU")
    weight, x = torch.randn(64, 128).bfloat16(), torch.randn(4, 128).bfloat16()
    torch.testing.assert_close(PackedLinear(weight, None)(x).float(), F.linear(x, weight).float(), rtol=2e-2, atol=2e-2)


def test_dense_weights_stay_the_reference_path():
    weight, b, x = torch.randn(8, 4), torch.randn(8), torch.randn(2, 4)
    assert torch.equal(linear(x, weight, b), F.linear(x, weight, b))


def test_only_cpu_weights_of_packed_dtypes_are_packed_and_glimmer_kernels_torch_keeps_them_dense(monkeypatch):
    assert packs("cpu", torch.float32)
    assert not packs("cpu", torch.float16)
    assert not packs("meta", torch.float32)
    monkeypatch.setenv("GLIMMER_KERNELS", "torch")
    assert not packs("cpu", torch.float32)
