"""Tie processed images and videos to the placeholder runs of a tokenized prompt.

The processor expands each `<|patch|>` into `<|image_start|>` + N `<|patch|>` + `<|image_end|>` and each
`<|video|>` into timestamped groups of `<|video|>` tokens (architecture.md §8). After tokenization, the
i-th run of image placeholder ids belongs to the i-th image, and each video owns as many consecutive
runs of video placeholder ids as it has temporal groups. Anything else is a malformed request.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import torch

from glimmer.engine.cache_keys import digest
from glimmer.engine.sequence import MediaKind, MultimodalItem, check_media_kind
from glimmer.errors import RequestError
from glimmer.multimodal import MultimodalPrompt
from glimmer.multimodal.placeholders import IMAGE_END, IMAGE_START, VIDEO_END, VIDEO_PLACEHOLDER, VIDEO_START


@dataclass(frozen=True)
class MediaTokenIds:
    """The ids of the tokens an image's and a video's expansions are made of (architecture.md §8): the placeholders
    (the config's), and the start and end markers (the tokenizer's; None where it has no such token). Resolved once,
    where the engine loads the tokenizer."""

    image: int | None
    video: int | None
    image_start: int | None
    image_end: int | None
    video_start: int | None
    video_end: int | None

    @classmethod
    def resolve(cls, image_token_id: int | None, video_token_id: int | None,
                token_to_id: Callable[[str], int | None]) -> MediaTokenIds:
        return cls(image_token_id, video_token_id, token_to_id(IMAGE_START), token_to_id(IMAGE_END),
                   token_to_id(VIDEO_START), token_to_id(VIDEO_END))

    def markers(self, kind: MediaKind) -> tuple[int | None, int | None]:
        """(start, end) marker ids of an item of `kind`; ValueError for another kind."""
        check_media_kind(kind)
        return (self.image_start, self.image_end) if kind == "image" else (self.video_start, self.video_end)


def placeholder_runs(token_ids: list[int], token_id: int) -> list[tuple[int, int]]:
    """(offset, length) of every maximal run of `token_id`."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate(token_ids):
        if t == token_id and start is None:
            start = i
        elif t != token_id and start is not None:
            runs.append((start, i - start))
            start = None
    if start is not None:
        runs.append((start, len(token_ids) - start))
    return runs


def content_hash(pixel_values: torch.Tensor, grid_thw: list[int] | tuple[int, ...]) -> bytes:
    """The key of the exact vision-tower input (same pixels and grid → same features): grid, pixel shape and
    float32 little-endian pixels, hashed like prefix-cache blocks (cache_keys)."""
    shape = (*(int(g) for g in grid_thw), *pixel_values.shape)
    pixels = pixel_values.detach().to(torch.float32).contiguous().cpu().numpy().astype("<f4", copy=False)
    return digest(struct.pack(f"<I{len(shape)}q", len(shape), *shape), pixels.tobytes())


def attach_media(token_ids: list[int], prompt: MultimodalPrompt, media_ids: MediaTokenIds) -> list[MultimodalItem]:
    """One MultimodalItem per image and video, placed on its placeholder runs; RequestError if they don't fit."""
    items: list[MultimodalItem] = []
    image_runs = placeholder_runs(token_ids, media_ids.image)
    if len(image_runs) != len(prompt.images):
        raise RequestError(
            f"the tokenized prompt has {len(image_runs)} image placeholder runs for {len(prompt.images)} images; "
            "image placeholders must not be written as text next to each other",
            param="messages",
        )
    for index, (image, run) in enumerate(zip(prompt.images, image_runs, strict=True)):
        if run[1] != image.num_tokens:
            raise RequestError(f"image {index}: its placeholder run has {run[1]} tokens, expected "
                               f"{image.num_tokens}", param="messages")
        span = expansion_span(token_ids, (run,), media_ids.markers("image"))
        items.append(MultimodalItem((run,), content_hash(image.pixel_values, image.grid_thw), image.pixel_values,
                                    torch.tensor([image.grid_thw]), "image", span))
    video_runs = iter(placeholder_runs(token_ids, media_ids.video))
    for index, video in enumerate(prompt.videos):
        groups = video.grid_thw[0]
        runs = tuple(next(video_runs, (0, -1)) for _ in range(groups))
        if any(length != video.tokens_per_group for _, length in runs):
            raise RequestError(f"video {index}: its placeholder runs do not match its {groups} frame groups of "
                               f"{video.tokens_per_group} tokens", param="messages")
        expansion = prompt.video_expansions[index]
        # the first group's timestamp, ASCII text ("Time: 0.0s"), is at most one token a character
        first_timestamp_chars = expansion.index(VIDEO_PLACEHOLDER) - len(VIDEO_START)
        span = expansion_span(token_ids, runs, media_ids.markers("video"), first_timestamp_chars)
        items.append(MultimodalItem(runs, content_hash(video.pixel_values, video.grid_thw), video.pixel_values,
                                    torch.tensor([video.grid_thw]), "video", span))
    if next(video_runs, None) is not None:
        raise RequestError("the prompt has more video placeholder tokens than the videos given", param="messages")
    return items


def expansion_span(token_ids: list[int], runs: tuple[tuple[int, int], ...], markers: tuple[int | None, int | None],
                   lead_tokens: int = 0) -> tuple[int, int]:
    """[start, end) of the expansion whose placeholder runs are `runs` in `token_ids`: from its start marker
    (`<|image_start|>` right before the first run; `<|vid_start|>` at most `lead_tokens` before it, the first
    group's timestamp between) through its end marker right after the last run (`<|image_end|>`, `<|vid_end|>`);
    the runs' own bounds on a side whose marker is not there. Only the expansion's own positions are looked at."""
    start_id, end_id = markers
    first, last = runs[0][0], runs[-1][0] + runs[-1][1]
    start = next((i for i in range(first - 1, max(first - 2 - lead_tokens, -1), -1) if token_ids[i] == start_id),
                 first)
    end = last + 1 if last < len(token_ids) and token_ids[last] == end_id else last
    return start, end


def refuse_stray_placeholders(token_ids: list[int], media_ids: MediaTokenIds) -> None:
    """A prompt without media must not contain placeholder ids: they would be embedded as token 0."""
    for name, token_id in (("image", media_ids.image), ("video", media_ids.video)):
        if token_id is not None and token_id in token_ids:
            raise RequestError(
                f"the prompt contains {name} placeholder tokens (id {token_id}) but no {name} was given; pass the "
                f"{name} with the prompt (multi_modal_data / content parts) or remove the placeholder",
                param="prompt",
            )
