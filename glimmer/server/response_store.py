"""Stored responses, for `previous_response_id`, `GET` and `DELETE /v1/responses/{id}`: in memory, bounded.

A stored response keeps its response object and the items it added to its conversation (its own input items, then
its output items, a `_Segment`), linked to the segment of the response it continues: a chain of responses holds each
item once, so its stored size grows with its length, not with its square. The store holds at most `max_bytes` (sized
as JSON: each response object, and each segment once, however many responses continue it) and forgets each response
after `max_age_s`; the oldest go first. A segment stays while a stored response holds it, as its own or down its
chain: forgetting a response forgets its items only once no stored response continues it, so a response that is kept
always has its whole conversation, and what the store holds is what it counts. An image a client named by a path or
URL is kept, beside the item as sent, as the bytes it was read as (`images_read`, counted as their length): the later
turns render the image the model saw, whatever the file or URL holds by then, as a data: URL built when they read it.
A server restart forgets everything.

A response is stored when it ends; while it is generated the store knows it as in progress (`generating`), so that
the routes naming it can tell a response not yet finished from one that does not exist.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False))


def _chain_bytes(segment: _Segment | None) -> int:
    """The size of a segment and of those it continues, held or not."""
    total = 0
    while segment is not None:
        total += segment.size_bytes
        segment = segment.previous
    return total


# where an image part is in a segment's items: the item's index, the field holding its parts (a message's `content`,
# a function_call_output's `output`) and the part's index there
ImagePart = tuple[int, str, int]


@dataclass(eq=False)
class _Segment:
    """The items one response added to its conversation, after those of the segment it continues (`previous`)."""

    items: list[dict[str, Any]]
    previous: _Segment | None
    size_bytes: int
    holders: int = 0  # the stored response it is the segment of, and the kept segments continuing it
    images_read: Mapping[ImagePart, bytes] = field(default_factory=dict)  # `ResponseStore.put`'s

    @property
    def rendered_items(self) -> list[dict[str, Any]]:
        """`items` with each image of `images_read` in place as a data: URL of its bytes, built here, when a
        continuation reads it: the store keeps the bytes, three quarters of their base64's size."""
        rendered = list(self.items)
        for (k, content, j), data in self.images_read.items():
            parts = list(rendered[k][content])
            url = "data:application/octet-stream;base64," + base64.b64encode(data).decode()
            parts[j] = {**parts[j], "image_url": url}
            rendered[k] = {**rendered[k], content: parts}
        return rendered


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    segment: _Segment
    size_bytes: int  # of the response object; the segment is counted apart, once
    stored_at: float

    @property
    def items(self) -> list[dict[str, Any]]:
        """The conversation the response ends: the items of the responses it continues, its input, its output."""
        return self._chain(rendered=False)

    @property
    def rendered_items(self) -> list[dict[str, Any]]:
        """`items` as a response continuing this one renders them: an image its client named by a path or URL is the
        data it was read as when sent (`ResponseStore.put`'s `images_read`), whatever that file or URL holds now."""
        return self._chain(rendered=True)

    def _chain(self, rendered: bool) -> list[dict[str, Any]]:
        segments = []
        segment: _Segment | None = self.segment
        while segment is not None:
            segments.append(segment.rendered_items if rendered else segment.items)
            segment = segment.previous
        return [item for items in reversed(segments) for item in items]

    @property
    def input_items(self) -> list[dict[str, Any]]:
        """The items the response read: those of the responses it continues, then its own input."""
        items = self.items
        return items[:len(items) - len(self.response["output"])]


class ResponseStore:
    def __init__(self, max_bytes: int, max_age_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._output_items: dict[str, StoredResponse] = {}  # an output item's id: the newest response holding it
        self._size_bytes = 0
        self._generating: dict[str, Callable[[], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    @property
    def size_bytes(self) -> int:
        """What the store holds, as it counts it against max_bytes."""
        return self._size_bytes

    def put(self, response_id: str, items: list[dict[str, Any]], response: dict[str, Any],
            previous: StoredResponse | None = None, images_read: Mapping[ImagePart, bytes] | None = None) -> bool:
        """Keep a response that added `items` (its own input items, then its output items) to the conversation of
        `previous`, the response it continues as it was read (held on even if forgotten since), in place of one
        stored under its id (a client's `request_id` named both). `images_read`: the bytes each image part a client
        named by a path or URL was read as, by where the part is in `items`, which the responses continuing it render
        (counted too, as their length). One larger than the whole store with its conversation is not kept, and
        evicts nothing but the response stored under its id, which it replaces (kept, it would be served as the
        answer to a request it is not); one that fits evicts the oldest responses until the store holds it. Whether
        it was kept; where not, a warning says why (its answer says `store: false`)."""
        images_read = dict(images_read or {})
        segment_bytes = _json_bytes(items) + sum(len(data) for data in images_read.values())
        segment = _Segment(items, previous.segment if previous is not None else None, segment_bytes,
                           images_read=images_read)
        size = _json_bytes(response)
        with self._lock:
            replaced = self._entries.pop(response_id, None)
            if replaced is not None:
                self._forget(replaced)
            # what it holds once every other response is evicted: itself and its whole conversation, told before
            # evicting any, so that one which cannot fit leaves the others as they were (all but the one it replaces)
            needed = size + _chain_bytes(segment)
            if needed > self.max_bytes:
                logger.warning("response %s not stored: %s bytes with the conversation it continues, more than the "
                               "store's bound of %s bytes", response_id, f"{needed:,}", f"{self.max_bytes:,}")
                return False
            entry = StoredResponse(response, segment, size, self._clock())
            self._entries[response_id] = entry
            self._output_items.update((item["id"], entry) for item in response.get("output", ()) if item.get("id"))
            self._size_bytes += size
            self._hold(segment)
            while self._size_bytes > self.max_bytes:  # the newest, it outlasts the others it needs gone
                self._evict_oldest()
            return True

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
        """The output item of a stored response whose id is `item_id` (the newest response holding it), or None; an
        expired response's items are forgotten with it. A dict lookup: an agent client sends each earlier item as a
        reference to it, and a store holds tens of thousands of responses."""
        with self._lock:
            self._evict_expired()
            entry = self._output_items.get(item_id)
        if entry is None:
            return None
        return next(item for item in entry.response["output"] if item.get("id") == item_id)

    def delete(self, response_id: str) -> bool:
        """Forget a stored response; False if none is stored under `response_id` (or it expired)."""
        if self.get(response_id) is None:
            return False
        with self._lock:
            entry = self._entries.pop(response_id, None)
            if entry is None:  # evicted between the two
                return False
            self._forget(entry)
            return True

    def __len__(self) -> int:
        return len(self._entries)

    def _evict_expired(self) -> None:
        now = self._clock()
        while self._entries and now - next(iter(self._entries.values())).stored_at > self.max_age_s:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self._forget(entry)

    def _forget(self, entry: StoredResponse) -> None:
        """Uncount a response taken out of the entries: its object, its output items' ids, and its segments that
        nothing else holds."""
        for item in entry.response.get("output", ()):
            if self._output_items.get(item.get("id")) is entry:
                del self._output_items[item["id"]]
        self._size_bytes -= entry.size_bytes
        segment: _Segment | None = entry.segment
        while segment is not None:
            segment.holders -= 1
            if segment.holders:
                return
            self._size_bytes -= segment.size_bytes
            segment = segment.previous

    def _hold(self, segment: _Segment) -> None:
        """Count a segment a new response holds, and the segments it continues that nothing held any longer (a
        response continued after it was forgotten brings its conversation back, which is kept again)."""
        current: _Segment | None = segment
        while current is not None:
            current.holders += 1
            if current.holders > 1:
                return
            self._size_bytes += current.size_bytes
            current = current.previous
