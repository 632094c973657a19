"""Target sizes (`smart_resize`) and the LANCZOS resize — architecture.md §6 step 2–3.

The reference resizes uint8 CHW tensors with torchvision's `resize(LANCZOS, antialias=True)`. On CPU,
torchvision ≥ 0.27 hands uint8 tensors straight to `torch.nn.functional.interpolate(mode="lanczos",
antialias=True, align_corners=False)` (`_do_native_uint8_resize_on_cpu`), so calling that torch
function ourselves is bit-identical to the reference without importing torchvision
(`bench/processor_resample_diff.py` measured 0 difference on every test image and video against
torchvision 0.28). Where this torch has no "lanczos" mode we fall back to Pillow's LANCZOS, a different
fixed-point implementation: within 1–2 uint8 levels when an axis is strongly down- or upscaled, but up
to ~40 levels (0.3–0.8 levels mean) on high-contrast detail (noise, text, fine checkerboards) when an
axis shrinks only slightly (e.g. 640×480 → 644×476, 200×600 → 196×588), where the filter's overshoot is
clipped differently.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

logger = logging.getLogger(__name__)


def smart_resize(height: int, width: int, factor: int, max_tokens: int) -> tuple[int, int]:
    """The (height, width) in pixels, multiples of `factor`, closest in aspect to the input under the cap.

    `max_tokens` caps (height/factor)·(width/factor). It may upscale. The steps are the reference's
    (architecture.md §6 step 2), including its tie-break: candidates come from a set of (rows, cols) int
    pairs, whose iteration order is fixed in CPython, and the first best one wins.
    """
    rows, cols = height / factor, width / factor
    ratio = cols / rows if rows > 0 else 1.0
    if rows * cols > max_tokens:
        rows = math.sqrt(max_tokens / ratio)
        cols = rows * ratio
    candidates = list(set(itertools.product((math.floor(rows), math.ceil(rows)), (math.floor(cols), math.ceil(cols)))))
    candidates = [(r, c) for r, c in candidates if r >= 1 and c >= 1 and r * c <= max_tokens]
    if not candidates:
        candidates = [(max(1, round(rows)), max(1, round(cols)))]
    best_rows, best_cols = min(candidates, key=lambda rc: abs(rc[0] / rc[1] - height / width))
    return best_rows * factor, best_cols * factor


@functools.cache
def torch_has_lanczos() -> bool:
    """Whether this torch's `interpolate` has the uint8 antialiased "lanczos" mode the reference uses."""
    try:
        F.interpolate(torch.zeros(1, 1, 2, 2, dtype=torch.uint8), size=(1, 1), mode="lanczos", antialias=True)
    except (NotImplementedError, RuntimeError, ValueError):
        logger.warning(
            "this torch has no uint8 'lanczos' interpolation; resizing with Pillow's LANCZOS instead, which can "
            "differ from the reference by a few levels per pixel (upgrade torch for bit-exact preprocessing)"
        )
        return False
    return True


def resize_frames(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Resize uint8 frames (F, 3, H, W) to (F, 3, height, width) with antialiased LANCZOS."""
    if frames.shape[-2:] == (height, width):
        return frames  # the reference skips the resize when the size is already right
    if torch_has_lanczos():
        return F.interpolate(frames, size=(height, width), mode="lanczos", antialias=True, align_corners=False)
    resized = [
        np.asarray(Image.fromarray(frame.permute(1, 2, 0).numpy()).resize((width, height), Image.Resampling.LANCZOS))
        for frame in frames
    ]
    return torch.from_numpy(np.stack(resized)).permute(0, 3, 1, 2)
