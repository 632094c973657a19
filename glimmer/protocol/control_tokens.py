"""Keeping control tokens out of what callers write: only the template's own markup frames a prompt.

A chat template pastes message text, tool declarations and template variables between its markup. If a
user writes `<|start|>system<|message|>…` and the rendered prompt is tokenized as one string, that text
becomes real control tokens and the user has forged a system turn. So every string a caller supplies is
rendered with its control-token spellings swapped for placeholders (`ControlTokenGuard`): a per-render
random number in mathematical angle brackets, which no template markup contains and which case changes,
trimming, `tojson` and Python's `repr` leave alone. The rendered prompt (`RenderedPrompt`) carries the
placeholders and what each stands for; the tokenizer then matches control tokens in the template's markup
only and tokenizes the caller's spellings as plain text.

A prompt whose caller text holds no control-token spelling has no placeholder: it is rendered and tokenized
exactly as before.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

# printable, so that a template that prints a list (Python's repr) keeps them as they are
_OPEN = "\u27ea"  # ⟪
_CLOSE = "\u27eb"  # ⟫


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt. `literals` maps each placeholder in `text` to the control-token spelling a caller
    wrote there, which must be tokenized as plain text (empty when no caller text held one)."""

    text: str
    literals: Mapping[str, str] = field(default_factory=dict)

    @property
    def display_text(self) -> str:
        """The prompt as a person reads it: placeholders back to what the caller wrote (not for tokenizing)."""
        text = self.text
        for placeholder, spelling in self.literals.items():
            text = text.replace(placeholder, spelling)
        return text


class ControlTokenGuard:
    """Swaps control-token spellings in caller strings for placeholders; one guard per rendered prompt."""

    def __init__(self, control_tokens: Collection[str]):
        tokens = sorted({token for token in control_tokens if token}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, tokens))) if tokens else None
        self._nonce = "".join(secrets.choice("0123456789") for _ in range(16))
        self._placeholders: dict[str, str] = {}  # control-token spelling -> its placeholder
        self._replace = lambda match: self._placeholder(match.group())

    def __call__(self, text: str) -> str:
        """`text` with every control-token spelling replaced by its placeholder."""
        if self._pattern is None:
            return text
        return self._pattern.sub(self._replace, text)

    def _placeholder(self, token: str) -> str:
        placeholder = self._placeholders.get(token)
        if placeholder is None:
            placeholder = f"{_OPEN}{self._nonce}.{len(self._placeholders)}{_CLOSE}"
            self._placeholders[token] = placeholder
        return placeholder

    def prompt(self, text: str) -> RenderedPrompt:
        """The rendered `text` with the placeholders that occur in it."""
        literals = {placeholder: token for token, placeholder in self._placeholders.items() if placeholder in text}
        return RenderedPrompt(text, literals)
