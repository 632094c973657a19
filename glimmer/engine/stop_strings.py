"""Stop-string matching over streamed text that never retracts what it released.

Text that could still be the start of a stop string is held back; once a stop string appears, the
text before it (and, if asked, the stop string) is released and generation ends. Each call costs
O(len(new text) + longest stop string).

Of overlapping stop strings, the one that ends first wins, and of those that end at one place the longest (the
earliest to start): what matching after each character finds, so the text cut does not depend on how it came in
tokens (`["bc", "abcd"]` cuts "abcd" before "bc" whether it came as one token or four). vLLM takes the first in the
list among those its last token completed; OpenAI documents only that the text stops at a stop sequence.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stop: list[str], include_in_output: bool = False):
        self.stop = stop
        self.include_in_output = include_in_output
        self._pending = ""

    def feed(self, text: str, *, armed: bool = True) -> tuple[str, str | None]:
        """Add decoded text; returns (text safe to release, the stop string matched or None).

        Unarmed text (the first `min_tokens` tokens') matches nothing, as in vLLM, where a stop string counts
        only if it ends in a token after the min_tokens-th; its tail that could start one is held as usual,
        so a stop string that ends in armed text is cut cleanly."""
        if not self.stop:
            return text, None
        buffer = self._pending + text
        found = []
        for s in self.stop if armed else ():
            # it must end in `text`: the held text may hold a whole stop string from unarmed text (a prefix of a
            # longer one), which counts no more than it did then
            at = buffer.find(s, max(0, len(self._pending) - len(s) + 1))
            if at >= 0:
                found.append((at, s))
        match = first_to_end(found)
        if match is not None:
            at, s = match
            self._pending = ""
            return buffer[: at + len(s)] if self.include_in_output else buffer[:at], s
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(buffer)), hold, -1):
                if buffer.endswith(s[:k]):
                    hold = k
                    break
        self._pending = buffer[len(buffer) - hold :]
        return buffer[: len(buffer) - hold], None

    def flush(self) -> str:
        """Release whatever was held back (generation ended for another reason)."""
        pending, self._pending = self._pending, ""
        return pending


def first_to_end(found: list[tuple[int, str]]) -> tuple[int, str] | None:
    """Of stop strings `found` (where each starts, the string), the one that ends first, of those ending at one place
    the one that starts first; None if none was found."""
    return min(found, key=lambda item: (item[0] + len(item[1]), item[0]), default=None)
