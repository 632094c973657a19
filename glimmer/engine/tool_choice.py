"""Steering a generation into a tool call, for `tool_choice` `required` or a named function (P-REQ-4, P-REQ-5).

Muse Glimmer writes calls as ATEM blocks in tool channels, never as JSON, so no JSON grammar is involved: the
controller constrains only the channel structure and lets the model write the ATEM body itself.

- At the turn start the prompt ends with `<|start|>assistant`, so the first header is bare: ` to=R<|message|>`.
  After each `<|eom|>` the next header is `<|start|>assistant to=R<|message|>`. At these decision points the
  only allowed continuations are the canonical tokenizations of a reasoning header (`to=self`) or of the header
  of an allowed tool (named: that function; required: every declared tool). Both header sets are token tries
  built once per request.
- Inside a message body the turn may not end (`<|eot|>`, eos and the other stop ids), and `<|start|>` and
  `<|message|>` are refused too: a body ends only at `<|eom|>`, so no `to=user` answer can be opened, neither
  by a header nor by a headerless switch (P-HDR-7).
- Once the turn holds a valid call of an allowed tool (the output parser's `valid_call_names`, P-NAME-3), the
  controller lets go and the model finishes the turn as it likes.

If the budget runs out first (max_tokens), the response has no valid call; the server then fails the request
(P-REQ-4). Each call costs O(1) amortized: a trie step, or one token through the detokenizer and the parser.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from glimmer.engine.detokenizer import IncrementalDetokenizer
from glimmer.engine.tokenizer import Tokenizer
from glimmer.protocol import OutputParser
from glimmer.protocol.tokens import BOS, EOM, EOS, EOT, MESSAGE, START

logger = logging.getLogger(__name__)

REASONING_RECIPIENT = "self"


@dataclass
class _TrieNode:
    children: dict[int, _TrieNode] = field(default_factory=dict)
    allowed: list[int] = field(default_factory=list)  # the children's ids, computed once


def _build_trie(sequences: Iterable[list[int]]) -> _TrieNode:
    root = _TrieNode()
    for ids in sequences:
        node = root
        for token_id in ids:
            node = node.children.setdefault(token_id, _TrieNode())
    pending = [root]
    while pending:
        node = pending.pop()
        node.allowed = list(node.children)
        pending.extend(node.children.values())
    return root


class ToolChoiceSteering:
    """What steering needs from one tokenizer, resolved once (P-TOK-1): framing ids and the body allow-list.

    Build one per engine and ask it for a controller factory per request.
    """

    def __init__(self, tokenizer: Tokenizer, stop_token_ids: Iterable[int]):
        """Raises ConfigError when the tokenizer lacks one of the framing tokens."""
        self.tokenizer = tokenizer
        self.eom_id = tokenizer.require_token_id(EOM)
        refused = {tokenizer.require_token_id(token) for token in (EOT, EOS, START, MESSAGE, BOS)}
        refused.update(stop_token_ids)
        refused.discard(self.eom_id)
        self.body_refused: tuple[int, ...] = tuple(sorted(refused))

    def controller_factory(
        self, tools: list[Mapping[str, Any]], allowed_names: list[str]
    ) -> Callable[[], ToolChoiceController]:
        """Controllers (one per completion) that force a call of one of `allowed_names`, declared in `tools`."""
        recipients = [REASONING_RECIPIENT, *allowed_names]
        encode = self.tokenizer.encode
        first_header = _build_trie(encode(f" to={name}{MESSAGE}") for name in recipients)
        next_header = _build_trie(encode(f"{START}assistant to={name}{MESSAGE}") for name in recipients)
        return lambda: ToolChoiceController(self, first_header, next_header, tools, allowed_names)


class ToolChoiceController:
    """Steers one completion until it holds a valid call of an allowed tool (a `TokenController`)."""

    def __init__(self, steering: ToolChoiceSteering, first_header: _TrieNode, next_header: _TrieNode,
                 tools: list[Mapping[str, Any]], allowed_names: list[str]):
        self._steering = steering
        self._next_header = next_header
        self._header: _TrieNode | None = first_header  # inside a forced header, else in a body
        self._allowed_names = frozenset(allowed_names)
        self._parser = OutputParser(tools)
        self._detokenizer = IncrementalDetokenizer(steering.tokenizer)
        self.satisfied = False

    def allowed_token_ids(self) -> list[int] | None:
        if self.satisfied or self._header is None:
            return None
        return self._header.allowed

    def banned_token_ids(self) -> tuple[int, ...]:
        if self.satisfied or self._header is not None:
            return ()
        return self._steering.body_refused

    def observe(self, token_id: int) -> bool:
        if self.satisfied:
            return False
        try:
            self._advance(token_id)
        except Exception:  # runs on the engine thread: a bug here must not stop the engine for everyone
            logger.exception("tool_choice steering failed; the completion continues unconstrained")
            self.satisfied = True
        return False

    def _advance(self, token_id: int) -> None:
        if self._header is not None:
            node = self._header.children.get(token_id)
            self._header = node if node is not None and node.children else None
        elif token_id == self._steering.eom_id:
            self._header = self._next_header
        self._parser.feed(self._detokenizer.add(token_id))
        if not self._allowed_names.isdisjoint(self._parser.valid_call_names):
            self.satisfied = True
