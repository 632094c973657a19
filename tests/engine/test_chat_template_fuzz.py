"""Differential fuzz test of chat rendering (P-TMPL-2, P-TMPL-4, P-TMPL-6): seeded random conversations (chat_fuzz.py),
rendered by Glimmer's path (`LLM.get_tokenizer().apply_chat_template` and `LLM.chat`, the path the server's also takes,
and `glimmer.protocol.render_chat`) and by transformers' `apply_chat_template` on the checkpoint's own template, must
give the same token ids. Conversations go to Glimmer as OpenAI clients send them and to transformers as P-TMPL-6 and
P-EFF-2 normalize them, so each difference is a normalization or rendering defect. The run is bounded: a fixed number
of seeded cases, a few seconds in all."""

from __future__ import annotations

import pytest
from chat_fuzz import cases
from transformers import AutoTokenizer

from glimmer import LLM, SamplingParams
from glimmer.default_model import default_model_dir
from glimmer.protocol import (
    DEFAULT_SPECIAL_TOKENS,
    builtin_template_source,
    normalize_messages,
    normalize_tools,
    render_chat,
)

transformers_templates = pytest.importorskip("transformers.utils.chat_template_utils")


@pytest.fixture(scope="module", params=["tiny", "glimmer-nano"])
def checkpoint(request, tiny_checkpoint):
    """The tiny test checkpoint (byte-level test tokenizer) and the embedded glimmer-nano (its trained BPE)."""
    return tiny_checkpoint if request.param == "tiny" else default_model_dir()


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(str(checkpoint), device="cpu", progress=False, kv_cache_memory=16 << 20, max_model_len=4096)


@pytest.fixture(scope="module")
def hf(checkpoint):
    return AutoTokenizer.from_pretrained(checkpoint)


@pytest.mark.parametrize("media", [False, True], ids=["text", "media"])
def test_glimmer_token_ids_equal_transformers_for_random_conversations(llm, hf, media):
    """P-TMPL-2, P-TMPL-5, P-TMPL-6: same ids as transformers on the normalized conversation, with the generation
    prompt (P-TMPL-8), without it, or continuing a final assistant answer; `image_url`/`video_url` parts give the
    `<|patch|>`/`<|video|>` ids (P-TOK-4; apply_chat_template does not expand them)."""
    tok = llm.get_tokenizer()
    for case in cases(media=media):
        ours = tok.apply_chat_template(case.sent, tools=case.tools, return_dict=False, **case.ending, **case.knobs)
        reference = hf.apply_chat_template(case.expected, tools=case.tools, return_dict=False, **case.ending,
                                           **case.kwargs)
        assert ours == reference, case


def test_llm_chat_prompts_equal_transformers_for_random_conversations(llm, hf):
    """`LLM.chat` prompts the model with transformers' ids for the same conversations (one token generated each)."""
    chats = [case for case in cases(media=False) if case.ending == {"add_generation_prompt": True}][:12]
    for case in chats:
        output = llm.chat(case.sent, SamplingParams(max_tokens=1), tools=case.tools, chat_template_kwargs=case.knobs,
                          use_tqdm=False)[0]
        reference = hf.apply_chat_template(case.expected, tools=case.tools, return_dict=False,
                                           add_generation_prompt=True, **case.kwargs)
        assert output.prompt_token_ids == reference, case


def test_protocol_render_chat_equals_transformers_for_random_conversations_with_media():
    """`glimmer.protocol.render_chat` renders the normalized conversation as transformers' template machinery does
    (P-TMPL-2), image and video parts included (P-TOK-4)."""
    template = builtin_template_source()
    for case in cases(media=True):
        tools = normalize_tools(case.tools) if case.tools else None
        ours = render_chat(normalize_messages(case.sent), tools=tools, template=template, **case.kwargs)
        reference, _ = transformers_templates.render_jinja_template(
            [case.expected], tools=case.tools, chat_template=template, add_generation_prompt=True,
            **{**DEFAULT_SPECIAL_TOKENS, **case.kwargs})
        assert ours == reference[0], case


@pytest.mark.parametrize("fields", [{"thinking": "T", "reasoning": "R"}, {"reasoning_content": "C", "reasoning": "R"},
                                    {"thinking": "T", "reasoning_content": "C"}, {"reasoning": "R"}])
def test_reasoning_under_several_names_renders_the_one_transformers_renders(fields):
    """P-TMPL-2, P-TMPL-6: transformers reads a message's reasoning from `reasoning_content`, else `thinking`, else
    `reasoning`; a message with `thinking` and `reasoning` rendered the `reasoning` here, the `thinking` there."""
    template = builtin_template_source()
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A", **fields},
                {"role": "user", "content": "q2"}]
    ours = render_chat(normalize_messages(messages), template=template, current_date="2026-01-01")
    reference, _ = transformers_templates.render_jinja_template(
        [messages], chat_template=template, add_generation_prompt=True, current_date="2026-01-01",
        **DEFAULT_SPECIAL_TOKENS)
    assert ours == reference[0]
