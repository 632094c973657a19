"""The fewest tokens in which a reply can hold a call a forced `tool_choice` asks for (P-REQ-4), to refuse a token
limit below it before generating: such a reply would end, cut short, without the call, a 500.

A text takes its fewest tokens when split into the longest vocabulary entries that fit, which need not be how the
tokenizer encodes it; the grammar lets the model write any split, so the count is the fewest of any split
(`fewest_tokens`), never more than the tokenizer's own encoding."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from glimmer.engine.tokenizer import Tokenizer
from glimmer.protocol.tokens import MESSAGE
from glimmer.protocol.turn_grammar import shortest_kept_calls


def fewest_call_tokens(tools: Sequence[Mapping[str, Any]], tokenizer: Tokenizer) -> int:
    """The fewest tokens of an output holding a call of one of `tools` (normalized), as their turn grammar writes it
    (`shortest_kept_calls`): `<|message|>` one token, each text its fewest (one where no split of the vocabulary
    spells it, which a vocabulary without every byte may lack: the count stays a lower bound). 0 where no call of
    them can be written (a required parameter's name holding `"`, which the turn grammar refuses, naming it): no
    token limit is too low for the call then, the refusal being the grammar's."""
    return min((sum(1 if piece == MESSAGE else fewest_tokens(piece, tokenizer) or 1 for piece in pieces)
                for tool in tools for pieces in shortest_kept_calls(tool)), default=0)


@functools.lru_cache(maxsize=1024)  # an agent sends the same tools with every request
def fewest_tokens(text: str, tokenizer: Tokenizer) -> int | None:
    """The fewest ordinary (non-special) tokens whose bytes spell `text`; None if none do."""
    entries, longest = _text_tokens(tokenizer)
    data = text.encode()
    fewest = [0] + [len(data) + 1] * len(data)  # fewest[i]: tokens spelling data[:i]; len + 1 is "none"
    for end in range(1, len(data) + 1):
        for start in range(max(0, end - longest), end):
            if fewest[start] + 1 < fewest[end] and data[start:end] in entries:
                fewest[end] = fewest[start] + 1
    return fewest[-1] if fewest[-1] <= len(data) else None


@functools.lru_cache(maxsize=4)
def _text_tokens(tokenizer: Tokenizer) -> tuple[frozenset[bytes], int]:
    """The bytes of every ordinary token of `tokenizer` (special ones are never text: engine/grammar.py's token
    table), and the longest."""
    special = set(tokenizer.all_special_ids)
    entries = frozenset(tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size) if i not in special) - {b""}
    return entries, max(map(len, entries))
