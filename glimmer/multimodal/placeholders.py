"""Expansion of media placeholders in a rendered prompt — architecture.md §8.

The chat template renders one `<|patch|>` per image and one `<|video|>` per video. Before tokenising,
the i-th placeholder of each kind is replaced by the i-th item's expansion:

* image: `<|image_start|>` + `<|patch|>` × tokens + `<|image_end|>`
* video: `<|vid_start|>`, then per frame group `Time: {ts:.1f}s` + `<|video|>` × tokens_per_group, each
  group followed by `<|vid_frame_separator|>` except the last, which is followed by `<|vid_end|>`.

The token strings are fixed by the protocol; their ids come from the tokenizer and are never written here.
"""

from __future__ import annotations

from collections.abc import Sequence

from glimmer.multimodal.errors import PlaceholderMismatchError

IMAGE_PLACEHOLDER = "<|patch|>"
IMAGE_START = "<|image_start|>"
IMAGE_END = "<|image_end|>"
VIDEO_PLACEHOLDER = "<|video|>"
VIDEO_START = "<|vid_start|>"
VIDEO_END = "<|vid_end|>"
VIDEO_FRAME_SEPARATOR = "<|vid_frame_separator|>"


def image_expansion(num_tokens: int) -> str:
    return IMAGE_START + IMAGE_PLACEHOLDER * num_tokens + IMAGE_END


def video_expansion(group_timestamps_s: Sequence[float], tokens_per_group: int, timestamp_format: str) -> str:
    parts = [VIDEO_START]
    for group, timestamp in enumerate(group_timestamps_s):
        parts.append(timestamp_format.format(timestamp=timestamp) + VIDEO_PLACEHOLDER * tokens_per_group)
        parts.append(VIDEO_FRAME_SEPARATOR if group < len(group_timestamps_s) - 1 else VIDEO_END)
    return "".join(parts)


def _check_count(prompt: str, placeholder: str, items: int, kind: str) -> None:
    found = prompt.count(placeholder)
    if found != items:
        raise PlaceholderMismatchError(
            f"the prompt has {found} {placeholder} placeholder(s) but {items} {kind}(s) were given; "
            f"each {kind} needs exactly one placeholder, in the order the {kind}s were given",
            param="messages",
        )


def check_placeholder_counts(prompt: str, num_images: int, num_videos: int) -> None:
    """Raises PlaceholderMismatchError unless the prompt has one placeholder per image and per video."""
    _check_count(prompt, VIDEO_PLACEHOLDER, num_videos, "video")
    _check_count(prompt, IMAGE_PLACEHOLDER, num_images, "image")


def _replace_each(prompt: str, placeholder: str, expansions: Sequence[str], kind: str) -> str:
    _check_count(prompt, placeholder, len(expansions), kind)
    pieces = prompt.split(placeholder)
    out = [pieces[0]]
    for expansion, piece in zip(expansions, pieces[1:], strict=True):
        out += [expansion, piece]
    return "".join(out)


def expand_placeholders(prompt: str, image_expansions: Sequence[str], video_expansions: Sequence[str]) -> str:
    """Replace the i-th `<|patch|>` / `<|video|>` with the i-th expansion.

    Raises PlaceholderMismatchError (a RequestError) when a placeholder count differs from the item count.
    """
    # neither expansion contains the other kind's placeholder, so the two passes do not interfere
    prompt = _replace_each(prompt, VIDEO_PLACEHOLDER, video_expansions, "video")
    return _replace_each(prompt, IMAGE_PLACEHOLDER, image_expansions, "image")
