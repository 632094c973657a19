"""JSON objects that give a key twice.

RFC 8259 §4 leaves the meaning of such an object to the reader: Python's json and pydantic take the last value, other
parsers the first, so a client, a proxy and the server could each read another request. A request body and the
tool-call arguments it carries as JSON text are both checked here.
"""

from __future__ import annotations

import json
from typing import Any

from glimmer.errors import RequestError


def refuse_duplicate_keys(text: str | bytes, under: str | None = None) -> None:
    """RequestError naming (by its path, below the field `under` when given) the first key that an object of `text`
    gives twice (`first_duplicate_key`). `text` is JSON that has been read already."""
    path = first_duplicate_key(text)
    if path is not None:
        path = path if under is None else f"{under}.{path}"
        raise RequestError(f"{path}: given more than once in the same JSON object; send each key once (JSON "
                           "leaves which value counts undefined)", param=path)


def first_duplicate_key(text: str | bytes) -> str | None:
    """The path (`messages[0].content`, `city`) of the first key that an object of `text` gives twice, outer objects
    before inner ones; None when every object's keys are distinct. `text` is JSON already accepted by a parser (its
    nesting bounded: the path is found by recursion)."""
    try:
        json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey:  # rare: parse again, keeping every pair, to say where
        return _first_duplicate_key(json.loads(text, object_pairs_hook=_Pairs), "")
    return None


class _DuplicateKey(Exception):
    """Raised inside json.loads by `_unique_keys`."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> None:
    """json.loads' object_pairs_hook for a parse that only checks: each object becomes None (building no dicts to
    throw away makes the check about a fifth faster on bodies of many small objects)."""
    if len(dict(pairs)) != len(pairs):
        raise _DuplicateKey


class _Pairs(list):
    """A JSON object as its (key, value) pairs, repeated keys kept."""


def _first_duplicate_key(value: Any, path: str) -> str | None:
    """The path of the first repeated key in `value` (objects as `_Pairs`), outer objects before inner ones."""
    if isinstance(value, _Pairs):
        seen: set[str] = set()
        for key, _ in value:
            if key in seen:
                return f"{path}.{key}" if path else key
            seen.add(key)
        children = [(f"{path}.{key}" if path else key, item) for key, item in value]
    elif isinstance(value, list):
        children = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
    else:
        return None
    return next((found for where, item in children if (found := _first_duplicate_key(item, where)) is not None),
                None)
