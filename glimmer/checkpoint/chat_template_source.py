"""Finding the chat template a checkpoint should be rendered with (P-TMPL-1).

Glimmer never invents a prompt format (P-TMPL-4): the template comes from the operator or from the
checkpoint. Search order: the operator's `--chat-template FILE`, then `chat_template.jinja`, then the
`chat_template` field of `tokenizer_config.json` (a string, or a list of named templates from which
`default` is taken). A `tool_use` template other than the default (in that list, or transformers 5's
`additional_chat_templates/tool_use.jinja`) is refused: transformers renders a chat with tools with it, and
Glimmer renders every chat with one template. A GGUF checkpoint carries its template in its metadata
(`tokenizer.chat_template`, a `tool_use` one as `tokenizer.chat_template.tool_use`, which llama.cpp renders a chat
with tools with), which the GGUF reader hands over as `embedded` (and `embedded_tool_use`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from glimmer.checkpoint.broken_links import refuse_broken_link
from glimmer.errors import CheckpointError
from glimmer.protocol import ChatTemplate, ChatTemplateError

logger = logging.getLogger(__name__)

CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
OVERRIDE_OPTION = "--chat-template FILE"
# transformers 5 saves named templates beside chat_template.jinja in this folder, one NAME.jinja each
ADDITIONAL_TEMPLATES_DIR = "additional_chat_templates"
# the named template transformers' apply_chat_template renders a chat with tools with (get_chat_template)
TOOL_USE = "tool_use"


@dataclass(frozen=True)
class ChatTemplateSource:
    """A chat template and where it came from. `sha256` is of the UTF-8 text (for a file: its bytes)."""

    text: str
    origin: str
    sha256: str

    def compile(self) -> ChatTemplate:
        """The compiled template; CheckpointError naming where it came from if it does not compile (a request's
        ChatTemplateError is the client's 400; a template that cannot compile is the checkpoint's or operator's)."""
        try:
            return ChatTemplate(self.text)
        except ChatTemplateError as error:
            raise CheckpointError(f"the chat template from {self.origin} does not compile ({error.template_message}); "
                                  f"fix it, or pass a working one with {OVERRIDE_OPTION}") from None


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
        source = _source(_read_template_file(override_file), f"--chat-template {override_file}")
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
    jinja_file = directory / CHAT_TEMPLATE_FILE
    config_file = directory / TOKENIZER_CONFIG_FILE
    for file in (jinja_file, config_file):  # not taken as absent: another template would render every prompt
        refuse_broken_link(file)
    if jinja_file.is_file():
        source = _source(_read_template_file(jinja_file), str(jinja_file))
        tool_use_file = directory / ADDITIONAL_TEMPLATES_DIR / f"{TOOL_USE}.jinja"
        refuse_broken_link(tool_use_file)
        if tool_use_file.is_file():
            _refuse_another_tool_use_template(source, _read_template_file(tool_use_file), str(tool_use_file))
        return source
    if config_file.is_file():
        source = _from_tokenizer_config(config_file)
        if source is not None:
            return source
    raise CheckpointError(
        f"no chat template found; searched {jinja_file} and the 'chat_template' field of {config_file}. "
        f"Pass the model's template with {OVERRIDE_OPTION}"
    )


def _read_template_file(path: Path) -> str:
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
        source = _source(named["default"], f"{config_file} (chat_template 'default')")
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


def _source(text: str, origin: str) -> ChatTemplateSource:
    if not text.strip():
        raise CheckpointError(
            f"the chat template from {origin} is empty; pass the model's template with {OVERRIDE_OPTION}"
        )
    return ChatTemplateSource(
        text=text, origin=origin, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest()
    )
