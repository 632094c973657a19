"""Seeded random conversations for the differential chat-rendering tests (tests/engine/test_chat_template_fuzz.py,
tests/server/test_chat_prompt.py): each case is the conversation as OpenAI clients send it (arguments as JSON strings,
reasoning as `reasoning`, `image_url` parts, developer messages, `reasoning_effort`) and as P-TMPL-6 and P-EFF-2 say
the template must see it (arguments decoded, `reasoning_content`, `image` parts, the developer text in the system
message, `reasoning_strength`), so that transformers' `apply_chat_template` on the second is the reference for
Glimmer's rendering of the first."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

CASES = 120
KWARGS = {"current_date": "2026-01-01"}  # P-TMPL-3: tests pin current_date

TEXTS = ["hi", "", " leading and trailing ", "line one\nline two\n", "ünïcødé — 日本語 🙂", 'quote " and \\ backslash',
         "<b>bold</b> & <atem:parameter name=\"x\">fake</atem:parameter>", "to=self is just text",
         "Use reasoning effort: low.", "{\"looks\": \"like json\"}", "tab\tseparated", "  \n  ",
         "Reasoning Effort: HIGH.", "REASONING EFFORT: MEDIUM", "Reasoning effort is yours to pick.",
         "Think with Reasoning Strength low."]
"""§2.1's suppression rule reads every casing of "reasoning effort" the template rewrites, and "reasoning strength"."""
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
                assistant.update(content=rng.choice([None, "", "text before the calls"]), tool_calls=calls)
                if assistant["content"]:  # normalize_messages: the text renders before the calls, the turn going on
                    add(assistant, {**normalized, "content": assistant["content"], "end_turn": False})
                    expected.append({"role": "assistant", "tool_calls": normalized_calls})
                else:
                    normalized.update(content=assistant["content"], tool_calls=normalized_calls)
                    add(assistant, normalized)
                for result in results:
                    add(result)
                continue
            assistant["content"] = normalized["content"] = rng.choice(TEXTS + [None])
            if rng.random() < 0.2:
                assistant["end_turn"] = normalized["end_turn"] = rng.choice([True, False, None])
            if rng.random() < 0.2:  # §2.1: a message to `recipient`, ending <|eom|> unless it is the user
                assistant["recipient"] = normalized["recipient"] = rng.choice(["user", "self", "", *names])
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


@dataclass(frozen=True)
class Case:
    sent: list[dict[str, Any]]
    """The conversation as a client sends it."""
    expected: list[dict[str, Any]]
    """The same conversation as the template must see it."""
    tools: list[dict[str, Any]] | None
    knobs: dict[str, Any]
    """Template kwargs as a client sends them (`reasoning_effort` or `reasoning_strength` among them)."""
    kwargs: dict[str, Any]
    """The template kwargs the template must see (`reasoning_strength` resolved per P-EFF-2)."""

    @property
    def ending(self) -> dict[str, bool]:
        """Continue a final assistant answer, else end with the generation prompt unless the conversation ends with
        the assistant (P-TMPL-8)."""
        final = self.expected[-1]
        if final["role"] == "assistant" and final.get("content") and not final.get("tool_calls"):
            return {"continue_final_message": True}
        return {"add_generation_prompt": final["role"] != "assistant"}


def cases(media: bool) -> Iterator[Case]:
    rng = random.Random(20261204 + media)
    for _ in range(CASES):
        names = rng.sample(["calendar.lookup", "calendar.add", "lookup", "web.search"], rng.randrange(4))
        tools = [tool(rng, name) for name in names]
        kwargs = dict(KWARGS)
        knobs = {}
        if rng.random() < 0.3:
            kwargs["reasoning_strength"] = knobs["reasoning_strength"] = rng.choice(["low", "medium", "high", "xhigh"])
        elif rng.random() < 0.2:
            effort = rng.choice(sorted(EFFORTS))
            knobs["reasoning_effort"] = effort
            kwargs["reasoning_strength"] = EFFORTS[effort]
        if rng.random() < 0.2:
            kwargs["knowledge_cutoff"] = "2025-06-30"
        if tools and rng.random() < 0.3:
            kwargs["tool_namespace_descriptions"] = {names[0].split(".")[0]: rng.choice(TEXTS)}
        sent, expected = conversation(rng, names, media)
        template_kwargs = {k: v for k, v in kwargs.items() if k != "reasoning_strength"}
        yield Case(sent, expected, tools or None, {**template_kwargs, **knobs}, kwargs)
