"""Stored responses, for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`: in memory, bounded.

A stored response keeps the conversation it ends (the input items, its own and those of the responses before
it, followed by its output items) and its response object. The store holds at most `max_bytes` of them (sized
as JSON) and forgets each after `max_age_s`; the oldest go first. A server restart forgets everything.

A response is stored when it ends; while it is generated the store knows it as in progress (`generating`), so that
the routes naming it can tell a response not yet finished from one that does not exist.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    items: list[dict[str, Any]]
    response: dict[str, Any]
    size_bytes: int
    stored_at: float

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """The items the response read: those of the responses it continues, then its own input."""
        return self.items[:len(self.items) - len(self.response["output"])]


class ResponseStore:
    def __init__(self, max_bytes: int, max_age_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._size_bytes = 0
        self._generating: dict[str, Callable[[], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def put(self, response_id: str, items: list[dict[str, Any]], response: dict[str, Any]) -> None:
        """Keep a response, in place of one stored under its id (a client's `request_id` named both); one larger than
        the whole store is not kept."""
        size = len(json.dumps(items, ensure_ascii=False)) + len(json.dumps(response, ensure_ascii=False))
        with self._lock:
            replaced = self._entries.pop(response_id, None)
            if replaced is not None:
                self._size_bytes -= replaced.size_bytes
            if size > self.max_bytes:
                return
            self._entries[response_id] = StoredResponse(items, response, size, self._clock())
            self._size_bytes += size
            while self._size_bytes > self.max_bytes:
                self._evict_oldest()

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None if it was never stored, was evicted or is older than max_age_s."""
        with self._lock:
            self._evict_expired()
            return self._entries.get(response_id)

    @contextlib.contextmanager
    def generating(self, response_id: str, snapshot: Callable[[], dict[str, Any]]) -> Iterator[None]:
        """Knows `response_id` as in progress until the block ends; `snapshot` gives its response object so far."""
        with self._lock:
            self._generating[response_id] = snapshot
        try:
            yield
        finally:
            with self._lock:
                if self._generating.get(response_id) is snapshot:  # not a later response under the same id
                    del self._generating[response_id]

    def in_progress(self, response_id: str) -> dict[str, Any] | None:
        """The response object so far of a response being generated under `response_id`, or None."""
        with self._lock:
            snapshot = self._generating.get(response_id)
        return None if snapshot is None else snapshot()

    def output_item(self, item_id: str) -> dict[str, Any] | None:
        """The output item of a stored response whose id is `item_id` (the newest response first), or None; an
        expired response's items are forgotten with it."""
        with self._lock:
            self._evict_expired()
            entries = list(self._entries.values())
        for entry in reversed(entries):
            for item in entry.response["output"]:
                if item.get("id") == item_id:
                    return item
        return None

    def delete(self, response_id: str) -> bool:
        """Forget a stored response; False if none is stored under `response_id` (or it expired)."""
        if self.get(response_id) is None:
            return False
        with self._lock:
            entry = self._entries.pop(response_id, None)
            if entry is None:  # evicted between the two
                return False
            self._size_bytes -= entry.size_bytes
            return True

    def __len__(self) -> int:
        return len(self._entries)

    def _evict_expired(self) -> None:
        now = self._clock()
        while self._entries and now - next(iter(self._entries.values())).stored_at > self.max_age_s:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self._size_bytes -= entry.size_bytes
