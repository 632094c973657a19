"""Which `reasoning_strength` a request renders with (protocol.md §2.3, P-EFF-1..4).

Muse Glimmer's template reads a `reasoning_strength` kwarg (`low`, `medium`, `high`, `xhigh`; it defaults to
`high` itself). OpenAI clients send `reasoning_effort` instead. The rule, in order of precedence:

1. An explicit `reasoning_strength` (top-level field or `chat_template_kwargs`) is used, lower-cased; a
   value outside low/medium/high/xhigh is a request error (P-EFF-3).
2. Else `reasoning_effort` (top-level, Responses `reasoning.effort`, or `chat_template_kwargs`) maps as
   none → low, minimal → low, low/medium/high/xhigh unchanged, case-insensitive; anything else is a request
   error (P-EFF-2). There is no way to turn reasoning off: `none` asks for the least there is.
3. Else `enable_thinking=false` (top-level or `chat_template_kwargs`) counts as effort `none`, i.e. `low`.
4. Else the server's default strength, if configured.
5. Else None: nothing is passed and the template's own default (`high`) applies (P-EFF-1).

A knob given both top-level and in `chat_template_kwargs` with different values is a request error. A
system prompt that mentions reasoning strength (or effort) suppresses the template's strength line; that is
the template's rule and system prompts are never edited to defeat it (P-EFF-4).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from glimmer.errors import ConfigError, RequestError

REASONING_STRENGTHS = ("low", "medium", "high", "xhigh")
"""Values of the template's `reasoning_strength` kwarg (the model card's vocabulary)."""

TEMPLATE_DEFAULT_STRENGTH = "high"
"""The strength the template reasons at when none is passed (P-EFF-1)."""

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
"""Accepted values of OpenAI `reasoning_effort`."""

_STRENGTH_OF_EFFORT = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
                       "xhigh": "xhigh"}


def strength_for_effort(effort: Any, param: str = "reasoning_effort") -> str:
    """The reasoning strength an OpenAI `reasoning_effort` asks for (P-EFF-2); RequestError otherwise."""
    if isinstance(effort, str) and effort.lower() in _STRENGTH_OF_EFFORT:
        return _STRENGTH_OF_EFFORT[effort.lower()]
    raise RequestError(f"{param}={effort!r} is not supported; use one of {', '.join(REASONING_EFFORTS)}",
                       param=param)


def checked_strength(strength: Any, param: str = "reasoning_strength") -> str:
    """`strength` lower-cased if it is one of REASONING_STRENGTHS (P-EFF-3); RequestError otherwise."""
    if isinstance(strength, str) and strength.lower() in REASONING_STRENGTHS:
        return strength.lower()
    raise RequestError(f"{param}={strength!r} is not supported; use one of {', '.join(REASONING_STRENGTHS)}",
                       param=param)


def resolve_reasoning_strength(
    *,
    reasoning_strength: Any = None,
    reasoning_effort: Any = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    enable_thinking: Any = None,
    default: str | None = None,
) -> str | None:
    """The strength to pass to the template, or None to leave the template's default (rule above).

    Raises RequestError (with `param` naming the field) for unsupported or conflicting values, and
    ConfigError for an unsupported server `default`.
    """
    template_kwargs = chat_template_kwargs or {}
    strength, param = _one_value("reasoning_strength", reasoning_strength, template_kwargs)
    if strength is not None:
        return checked_strength(strength, param)
    effort, param = _one_value("reasoning_effort", reasoning_effort, template_kwargs)
    if effort is not None:
        return strength_for_effort(effort, param)
    thinking, param = _one_value("enable_thinking", enable_thinking, template_kwargs)
    if thinking is not None and not isinstance(thinking, bool):
        raise RequestError(f"{param} must be true or false, got {thinking!r}", param=param)
    if thinking is False:
        return strength_for_effort("none")
    if default is not None:
        if not isinstance(default, str) or default.lower() not in REASONING_STRENGTHS:
            raise ConfigError(f"default reasoning strength {default!r} is not supported; use one of "
                              f"{', '.join(REASONING_STRENGTHS)}")
        return default.lower()
    return None


def _one_value(name: str, top_level: Any, template_kwargs: Mapping[str, Any]) -> tuple[Any, str]:
    """The knob's value and the field it came from, for its error to name the field the client sent: the top-level
    field's, else `chat_template_kwargs.NAME`'s."""
    in_kwargs = template_kwargs.get(name)
    if top_level is not None and in_kwargs is not None and _comparable(top_level) != _comparable(in_kwargs):
        raise RequestError(f"{name} is given twice with different values ({top_level!r} and "
                           f"chat_template_kwargs.{name}={in_kwargs!r}); give it once", param=name)
    if top_level is None and in_kwargs is not None:
        return in_kwargs, f"chat_template_kwargs.{name}"
    return top_level, name


def _comparable(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value
