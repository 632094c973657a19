"""Differential fuzz test of chat rendering (P-TMPL-2, P-TMPL-4, P-TMPL-6): seeded random conversations, rendered by
Glimmer's path (`LLM.get_tokenizer().apply_chat_template`, the path of `LLM.chat` and the server, and
`glimmer.protocol.render_chat`) and by transformers' `apply_chat_template` on the tiny checkpoint's own template, must
give the same token ids.

Conversations are sent to Glimmer the way OpenAI clients send them (arguments as JSON strings, reasoning as
`reasoning`, `image_url` parts) and to transformers in the form P-TMPL-6 normalizes them to (arguments decoded,
`reasoning_content`, `image` parts), so each difference is a normalization or rendering defect. The run is bounded:
a fixed number of seeded cases, a few seconds in all."""

from __future__ import annotations

import copy
import json
import random

import pytest
from transformers import AutoTokenizer

from glimmer import LLM
from glimmer.default_model import default_model_dir
from glimmer.protocol import (
    DEFAULT_SPECIAL_TOKENS,
    builtin_template_source,
    normalize_messages,
    normalize_tools,
    render_chat,
)

transformers_templates = pytest.importorskip("transformers.utils.chat_template_utils")

CASES = 120
KWARGS = {"current_date": "2026-01-01"}  # P-TMPL-3: tests pin current_date

TEXTS = ["hi", "", " leading and trailing ", "line one\nline two\n", "ünïcødé — 日本語 🙂", 'quote " and \\ backslash',
         "<b>bold</b> & <atem:parameter name=\"x\">fake</atem:parameter>", "to=self is just text",
         "Use reasoning effort: low.", "{\"looks\": \"like json\"}", "tab\tseparated", "  \n  "]
EFFORTS = {"none": "low", "minimal": "low", "low": "low", "Medium": "medium", "HIGH": "high", "xhigh": "xhigh"}
"""P-EFF-2: `reasoning_effort` (any case) and the `reasoning_strength` the template gets for it."""
SCALARS = [0, -7, 3.5, 2.0, 1e-05, True, False, None, "", "text", "多行\n文本", "<tag>\n</tag>", "true", "123"]


def value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(4 if depth < 3 else 1)
    if kind == 0:
        return rng.choice(SCALARS)
    if kind == 1:
        return [value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(["a", "b", "ключ", "<k>", "k k"]): value(rng, depth + 1) for _ in range(rng.randrange(3))}


def tool(rng: random.Random, name: str) -> dict:
    properties = {
        "s": {"type": "string", "description": rng.choice(TEXTS)},
        "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "o": {"type": "object", "properties": {"deep": {"type": "array", "items": {"$ref": "#/$defs/item"}}}},
        "e": {"enum": ["a", "ü", 1, None]},
    }
    schema = {"type": "object", "properties": dict(rng.sample(sorted(properties.items()), rng.randrange(5))),
              "$defs": {"item": {"type": "string"}}, "required": []}
    function = {"name": name, "description": rng.choice(TEXTS), "parameters": schema}
    return {"type": "function", "function": function} if rng.random() < 0.7 else function


def conversation(rng: random.Random, names: list[str], media: bool) -> tuple[list[dict], list[dict]]:
    """(as sent, as transformers should see it): the same conversation before and after P-TMPL-6."""
    sent, expected = [], []

    def add(message: dict, normalized: dict | None = None) -> None:
        sent.append(message)
        expected.append(message if normalized is None else normalized)

    if rng.random() < 0.5:
        add({"role": "system", "content": rng.choice(TEXTS)})
    counter = 0
    for _ in range(rng.randrange(1, 4)):
        if rng.random() < 0.15:
            add({"role": "system", "content": rng.choice(TEXTS)})
        content = rng.choice(TEXTS)
        if rng.random() < 0.4:
            parts = [{"type": "text", "text": rng.choice(TEXTS)} for _ in range(rng.randrange(1, 3))]
            content, normalized_content = parts, copy.deepcopy(parts)
            if media:
                kind = rng.choice(["image", "video"])
                content.insert(0, {"type": f"{kind}_url", f"{kind}_url": {"url": "http://example.com/x"}})
                normalized_content.insert(0, {**content[0], "type": kind})
            add({"role": "user", "content": content}, {"role": "user", "content": normalized_content})
        else:
            add({"role": "user", "content": content})
        for _ in range(rng.randrange(0, 3)):
            assistant, normalized = {"role": "assistant"}, {"role": "assistant"}
            reasoning = rng.choice([None, "", "thinking\nabout <it>", "🙂 plan"])
            if reasoning is not None:
                field = rng.choice(["reasoning_content", "reasoning"])
                assistant[field] = reasoning
                normalized["reasoning_content"] = reasoning
                if field == "reasoning":
                    normalized["reasoning"] = reasoning
            if names and rng.random() < 0.5:
                calls, normalized_calls, results = [], [], []
                for _ in range(rng.randrange(1, 4)):
                    counter += 1
                    name = rng.choice(names)
                    keys = ["s", "n", "o", "e", "ü", "x y"]
                    arguments = {rng.choice(keys): value(rng) for _ in range(rng.randrange(4))}
                    sent_arguments = json.dumps(arguments, ensure_ascii=rng.random() < 0.5) if rng.random() < 0.7 \
                        else arguments
                    call_id = f"call_{counter}"
                    calls.append({"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": sent_arguments}})
                    normalized_calls.append({"id": call_id, "type": "function",
                                             "function": {"name": name, "arguments": arguments}})
                    result = rng.choice([rng.choice(TEXTS), json.dumps({"ok": value(rng)}, ensure_ascii=False),
                                         [{"type": "text", "text": rng.choice(TEXTS)}]])
                    results.append({"role": "tool", "tool_call_id": call_id, "content": result})
                    if rng.random() < 0.3:
                        results[-1]["name"] = name
                assistant.update(content=rng.choice([None, "", "ignored content"]), tool_calls=calls)
                normalized.update(content=assistant["content"], tool_calls=normalized_calls)
                add(assistant, normalized)
                for result in results:
                    add(result)
                continue
            assistant["content"] = normalized["content"] = rng.choice(TEXTS + [None])
            if rng.random() < 0.2:
                assistant["end_turn"] = normalized["end_turn"] = rng.choice([True, False, None])
            add(assistant, normalized)
            break
    if rng.random() < 0.2:
        # glimmer's developer rule (normalize_messages): its text joins the first system message's, blank line
        # between, in message order; with no system message it becomes one
        developer = {"role": "developer", "content": rng.choice(TEXTS[1:])}
        position = rng.randrange(2)
        sent.insert(position, developer)
        systems = [i for i, message in enumerate(expected) if message["role"] == "system"]
        if not systems:
            expected.insert(position, {"role": "system", "content": developer["content"]})
        else:
            first = expected[systems[0]]["content"]
            texts = (developer["content"], first) if position <= systems[0] else (first, developer["content"])
            expected[systems[0]] = {"role": "system", "content": "\n\n".join(text for text in texts if text)}
    return sent, expected


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


def cases(media: bool):
    rng = random.Random(20261204 + media)
    for _ in range(CASES):
        names = rng.sample(["calendar.lookup", "calendar.add", "lookup", "web.search"], rng.randrange(4))
        tools = [tool(rng, name) for name in names]
        kwargs = dict(KWARGS)
        sent_kwargs = {}
        if rng.random() < 0.3:
            kwargs["reasoning_strength"] = rng.choice(["low", "medium", "high", "xhigh"])
        elif rng.random() < 0.2:
            effort = rng.choice(sorted(EFFORTS))
            sent_kwargs["reasoning_effort"] = effort
            kwargs["reasoning_strength"] = EFFORTS[effort]
        if rng.random() < 0.2:
            kwargs["knowledge_cutoff"] = "2025-06-30"
        if tools and rng.random() < 0.3:
            kwargs["tool_namespace_descriptions"] = {names[0].split(".")[0]: rng.choice(TEXTS)}
        sent, expected = conversation(rng, names, media)
        yield sent, expected, tools or None, {**kwargs, **sent_kwargs}, kwargs


def test_glimmer_token_ids_equal_transformers_for_random_conversations(llm, hf):
    """P-TMPL-2, P-TMPL-5, P-TMPL-6: same ids as transformers on the normalized conversation, generation prompt
    (P-TMPL-8) or not, and continuing a final assistant answer."""
    tok = llm.get_tokenizer()
    for sent, expected, tools, sent_kwargs, kwargs in cases(media=False):
        ending = {"add_generation_prompt": expected[-1]["role"] != "assistant"}
        if expected[-1]["role"] == "assistant" and expected[-1].get("content") and not expected[-1].get("tool_calls"):
            ending = {"continue_final_message": True}
        ours = tok.apply_chat_template(sent, tools=tools, return_dict=False, **ending,
                                       **{k: v for k, v in sent_kwargs.items() if k != "reasoning_strength" or
                                          "reasoning_effort" not in sent_kwargs})
        reference = hf.apply_chat_template(expected, tools=tools, return_dict=False, **ending, **kwargs)
        assert ours == reference, (sent, tools, kwargs, ending)


def test_protocol_render_chat_equals_transformers_for_random_conversations_with_media():
    """`glimmer.protocol.render_chat` renders the normalized conversation as transformers' template machinery does
    (P-TMPL-2), image and video parts included (P-TOK-4)."""
    template = builtin_template_source()
    for sent, expected, tools, _, kwargs in cases(media=True):
        normalized_tools = normalize_tools(tools) if tools else None
        ours = render_chat(normalize_messages(sent), tools=normalized_tools, template=template, **kwargs)
        reference, _ = transformers_templates.render_jinja_template(
            [expected], tools=tools, chat_template=template, add_generation_prompt=True,
            **{**DEFAULT_SPECIAL_TOKENS, **kwargs})
        assert ours == reference[0], (sent, tools, kwargs)
