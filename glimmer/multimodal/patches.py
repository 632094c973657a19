"""Frames → normalised patch rows, the vision tower's input layout — architecture.md §4.1, §6 step 4–5, §7.

An image is a one-frame video: padding its frame count up to the temporal patch size by repeating the
last frame is exactly the reference's duplication of an image across the temporal patch.
"""

from __future__ import annotations

import torch

from glimmer.multimodal.settings import MediaSettings


def patch_rows(frames: torch.Tensor, settings: MediaSettings) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Turn resized uint8 frames (F, 3, H, W) into float32 rows (grid_t·grid_h·grid_w, T·3·p·p) and the grid.

    Rows go frame group, patch row, patch column (raster); each row is flattened (t, c, py, px) —
    temporal outermost, not channel (pitfall 14.18). H and W must be multiples of patch_size.
    """
    p, temporal = settings.patch_size, settings.temporal_patch_size
    num_frames, channels, height, width = frames.shape
    if missing := -num_frames % temporal:
        # the last frame is repeated up to a whole temporal patch — §7
        frames = torch.cat([frames, frames[-1:].expand(missing, -1, -1, -1)])
    grid_t, grid_h, grid_w = frames.shape[0] // temporal, height // p, width // p
    patches = frames.reshape(grid_t, temporal, channels, grid_h, p, grid_w, p)
    patches = patches.permute(0, 3, 5, 1, 2, 4, 6)  # (gt, gh, gw, t, c, py, px), still uint8: cheap to copy
    # the reference fuses rescale and normalise: (x − mean/rescale) / (std/rescale) in fp32 — §6 step 4
    mean = torch.tensor(settings.image_mean, dtype=torch.float32) * (1.0 / settings.rescale_factor)
    std = torch.tensor(settings.image_std, dtype=torch.float32) * (1.0 / settings.rescale_factor)
    normalised = (patches.float() - mean.view(3, 1, 1)) / std.view(3, 1, 1)
    return normalised.reshape(grid_t * grid_h * grid_w, temporal * channels * p * p), (grid_t, grid_h, grid_w)
