"""Images and videos → vision-tower inputs and expanded prompts (architecture.md §6–8).

Pillow, PyAV and torch only; no torchvision and no transformers. The names below are resolved lazily, so that
importing a submodule that needs no torch (`settings`, which the CLI reads, or `errors`) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

_LAZY = {
    "MediaDecodeError": "errors", "MediaError": "errors", "MediaLimitError": "errors",
    "PlaceholderMismatchError": "errors",
    "ImageInput": "image", "ProcessedImage": "image", "image_grid": "image", "process_image": "image",
    "expand_placeholders": "placeholders", "image_expansion": "placeholders", "video_expansion": "placeholders",
    "MediaProcessor": "processor", "MultimodalPrompt": "processor",
    "smart_resize": "resize",
    "MediaLimits": "settings", "MediaSettings": "settings", "checkpoint_media_settings": "settings",
    "load_media_settings": "settings",
    "DecodedVideo": "video", "ProcessedVideo": "video", "VideoInput": "video", "process_video": "video",
    "sample_frame_indices": "video",
}

if TYPE_CHECKING:
    from glimmer.multimodal.errors import MediaDecodeError, MediaError, MediaLimitError, PlaceholderMismatchError
    from glimmer.multimodal.image import ImageInput, ProcessedImage, image_grid, process_image
    from glimmer.multimodal.placeholders import expand_placeholders, image_expansion, video_expansion
    from glimmer.multimodal.processor import MediaProcessor, MultimodalPrompt
    from glimmer.multimodal.resize import smart_resize
    from glimmer.multimodal.settings import MediaLimits, MediaSettings, checkpoint_media_settings, load_media_settings
    from glimmer.multimodal.video import DecodedVideo, ProcessedVideo, VideoInput, process_video, sample_frame_indices

__all__ = [
    "DecodedVideo",
    "ImageInput",
    "MediaDecodeError",
    "MediaError",
    "MediaLimitError",
    "MediaLimits",
    "MediaProcessor",
    "MediaSettings",
    "MultimodalPrompt",
    "PlaceholderMismatchError",
    "ProcessedImage",
    "ProcessedVideo",
    "VideoInput",
    "checkpoint_media_settings",
    "expand_placeholders",
    "image_expansion",
    "image_grid",
    "load_media_settings",
    "process_image",
    "process_video",
    "sample_frame_indices",
    "smart_resize",
    "video_expansion",
]


def __dir__() -> list[str]:
    """The lazy names too, as `dir(glimmer)` lists its own (glimmer/__init__.py)."""
    return sorted(set(globals()) | set(_LAZY))


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"glimmer.multimodal.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'glimmer.multimodal' has no attribute {name!r}")
