"""Extracting ATEM tool calls from the body of one tool channel (protocol.md §3.2, §4.4).

The output parser hands this class the body text of a tool channel once framing is decided (framing sits
above ATEM: terminators, headers and headerless switches end the body before any tag is looked at), then
`close()` when the body ends. A body holds blocks of invokes:

    <atem:function_calls>
    <atem:invoke name="NAME">
    <atem:parameter name="KEY">VALUE</atem:parameter>
    </atem:invoke>
    </atem:function_calls>

Values are raw text and may contain anything, tag lookalikes included, so closers are positional (P-ATEM-2):
`</atem:parameter>` ends a value only when, after whitespace, a parameter opener, `</atem:invoke>`,
`</atem:function_calls>` or the end of the body follows; `</atem:invoke>` closes only before an invoke
opener, `</atem:function_calls>` or the end of the body. More than 64 whitespace characters of lookahead
count as legal, which bounds what is held. Text outside the tags is ignored with one warning per channel.

A call materializes when its opener is complete and a parameter completes or the invoke closes; from then
on its argument JSON streams, one completed parameter at a time (P-ATEM-4). A body that ends inside an
open invoke keeps a materialized call with closed JSON and drops an unmaterialized one (P-ATEM-5).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from glimmer.protocol.call_ledger import CallLedger
from glimmer.protocol.tokens import MESSAGE
from glimmer.protocol.tool_registry import ToolRegistry
from glimmer.protocol.value_typing import parameter_value_json

logger = logging.getLogger(__name__)

BLOCK_OPEN = "<atem:function_calls>"
BLOCK_CLOSE = "</atem:function_calls>"
INVOKE_OPEN = '<atem:invoke name="'
INVOKE_CLOSE = "</atem:invoke>"
PARAMETER_OPEN = '<atem:parameter name="'
PARAMETER_CLOSE = "</atem:parameter>"
CLOSING_TAGS = (PARAMETER_CLOSE, INVOKE_CLOSE, BLOCK_CLOSE)

LOOKAHEAD_WHITESPACE_MAX = 64
"""More whitespace than this after a closer counts as a legal closer (P-ATEM-2)."""
NAME_MAX = 256
"""A name attribute longer than this is not a name: the opener is ignored."""

_PARAMETER_CLOSE_FOLLOWERS = (PARAMETER_OPEN, INVOKE_CLOSE, BLOCK_CLOSE)
_INVOKE_CLOSE_FOLLOWERS = (INVOKE_OPEN, BLOCK_CLOSE)
_OUTSIDE_TAGS = (INVOKE_OPEN, BLOCK_OPEN, BLOCK_CLOSE, INVOKE_CLOSE, PARAMETER_CLOSE)
_INVOKE_TAGS = (PARAMETER_OPEN, INVOKE_CLOSE, INVOKE_OPEN, BLOCK_CLOSE)
_WHITESPACE = re.compile(r"\s*")
_NAME_CHARACTERS = re.compile(r'[^\s<>"]*')

# Scanner states.
_OUTSIDE = "outside"  # between invokes (inside or outside a block)
_INVOKE_NAME = "invoke name"  # after `<atem:invoke name="`
_SWALLOW_CHECK = "swallow check"  # after an opener named H.P: does a value follow directly? (P-ATEM-6)
_INVOKE = "invoke"  # inside an invoke, between parameters
_PARAMETER_NAME = "parameter name"  # after `<atem:parameter name="`
_VALUE = "value"  # inside a parameter value


@dataclass
class _OpenInvoke:
    tag_name: str
    tool: str | None  # the declared tool the call resolved to, or None
    index: int | None = None  # set when the call materializes
    keys: set[str] = field(default_factory=set)
    swallowed_key: str | None = None  # P-ATEM-6: parameter whose opener the model glued onto the name

    @property
    def name(self) -> str:
        return self.tool if self.tool is not None else self.tag_name


def _could_become(text: str, start: int, tags: tuple[str, ...]) -> bool:
    """True when `text[start:]` (the end of the text) is a proper prefix of one of `tags`."""
    rest_length = len(text) - start
    return any(rest_length < len(tag) and tag.startswith(text[start:]) for tag in tags)


class AtemChannel:
    """The ATEM scanner of one tool channel."""

    def __init__(self, recipient: str, tools: ToolRegistry, ledger: CallLedger):
        self._tools = tools
        self._ledger = ledger
        self._recipient = recipient
        self._recipient_tool = tools.resolve(recipient)
        self._state = _OUTSIDE
        self._pending = ""  # undecided text: a partial tag, a closer awaiting lookahead, a name
        self._invoke: _OpenInvoke | None = None
        self._parameter_key = ""
        self._value_parts: list[str] = []
        self._prose_characters = 0

    @property
    def accepts_plain_value_text(self) -> bool:
        """True when text without `</` or a trailing `<` can be appended to the open value as is."""
        return self._state is _VALUE and not self._pending

    @property
    def append_plain_value_text(self) -> Callable[[str], None]:
        """Appends text without `</` or a trailing `<` to the open value; see `accepts_plain_value_text`."""
        return self._value_parts.append

    def feed(self, text: str) -> None:
        """Scan more body text (framing already removed)."""
        if self._state is _VALUE and not self._pending and "</" not in text and text[-1:] != "<":
            self._value_parts.append(text)
            return
        self._scan(self._pending + text, final=False)

    def close(self) -> bool:
        """The body ended. Returns True when it ended inside an open invoke (P-ATEM-5, P-CHAN-7)."""
        self._scan(self._pending, final=True)
        if self._prose_characters:
            logger.warning("tool channel to=%s: dropped %d characters of text outside ATEM tags",
                           self._recipient, self._prose_characters)
        invoke = self._invoke
        inside_invoke = invoke is not None or self._state is _INVOKE_NAME
        if invoke is not None:
            if invoke.index is None:
                logger.warning("tool channel to=%s ended inside invoke %r before any parameter completed; "
                               "the call is dropped", self._recipient, invoke.tag_name)
            else:
                logger.warning("tool channel to=%s ended inside invoke %r; the call keeps its completed "
                               "parameters", self._recipient, invoke.tag_name)
                self._ledger.add_fragment(invoke.index, "}")
                self._ledger.finish(invoke.index, invoke.name, invoke.tool is not None)
        self._invoke = None
        self._value_parts = []
        self._state = _OUTSIDE
        return inside_invoke

    def _scan(self, text: str, final: bool) -> None:
        handlers = _HANDLERS
        position = 0
        while position < len(text):
            state = self._state
            next_position = handlers[state](self, text, position, final)
            if next_position == position and self._state is state:
                break
            position = next_position
        self._pending = text[position:]
        if final and self._pending:
            # Whatever could not be decided is text that ends the body: prose, or an unfinished tag.
            self._note_prose(self._pending)
            self._pending = ""

    # -- between invokes ------------------------------------------------------------------------------------

    def _scan_outside(self, text: str, position: int, final: bool) -> int:
        tag_start = text.find("<", position)
        if tag_start < 0:
            self._note_prose(text[position:])
            return len(text)
        self._note_prose(text[position:tag_start])
        if text.startswith(INVOKE_OPEN, tag_start):
            self._state = _INVOKE_NAME
            return tag_start + len(INVOKE_OPEN)
        for tag in (BLOCK_OPEN, BLOCK_CLOSE):
            if text.startswith(tag, tag_start):
                return tag_start + len(tag)
        for tag in (INVOKE_CLOSE, PARAMETER_CLOSE):
            if text.startswith(tag, tag_start):
                self._note_prose(tag)
                return tag_start + len(tag)
        if _could_become(text, tag_start, _OUTSIDE_TAGS):
            # undecided; at the end of the body a tag cut short (max_tokens), which is not prose
            return len(text) if final else tag_start
        self._note_prose("<")
        return tag_start + 1

    # -- name attributes ------------------------------------------------------------------------------------

    def _scan_name(self, text: str, position: int, final: bool) -> int:
        """Read a name attribute up to its `">` (P-ATEM-1), repairing a fumbled `<|message|>` (P-ATEM-7).

        Nothing is consumed until the opener is decided. The attribute's raw text is at most NAME_MAX
        characters; past that it is no name, which bounds both the wait and the search.
        """
        limit = position + NAME_MAX
        horizon = limit + len(MESSAGE)  # every marker starting within the limit is complete by here
        pieces: list[str] = []
        scan = position
        while True:
            quote = text.find('"', scan, limit + 1)
            marker = text.find(MESSAGE, scan, horizon)
            if marker >= 0 and (quote < 0 or marker < quote):
                pieces.append(text[scan:marker])
                after = marker + len(MESSAGE)
                continuation = _NAME_CHARACTERS.match(text, after, after + NAME_MAX + 1).end()
                if continuation == len(text) and not final:
                    return position
                if continuation < len(text) and text[continuation] == '"':
                    scan = after  # the marker sits inside the name: drop it and read on
                    continue
                # The marker stands where `">` belongs: the name ends and the opener is complete.
                end = after + 1 if text.startswith(">", after) else after
                return self._name_complete("".join(pieces), end)
            if quote >= 0:
                pieces.append(text[scan:quote])
                if quote + 1 == len(text):
                    if not final:
                        return position
                    self._state = _OUTSIDE if self._state is _INVOKE_NAME else _INVOKE  # cut short before `>`
                    return len(text)
                if text.startswith(">", quote + 1):
                    return self._name_complete("".join(pieces), quote + 2)
                return self._name_invalid(position)
            if final and len(text) < horizon:  # the body ended inside the name: an opener cut short, not prose
                self._state = _OUTSIDE if self._state is _INVOKE_NAME else _INVOKE
                return len(text)
            if final or len(text) >= horizon:
                return self._name_invalid(position)
            return position

    def _name_invalid(self, name_start: int) -> int:
        # Not an opener after all: resume right after `name="`, so a real opener inside the text is found.
        self._state = _OUTSIDE if self._state is _INVOKE_NAME else _INVOKE
        self._note_prose("<")
        return name_start

    def _name_complete(self, name: str, end: int) -> int:
        if self._state is _INVOKE_NAME:
            self._open_invoke(name)
        else:
            self._parameter_key = name
            self._value_parts = []
            self._state = _VALUE
        return end

    def _open_invoke(self, tag_name: str) -> None:
        tool = self._tools.resolve(tag_name)
        if tool is None and "." in tag_name:
            head, key = tag_name.rsplit(".", 1)
            head_tool = self._tools.resolve(head)
            if head_tool is not None and self._tools.declares_parameter(head_tool, key):
                self._invoke = _OpenInvoke(tag_name, head_tool, swallowed_key=key)
                self._state = _SWALLOW_CHECK
                return
        self._invoke = _OpenInvoke(tag_name, self._tool_for(tag_name, tool))
        self._state = _INVOKE

    def _tool_for(self, tag_name: str, tag_tool: str | None) -> str | None:
        """P-NAME-2: the invoke's own name wins; the channel's recipient fills in for an unknown name."""
        if tag_tool is not None:
            if self._recipient_tool is not None and self._recipient_tool != tag_tool:
                logger.warning("invoke %r resolves to %r but its channel to=%s resolves to %r; using the "
                               "invoke", tag_name, tag_tool, self._recipient, self._recipient_tool)
            return tag_tool
        if self._recipient_tool is not None:
            logger.warning("invoke %r names no declared tool; using its channel's recipient %r",
                           tag_name, self._recipient_tool)
        return self._recipient_tool

    def _scan_swallow_check(self, text: str, position: int, final: bool) -> int:
        """After `<atem:invoke name="H.P">`: a value right away means the parameter opener was swallowed."""
        invoke = self._invoke
        assert invoke is not None and invoke.swallowed_key is not None
        first_visible = _WHITESPACE.match(text, position, position + LOOKAHEAD_WHITESPACE_MAX + 1).end()
        if first_visible - position <= LOOKAHEAD_WHITESPACE_MAX:
            if first_visible == len(text) and not final:
                return position
            if first_visible == len(text) or any(text.startswith(tag, first_visible) for tag in _INVOKE_TAGS):
                invoke.tool = self._tool_for(invoke.tag_name, None)
                invoke.swallowed_key = None
                self._state = _INVOKE
                return position
            if not final and _could_become(text, first_visible, _INVOKE_TAGS):
                return position
        logger.warning("invoke %r has no parameter opener; reading it as %r with parameter %r (P-ATEM-6)",
                       invoke.tag_name, invoke.tool, invoke.swallowed_key)
        self._parameter_key = invoke.swallowed_key
        self._value_parts = []
        self._state = _VALUE
        return position

    # -- inside an invoke -----------------------------------------------------------------------------------

    def _scan_invoke(self, text: str, position: int, final: bool) -> int:
        tag_start = _WHITESPACE.match(text, position).end()
        if tag_start == len(text):
            return tag_start
        if text.startswith(PARAMETER_OPEN, tag_start):
            self._state = _PARAMETER_NAME
            return tag_start + len(PARAMETER_OPEN)
        if text.startswith(INVOKE_CLOSE, tag_start):
            after = tag_start + len(INVOKE_CLOSE)
            legal = self._closer_is_legal(text, after, final, _INVOKE_CLOSE_FOLLOWERS)
            if legal is None:
                return tag_start
            if legal:
                self._close_invoke()
            else:
                self._note_prose(INVOKE_CLOSE)
            return after
        if text.startswith(INVOKE_OPEN, tag_start) or text.startswith(BLOCK_CLOSE, tag_start):
            logger.warning("invoke %r is not closed before the next tag; closing it there",
                           self._invoke_name())
            self._close_invoke()
            return tag_start
        if _could_become(text, tag_start, _INVOKE_TAGS):
            return len(text) if final else tag_start  # at the end of the body: a tag cut short, not prose
        next_tag = text.find("<", tag_start + 1)
        end = len(text) if next_tag < 0 else next_tag
        self._note_prose(text[tag_start:end])
        return end

    def _invoke_name(self) -> str:
        return self._invoke.tag_name if self._invoke is not None else ""

    def _scan_value(self, text: str, position: int, final: bool) -> int:
        closer = text.find(PARAMETER_CLOSE, position)
        if closer < 0:
            end = len(text) if final else _start_of_partial(text, position, PARAMETER_CLOSE)
            self._value_parts.append(text[position:end])
            return end
        after = closer + len(PARAMETER_CLOSE)
        legal = self._closer_is_legal(text, after, final, _PARAMETER_CLOSE_FOLLOWERS)
        if legal is None:
            self._value_parts.append(text[position:closer])
            return closer
        if not legal:
            self._value_parts.append(text[position:after])  # a lookalike closer is value text
            return after
        self._value_parts.append(text[position:closer])
        self._complete_parameter(self._parameter_key, "".join(self._value_parts))
        self._value_parts = []
        self._state = _INVOKE
        return after

    @staticmethod
    def _closer_is_legal(text: str, after: int, final: bool, followers: tuple[str, ...]) -> bool | None:
        """Whether the closer ending at `after` really closes (P-ATEM-2); None while undecided.

        At the end of the body, a follower cut short (`</atem:parameter>` then `\n</`, max_tokens) counts as
        the end of the body: only a legal tag could have followed, and the parameter or invoke it closes is kept
        (P-ATEM-5)."""
        next_tag = _WHITESPACE.match(text, after, after + LOOKAHEAD_WHITESPACE_MAX + 1).end()
        if next_tag - after > LOOKAHEAD_WHITESPACE_MAX:
            return True
        if next_tag == len(text):
            return True if final else None
        if any(text.startswith(follower, next_tag) for follower in followers):
            return True
        if _could_become(text, next_tag, followers):
            return True if final else None
        return False

    # -- calls ----------------------------------------------------------------------------------------------

    def _complete_parameter(self, key: str, raw_value: str) -> None:
        invoke = self._invoke
        assert invoke is not None
        if key in invoke.keys:
            logger.warning("invoke %r repeats parameter %r; the first value is kept", invoke.tag_name, key)
            return
        invoke.keys.add(key)
        if invoke.tool is not None:
            schema, root = self._tools.parameter_schema(invoke.tool, key)
        else:
            schema, root = None, {}
        pair = json.dumps(key, ensure_ascii=False) + ": " + parameter_value_json(raw_value, schema, root)
        if invoke.index is None:
            invoke.index = self._ledger.start(invoke.name, "{" + pair)
        else:
            self._ledger.add_fragment(invoke.index, ", " + pair)

    def _close_invoke(self) -> None:
        invoke = self._invoke
        assert invoke is not None
        if invoke.index is None:
            invoke.index = self._ledger.start(invoke.name, "{}")
        else:
            self._ledger.add_fragment(invoke.index, "}")
        self._ledger.finish(invoke.index, invoke.name, invoke.tool is not None)
        self._invoke = None
        self._state = _OUTSIDE

    def _note_prose(self, text: str) -> None:
        if text and not text.isspace():
            self._prose_characters += len(text)


_HANDLERS = {
    _OUTSIDE: AtemChannel._scan_outside,
    _INVOKE_NAME: AtemChannel._scan_name,
    _SWALLOW_CHECK: AtemChannel._scan_swallow_check,
    _INVOKE: AtemChannel._scan_invoke,
    _PARAMETER_NAME: AtemChannel._scan_name,
    _VALUE: AtemChannel._scan_value,
}


def _start_of_partial(text: str, position: int, tag: str) -> int:
    """Where a trailing proper prefix of `tag` starts in `text[position:]`; len(text) when there is none."""
    candidate = text.rfind("<", max(position, len(text) - len(tag) + 1))
    if candidate >= 0 and tag.startswith(text[candidate:]):
        return candidate
    return len(text)
