"""Preprocessing settings (what a checkpoint's preprocessor configs say) and request limits (what we allow).

`MediaSettings` mirrors the reference image and video processors (architecture.md §6, §7); its defaults
are the released values. `load_media_settings` reads them from a checkpoint's `preprocessor_config.json`
and `video_preprocessor_config.json` dicts (or one `processor_config.json` that nests both), so a
checkpoint that changes a value is honoured. `MediaLimits` bounds the work one request can cause; the
reference has no such limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from glimmer.checkpoint.config import VisionConfig
from glimmer.errors import ConfigError

# PIL's (and transformers' PILImageResampling) code for LANCZOS, the only resampling the released
# processors use — architecture.md §6.
LANCZOS = 1


@dataclass(frozen=True)
class MediaSettings:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    # cap on merged tokens per image; smart_resize keeps the aspect ratio under it — §6
    max_image_tokens: int = 4096
    # cap on merged tokens per video frame; one target size per video — §7
    max_video_frame_tokens: int = 144
    # frame sampling: at most video_max_frames frames, at video_sample_fps — §7
    video_max_frames: int = 96
    video_sample_fps: float = 2.0
    frame_timestamp_format: str = "Time: {timestamp:.1f}s"
    # pixel = (x·rescale_factor − mean) / std, i.e. (x − 127.5)/127.5 ∈ [−1, 1] for the release — §6
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    def __post_init__(self) -> None:
        for name in (
            "patch_size",
            "temporal_patch_size",
            "merge_size",
            "max_image_tokens",
            "max_video_frame_tokens",
            "video_max_frames",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"preprocessor config: {name}={value!r} is invalid; expected a positive integer")
        for name in ("video_sample_fps", "rescale_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"preprocessor config: {name}={value!r} is invalid; expected a positive number")
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if len(value) != 3 or not all(isinstance(v, int | float) and math.isfinite(v) for v in value):
                raise ConfigError(f"preprocessor config: {name}={value!r} is invalid; expected three numbers (R, G, B)")
        if not all(v > 0 for v in self.image_std):
            raise ConfigError(f"preprocessor config: image_std={self.image_std!r} must be positive")
        try:
            self.frame_timestamp_format.format(timestamp=0.0)
        except (KeyError, IndexError, ValueError) as error:
            raise ConfigError(
                f"preprocessor config: frame_timestamp_format={self.frame_timestamp_format!r} cannot format a "
                f"timestamp ({error}); use a str.format pattern with a {{timestamp}} field"
            ) from None

    @property
    def resize_factor(self) -> int:
        """Target sizes are multiples of patch_size·merge_size pixels (28 for the release)."""
        return self.patch_size * self.merge_size

    def check_matches(self, vision: VisionConfig) -> None:
        """Raises ConfigError if the patch geometry disagrees with the checkpoint's vision tower."""
        for ours, theirs in (
            ("patch_size", "patch_size"),
            ("temporal_patch_size", "patch_temporal"),
            ("merge_size", "merge_size"),
        ):
            if getattr(self, ours) != getattr(vision, theirs):
                raise ConfigError(
                    f"preprocessor config: {ours}={getattr(self, ours)} disagrees with "
                    f"vision_config.{theirs}={getattr(vision, theirs)}; the checkpoint's files are inconsistent"
                )


@dataclass(frozen=True)
class MediaLimits:
    """Bounds on the work one request may cause. Exceeding one raises MediaLimitError (HTTP 400)."""

    # pixels of one decoded image or video frame, checked before the pixels are decoded
    max_image_pixels: int = 100_000_000
    # frames in a video stream before sampling; bounds decode time (10 minutes at 30 fps)
    max_video_source_frames: int = 18_000
    # placeholder tokens of all images and videos of one request together; None = no limit (the engine
    # also checks the prompt against the context length)
    max_media_tokens: int | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name == "max_media_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"media limits: {item.name}={value!r} is invalid; expected a positive integer")


# preprocessor-config key → MediaSettings field, per file; keys not listed (processor class names,
# `size`, `default_to_square`, ...) do not affect these processors
_IMAGE_KEYS = {
    "patch_size": "patch_size",
    "temporal_patch_size": "temporal_patch_size",
    "merge_size": "merge_size",
    "max_image_tokens": "max_image_tokens",
    "image_mean": "image_mean",
    "image_std": "image_std",
    "rescale_factor": "rescale_factor",
}
_VIDEO_KEYS = {
    "patch_size": "patch_size",
    "temporal_patch_size": "temporal_patch_size",
    "merge_size": "merge_size",
    "max_video_frame_tokens": "max_video_frame_tokens",
    "num_frames": "video_max_frames",
    "fps": "video_sample_fps",
    "frame_timestamp_format": "frame_timestamp_format",
    "image_mean": "image_mean",
    "image_std": "image_std",
    "rescale_factor": "rescale_factor",
}
# switches that the released processors turn on and that we implement only in the on position
_REQUIRED_ON = ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")


def _read(config: Mapping[str, Any], keys: Mapping[str, str], file: str) -> dict[str, Any]:
    for switch in _REQUIRED_ON + (("do_sample_frames",) if file.startswith("video") else ()):
        if config.get(switch, True) is not True:
            raise ConfigError(
                f"{file}: {switch}={config[switch]!r} is not supported; Muse Glimmer's processors use true"
            )
    resample = config.get("resample", LANCZOS)
    if resample != LANCZOS:
        raise ConfigError(f"{file}: resample={resample!r} is not supported; only LANCZOS ({LANCZOS}) is implemented")
    values = {}
    for key, name in keys.items():
        if key in config and config[key] is not None:
            value = config[key]
            values[name] = tuple(value) if isinstance(value, list) else value
    return values


def load_media_settings(
    preprocessor_config: Mapping[str, Any] | None = None,
    video_preprocessor_config: Mapping[str, Any] | None = None,
) -> MediaSettings:
    """Settings from a checkpoint's preprocessor config dicts; missing files or keys keep the defaults.

    `preprocessor_config` may also be a `processor_config.json` dict that nests `image_processor` and
    `video_processor`. Raises ConfigError for values we do not implement or that the two files disagree on.
    """
    image_config = preprocessor_config or {}
    video_config = video_preprocessor_config or {}
    if "image_processor" in image_config or "video_processor" in image_config:
        video_config = video_config or image_config.get("video_processor") or {}
        image_config = image_config.get("image_processor") or {}
    image_values = _read(image_config, _IMAGE_KEYS, "preprocessor_config.json")
    video_values = _read(video_config, _VIDEO_KEYS, "video_preprocessor_config.json")
    for name in image_values.keys() & video_values.keys():
        if image_values[name] != video_values[name]:
            raise ConfigError(
                f"preprocessor configs disagree on {name}: image {image_values[name]!r}, video "
                f"{video_values[name]!r}; Glimmer uses one value for both"
            )
    return MediaSettings(**{**image_values, **video_values})
