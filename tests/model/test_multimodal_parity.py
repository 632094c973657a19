"""Image and video prompts end to end against the reference (transformers 5.23), float32.

Our processor prepares the prompt (its parity with the reference processor is tested in
tests/multimodal); both models then get the same token ids and pixels. Every weight is random, norms
included; the tiny tower's 4×4-patch windows make the grids below ragged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle import reference_model
from PIL import Image

from glimmer import LLM, SamplingParams
from glimmer.model.context import ForwardContext
from glimmer.multimodal import DecodedVideo

NEW_TOKENS = 24
IMAGE_PROMPT = "<|begin_of_text|>Describe <|patch|> briefly."


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    return make_tiny("canonical", vision=True, seed=17)


@pytest.fixture(scope="module")
def llm(checkpoint, same_cpu_kernels_in_module):
    return LLM(str(checkpoint), progress=False)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return reference_model(checkpoint)


def _image(height: int, width: int, seed: int) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


def _video(frames: int = 8) -> DecodedVideo:
    rng = np.random.RandomState(4)
    return DecodedVideo(frames=(rng.rand(frames, 90, 120, 3) * 255).astype("uint8"), fps=4.0)


def test_image_prompt_logits_match_reference(llm, reference):
    ids, items = llm.engine.prepare_prompt("<|begin_of_text|>Look: <|patch|> and <|patch|> now", [
        _image(150, 230, 0), _image(300, 90, 1)])
    grids = [tuple(item.grid_thw[0].tolist()) for item in items]
    assert any(h % 4 or w % 4 for _, h, w in grids), grids  # ragged 4×4 windows
    model = llm.engine.loaded.model
    features = torch.cat([torch.cat(model.encode_vision(i.pixel_values, i.grid_thw)) for i in items])
    token_ids = torch.tensor(ids)
    mask = token_ids == llm.engine.model_config.image_token_id
    with torch.no_grad():
        ours = model.compute_logits(model(token_ids, ForwardContext.without_cache([len(ids)]), features, mask))
        expected = reference(
            input_ids=token_ids[None],
            pixel_values=torch.cat([i.pixel_values for i in items]),
            image_grid_thw=torch.cat([i.grid_thw for i in items]),
        ).logits[0]
    assert (ours - expected).abs().max().item() < 1e-4


def test_image_features_match_reference(llm, reference):
    _, items = llm.engine.prepare_prompt("<|patch|>", [_image(64, 500, 2)])
    model = llm.engine.loaded.model
    with torch.no_grad():
        ours = torch.cat(model.encode_vision(items[0].pixel_values, items[0].grid_thw))
        expected = torch.cat(reference.get_image_features(items[0].pixel_values, items[0].grid_thw).pooler_output)
    assert (ours - expected).abs().max().item() < 1e-4


def _reference_greedy(reference, ids, token_count: int, **pixels) -> list[int]:
    """transformers' greedy generate, the logit rows past the tokenizer's ids suppressed (Glimmer never samples a
    row that is no token; this random model's argmax can land there)."""
    vocab = reference.config.get_text_config().vocab_size
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, suppress_tokens=list(range(token_count, vocab)),
                                 **pixels)
    return out[0, len(ids):].tolist()


def test_greedy_generation_with_an_image_matches_reference(llm, reference):
    prompt = {"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": _image(150, 230, 0)}}
    output = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))[0]
    ids, items = llm.engine.prepare_prompt(prompt["prompt"], [prompt["multi_modal_data"]["image"]])
    assert output.prompt_token_ids == ids
    assert output.token_ids == _reference_greedy(reference, ids, llm.engine.token_count,
                                                 pixel_values=items[0].pixel_values, image_grid_thw=items[0].grid_thw)


def test_greedy_generation_with_a_video_matches_reference(llm, reference):
    video = _video()
    prompt = {"prompt": "<|begin_of_text|>Watch <|video|> and tell.", "multi_modal_data": {"video": video}}
    output = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))[0]
    ids, items = llm.engine.prepare_prompt(prompt["prompt"], [], [video])
    assert items[0].grid_thw[0, 0].item() == 2 and len(items[0].runs) == 2  # two temporal groups
    assert output.token_ids == _reference_greedy(reference, ids, llm.engine.token_count,
                                                 pixel_values_videos=items[0].pixel_values,
                                                 video_grid_thw=items[0].grid_thw)


def test_chunked_prefill_splitting_an_image_gives_the_same_tokens(checkpoint, llm, same_cpu_kernels):
    prompt = {"prompt": IMAGE_PROMPT, "multi_modal_data": {"image": _image(150, 230, 0)}}
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    chunked = LLM(str(checkpoint), progress=False, max_num_batched_tokens=7, enable_prefix_caching=False)
    assert chunked.generate(prompt, params)[0].token_ids == llm.generate(prompt, params)[0].token_ids


MIXED_PROMPT = "<|patch|> then <|video|>, <|patch|> and <|patch|>"  # starts and ends inside an image's tokens


@pytest.mark.parametrize(("budget", "block_size"), [(1, 4), (3, 1), (7, 16)])
def test_images_and_a_video_chunked_anywhere_match_reference(checkpoint, reference, budget, block_size):
    """Three images and a two-group video in one prompt that starts and ends with an image, prefilled in chunks
    whose boundaries fall inside every placeholder run (and between a video's groups), then again from the prefix
    cache: the reference's greedy tokens each time."""
    images, video = [_image(50, 70, 1), _image(30, 30, 5), _image(90, 60, 6)], _video()
    llm = LLM(str(checkpoint), progress=False, max_num_batched_tokens=budget, block_size=block_size)
    ids, items = llm.engine.prepare_prompt(MIXED_PROMPT, images, [video])
    expected = _reference_greedy(
        reference, ids, llm.engine.token_count,
        pixel_values=torch.cat([item.pixel_values for item in items[:3]]),
        image_grid_thw=torch.cat([item.grid_thw for item in items[:3]]),
        pixel_values_videos=items[3].pixel_values, video_grid_thw=items[3].grid_thw)
    assert len(items[3].runs) == 2 and ids[-2] == llm.engine.model_config.image_token_id
    prompt = {"prompt": MIXED_PROMPT, "multi_modal_data": {"image": images, "video": video}}
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    first, again = (llm.generate(prompt, params)[0] for _ in range(2))
    assert first.prompt_token_ids == ids
    assert first.token_ids == expected and again.token_ids == expected
    assert again.num_cached_tokens > items[3].runs[1][0]


def test_same_placeholders_with_different_pixels_never_share_cached_blocks(llm):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    text = "<|begin_of_text|>" + "x " * 40 + "<|patch|> what?"
    first = llm.generate({"prompt": text, "multi_modal_data": {"image": _image(150, 230, 5)}}, params)[0]
    repeat = llm.generate({"prompt": text, "multi_modal_data": {"image": _image(150, 230, 5)}}, params)[0]
    other = llm.generate({"prompt": text, "multi_modal_data": {"image": _image(150, 230, 6)}}, params)[0]
    image_start = first.prompt_token_ids.index(llm.engine.model_config.image_token_id)
    assert repeat.num_cached_tokens > image_start and repeat.token_ids == first.token_ids
    assert other.num_cached_tokens <= image_start


def test_repeated_image_is_encoded_once(llm):
    cache = llm.engine.runner.encoder_cache
    image = _image(120, 120, 9)
    params = SamplingParams(temperature=0, max_tokens=2)
    llm.generate({"prompt": "<|patch|>a", "multi_modal_data": {"image": image}}, params)
    size = len(cache._items)
    llm.generate({"prompt": "<|patch|>b", "multi_modal_data": {"image": image}}, params)
    assert len(cache._items) == size
    # bounded in rows: two prefill chunks' worth, or the largest item the media settings allow if that is more
    media = llm.engine.media
    largest = max(t * h * w // media.settings.merge_size**2 for t, h, w in media.largest_grids())
    assert cache.max_rows == max(2 * llm.engine.scheduler_config.max_num_batched_tokens, largest)


def test_an_image_is_encoded_again_under_another_cache_salt(llm, monkeypatch):
    """Requests with different salts share no encoded image either: a hit is faster, so a tenant could otherwise
    learn by timing which image another tenant sent."""
    model = llm.engine.runner.model
    encoded = []
    encode = model.encode_vision
    monkeypatch.setattr(model, "encode_vision", lambda *args: encoded.append(1) or encode(*args))
    prompt = {"prompt": "<|patch|>a", "multi_modal_data": {"image": _image(120, 120, 11)}}
    outputs = [llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, cache_salt=salt))[0]
               for salt in ("tenant-a", "tenant-a", "tenant-b", None, None)]
    assert len(encoded) == 3
    assert all(out.token_ids == outputs[0].token_ids for out in outputs)


def test_chat_with_an_image_renders_one_placeholder_per_image(llm):
    out = llm.chat([{"role": "user", "content": [{"type": "image", "image": _image(100, 100, 3)},
                                                  {"type": "text", "text": "What is it?"}]}],
                   SamplingParams(temperature=0, max_tokens=5), chat_template_kwargs={"current_date": "2026-01-01"})[0]
    tokenizer = llm.get_tokenizer()
    ids = out.output.prompt_token_ids
    assert ids.count(tokenizer.token_to_id("<|image_start|>")) == 1
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id


@pytest.mark.parametrize(
    ("prompt", "data", "message"),
    [("no placeholder", {"image": "IMG"}, "placeholder"),
     ("<|patch|><|patch|>", {"image": "IMG"}, "placeholder"),
     ("<|patch|>", {"audio": [1]}, "not supported")],
)
def test_mismatched_multimodal_prompts_are_refused(llm, prompt, data, message):
    from glimmer.errors import RequestError

    data = {k: (_image(50, 50, 1) if v == "IMG" else v) for k, v in data.items()}
    with pytest.raises(RequestError, match=message):
        llm.generate({"prompt": prompt, "multi_modal_data": data}, SamplingParams(max_tokens=2))


def test_placeholder_tokens_without_media_are_refused(llm):
    from glimmer.errors import RequestError

    with pytest.raises(RequestError, match="no image was given"):
        llm.generate("<|patch|> hello", SamplingParams(max_tokens=2))
