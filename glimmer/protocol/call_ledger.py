"""The turn's tool calls: wire-order numbering, fresh ids, which calls are valid (P-ATEM-3, P-REQ-4)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from glimmer.protocol.deltas import ToolCallDelta

logger = logging.getLogger(__name__)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class CallLedger:
    """Numbers calls densely in wire order across blocks and channels and emits their deltas."""

    def __init__(self, emit: Callable[[ToolCallDelta], None]):
        self._emit = emit
        self.count = 0
        self.valid_call_names: list[str] = []
        """Names of finished calls whose name resolved to a declared tool (arguments are always objects)."""
        self.unresolved_call_count = 0
        """Finished calls whose name matched no declared tool (P-NAME-3)."""

    def start(self, name: str, first_fragment: str) -> int:
        """Materialize a call (P-ATEM-4): emit its start and first fragment; return its index."""
        index = self.count
        self.count += 1
        self._emit(ToolCallDelta(index, new_call_id(), name, first_fragment))
        return index

    def add_fragment(self, index: int, fragment: str) -> None:
        self._emit(ToolCallDelta(index, None, None, fragment))

    def finish(self, index: int, name: str, resolved: bool) -> None:
        """The call's arguments are closed; record whether it is a valid call."""
        if resolved:
            self.valid_call_names.append(name)
        else:
            self.unresolved_call_count += 1
            logger.warning("tool call %d names %r, which is not a declared tool; passed through unchanged",
                           index, name)
