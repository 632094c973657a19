"""vLLM's `truncate_prompt_tokens` in the Python API: a prompt's last k tokens (-1: max_model_len) are the request's
prompt, token for token what that shorter prompt gives, in its output, its usage and its prompt_logprobs."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

from glimmer import LLM, SamplingParams
from glimmer.errors import ContextLengthError, RequestError
from glimmer.multimodal import DecodedVideo

MAX_MODEL_LEN = 64
PROMPT_IDS = [5, 77, 130, 42, 99, 310, 12, 8, 250, 61, 17, 23]


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(str(tiny_checkpoint), progress=False, kv_cache_memory=16 << 20, max_model_len=MAX_MODEL_LEN)


def _greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, **fields)


@pytest.mark.parametrize("keep", [1, 5, len(PROMPT_IDS) - 1])
def test_the_last_k_token_ids_are_the_prompt(llm, keep):
    truncated = llm.generate(PROMPT_IDS, _greedy(truncate_prompt_tokens=keep, prompt_logprobs=0))[0]
    direct = llm.generate(PROMPT_IDS[-keep:], _greedy(prompt_logprobs=0))[0]
    assert truncated.prompt_token_ids == PROMPT_IDS[-keep:]
    assert truncated.outputs[0].token_ids == direct.outputs[0].token_ids
    assert truncated.prompt_logprobs == direct.prompt_logprobs and len(truncated.prompt_logprobs) == keep


def test_a_text_prompt_keeps_its_last_k_tokens_the_bos_cut_off(llm):
    text = "the quick brown fox jumps over the lazy dog"
    ids = llm.encode_prompt(text)
    truncated = llm.generate(text, _greedy(truncate_prompt_tokens=4))[0]
    direct = llm.generate(ids[-4:], _greedy())[0]
    assert truncated.prompt_token_ids == ids[-4:] and truncated.prompt == text  # vLLM keeps the text as given
    assert truncated.outputs[0].token_ids == direct.outputs[0].token_ids


@pytest.mark.parametrize("keep", [len(PROMPT_IDS), 40, -1])
def test_a_prompt_no_longer_than_k_is_kept_whole(llm, keep):
    truncated = llm.generate(PROMPT_IDS, _greedy(truncate_prompt_tokens=keep))[0]
    assert truncated.prompt_token_ids == PROMPT_IDS
    assert truncated.outputs[0].token_ids == llm.generate(PROMPT_IDS, _greedy())[0].outputs[0].token_ids


def test_minus_one_keeps_max_model_len_tokens(llm):
    """max_model_len tokens leave no room to generate: max_tokens=0 scores them (vLLM's -1 is max_model_len too)."""
    ids = (PROMPT_IDS * 10)[:MAX_MODEL_LEN + 7]
    out = llm.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=0, truncate_prompt_tokens=-1))[0]
    assert out.prompt_token_ids == ids[-MAX_MODEL_LEN:] and len(out.prompt_logprobs) == MAX_MODEL_LEN


@pytest.mark.parametrize("keep", [-1, MAX_MODEL_LEN])
def test_a_cut_that_fills_the_context_is_refused_naming_truncate_prompt_tokens(llm, keep):
    """It said to shorten the prompt, which truncate_prompt_tokens would cut to as many tokens again."""
    with pytest.raises(ContextLengthError) as caught:
        llm.generate((PROMPT_IDS * 10)[:MAX_MODEL_LEN + 7], _greedy(truncate_prompt_tokens=keep))
    assert caught.value.param == "truncate_prompt_tokens"
    assert str(caught.value).endswith(f"kept {MAX_MODEL_LEN} tokens of the prompt, which leave no room to generate; "
                                      f"lower truncate_prompt_tokens to at most {MAX_MODEL_LEN - 1} (-1 keeps "
                                      "max_model_len tokens)")


def test_an_engine_request_that_fills_the_context_uncut_is_not_blamed_on_truncate_prompt_tokens(llm):
    """The engine does not cut a prompt (LLM and the server do, before it): a prompt of max_model_len tokens sent to
    it with truncate_prompt_tokens=10 was refused as "kept 64 tokens ...; lower truncate_prompt_tokens", which no
    value of it would have changed."""
    with pytest.raises(ContextLengthError) as caught:
        llm.engine.add_request("uncut", (PROMPT_IDS * 10)[:MAX_MODEL_LEN], _greedy(truncate_prompt_tokens=10))
    assert caught.value.param != "truncate_prompt_tokens" and "truncate_prompt_tokens" not in str(caught.value)


def test_of_several_prompts_a_cut_that_fills_the_context_names_the_prompt(llm):
    """It did not say which of the prompts truncate_prompt_tokens left no room (/v1/completions says prompt[1])."""
    with pytest.raises(ContextLengthError) as caught:
        llm.generate([PROMPT_IDS, (PROMPT_IDS * 10)[:MAX_MODEL_LEN + 7]], _greedy(truncate_prompt_tokens=-1))
    assert caught.value.param == "truncate_prompt_tokens"
    assert str(caught.value).startswith("prompts[1]: This model's maximum context length is")
    assert not llm.engine.has_unfinished_requests


def test_of_several_conversations_a_cut_that_fills_the_context_names_the_conversation(llm):
    conversation = [{"role": "user", "content": "the quick brown fox " * 20}]
    with pytest.raises(ContextLengthError) as caught:
        llm.chat([conversation, conversation], [_greedy(truncate_prompt_tokens=10), _greedy(truncate_prompt_tokens=-1)])
    assert caught.value.param == "truncate_prompt_tokens"
    assert str(caught.value).startswith("messages[1]: This model's maximum context length is")


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4"])
def test_an_invalid_value_is_refused_naming_it(value):
    with pytest.raises(RequestError) as caught:
        SamplingParams(truncate_prompt_tokens=value)
    assert caught.value.param == "truncate_prompt_tokens" and ">= 1" in str(caught.value)


def test_an_invalid_value_set_after_construction_is_refused_on_submission(llm):
    params = _greedy(truncate_prompt_tokens=4)
    params.truncate_prompt_tokens = 0
    with pytest.raises(RequestError) as caught:
        llm.generate(PROMPT_IDS, params)
    assert caught.value.param == "truncate_prompt_tokens"


def test_more_than_max_model_len_is_refused_naming_it(llm):
    with pytest.raises(RequestError) as caught:
        llm.generate(PROMPT_IDS, _greedy(truncate_prompt_tokens=MAX_MODEL_LEN + 1))
    assert caught.value.param == "truncate_prompt_tokens" and f"max_model_len={MAX_MODEL_LEN}" in str(caught.value)


def test_chat_keeps_the_end_of_the_rendered_prompt(llm):
    """As vLLM's LLM.chat: the rendered conversation's last k tokens, which end with the generation prompt (a
    conversation longer than max_model_len then fits)."""
    messages = [{"role": "user", "content": "tell me about the quick brown fox and the lazy dog"}]
    rendered = llm.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert len(rendered) > MAX_MODEL_LEN
    truncated = llm.chat(messages, _greedy(truncate_prompt_tokens=10))[0]
    assert truncated.prompt_token_ids == rendered[-10:]
    direct = llm.generate(rendered[-10:], _greedy(skip_special_tokens=False))[0]
    assert truncated.outputs[0].token_ids == direct.outputs[0].token_ids


@pytest.fixture(scope="module")
def vision_llm(make_tiny):
    return LLM(str(make_tiny("canonical", vision=True, seed=17)), progress=False, kv_cache_memory=16 << 20,
               max_model_len=512)


def _image() -> Image.Image:
    return Image.fromarray((np.random.RandomState(3).rand(60, 90, 3) * 255).astype("uint8"))


@dataclass(frozen=True)
class ExpandedPrompt:
    """A prompt of one media item, its token ids as the engine expands it, and the positions of the item's first
    start marker and last end marker there."""

    prompt: dict
    ids: list[int]
    first: int
    last: int


def _expanded(llm: LLM, prompt: dict, start: str, end: str) -> ExpandedPrompt:
    ids = llm.generate(prompt, _greedy())[0].prompt_token_ids
    start_id, end_id = llm.get_tokenizer().convert_tokens_to_ids([start, end])
    return ExpandedPrompt(prompt, ids, ids.index(start_id), len(ids) - 1 - ids[::-1].index(end_id))


@pytest.fixture(scope="module")
def image_prompt(vision_llm) -> ExpandedPrompt:
    prompt = {"prompt": "<|begin_of_text|>Describe <|patch|> briefly.", "multi_modal_data": {"image": _image()}}
    return _expanded(vision_llm, prompt, "<|image_start|>", "<|image_end|>")


@pytest.mark.parametrize("where", ["last patch", "image end", "first patch"])
def test_a_cut_inside_an_images_expansion_is_refused_naming_the_field(vision_llm, image_prompt, where):
    """The image is its whole expansion, <|image_start|> + <|patch|> x N + <|image_end|>: a cut that keeps its
    patches without the start marker, or its end marker without the patches, leaves what no prompt holds."""
    ids, first, last = image_prompt.ids, image_prompt.first, image_prompt.last
    keep = {"last patch": len(ids) - last + 1, "image end": len(ids) - last, "first patch": len(ids) - first - 1}[where]
    with pytest.raises(RequestError) as caught:
        vision_llm.generate(image_prompt.prompt, _greedy(truncate_prompt_tokens=keep))
    assert caught.value.param == "truncate_prompt_tokens"
    assert f"keep at most {len(ids) - last - 1} tokens (after it) or at least {len(ids) - first}" in str(caught.value)
    assert not vision_llm.engine.has_unfinished_requests


def test_the_refusals_advice_followed_to_its_exact_numbers_is_taken(vision_llm, image_prompt):
    """The refusal's "keep at most N" leaves the image out whole, its <|image_end|> included, and its "at least M"
    keeps it from its <|image_start|>: each, at its exact value, is served (N + 1 kept a lone end marker)."""
    ids, first, last = image_prompt.ids, image_prompt.first, image_prompt.last
    with pytest.raises(RequestError) as caught:
        vision_llm.generate(image_prompt.prompt, _greedy(truncate_prompt_tokens=len(ids) - first - 1))
    at_most, at_least = map(int, re.search(r"keep at most (\d+) tokens \(after it\) or at least (\d+)",
                                           str(caught.value)).groups())
    after = vision_llm.generate(image_prompt.prompt, _greedy(truncate_prompt_tokens=at_most))[0]
    assert after.prompt_token_ids == ids[last + 1:]
    whole = vision_llm.generate(image_prompt.prompt, _greedy(truncate_prompt_tokens=at_least))[0]
    assert whole.prompt_token_ids == ids[first:]


def test_a_cut_between_a_videos_start_and_its_first_frames_is_refused(vision_llm):
    frames = DecodedVideo((np.random.RandomState(4).rand(4, 56, 56, 3) * 255).astype("uint8"), fps=2.0)
    video = _expanded(vision_llm, {"prompt": "<|begin_of_text|>What happens in <|video|> here?",
                                   "multi_modal_data": {"video": frames}}, "<|vid_start|>", "<|vid_end|>")
    ids, first, last = video.ids, video.first, video.last
    with pytest.raises(RequestError) as caught:
        vision_llm.generate(video.prompt, _greedy(truncate_prompt_tokens=len(ids) - first - 1))
    assert f"keep at most {len(ids) - last - 1} tokens (after it) or at least {len(ids) - first}" in str(caught.value)
    kept = vision_llm.generate(video.prompt, _greedy(truncate_prompt_tokens=len(ids) - first))[0]
    assert kept.prompt_token_ids == ids[first:]


def test_a_kept_image_is_moved_with_its_tokens(vision_llm):
    """Cutting text before the image keeps it, its features on its placeholders: the output is the shorter prompt's."""
    prompt = "<|begin_of_text|>Look closely at this picture now: <|patch|> briefly."
    whole = vision_llm.generate({"prompt": prompt, "multi_modal_data": {"image": _image()}}, _greedy())[0]
    keep = len(whole.prompt_token_ids) - 3
    truncated = vision_llm.generate({"prompt": prompt, "multi_modal_data": {"image": _image()}},
                                    _greedy(truncate_prompt_tokens=keep, prompt_logprobs=0))[0]
    shorter = vision_llm.encode_prompt(prompt)[3:]  # one placeholder, expanded as the text's is
    direct = vision_llm.generate({"prompt_token_ids": shorter, "multi_modal_data": {"image": _image()}},
                                 _greedy(prompt_logprobs=0))[0]
    assert truncated.prompt_token_ids == whole.prompt_token_ids[3:] == direct.prompt_token_ids
    assert truncated.outputs[0].token_ids == direct.outputs[0].token_ids
    assert truncated.prompt_logprobs == direct.prompt_logprobs


def test_an_image_cut_off_whole_is_dropped(vision_llm):
    prompt = "<|begin_of_text|>Describe <|patch|> briefly, in a few plain words please."
    whole = vision_llm.generate({"prompt": prompt, "multi_modal_data": {"image": _image()}}, _greedy())[0]
    truncated = vision_llm.generate({"prompt": prompt, "multi_modal_data": {"image": _image()}},
                                    _greedy(truncate_prompt_tokens=4))[0]
    assert truncated.prompt_token_ids == whole.prompt_token_ids[-4:]
    assert truncated.outputs[0].token_ids == vision_llm.generate(whole.prompt_token_ids[-4:], _greedy())[0] \
        .outputs[0].token_ids


@pytest.mark.parametrize("form", ["text", "dict"])
def test_a_text_longer_than_any_prompt_the_context_holds_is_cut_to_its_last_k_tokens(llm, form):
    """As vLLM tokenizes a prompt of any length and keeps its last k tokens: a text past `max_prompt_chars`, which
    without truncation is refused before it is tokenized, is read (it was refused all the same)."""
    text = "the quick brown fox " * (llm.engine.max_prompt_chars // 20 + 1)
    with pytest.raises(ContextLengthError):
        llm.generate(text, _greedy())
    ids = llm.get_tokenizer().encode(text)
    truncated = llm.generate(text if form == "text" else {"prompt": text}, _greedy(truncate_prompt_tokens=10))[0]
    assert truncated.prompt_token_ids == ids[-10:]
    assert truncated.outputs[0].token_ids == llm.generate(ids[-10:], _greedy())[0].outputs[0].token_ids


def test_chat_of_a_conversation_longer_than_any_prompt_the_context_holds_keeps_its_end(llm):
    """Its end is the end of a shorter conversation of the same repeated words (whose tokens the tokenizer can give:
    the long one's it refuses)."""
    def conversation(repeats: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": "the quick brown fox " * repeats}]

    messages = conversation(llm.engine.max_prompt_chars // 20 + 1)
    with pytest.raises(ContextLengthError):
        llm.chat(messages, _greedy())
    shorter = llm.get_tokenizer().apply_chat_template(conversation(20), add_generation_prompt=True)["input_ids"]
    assert llm.chat(messages, _greedy(truncate_prompt_tokens=10))[0].prompt_token_ids == shorter[-10:]
