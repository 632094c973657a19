"""Images through the real server with the `openai` SDK (issue 5's serving part)."""

from __future__ import annotations

import base64
import contextlib
import io
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import openai
import pytest
from openai.types.responses import ResponseInputImage, ResponseInputImageContent
from PIL import Image
from server_support import PINNED_DATE, live_server

from glimmer import LLM, SamplingParams
from glimmer.multimodal.sources import MediaFetchPolicy

EXTRA = {"chat_template_kwargs": PINNED_DATE}


def _png(seed: int, size=(90, 60)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray((np.random.RandomState(seed).rand(size[1], size[0], 3) * 255).astype("uint8")).save(buffer, "PNG")
    return buffer.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _messages(*urls: str) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is in the picture?"}]}]


@pytest.fixture(scope="module")
def checkpoint(make_tiny):
    return make_tiny("canonical", vision=True, seed=17)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("media")
    (directory / "cat.png").write_bytes(_png(3))
    return directory


@pytest.fixture(scope="module")
def server(checkpoint, media_dir):
    policy = MediaFetchPolicy.create([media_dir])
    with live_server(checkpoint, media_policy=policy, max_images_per_request=2) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


def test_an_image_sent_as_a_data_url_is_seen_by_the_model(client, checkpoint):
    messages = _messages(_data_url(_png(1)))
    response = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                              extra_body={**EXTRA, "ignore_eos": True})
    offline = LLM(str(checkpoint), progress=False).chat(
        messages, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), chat_template_kwargs=PINNED_DATE)[0]
    assert response.usage.prompt_tokens == len(offline.output.prompt_token_ids)
    assert response.usage.completion_tokens == 16
    message = response.choices[0].message
    assert (message.content, getattr(message, "reasoning_content", None)) == (offline.content, offline.reasoning)


def test_streaming_with_an_image_matches_non_streaming(client):
    messages = _messages(_data_url(_png(2)))
    kwargs = dict(model="tiny", messages=messages, max_tokens=12, temperature=0,
                  extra_body={**EXTRA, "ignore_eos": True})
    whole = client.chat.completions.create(**kwargs).choices[0].message
    content = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        stream=True, **kwargs) if chunk.choices)
    assert content == (whole.content or "")


def test_a_file_under_an_allowed_directory_works_and_others_are_refused(client, media_dir, tmp_path):
    ok = client.chat.completions.create(model="tiny", messages=_messages(str(media_dir / "cat.png")),
                                        max_tokens=2, extra_body=EXTRA)
    assert ok.choices[0].finish_reason in ("stop", "length")
    outside = tmp_path / "secret.png"
    outside.write_bytes(_png(4))
    with pytest.raises(openai.BadRequestError, match="is not a readable file under the allowed media directories"):
        client.chat.completions.create(model="tiny", messages=_messages(str(outside)), max_tokens=2, extra_body=EXTRA)


@pytest.mark.parametrize(
    ("url", "message"),
    [("data:image/png;base64,aGVsbG8=", "image 0"), ("https://example.com/cat.png", "--allow-remote-media"),
     ("data:image/png;base64,@@", "not valid base64")],
)
def test_bad_images_are_400_not_500(client, url, message):
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model="tiny", messages=_messages(url), max_tokens=2, extra_body=EXTRA)


def test_an_image_detail_openai_does_not_know_is_a_400_naming_it(client):
    """OpenAI refuses a `detail` other than auto, low, high and original; it was taken silently."""
    url = _data_url(_png(5, size=(30, 30)))
    for detail in ("auto", "low", "high", "original"):
        messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": detail}}]}]
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, extra_body=EXTRA)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": "hgih"}}]}]
    refused = r"image_url\.detail must be one of 'auto', 'low', 'high', 'original'"
    with pytest.raises(openai.BadRequestError, match=refused) as e:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, extra_body=EXTRA)
    assert e.value.body["param"] == "messages[0].content[0].image_url.detail"


def test_a_video_url_fps_is_a_400_naming_it(client):
    """vLLM reads a video_url's url alone; an `fps` beside it (the sampling rate other APIs take there) was dropped
    without a word, the video sampled at the model's own rate."""
    video = {"url": "data:video/mp4;base64,AAAA", "fps": 2}
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": video}]}]
    with pytest.raises(openai.BadRequestError, match=r"video_url\.fps: a video_url object takes only its url") as e:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, extra_body=EXTRA)
    assert e.value.body["param"] == "messages[0].content[0].video_url.fps"


def test_too_many_images_is_a_400_naming_the_limit(client):
    url = _data_url(_png(5, size=(30, 30)))
    with pytest.raises(openai.BadRequestError, match="more than 2 images"):
        client.chat.completions.create(model="tiny", messages=_messages(url, url, url), max_tokens=2, extra_body=EXTRA)


def test_a_request_over_the_media_limits_is_refused_before_any_item_is_loaded(client, monkeypatch):
    """The per-request limits and every part's shape are checked before any reference is loaded: the server fetched
    (or read) each image and video in turn and refused the one past the limit only on reaching it, so 2 remote videos
    (64 MiB and 10 s each) and a third, or 16 slow image URLs and one more, were all downloaded to be refused."""
    import glimmer.server.chat_prompt as chat_prompt

    loaded = []
    monkeypatch.setattr(chat_prompt, "load_media_reference", lambda reference, *args: loaded.append(reference))
    url = _data_url(_png(5, size=(30, 30)))
    with pytest.raises(openai.BadRequestError, match="more than 2 images") as over:
        client.chat.completions.create(model="tiny", messages=_messages(url, url, url), max_tokens=2, extra_body=EXTRA)
    assert over.value.body["param"] == "messages[0].content[2]"
    no_url = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                           {"type": "image_url", "image_url": {}}]}]
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\]\.image_url\.url is missing"):
        client.chat.completions.create(model="tiny", messages=no_url, max_tokens=2, extra_body=EXTRA)
    assert loaded == []


def test_the_image_limit_says_when_it_counted_the_images_of_the_responses_continued(client):
    """/v1/responses counts the images of the responses previous_response_id continues (the prompt holds them): a
    request sending one image past them was refused "more than 2 images in one request", naming its one image. The
    message says how many of those counted came from the chain; a request over the limit alone says nothing of it."""
    url = _data_url(_png(5, size=(30, 30)))
    images = [{"type": "input_image", "image_url": url}] * 2
    first = client.responses.create(model="tiny", max_output_tokens=2, extra_body=EXTRA, input=[
        {"role": "user", "content": [*images, {"type": "input_text", "text": "Compare them."}]}])
    one_more = [{"role": "user", "content": [images[0], {"type": "input_text", "text": "And this?"}]}]
    for create in (client.responses.create, client.responses.input_tokens.count):
        with pytest.raises(openai.BadRequestError) as refused:
            create(model="tiny", input=one_more, previous_response_id=first.id, extra_body=EXTRA)
        assert refused.value.body["param"] == "input[0].content[0]"
        message = refused.value.body["message"]
        assert message.startswith("input[0].content[0]: more than 2 images in one request"), message
        assert "2 of the images counted are in the responses previous_response_id continues" in message
    with pytest.raises(openai.BadRequestError) as alone:
        client.responses.create(model="tiny", max_output_tokens=2, extra_body=EXTRA, input=[
            {"role": "user", "content": [*images, *images]}])
    assert alone.value.body["param"] == "input[0].content[2]"
    assert "previous_response_id" not in alone.value.body["message"]


def test_the_server_keeps_serving_after_bad_media(client):
    response = client.chat.completions.create(model="tiny", messages=_messages(_data_url(_png(6))), max_tokens=2,
                                              extra_body=EXTRA)
    assert response.choices[0].finish_reason in ("stop", "length")


def _mkv_video(tmp_path) -> bytes:
    """8 lossless frames at 4 fps (Matroska/FFV1), like a client would upload."""
    import av

    frames = (np.random.RandomState(8).rand(8, 60, 90, 3) * 255).astype("uint8")
    path = tmp_path / "clip.mkv"
    with av.open(str(path), "w", format="matroska") as output:
        stream = output.add_stream("ffv1", rate=4)
        stream.height, stream.width, stream.pix_fmt = 60, 90, "bgr0"
        for array in frames:
            output.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        output.mux(stream.encode())
    return path.read_bytes()


def test_a_video_sent_as_a_data_url_is_expanded_into_timestamped_groups(client, checkpoint, tmp_path):
    url = "data:video/x-matroska;base64," + base64.b64encode(_mkv_video(tmp_path)).decode()
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                             {"type": "text", "text": "What happens?"}]}]
    response = client.chat.completions.create(model="tiny", messages=messages, max_tokens=3, extra_body=EXTRA)
    assert response.choices[0].finish_reason in ("stop", "length")
    offline = LLM(str(checkpoint), progress=False)
    reply = offline.chat(messages, SamplingParams(max_tokens=1), chat_template_kwargs=PINNED_DATE)[0]
    ids = reply.output.prompt_token_ids
    assert response.usage.prompt_tokens == len(ids)
    # 8 frames at 4 fps sampled at 2 fps: 4 frames, 2 temporal groups stamped 0.0 s and 1.0 s (§7-8)
    prompt = offline.get_tokenizer().decode(ids)
    assert "<|vid_start|>Time: 0.0s<|video|>" in prompt and "<|vid_frame_separator|>Time: 1.0s<|video|>" in prompt


def test_media_errors_name_the_content_part(client):
    """Audit: image errors said `image 0: …` with param "messages"; `{"image_url": {}}` said NoneType."""
    messages = _messages(_data_url(_png(7, size=(30, 30))), _data_url(_png(8, size=(2, 900))))
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, extra_body=EXTRA)
    assert err.value.body["param"] == "messages[0].content[1]"
    assert err.value.body["message"].startswith("messages[0].content[1] (image 1): ")
    empty = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=empty, max_tokens=2, extra_body=EXTRA)
    assert err.value.body["param"] == "messages[0].content[1].image_url.url"
    assert "is missing" in err.value.body["message"]
    not_a_string = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=not_a_string, max_tokens=2, extra_body=EXTRA)
    assert err.value.body["param"] == "messages[0].content[0].image_url.url"
    assert "must be a string" in err.value.body["message"]


def test_a_video_ffmpeg_cannot_read_is_a_400_in_plain_words(client):
    """It said `... decodable video (...): [Errno 1094995529] Invalid data found when processing input: '<none>'`,
    PyAV's text with FFmpeg's error code and the stream's name."""
    url = "data:video/mp4;base64," + base64.b64encode(b"not a video at all" * 20).decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "video_url", "video_url": {"url": url}}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, extra_body=EXTRA)
    assert err.value.status_code == 400 and err.value.body["param"] == "messages[0].content[1]"
    assert err.value.body["message"] == ("messages[0].content[1] (video 0): not a video FFmpeg can decode (MP4, WebM, "
                                         "MKV, AVI, MPEG-TS, ...): invalid data found when processing input")


def test_an_image_in_a_responses_function_call_output_is_seen_as_in_a_chat_tool_message(client):
    """The openai SDK's function_call_output takes input_image parts, as chat's tool messages take images; they were
    refused as 'not supported here (text parts are)'. The prompt is the chat one, token for token."""
    url = _data_url(_png(9))
    chat = client.chat.completions.create(model="tiny", max_tokens=1, extra_body=EXTRA, messages=[
        {"role": "user", "content": "Look."},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "snap", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1",
         "content": [{"type": "text", "text": "taken"}, {"type": "image_url", "image_url": {"url": url}}]}])
    output = [{"type": "input_text", "text": "taken"}, {"type": "input_image", "image_url": url, "detail": "auto"}]
    input_items = [{"role": "user", "content": "Look."},
                   {"type": "function_call", "call_id": "c1", "name": "snap", "arguments": "{}"},
                   {"type": "function_call_output", "call_id": "c1", "output": output}]
    response = client.responses.create(model="tiny", max_output_tokens=16, input=input_items, extra_body=EXTRA)
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    broken = [*input_items[:2], {**input_items[2], "output": [output[0], {**output[1], "image_url": "data:,"}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", max_output_tokens=16, input=broken, extra_body=EXTRA)
    assert err.value.body["param"] == "input[2].output[1]"
    assert err.value.body["message"].startswith("input[2].output[1] (image 0): ")


def test_an_image_of_the_conversation_continued_is_the_one_read_when_it_was_sent(client, media_dir):
    """A stored response kept its images' paths and URLs, read again on every turn: a file overwritten since (an
    agent's screenshot.png, each step) put the new image in the earlier turn too, a conversation other than the one
    the model answered, and one removed since refused the continuation. A stored response keeps the bytes its images
    were read as, as OpenAI keeps an input image; input_items still lists them as sent."""
    photo = media_dir / "shot.png"
    sent = _png(14)  # 8 tokens; the image written over it takes 56
    photo.write_bytes(sent)
    look = [{"type": "input_text", "text": "Look."}, {"type": "input_image", "image_url": str(photo)}]
    greedy = dict(model="tiny", max_output_tokens=3, temperature=0, extra_body=EXTRA)
    first = client.responses.create(**greedy, input=[{"role": "user", "content": look}])
    photo.write_bytes(_png(15, size=(300, 200)))
    second = client.responses.create(**greedy, previous_response_id=first.id, input="And now?")
    inline = [{"role": "user", "content": [look[0], {**look[1], "image_url": _data_url(sent)}]},
              *(item.model_dump(exclude_none=True) for item in first.output), {"role": "user", "content": "And now?"}]
    alone = client.responses.create(**greedy, store=False, input=inline)
    assert second.usage.input_tokens == alone.usage.input_tokens
    assert second.output_text == alone.output_text
    photo.unlink()
    assert client.responses.create(**greedy, previous_response_id=second.id, input="Still?").status != "failed"
    assert client.responses.input_items.list(second.id, order="asc").data[0].content[1].image_url == str(photo)


def test_a_conversation_with_an_image_from_a_path_sent_again_beside_its_response_is_400(client, media_dir):
    """The conversation previous_response_id continues, sent again beside it, is refused at its answer; with an image
    from a path in its user message it was taken once that image was kept as the data read (the chain's user message
    compared unlike the path sent again), and the prompt held the conversation twice."""
    photo = media_dir / "again.png"
    photo.write_bytes(_png(16))
    user = {"role": "user", "content": [{"type": "input_text", "text": "Look."},
                                        {"type": "input_image", "image_url": str(photo)}]}
    first = client.responses.create(model="tiny", max_output_tokens=3, temperature=0, extra_body=EXTRA, input=[user])
    assert first.output_text
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", max_output_tokens=3, extra_body=EXTRA, previous_response_id=first.id,
                                input=[user, {"role": "assistant", "content": first.output_text},
                                       {"role": "user", "content": "And now?"}])
    assert refused.value.body["param"] == "input[1]"
    assert refused.value.body["message"].startswith("input[1]: duplicate assistant message item")


def test_listed_input_images_have_the_detail_openai_lists_so_the_sdk_reads_them_as_images(client):
    """OpenAI lists every input_image with its `detail` (`auto` where none was sent), which the SDK's
    ResponseInputImage requires: an image sent without one was listed without, and the SDK read the part as a
    ResponseOutputText (`.detail` an AttributeError), a function_call_output's as a bare dict."""
    url = _data_url(_png(12))
    listed = client.responses.input_items.list(client.responses.create(
        model="tiny", max_output_tokens=2, extra_body=EXTRA,
        input=[{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]).id).data
    assert isinstance(listed[0].content[0], ResponseInputImage), type(listed[0].content[0])
    assert listed[0].content[0].detail == "auto"
    response = client.responses.create(model="tiny", max_output_tokens=2, extra_body=EXTRA, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": url, "detail": "low"}]},
        {"type": "function_call", "call_id": "c1", "name": "snap", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_image", "image_url": url}]}])
    user, _, output = client.responses.input_items.list(response.id, order="asc").data
    for part, detail in ((user.content[0], "low"), (output.output[0], "auto")):
        assert isinstance(part, ResponseInputImage | ResponseInputImageContent), type(part)
        assert (part.type, part.image_url, part.detail) == ("input_image", url, detail)


def test_including_the_input_image_urls_as_openai_asks_lists_them(client):
    """OpenAI's `include: ["message.input_image.image_url"]` asks for the input images' URLs, which input_items lists
    (Glimmer always lists them as sent); create, retrieve and input_items refused it as "not supported"."""
    url = _data_url(_png(13))
    include = ["message.input_image.image_url"]
    response = client.responses.create(model="tiny", max_output_tokens=2, extra_body=EXTRA, include=include, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": url}]}])
    assert client.responses.retrieve(response.id, include=include).id == response.id
    listed = client.responses.input_items.list(response.id, include=include).data
    assert listed[0].content[0].image_url == url


def test_images_past_the_context_are_a_400_with_the_context_length_code(checkpoint):
    """Images alone past max_model_len were a 400 with code null, "more than the limit of 120", telling the client
    to lower max_image_tokens (no request field); a shorter prompt of one image was context_length_exceeded. Each
    image counts whole, its 54 <|patch|> tokens and its two markers (3 x 56), as the prompt's own refusal counts it."""
    import httpx

    with live_server(checkpoint, engine_options={"max_model_len": 120}) as live:
        parts = [{"type": "image_url", "image_url": {"url": _data_url(_png(seed, (300, 200)))}} for seed in range(3)]
        response = httpx.post(live.base_url + "/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": parts}]})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "This model's maximum context length is 120 tokens (max_model_len), but the images and videos "
                   "need 168 tokens together; send fewer or smaller images or videos",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}


def test_a_prompt_past_the_context_counts_each_image_and_video_with_its_markers_and_timestamps(checkpoint,
                                                                                               tmp_path):
    """The refusal's share of images and videos counted their placeholder tokens alone: each image's
    <|image_start|> and <|image_end|>, and a video's <|vid_start|>, timestamps, separators and <|vid_end|>, were
    counted as `messages`, the part it named to shorten."""
    import httpx

    video = "data:video/x-matroska;base64," + base64.b64encode(_mkv_video(tmp_path)).decode()
    parts = [{"type": "image_url", "image_url": {"url": _data_url(_png(1, (300, 200)))}},
             {"type": "video_url", "video_url": {"url": video}}, {"type": "text", "text": "What is shown?"}]
    messages = [{"role": "user", "content": parts}]
    with live_server(checkpoint, engine_options={"max_model_len": 120}) as live:
        tokens = httpx.post(live.base_url.removesuffix("/v1") + "/tokenize", timeout=60,
                            json={"messages": messages, **EXTRA}).json()["tokens"]
        response = httpx.post(live.base_url + "/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 2, "messages": messages, **EXTRA})
        marker = live.engine.engine.tokenizer.token_to_id
    spans = {kind: tokens.index(marker(end)) - tokens.index(marker(start)) + 1 for kind, start, end in
             [("images", "<|image_start|>", "<|image_end|>"), ("videos", "<|vid_start|>", "<|vid_end|>")]}
    message = response.json()["error"]["message"]
    assert response.status_code == 400 and f"but the prompt has {len(tokens)} tokens (" in message
    assert re.search(rf"\bimages {spans['images']}\b", message)
    assert re.search(rf"\bvideos {spans['videos']}\b", message)


def test_images_of_the_conversation_previous_response_id_continues_count_as_that_conversation(checkpoint):
    """A /v1/responses prompt too long after a response whose input held images counted them as `images` ("(images
    630, input 534); shorten or remove images", param `images`'s `input`), though they are in the conversation
    previous_response_id continues, which shortening the input leaves: they count in its part now, each once (its
    placeholder was counted twice: previous_response_id 248, input 185, for 244 and 189)."""
    import httpx

    image = {"type": "input_image", "image_url": _data_url(_png(1, (300, 200)))}
    limit = 400
    with live_server(checkpoint, engine_options={"max_model_len": limit}) as live:
        first = httpx.post(live.base_url + "/responses", timeout=60, json={
            "model": "tiny", "max_output_tokens": 2, **EXTRA,
            "input": [{"role": "user", "content": [*[image] * 4, {"type": "input_text", "text": "What is it?"}]}]})
        assert first.status_code == 200, first.text
        response = httpx.post(live.base_url + "/responses", timeout=60, json={
            "model": "tiny", "max_output_tokens": 2, "previous_response_id": first.json()["id"],
            "input": "and these lighthouses? " * 6})
        alone = httpx.post(live.base_url.removesuffix("/v1") + "/tokenize", timeout=60, json={  # the input's prompt
            "messages": [{"role": "user", "content": "and these lighthouses? " * 6}]}).json()["count"]
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "images" not in error["message"] and error["param"] == "previous_response_id", error
    total = int(re.search(r"the prompt has (\d+) tokens", error["message"])[1])
    assert f"previous_response_id {total - alone}" in error["message"], (alone, error)
    assert re.search(rf"\binput {alone}\b", error["message"]), (alone, error)


def test_images_past_the_context_with_those_of_the_conversation_continued_say_how_many_are_its(checkpoint):
    """The images of a request and of the conversation previous_response_id continues, together past the context, were
    refused "send fewer or smaller images or videos", naming `input`, which may hold fewer than the images the prompt
    holds: the 400 says how many of them are that conversation's, and how to leave it."""
    import httpx

    image = {"type": "input_image", "image_url": _data_url(_png(1, (300, 200)))}  # 56 tokens each
    with live_server(checkpoint, engine_options={"max_model_len": 400}) as live:
        first = httpx.post(live.base_url + "/responses", timeout=60, json={
            "model": "tiny", "max_output_tokens": 2, **EXTRA, "input": [{"role": "user", "content": [image] * 4}]})
        assert first.status_code == 200, first.text
        response = httpx.post(live.base_url + "/responses", timeout=60, json={
            "model": "tiny", "max_output_tokens": 2, "previous_response_id": first.json()["id"],
            "input": [{"role": "user", "content": [image] * 4}]})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == {
        "message": "This model's maximum context length is 400 tokens (max_model_len), but the images and videos "
                   "need 448 tokens together; send fewer or smaller images or videos; 4 of its 8 images are in the "
                   "responses previous_response_id continues, which the prompt holds too: continue an earlier "
                   "response, or send a shorter conversation as input without previous_response_id",
        "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}


@contextlib.contextmanager
def _image_host(answer):
    """The base URL of a local http image host: `answer(path)` gives a GET's body (None: 404), a thread a request."""
    class Host(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            body = answer(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    host = ThreadingHTTPServer(("127.0.0.1", 0), Host)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{host.server_address[1]}"
    finally:
        host.shutdown()
        host.server_close()


@pytest.fixture(scope="module")
def remote_client(checkpoint):
    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=60)
    with live_server(checkpoint, media_policy=policy) as live:
        yield openai.OpenAI(base_url=live.base_url, api_key="unused", max_retries=0)


def test_a_requests_remote_images_are_fetched_beside_each_other_and_kept_in_order(remote_client):
    """They were fetched one after another: 16 images from a slow host took 16 times its delay, 16 times the fetch
    time limit where it never answered. The host answers none until all are asked for at once (or 10 s passed)."""
    images = [_png(seed, size=(30 + 10 * seed % 40, 40)) for seed in (21, 22, 23, 24)]
    lock, connections = threading.Lock(), {"open": 0, "most": 0}
    all_asked = threading.Barrier(len(images), timeout=10)

    def answer(path):
        with lock:
            connections["open"] += 1
            connections["most"] = max(connections["most"], connections["open"])
        try:
            all_asked.wait()
        except threading.BrokenBarrierError:  # asked one after another: the first waited out the 10 s
            pass
        finally:
            with lock:  # before answering: the next one may be asked for once this answer is read
                connections["open"] -= 1
        return images[int(path.strip("/").removesuffix(".png"))]

    def chat(urls):
        return remote_client.chat.completions.create(model="tiny", messages=_messages(*urls), max_tokens=6,
                                                     temperature=0, extra_body=EXTRA)

    with _image_host(answer) as base:
        fetched = chat([f"{base}/{i}.png" for i in range(len(images))])
    assert connections["most"] == len(images)
    sent = chat([_data_url(image) for image in images])
    assert fetched.choices[0].message.content == sent.choices[0].message.content
    assert fetched.usage.prompt_tokens == sent.usage.prompt_tokens


def test_of_a_requests_remote_images_the_first_that_fails_in_its_order_is_named(remote_client):
    """The second image's host refuses it at once, the first's only after that: the error names the first."""
    second_refused = threading.Event()

    def answer(path):
        if path == "/second.png":
            second_refused.set()
        else:
            second_refused.wait(10)
        return _png(5) if path == "/third.png" else None

    with _image_host(answer) as base, pytest.raises(openai.BadRequestError) as err:
        remote_client.chat.completions.create(model="tiny", messages=_messages(
            f"{base}/first.png", f"{base}/second.png", f"{base}/third.png"), max_tokens=2, extra_body=EXTRA)
    assert second_refused.is_set()
    assert err.value.body["param"] == "messages[0].content[0]", err.value.body
    assert "first.png could not be fetched" in err.value.body["message"]


def test_requests_waiting_on_remote_images_leave_other_requests_served(checkpoint):
    """Building a prompt runs on a worker thread, and the threads are few (anyio's default, 40): as many requests
    whose image host answers slowly held every one for the download's time limit, and a text-only request waited
    behind them."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import anyio.to_thread
    import httpx

    async def default_threads() -> int:
        return anyio.to_thread.current_default_thread_limiter().total_tokens

    threads = asyncio.run(default_threads())
    release, seen = threading.Event(), threading.Semaphore(0)

    def slow_404(path):
        seen.release()
        release.wait(120)

    policy = MediaFetchPolicy.create(allowed_domains=["127.0.0.1"], timeout_s=120)
    with (live_server(checkpoint, media_policy=policy) as live, ThreadPoolExecutor(threads) as pool,
          _image_host(slow_404) as host):
        slow_url = f"{host}/cat.png"

        def chat(messages, timeout):
            return httpx.post(f"{live.base_url}/chat/completions", timeout=timeout, json={
                "model": "tiny", "messages": messages, "max_tokens": 2, **EXTRA})

        try:
            waiting = [pool.submit(chat, _messages(slow_url), 150) for _ in range(threads)]
            for _ in range(threads):  # every one of them is downloading
                assert seen.acquire(timeout=60)
            answer = chat([{"role": "user", "content": "hi"}], 30)
            assert answer.status_code == 200, answer.text
        finally:
            release.set()
        assert all(request.result().status_code == 400 for request in waiting)


def test_responses_style_parts_in_a_chat_message_are_read_as_vllm_reads_them(client):
    """vLLM's chat takes the Responses API's `input_text` / `output_text` and `input_image` parts (an image_url string,
    its detail beside it); they were a 400, "content parts of type 'input_text' are not supported"."""
    url = _data_url(_png(10))
    chat_parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]
    responses_parts = [{"type": "input_image", "image_url": url, "detail": "auto"},
                       {"type": "input_text", "text": "What is this?"}]
    kwargs = dict(model="tiny", max_tokens=6, temperature=0, extra_body={**EXTRA, "ignore_eos": True})
    replies = [client.chat.completions.create(messages=[
        {"role": "user", "content": "Hi."}, {"role": "assistant", "content": [{"type": kind, "text": "Hello."}]},
        {"role": "user", "content": parts}], **kwargs) for kind, parts in (("text", chat_parts),
                                                                           ("output_text", responses_parts))]
    assert replies[0].usage.prompt_tokens == replies[1].usage.prompt_tokens
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content
    typo = [{"role": "user", "content": [{**responses_parts[0], "detail": "hgih"}]}]
    with pytest.raises(openai.BadRequestError, match=r"content\[0\]\.detail must be one of 'auto'") as e:
        client.chat.completions.create(messages=typo, **kwargs)
    assert e.value.body["param"] == "messages[0].content[0].detail"


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "image_url", "image_url": {"url": ""}}, "messages[0].content[0].image_url.url"),
    ({"type": "image_url", "image_url": " "}, "messages[0].content[0].image_url"),
    ({"type": "video_url", "video_url": {"url": ""}}, "messages[0].content[0].video_url.url")])
def test_an_empty_media_url_is_a_400_saying_so(client, part, param):
    """An empty url was read as a local path: "local files are not allowed; allow a directory with
    --allowed-local-media-path", which sent the client to a server flag for a url its own code left empty."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [part]}], max_tokens=2,
                                       extra_body=EXTRA)
    assert e.value.body["param"] == param
    assert e.value.body["message"] == f"{param} is empty; send a data: URL, a local path or an http(s) URL"


def test_an_empty_input_image_url_is_a_400_saying_so(client):
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.content\[0\]\.image_url is empty; send") as e:
        client.responses.create(model="tiny", max_output_tokens=2, extra_body=EXTRA, input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": ""}]}])
    assert e.value.body["param"] == "input[0].content[0].image_url"
