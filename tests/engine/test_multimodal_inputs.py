"""glimmer/engine/multimodal_inputs.py: where each image's and video's whole expansion lies in a tokenized prompt."""

from __future__ import annotations

import numpy as np
import pytest

from glimmer.engine.multimodal_inputs import MediaTokenIds, attach_media, expansion_span, placeholder_runs
from glimmer.multimodal import DecodedVideo, MediaProcessor, MediaSettings

START, END, PLACEHOLDER, TEXT = 1, 2, 9, 7


@pytest.mark.parametrize(("token_ids", "run", "span"), [
    # a second item without its start marker: the first item's <|image_start|> far before it is not its own
    ([0, START, 9, 9, END, TEXT, TEXT, TEXT, 9, 9, END, TEXT], (8, 2), (8, 11)),
    # an item without its end marker: an <|image_end|> after text past it is not its own
    ([0, START, 9, 9, TEXT, TEXT, END], (2, 2), (1, 4)),
])
def test_an_expansion_span_looks_only_at_the_positions_beside_its_runs(token_ids, run, span):
    assert expansion_span(token_ids, (run,), (START, END)) == span


def test_a_videos_span_runs_from_its_start_marker_before_the_first_timestamp_to_its_end_marker(vision_tokenizer):
    """attach_media records each item's span where the processor wrote it: an image's markers around its patches, a
    video's <|vid_start|> before its first group's timestamp tokens and its <|vid_end|> after the last group."""
    tokenizer = vision_tokenizer
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
    video = DecodedVideo(rng.integers(0, 256, (8, 90, 120, 3), dtype=np.uint8), fps=4.0)
    processed = MediaProcessor(MediaSettings(max_image_tokens=64, max_video_frame_tokens=16)).process(
        "Look <|patch|> then <|video|> now", [image], [video])
    token_ids = tokenizer.encode(processed.text, add_special_tokens=False).ids
    media_ids = MediaTokenIds.resolve(tokenizer.token_to_id("<|patch|>"), tokenizer.token_to_id("<|video|>"),
                                      tokenizer.token_to_id)
    image_item, video_item = attach_media(token_ids, processed, media_ids)
    spans = [(token_ids.index(media_ids.image_start), token_ids.index(media_ids.image_end) + 1),
             (token_ids.index(media_ids.video_start), token_ids.index(media_ids.video_end) + 1)]
    assert [image_item.span, video_item.span] == spans
    assert video_item.span[0] < video_item.runs[0][0] - 1  # the timestamp's tokens between
    assert tokenizer.decode(token_ids[video_item.span[0]:video_item.span[1]], skip_special_tokens=False).replace(
        " ", "") == processed.video_expansions[0].replace(" ", "")
    assert len(placeholder_runs(token_ids, media_ids.video)) == len(video_item.runs) == 2


def test_an_item_of_another_kind_than_image_or_video_is_refused_naming_it():
    """MediaTokenIds.markers gave a video's markers to any kind but "image", and a MultimodalItem took any kind: a
    misspelt kind read a video's markers. Both now refuse it, naming the kinds there are."""
    import torch

    from glimmer.engine.sequence import MultimodalItem

    ids = MediaTokenIds(PLACEHOLDER, PLACEHOLDER + 1, START, END, START + 10, END + 10)
    assert ids.markers("image") == (START, END) and ids.markers("video") == (START + 10, END + 10)
    with pytest.raises(ValueError, match=r"kind='images': a media item is an 'image' or a 'video'"):
        ids.markers("images")
    with pytest.raises(ValueError, match=r"kind='audio': a media item is an 'image' or a 'video'"):
        MultimodalItem(((0, 1),), b"", torch.zeros(1, 1), torch.tensor([[1, 1, 1]]), "audio", (0, 1))
