"""The request's declared tools, as the output parser sees them: names to resolve, schemas to type values.

Tools arrive OpenAI-style (`{"type": "function", "function": {...}}`) or as bare function objects. The
server validates them (`normalize_tools`); this view is lenient and skips entries it cannot read, because
the parser must never fail on its inputs (P-STREAM-8).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from glimmer.protocol.value_typing import object_shape


def function_of(tool: Any) -> Mapping[str, Any] | None:
    """The function object of a wrapped or bare tool, or None when `tool` is neither."""
    if not isinstance(tool, Mapping):
        return None
    wrapped = tool.get("function")
    return wrapped if isinstance(wrapped, Mapping) else tool


class ToolRegistry:
    """Declared tool names and their parameter schemas."""

    def __init__(self, tools: Iterable[Any] | None):
        self._parameters: dict[str, Mapping[str, Any]] = {}
        self._properties: dict[str, dict[str, Any]] = {}  # through a root `$ref` and `allOf` (object_shape)
        for tool in tools or ():
            function = function_of(tool)
            name = function.get("name") if function is not None else None
            if not isinstance(name, str) or name in self._parameters:
                continue
            parameters = function.get("parameters")
            self._parameters[name] = parameters if isinstance(parameters, Mapping) else {}
            self._properties[name] = object_shape(self._parameters[name])[0]

    def __bool__(self) -> bool:
        return bool(self._parameters)

    @property
    def names(self) -> list[str]:
        return list(self._parameters)

    def resolve(self, name: str) -> str | None:
        """The declared name `name` refers to, or None (P-NAME-1).

        Exact match first. Otherwise, when the first two dot-segments are equal and dropping one of them
        gives a declared name, that name: the template lists a bare tool `lookup` as recipient `"lookup.*"`,
        so the model writes `lookup.lookup` (and `cal.cal.find` for `cal.find`). Declared names are never
        rewritten, and there is no suffix or head matching.
        """
        if name in self._parameters:
            return name
        segments = name.split(".")
        if len(segments) >= 2 and segments[0] == segments[1]:
            collapsed = ".".join(segments[1:])
            if collapsed in self._parameters:
                return collapsed
        return None

    def declares_parameter(self, tool_name: str, key: str) -> bool:
        return key in self._properties.get(tool_name, {})

    def parameter_schema(self, tool_name: str, key: str) -> tuple[Any, Mapping[str, Any]]:
        """(schema of parameter `key` or None when undeclared, the tool's whole parameters schema)."""
        return self._properties.get(tool_name, {}).get(key), self._parameters.get(tool_name, {})
