"""Media given to the Python API: `multi_modal_data` takes what `LLM.chat` takes for an item, paths and data: URLs."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from glimmer import LLM, SamplingParams
from glimmer.errors import RequestError

PROMPT = "<|begin_of_text|>Describe <|patch|> briefly."


@pytest.fixture(scope="module")
def llm(make_tiny):
    return LLM(str(make_tiny("canonical", vision=True, seed=17)), progress=False, kv_cache_memory=16 << 20,
               max_model_len=512)


def _png(height: int, width: int) -> bytes:
    encoded = io.BytesIO()
    Image.fromarray((np.random.RandomState(3).rand(height, width, 3) * 255).astype("uint8")).save(encoded, "PNG")
    return encoded.getvalue()


def test_generate_takes_a_data_url_where_it_takes_a_path(llm, tmp_path):
    """README: the image of multi_modal_data is what LLM.chat takes; a data URL was opened as a file of that name."""
    path = tmp_path / "image.png"
    path.write_bytes(_png(60, 90))
    url = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
    params = SamplingParams(temperature=0, max_tokens=3)
    from_path, from_url = (llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": item}}, params)[0]
                           for item in (str(path), url))
    assert from_url.prompt_token_ids == from_path.prompt_token_ids
    assert from_url.outputs[0].token_ids == from_path.outputs[0].token_ids


def test_a_bad_data_url_in_generate_is_refused_without_echoing_it(llm):
    url = "data:image/png;base64," + "A" * 5000 + "!"
    with pytest.raises(RequestError) as raised:
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": url}}, SamplingParams(max_tokens=2))
    assert str(raised.value) == "image 0: data URL is not valid base64"
    assert raised.value.param == "prompt"


def test_generate_fetches_an_http_url_as_chat_does_only_when_remote_media_is_allowed(make_tiny, llm, tmp_path,
                                                                                     monkeypatch):
    """QA: multi_modal_data's "https://host/cat.png" was opened as a file of that name, refused as "no such file"
    however `allow_remote_media` was set, where LLM.chat fetches the same URL from an image_url part."""
    import glimmer.multimodal.sources as sources

    body = _png(60, 90)
    fetched_urls = []
    monkeypatch.setattr(sources, "fetch_remote", lambda url, policy, cancel: fetched_urls.append(url) or body)
    url = "https://images.example/cat.png"
    params = SamplingParams(temperature=0, max_tokens=3)
    with pytest.raises(RequestError, match=r"image 0: fetching media over http\(s\) is disabled.*"
                                            r"LLM\(\.\.\., allow_remote_media=True\)"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": url}}, params)
    assert fetched_urls == []
    remote = LLM(str(make_tiny("canonical", vision=True, seed=17)), progress=False, kv_cache_memory=16 << 20,
                 max_model_len=512, allow_remote_media=True)
    fetched = remote.generate({"prompt": PROMPT, "multi_modal_data": {"image": url}}, params)[0]
    assert fetched_urls == [url]
    path = tmp_path / "cat.png"
    path.write_bytes(body)
    from_path = remote.generate({"prompt": PROMPT, "multi_modal_data": {"image": str(path)}}, params)[0]
    assert fetched.prompt_token_ids == from_path.prompt_token_ids
    assert fetched.outputs[0].token_ids == from_path.outputs[0].token_ids


def test_generate_reads_a_file_url_as_the_path_it_names(llm, tmp_path):
    """QA: multi_modal_data's "file:///dir/cat.png" was opened as a file of that very name, "no such file", while the
    path /dir/cat.png was read; a file: URL naming another host is still refused, as LLM.chat refuses it."""
    path = tmp_path / "cat.png"
    path.write_bytes(_png(60, 90))
    params = SamplingParams(temperature=0, max_tokens=3)
    from_path, from_url = (llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": item}}, params)[0]
                           for item in (str(path), path.as_uri()))
    assert from_url.prompt_token_ids == from_path.prompt_token_ids
    assert from_url.outputs[0].token_ids == from_path.outputs[0].token_ids
    with pytest.raises(RequestError, match="image 0: file URL names the host 'fileserver'"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": f"file://fileserver{path}"}}, params)


def test_a_string_urllib_cannot_split_is_refused_naming_the_item(llm):
    """multi_modal_data's "http://[::1/x.png" (an unclosed IPv6 bracket) raised urllib's bare ValueError ("Invalid
    IPv6 URL") out of LLM.generate while it looked for data: URLs; it is a path that names no file, as the server
    already refused such a URL naming its part."""
    with pytest.raises(RequestError, match=r"image 0: no such file: 'http://\[::1/x.png'"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": "http://[::1/x.png"}},
                     SamplingParams(max_tokens=2))


def test_generate_takes_a_video_as_vllm_takes_it_frames_and_metadata(llm):
    """vLLM's `{"video": (frames, metadata)}` (or a list of such) is one video at metadata's fps; it was read as two
    videos, the metadata dict being the second."""
    from glimmer.multimodal import DecodedVideo

    frames = np.random.RandomState(5).randint(0, 256, (9, 60, 90, 3), dtype=np.uint8)
    prompt = "<|begin_of_text|>What happens in <|video|>?"
    params = SamplingParams(temperature=0, max_tokens=3)
    expected = llm.generate({"prompt": prompt, "multi_modal_data": {"video": DecodedVideo(frames, fps=3.0)}}, params)[0]
    for video in ((frames, {"fps": 3.0}), [(frames, {"fps": 3.0, "frames_indices": list(range(9))})]):
        out = llm.generate({"prompt": prompt, "multi_modal_data": {"video": video}}, params)[0]
        assert out.prompt_token_ids == expected.prompt_token_ids
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids


def test_frames_with_metadata_none_are_one_video_of_unknown_rate_as_vllm_reads_them(llm):
    """vLLM's `{"video": (frames, None)}` is one video whose metadata is not known (its _get_video_with_metadata
    returns the pair as it is); Glimmer read it as two videos, refusing the prompt's one <|video|> for "2 video(s)
    were given". The rate is unknown: the reference's 24 fps, as for the frames alone."""
    from glimmer.multimodal import DecodedVideo

    frames = np.random.RandomState(5).randint(0, 256, (9, 60, 90, 3), dtype=np.uint8)
    prompt = "<|begin_of_text|>What happens in <|video|>?"
    params = SamplingParams(temperature=0, max_tokens=3)
    expected = llm.generate({"prompt": prompt, "multi_modal_data": {"video": DecodedVideo(frames)}}, params)[0]
    for video in ((frames, None), [(frames, None)]):
        out = llm.generate({"prompt": prompt, "multi_modal_data": {"video": video}}, params)[0]
        assert out.prompt_token_ids == expected.prompt_token_ids
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids


def test_a_list_of_pil_images_is_one_video_as_vllm_reads_it(llm):
    """vLLM's multi_modal_data reads {"video": [PIL images]} as one video's frames (its _parse_video_data); Glimmer
    read each frame as a video of its own, refusing the prompt's one <|video|> for "9 video(s)" (and a frame as a
    video after that). The frames alone have no rate: the reference's 24 fps, as for a frames array alone."""
    from glimmer.multimodal import DecodedVideo

    frames = np.random.RandomState(5).randint(0, 256, (9, 60, 90, 3), dtype=np.uint8)
    prompt = "<|begin_of_text|>What happens in <|video|>?"
    params = SamplingParams(temperature=0, max_tokens=3)
    expected = llm.generate({"prompt": prompt, "multi_modal_data": {"video": DecodedVideo(frames)}}, params)[0]
    images = [Image.fromarray(frame) for frame in frames]
    for video in (images, [images]):
        out = llm.generate({"prompt": prompt, "multi_modal_data": {"video": video}}, params)[0]
        assert out.prompt_token_ids == expected.prompt_token_ids
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids


def test_an_array_stacking_images_or_videos_is_that_many_items_as_vllm_reads_it(llm):
    """vLLM's multi_modal_data reads an (N, H, W, C) image array or an (N, T, H, W, C) video array as N items (its
    _parse_image_data / _parse_video_data). Glimmer read it as one item: a prompt with a placeholder for each was
    refused for "2 placeholder(s) but 1 image(s) were given", though two were."""
    rng = np.random.RandomState(7)
    images = rng.randint(0, 256, (2, 60, 90, 3), dtype=np.uint8)
    videos = rng.randint(0, 256, (2, 4, 60, 90, 3), dtype=np.uint8)
    params = SamplingParams(temperature=0, max_tokens=3)
    for kind, stacked, prompt in (("image", images, "<|begin_of_text|>Compare <|patch|> and <|patch|>."),
                                  ("video", videos, "<|begin_of_text|>Compare <|video|> and <|video|>.")):
        expected = llm.generate({"prompt": prompt, "multi_modal_data": {kind: list(stacked)}}, params)[0]
        out = llm.generate({"prompt": prompt, "multi_modal_data": {kind: stacked}}, params)[0]
        assert out.prompt_token_ids == expected.prompt_token_ids
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids


@pytest.mark.parametrize("metadata", [{"fps": 3.0, "do_sample_frames": False},
                                      {"fps": 3.0, "frames_indices": [0, 4, 8, 12]},
                                      # 4 frames sampled from a clip of 16, without their indices, were read as the
                                      # whole clip at 3 fps: other frames kept, and their times a quarter of the truth
                                      {"fps": 3.0, "total_num_frames": 16, "duration": 16 / 3.0},
                                      {"fps": 3.0, "total_num_frames": "4"}])
def test_frames_already_sampled_are_refused_naming_the_fix(llm, metadata):
    frames = np.zeros((4, 60, 90, 3), dtype=np.uint8)
    with pytest.raises(RequestError, match="must hold every frame of the video"):
        llm.generate({"prompt": "<|video|>", "multi_modal_data": {"video": (frames, metadata)}},
                     SamplingParams(max_tokens=2))


def test_frames_with_metadata_counting_every_frame_are_read_at_its_fps(llm):
    """A total_num_frames equal to the frames given (an int, a NumPy int, or a whole float) is every frame."""
    frames = np.zeros((4, 60, 90, 3), dtype=np.uint8)
    expected = llm.generate({"prompt": "<|video|>", "multi_modal_data": {"video": (frames, {"fps": 3.0})}},
                            SamplingParams(max_tokens=2))[0]
    for total in (4, np.int64(4), 4.0):
        out = llm.generate({"prompt": "<|video|>", "multi_modal_data": {"video": (frames, {
            "fps": 3.0, "total_num_frames": total, "frames_indices": list(range(4))})}}, SamplingParams(max_tokens=2))
        assert out[0].prompt_token_ids == expected.prompt_token_ids


@pytest.mark.parametrize("indices", [5, np.arange(4)[:, None], "0123", [0.5, 1, 2, 3]])
def test_frames_indices_that_are_no_list_of_integers_are_refused_naming_them(llm, indices):
    """A (frames, metadata) video's frames_indices of 5 raised TypeError ('int' object is not iterable) out of
    LLM.generate, a (4, 1) array of them was taken as they are; a string or fractions were refused as
    frames already sampled. Whole numbers in any form (an int array, floats 0.0, 1.0, ...) are indices."""
    frames = np.zeros((4, 60, 90, 3), dtype=np.uint8)
    with pytest.raises(RequestError, match="metadata frames_indices must be a list of integers"):
        llm.generate({"prompt": "<|video|>", "multi_modal_data": {"video": (frames, {"fps": 3.0,
                                                                                    "frames_indices": indices})}},
                     SamplingParams(max_tokens=2))
    for whole in (np.arange(4), np.arange(4.0)):
        llm.generate({"prompt": "<|video|>", "multi_modal_data": {"video": (frames, {"fps": 3.0,
                                                                                    "frames_indices": whole})}},
                     SamplingParams(max_tokens=2))


def test_token_ids_with_media_are_expanded_as_their_text_is(llm):
    """vLLM's `{"prompt_token_ids": ids, "multi_modal_data": ...}` was refused ("needs a text prompt"): code that
    tokenizes its own prompts could not send an image. The ids hold one placeholder id per item, as the text does,
    and give the same prompt ids, media and tokens as the text."""
    from glimmer.multimodal import DecodedVideo

    frames = np.random.RandomState(5).randint(0, 256, (9, 60, 90, 3), dtype=np.uint8)
    text = "<|begin_of_text|>Compare <|patch|> with <|video|> and <|patch|>, in Time: order."
    media = {"image": [_png(60, 90), _png(30, 140)], "video": DecodedVideo(frames, fps=3.0)}
    params = SamplingParams(temperature=0, max_tokens=4)
    expected = llm.generate({"prompt": text, "multi_modal_data": media}, params)[0]
    ids = llm.get_tokenizer().encode(text, add_special_tokens=False)
    out = llm.generate({"prompt_token_ids": ids, "multi_modal_data": media}, params)[0]
    assert len(out.prompt_token_ids) > len(ids) + 10  # expanded
    assert out.prompt_token_ids == expected.prompt_token_ids
    assert out.outputs[0].token_ids == expected.outputs[0].token_ids


def test_token_ids_whose_placeholders_do_not_match_the_media_are_refused_naming_them(llm):
    image = _png(60, 90)
    expanded = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}},
                            SamplingParams(max_tokens=1))[0].prompt_token_ids
    plain = llm.get_tokenizer().encode("<|begin_of_text|>Describe it briefly.", add_special_tokens=False)
    patches = expanded.count(llm.engine.model_config.image_token_id)
    assert patches > 1
    for ids, found in ((plain, 0), (expanded, patches)):
        message = rf"prompts\[1\].prompt_token_ids holds {found} image placeholder"
        with pytest.raises(RequestError, match=message) as raised:
            llm.generate([PROMPT, {"prompt_token_ids": ids, "multi_modal_data": {"image": image}}],
                         SamplingParams(max_tokens=1))
        assert raised.value.param == "prompts[1].prompt_token_ids"


def test_chat_takes_vllms_image_pil_part(llm):
    """vLLM's `LLM.chat` takes `{"type": "image_pil", "image_pil": image}`; it was refused as an unknown part type."""
    png = _png(60, 90)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    params = SamplingParams(temperature=0, max_tokens=3)
    replies = [llm.chat([{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}], params)[0]
               for part in ({"type": "image_url", "image_url": {"url": url}},
                            {"type": "image_pil", "image_pil": Image.open(io.BytesIO(png))})]
    assert replies[1].prompt_token_ids == replies[0].prompt_token_ids
    assert replies[1].outputs[0].token_ids == replies[0].outputs[0].token_ids


def test_an_error_in_one_of_several_conversations_names_that_conversation(llm):
    """A batch's second conversation's faults were named as the first's (`messages[0].role`, a part of
    `messages[0].content[0]`), where nothing is wrong."""
    good = [{"role": "user", "content": "hi"}]
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    bad_image = [{"role": "user", "content": [part]}]
    bad_role = [{"role": "robot", "content": "hi"}]
    params = SamplingParams(max_tokens=1)
    for conversations, param in (([good, bad_role], "messages[1][0].role"),
                                 ([good, bad_image], "messages[1][0].content[0]"),
                                 (bad_role, "messages[0].role"), (bad_image, "messages[0].content[0]")):
        with pytest.raises(RequestError) as caught:
            llm.chat(conversations, params)
        assert caught.value.param == param and str(caught.value).startswith(param), caught.value


@pytest.mark.parametrize(("data", "given"), [([Image.new("RGB", (28, 28))], "list"), ("cat.png", "str"),
                                             (("image",), "tuple")])
def test_multi_modal_data_that_is_no_dict_is_refused_naming_it(llm, data, given):
    """A list of images (an unhashable TypeError), a path (read as the keys '.', 'a', ...) or a tuple of key names (an
    AttributeError) given as multi_modal_data itself, where it takes {"image": ...}."""
    with pytest.raises(RequestError) as refused:
        llm.generate({"prompt": PROMPT, "multi_modal_data": data}, SamplingParams(max_tokens=2))
    assert str(refused.value) == ('prompt.multi_modal_data must be a dict of the media by kind, {"image": ..., '
                                  f'"video": ...}} (each an item or a list of items), not {given}')
    assert refused.value.param == "prompt.multi_modal_data"


def test_multi_modal_data_keys_of_several_types_are_named(llm):
    """Keys of several types could not be sorted for the message: a TypeError instead of the refusal."""
    with pytest.raises(RequestError, match=r"^multi_modal_data keys \['1', 'images'\] are not supported; use 'image' "
                                           r"and 'video'$"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {1: b"", "images": b""}}, SamplingParams(max_tokens=2))


def test_split_special_tokens_makes_a_text_prompts_spellings_text_and_refuses_media_placeholders_there(make_tiny,
                                                                                                     tmp_path):
    """tokenizer_config.json's split_special_tokens was ignored: transformers (and vLLM through it) tokenizes a text
    prompt's special-token spellings as text, `<|begin_of_text|>` and `<|patch|>` included, so that a text prompt
    then marks no image; a chat prompt keeps its template's control tokens (the user's text is plain either way)."""
    import json
    import shutil

    from transformers import AutoTokenizer

    checkpoint = tmp_path / "split"
    shutil.copytree(make_tiny("canonical", vision=True, seed=17), checkpoint)
    config_file = checkpoint / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "split_special_tokens": True}))
    hf = AutoTokenizer.from_pretrained(str(checkpoint))
    llm = LLM(str(checkpoint), progress=False, kv_cache_memory=16 << 20, max_model_len=512)
    tokenizer = llm.get_tokenizer()
    for text in (PROMPT, "Describe <|patch|> then <|eot|> and <|start|>assistant"):
        expected = hf(text)["input_ids"]
        assert llm.encode_prompt(text) == tokenizer.encode(text) == tokenizer(text)["input_ids"] == expected
        assert tokenizer.tokenize(text) == hf.tokenize(text)
        assert llm.generate(text, SamplingParams(max_tokens=1))[0].prompt_token_ids == expected
    with pytest.raises(RequestError, match="split_special_tokens.*prompt_token_ids") as raised:
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": Image.new("RGB", (56, 56))}},
                     SamplingParams(max_tokens=1))
    assert raised.value.param == "prompt"
    chat = llm.chat([{"role": "user", "content": "Hi <|eot|>"}], SamplingParams(max_tokens=1))[0]
    prompt, ids = chat.output.prompt, chat.prompt_token_ids
    assert ids.count(hf.convert_tokens_to_ids("<|start|>")) == prompt.count("<|start|>") > 1
    assert ids.count(hf.convert_tokens_to_ids("<|eot|>")) == prompt.count("<|eot|>") - 1  # the user's is text


@pytest.mark.parametrize(("part", "named"), [
    ({"type": "image_url", "image_url": {"url": "A"}, "image": "B"}, "image and image_url"),
    ({"type": "image", "image": "A", "url": "B"}, "image and url"),
    ({"type": "video_url", "video_url": {"url": "A"}, "path": "B"}, "video_url and path"),
])
def test_a_media_part_giving_its_item_twice_is_refused_naming_both(llm, part, named):
    """A part may give its item under any of several keys (OpenAI's image_url, HF's image, url, path, vLLM's
    image_pil); one giving two took the first of them silently and dropped the other, another image than the client
    may have meant. Other keys of a part are metadata and ignored, as a message's are."""
    images = [_png(40, 40), _png(50, 70)]
    urls = ["data:image/png;base64," + base64.b64encode(image).decode() for image in images]
    sources = dict(zip("AB", urls, strict=True))
    part = {key: ({"url": sources[value["url"]]} if isinstance(value, dict) else sources.get(value, value))
            for key, value in part.items()}
    with pytest.raises(RequestError) as raised:
        llm.chat([{"role": "user", "content": [part, {"type": "text", "text": "hi"}]}], SamplingParams(max_tokens=2))
    assert str(raised.value) == (f"messages[0].content[0] gives its {part['type'].removesuffix('_url')} twice, "
                                 f"as {named}; give it once")
    assert raised.value.param == "messages[0].content[0]"
    metadata = {"type": "image_url", "image_url": {"url": urls[0]}, "cache_control": {"type": "ephemeral"}, "uuid": "x"}
    params = SamplingParams(max_tokens=2, temperature=0)
    plain = llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": urls[0]}}]}], params)[0]
    assert llm.chat([{"role": "user", "content": [metadata]}], params)[0].outputs[0].token_ids == \
        plain.outputs[0].token_ids
