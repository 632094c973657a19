"""Rendering a chat with the checkpoint's (or operator's) jinja template, as HF `apply_chat_template` does.

`ChatTemplate` compiles a template once; `render` passes the template exactly what transformers passes it
(P-TMPL-2, P-TMPL-3): `messages`, `tools` (None when there are none), `documents` (None),
`add_generation_prompt`, the special-token variables (`bos_token`, `eos_token`, …), `reasoning_strength`
when the request resolved one (P-EFF-1), and then the request's extra template kwargs (`current_date`,
`knowledge_cutoff`, `tool_namespace_descriptions`, …). A kwarg that would replace one of the fixed variables
is a request error naming it.

Inputs are rebuilt from plain JSON types before the template sees them, so the template can neither reach
methods of rich objects nor modify the caller's messages. Like transformers 5, a message's reasoning given
as `thinking` or `reasoning` is also offered as `reasoning_content` (and `thinking`).

The rendered prompt contains the bos text the template writes: tokenize it **without** adding special tokens
(P-TMPL-5, architecture.md §14.22), or the model sees a second bos.

`render_prompt` keeps control tokens that callers spell in their text apart from the template's markup
(see `control_tokens`), so that a user cannot forge a turn; `render` pastes caller text as it is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol

import jinja2
import jinja2.meta

from glimmer.errors import ConfigError, GlimmerError, RequestError
from glimmer.protocol.control_tokens import ControlTokenGuard, RenderedPrompt
from glimmer.protocol.jinja_sandbox import make_environment
from glimmer.protocol.tokens import BOS, EOS, FRAMING_MARKERS, GENERATION_PROMPT, PAD

logger = logging.getLogger(__name__)

DEFAULT_SPECIAL_TOKENS: Mapping[str, str] = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
"""The Muse Glimmer tokenizer's named tokens, used when the caller passes none."""

TOKEN_VARIABLES = frozenset(
    {"bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token",
     "additional_special_tokens"}
)
"""Template variables that carry token spellings; request kwargs may not replace them (P-TMPL-3)."""

FIXED_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt"})
"""Template variables the renderer owns; request kwargs may not replace them (P-TMPL-3)."""
RENDERING_ARGUMENTS = frozenset({"continue_final_message", "chat_template"})
"""Arguments of transformers' `apply_chat_template` that vLLM's `LLM.chat` also reads from its `chat_template_kwargs`;
they are no template variables, and a template never reads them: refused as kwargs, not silently ignored."""

TEXT_KWARGS = ("current_date", "knowledge_cutoff")
"""Kwargs of the Muse Glimmer template (protocol.md §2.1) that it writes into the prompt as text; null or empty leaves
the template's default."""

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names under which clients send a message's reasoning; the first is the one chat templates read (transformers 5,
and the renderer, offer it under each)."""


class ChatTemplateError(GlimmerError, ValueError):
    """The chat template failed to compile or to render; `template_message` is the template's own message.

    The server answers 400 with this message: the usual cause is a request the template rejects (for
    example tool-call arguments that are not an object, or a `raise_exception` in the template).
    """

    def __init__(self, template_message: str):
        super().__init__(f"chat template error: {template_message}")
        self.template_message = template_message


class ChatTemplate:
    """A compiled chat template. Compile once per source (it is immutable and safe to share)."""

    def __init__(self, source: str):
        """Raises ChatTemplateError when the source is not a valid jinja template."""
        if not isinstance(source, str):
            raise ChatTemplateError(f"the template source must be a string, got {type(source).__name__}")
        self.source = source
        try:
            self.sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()
            environment = make_environment()
            self._template = environment.from_string(source)
            # the variables it reads from the caller (messages, tools, documents, its kwargs, ...)
            self.variables = frozenset(jinja2.meta.find_undeclared_variables(environment.parse(source)))
        except jinja2.TemplateSyntaxError as error:
            raise ChatTemplateError(f"line {error.lineno}: {error.message}") from error
        except jinja2.TemplateError as error:
            raise ChatTemplateError(str(error)) from error
        except Exception as error:  # a source can fail otherwise: nesting past the compiler's recursion limit, ...
            raise ChatTemplateError(f"{type(error).__name__}: {error}") from error

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        special_tokens: Mapping[str, str] | None = None,
        reasoning_strength: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for `messages`, caller text pasted as it is (see `render_prompt` for a prompt that
        keeps control tokens a caller wrote apart).

        `special_tokens` maps token variable names to spellings (default: the Muse Glimmer tokenizer's
        `bos_token`, `eos_token`, `pad_token`). `reasoning_strength` is passed only when not None (the
        template's own default applies otherwise); it replaces a `reasoning_strength` inside
        `chat_template_kwargs`, from which the server resolved it (P-EFF-1). `chat_template_kwargs` (the
        request's field) and `template_kwargs` are further template variables.

        Raises RequestError when `messages` is not a list of mappings or a kwarg would replace `messages`,
        `tools`, `add_generation_prompt` or a token variable (P-TMPL-3); ChatTemplateError when the
        template fails.
        """
        return self.render_prompt(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                  special_tokens=special_tokens, reasoning_strength=reasoning_strength,
                                  chat_template_kwargs=chat_template_kwargs, **template_kwargs).text

    def render_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        special_tokens: Mapping[str, str] | None = None,
        reasoning_strength: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        control_tokens: Collection[str] = (),
        **template_kwargs: Any,
    ) -> RenderedPrompt:
        """The prompt for `messages`, as `render` makes it, except that `control_tokens` spelled in any string
        of the messages, tools or template kwargs become placeholders (`RenderedPrompt.literals`), so that the
        tokenizer can keep them plain text: only the template's own markup frames the prompt.

        Same arguments and errors as `render`.
        """
        guard = ControlTokenGuard(control_tokens)
        tokens = dict(DEFAULT_SPECIAL_TOKENS if special_tokens is None else special_tokens)
        extra = {**(chat_template_kwargs or {}), **template_kwargs}
        self.check_kwargs(extra, tokens)
        context: dict[str, Any] = {**tokens}
        context["documents"] = None
        context.update({name: _plain(value, guard) for name, value in extra.items()})
        if reasoning_strength is not None:
            context["reasoning_strength"] = reasoning_strength
        context["messages"] = _template_messages(messages, guard)
        context["tools"] = _plain(list(tools), guard) if tools else None
        context["add_generation_prompt"] = bool(add_generation_prompt)
        try:
            text = self._template.render(**context)
        except jinja2.TemplateError as error:
            raise ChatTemplateError(error.message or type(error).__name__) from error
        except Exception as error:  # a template can fail in any Python operation it performs
            raise ChatTemplateError(f"{type(error).__name__}: {error}") from error
        return guard.prompt(text)

    def check_kwargs(self, template_kwargs: Mapping[str, Any], special_tokens: Mapping[str, str] | None = None) -> None:
        """Raises RequestError for template kwargs that every render would refuse (`render`'s refusals): one replacing
        a fixed or token variable, a value no template can read, a kwarg of the Muse Glimmer template of another type
        than it renders. A server checks its default kwargs so, once at start."""
        _refuse_fixed_kwargs(template_kwargs, DEFAULT_SPECIAL_TOKENS if special_tokens is None else special_tokens)
        _refuse_opaque_kwargs(template_kwargs)
        _refuse_mistyped_kwargs(template_kwargs, self.variables)


class FramingTokenizer(Protocol):
    """What the probe of `check_chat_template` needs of a tokenizer (the engine's `Tokenizer` has it)."""

    special_tokens: Mapping[str, str]
    bos_token: str | None
    prompt_bos_token: str | None  # the named bos, else the one encoding with special tokens begins a text with
    prompt_bos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


_PROBE_KWARGS = {"current_date": "2026-01-01"}


def check_chat_template(template: ChatTemplate, tokenizer: FramingTokenizer, *, max_chars: int | None = None) -> None:
    """Render a probe chat: the prompt must end with the generation prompt (P-TMPL-8), each framing marker it writes
    must be one token of the tokenizer (P-TOK-1), and it must hold one bos (P-TMPL-5).
    Raises ConfigError, or ChatTemplateError where the template fails to render (the server runs it at start and
    on a request's own template, `glimmer inspect` too). `max_chars`: a longer probe prompt is a ConfigError
    before it is tokenized."""
    prompt = template.render([{"role": "user", "content": "hello"}], special_tokens=tokenizer.special_tokens,
                             chat_template_kwargs=_PROBE_KWARGS)
    # the probe's messages are plain text: a lone surrogate in its prompt is the template's own (a request's prompt
    # is checked where it is tokenized, and refused naming `prompt`)
    _refuse_lone_surrogates(prompt)
    if not prompt.endswith(GENERATION_PROMPT):
        raise ConfigError(f"the chat template's generation prompt must be exactly {GENERATION_PROMPT!r} "
                          f"(P-TMPL-8); a probe prompt ends {prompt[-40:]!r}")
    if max_chars is not None and len(prompt) > max_chars:
        raise ConfigError(f"the chat template renders a one-message probe chat as {len(prompt):,} characters, more "
                          f"than a prompt may have ({max_chars:,})")
    for marker in FRAMING_MARKERS:
        if marker in prompt and len(tokenizer.encode(marker, add_special_tokens=False)) != 1:
            raise ConfigError(f"the chat template writes {marker!r}, which is no token of the tokenizer: every chat "
                              "prompt's markup would be tokenized as text; use the tokenizer.json published with the "
                              "model, or a template for this tokenizer")
    bos, bos_id = tokenizer.prompt_bos_token, tokenizer.prompt_bos_token_id
    # a bos the files do not name (bos_token None) a template cannot write as {{ bos_token }}: the engine adds the
    # post-processor's where the prompt does not begin with it (LLMEngine.encode_prompt)
    added = tokenizer.bos_token is None and bos is not None and not prompt.startswith(bos)
    ids = tokenizer.encode(prompt, add_special_tokens=added)
    if bos_id is not None and (ids.count(bos_id) != 1 or ids[0] != bos_id):
        raise ConfigError(f"the chat template must start the prompt with exactly one {bos!r} "
                          f"(P-TMPL-5); a probe prompt has {ids.count(bos_id)}")


@lru_cache(maxsize=32)
def compiled_template(source: str) -> ChatTemplate:
    """The ChatTemplate for `source`, compiled once per distinct source text."""
    return ChatTemplate(source)


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template: str,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    reasoning_strength: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    **template_kwargs: Any,
) -> str:
    """Render `messages` with the template source `template` (compiled once and cached).

    Same arguments and errors as `ChatTemplate.render`.
    """
    return compiled_template(template).render(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        special_tokens=special_tokens,
        reasoning_strength=reasoning_strength,
        chat_template_kwargs=chat_template_kwargs,
        **template_kwargs,
    )


def _refuse_lone_surrogates(text: str) -> None:
    """ChatTemplateError for a prompt holding a lone surrogate (a template's string escape `"\\ud800"` writes one):
    it is no text, and no tokenizer takes it."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ChatTemplateError(f"the rendered prompt holds a lone surrogate ({text[error.start]!r} at character "
                                f"{error.start}), which is no text; a string escape in the template or a message "
                                "wrote it") from None


def _refuse_fixed_kwargs(template_kwargs: Mapping[str, Any], tokens: Mapping[str, str]) -> None:
    for name in template_kwargs:
        if name in RENDERING_ARGUMENTS:
            raise RequestError(
                f"chat_template_kwargs may not set {name!r}: it is an argument of apply_chat_template, not a template "
                f"variable, and chat rendering here does not take it (in Python, LLM.chat(messages, {name}=...) and "
                f"tokenizer.apply_chat_template(messages, {name}=..., tokenize=False) take it; a checkpoint's "
                "template is replaced with --chat-template FILE)",
                param="chat_template_kwargs",
            )
        if name in FIXED_VARIABLES or name in TOKEN_VARIABLES or name in tokens:
            raise RequestError(
                f"chat_template_kwargs may not set {name!r}: the renderer sets it (pass messages, tools and "
                "add_generation_prompt as request fields on the server, or as arguments in the Python API: "
                "LLM.chat(messages, tools=...), tokenizer.apply_chat_template(messages, tools=..., "
                "add_generation_prompt=...); token variables come from the tokenizer)",
                param="chat_template_kwargs",
            )


def _refuse_opaque_kwargs(template_kwargs: Mapping[str, Any]) -> None:
    """RequestError naming a template kwarg that holds a value `_plain` cannot pass on (a `datetime.date`, a
    `Decimal`, ...): the template would read its `<TypeName>` placeholder, as transformers' does, and a
    `current_date=datetime.date.today()` would tell the model the date is `<date>`. Likewise NaN and the infinities
    (a request body's `NaN`, `Infinity`, `1e400`), which the template would write as `nan` / `inf`."""
    pending = [(f"chat_template_kwargs.{name}", value) for name, value in template_kwargs.items()]
    while pending:
        where, value = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise RequestError(f"{where} is {value!r}, which is no JSON value (the template would write '{value!r}'; a "
                               "request body's NaN, Infinity or 1e400 reads as one); pass a finite number or a string",
                               param="chat_template_kwargs")
        if value is None or isinstance(value, (str, int, float)):
            continue
        if isinstance(value, Mapping):
            pending += [(f"{where}.{key}", item) for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            pending += [(f"{where}[{index}]", item) for index, item in enumerate(value)]
        elif not (dataclasses.is_dataclass(value) and not isinstance(value, type)) and not callable(
                getattr(value, "model_dump", None)):
            raise RequestError(f"{where} is a {type(value).__name__}, which a chat template cannot read (it would "
                               f"render as '<{type(value).__name__}>'); pass a string, number, boolean, list or "
                               f"object instead, such as {str(value)!r}", param="chat_template_kwargs")


def _refuse_mistyped_kwargs(template_kwargs: Mapping[str, Any], variables: Collection[str]) -> None:
    """RequestError naming a kwarg of the Muse Glimmer template (protocol.md §2.1) of a type it cannot render, where the
    template reads it: `tool_namespace_descriptions` as a string, list or null failed inside the template ("Object of
    type Undefined is not JSON serializable", naming `messages`) or was silently ignored, and a `current_date` of
    `true` rendered "Current date: True."."""
    if "tool_namespace_descriptions" in variables:
        _refuse_mistyped_descriptions(template_kwargs.get("tool_namespace_descriptions", {}))
    for name in TEXT_KWARGS:  # a number is written as text by any template (`knowledge_cutoff: 2024`)
        value = template_kwargs.get(name)
        if name in variables and (isinstance(value, bool) or not isinstance(value, str | int | float | None)):
            raise RequestError(f"chat_template_kwargs.{name} is {_json_type(value)}; it must be a string or a number "
                               '(or null for the template\'s default), such as "2026-01-01"',
                               param=f"chat_template_kwargs.{name}")


def _refuse_mistyped_descriptions(descriptions: Any) -> None:
    """RequestError unless `descriptions` maps namespaces to strings; a key with a dot is no namespace (a tool's name
    up to its first dot, §2.1), and its description, matching none, would be silently left out."""
    where = "chat_template_kwargs.tool_namespace_descriptions"
    if not (isinstance(descriptions, Mapping) and all(isinstance(text, str) for text in descriptions.values())):
        if isinstance(descriptions, Mapping):
            key = next(key for key, text in descriptions.items() if not isinstance(text, str))
            where, descriptions = f"{where}.{key}", descriptions[key]
        raise RequestError(f"{where} is {_json_type(descriptions)}; it must be an object mapping each tool namespace "
                           'to its description string, such as {"calendar": "Reads and writes the user\'s calendar"}',
                           param="chat_template_kwargs.tool_namespace_descriptions")
    dotted = next((key for key in descriptions if isinstance(key, str) and "." in key), None)
    if dotted is not None:
        raise RequestError(f"{where} names {dotted!r}, which is no namespace (a namespace is a tool's name up to its "
                           "first dot), so its description would reach no prompt; describe the namespace "
                           f"{dotted.split('.')[0]!r} instead", param=where)


def _json_type(value: Any) -> str:
    """How a request body spells the type of `value`: "null", "a boolean", "a number", "a string", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an object" if isinstance(value, Mapping) else "a list"


def _template_messages(messages: Any, text: Callable[[str], str]) -> list[dict[str, Any]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise RequestError("messages must be a list of message objects", param="messages")
    plain_messages = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RequestError(f"messages[{index}] must be an object, got {type(message).__name__}",
                               param="messages")
        plain_messages.append(_with_reasoning_aliases(_plain(message, text)))
    return plain_messages


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    # transformers 5 offers reasoning under every name templates read; a template written for `thinking` and
    # one written for `reasoning_content` both see it.
    reasoning = next((message[field] for field in REASONING_FIELDS if message.get(field) is not None), None)
    if reasoning is None:
        return message
    aliased = {"thinking": reasoning}
    aliased.update(message)
    aliased["reasoning_content"] = reasoning
    return aliased


_JSON_SCALARS = frozenset({int, float, bool, type(None)})


def _plain(value: Any, text: Callable[[str], str]) -> Any:
    """`value` rebuilt from JSON-like types, each string passed through `text`; anything else becomes an
    inert `<TypeName>` placeholder. What a request body parses to (exactly dict, list, str, int, float, bool, None)
    takes a fast path, checked by exact type; the rest, subclasses, tuples and objects included, `_plain_any`."""
    kind = type(value)
    if kind is str:
        return text(value)
    if kind is dict:
        return {text(key) if type(key) is str else _plain(key, text):
                text(item) if type(item) is str else _plain(item, text) for key, item in value.items()}
    if kind is list:
        return [text(item) if type(item) is str else _plain(item, text) for item in value]
    if kind in _JSON_SCALARS:
        return value
    return _plain_any(value, text)


def _plain_any(value: Any, text: Callable[[str], str]) -> Any:
    """`_plain` of any value, by the JSON-like type it is an instance of (a str subclass as its str, a Mapping as a
    dict, ...), its items through `_plain`."""
    if value is None or type(value) in (int, float, bool):
        return value
    if isinstance(value, str):
        return text(str.__str__(value))
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key, text): _plain(item, text) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item, text) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item, text) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _plain(getattr(value, field.name), text) for field in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return _plain(model_dump(), text)
    return f"<{type(value).__name__}>"
