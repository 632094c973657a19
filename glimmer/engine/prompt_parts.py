"""What made a chat prompt long, part by part, for a context-length refusal to name (`PromptPart`): the server's
/v1/chat/completions (and /v1/responses through it) and `LLM.chat` measure the same parts the same way.

A part is what the rendered conversation loses without it: `tools`, `chat_template_kwargs`, each system message
(`messages[i]`; more than four together, `system messages`), template variables a caller names on their own
(`LLM.chat`'s `documents`) and messages a caller groups under a name (/v1/responses' `previous_response_id`, the
conversation it continues); `messages` is the rest, the template's own markup included. A part the template cannot
render without is left out (counted in `messages`). Each part costs one more render: for a refused prompt only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from glimmer.engine.chat_rendering import ChatRendering, render_conversation
from glimmer.errors import PromptPart, RequestError
from glimmer.protocol import ChatTemplateError, RenderedPrompt

_SYSTEM_ROLES = ("system", "developer")
_MEASURED_ONE_BY_ONE = 4  # system messages measured each on its own; more are measured together (a render each)


@dataclass(frozen=True)
class MessageGroup:
    """Messages a caller measures together as one part (`removable_parts`' groups): their `indices`, and the `fix` a
    refusal whose largest part they are gives (`PromptPart.fix`), in the caller's words."""

    indices: Collection[int]
    fix: str | None = None


def prompt_text_parts(messages: list[dict[str, Any]], rendering: ChatRendering, tokenizer: Any,
                      own_kwargs: Mapping[str, str] | None = None,
                      groups: Mapping[str, MessageGroup] | None = None) -> list[PromptPart]:
    """The parts counted in characters of the rendered text, for a prompt refused before it is tokenized
    (`PromptTextTooLongError`): tokenizing a text too long for any context is the work that refusal saves.
    `own_kwargs` and `groups`: see `removable_parts`."""
    measured = removable_parts(messages, rendering, tokenizer, lambda rendered: len(rendered.text), own_kwargs,
                               groups)
    if measured is None:
        return []
    whole, parts = measured
    return [*parts, PromptPart("messages", whole - sum(max(part.size, 0) for part in parts), "messages")]


def removable_parts(messages: list[dict[str, Any]], rendering: ChatRendering | None, tokenizer: Any,
                    size: Callable[[RenderedPrompt], int], own_kwargs: Mapping[str, str] | None = None,
                    groups: Mapping[str, MessageGroup] | None = None) -> tuple[int, list[PromptPart]] | None:
    """The `size` of the whole rendered conversation, and of what `tools`, the template variables and each system
    message add to it; None where it cannot be rendered again. `own_kwargs`: template variables measured as parts of
    their own, by the name (and param) a refusal gives them; the others are `chat_template_kwargs`. `groups`: runs of
    messages (by index, from the first to the last) measured together as a part of their own, by the name (and param)
    a refusal gives them: what the conversation rendered through the run adds to it rendered up to the run, without
    a generation prompt; a system message among them is not measured apart."""

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
    grouped = {i for group in (groups or {}).values() for i in group.indices}
    system = [i for i, message in enumerate(messages)
              if isinstance(message, dict) and message.get("role") in _SYSTEM_ROLES and i not in grouped]
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
    for group in [[i] for i in system] if len(system) <= _MEASURED_ONE_BY_ONE else [system]:
        name = f"messages[{group[0]}]" if len(group) == 1 else "system messages"
        removals.append((name, name if len(group) == 1 else "messages", rendering,
                         [message for i, message in enumerate(messages) if i not in group]))
    parts = []
    for part_name, param, part_rendering, conversation in removals:
        shorter = size_without(part_rendering, conversation)
        if shorter is not None:
            parts.append(PromptPart(part_name, whole - shorter, param))
    # a group is measured in place, as the history it is: the prompt without it could not be rendered where a message
    # after it answers a call it made (/v1/responses' agent loop, an input opening with a function_call_output)
    history = replace(rendering, generation_prompt=False, continue_final_message=False)
    for name, group in (groups or {}).items():
        if group.indices:
            through = size_without(history, messages[:max(group.indices) + 1])
            before = size_without(history, messages[:min(group.indices)])
            if through is not None and before is not None:
                parts.append(PromptPart(name, through - before, name, group.fix))
    return whole, parts
