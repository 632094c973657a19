"""The jinja2 environment chat templates run in, matching HF `apply_chat_template` (P-TMPL-2).

A chat template is untrusted input: it comes with a downloaded checkpoint or from an operator's file. It
runs in an immutable sandbox (no attribute access to Python internals, no mutation of the inputs) with the
settings and helpers Hugging Face transformers gives templates, so a template renders here exactly as it
renders there:

- `trim_blocks` and `lstrip_blocks` on, the `loopcontrols` extension (`{% break %}`, `{% continue %}`), and
  the `{% generation %}` block, which transformers uses to mark assistant text and which renders its body;
- `tojson` as `json.dumps(ensure_ascii=False)` with default separators, unsorted keys and **no HTML
  escaping** (jinja's builtin filter escapes `<`, `>`, `&` and `'`, which would change every tool schema);
- `raise_exception(message)`, `strftime_now(format)` (local wall clock), and `dict`/`namespace` that refuse
  names starting with an underscore.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _check_attribute_name(name: object) -> None:
    # A namespace is a real Python object the template can write to; underscore names are how sandbox escapes
    # reach interpreter internals, so they are refused outright.
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates may not use underscore-prefixed names on a namespace or dict, got {name!r}"
        )


class _SafeNamespace(jinja2.utils.Namespace):
    """`namespace(...)` for templates, refusing underscore-prefixed attributes."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - mirrors jinja's Namespace signature
        self, positional = args[0], args[1:]
        attributes = dict(*positional, **kwargs)
        for name in attributes:
            _check_attribute_name(name)
        jinja2.utils.Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_attribute_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


class _SafeDictConstructor:
    """`dict(...)` for templates: builds plain dicts and exposes nothing else of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        result = dict(*args, **kwargs)
        for name in result:
            _check_attribute_name(name)
        return result

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}`: transformers' marker of assistant text; renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        line = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(line)

    def _render_body(self, caller: Any) -> str:
        return caller()


def make_environment() -> ImmutableSandboxedEnvironment:
    """A fresh sandboxed environment with HF's settings and helpers."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _SafeDictConstructor()
    environment.globals["namespace"] = _SafeNamespace
    return environment
