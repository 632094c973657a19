"""JSON text that stays on one line, for both writers of JSON a line: the server's events (streaming.py) and
`glimmer run-batch`'s output records (cli.py)."""

from __future__ import annotations

import json
from typing import Any

# U+2028, U+2029 and NEL end a line for str.splitlines, where httpx's `iter_lines()` (and so many an SSE client) splits
# a stream, though SSE splits at CR and LF alone, and so does many a reader of a JSON Lines file (`read_text().
# splitlines()`): escaped, a JSON text stays on its line and reads the same
_LINE_BREAKS_ESCAPED = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def one_line_json(payload: Any, separators: tuple[str, str] | None = None) -> str:
    """`payload` as JSON text (UTF-8's characters as they are) that every reader of lines sees as one line: JSON
    escapes CR and LF, and this U+2028, U+2029 and NEL too. `separators` as json.dumps takes them."""
    text = json.dumps(payload, ensure_ascii=False, separators=separators)
    if "\u2028" in text or "\u2029" in text or "\x85" in text:  # rare: the check costs a fraction of translating
        text = text.translate(_LINE_BREAKS_ESCAPED)
    return text
