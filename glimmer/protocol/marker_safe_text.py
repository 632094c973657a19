"""Channel text that can never spell a framing marker (P-CHAN-6).

The parser removes markers and drops pieces (a voided `<|start|>`, a stray `<|message|>`, a tool channel
between two content messages), and the text on either side of a removed piece is joined in the channel. Two
halves can then spell a marker: `<|eo` + `<|start|>…` + `m|>`. Emitted text is never retracted (P-STREAM-2),
so the join is checked before the second half goes out: when the channel's emitted text ends with a proper
prefix of a marker, new text that completes the marker loses that completion; new text that might still
complete it is held (at most 16 characters) until it is decided or the stream ends.
"""

from __future__ import annotations

from glimmer.protocol.tokens import FRAMING_MARKERS

_LONGEST_MARKER = max(len(marker) for marker in FRAMING_MARKERS)

# Each proper prefix of a marker (they all start with "<") -> the texts that would complete a marker.
_COMPLETIONS: dict[str, tuple[str, ...]] = {}
for _marker in FRAMING_MARKERS:
    for _cut in range(1, len(_marker)):
        _COMPLETIONS.setdefault(_marker[:_cut], ())
        _COMPLETIONS[_marker[:_cut]] += (_marker[_cut:],)


def open_marker_prefix(text: str) -> str:
    """The suffix of `text` that is a proper prefix of a framing marker, or ""."""
    start = text.rfind("<", max(0, len(text) - _LONGEST_MARKER))
    if start < 0:
        return ""
    suffix = text[start:]
    return suffix if suffix in _COMPLETIONS else ""


class MarkerSafeText:
    """The emitted text of one output channel (reasoning or content)."""

    __slots__ = ("_open_prefix", "_held")

    def __init__(self) -> None:
        self._open_prefix = ""
        self._held = ""

    @property
    def is_settled(self) -> bool:
        """True when nothing is held and the emitted text ends in no marker prefix (any text passes as is)."""
        return not self._open_prefix and not self._held

    def accept(self, text: str) -> str:
        """Append `text` to the channel; returns the part to emit now."""
        if self._open_prefix:
            text = self._held + text
            self._held = ""
            completions = _COMPLETIONS[self._open_prefix]
            removed = True
            while removed and text:
                removed = False
                for completion in completions:
                    if text.startswith(completion):
                        text = text[len(completion):]
                        removed = True
                        break
            if not text:
                return ""
            if any(completion.startswith(text) for completion in completions):
                self._held = text
                return ""
        if "<" in text:
            self._open_prefix = open_marker_prefix(text)
        else:
            self._open_prefix = ""
        return text

    def flush(self) -> str:
        """End of stream: held text could not complete a marker after all."""
        held, self._held = self._held, ""
        return held
