"""cuBLASLt products chosen by measurement (kernels/tuned_gemm.py) against F.linear and a float32 product, on the
GPU (skipped without CUDA): every candidate the heuristic offers is checked, not only the one that wins."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from glimmer.model.kernels import tuned_gemm  # noqa: E402
from glimmer.model.kernels.linear import linear  # noqa: E402
from glimmer.model.kernels.tuned_gemm import (  # noqa: E402
    Descriptors,
    LtProduct,
    ProductShape,
    choose_products,
    close_to_reference,
    tuned_product,
)

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch, tmp_path):
    """No choice of another test (or engine) in this process, and a cache directory of this test's own."""
    monkeypatch.setattr(tuned_gemm, "_chosen", {})
    monkeypatch.setattr(tuned_gemm, "_geometry", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("GLIMMER_GEMM", raising=False)
    monkeypatch.delenv("GLIMMER_KERNELS", raising=False)


def _weights(count: int, out_features: int, in_features: int, dtype=torch.bfloat16) -> list[torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(out_features * 7 + in_features)
    return [torch.randn((out_features, in_features), device="cuda", generator=generator).to(dtype) / in_features**0.5
            for _ in range(count)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "out_features", "in_features"), [(2, 1024, 512), (8, 96, 64), (64, 1536, 1024),
                                                                   (24, 4096, 768), (256, 512, 2048)])
def test_every_heuristic_candidate_is_as_close_to_the_float32_product_as_f_linear(rows, out_features, in_features,
                                                                                   dtype):
    weight = _weights(1, out_features, in_features, dtype)[0]
    x = torch.randn((rows, in_features), device="cuda").to(dtype)
    exact = x.float() @ weight.float().T
    cublas_error = (F.linear(x, weight).float() - exact).abs().max().item()
    shape = ProductShape(rows, out_features, in_features, dtype)
    descriptors = Descriptors(shape)
    candidates = descriptors.heuristic_algos(0)
    assert candidates, "cuBLASLt offered no algorithm"
    for candidate in candidates:
        product = LtProduct(shape, descriptors, candidate.algo, 0)
        out = product(x, weight)
        assert out.shape == (rows, out_features) and out.dtype == dtype
        assert close_to_reference(out, exact, cublas_error)
        assert torch.equal(out, product(x, weight))  # the same bits on every call


def test_a_product_replays_from_a_cuda_graph_with_the_bits_it_gives_eagerly():
    weight = _weights(1, 2048, 1024)[0]
    x = torch.randn((32, 1024), device="cuda").bfloat16()
    shape = ProductShape(32, 2048, 1024, torch.bfloat16)
    descriptors = Descriptors(shape)
    for candidate in descriptors.heuristic_algos(0):
        product = LtProduct(shape, descriptors, candidate.algo, 0)
        eager = product(x, weight)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            product(x, weight)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = product(x, weight)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed, eager)


def test_linear_runs_the_chosen_product_for_its_shape_and_f_linear_for_any_other():
    weights = _weights(4, 4096, 1024)
    choices = choose_products(weights, rows=(1, 4, 16, 64))
    assert sorted(c.shape.rows for c in choices) == [4, 16, 64]  # one row runs the GEMV, never measured
    for choice in choices:
        assert choice.cublas_us > 0
        x = torch.randn((choice.shape.rows, 1024), device="cuda").bfloat16()
        product = tuned_product(x, weights[1], None)
        if choice.algo_hex is None:
            assert product is None
            assert torch.equal(linear(x, weights[1]), F.linear(x, weights[1]))
            continue
        assert product is not None and product.algo_hex == choice.algo_hex
        assert choice.chosen_us < (1 - tuned_gemm.MIN_GAIN) * choice.cublas_us
        assert torch.equal(linear(x, weights[1]), product(x, weights[1]))
        # leading dimensions are rows too; a bias, another row count or float32 stays with F.linear
        assert torch.equal(linear(x.view(2, -1, 1024), weights[1]), product(x, weights[1]).view(2, -1, 4096))
        bias = torch.randn(4096, device="cuda").bfloat16()
        assert torch.equal(linear(x, weights[1], bias), F.linear(x, weights[1], bias))
    odd = torch.randn((5, 1024), device="cuda").bfloat16()
    assert tuned_product(odd, weights[0], None) is None
    measured = torch.randn((16, 1024), device="cuda")  # a measured row count, but float32
    assert tuned_product(measured, weights[0].float(), None) is None


def test_a_row_view_that_is_not_16_byte_aligned_stays_with_f_linear():
    weights = _weights(2, 4096, 1024)
    choose_products(weights, rows=(8,))
    if tuned_gemm._chosen[(0, ProductShape(8, 4096, 1024, torch.bfloat16))] is None:
        pytest.skip("F.linear won at this shape on this GPU")
    storage = torch.randn(8 * 1024 + 1, device="cuda").bfloat16()
    x = storage[1:].view(8, 1024)  # 2 bytes past an aligned start
    assert tuned_product(x, weights[0], None) is None
    assert torch.equal(linear(x, weights[0]), F.linear(x, weights[0]))


def test_choices_are_kept_on_disk_and_a_restart_reuses_them_without_measuring(monkeypatch, tmp_path):
    weights = _weights(3, 4096, 1024)
    first = choose_products(weights, rows=(8, 32))
    files = list((tmp_path / "cache" / "glimmer" / "gemm").glob("*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())["choices"]
    assert sorted(saved) == ["32x4096x1024:bfloat16", "8x4096x1024:bfloat16"]

    monkeypatch.setattr(tuned_gemm, "_chosen", {})  # a new process

    def no_measuring(*args):
        raise AssertionError("measured a shape the cache holds")

    monkeypatch.setattr(tuned_gemm, "_measure", no_measuring)
    again = choose_products(weights, rows=(8, 32))
    assert [(c.shape, c.algo_hex) for c in again] == [(c.shape, c.algo_hex) for c in first]
    x = torch.randn((32, 1024), device="cuda").bfloat16()
    chosen = tuned_product(x, weights[0], None)
    assert (chosen.algo_hex if chosen else None) == next(c.algo_hex for c in first if c.shape.rows == 32)


def test_an_unreadable_cache_or_a_refused_algorithm_is_measured_again(monkeypatch, tmp_path, caplog):
    weights = _weights(2, 2048, 1024)
    choose_products(weights, rows=(16,))
    path = next((tmp_path / "cache" / "glimmer" / "gemm").glob("*.json"))
    path.write_text("{not json")
    monkeypatch.setattr(tuned_gemm, "_chosen", {})
    with caplog.at_level("WARNING", logger="glimmer.model.kernels.tuned_gemm"):
        choices = choose_products(weights, rows=(16,))
    assert "cannot read" in caplog.text and len(choices) == 1
    # an algorithm cuBLASLt no longer accepts (another library's, or a damaged entry): measured again, not used
    data = json.loads(path.read_text())
    data["choices"]["16x2048x1024:bfloat16"]["algo"] = "ff" * 64
    path.write_text(json.dumps(data))
    monkeypatch.setattr(tuned_gemm, "_chosen", {})
    caplog.clear()
    with caplog.at_level("WARNING", logger="glimmer.model.kernels.tuned_gemm"):
        choices = choose_products(weights, rows=(16,))
    assert "refuses the cached algorithm" in caplog.text
    assert choices[0].algo_hex != "ff" * 64


def test_glimmer_gemm_cublas_keeps_every_product_on_f_linear(monkeypatch):
    weights = _weights(2, 4096, 1024)
    choose_products(weights, rows=(8, 32))  # an engine started before, with tuning on
    monkeypatch.setenv("GLIMMER_GEMM", "cublas")
    assert choose_products(weights, rows=(8, 32)) == []
    x = torch.randn((8, 1024), device="cuda").bfloat16()
    assert tuned_product(x, weights[0], None) is None


def test_measuring_a_large_weight_holds_no_whole_float32_copy_of_it():
    """The choice is measured after the KV cache took the GPU's memory: the exactness check's float32 reference
    widens the weight a slice at a time (the 30B's output embedding is 5.4 GB in float32), and gives the whole
    product's values."""
    weight = _weights(1, 65536, 4096)[0]  # 0.5 GiB in bf16, 1 GiB in float32
    x = torch.randn((64, 4096), device="cuda").bfloat16()
    whole = x.float() @ weight.float().T
    assert torch.allclose(tuned_gemm._float32_product(x, weight), whole, rtol=1e-5, atol=1e-5)
    del whole
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    choose_products([weight], rows=(64,))
    assert torch.cuda.max_memory_allocated() - base < weight.numel() * 4 // 2


def test_measuring_many_shapes_leaves_no_memory_allocated_behind():
    """Every measurement runs on one side stream: cuBLAS keeps a workspace for each stream it ran on until the
    process ends, and a stream per measured shape left 32 MiB each allocated (1.05 GiB after the 30B's 33 shapes,
    which the engine's first start then took from its KV cache)."""
    weights = [w for out_features in (1024, 1536, 2048, 2560, 3072, 3584) for w in _weights(1, out_features, 1024)]
    choose_products(weights[:1], rows=(8,))  # the side stream's own workspace, kept once
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    choices = choose_products(weights, rows=(8, 16))
    torch.cuda.synchronize()
    assert sum(c.measured for c in choices) == 11  # 6 shapes × 2 row counts, less the one measured above
    assert torch.cuda.memory_allocated() - base < 8 << 20
