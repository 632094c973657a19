"""Conversations → training text with the checkpoint's real chat template, and the spans the model writes.

A conversation is rendered whole with the chat template. The model's part of it is each run of assistant
messages, from right after the `<|start|>assistant` that opens the run (where the server's generation
prompt stops) through the run's last terminator: exactly the text the model generates for that turn.
`check_spans` proves this against the template itself — each span starts where the turn's generation
prompt (`add_generation_prompt=True`) ends and stops where the conversation rendered through that turn
stops — and the pipeline runs it on a sample of every corpus. Turns a client stripped of their reasoning
are context only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from glimmer.protocol import render_chat
from glimmer.train_nano.corpus import Conversation

_BLOCK = re.compile(r"<\|start\|>([a-z]+)")


@dataclass(frozen=True)
class RenderedConversation:
    """The rendered text and the [start, end) character spans that the assistant generates."""

    text: str
    spans: tuple[tuple[int, int], ...]

    def segments(self) -> list[tuple[str, bool]]:
        """The text cut into (piece, trainable) pieces, in order."""
        pieces, position = [], 0
        for start, end in self.spans:
            pieces.append((self.text[position:start], False))
            pieces.append((self.text[start:end], True))
            position = end
        if position < len(self.text):
            pieces.append((self.text[position:], False))
        return [(piece, trainable) for piece, trainable in pieces if piece]


def render(conversation: Conversation, messages: list[dict[str, Any]], template: str, *,
           add_generation_prompt: bool) -> str:
    return render_chat(messages, tools=conversation.tools, template=template,
                       add_generation_prompt=add_generation_prompt,
                       reasoning_strength=conversation.reasoning_strength, **conversation.template_kwargs)


def assistant_runs(messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """[first, end) message indices of each maximal run of assistant messages."""
    runs, index = [], 0
    while index < len(messages):
        if messages[index]["role"] != "assistant":
            index += 1
            continue
        end = index
        while end < len(messages) and messages[end]["role"] == "assistant":
            end += 1
        runs.append((index, end))
        index = end
    return runs


def _text_runs(text: str) -> list[tuple[int, int]]:
    """Character spans of each run of assistant blocks, from after its first `<|start|>assistant`."""
    blocks = [(m.start(), m.end(), m.group(1)) for m in _BLOCK.finditer(text)]
    runs, index = [], 0
    while index < len(blocks):
        if blocks[index][2] != "assistant":
            index += 1
            continue
        end = index
        while end < len(blocks) and blocks[end][2] == "assistant":
            end += 1
        runs.append((blocks[index][1], blocks[end][0] if end < len(blocks) else len(text)))
        index = end
    return runs


def render_conversation(conversation: Conversation, template: str) -> RenderedConversation:
    """Raises ValueError if the rendered text's assistant runs do not match the messages'."""
    text = render(conversation, conversation.messages, template, add_generation_prompt=False)
    message_runs = assistant_runs(conversation.messages)
    text_runs = _text_runs(text)
    if len(text_runs) != len(message_runs):
        raise ValueError(f"the rendered conversation has {len(text_runs)} assistant turns, its messages "
                         f"{len(message_runs)}; a message content holds a <|start|> marker")
    spans = tuple(span for span, (first, end) in zip(text_runs, message_runs, strict=True)
                  if all(conversation.trained[i] for i in range(first, end)))
    return RenderedConversation(text, spans)


def check_spans(conversation: Conversation, rendered: RenderedConversation, template: str) -> None:
    """Raises ValueError unless every span is exactly what the model generates for its turn."""
    spans = iter(rendered.spans)
    for first, end in assistant_runs(conversation.messages):
        if not all(conversation.trained[i] for i in range(first, end)):
            continue
        prompt = render(conversation, conversation.messages[:first], template, add_generation_prompt=True)
        through_turn = render(conversation, conversation.messages[:end], template, add_generation_prompt=False)
        expected = (len(prompt), len(through_turn))
        if next(spans) != expected or not rendered.text.startswith(through_turn) \
                or not through_turn.startswith(prompt):
            raise ValueError(f"assistant turn at message {first}: the training span is not the text generated "
                             f"after the turn's prompt (expected characters {expected})")
