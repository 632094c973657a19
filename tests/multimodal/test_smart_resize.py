"""smart_resize and the image grid — architecture.md §6 step 2."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glimmer.multimodal import MediaSettings, image_grid, smart_resize


@pytest.mark.parametrize(
    ("height", "width", "max_tokens", "grid"),
    [
        pytest.param(480, 640, 4096, (1, 34, 46), id="coco-640x480-gives-391-tokens"),
        pytest.param(150, 230, 64, (1, 12, 18), id="230x150-cap-64"),
        pytest.param(1, 1, 4096, (1, 2, 2), id="1x1-upscales-to-one-merged-token"),
        pytest.param(5, 300, 4096, (1, 2, 22), id="5x300-tiny-and-wide"),
        pytest.param(20, 4000, 4096, (1, 2, 286), id="4000x20-very-wide"),
        pytest.param(4000, 20, 4096, (1, 286, 2), id="20x4000-very-tall"),
        pytest.param(6000, 8000, 4096, (1, 110, 146), id="48-megapixel-photo-is-capped-at-55x73-merged"),
        pytest.param(100000, 10, 4096, (1, 7144, 2), id="absurdly-tall-keeps-one-merged-column"),
    ],
)
def test_examples(height, width, max_tokens, grid) -> None:
    assert image_grid(height, width, MediaSettings(max_image_tokens=max_tokens)) == grid


def test_coco_example_token_count() -> None:
    _, grid_h, grid_w = image_grid(480, 640, MediaSettings())
    assert grid_h * grid_w // 4 == 391


@settings(max_examples=400, deadline=None)
@given(
    height=st.integers(1, 12000),
    width=st.integers(1, 12000),
    max_tokens=st.sampled_from([1, 2, 3, 16, 64, 144, 1000, 4096, 16384]),
)
def test_matches_reference_smart_resize(height, width, max_tokens, reference_smart_resize) -> None:
    assert smart_resize(height, width, 28, max_tokens) == reference_smart_resize(height, width, 28, max_tokens)


@settings(max_examples=200, deadline=None)
@given(height=st.integers(1, 5000), width=st.integers(1, 5000), max_tokens=st.integers(1, 8192))
def test_target_is_whole_merged_tokens_under_the_cap(height, width, max_tokens) -> None:
    target_height, target_width = smart_resize(height, width, 28, max_tokens)
    assert target_height % 28 == 0 and target_width % 28 == 0
    assert target_height >= 28 and target_width >= 28
    rows, cols = target_height // 28, target_width // 28
    if rows * cols > max_tokens:
        # only the reference's fallback for extreme aspect ratios leaves the cap: one row or column
        assert min(rows, cols) == 1


def test_square_tie_break_follows_the_reference(reference_smart_resize) -> None:
    # 70×70 px is 2.5×2.5 merged tokens: (2, 2) and (3, 3) fit the aspect equally well
    assert smart_resize(70, 70, 28, 4096) == reference_smart_resize(70, 70, 28, 4096)
