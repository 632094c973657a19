"""Reading a message header: the text between `<|start|>` and `<|message|>` (protocol.md §3.1, §4.2).

The prompt ends with `<|start|>assistant`, so the turn's first header is bare (` to=self`); later headers
repeat `assistant`. The recipient decides the channel: `self` is reasoning, `user` or no recipient is
content, anything else is a tool. A header that reads otherwise opens a discarded channel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from glimmer.protocol.tokens import MESSAGE, RECIPIENT_MAX

Channel = Literal["reasoning", "content", "tool", "discarded"]

_RECIPIENT = rf"[^\s<]{{1,{RECIPIENT_MAX}}}"

# P-HDR-2: optional whitespace, optional `assistant`, optional `to=R` (after whitespace when `assistant`
# precedes it), optional whitespace.
_WELL_FORMED_HEADER = re.compile(
    rf"\s*(?:assistant(?:\s+to=(?P<after_role>{_RECIPIENT}))?|to=(?P<bare>{_RECIPIENT}))?\s*"
)

# P-HDR-8: a header for a role the model must not write (it is inventing a user turn or a tool result).
_OTHER_ROLE_HEADER = re.compile(r"\s*(?:user|system|developer|tool)(?:\s|$)")

# P-HDR-7: a headerless switch `to=R<|message|>`; this matches the `to=R` part ending where the marker starts.
HEADERLESS_SWITCH = re.compile(rf"(\s?)to=({_RECIPIENT})\Z")
# Text that may still grow into a headerless switch, at the end of a body: whitespace then a prefix of
# `to=R<|message|>`. The body-start variant has no whitespace.


def _optional_prefixes(literal: str, tail: str = "") -> str:
    """A pattern matching any prefix of `literal` (then, after all of it, an optional `tail`)."""
    pattern = f"(?:{tail})?" if tail else ""
    for character in reversed(literal):
        pattern = f"(?:{re.escape(character)}{pattern})?"
    return pattern


_SWITCH_IN_PROGRESS = _optional_prefixes("to=", f"{_RECIPIENT}{_optional_prefixes(MESSAGE[:-1])}")
SWITCH_PREFIX_AFTER_SPACE = re.compile(rf"\s{_SWITCH_IN_PROGRESS}\Z")
SWITCH_PREFIX_AT_START = re.compile(_SWITCH_IN_PROGRESS)
# P-HDR-6: what a real `<|start|>` header cut off by the end of the stream can look like: a prefix of
# `assistant to=R`.
_ROLE_IN_PROGRESS = _optional_prefixes("assistant")
_RECIPIENT_IN_PROGRESS = _optional_prefixes("to=", _RECIPIENT + r"\s*")
_INTERRUPTED_HEADER = re.compile(
    rf"\s*(?:{_ROLE_IN_PROGRESS}|assistant\s*|assistant\s+{_RECIPIENT_IN_PROGRESS})"
)
SWITCH_PREFIX_SPAN = 1 + len("to=") + RECIPIENT_MAX + len("<|message|>")
"""The longest text that may still turn out to be a headerless switch."""


@dataclass(frozen=True, slots=True)
class Header:
    channel: Channel
    recipient: str | None
    names_other_role: bool = False


def is_valid_recipient(text: str) -> bool:
    """Whether `to=text` is a well-formed header's recipient (P-HDR-2): 1..RECIPIENT_MAX characters, no whitespace or
    `<`."""
    return re.fullmatch(_RECIPIENT, text) is not None


def channel_of_recipient(recipient: str | None) -> Channel:
    if recipient is None or recipient == "user":
        return "content"
    if recipient == "self":
        return "reasoning"
    return "tool"


def read_header(text: str) -> Header:
    """The channel a complete header opens (P-HDR-2); ill-formed headers open a discarded channel."""
    match = _WELL_FORMED_HEADER.fullmatch(text)
    if match is None:
        return Header("discarded", None, names_other_role=_OTHER_ROLE_HEADER.match(text) is not None)
    recipient = match.group("after_role") or match.group("bare")
    return Header(channel_of_recipient(recipient), recipient)


def is_interrupted_header(text: str) -> bool:
    """True when a real header cut off by the end of the stream is a prefix of `assistant to=R` (P-HDR-6)."""
    return _INTERRUPTED_HEADER.fullmatch(text) is not None
