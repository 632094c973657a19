"""Every Triton kernel against its plain-torch reference, on the GPU (skipped without CUDA).

Attention cases cover ragged batches, prefill chunks after a cached prefix (prefix-cache hits and chunked
prefill look alike to a kernel), decode, window and block boundaries, GQA 16:1 at head_dim 128 and the tiny
ratios, split-KV and the fused output gate; unused cache slots hold NaN, so a kernel that reads one fails.
float32 agrees to rounding; bf16 stays within the reference's own bf16 error against float32.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))

from paged_cases import make_case  # noqa: E402

from glimmer.model.kernels import logits as logits_kernels  # noqa: E402
from glimmer.model.kernels import support, tuned_gemm  # noqa: E402
from glimmer.model.kernels.linear import linear, matvec_triton  # noqa: E402
from glimmer.model.kernels.logits import (  # noqa: E402
    fused_softcap_exact,
    softcap_triton_,
    softcapped_logits,
    softcapped_logits_torch,
)
from glimmer.model.kernels.paged_attention import paged_attention_torch, paged_attention_triton  # noqa: E402
from glimmer.model.kernels.qk_norm_rope import (  # noqa: E402
    HeadLayout,
    qk_norm_rope_store_torch,
    qk_norm_rope_store_triton,
)
from glimmer.model.kernels.residual_norm import NormSpec, residual_norm_torch, residual_norm_triton  # noqa: E402
from glimmer.model.kernels.silu_mul import silu_mul_torch, silu_mul_triton  # noqa: E402
from glimmer.model.kernels.support import dependent_launch, dependent_launch_failure  # noqa: E402
from glimmer.model.layers import RotaryTable  # noqa: E402

pytestmark = pytest.mark.cuda

ATTENTION_CASES = {
    "decode-ragged": ([(37, 1), (5, 1), (16, 1), (0, 1), (300, 1)], None),
    "decode-window": ([(37, 1), (5, 1), (70, 1), (31, 1), (32, 1), (33, 1)], 32),
    "prefill-ragged": ([(0, 23), (0, 1), (0, 64), (0, 17)], None),
    "chunk-after-prefix": ([(48, 16), (17, 9), (40, 1), (64, 33)], None),
    "chunk-window": ([(0, 100), (40, 70), (33, 31), (95, 2)], 32),
    "verify-window": ([(200, 16), (31, 16), (1000, 8)], 64),
}


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("heads", [(4, 2, 16), (32, 2, 128), (8, 8, 64)], ids=["gqa2-d16", "gqa16-d128", "mha-d64"])
@pytest.mark.parametrize("name", list(ATTENTION_CASES))
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_paged_attention_matches_the_reference_in_float32(name, heads, num_splits):
    lengths, window = ATTENTION_CASES[name]
    num_q_heads, num_kv_heads, head_dim = heads
    case = make_case(lengths, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     sliding_window=window, device="cuda", seed=len(name))
    scale = head_dim**-0.5 * 3.0
    gate = torch.randn((case.query.shape[0], num_q_heads * head_dim), device="cuda")
    for g in (None, gate):
        ref = paged_attention_torch(case.query, case.key_cache, case.value_cache, case.group, case.ctx, window,
                                    scale, g)
        out = paged_attention_triton(case.query, case.poisoned_key_cache, case.poisoned_value_cache, case.group,
                                     case.ctx, window, scale, g, num_splits=num_splits)
        assert torch.isfinite(out).all()
        # float32 up to summation order (exp amplifies it on the largest logits): tight in norm, loose per element
        assert _error(out, ref) < 1e-5
        torch.testing.assert_close(out, ref, rtol=1e-3, atol=5e-5)


@pytest.mark.parametrize("name", list(ATTENTION_CASES))
@pytest.mark.parametrize("num_splits", [None, 1, 4], ids=["splits-auto", "splits-1", "splits-4"])
def test_paged_attention_in_bf16_stays_within_the_references_own_error(name, num_splits):
    # the 30B's heads; 1 and 4 splits take the decode tiles of large batches (`decode_tiles`)
    lengths, window = ATTENTION_CASES[name]
    case = make_case(lengths, num_q_heads=32, num_kv_heads=2, head_dim=128, sliding_window=window,
                     device="cuda", seed=3)
    scale = 128**-0.5 * 3.87
    exact = paged_attention_torch(case.query, case.key_cache, case.value_cache, case.group, case.ctx, window, scale)
    half = lambda t: t.to(torch.bfloat16)  # noqa: E731
    ref = paged_attention_torch(half(case.query), half(case.key_cache), half(case.value_cache), case.group,
                                case.ctx, window, scale)
    out = paged_attention_triton(half(case.query), half(case.poisoned_key_cache), half(case.poisoned_value_cache),
                                 case.group, case.ctx, window, scale, num_splits=num_splits)
    assert torch.isfinite(out).all()
    assert _error(out, exact) <= 1.5 * _error(ref, exact) + 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "nope"])
def test_qk_norm_rope_store_matches_the_reference(dtype, rope):
    torch.manual_seed(7)
    layout = HeadLayout(32, 2, 128)
    n = 37
    qkvg = (torch.randn((n, 2 * 32 * 128 + 2 * 2 * 128), device="cuda") * 3).to(dtype)
    rotary = RotaryTable(128, 500000.0)(torch.randint(0, 100000, (n,), device="cuda"), dtype) if rope else None
    slots = torch.randperm(40 * 16, device="cuda")[:n]
    caches = [torch.full((40, 16, 2, 128), float("nan"), dtype=dtype, device="cuda") for _ in range(4)]
    q_ref = qk_norm_rope_store_torch(qkvg, layout, 1e-5, 3.87, rotary, caches[0], caches[1], slots)
    q_out = qk_norm_rope_store_triton(qkvg, layout, 1e-5, 3.87, rotary, caches[2], caches[3], slots)
    exact = dtype == torch.float32
    # float32: the kernel's fused multiply-adds and sum order move a result by a few ulps of the largest
    # products (|q| reaches ~12 here): over 300 random draws at most 3.8e-6 (1.3e-6 past rtol 1e-6 alone)
    tolerance = {"rtol": 1e-6, "atol": 5e-6} if exact else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(q_out, q_ref, **tolerance)
    torch.testing.assert_close(caches[2], caches[0], equal_nan=True, **tolerance)
    torch.testing.assert_close(caches[3], caches[1], equal_nan=True, rtol=0, atol=0)
    if not exact:  # the rounding steps follow the reference: nearly every element is bit-identical
        assert (q_out != q_ref).float().mean() < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 6656])
def test_residual_norm_matches_the_reference(dtype, width):
    rows = 19
    h = torch.randn((rows, width), device="cuda").to(dtype)
    residual = (torch.randn((rows, width), device="cuda") * 10).to(dtype)
    post = NormSpec((torch.randn(width, device="cuda") * 0.3).to(dtype), 1e-8, 1.0)
    following = NormSpec((torch.randn(width, device="cuda") * 0.3).to(dtype), 1e-5, 1.0)
    final = NormSpec((1 + torch.randn(width, device="cuda") * 0.3).to(dtype), 1e-5, 0.0)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    for args in ((h, residual, post, following), (h, residual, post, final), (None, residual, None, following)):
        for got, want in zip(residual_norm_triton(*args), residual_norm_torch(*args), strict=True):
            torch.testing.assert_close(got, want, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_the_reference(dtype):
    gate_up = (torch.randn((13, 2 * 19968), device="cuda") * 4).to(dtype)
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    torch.testing.assert_close(silu_mul_triton(gate_up), silu_mul_torch(gate_up), **tolerance)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("multiplier,cap", [(1.0, 30.0), (0.25, 15.0), (3.0, 0.5)])
def test_the_fused_softcap_gives_the_references_bits_on_every_16_bit_value(dtype, multiplier, cap):
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype).cuda()
    got = softcap_triton_(every.clone(), multiplier, cap)
    want = ((every * multiplier) / cap).tanh() * cap  # the reference's ops after its product
    same = (got.view(torch.int16) == want.view(torch.int16)) | (got.isnan() & want.isnan())
    assert same.all(), every[~same][:8].tolist()
    assert fused_softcap_exact(torch.cuda.current_device(), dtype, multiplier, cap)


def test_softcapped_logits_fuse_the_cap_for_16_bit_cuda_rows_only_and_give_the_references_bits(monkeypatch):
    for dtype in (torch.bfloat16, torch.float16):  # probed first, so the count below is the logits' calls only
        for multiplier, cap in ((1.0, 30.0), (0.5, 2.0)):
            assert fused_softcap_exact(torch.cuda.current_device(), dtype, multiplier, cap)
    calls = []
    real = logits_kernels.softcap_triton_
    monkeypatch.setattr(logits_kernels, "softcap_triton_", lambda *args: calls.append(args[0].dtype) or real(*args))
    generator = torch.Generator(device="cuda").manual_seed(5)
    hidden = torch.randn((7, 256), device="cuda", generator=generator)
    weight = torch.randn((5000, 256), device="cuda", generator=generator) / 4  # saturates tanh at cap 2
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        h, w = hidden.to(dtype), weight.to(dtype)
        for multiplier, cap in ((1.0, 30.0), (0.5, 2.0)):
            assert torch.equal(softcapped_logits(h, w, multiplier, cap), softcapped_logits_torch(h, w, multiplier, cap))
    assert calls == [torch.bfloat16] * 2 + [torch.float16] * 2


def test_an_unprobed_or_inexact_fused_softcap_leaves_the_reference_to_run(monkeypatch, caplog):
    monkeypatch.setattr(logits_kernels, "_exact", {})
    h = torch.randn((3, 64), device="cuda").bfloat16()
    w = torch.randn((100, 64), device="cuda").bfloat16()
    calls = []
    real = logits_kernels.softcap_triton_
    monkeypatch.setattr(logits_kernels, "softcap_triton_", lambda *args: calls.append(1) or real(*args))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # unprobed inside a capture: the reference's ops are captured
        captured = softcapped_logits(h, w, 1.0, 30.0)
    graph.replay()
    assert calls == [] and torch.equal(captured, softcapped_logits_torch(h, w, 1.0, 30.0))
    # a kernel whose bits differ anywhere is found out by the probe and not used
    monkeypatch.setattr(logits_kernels, "softcap_triton_", lambda x, m, c: real(x, m, c).mul_(1.0078125))
    with caplog.at_level(logging.WARNING, logger="glimmer.model.kernels.logits"):
        assert not fused_softcap_exact(torch.cuda.current_device(), torch.bfloat16, 1.0, 30.0)
    assert "keep torch's ops" in caplog.text
    assert torch.equal(softcapped_logits(h, w, 1.0, 30.0), softcapped_logits_torch(h, w, 1.0, 30.0))


MATVEC_SHAPES = {  # (out, in): three of the 30B's projections (q|k|v|gate takes the narrow tile), tiny and ragged ones
    "qkvg-30b": (8704, 6656), "o-30b": (6656, 4096), "down-30b": (6656, 19968), "tiny": (48, 64),
    "ragged": (37, 100), "narrow": (5, 3),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape", list(MATVEC_SHAPES))
def test_matvec_matches_f_linear(shape, bias, dtype):
    out_features, in_features = MATVEC_SHAPES[shape]
    generator = torch.Generator(device="cuda").manual_seed(out_features)
    # a column slice of a wider matrix: rows strided past their length, as a fused weight's view can be
    wide = torch.randn((out_features, in_features + 8), device="cuda", generator=generator)
    weight = (wide[:, :in_features] * in_features**-0.5).to(dtype)
    x = torch.randn((1, in_features), device="cuda", generator=generator).to(dtype)
    b = torch.randn(out_features, device="cuda", generator=generator).to(dtype) if bias else None
    got = matvec_triton(x, weight, b)
    exact = F.linear(x.double(), weight.double(), None if b is None else b.double())
    # the GEMV sums in fp32 and rounds once (bias included): within one rounding step of the exact product plus
    # fp32's summation error. cuBLAS is not always that close: for some shapes it rounds the product before adding
    # the bias (the 37×100 bf16 case), so the GEMV's error is bounded, never compared, against it
    step = exact.abs() * (2**-7 if dtype == torch.bfloat16 else 2**-10)
    step += 1e-6 * F.linear(x.double().abs(), weight.double().abs())
    assert ((got.double() - exact).abs() <= step).all()
    # one rounding of an fp32 sum: nearly every output is the exact product rounded once. Compared with the exact
    # product, not cuBLAS, whose fp16 bits differ by GPU: 2.4% of the 30B's q|k|v|gate outputs differed from the
    # GEMV's on an H100 (torch lets cuBLAS reduce fp16 in fp16 by default), under 2% on an H200
    assert (got != exact.to(dtype)).float().mean() < 0.02
    # any leading shape of one row
    torch.testing.assert_close(matvec_triton(x.view(1, 1, -1), weight, b), got.view(1, 1, -1), rtol=0, atol=0)


def test_linear_runs_the_gemv_for_one_half_precision_row_and_cublas_otherwise(monkeypatch):
    monkeypatch.setattr(tuned_gemm, "_chosen", {})  # no product measured faster for these shapes
    weight = torch.randn((96, 64), device="cuda").bfloat16()
    one, two = torch.randn((1, 64), device="cuda").bfloat16(), torch.randn((2, 64), device="cuda").bfloat16()
    assert torch.equal(linear(one, weight), matvec_triton(one, weight))
    assert torch.equal(linear(two, weight), F.linear(two, weight))
    assert torch.equal(linear(one.float(), weight.float()), F.linear(one.float(), weight.float()))


def test_kernels_launch_as_dependent_launches_on_hopper_and_a_graph_replays_them_exactly():
    assert dependent_launch(torch.cuda.current_device()) == (torch.cuda.get_device_capability()[0] >= 9)
    probe = "from glimmer.model.kernels.support import dependent_launch; print(dependent_launch(0))"
    switched_off = subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, "GLIMMER_PDL": "0"}, capture_output=True, text=True,
        check=True)
    assert switched_off.stdout.strip() == "False"
    # a decode layer's chain of kernels, each reading the one before it: eager and graph replay give the same bits
    width, inner = 512, 1024
    norm = NormSpec(torch.randn(width, device="cuda").bfloat16(), 1e-5, 1.0)
    up = (torch.randn((2 * inner, width), device="cuda") * 0.05).bfloat16()
    down = (torch.randn((width, inner), device="cuda") * 0.05).bfloat16()
    residual = torch.randn((1, width), device="cuda").bfloat16()

    def chain():
        x, h = residual, residual
        for _ in range(8):
            x, h = residual_norm_triton(h, x, norm, norm)
            h = matvec_triton(silu_mul_triton(matvec_triton(h, up)), down)
        return h

    eager = chain()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain()
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


def test_dependent_launch_is_probed_and_a_driver_that_refuses_it_gets_plain_launches(monkeypatch, caplog):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0+")
    assert dependent_launch_failure(torch.cuda.current_device()) is None
    counter = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # asked inside a capture, it says so and leaves the capture intact
        counter.add_(1)
        assert "capture" in dependent_launch_failure(torch.cuda.current_device())
    graph.replay()
    assert counter.item() == 1
    monkeypatch.setattr(support, "dependent_launch_failure", lambda index: "RuntimeError: not supported")
    with caplog.at_level(logging.WARNING, logger="glimmer.model.kernels.support"):
        assert support.dependent_launch.__wrapped__(torch.cuda.current_device()) is False  # past the cache
    assert "not supported" in caplog.text and "launch plainly" in caplog.text
