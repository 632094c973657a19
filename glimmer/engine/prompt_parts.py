"""What made a chat prompt long, part by part, for a context-length refusal to name (`PromptPart`): the server's
/v1/chat/completions (and /v1/responses through it) and `LLM.chat` measure the same parts the same way.

A part is what the rendered conversation loses without it: `tools`, `chat_template_kwargs`, each system message
(`messages[i]`; more than four together, `system messages`), and template variables a caller names on their own
(`LLM.chat`'s `documents`); `messages` is the rest, the template's own markup included. A part the template cannot
render without is left out (counted in `messages`). Each part costs one more render: for a refused prompt only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from glimmer.engine.chat_rendering import ChatRendering, render_conversation
from glimmer.errors import PromptPart, RequestError
from glimmer.protocol import ChatTemplateError, RenderedPrompt

_SYSTEM_ROLES = ("system", "developer")
_MEASURED_ONE_BY_ONE = 4  # system messages measured each on its own; more are measured together (a render each)


def prompt_text_parts(messages: list[dict[str, Any]], rendering: ChatRendering, tokenizer: Any,
                      own_kwargs: Mapping[str, str] | None = None) -> list[PromptPart]:
    """The parts counted in characters of the rendered text, for a prompt refused before it is tokenized
    (`PromptTextTooLongError`): tokenizing a text too long for any context is the work that refusal saves.
    `own_kwargs`: see `removable_parts`."""
    measured = removable_parts(messages, rendering, tokenizer, lambda rendered: len(rendered.text), own_kwargs)
    if measured is None:
        return []
    whole, parts = measured
    return [*parts, PromptPart("messages", whole - sum(max(part.size, 0) for part in parts), "messages")]


def removable_parts(messages: list[dict[str, Any]], rendering: ChatRendering | None, tokenizer: Any,
                    size: Callable[[RenderedPrompt], int], own_kwargs: Mapping[str, str] | None = None
                    ) -> tuple[int, list[PromptPart]] | None:
    """The `size` of the whole rendered conversation, and of what `tools`, the template variables and each system
    message add to it; None where it cannot be rendered again. `own_kwargs`: template variables measured as parts of
    their own, by the name (and param) a refusal gives them; the others are `chat_template_kwargs`."""

    def size_without(part_rendering: ChatRendering, conversation: list[dict[str, Any]]) -> int | None:
        try:
            _, rendered, _ = render_conversation(conversation, part_rendering, tokenizer)
        except (RequestError, ChatTemplateError):
            return None
        return size(rendered)

    if rendering is None:
        return None
    whole = size_without(rendering, messages)
    if whole is None:
        return None
    own = own_kwargs or {}
    system = [i for i, message in enumerate(messages)
              if isinstance(message, dict) and message.get("role") in _SYSTEM_ROLES]
    removals = []  # (name, param, the rendering and conversation without the part)
    if rendering.tools:
        removals.append(("tools", "tools", replace(rendering, tools=None), messages))
    if any(key not in own for key in rendering.kwargs):
        kept = {key: value for key, value in rendering.kwargs.items() if key in own}
        removals.append(("chat_template_kwargs", "chat_template_kwargs", replace(rendering, kwargs=kept), messages))
    for key, name in own.items():
        if key in rendering.kwargs:
            kept = {other: value for other, value in rendering.kwargs.items() if other != key}
            removals.append((name, name, replace(rendering, kwargs=kept), messages))
    groups = [[i] for i in system] if len(system) <= _MEASURED_ONE_BY_ONE else [system]
    for group in groups:
        name = f"messages[{group[0]}]" if len(group) == 1 else "system messages"
        removals.append((name, name if len(group) == 1 else "messages", rendering,
                         [message for i, message in enumerate(messages) if i not in group]))
    parts = []
    for part_name, param, part_rendering, conversation in removals:
        shorter = size_without(part_rendering, conversation)
        if shorter is not None:
            parts.append(PromptPart(part_name, whole - shorter, param))
    return whole, parts
