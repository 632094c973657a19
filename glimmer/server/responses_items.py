"""GET /v1/responses/{id}/input_items: the items a stored response read, as OpenAI lists them.

A response's input items are those of the responses its `previous_response_id` chain continues (their inputs and
outputs, oldest first) followed by its own `input`, as OpenAI lists them; `instructions` are no item (the response
object carries them). Each item gets an id when its response is stored (`with_item_ids`), so the same item keeps
its id in the lists of every response that continues it and a page's last id can be the next page's `after`.
Items are listed in OpenAI's shape (`listed_item`): a string content becomes one `input_text` part (an
assistant's one `output_text` part), an `input_image` sent without a `detail` has OpenAI's default, `auto`, and items
sent without a `status` are `completed`.

Pagination as OpenAI's list endpoints: `order` (`desc`, newest first, by default; or `asc`), `limit` (1 to 100,
20 by default), `after` (the items after that id in `order`) and `before` (the items before it: the page nearest
the cursor). The page answers `{"object": "list", "data", "first_id", "last_id", "has_more"}`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from glimmer.errors import RequestError
from glimmer.server.responses_input import with_sealed_reasoning
from glimmer.server.responses_schemas import ENCRYPTED_REASONING, check_include

_ID_PREFIXES = {"message": "msg", "reasoning": "rs", "function_call": "fc", "function_call_output": "fco"}
_QUERY_FIELDS = ("after", "before", "limit", "order", "include")
_MAX_LIMIT = 100
_DEFAULT_LIMIT = 20


def with_item_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`items` with an id given to each that has none (a copy of it: the request's own items stay as sent)."""
    return [item if item.get("id") else
            {**item, "id": f"{_ID_PREFIXES.get(item.get('type', 'message'), 'item')}_{uuid.uuid4().hex}"}
            for item in items]


def listed_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item in the shape OpenAI lists it (ResponseItem): content as parts, a status."""
    kind = item.get("type", "message")
    listed = {**item, "type": kind}
    if kind == "message" and isinstance(item.get("content"), str):
        text = item["content"]
        assistant = item.get("role") == "assistant"
        listed["content"] = [{"type": "output_text", "text": text, "annotations": []} if assistant
                             else {"type": "input_text", "text": text}]
    for field in ("content", "output"):  # a message's parts, a function_call_output's
        if isinstance(listed.get(field), list):
            listed[field] = [_listed_part(part) for part in listed[field]]
    if kind == "reasoning" and listed.get("summary") is None:
        listed["summary"] = []
    if listed.get("status") is None:
        listed["status"] = "completed"
    return listed


def _listed_part(part: Any) -> Any:
    """A content part in the shape OpenAI lists it: an input_image with its `detail`, `auto` (OpenAI's default) where
    none was sent, which the SDK's ResponseInputImage requires (without it the SDK read the part as another type)."""
    if isinstance(part, dict) and part.get("type") == "input_image" and part.get("detail") is None:
        return {**part, "detail": "auto"}
    return part


def input_items_page(items: Sequence[dict[str, Any]], query: Mapping[str, str | list[str]]) -> dict[str, Any]:
    """The page of `items` (a stored response's input items, in the order it read them) that `query` asks for.
    `query` maps each query parameter to its value (a list for `include`: `reasoning.encrypted_content` seals the
    reasoning items' text, as create does; output parts hold the logprobs they were generated with, if any). Raises
    RequestError naming a parameter that is unknown, out of range, or names no item (`after`, `before`)."""
    unknown = sorted(set(query) - set(_QUERY_FIELDS))
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown query parameter (input_items takes {', '.join(_QUERY_FIELDS)})",
                           param=unknown[0])
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise RequestError(f"order: {order!r} is not one of 'asc', 'desc'", param="order")
    limit = _limit(query.get("limit"))
    include = query.get("include", [])
    include = [include] if isinstance(include, str) else include
    check_include(include)
    ordered = [listed_item(item) for item in (items if order == "asc" else reversed(items))]
    start, end = 0, len(ordered)
    if query.get("after") is not None:
        start = _position(ordered, query["after"], "after") + 1
    if query.get("before") is not None:
        end = _position(ordered, query["before"], "before")
    if query.get("before") is not None and query.get("after") is None:
        page, has_more = ordered[max(start, end - limit):end], end - limit > start  # the page nearest the cursor
    else:
        page, has_more = ordered[start:min(end, start + limit)], start + limit < end
    if ENCRYPTED_REASONING in include:  # the page's items alone
        page = [with_sealed_reasoning(item) for item in page]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": has_more}


def _limit(value: Any) -> int:
    if value is None:
        return _DEFAULT_LIMIT
    try:
        limit = int(value)
    except ValueError:
        raise RequestError(f"limit: {value!r} is not an integer (1 to {_MAX_LIMIT})", param="limit") from None
    if not 1 <= limit <= _MAX_LIMIT:
        raise RequestError(f"limit: {limit} is out of range (1 to {_MAX_LIMIT})", param="limit")
    return limit


def _position(items: list[dict[str, Any]], item_id: Any, name: str) -> int:
    for i, item in enumerate(items):
        if item["id"] == item_id:
            return i
    raise RequestError(f"{name}: no input item {item_id!r} in this response; pass an id from a page of its list",
                       param=name)
