"""Bounds of a JSON schema that no value meets, looked for only where every valid instance needs them.

A strict schema whose bounds leave no value (`minLength` 4 with `maxLength` 2; an `integer` between
`exclusiveMinimum` 2 and `exclusiveMaximum` 3; `multipleOf` 7 between 3 and 5) is refused by the grammar engine in
its own words ("required property 'x' is unsatisfiable", "range [7, 0] does not contain a multiple of 7"), which
name neither the keyword nor where it is. `empty_bounds` names the first such schema by its path and its bounds.

Only the schemas every valid instance needs are looked at: the root, the members of its `allOf`, the properties an
object requires, the items an array must hold, and the targets of their `$ref`s. An `anyOf`/`oneOf` branch (another
may be met), an optional property or an array's items beyond `minItems` (they may be left out) and a `$defs` entry
nothing needed points to are not: a schema with such bounds there is still met by some value. A bound is read only
where the schema's own `type` admits no value it does not bound (`minLength` of a `["string", "integer"]` leaves
integers free).

`endless_reference` finds the other schema no value meets that the engine takes: a `$ref` cycle with no way out (a
property that refers to itself, or an object that requires a property of its own kind), which only an endless value
would meet, so a forced call or an answer held to it never finished.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

from glimmer.protocol.value_typing import is_json_number, local_reference_target

_COUNT_BOUNDS = (("minLength", "maxLength", "string"), ("minItems", "maxItems", "array"),
                 ("minProperties", "maxProperties", "object"))
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum")


def empty_bounds(schema: Mapping[str, Any], *, every_property: bool = False,
                 start: tuple[str, Any] | None = None) -> tuple[str, str] | None:
    """The path (`.properties.x`, `.$defs.Item`; "" for `schema` itself) and, in words, the bounds of the first schema
    every instance of `schema` needs whose bounds no value meets; None when there is none. `every_property`: each
    property of the root object is needed, optional ones too (a tool's parameters: a call may write any of them, each
    as a value of its own). `start`: the path and node of a subschema of `schema` to look from instead of its root
    (its `$ref`s still point into `schema`)."""
    for path, node in _needed_schemas(schema, start or ("", schema), every_property):
        reason = _count_bounds_past_each_other(node) or _empty_number_range(node)
        if reason:
            return path, reason
    return None


def without_references_to_empty(schema: Any) -> Any:
    """`schema` with each local `$ref` to a schema whose needed bounds no value meets (`empty_bounds` from there)
    written `false`, the schema no value meets: the same values meet it, but the grammar engine refused every schema
    holding such a reference, even in an `anyOf` branch another branch leaves satisfiable or an optional property.
    A `$ref` of the root itself is kept (the engine names that refusal). `schema` itself where it holds none."""
    if not isinstance(schema, Mapping):
        return schema
    verdicts: dict[str, bool] = {}

    def empty(reference: str) -> bool:
        if reference not in verdicts:
            target = local_reference_target(reference, schema)
            verdicts[reference] = target is not None and empty_bounds(schema, start=target) is not None
        return verdicts[reference]

    def rewritten(node: Any) -> Any:
        if isinstance(node, list):
            return [rewritten(member) for member in node]
        if not isinstance(node, Mapping):
            return node
        reference = node.get("$ref")
        if isinstance(reference, str) and empty(reference):
            return False
        return {key: value if key in ("enum", "const") else rewritten(value) for key, value in node.items()}

    kept = {key: value if key in ("enum", "const") else rewritten(value) for key, value in schema.items()}
    return schema if kept == schema else kept


def endless_reference(schema: Mapping[str, Any]) -> tuple[str, str] | None:
    """The path of the first `$ref` every instance of `schema` needs (`_needed_schemas`) whose target only an endless
    value meets, and the reference ("" and "" where every `anyOf` branch leads into such a cycle); None when a finite
    value may meet `schema`. A target is met by a finite value where some way through it reaches no reference back
    (an `anyOf` branch, an optional property, an array that may be empty, a type beside `object`/`array`): the
    references that have one are found by widening the set from none, so a cycle stays outside. Only local
    references are followed; another is taken as met."""
    targets: dict[str, Any] = {}  # each reference met so far, and its target schema
    finite: set[str] = set()
    while True:
        known = (len(targets), len(finite))
        root_met = _finitely_met(schema, schema, finite, targets)
        for reference, target in list(targets.items()):
            if reference not in finite and (target is None or _finitely_met(target[1], schema, finite, targets)):
                finite.add(reference)
        if known == (len(targets), len(finite)):
            break
    if root_met:
        return None
    for path, node in _needed_schemas(schema, ("", schema), False):
        if isinstance(node.get("$ref"), str) and node["$ref"] not in finite:
            return path, node["$ref"]
    return "", ""  # the cycle lies in branches (`anyOf`) none of which leaves it


def _finitely_met(node: Any, root: Mapping[str, Any], finite: set[str], targets: dict[str, Any]) -> bool:
    """Whether a finite value may meet `node` of `root`, given the references known to be met by one; each reference
    looked at is added to `targets` (`endless_reference`)."""
    if not isinstance(node, Mapping):
        return True  # `false` and the like are no cycle: the engine refuses them by itself
    reference = node.get("$ref")
    if isinstance(reference, str) and reference not in finite:
        targets.setdefault(reference, local_reference_target(reference, root))
        return False
    every = node.get("allOf")
    if isinstance(every, list) and not all(_finitely_met(member, root, finite, targets) for member in every):
        return False
    for keyword in ("anyOf", "oneOf"):
        branches = node.get(keyword)
        if isinstance(branches, list) and branches and not any(
                _finitely_met(member, root, finite, targets) for member in branches):
            return False
    types = _own_types(node)
    if not types or types - {"object", "array"}:
        return True
    return any(all(_finitely_met(member, root, finite, targets) for _, member, _ in
                   _needed_members({**node, "type": kind}, "", False)) for kind in types)


def _needed_schemas(root: Mapping[str, Any], start: tuple[str, Any],
                    every_property: bool) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The schemas every instance of `start` (a subschema of `root`, or `root`) is checked against, each once, with
    its path in `root`."""
    seen: set[int] = set()
    pending: list[tuple[str, Any, bool]] = [(*start, every_property)]
    while pending:
        path, node, whole_object = pending.pop()
        if not isinstance(node, Mapping) or id(node) in seen:
            continue
        seen.add(id(node))
        yield path, node
        needed = list(_needed_members(node, path, whole_object))
        reference = node.get("$ref")
        if isinstance(reference, str):
            target = local_reference_target(reference, root)
            if target is not None:
                needed.append((*target, whole_object))
        pending.extend(reversed(needed))


def _needed_members(node: Mapping[str, Any], path: str, whole_object: bool) -> Iterator[tuple[str, Any, bool]]:
    """The subschemas of `node` that every instance of it is checked against (`_needed_schemas`)."""
    every = node.get("allOf")
    if isinstance(every, list):
        yield from ((f"{path}.allOf[{index}]", member, whole_object) for index, member in enumerate(every))
    types = _own_types(node)
    if types == {"object"} and isinstance(node.get("properties"), Mapping):
        required = node.get("required")
        names = node["properties"] if whole_object else required if isinstance(required, list) else []
        yield from ((f"{path}.properties.{name}", node["properties"][name], False) for name in names
                    if isinstance(name, str) and name in node["properties"])
    if types == {"array"}:
        least = node.get("minItems")
        least = least if _finite(least) else 0
        prefix = node.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        yield from ((f"{path}.prefixItems[{index}]", member, False) for index, member in enumerate(prefix)
                    if index < least)
        items = node.get("items")
        if isinstance(items, Mapping) and least > len(prefix):
            yield f"{path}.items", items, False


def _own_types(node: Mapping[str, Any]) -> set[str] | None:
    """The JSON types the schema's own `type` admits; None without one (every type)."""
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list) and all(isinstance(name, str) for name in declared):
        return set(declared)
    return None


def _count_bounds_past_each_other(node: Mapping[str, Any]) -> str | None:
    """A lower count bound above its upper one (`minLength` 4 with `maxLength` 2) of a schema of that type only."""
    types = _own_types(node)
    for low, high, kind in _COUNT_BOUNDS:
        if types != {kind}:
            continue
        if is_json_number(node.get(low)) and is_json_number(node.get(high)) and node[low] > node[high]:
            return (f"{low} {node[low]} is above {high} {node[high]}, so no value meets both; lower {low} or raise "
                    f"{high}")
    return None


def _empty_number_range(node: Mapping[str, Any]) -> str | None:
    """Numeric bounds of a number or integer schema that leave no value: a lower bound above the upper one (or at it,
    either exclusive), no integer between them for an `integer`, or no multiple of `multipleOf` between them."""
    types = _own_types(node)
    if not types or not types <= {"integer", "number"}:
        return None
    lower = _tightest(node, _LOWER_BOUNDS)
    upper = _tightest(node, _UPPER_BOUNDS)
    if lower is None or upper is None:
        return None
    (low, low_value, low_open), (high, high_value, high_open) = lower, upper
    between = f"{low} {node[low]} and {high} {node[high]}"
    if low_value > high_value or low_value == high_value and (low_open or high_open):
        relation = "is above" if low_value > high_value else "is not below"
        return f"{low} {node[low]} {relation} {high} {node[high]}, so no number meets both; lower {low} or raise {high}"
    step = node.get("multipleOf")
    step = _exact(step) if _finite(step) and step > 0 else None
    if "number" not in types:
        first = math.floor(low_value) + 1 if low_open else math.ceil(low_value)
        last = math.ceil(high_value) - 1 if high_open else math.floor(high_value)
        if first > last:
            return f"no integer lies between {between}; widen the bounds, or let the value be a number"
        if step is not None and _first_multiple(Fraction(first), False, Fraction(step.numerator)) > last:
            return (f"no integer multiple of multipleOf {node['multipleOf']} lies between {between}; widen the "
                    "bounds or change multipleOf")
        return None
    if step is not None:
        first = _first_multiple(low_value, low_open, step)
        if first > high_value or first == high_value and high_open:
            return (f"no multiple of multipleOf {node['multipleOf']} lies between {between}; widen the bounds or "
                    "change multipleOf")
    return None


def _tightest(node: Mapping[str, Any], keywords: tuple[str, str]) -> tuple[str, Fraction, bool] | None:
    """The tighter of a schema's inclusive and exclusive lower (or upper) bounds: its keyword, value and whether it is
    exclusive; None without either. Values are read as the decimals the request wrote (`0.1` is one tenth)."""
    bounds = [(keyword, _exact(node[keyword]), keyword.startswith("exclusive")) for keyword in keywords
              if _finite(node.get(keyword))]
    if not bounds:
        return None
    upper = keywords == _UPPER_BOUNDS
    # tighter: a higher lower bound (a lower upper one), and at the same value the exclusive one
    return max(bounds, key=lambda bound: ((-bound[1] if upper else bound[1]), bound[2]))


def _finite(value: Any) -> bool:
    """Whether `value` is a JSON number other than NaN or an infinity. An integer always is, however large: one past
    a float's range (`10**400`) is compared as the integer it is, never made a float (an OverflowError)."""
    return is_json_number(value) and (isinstance(value, int) or math.isfinite(value))


def _exact(value: int | float) -> Fraction:
    """A finite JSON number as the exact value the request wrote: an integer as itself, a float as its shortest
    decimal (`0.1` is one tenth, not the float's binary value)."""
    return Fraction(value) if isinstance(value, int) else Fraction(repr(value))


def _first_multiple(low: Fraction, exclusive: bool, step: Fraction) -> Fraction:
    """The least multiple of `step` at or above `low` (above it, `exclusive`)."""
    count = math.floor(low / step) + 1 if exclusive else math.ceil(low / step)
    return count * step
