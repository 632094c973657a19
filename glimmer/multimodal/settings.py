"""Preprocessing settings (what a checkpoint's preprocessor configs say) and request limits (what we allow).

`MediaSettings` mirrors the reference image and video processors (architecture.md §6, §7); its defaults
are the released values. `load_media_settings` reads them from a checkpoint's `preprocessor_config.json`
and `video_preprocessor_config.json` dicts (or one `processor_config.json` that nests both, which comes
first where a checkpoint has both forms, as in transformers), so a checkpoint that changes a value is
honoured. `MediaLimits` bounds the work one request can cause; the reference has no such limits.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from glimmer.checkpoint.config import VisionConfig, is_finite, is_finite_number
from glimmer.checkpoint.json_files import read_json_object
from glimmer.errors import ConfigError
from glimmer.multimodal.errors import MediaDecodeError, MediaLimitError

# PIL's (and transformers' PILImageResampling) code for LANCZOS, the only resampling the released
# processors use — architecture.md §6.
LANCZOS = 1

logger = logging.getLogger(__name__)


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
            if not is_finite_number(value) or value <= 0:
                raise ConfigError(f"preprocessor config: {name}={value!r} is invalid; expected a positive number")
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if not isinstance(value, tuple | list) or len(value) != 3 or not all(
                isinstance(v, int | float) and is_finite(v) for v in value
            ):
                raise ConfigError(f"preprocessor config: {name}={value!r} is invalid; expected three numbers (R, G, B)")
        if not all(v > 0 for v in self.image_std):
            raise ConfigError(f"preprocessor config: image_std={self.image_std!r} must be positive")
        if not isinstance(self.frame_timestamp_format, str):
            raise ConfigError(f"preprocessor config: frame_timestamp_format={self.frame_timestamp_format!r} is "
                              "invalid; expected a str.format pattern with a {timestamp} field")
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
    """Bounds on the work one request may cause. Exceeding one raises MediaLimitError (HTTP 400).

    The size of an image or video frame is checked against the first three from the file's header, before
    any pixel is decoded: a 74-byte PNG may claim 1 × 100,000,000 pixels.
    """

    # pixels of one decoded image or video frame
    max_image_pixels: int = 100_000_000
    # the longer side of an image or video frame, in pixels
    max_image_side: int = 16_384
    # longer side / shorter side; the resized image must still hold at least one patch row (the reference's
    # Qwen-style processors refuse 200:1 as well)
    max_image_aspect_ratio: int = 200
    # pixels of one video frame (every frame up to the last sampled one is decoded): 4096×2160
    max_video_frame_pixels: int = 8_847_360
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

    @property
    def max_frame_pixels(self) -> int:
        return min(self.max_image_pixels, self.max_video_frame_pixels)

    def check_frame_size(self, kind: str, index: int, width: int, height: int) -> None:
        """Raises MediaDecodeError for an empty frame, MediaLimitError for one beyond the pixel, side or aspect
        limits (each limit value itself is allowed)."""
        what = "the video frames are" if kind == "video" else "the image is"
        if width <= 0 or height <= 0:
            raise MediaDecodeError(kind, index, f"{what} empty ({width}×{height} pixels)")
        per_frame = " per frame" if kind == "video" else ""
        longer, shorter = max(width, height), min(width, height)
        pixel_limit = self.max_frame_pixels if kind == "video" else self.max_image_pixels
        fix = f"downscale the {kind} before sending it"
        if longer > self.max_image_side:
            problem = f"{width}×{height}{per_frame}: a side of {longer:,} pixels exceeds the limit of " \
                      f"{self.max_image_side:,}"
        elif longer > self.max_image_aspect_ratio * shorter:
            problem = f"{width}×{height}{per_frame}: the aspect ratio exceeds the limit of " \
                      f"{self.max_image_aspect_ratio}:1"
            # downscaling keeps the ratio
            fix = (f"crop or pad the {kind} to at most {self.max_image_aspect_ratio}:1 before sending it (the server's "
                   "--max-image-aspect-ratio sets the limit)")
        elif width * height > pixel_limit:
            problem = f"{width}×{height} = {width * height:,} pixels{per_frame} exceeds the limit of {pixel_limit:,}"
        else:
            return
        raise MediaLimitError(kind, index, f"{problem}; {fix}")


@dataclass(frozen=True)
class MediaFetchPolicy:
    """Where a request's images and videos may come from, besides data URLs (always allowed).

    allowed_local_paths: directories (resolved) whose files requests may name; none by default.
    allow_remote: fetch http(s) URLs from any host whose addresses are all public.
    allowed_domains: hosts (exact names) that may be fetched over http(s) even when they resolve to loopback,
        link-local or private addresses (an internal image store the operator vouches for).
    max_bytes, timeout_s, max_redirects: bounds on one remote download.
    """

    allowed_local_paths: tuple[Path, ...] = ()
    allow_remote: bool = False
    allowed_domains: tuple[str, ...] = ()
    max_bytes: int = 64 << 20
    timeout_s: float = 10.0
    max_redirects: int = 3

    @classmethod
    def create(cls, allowed_local_paths: list[str | os.PathLike] | None = None, *,
               allowed_domains: list[str] | None = None, **kwargs: Any) -> MediaFetchPolicy:
        """A policy from operator input: paths resolved, domain names normalized (lower case, no final dot). Raises
        ConfigError for a blank path (BLANK_MEDIA_DIRECTORY) and a domain that is no host name (NOT_A_HOST_NAME)."""
        for path in allowed_local_paths or []:
            # Path("") is the working directory, every image under it then readable by any request
            if not os.fspath(path).strip():
                raise ConfigError(f"allowed_local_media_path: {path!r} {BLANK_MEDIA_DIRECTORY}")
        roots = tuple(Path(p).expanduser().resolve() for p in (allowed_local_paths or []))
        domains = tuple(host_name(name) for name in (allowed_domains or []))
        return cls(allowed_local_paths=roots, allowed_domains=domains, **kwargs)

    @property
    def allows_remote(self) -> bool:
        return self.allow_remote or bool(self.allowed_domains)

    def allows_host(self, host: str) -> bool:
        return self.allow_remote or host in self.allowed_domains


BLANK_MEDIA_DIRECTORY = ("is blank (empty or white space alone, as an unset variable's \"$DIR\" gives), which names no "
                         "directory meant; give the directories whose images and videos may be named")
NOT_A_HOST_NAME = "is not a host name; give names like images.internal or 10.0.0.5, without scheme, port or path"


def host_name(name: str) -> str:
    """`name` as URLs spell a host once parsed: lower case, no final dot, IPv6 without brackets; ConfigError for a
    name that is none (`http://x`, `x:80`), NOT_A_HOST_NAME."""
    host = name.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not re.fullmatch(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*", host):
        raise ConfigError(f"allowed media domain {name!r} {NOT_A_HOST_NAME}")
    return host


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
            if name in ("image_mean", "image_std") and isinstance(value, int | float) and not isinstance(value, bool):
                value = [value] * 3  # one number for every channel, as the reference processors read it
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
        nested = {key: image_config.get(key) or {} for key in ("image_processor", "video_processor")}
        for key, section in nested.items():
            if not isinstance(section, Mapping):
                raise ConfigError(f"processor_config.json: {key} must be a JSON object, not {type(section).__name__}")
        video_config = video_config or nested["video_processor"]
        image_config = nested["image_processor"]
    image_values = _read(image_config, _IMAGE_KEYS, "preprocessor_config.json")
    video_values = _read(video_config, _VIDEO_KEYS, "video_preprocessor_config.json")
    for name in image_values.keys() & video_values.keys():
        if image_values[name] != video_values[name]:
            raise ConfigError(
                f"preprocessor configs disagree on {name}: image {image_values[name]!r}, video "
                f"{video_values[name]!r}; Glimmer uses one value for both"
            )
    return MediaSettings(**{**image_values, **video_values})


def checkpoint_media_settings(
    checkpoint_dir: Path, vision: VisionConfig, embedded: Mapping[str, Any] | None = None
) -> MediaSettings:
    """The settings a vision checkpoint is served with, checked against its vision config (ConfigError otherwise).

    `embedded` is the preprocessor config a GGUF `--mmproj` carries; without it they come from the directory's
    processor config files, found as transformers finds them (`_processor_configs`).
    """
    if embedded is not None:
        settings = load_media_settings(embedded)
    else:
        settings = load_media_settings(*_processor_configs(checkpoint_dir))
    settings.check_matches(vision)
    return settings


def _processor_configs(checkpoint_dir: Path) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """A checkpoint directory's image and video processor configs, for `load_media_settings`, found as transformers
    (5.x) finds them: the `image_processor` and `video_processor` sections of `processor_config.json` (what its
    save_pretrained writes) first, before `preprocessor_config.json` for the images and
    `video_preprocessor_config.json`, else `preprocessor_config.json`, for the videos. A directory holding both
    forms (a repository saved again by transformers 5) is read from the sections, however the older files differ."""
    processor = read_json_object(checkpoint_dir / "processor_config.json") or {}
    image = read_json_object(checkpoint_dir / "preprocessor_config.json")
    video = read_json_object(checkpoint_dir / "video_preprocessor_config.json")
    if video is None:
        video = image
    sections = {key: processor[key] for key in ("image_processor", "video_processor") if processor.get(key) is not None}
    if image is None and "image_processor" not in sections:
        # transformers refuses to build the processor without one; the released settings are a guess for another model
        logger.warning("%s has no image processor config (preprocessor_config.json, or processor_config.json's "
                       "image_processor): media are preprocessed with the released processor's settings "
                       "(max_image_tokens=%d); add the file the checkpoint was published with", checkpoint_dir,
                       MediaSettings.max_image_tokens)
    if not sections:
        return image, video
    return {"image_processor": image, "video_processor": video, **sections}, None
