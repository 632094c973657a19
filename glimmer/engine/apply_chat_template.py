"""The named arguments of transformers' `apply_chat_template`, for `LLM.get_tokenizer().apply_chat_template`.

transformers 5 (the installed version is the reference the tests compare with) takes a conversation or a batch of
them, a few named arguments that steer the call, and passes every other keyword argument to the template as a
variable. A named argument must therefore be honoured or refused, never handed to the template. Their rules:

- the conversation(s): `split_conversations`, and the `tools` (schemas or Python functions, `tool_schemas`) and
  `documents` (`checked_documents`) the template sees;
- `continue_final_message`: `tag_final_message` appends a unique tag to the final message's text before rendering
  and `cut_at_final_message` cuts the rendered prompt there, as transformers does, so that the prompt ends inside
  that message's body and the model continues it;
- the tokenizer's output: `padding`, `truncation`, `max_length`, `return_tensors`, `return_dict` (`OutputShape`).
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from glimmer.engine.tokenizer import NO_LENGTH_LIMIT
from glimmer.errors import RequestError
from glimmer.protocol import ChatTemplate, RenderedPrompt
from glimmer.protocol.chat_template import REASONING_FIELDS
from glimmer.protocol.tokens import MESSAGE

TENSOR_TYPES = ("pt", "np")
"""The `return_tensors` values supported: torch tensors and numpy arrays (transformers also knows 'mlx')."""


def given_conversation(conversation: Any, template_kwargs: dict[str, Any]) -> Any:
    """The conversation argument: transformers calls it `conversation`, Glimmer's earlier signature `messages`; the
    latter is taken out of `template_kwargs` (it is never a template variable). Raises TypeError for neither or
    both, as Python does for a missing or repeated argument."""
    if "messages" in template_kwargs:
        if conversation is not None:
            raise TypeError("apply_chat_template() got the conversation twice (conversation and messages)")
        conversation = template_kwargs.pop("messages")
    if conversation is None:
        raise TypeError("apply_chat_template() missing the conversation (a list of message dicts)")
    return conversation


def split_conversations(conversation: Any) -> tuple[list[Any], bool]:
    """The conversations to render and whether the call is batched: by transformers' rule, a list whose first item
    is a list is a batch of conversations. Raises RequestError for an empty conversation (transformers refuses it)."""
    if isinstance(conversation, list | tuple) and not conversation:
        raise RequestError("conversation: holds no message; give at least one message dict",
                           param="conversation")
    if isinstance(conversation, list | tuple) and isinstance(conversation[0], list | tuple):
        return list(conversation), True
    return [conversation], False


def tool_schemas(tools: Any) -> Any:
    """`tools` with each Python function replaced by its JSON schema, converted by transformers' `get_json_schema`
    as transformers does it (type hints and a Google-style docstring). Raises RequestError when transformers is
    not installed; anything else is left to the tool normalization to judge."""
    if not isinstance(tools, list | tuple):
        return tools
    return [_function_schema(tool, index) if inspect.isfunction(tool) or inspect.ismethod(tool) else tool
            for index, tool in enumerate(tools)]


def _function_schema(function: Callable[..., Any], index: int) -> dict[str, Any]:
    """The JSON schema of the Python function `tools[index]`; RequestError naming it where transformers is missing or
    cannot read the function (no docstring, an argument without a type hint or its description)."""
    try:
        from transformers.utils import get_json_schema
        from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException
    except ImportError as error:
        raise RequestError(f"tools: the Python function {function.__name__!r} needs transformers (pip install "
                           "transformers) to become a JSON schema; or pass its schema as a dict",
                           param="tools") from error
    try:
        return get_json_schema(function)
    except (DocstringParsingException, TypeHintParsingException) as error:
        raise RequestError(f"tools[{index}]: {error} (transformers reads a function's schema from its type hints and "
                           "Google-style docstring: a summary, then an Args: section describing each argument); or "
                           "pass its schema as a dict", param=f"tools[{index}]") from error


def checked_documents(documents: Any, template: ChatTemplate) -> list[Mapping[str, Any]]:
    """`documents` as transformers takes them, a list of dicts (`title` and `text` keys recommended), for the
    template's `documents` variable. Raises RequestError naming the first item that is not a dict, and for documents
    given to a template that never reads the variable (as the checkpoint's), where they would reach no prompt."""
    if isinstance(documents, str | bytes | Mapping) or not isinstance(documents, Sequence):
        raise RequestError("documents must be a list of dicts with 'title' and 'text' keys", param="documents")
    for index, document in enumerate(documents):
        if not isinstance(document, Mapping):
            raise RequestError(f"documents[{index}] must be a dict with 'title' and 'text' keys, not "
                               f"{type(document).__name__}", param=f"documents[{index}]")
    if documents and "documents" not in template.variables:
        raise RequestError("documents: the chat template never reads `documents`, so they would reach no prompt; "
                           "put their text in a message, or render with a chat_template that reads them",
                           param="documents")
    return list(documents)


def generation_prompt(add_generation_prompt: bool | None, continue_final_message: bool | str) -> bool:
    """Whether the prompt ends with the generation prompt: as `add_generation_prompt` says, and by default (None)
    unless the final message is continued. Raises RequestError for a value of either argument of another type, and
    for both set (transformers and vLLM refuse it too)."""
    if add_generation_prompt is not None and not isinstance(add_generation_prompt, bool):
        raise RequestError(f"add_generation_prompt must be True, False or None, not {add_generation_prompt!r}",
                           param="add_generation_prompt")
    if not isinstance(continue_final_message, bool | str):
        raise RequestError("continue_final_message must be True, False or the name of the field to continue, not "
                           f"{continue_final_message!r}", param="continue_final_message")
    if continue_final_message and add_generation_prompt:
        raise RequestError("continue_final_message=True with add_generation_prompt=True: the first ends the prompt "
                           "inside the final message, the second after it with a new turn's header; give one",
                           param="continue_final_message")
    return not continue_final_message if add_generation_prompt is None else add_generation_prompt


@dataclass(frozen=True)
class FinalMessageTag:
    """The tag appended to the final message's `text` before rendering; the prompt is cut where it lands.

    `recipient` is the channel whose body the cut prompt ends inside, for the output parser (P-TMPL-8): `self` for the
    reasoning, else the message's `recipient`, `user` without one (protocol.md §2.1, assistant messages). `part`: the
    index of the content part tagged (its last text part), None when the field is a string; the parts after it are
    cut off the prompt, and with the reasoning continued, every content part is. `body`: once the prompt is cut
    (`continued_body`), the message's body as the prompt holds it, for a tool channel's parse to start from."""

    field: str
    text: str
    tag: str
    recipient: str
    part: int | None = None
    body: str = ""


def tag_final_message(messages: Any, continue_final_message: bool | str,
                      template_source: str) -> tuple[list[Any], FinalMessageTag]:
    """`messages` with a tag appended to the final message's text to continue, and the tag.

    The text is the final message's `content`, or the field that `continue_final_message` names when it is a string
    (`"reasoning_content"` continues the reasoning). A reasoning field is found under any of its names, and every name
    holding it is tagged, as the renderer offers it under each. (transformers finds it under `reasoning` only where
    the message names it so, and refuses `continue_final_message="reasoning"` for reasoning given as
    `reasoning_content` or `thinking`; the three names are one field here.) Content parts: the last part with a
    `text`. The final message may have any role, as in transformers.

    Raises RequestError, with transformers' conditions: no message, no such field (None counts as none), a field
    the template's source never names, or content parts without text.
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise RequestError("continue_final_message: the conversation holds no message to continue",
                           param="continue_final_message")
    if not isinstance(messages[-1], Mapping):
        raise RequestError(f"messages[{len(messages) - 1}] must be an object, got {type(messages[-1]).__name__}",
                           param="messages")
    field = continue_final_message if isinstance(continue_final_message, str) else "content"
    final = dict(messages[-1])
    if field in REASONING_FIELDS:  # the renderer's aliasing (transformers' too), done first: every alias is tagged
        reasoning = next((final[name] for name in REASONING_FIELDS if final.get(name) is not None), None)
        if reasoning is not None:
            final.update({name: reasoning for name in REASONING_FIELDS if final.get(name) is None},
                         reasoning_content=reasoning)
    value = final.get(field)
    if value is None:
        raise RequestError(f'continue_final_message: the final message has no "{field}" (or it is null), so '
                           "there is nothing to continue",
                           param="continue_final_message")
    if field not in REASONING_FIELDS and final.get("tool_calls"):
        raise RequestError(f'continue_final_message: the final message holds tool_calls, which render after its '
                           f'"{field}", so continuing it would leave them out; send the calls in a '
                           "message of their own, or continue a message without them", param="continue_final_message")
    fields = [name for name in REASONING_FIELDS if final.get(name) == value] if field in REASONING_FIELDS else [field]
    if not any(name in template_source for name in fields):
        raise RequestError(f'continue_final_message: the chat template never reads a message\'s "{field}", so it '
                           "cannot be continued", param="continue_final_message")
    tag = f"CONTINUE_FINAL_MESSAGE_TAG_{secrets.token_hex(8)} "  # transformers' tag, made unique per render
    if isinstance(value, list | tuple):
        parts = [dict(part) if isinstance(part, Mapping) else part for part in value]
        part = next((index for index in reversed(range(len(parts)))
                     if isinstance(parts[index], dict) and "text" in parts[index]), None)
        if part is None or not isinstance(parts[part]["text"], str):
            raise RequestError("continue_final_message: the final message's content parts hold no text part to "
                               "continue", param="continue_final_message")
        text = parts[part]["text"]
        parts[part]["text"] = text + tag
        final[field] = parts
    elif isinstance(value, str):
        text, part = value, None
        final.update({name: value + tag for name in fields})
    else:
        raise RequestError(f'continue_final_message: the final message\'s "{field}" must be a string or a list of '
                           f"content parts, not {type(value).__name__}", param="continue_final_message")
    recipient = "self" if field in REASONING_FIELDS else final.get("recipient") or "user"
    return [*messages[:-1], final], FinalMessageTag(field, text, tag, str(recipient), part)


def cut_at_final_message(rendered: RenderedPrompt, final: FinalMessageTag) -> RenderedPrompt:
    """The prompt up to the end of the final message's text: what the template writes after it (for this model
    the message's `<|eot|>` or `<|eom|>`, and any later message) is left out. Where the template trimmed the
    whitespace after the tag, the prompt's trailing whitespace goes too (transformers' rule).

    Raises RequestError when the template does not render the text as given (it drops it or changes it)."""
    marker = final.tag.strip()
    if final.text.strip() not in rendered.display_text or marker not in rendered.text:
        raise RequestError(f'continue_final_message: the chat template does not render the final message\'s '
                           f'"{final.field}" as given, so there is nothing to continue',
                           param="continue_final_message")
    at = rendered.text.rindex(marker)
    text = rendered.text[:at] if rendered.text.startswith(final.tag, at) else rendered.text[:at].rstrip()
    return RenderedPrompt(text, {key: spelling for key, spelling in rendered.literals.items() if key in text})


def continued_body(cut: RenderedPrompt) -> str:
    """The body of the message a cut prompt ends inside, as the model reads it: the text after the header's
    `<|message|>` (protocol.md §2.1), control-token text the caller wrote in it included."""
    at = cut.text.rfind(MESSAGE)
    return RenderedPrompt(cut.text[at + len(MESSAGE):], cut.literals).display_text if at >= 0 else ""


@dataclass(frozen=True)
class OutputShape:
    """How `apply_chat_template` returns token ids, from transformers' arguments of the same names.

    `padding`: True or 'longest' pads to the longest conversation of the batch, 'max_length' to `max_length`;
    False or 'do_not_pad' pads nothing. `truncation`: True, 'longest_first' or 'only_first' cuts each
    conversation's ids to `max_length`. They pad and cut on the sides given to `apply` (the tokenizer's
    `padding_side` and `truncation_side`, as in transformers); without `max_length` the limit is the
    `default_max_length` given to `apply`, and 'max_length' pads nothing to a limit above `NO_LENGTH_LIMIT`.
    `return_tensors`: None gives lists, 'pt' torch tensors, 'np' numpy arrays (both int64, with a batch axis even for
    one conversation). `return_dict`: {"input_ids", "attention_mask"} instead of the ids alone. Raises RequestError
    naming the argument on a value it does not support.
    """

    padding: bool | str = False
    truncation: bool | str = False
    max_length: int | None = None
    return_tensors: str | None = None
    return_dict: bool = False

    def __post_init__(self) -> None:
        _padding_strategy(self.padding)
        _truncates(self.truncation)
        _tensor_type(self.return_tensors)
        if self.max_length is not None and (
                not isinstance(self.max_length, int) or isinstance(self.max_length, bool) or self.max_length < 1):
            raise RequestError(f"max_length must be a positive integer or None, got {self.max_length!r}",
                               param="max_length")

    def truncation_limit(self, default_max_length: int) -> int | None:
        """The most tokens a sequence keeps (`max_length`, else `default_max_length`), None without truncation."""
        if not _truncates(self.truncation):
            return None
        return self.max_length if self.max_length is not None else default_max_length

    def apply(self, ids: list[list[int]], *, batched: bool, default_max_length: int, pad_token_id: int | None,
              padding_side: str = "right", truncation_side: str = "right") -> Any:
        """The call's result for the sequences' token ids `ids` (one list per conversation or text), padded on
        `padding_side` and cut on `truncation_side` ('right' or 'left').

        Raises RequestError for padding without a pad token, and for tensors of conversations of different
        lengths (they need padding)."""
        limit = self.truncation_limit(default_max_length)
        if limit is not None:
            ids = [sequence[:limit] if truncation_side == "right" else sequence[max(0, len(sequence) - limit):]
                   for sequence in ids]
        limit = self.max_length if self.max_length is not None else default_max_length
        padding = _padding_strategy(self.padding)
        if padding == "max_length" and limit > NO_LENGTH_LIMIT:
            padding = None
        if padding is not None and pad_token_id is None:
            raise RequestError("padding: this tokenizer has no pad token to pad with; set one of its tokens first "
                               "(tok.pad_token = tok.eos_token, as with transformers), or pass padding=False",
                               param="padding")
        length = max(map(len, ids), default=0) if padding == "longest" else limit if padding == "max_length" else 0
        masks = [_padded([1] * len(sequence), 0, length, padding_side) for sequence in ids]
        ids = [_padded(sequence, pad_token_id, length, padding_side) for sequence in ids]
        tensor_type = _tensor_type(self.return_tensors)
        if tensor_type is not None:
            lengths = sorted({len(sequence) for sequence in ids})
            if len(lengths) > 1:
                raise RequestError(f"return_tensors={tensor_type!r}: the sequences' token ids differ in length "
                                   f"({lengths}); pass padding=True to pad them to the longest (with "
                                   "padding='max_length', truncation=True cuts those past max_length)",
                                   param="return_tensors")
            input_ids, attention_mask = _as_tensor(ids, tensor_type), _as_tensor(masks, tensor_type)
        else:
            input_ids, attention_mask = (ids, masks) if batched else (ids[0], masks[0])
        return ChatEncoding(input_ids=input_ids, attention_mask=attention_mask) if self.return_dict else input_ids


def _padded(sequence: list[int], pad: int | None, length: int, side: str) -> list[int]:
    """`sequence` padded with `pad` to `length` on `side` ('right' or 'left'); as it is if already as long."""
    padding = [pad] * (length - len(sequence))
    return sequence + padding if side == "right" else padding + sequence


class ChatEncoding(dict):
    """`return_dict=True`'s result: a dict of "input_ids" and "attention_mask" that code written for transformers'
    `BatchEncoding` can use as it is: its keys read as attributes too (`enc.input_ids`), and `.to(device)` moves its
    torch tensors (lists and numpy arrays stay) and returns it."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: str | torch.device | int) -> ChatEncoding:
        for key, value in self.items():
            if isinstance(value, torch.Tensor):
                self[key] = value.to(device)
        return self


def _padding_strategy(padding: Any) -> str | None:
    """'longest', 'max_length' or None (no padding) for a transformers `padding` value (a PaddingStrategy too)."""
    if isinstance(padding, bool) or padding is None:
        return "longest" if padding else None
    for strategy in ("longest", "max_length"):
        if padding == strategy:
            return strategy
    if padding == "do_not_pad":
        return None
    raise RequestError(f"padding={padding!r} is not one of True, False, 'longest', 'max_length', 'do_not_pad'",
                       param="padding")


def _truncates(truncation: Any) -> bool:
    """Whether a transformers `truncation` value (a TruncationStrategy too) cuts a single sequence."""
    if isinstance(truncation, bool) or truncation is None:
        return bool(truncation)
    if truncation in ("longest_first", "only_first"):
        return True
    if truncation == "do_not_truncate":
        return False
    if truncation == "only_second":
        raise RequestError("truncation='only_second' needs a second sequence, and a chat or a text is one (text "
                           "pairs are not supported): use truncation=True", param="truncation")
    raise RequestError(f"truncation={truncation!r} is not one of True, False, 'longest_first', 'only_first', "
                       "'do_not_truncate'", param="truncation")


def _tensor_type(return_tensors: Any) -> str | None:
    if return_tensors is None:
        return None
    for tensor_type in TENSOR_TYPES:
        if return_tensors == tensor_type:
            return tensor_type
    raise RequestError(f"return_tensors={return_tensors!r} is not supported; use 'pt' (torch) or 'np' (numpy), or "
                       "None for lists", param="return_tensors")


def _as_tensor(rows: list[list[int]], tensor_type: str) -> torch.Tensor | np.ndarray:
    return torch.tensor(rows, dtype=torch.long) if tensor_type == "pt" else np.array(rows, dtype=np.int64)
