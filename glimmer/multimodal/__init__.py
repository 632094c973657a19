"""Images and videos → vision-tower inputs and expanded prompts (architecture.md §6–8).

Pillow, PyAV and torch only; no torchvision and no transformers.
"""

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
