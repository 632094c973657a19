"""Finding the chat template a checkpoint should be rendered with (P-TMPL-1).

Glimmer never invents a prompt format (P-TMPL-4): the template comes from the operator or from the
checkpoint. The operator's `--chat-template FILE` wins. A checkpoint directory's template is the one transformers
5.23 and vLLM render with:
- the tokenizer's: `chat_template.jinja`, else the `chat_template` field of `tokenizer_config.json` (a string, or a
  list of named templates from which `default` is taken). transformers 5 saves named templates beside it in
  `additional_chat_templates/NAME.jinja`; where that folder holds templates, the tokenizer takes them (with
  `chat_template.jinja` as `default`, a `default.jinja` there replacing it) in place of `tokenizer_config.json`'s.
- the processor's, which vLLM renders a chat without tools with, the tokenizer's rendering a chat with tools:
  `processor_config.json`'s `chat_template`, else the older separate file `chat_template.json`
  (`{"chat_template": ...}`), else the tokenizer's files above.
Glimmer renders every chat with one template, so two that differ, where transformers or vLLM would render one chat
with one and another with the other, are refused rather than one picked: a `tool_use` template other than the
default, a processor template other than the tokenizer's, or a `default.jinja` other than `chat_template.jinja`. A
GGUF checkpoint carries its template in its metadata (`tokenizer.chat_template`, a `tool_use` one as
`tokenizer.chat_template.tool_use`, which llama.cpp renders a chat with tools with), which the GGUF reader hands
over as `embedded` (and `embedded_tool_use`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from glimmer.checkpoint.broken_links import refuse_lfs_pointer, refuse_not_a_file
from glimmer.errors import CheckpointError, ConfigError, option_and_keyword
from glimmer.protocol import ChatTemplate, ChatTemplateError, check_chat_template
from glimmer.protocol.chat_template import FramingTokenizer

logger = logging.getLogger(__name__)

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# the processor's older places for its template (transformers' ProcessorMixin still reads both, before the .jinja)
LEGACY_CHAT_TEMPLATE_FILE = "chat_template.json"
PROCESSOR_CONFIG_FILE = "processor_config.json"
OVERRIDE_OPTION = option_and_keyword("--chat-template", "FILE")  # a refusal is read from either
# transformers 5 saves named templates beside chat_template.jinja in this folder, one NAME.jinja each
ADDITIONAL_TEMPLATES_DIR = "additional_chat_templates"
# the named template transformers' apply_chat_template renders a chat with tools with (get_chat_template)
TOOL_USE = "tool_use"


@dataclass(frozen=True)
class ChatTemplateSource:
    """A chat template and where it came from. `sha256` is of the UTF-8 text (for a file: its bytes). `named`: the
    checkpoint tokenizer's templates by name, where it has several (tokenizer_config.json's list, or
    `additional_chat_templates/` with `chat_template.jinja` as `default`), which transformers' `apply_chat_template`
    (and so vLLM) renders with where its `chat_template` argument is one of the names; empty where the tokenizer has
    one template, and for an operator's --chat-template."""

    text: str
    origin: str
    sha256: str
    named: dict[str, str] = field(default_factory=dict)

    def compile(self) -> ChatTemplate:
        """The compiled template; CheckpointError naming where it came from if it does not compile (a request's
        ChatTemplateError is the client's 400; a template that cannot compile is the checkpoint's or operator's)."""
        try:
            return ChatTemplate(self.text)
        except ChatTemplateError as error:
            raise CheckpointError(f"the chat template from {self.origin} does not compile ({error.template_message}); "
                                  f"fix it, or pass a working one with {OVERRIDE_OPTION}") from None

    def probed(self, tokenizer: FramingTokenizer) -> ChatTemplate:
        """The compiled template, put through `check_chat_template`'s probe chat (what the server's start and `glimmer
        inspect` check). Raises CheckpointError where it does not compile, and ChatTemplateError (it fails to render)
        or ConfigError (it breaks the protocol) naming where it came from and the option that replaces it: a template
        that raised at start was reported as "chat template error: boom", with neither."""
        template = self.compile()
        fix = f"fix it, or pass a working one with {OVERRIDE_OPTION}"
        try:
            check_chat_template(template, tokenizer)
        except ChatTemplateError as error:
            raise ChatTemplateError(f"the chat template from {self.origin} fails on a one-message probe chat: "
                                    f"{error.template_message}; {fix}") from None
        except ConfigError as error:
            raise ConfigError(f"the chat template from {self.origin} fails its check: {error} ({fix})") from None
        return template


def find_chat_template(
    checkpoint_dir: str | os.PathLike[str],
    override: str | os.PathLike[str] | None = None,
    *,
    embedded: str | None = None,
    embedded_tool_use: str | None = None,
    is_file: bool = False,
) -> ChatTemplateSource:
    """The template to render with, by the P-TMPL-1 order. Logs its origin and sha256.

    For a single-file checkpoint (`is_file`, a GGUF) the template is `embedded` (its metadata's), not a file, and
    `embedded_tool_use` its `tool_use` template (tokenizer.chat_template.tool_use), refused where it differs.
    Raises CheckpointError when the override file cannot be read, when a template found is empty or
    unreadable, or when no template exists anywhere searched.
    """
    directory = Path(checkpoint_dir)
    if override is not None:
        override_file = Path(override)
        # named plainly, the option left to the fix: LLM(..., chat_template=FILE) has no flag, glimmer serve no keyword
        source = _source(_read_template_file(override_file), f"{override_file} (the caller's template)",
                         fix=f"fix it or pass another with {OVERRIDE_OPTION}")
    elif is_file:
        if embedded is None:
            raise CheckpointError(f"{directory} has no tokenizer.chat_template in its metadata; pass the model's "
                                  f"template with {OVERRIDE_OPTION}")
        source = _source(embedded, f"{directory} (tokenizer.chat_template)")
        if embedded_tool_use is not None:
            _refuse_another_tool_use_template(source, embedded_tool_use,
                                              f"{directory} (tokenizer.chat_template.{TOOL_USE})")
    else:
        source = _from_checkpoint(directory)
    logger.info("chat template from %s (sha256 %s)", source.origin, source.sha256)
    return source


class EmbeddedTemplates(Protocol):
    """The templates a single-file checkpoint carries (a GGUF's tokenizer, gguf_tokenizer.py)."""

    chat_template: str | None
    tool_use_chat_template: str | None


def find_checkpoint_chat_template(
    checkpoint: str | os.PathLike[str], override: str | os.PathLike[str] | None, embedded: EmbeddedTemplates | None
) -> ChatTemplateSource:
    """`find_chat_template` for a checkpoint directory or single file whose reader found `embedded` templates (a
    GGUF's; None for a directory): what loading and `glimmer inspect` both read."""
    return find_chat_template(checkpoint, override, is_file=Path(checkpoint).is_file(),
                              embedded=embedded.chat_template if embedded is not None else None,
                              embedded_tool_use=embedded.tool_use_chat_template if embedded is not None else None)


def _from_checkpoint(directory: Path) -> ChatTemplateSource:
    named = _additional_templates(directory)
    tokenizer_source = _tokenizer_template(directory, named)
    processor_source = _processor_template(directory, named)
    if processor_source is None:
        if tokenizer_source is None:
            raise CheckpointError(
                f"no chat template found; searched {directory / CHAT_TEMPLATE_FILE}, the 'chat_template' field of "
                f"{directory / TOKENIZER_CONFIG_FILE}, {directory / LEGACY_CHAT_TEMPLATE_FILE} and the "
                f"'chat_template' field of {directory / PROCESSOR_CONFIG_FILE}. Pass the model's template with "
                f"{OVERRIDE_OPTION}"
            )
        return tokenizer_source
    if tokenizer_source is None:
        return processor_source
    if tokenizer_source.text != processor_source.text:
        raise CheckpointError(
            f"the checkpoint has two chat templates that differ: the processor's ({processor_source.origin}) and the "
            f"tokenizer's ({tokenizer_source.origin}). transformers' processor renders with the first and its "
            "tokenizer with the second, and vLLM renders a chat without tools with the first and one with tools with "
            f"the second, but Glimmer renders every chat with one template; remove the one that is stale, or pass "
            f"the one to use with {OVERRIDE_OPTION}"
        )
    return replace(processor_source, named=tokenizer_source.named)  # a name picks among the tokenizer's templates


def _tokenizer_template(directory: Path, named: dict[str, ChatTemplateSource]) -> ChatTemplateSource | None:
    """The tokenizer's default template as transformers' tokenizer loads it (None where it has none):
    `chat_template.jinja` and the `additional_chat_templates/*.jinja` read into `named` in place of
    tokenizer_config.json's field. Its `named` is empty for `chat_template.jinja` alone, one template."""
    jinja_file = directory / CHAT_TEMPLATE_FILE
    config_file = directory / TOKENIZER_CONFIG_FILE
    for file in (jinja_file, config_file):  # not taken as absent: another template would render every prompt
        refuse_not_a_file(file)
    if jinja_file.is_file():
        default = _source(_read_template_file(jinja_file), str(jinja_file))
        other = named.get("default")
        if other is not None and other.text != default.text:
            raise CheckpointError(
                f"the checkpoint has two default chat templates that differ, {jinja_file} and {other.origin}: "
                "transformers' tokenizer takes the second and its processor the first; remove one, or pass the one "
                f"to use with {OVERRIDE_OPTION}"
            )
        if not named:  # one template: transformers' tokenizer holds a string, and a name is a template's source
            return default
        named = {**named, "default": default}
    elif named and "default" not in named:
        raise CheckpointError(
            f"{directory / ADDITIONAL_TEMPLATES_DIR} holds chat templates {sorted(named)} but {jinja_file} does not "
            f"exist: transformers then takes these in place of {config_file}'s chat_template and has no default "
            f"to render a chat with; add the default as {jinja_file}, or pass it with {OVERRIDE_OPTION}"
        )
    if named:
        if TOOL_USE in named:
            _refuse_another_tool_use_template(named["default"], named[TOOL_USE].text, named[TOOL_USE].origin)
        return replace(named["default"], named={name: source.text for name, source in named.items()})
    if config_file.is_file():
        return _from_tokenizer_config(config_file)
    return None


def _additional_templates(directory: Path) -> dict[str, ChatTemplateSource]:
    """transformers 5's named templates, `additional_chat_templates/NAME.jinja` → NAME."""
    folder = directory / ADDITIONAL_TEMPLATES_DIR
    if not folder.is_dir():
        return {}
    named = {}
    for file in sorted(folder.glob("*.jinja")):
        refuse_not_a_file(file)
        named[file.name.removesuffix(".jinja")] = _source(_read_template_file(file), str(file))
    return named


def _processor_template(directory: Path, named: dict[str, ChatTemplateSource]) -> ChatTemplateSource | None:
    """The processor's template from its older places, as transformers' ProcessorMixin reads them (None where
    neither holds one): processor_config.json's `chat_template`, else chat_template.json's (refused beside the
    additional templates `named`)."""
    processor_file = directory / PROCESSOR_CONFIG_FILE
    legacy_file = directory / LEGACY_CHAT_TEMPLATE_FILE
    for file in (processor_file, legacy_file):
        refuse_not_a_file(file)
    if processor_file.is_file():
        template = _read_json_object(processor_file).get("chat_template")
        if template is not None:
            return _source(_template_string(template, processor_file), f"{processor_file} (chat_template)")
    if not legacy_file.is_file():
        return None
    if named:  # transformers' processor raises a ValueError for the pair
        raise CheckpointError(
            f"{legacy_file} (the older layout) sits beside {directory / ADDITIONAL_TEMPLATES_DIR}, which transformers "
            f"refuses to load together; replace {legacy_file} by {directory / CHAT_TEMPLATE_FILE}"
        )
    config = _read_json_object(legacy_file)
    if "chat_template" not in config:
        raise CheckpointError(f"{legacy_file} has no 'chat_template' field; it must be "
                              '{"chat_template": "<the Jinja template>"}, or remove the file')
    return _source(_template_string(config["chat_template"], legacy_file), f"{legacy_file} (chat_template)")


def _read_json_object(path: Path) -> dict:
    refuse_lfs_pointer(path)  # else "not readable JSON: Expecting value: line 1 column 1"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds a JSON {type(config).__name__}; expected an object")
    return config


def _template_string(template: object, path: Path) -> str:
    if not isinstance(template, str):
        raise CheckpointError(f"{path}: chat_template is a {type(template).__name__}; expected the template's text, "
                              f"a string (or pass the template to use with {OVERRIDE_OPTION})")
    return template


def _read_template_file(path: Path) -> str:
    refuse_lfs_pointer(path)  # else a template of the pointer's text, refused as failing the protocol's check
    try:
        # bytes, not read_text: newline translation would change the text and its sha256
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError as exc:
        raise CheckpointError(f"chat template file {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"chat template file {path} is not readable UTF-8 text: {exc}") from exc
    return text


def _from_tokenizer_config(config_file: Path) -> ChatTemplateSource | None:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{config_file} is not readable JSON: {exc}") from exc
    template = config.get("chat_template") if isinstance(config, dict) else None
    if template is None:
        return None
    if isinstance(template, str):
        return _source(template, f"{config_file} (chat_template)")
    if isinstance(template, list):
        for index, entry in enumerate(template):
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise CheckpointError(
                    f"{config_file}: chat_template[{index}]={entry!r:.80} is not a {{name, template}} object of two "
                    f"strings; fix the file, or pass the template to use with {OVERRIDE_OPTION}"
                )
        named = {entry["name"]: entry["template"] for entry in template}
        if "default" not in named:
            raise CheckpointError(
                f"{config_file}: chat_template lists templates {sorted(map(str, named))} but none named "
                f"'default'; pass the one to use with {OVERRIDE_OPTION}"
            )
        source = replace(_source(named["default"], f"{config_file} (chat_template 'default')"), named=named)
        if TOOL_USE in named:
            _refuse_another_tool_use_template(source, named[TOOL_USE], f"{config_file} (chat_template {TOOL_USE!r})")
        return source
    raise CheckpointError(
        f"{config_file}: chat_template is a {type(template).__name__}; expected a string or a list of "
        "{name, template} objects"
    )


def _refuse_another_tool_use_template(default: ChatTemplateSource, tool_use: str, origin: str) -> None:
    """CheckpointError where the checkpoint names a `tool_use` template other than its default: transformers' (and
    through it vLLM's) apply_chat_template renders a chat with tools with it and every other chat with the default,
    where Glimmer renders every chat with one template (a request with tools would get another prompt)."""
    if tool_use != default.text:
        raise CheckpointError(
            f"the checkpoint has a {TOOL_USE!r} chat template ({origin}) beside its default one ({default.origin}): "
            "transformers and vLLM render a chat with tools with it and every other chat with the default, but "
            f"Glimmer renders every chat with one template; pass the one to use with {OVERRIDE_OPTION}"
        )


def _source(text: str, origin: str, fix: str = f"pass the model's template with {OVERRIDE_OPTION}"
            ) -> ChatTemplateSource:
    """The source of `text`, read from `origin`; CheckpointError saying it is empty, and `fix`, where it is."""
    if not text.strip():
        raise CheckpointError(f"the chat template from {origin} is empty; {fix}")
    return ChatTemplateSource(
        text=text, origin=origin, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest()
    )
