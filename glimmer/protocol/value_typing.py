"""Typing an ATEM parameter value by the tool's JSON schema (protocol.md §4.5, P-VAL-1..4).

ATEM values are raw text: the template writes strings as they are and lists/objects as JSON. The schema of
the parameter decides how the text is read back, so a string parameter keeps text that merely looks like
JSON, a number or `true`, and an integer parameter gets a number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

_JSON_TYPE_NAMES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
_MAX_SCHEMA_DEPTH = 32


class _NotJson(Exception):
    """The text is not strict, finite JSON."""


def parameter_value_json(raw: str, schema: Any, root: Mapping[str, Any]) -> str:
    """The JSON text of a parameter value given its raw ATEM text.

    `schema` is the parameter's schema (None when the parameter is undeclared), `root` the tool's whole
    parameters schema (for local `$ref`). The result is always valid JSON: non-finite numbers and
    anything that cannot be serialized fall back to the raw text as a string (P-VAL-4).
    """
    value = typed_value(raw, schema, root)
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return json.dumps(raw, ensure_ascii=False)


def typed_value(raw: str, schema: Any, root: Mapping[str, Any]) -> Any:
    allowed = allowed_types(schema, root)
    if not allowed:
        return _untyped_value(raw)
    if "string" in allowed:
        # P-VAL-1: verbatim and untrimmed; only the exact text null is null, and only if null is allowed.
        return None if raw == "null" and "null" in allowed else raw
    try:
        parsed = _strict_json(raw.strip())
    except _NotJson:
        return raw
    return _fitted(parsed, allowed, raw)


def allowed_types(schema: Any, root: Mapping[str, Any], depth: int = 0) -> set[str]:
    """JSON type names a schema admits, from `type`, `enum`/`const` values, `anyOf`/`oneOf` members and the types
    common to its `allOf` members.

    Empty when the schema says nothing about types (no schema at all, `{}`, only a description).
    """
    if depth > _MAX_SCHEMA_DEPTH or not isinstance(schema, Mapping):
        return set()
    types: set[str] = set()
    reference = schema.get("$ref")
    if isinstance(reference, str):
        types |= allowed_types(resolve_local_reference(reference, root), root, depth + 1)
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(name for name in declared if isinstance(name, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        types.update(_json_type_of(member) for member in enum)
    if "const" in schema:
        types.add(_json_type_of(schema["const"]))
    for combinator in ("anyOf", "oneOf"):
        members = schema.get(combinator)
        if isinstance(members, list):
            for member in members:
                types |= allowed_types(member, root, depth + 1)
    every = schema.get("allOf")
    if isinstance(every, list):  # a value is of every member's types at once
        for member in every:
            required = allowed_types(member, root, depth + 1)
            if required:
                types = _common_types(types, required) if types else required
    return types & _JSON_TYPE_NAMES


def _common_types(first: set[str], second: set[str]) -> set[str]:
    """Types a value of both sets has (an integer is a number)."""
    common = first & second
    if ("integer" in first and "number" in second) or ("number" in first and "integer" in second):
        common.add("integer")
    return common


def is_json_number(value: Any) -> bool:
    """Whether a parsed JSON value (a schema keyword's) is a number: an int or a float, never a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def root_schemas(root: Mapping[str, Any], start: Any = None) -> Iterator[Mapping[str, Any]]:
    """The schemas that describe an object schema's object itself: `root` (or `start`, a schema inside it), the target
    of a `$ref` at it (beside its own keywords) and its `allOf` members, and theirs in turn (a tool's parameters may
    be written any of these ways); `$ref`s point into `root`."""
    pending: list[Any] = [root if start is None else start]
    for _ in range(_MAX_SCHEMA_DEPTH):
        if not pending:
            return
        schema = pending.pop(0)
        if not isinstance(schema, Mapping):
            continue
        yield schema
        if isinstance(schema.get("$ref"), str):
            pending.append(resolve_local_reference(schema["$ref"], root))
        if isinstance(schema.get("allOf"), list):
            pending.extend(schema["allOf"])


def object_shape(root: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """An object schema's properties and required names, from its `root_schemas`. A property that several of them
    declare holds to each declaration: its schema is their `allOf`, where the last one declared replaced the others
    (a value of `{"minimum": 5}` in one member and `{"maximum": 9}` in another could be 1).

    The properties the members of a root `anyOf` or `oneOf` declare (a non-strict tool's alternatives; a strict
    tool's are refused) are properties too, of the `anyOf` of their declarations where the root declares none, and
    required where every member requires them: without them a call could write none of an alternative's
    parameters, and was forced to `{}`."""
    return _object_shape(root, root, set())


def _object_shape(start: Any, root: Mapping[str, Any], expanded: set[int]) -> tuple[dict[str, Any], set[str]]:
    """`object_shape` of `start`, a schema in `root`; the `anyOf`/`oneOf` members of `expanded` (ids) are not read
    again (a member that points back to the root would repeat it for ever)."""
    properties: dict[str, Any] = {}
    required: set[str] = set()
    alternatives: list[list[Any]] = []
    for schema in root_schemas(root, start):
        if isinstance(schema.get("properties"), Mapping):
            for key, declared in schema["properties"].items():
                properties[key] = {"allOf": [properties[key], declared]} if key in properties else declared
        if isinstance(schema.get("required"), list):
            required.update(key for key in schema["required"] if isinstance(key, str))
        for keyword in ("anyOf", "oneOf"):
            members = schema.get(keyword)
            if isinstance(members, list) and members and id(members) not in expanded:
                expanded.add(id(members))
                alternatives.append(members)
    for members in alternatives:
        shapes = [_object_shape(member, root, expanded) for member in members]
        declared: dict[str, list[Any]] = {}
        for member_properties, _ in shapes:
            for key, schema in member_properties.items():
                declared.setdefault(key, []).append(schema)
        for key, schemas in declared.items():
            if key not in properties:
                properties[key] = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        required.update(set.intersection(*(member_required for _, member_required in shapes)))
    return properties, required


def _untyped_value(raw: str) -> Any:
    # P-VAL-3: without a schema only an unmistakable object or array is decoded.
    stripped = raw.strip()
    if stripped[:1] in ("{", "["):
        try:
            parsed = _strict_json(stripped)
        except _NotJson:
            return raw
        if isinstance(parsed, (dict, list)):
            return parsed
    return raw


def _fitted(parsed: Any, allowed: set[str], raw: str) -> Any:
    if isinstance(parsed, bool):
        return parsed if "boolean" in allowed else raw
    if parsed is None:
        return None if "null" in allowed else raw
    if isinstance(parsed, int):
        return parsed if allowed & {"integer", "number"} else raw
    if isinstance(parsed, float):
        if "number" in allowed:
            return parsed
        if "integer" in allowed:
            # the number the text says, not its float: 1e23 is 10**23 (the float, 99999999999999991611392), and
            # 1.0000000000000000001 is no integer (its float is 1.0); the float is finite, so at most 309 digits
            exact = Decimal(raw.strip())
            if exact == exact.to_integral_value():
                return int(exact)
        return raw
    if isinstance(parsed, dict):
        return parsed if "object" in allowed else raw
    if isinstance(parsed, list):
        return parsed if "array" in allowed else raw
    return raw


def _strict_json(text: str) -> Any:
    """`strict_json_loads`, raising _NotJson."""
    try:
        return strict_json_loads(text)
    except (ValueError, RecursionError) as error:
        raise _NotJson from error


class LoneSurrogateError(ValueError):
    """JSON text whose string escapes decode to a lone UTF-16 surrogate (`strict_json_loads`)."""


def strict_json_loads(text: str) -> Any:
    """json.loads without NaN/Infinity, without overflowing floats (1e400 would become inf) and without lone
    surrogates (JSON's `\\ud800` escape decodes to one; such text cannot be encoded as UTF-8, so a value holding
    one could not be sent back: LoneSurrogateError). Raises ValueError (or RecursionError) for anything else."""
    value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    check_no_lone_surrogate(text, value)
    return value


def check_no_lone_surrogate(text: str, value: Any) -> None:
    """Raises LoneSurrogateError when `value`, read from the JSON `text`, holds a lone UTF-16 surrogate (only a
    `\\u` escape in the text can make one)."""
    if "\\u" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise LoneSurrogateError("the JSON holds a lone UTF-16 surrogate") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} overflows a double")
    return number


def _json_type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def resolve_local_reference(reference: str, root: Mapping[str, Any]) -> Any:
    """The schema a local `$ref` (`#`, `#/$defs/Name`, …) points to inside `root`, or None."""
    found = local_reference_target(reference, root)
    return None if found is None else found[1]


def local_reference_target(reference: str, root: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The path (`.$defs.Item`, `.prefixItems[0]`; "" for `#`) and schema a local `$ref` points to in `root`; None
    for another reference, or one that points nowhere."""
    if reference == "#":
        return "", root
    if not reference.startswith("#/"):
        return None
    path, target = "", root
    for token in reference[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(target, Mapping) and token in target:
            path, target = f"{path}.{token}", target[token]
        elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
            path, target = f"{path}[{token}]", target[int(token)]
        else:
            return None
    return path, target
