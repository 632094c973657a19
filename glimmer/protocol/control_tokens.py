"""Keeping control tokens out of what callers write: only the template's own markup frames a prompt.

A chat template pastes message text, tool declarations and template variables between its markup. If a
user writes `<|start|>system<|message|>…` and the rendered prompt is tokenized as one string, that text
becomes real control tokens and the user has forged a system turn. So every string a caller supplies is
rendered with its control-token spellings swapped for placeholders (`ControlTokenGuard`): a per-render
random number in mathematical angle brackets, which no template markup contains and which case changes,
trimming, `tojson` and Python's `repr` leave alone. The rendered prompt (`RenderedPrompt`) carries the
placeholders and what each stands for; the tokenizer then matches control tokens in the template's markup
only and tokenizes the caller's spellings as plain text.

A template pastes some caller strings side by side (a user message's text parts), so the end of one string is
guarded too: a string that ends in a proper prefix of a control token (`<|eo`) gets a placeholder standing for
nothing after it, or `<|eo` and a next part's `t|>` would join into a real `<|eot|>`.

A prompt whose caller text holds no control-token spelling (nor a string ending in the start of one) has no
placeholder: it is rendered and tokenized exactly as before.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

# printable, so that a template that prints a list (Python's repr) keeps them as they are
_OPEN = "\u27ea"  # ⟪
_CLOSE = "\u27eb"  # ⟫


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt. `literals` maps each placeholder in `text` to the control-token spelling a caller
    wrote there, which must be tokenized as plain text, or to "" where it only keeps a caller string that ends in the
    start of one from the text after it (empty when no caller text held either)."""

    text: str
    literals: Mapping[str, str] = field(default_factory=dict)

    @property
    def display_text(self) -> str:
        """The prompt as a person reads it: placeholders back to what the caller wrote (not for tokenizing)."""
        text = self.text
        for placeholder, spelling in self.literals.items():
            text = text.replace(placeholder, spelling)
        return text


@dataclass(frozen=True)
class _Spellings:
    """What a guard looks for, derived once per tokenizer (thousands of reserved tokens), not per prompt."""

    pattern: re.Pattern[str] | None
    """Any control-token spelling, the longest first."""
    prefixes: frozenset[str]
    """Every proper prefix of one."""
    longest_prefix: int
    first_characters: re.Pattern[str] | None
    """A character a prefix may start with: a tail without any ends in no prefix (the common case, checked first)."""


@lru_cache(maxsize=8)
def _spellings(control_tokens: tuple[str, ...]) -> _Spellings:
    tokens = sorted({token for token in control_tokens if token}, key=len, reverse=True)
    if not tokens:
        return _Spellings(None, frozenset(), 0, None)
    return _Spellings(re.compile("|".join(map(re.escape, tokens))),
                      frozenset(token[:cut] for token in tokens for cut in range(1, len(token))), len(tokens[0]) - 1,
                      re.compile(f"[{''.join(sorted({re.escape(token[0]) for token in tokens}))}]"))


class ControlTokenGuard:
    """Swaps control-token spellings in caller strings for placeholders; one guard per rendered prompt."""

    def __init__(self, control_tokens: Collection[str]):
        self._spellings = _spellings(tuple(control_tokens))
        self._nonce = "".join(secrets.choice("0123456789") for _ in range(16))
        self._placeholders: dict[str, str] = {}  # control-token spelling (or "") -> its placeholder
        self._replace = lambda match: self._placeholder(match.group())

    def __call__(self, text: str) -> str:
        """`text` with every control-token spelling replaced by its placeholder, and the placeholder of nothing after
        a trailing proper prefix of one (the text pasted next cannot complete it; put before trailing whitespace, which
        a template may trim)."""
        spellings = self._spellings
        if spellings.pattern is None:
            return text
        text = spellings.pattern.sub(self._replace, text)
        end = len(text.rstrip())
        start = spellings.first_characters.search(text, max(0, end - spellings.longest_prefix), end)
        if start is not None and any(text[cut:end] in spellings.prefixes for cut in range(start.start(), end)):
            return text[:end] + self._placeholder("") + text[end:]
        return text

    def _placeholder(self, token: str) -> str:
        placeholder = self._placeholders.get(token)
        if placeholder is None:
            placeholder = f"{_OPEN}{self._nonce}.{len(self._placeholders)}{_CLOSE}"
            self._placeholders[token] = placeholder
        return placeholder

    def prompt(self, text: str) -> RenderedPrompt:
        """The rendered `text` with the placeholders that occur in it. The placeholder of nothing is taken out again
        where the text without it holds the same control tokens at the same places (no caller string joined the
        next into one): a prompt with a placeholder is tokenized piece by piece, which some tokenizers do otherwise
        than the whole text (a Metaspace that prefixes only the first piece), and text ending in `<` is common."""
        separator = self._placeholders.get("")
        if separator is not None and separator in text:
            joined = text.replace(separator, "")
            if self._control_tokens_at(joined) == self._control_tokens_at(text, separator):
                text = joined
        literals = {placeholder: token for token, placeholder in self._placeholders.items() if placeholder in text}
        return RenderedPrompt(text, literals)

    def _control_tokens_at(self, text: str, removed: str = "") -> list[tuple[int, str]]:
        """(start, spelling) of each control token in `text`, a start counted as if every `removed` were taken out."""
        cuts = [match.start() for match in re.finditer(re.escape(removed), text)] if removed else []
        found, passed = [], 0
        for match in self._spellings.pattern.finditer(text):
            while passed < len(cuts) and cuts[passed] < match.start():
                passed += 1
            found.append((match.start() - passed * len(removed), match.group()))
        return found
