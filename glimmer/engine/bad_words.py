"""vLLM's `bad_words`: the token sequences of the words a request bans, and the ids they ban at a step.

As vLLM (`SamplingParams.update_from_tokenizer`, `v1/sample/ops/bad_words.py`): each word, stripped of leading
whitespace, is tokenized as it is and after a space (" word", the form it takes inside a text); the spaced form
counts where its first token differs from the bare form's and it has as many tokens. A word of one token bans that
token at every step; a longer one bans its last token right after the output's last tokens spell the others (the
output's tokens only, not the prompt's). Words are tokenized as plain text: a special token's spelling is its
characters, so no word bans a special token (a chat reply's framing, a stop id).
"""

from __future__ import annotations

from collections.abc import Sequence

from glimmer.engine.tokenizer import Tokenizer

BadWordIds = tuple[tuple[int, ...], ...]


def bad_word_ids(tokenizer: Tokenizer, words: Sequence[str]) -> BadWordIds:
    """The token sequences `words` ban (vLLM's `_bad_words_token_ids`), without repeats."""
    sequences: dict[tuple[int, ...], None] = {}
    for word in words:
        bare = tuple(tokenizer.encode_text(word.lstrip()))
        spaced = tuple(tokenizer.encode_text(" " + word.lstrip()))
        sequences[bare] = None
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences[spaced] = None
    return tuple(sequences)


def banned_after(sequences: BadWordIds, outputs: Sequence[int]) -> tuple[int, ...]:
    """The ids `sequences` ban as the token after `outputs` (the tokens generated so far)."""
    banned = []
    for ids in sequences:
        prefix = len(ids) - 1
        if prefix <= len(outputs) and (prefix == 0 or tuple(outputs[len(outputs) - prefix:]) == ids[:-1]):
            banned.append(ids[-1])
    return tuple(banned)
