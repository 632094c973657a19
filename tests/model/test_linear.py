"""The projection entry point (glimmer/model/kernels/linear.py) on the CPU, and how the GPU's GEMV picks its tile.

The GEMV itself runs against `F.linear` in tests/model/test_kernels_cuda.py (on a GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glimmer.model.kernels.linear import NARROW_TILE, WIDE_TILE, linear, matvec_supports, matvec_tile


def test_on_the_cpu_a_dense_weight_takes_f_linear_for_any_row_count():
    weight, bias = torch.randn(24, 16).bfloat16(), torch.randn(24).bfloat16()
    for rows in (1, 3):
        x = torch.randn(rows, 16).bfloat16()
        assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))


def test_the_gemv_tile_is_the_wide_one_unless_it_leaves_a_nearly_empty_last_wave():
    h200 = 132  # 4 wide-tile programs per SM: 528 at once
    assert matvec_tile(2 * 4096 + 2 * 256, h200) == NARROW_TILE  # the 30B's q|k|v|gate: 544 programs, 16 left over
    for rows in (6656, 2 * 19968, 202048, 48, 5, 528 * 16):  # o and down, gate|up, lm_head, tiny, one full wave
        assert matvec_tile(rows, h200) == WIDE_TILE
    assert matvec_tile(2 * 4096 + 2 * 256, 96) == WIDE_TILE  # a smaller GPU: 544 programs are 1.4 waves of 384


def test_the_gemv_takes_one_half_precision_row_and_never_a_product_autograd_records():
    weight = torch.randn(24, 16).bfloat16()
    row = torch.randn(1, 16).bfloat16()
    assert matvec_supports(row, weight, None)
    assert matvec_supports(row.view(1, 1, 16), weight, None)
    assert not matvec_supports(torch.randn(2, 16).bfloat16(), weight, None)  # two rows: cuBLAS
    assert not matvec_supports(row.float(), weight.float(), None)  # float32 keeps F.linear's bits
    assert not matvec_supports(row, weight, torch.randn(24))  # a bias in another dtype
    trained = torch.nn.Parameter(weight.clone())
    assert not matvec_supports(row, trained, None)  # the GEMV has no backward
    with torch.no_grad():
        assert matvec_supports(row, trained, None)
