"""Placeholder expansion and the whole-request processor — architecture.md §8."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from glimmer.errors import ContextLengthError, RequestError
from glimmer.multimodal import (
    DecodedVideo,
    MediaLimitError,
    MediaLimits,
    MediaProcessor,
    MediaSettings,
    PlaceholderMismatchError,
    expand_placeholders,
    image_expansion,
    video_expansion,
)
from glimmer.multimodal.errors import MediaContextLengthError

TIME_FORMAT = "Time: {timestamp:.1f}s"


def test_spec_video_example() -> None:
    expected = (
        "<|vid_start|>Time: 0.0s"
        + "<|video|>" * 12
        + "<|vid_frame_separator|>Time: 1.0s"
        + "<|video|>" * 12
        + "<|vid_end|>"
    )
    assert video_expansion((0.0, 1.0), 12, TIME_FORMAT) == expected


@settings(max_examples=50, deadline=None)
@given(grid_h=st.integers(1, 20).map(lambda n: 2 * n), grid_w=st.integers(1, 20).map(lambda n: 2 * n))
def test_image_expansion_matches_the_reference(grid_h, grid_w, reference_processor) -> None:
    assert image_expansion(grid_h * grid_w // 4) == reference_processor.image([1, grid_h, grid_w])


@settings(max_examples=50, deadline=None)
@given(
    total=st.integers(1, 2000),
    video_fps=st.sampled_from([4.0, 20.0, 24.0, 29.97, 30.0, 60.0, 120.0]),
    grid_h=st.integers(1, 6).map(lambda n: 2 * n),
    grid_w=st.integers(1, 6).map(lambda n: 2 * n),
)
def test_video_expansion_matches_the_reference(total, video_fps, grid_h, grid_w, reference_processor) -> None:
    from glimmer.multimodal import sample_frame_indices
    from glimmer.multimodal.video import frame_timestamps_s, group_timestamps

    indices = sample_frame_indices(total, video_fps, MediaSettings())
    grid_t = -(-len(indices) // 2)
    ours = video_expansion(
        group_timestamps(frame_timestamps_s(indices, video_fps), grid_t, 2), grid_h * grid_w // 4, TIME_FORMAT
    )
    assert ours == reference_processor.video([grid_t, grid_h, grid_w], indices, video_fps)


def test_each_placeholder_gets_its_own_item_in_order() -> None:
    prompt = "a<|patch|>b<|video|>c<|patch|>d"
    text = expand_placeholders(
        prompt, [image_expansion(1), image_expansion(2)], [video_expansion((0.0,), 1, TIME_FORMAT)]
    )
    assert text == (
        "a<|image_start|><|patch|><|image_end|>"
        "b<|vid_start|>Time: 0.0s<|video|><|vid_end|>"
        "c<|image_start|><|patch|><|patch|><|image_end|>d"
    )


@pytest.mark.parametrize(
    ("prompt", "images", "videos", "message"),
    [
        ("no placeholders", 1, 0, "0 <|patch|> placeholder(s) but 1 image(s)"),
        ("<|patch|><|patch|>", 1, 0, "2 <|patch|> placeholder(s) but 1 image(s)"),
        ("<|video|>", 0, 0, "1 <|video|> placeholder(s) but 0 video(s)"),
        ("<|patch|>", 1, 1, "0 <|video|> placeholder(s) but 1 video(s)"),
    ],
)
def test_count_mismatch_raises(prompt, images, videos, message) -> None:
    with pytest.raises(PlaceholderMismatchError) as raised:
        expand_placeholders(prompt, [image_expansion(1)] * images, [video_expansion((0.0,), 1, TIME_FORMAT)] * videos)
    assert message in str(raised.value)
    assert isinstance(raised.value, RequestError)


def test_processor_packs_items_and_expands_the_prompt() -> None:
    rng = np.random.default_rng(0)
    small = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
    large = rng.integers(0, 256, (150, 230, 3), dtype=np.uint8)
    video = DecodedVideo(rng.integers(0, 256, (8, 90, 120, 3), dtype=np.uint8), fps=4.0)
    processor = MediaProcessor(MediaSettings(max_image_tokens=64, max_video_frame_tokens=16))
    result = processor.process("<|start|>user<|message|><|patch|> and <|video|> and <|patch|>", [small, large], [video])
    assert result.image_grid_thw.tolist() == [[1, 4, 6], [1, 12, 18]]
    assert result.image_pixel_values.shape == (4 * 6 + 12 * 18, 1176)
    assert result.video_grid_thw.tolist() == [[2, 6, 8]]
    assert result.video_pixel_values.shape == (2 * 6 * 8, 1176)
    assert result.text.count("<|patch|>") == 6 + 54
    assert result.text.count("<|video|>") == 24
    assert result.num_media_tokens == 6 + 54 + 24
    first, second = result.text.split(" and ")[0], result.text.split(" and ")[2]
    assert first.endswith("<|image_start|>" + "<|patch|>" * 6 + "<|image_end|>")
    assert second == "<|image_start|>" + "<|patch|>" * 54 + "<|image_end|>"
    assert processor.image_tokens(150, 230) == 54


def test_processor_text_only_request_has_empty_tensors() -> None:
    result = MediaProcessor().process("just text")
    assert result.text == "just text"
    assert result.image_pixel_values.shape == (0, 1176) and result.image_grid_thw.shape == (0, 3)
    assert result.video_grid_thw.dtype == torch.long


def test_processor_checks_placeholders_before_decoding() -> None:
    with pytest.raises(PlaceholderMismatchError):
        MediaProcessor().process("no placeholder", [b"not even an image"])


def test_processor_enforces_the_request_token_limit() -> None:
    image = np.zeros((150, 230, 3), dtype=np.uint8)
    processor = MediaProcessor(MediaSettings(max_image_tokens=64), MediaLimits(max_media_tokens=100))
    assert processor.process("<|patch|>", [image]).num_media_tokens == 54
    with pytest.raises(
        MediaLimitError, match="request: the images and videos need 108 tokens together, more than the limit of 100"
    ):
        processor.process("<|patch|><|patch|>", [image, image])


@pytest.fixture(scope="module")
def count_tokens(vision_tokenizer):
    """A tiny vision checkpoint's tokenizer's count of a text, what the engine gives the processor."""
    return lambda text: len(vision_tokenizer.encode(text, add_special_tokens=False).ids)


def test_media_past_the_context_are_a_context_length_refusal_the_lower_bound_deciding(count_tokens) -> None:
    """Media tokens past max_model_len were refused as "more than the limit of N" with code null, telling the user
    to lower max_image_tokens (a checkpoint setting); it is the context-length refusal clients recognise. Each image
    counts whole, its 54 <|patch|> tokens and its <|image_start|> and <|image_end|>: 3 x 56 = 168."""
    image = np.zeros((150, 230, 3), dtype=np.uint8)  # 54 tokens
    processor = MediaProcessor(MediaSettings(max_image_tokens=64), MediaLimits(max_media_tokens=200), max_model_len=100,
                               count_tokens=count_tokens)
    with pytest.raises(MediaContextLengthError) as refused:
        processor.process("<|patch|>" * 3, [image, image, image])
    assert str(refused.value) == ("This model's maximum context length is 100 tokens (max_model_len), but the images "
                                  "and videos need 168 tokens together; send fewer or smaller images or videos")
    assert (refused.value.code, refused.value.param) == ("context_length_exceeded", "messages")
    assert isinstance(refused.value, MediaLimitError) and isinstance(refused.value, ContextLengthError)
    assert (refused.value.prompt_tokens, refused.value.parts) == (None, [])
    below_context = MediaProcessor(MediaSettings(max_image_tokens=64), MediaLimits(max_media_tokens=100),
                                   max_model_len=200, count_tokens=count_tokens)
    with pytest.raises(MediaLimitError, match="more than the limit of 100") as limited:
        below_context.process("<|patch|>" * 2, [image, image])
    assert not isinstance(limited.value, MediaContextLengthError) and limited.value.code is None


def test_media_whose_placeholders_fit_the_context_but_not_their_expansions_are_refused(count_tokens) -> None:
    """The early check counted placeholder tokens alone: an image and a video whose 54 + 24 placeholders fit a
    context their expansions (markers, the video's timestamps and separators) did not were decoded whole, then
    refused by the prompt's count. The early refusal counts each item as the prompt holds it."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (150, 230, 3), dtype=np.uint8)
    video = DecodedVideo(rng.integers(0, 256, (8, 90, 120, 3), dtype=np.uint8), fps=4.0)
    settings = MediaSettings(max_image_tokens=64, max_video_frame_tokens=16)
    expanded = MediaProcessor(settings).process("<|patch|><|video|>", [image], [video])
    whole = count_tokens(expanded.text)
    assert expanded.num_media_tokens == 54 + 24 < whole
    processor = MediaProcessor(settings, max_model_len=whole - 1, count_tokens=count_tokens)
    with pytest.raises(MediaContextLengthError, match=f"the images and videos need {whole} tokens together"):
        processor.process("<|patch|><|video|>", [image], [video])
    assert MediaProcessor(settings, max_model_len=whole, count_tokens=count_tokens).process(
        "<|patch|><|video|>", [image], [video]).text == expanded.text


def test_an_items_expansion_is_counted_without_tokenizing_each_placeholder(count_tokens) -> None:
    """Counting an item tokenized its whole expansion (a 4096-patch image: milliseconds), which the prompt's
    tokenization does again: each run of placeholders is tokenized as one placeholder, the rest of the run added (a
    placeholder is one token), so the counts are the tokenizer's of the whole expansion."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (150, 230, 3), dtype=np.uint8)
    video = DecodedVideo(rng.integers(0, 256, (8, 90, 120, 3), dtype=np.uint8), fps=4.0)
    settings = MediaSettings(max_image_tokens=64, max_video_frame_tokens=16)
    counted: list[str] = []
    processor = MediaProcessor(settings, max_model_len=1000,
                               count_tokens=lambda text: counted.append(text) or count_tokens(text))
    expanded = processor.process("<|patch|><|video|>", [image], [video])
    assert counted and not any("<|patch|><|patch|>" in text or "<|video|><|video|>" in text for text in counted)
    whole = count_tokens(expanded.text)
    with pytest.raises(MediaContextLengthError, match=f"the images and videos need {whole} tokens together"):
        MediaProcessor(settings, max_model_len=whole - 1, count_tokens=lambda text: counted.append(text) or
                       count_tokens(text)).process("<|patch|><|video|>", [image], [video])


def test_a_context_bound_without_the_tokenizers_count_is_refused() -> None:
    with pytest.raises(ValueError, match="give count_tokens with it"):
        MediaProcessor(max_model_len=100)


def test_the_request_token_limit_error_gives_the_total_of_all_items() -> None:
    """QA: 5 images of 54 tokens over a limit of 100 said "need 108 tokens together" (the sum so far)."""
    image = np.zeros((150, 230, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(np.zeros((230, 150, 3), dtype=np.uint8)).save(png, format="PNG")
    processor = MediaProcessor(MediaSettings(max_image_tokens=64), MediaLimits(max_media_tokens=100))
    with pytest.raises(MediaLimitError, match="need 270 tokens together, more than the limit of 100"):
        processor.process("<|patch|>" * 5, [image, image, png.getvalue(), image, image])
    with pytest.raises(MediaLimitError, match="need at least 162 tokens together"):  # an unreadable one is not counted
        processor.process("<|patch|>" * 4, [image, image, b"not an image", image])
