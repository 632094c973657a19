"""One request's media → expanded prompt plus vision-tower inputs (the reference's MuseGlimmerProcessor).

`MediaProcessor.process` takes the rendered prompt (one `<|patch|>` per image, one `<|video|>` per video,
in order) and the items, and returns `MultimodalPrompt`: the prompt with placeholders expanded, ready to
tokenise with add_special_tokens=False, and the packed `pixel_values` / `grid_thw` tensors that
`glimmer.model.vision.project_vision_features` consumes (images and videos separately, as the reference
keeps them; the model scatters image rows into `<|patch|>` positions and video rows into `<|video|>`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from glimmer.cancellation import CancelToken
from glimmer.multimodal.errors import MediaContextLengthError, MediaDecodeError, MediaLimitError
from glimmer.multimodal.image import (
    ImageInput,
    ProcessedImage,
    image_grid,
    image_token_count,
    image_tokens_from_header,
    is_image_data,
    process_image,
)
from glimmer.multimodal.placeholders import (
    IMAGE_PLACEHOLDER,
    VIDEO_PLACEHOLDER,
    check_placeholder_counts,
    expand_placeholders,
    image_expansion,
    video_expansion,
)
from glimmer.multimodal.resize import smart_resize
from glimmer.multimodal.settings import MediaLimits, MediaSettings
from glimmer.multimodal.video import ProcessedVideo, VideoInput, is_video_data, process_video


def _pack(items: Sequence[ProcessedImage | ProcessedVideo], patch_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not items:
        return torch.zeros((0, patch_dim)), torch.zeros((0, 3), dtype=torch.long)
    return torch.cat([item.pixel_values for item in items]), torch.tensor([item.grid_thw for item in items])


@dataclass(frozen=True)
class MultimodalPrompt:
    text: str  # the prompt with every placeholder expanded
    images: tuple[ProcessedImage, ...]
    videos: tuple[ProcessedVideo, ...]
    image_pixel_values: torch.Tensor  # (Σ image patches, patch_dim) float32
    image_grid_thw: torch.Tensor  # (num_images, 3) long
    video_pixel_values: torch.Tensor  # (Σ video patches, patch_dim) float32
    video_grid_thw: torch.Tensor  # (num_videos, 3) long
    image_expansions: tuple[str, ...] = ()  # what each image's placeholder became in `text`, in order
    video_expansions: tuple[str, ...] = ()

    @property
    def num_media_tokens(self) -> int:
        return sum(item.num_tokens for item in self.images) + sum(item.num_tokens for item in self.videos)


_PLACEHOLDER_RUNS = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})\\1+")


def _placeholders(text: str) -> int:
    return text.count(IMAGE_PLACEHOLDER) + text.count(VIDEO_PLACEHOLDER)


class MediaProcessor:
    """`max_model_len`, where given, bounds a request's media as `limits.max_media_tokens` bounds their placeholder
    tokens (the lower decides), refused as a context-length error: tokens past the context can never be served. The
    context holds each item's whole expansion (markers, a video's timestamps and separators too), which
    `count_tokens` (the tokenizer's count of a text, given with `max_model_len`) measures, so this refusal's count
    is the one the prompt's own refusal would give the items."""

    def __init__(self, settings: MediaSettings | None = None, limits: MediaLimits | None = None,
                 max_model_len: int | None = None, count_tokens: Callable[[str], int] | None = None):
        if max_model_len is not None and count_tokens is None:
            raise ValueError("MediaProcessor: max_model_len bounds each item's whole expansion, which count_tokens "
                             "(the tokenizer's count of a text) measures; give count_tokens with it")
        self.settings = settings or MediaSettings()
        self.limits = limits or MediaLimits()
        self.max_model_len = max_model_len
        self.count_tokens = count_tokens

    @property
    def patch_dim(self) -> int:
        return self.settings.temporal_patch_size * 3 * self.settings.patch_size**2

    def image_tokens(self, height: int, width: int) -> int:
        """`<|patch|>` tokens for an image of this size, without processing it."""
        return image_token_count(height, width, self.settings)

    def largest_grids(self) -> list[tuple[int, int, int]]:
        """The patch grids (t, h, w) of the largest image and the largest video one item can have (what the engine
        sizes the vision encoder's memory and its cache of features by): an image, and each of video_max_frames
        frames, at the larger of a square's grid and the most elongated one the limits allow. The token cap alone
        does not bound them: where it leaves less than one row of merged patches, smart_resize keeps one row (as the
        reference does), so a 200:1 video frame gets 170 merged tokens under the cap of 144."""
        s, limits = self.settings, self.limits
        side = limits.max_image_side
        shapes = ((side, side), (-(-side // limits.max_image_aspect_ratio), side))

        def frame_grid(height: int, width: int) -> tuple[int, int]:
            frame_height, frame_width = smart_resize(height, width, s.resize_factor, s.max_video_frame_tokens)
            return frame_height // s.patch_size, frame_width // s.patch_size

        groups = -(-s.video_max_frames // s.temporal_patch_size)
        video = max(((groups, *frame_grid(*shape)) for shape in shapes), key=math.prod)
        return [max((image_grid(*shape, s) for shape in shapes), key=math.prod), video]

    def largest_item_tokens(self) -> int:
        """Placeholder tokens (vision feature rows) of the larger of `largest_grids`."""
        return max(t * h * w for t, h, w in self.largest_grids()) // self.settings.merge_size**2

    def _expansion_tokens(self, expansion: str) -> int:
        """Tokens of an item's whole expansion, what the context must hold of it; 0 without a context bound (then
        nothing counts them). Each run of placeholders is tokenized as one, the rest of the run added (a placeholder
        is one token): the prompt's tokenization writes them all, counting need not (a 4096-patch image: ms)."""
        if self.count_tokens is None:
            return 0
        collapsed = _PLACEHOLDER_RUNS.sub(r"\1", expansion)
        return self.count_tokens(collapsed) + _placeholders(expansion) - _placeholders(collapsed)

    def _later_tokens(self, images: Sequence[ImageInput], videos: Sequence[VideoInput]) -> _Tokens:
        """The tokens of items not yet processed and whether all were counted: images from their headers; videos,
        which need decoding to count, are not."""
        counts = [image_tokens_from_header(image, self.settings, self.limits) for image in images]
        known = [n for n in counts if n is not None]
        return _Tokens(sum(known), sum(self._expansion_tokens(image_expansion(n)) for n in known),
                       None not in counts and not videos)

    def process(
        self, prompt: str, images: Sequence[ImageInput] = (), videos: Sequence[VideoInput] = (), *,
        cancel: CancelToken | None = None,
    ) -> MultimodalPrompt:
        """Process every item and expand the prompt.

        Raises MediaDecodeError / MediaLimitError naming the item, PlaceholderMismatchError when the
        placeholders do not match the items, and MediaLimitError as soon as the items so far exceed
        `limits.max_media_tokens` together (its total counts the later images from their headers). All are
        RequestErrors. With `cancel`, stops between items and between video frames with Cancelled once it is
        cancelled.
        """
        check_placeholder_counts(prompt, len(images), len(videos))  # before the expensive decoding
        budget = _TokenBudget(self.limits.max_media_tokens, self.max_model_len)
        processed_images, image_expansions = [], []
        for index, image in enumerate(images):
            if cancel is not None:
                cancel.check()
            processed = _process_image(image, self.settings, self.limits, index)
            image_expansions.append(image_expansion(processed.num_tokens))
            budget.spend(_Tokens(processed.num_tokens, self._expansion_tokens(image_expansions[-1])),
                         partial(self._later_tokens, images[index + 1:], videos))
            processed_images.append(processed)
        processed_videos, video_expansions = [], []
        for index, video in enumerate(videos):
            processed = process_video(video, self.settings, self.limits, index, cancel)
            video_expansions.append(video_expansion(processed.group_timestamps_s, processed.tokens_per_group,
                                                    self.settings.frame_timestamp_format))
            budget.spend(_Tokens(processed.num_tokens, self._expansion_tokens(video_expansions[-1])),
                         partial(self._later_tokens, (), videos[index + 1:]))
            processed_videos.append(processed)
        text = expand_placeholders(prompt, image_expansions, video_expansions)
        image_pixels, image_grids = _pack(processed_images, self.patch_dim)
        video_pixels, video_grids = _pack(processed_videos, self.patch_dim)
        return MultimodalPrompt(
            text=text,
            images=tuple(processed_images),
            videos=tuple(processed_videos),
            image_pixel_values=image_pixels,
            image_grid_thw=image_grids,
            video_pixel_values=video_pixels,
            video_grid_thw=video_grids,
            image_expansions=tuple(image_expansions),
            video_expansions=tuple(video_expansions),
        )


def _process_image(image: ImageInput, settings: MediaSettings, limits: MediaLimits, index: int) -> ProcessedImage:
    """`process_image`, whose decoding error for a video sent where an image goes says so, as a video's says it of an
    image (probed only once the image failed, and only data Pillow does not take for an image)."""
    try:
        return process_image(image, settings, limits, index)
    except MediaDecodeError:
        encoded = bytes(image) if isinstance(image, bytes | bytearray | memoryview) else None
        if encoded is None or is_image_data(encoded) or not is_video_data(encoded):  # a broken GIF is both
            raise
    raise MediaDecodeError("image", index, "the data is a video, not an image; send it as a video (a video_url part, "
                                           "or multi_modal_data's \"video\"), or one of its frames as an image")


@dataclass(frozen=True)
class _Tokens:
    placeholders: int  # vision feature rows, what `limits.max_media_tokens` bounds
    expansions: int  # whole expansions, markers, timestamps and separators included: what the context holds of them
    all_counted: bool = True


class _TokenBudget:
    """The media tokens of one request so far, refused as soon as they pass the limit or the context (None: no
    bound), so a request of many items stops at the first one too many instead of decoding them all."""

    def __init__(self, limit: int | None, context: int | None = None):
        self.limit = limit
        self.context = context
        self.spent = _Tokens(0, 0)

    def spend(self, item: _Tokens, later_tokens: Callable[[], _Tokens]) -> None:
        """`later_tokens()`: the tokens of the items not yet processed, so the error gives the total."""
        self.spent = _Tokens(self.spent.placeholders + item.placeholders, self.spent.expansions + item.expansions)
        past_limit = self.limit is not None and self.spent.placeholders > self.limit
        past_context = self.context is not None and self.spent.expansions > self.context
        if not past_limit and not past_context:
            return
        later = later_tokens()
        at_least = "" if later.all_counted else "at least "
        if past_context and (not past_limit or self.context <= self.limit):
            raise MediaContextLengthError(self.context, f"{at_least}{self.spent.expansions + later.expansions:,}")
        raise MediaLimitError(
            "request",
            None,
            f"the images and videos need {at_least}{self.spent.placeholders + later.placeholders:,} tokens together, "
            f"more than the limit of {self.limit:,}; send fewer or smaller items, or lower max_image_tokens / "
            "max_video_frame_tokens",
        )
