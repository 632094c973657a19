"""ATEM markup that must not show in reasoning or content (P-CHAN-2, P-CHAN-7, issue 8).

Two kinds of text outside tool channels look like ATEM and are not what the reader should see:

- **A tag cut short.** When a body ends (a terminator, a header, the end of the stream) inside something that
  is still becoming an ATEM tag, `Let me check <atem:invoke name="get_wea`, the fragment is the start of a
  call that never happened, not prose. While streaming, such a trailing fragment is held (it is undecided:
  at most `MAX_TAG_CHARACTERS`, under HOLD_MAX); once it completes, a quoted tag is shown verbatim (P-CHAN-2);
  if the body ends first, it is dropped once it names the namespace (`<atem:`, `</atem:`), and shown as the
  text it is before that (`a <`).
- **The remains of an interrupted call.** When a tool channel closes inside an open invoke (a header or
  `to=R<|message|>` inside a parameter value, a terminator; P-ATEM-5), the model usually goes on writing the
  call it was in: the rest of the value, more parameters, the closing tags. That text arrives in the next
  body. In residue mode every ATEM tag is removed with the whitespace after it (and the body's leading
  whitespace), wherever it stands: a reply that starts with prose and then closes the broken call must not
  show `</atem:parameter>`. Text between tags flows on. Residue mode covers the first body after the
  interruption that shows any text; bodies that show nothing pass it on (P-CHAN-7).

Decisions are local and only grow (P-STREAM-2); each `accept` costs O(len(text) + MAX_TAG_CHARACTERS).
"""

from __future__ import annotations

import re

from glimmer.protocol.atem import BLOCK_OPEN, CLOSING_TAGS, INVOKE_OPEN, PARAMETER_OPEN
from glimmer.protocol.tokens import FRAMING_MARKERS, HEADER_SPAN, HOLD_MAX, MESSAGE, RECIPIENT_MAX

NAME_CHARACTERS = RECIPIENT_MAX
"""Longest name attribute a tag is waited for with: a declared tool's whole name (P-REQ-8)."""

_NAMED_OPENERS = (INVOKE_OPEN, PARAMETER_OPEN)
_FIXED_TAGS = (*CLOSING_TAGS, BLOCK_OPEN)
_NAME = f'[^"<>]{{0,{NAME_CHARACTERS}}}'
_TAG = re.compile("|".join([*(re.escape(tag) for tag in _FIXED_TAGS),
                            *(re.escape(opener) + _NAME + '">' for opener in _NAMED_OPENERS)]))
_PARTIAL_NAME = re.compile(f'{_NAME}"?')
_WHITESPACE = re.compile(r"\s*")
_NAMESPACES = ("<atem:", "</atem:")

MAX_TAG_CHARACTERS = max(len(opener) for opener in _NAMED_OPENERS) + NAME_CHARACTERS + 2
# While a fragment is held, the parser may hold a header candidate after it (up to HEADER_SPAN + len(MESSAGE) - 1
# characters, P-HDR-3) and MarkerSafeText the start of a marker's completion before it: all three are undecided
# text at once, and together stay within HOLD_MAX (P-STREAM-4).
HELD_AT_ONCE_MAX = MAX_TAG_CHARACTERS + HEADER_SPAN + len(MESSAGE) - 1 + max(map(len, FRAMING_MARKERS)) - 2
assert HELD_AT_ONCE_MAX <= HOLD_MAX


def could_become_tag(text: str) -> bool:
    """True when `text` (starting with `<`) is a proper prefix of an ATEM tag."""
    if any(len(text) < len(tag) and tag.startswith(text) for tag in _FIXED_TAGS):
        return True
    for opener in _NAMED_OPENERS:
        if opener.startswith(text):
            return True
        if text.startswith(opener) and _PARTIAL_NAME.fullmatch(text, len(opener)):
            return True
    return False


def trailing_tag_start(text: str) -> int:
    """Where a trailing fragment that may still become an ATEM tag starts in `text`, or -1."""
    start = text.rfind("<", max(0, len(text) - MAX_TAG_CHARACTERS))
    return start if start >= 0 and could_become_tag(text[start:]) else -1


class AtemMarkupFilter:
    """The ATEM rules for the decided text of reasoning and content bodies, one body at a time."""

    __slots__ = ("_held", "_residue", "_dropping_whitespace", "_showed_text")

    def __init__(self) -> None:
        self._held = ""
        self._residue = False
        self._dropping_whitespace = False
        self._showed_text = False

    @property
    def residue(self) -> bool:
        """Watching for the remains of an interrupted call."""
        return self._residue

    @property
    def is_settled(self) -> bool:
        """Nothing held and no residue watch: text without a trailing tag fragment passes as it is."""
        return not self._held and not self._residue

    def start_residue(self) -> None:
        """A tool channel closed inside an open invoke: the next bodies may hold its remains."""
        self._residue = True
        self._dropping_whitespace = True
        self._showed_text = False

    def end_residue(self) -> None:
        """The watch is over (a tool body took it on and began with other text)."""
        self._residue = False
        self._dropping_whitespace = False

    def accept(self, text: str) -> list[str]:
        """The parts of the body's next decided text to show now, in order. Text on either side of a removed tag is
        a part of its own: joined, the halves could spell a framing marker (`<|eo` + `</atem:invoke>` + `t|>`), which
        the channel's MarkerSafeText catches only between parts (P-CHAN-6)."""
        text = self._held + text
        self._held = ""
        end = len(text)
        fragment = trailing_tag_start(text)
        if fragment >= 0:
            self._held = text[fragment:]
            end = fragment
        if not self._residue:
            return [text[:end]]
        shown = []
        position = 0
        while position < end:
            if self._dropping_whitespace:
                position = _WHITESPACE.match(text, position, end).end()
                if position == end:
                    break
                self._dropping_whitespace = False
            tag = _TAG.search(text, position, end)
            if tag is None:
                shown.append(text[position:end])
                break
            shown.append(text[position:tag.start()])
            position = tag.end()
            self._dropping_whitespace = True
        shown = [part for part in shown if part]
        if shown:
            self._showed_text = True
        return shown

    def end_body(self) -> str:
        """The body ended. Returns held text to show after all: a fragment too short to name ATEM (`<`, `</at`)
        is text (P-STREAM-6); one that does (`<atem:inv`) never became a tag and is dropped. A residue watch
        ends with the first body that showed text."""
        held, self._held = self._held, ""
        if held.startswith(_NAMESPACES):
            held = ""
        if self._residue and (self._showed_text or held):
            self.end_residue()
        self._dropping_whitespace = self._residue
        return held
