"""How a conversation becomes a prompt: one path for `LLM.chat`, `LLMTokenizer.apply_chat_template` and the server's
/v1/chat/completions.

A `ChatRendering` holds what every conversation of a call is rendered with: the template, the tools, the reasoning
strength and template variables it sees, and where the prompt ends. By default it ends with the generation prompt
`<|start|>assistant` (P-TMPL-8); vLLM's `add_generation_prompt=False` ends it after the final message, and its
`continue_final_message` inside the final message, which must then be an assistant's: the reply continues that
message, and the output parser starts inside its channel (P-TMPL-8). A grammar over the turn starts at the generation
prompt, so a prompt that ends elsewhere refuses one (`refuse_turn_grammar`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from glimmer.engine.apply_chat_template import (
    FinalMessageTag,
    continued_body,
    cut_at_final_message,
    tag_final_message,
)
from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import ConfigError, RequestError
from glimmer.multimodal.sources import media_kind
from glimmer.protocol import ChatTemplate, ChatTemplateError, RenderedPrompt, compiled_template, normalize_messages
from glimmer.protocol.chat_template import RENDERING_ARGUMENTS, check_chat_template
from glimmer.protocol.headers import channel_of_recipient
from glimmer.protocol.request_normalization import (
    prefix_message_index,
    refuse_unmatched_tool_messages,
)
from glimmer.protocol.tool_choice import ToolPlan

STRENGTH_KWARGS = ("reasoning_strength", "reasoning_effort", "enable_thinking")
"""Template variables resolved into `reasoning_strength` before rendering (`resolve_reasoning_strength`): the
template gets the result, not them."""
RENDERING_ARGUMENT_NAMES = ("add_generation_prompt", *sorted(RENDERING_ARGUMENTS))
"""Arguments of `LLM.chat` and fields of a chat request that vLLM also reads from `chat_template_kwargs`; no
template variables."""


@dataclass(frozen=True)
class ChatRendering:
    """How the conversations of one call become prompts: their template, the tools, reasoning strength and template
    variables it sees, whether control-token text stays text, and where each prompt ends: with the generation
    prompt, after the final message, or inside it (`continue_final_message`)."""

    template: ChatTemplate
    tools: list[dict[str, Any]] | None
    strength: str | None
    kwargs: Mapping[str, Any]
    allow_control_tokens: bool
    generation_prompt: bool = True
    continue_final_message: bool | str = False

    @property
    def prompt_end(self) -> str | None:
        """The argument that ends the prompt elsewhere than at the generation prompt, where a turn grammar starts
        (`continue_final_message` or `add_generation_prompt`), or None."""
        if self.continue_final_message:
            return "continue_final_message"
        return None if self.generation_prompt else "add_generation_prompt"


def render_conversation(conversation: Any, rendering: ChatRendering, tokenizer: Tokenizer
                        ) -> tuple[list[dict[str, Any]], RenderedPrompt, FinalMessageTag | None]:
    """One conversation's messages, normalized, its prompt, and where that prompt was cut inside the final message,
    with the message's body before the cut (None unless `rendering.continue_final_message`). Raises RequestError
    naming what the template cannot render, ChatTemplateError where the template fails."""
    final = None
    prefix = prefix_message_index(conversation)
    if prefix is not None and not rendering.continue_final_message:  # the server continues it (chat_prompt)
        raise RequestError(f"messages[{prefix}].prefix: the final message is a prefix for the reply to continue; "
                           "pass continue_final_message=True to continue it", param=f"messages[{prefix}].prefix")
    if rendering.continue_final_message:
        conversation, final = tag_final_message(conversation, rendering.continue_final_message,
                                                rendering.template.source)
    normalized = normalize_messages(conversation, refuse_unrendered=True)
    refuse_unmatched_tool_messages(conversation, final_turn_is_history=not rendering.generation_prompt)
    rendered = rendering.template.render_prompt(
        normalized,
        tools=rendering.tools,
        add_generation_prompt=rendering.generation_prompt,
        special_tokens=tokenizer.special_tokens,
        reasoning_strength=rendering.strength,
        chat_template_kwargs=rendering.kwargs,
        control_tokens=() if rendering.allow_control_tokens else tokenizer.control_tokens,
    )
    if final is None:
        return normalized, rendered, None
    cut = cut_at_final_message(rendered, final)
    return normalized, cut, replace(final, body=continued_body(cut))


def check_final_message_is_the_assistants(conversation: Any, index: int | None = None) -> None:
    """RequestError unless the final message of `conversation` (the `index`-th of several) is an assistant's: with
    `continue_final_message` the reply continues it, and is parsed as that message's continuation."""
    final = conversation[-1] if isinstance(conversation, list | tuple) and conversation else None
    role = final.get("role") if isinstance(final, Mapping) else None
    if role != "assistant":
        where = "" if index is None else f"messages[{index}]: "
        raise RequestError(f"continue_final_message: {where}the final message has role {role!r}, and only an "
                           "assistant message can be continued (the reply continues it); end the conversation with "
                           '{"role": "assistant", "content": PREFIX}, or leave continue_final_message out for a new '
                           "turn", param="continue_final_message")


def check_continued_call_is_read(final: FinalMessageTag, rendering: ChatRendering, index: int | None = None) -> None:
    """RequestError naming `continue_final_message` when the final message continued is addressed to a tool while the
    request offers no tools (none declared, or `tool_choice` "none"): its reply is that tool's call (P-TMPL-8), and
    with no tools the parser returns no call from a tool channel (P-NAME-4), so the reply would vanish."""
    if channel_of_recipient(final.recipient) != "tool" or rendering.tools is not None:
        return
    where = "" if index is None else f"messages[{index}]: "
    raise RequestError(f"continue_final_message: {where}the final message is addressed to the tool "
                       f"{final.recipient!r}, so the reply continues its call, but the request offers no tools (none "
                       "declared, or tool_choice \"none\"), and no call could be returned; declare "
                       f"{final.recipient!r} in tools", param="continue_final_message")


def check_media_before_the_cut(messages: Sequence[Mapping[str, Any]], final: FinalMessageTag,
                               index: int | None = None) -> None:
    """RequestError naming `continue_final_message` for an image or video of the continued final message (of
    `messages`, the `index`-th conversation of several) that the prompt, cut inside that message, leaves out: a
    content part after the text part the reply continues, or any content part when the reasoning is continued (the
    content follows it). Its placeholder is cut off while the item would still be loaded, and the model would never
    see it; transformers' processors and vLLM fail on such a conversation with a placeholder count mismatch.
    `messages` as the client sent them, so that the error names the client's part: normalization merges developer
    messages into the system message, which shifts the index of the final message."""
    content = messages[-1].get("content")
    if not isinstance(content, list):
        return
    continues_content = final.field == "content"
    for position in range(final.part + 1 if continues_content else 0, len(content)):
        kind = media_kind(content[position])
        if kind is None:
            continue
        where = ("" if index is None else f"messages[{index}]: ") + f"messages[{len(messages) - 1}].content[{position}]"
        what = "an image" if kind == "image" else "a video"
        if continues_content:
            raise RequestError(f"continue_final_message: {where} is {what} after the text the reply continues, where "
                               f"the prompt ends, so the model would never see it; a continued message ends with its "
                               f"text: move the {kind} before that text, or leave continue_final_message out",
                               param="continue_final_message")
        raise RequestError(f"continue_final_message: {where} is {what} of the final message's content, which the "
                           f'prompt leaves out, as it ends inside the message\'s "{final.field}", so the model would '
                           f"never see it; move the {kind} to an earlier message, or continue the content",
                           param="continue_final_message")


def refuse_turn_grammar(prompt_end: str | None, plan: ToolPlan, *, structured_param: str | None,
                        thinking_token_budget: int | None) -> None:
    """RequestError naming `prompt_end` (`ChatRendering.prompt_end`) when the turn has a grammar, which constrains it
    from the generation prompt on: the answer's (`structured_param`, the field that asked for it, None for a free
    answer), a required or named `tool_choice`, strict tools, or a `thinking_token_budget`."""
    if prompt_end is None:
        return
    constrained_by = next((name for name, given in (
        (structured_param, structured_param is not None), ("tool_choice", plan.required_names is not None),
        ("thinking_token_budget", thinking_token_budget is not None), ("tools (strict)", plan.strict)) if given), None)
    if constrained_by is not None:
        raise RequestError(f"{prompt_end}: cannot be combined with {constrained_by}, whose grammar constrains the "
                           "turn from the generation prompt `<|start|>assistant` on, where this prompt does not end; "
                           "drop one of them", param=prompt_end)


def compiled_template_argument(source: Any, named: Mapping[str, str]) -> ChatTemplate:
    """A caller's own `chat_template` argument compiled: as transformers' `get_chat_template`, the name of one of the
    checkpoint tokenizer's `named` templates (LLMEngine.named_chat_templates) is that template, and any other string
    the template's source (a name the tokenizer lacks is a source too). Raises RequestError, ChatTemplateError."""
    if not isinstance(source, str):
        raise RequestError(f"chat_template must be a jinja template source (a string), not {type(source).__name__}",
                           param="chat_template")
    return compiled_template(named.get(source, source))


def checked_template_argument(source: str, tokenizer: Tokenizer, max_prompt_chars: int,
                              named: Mapping[str, str]) -> ChatTemplate:
    """A caller's own `chat_template` source, or the name of one of the checkpoint's `named` templates (`LLM.chat`'s,
    a trusted server request's), compiled, and put through the check the checkpoint's template passed at load: the
    reply is parsed from the generation prompt on (P-TMPL-8), and the prompt holds one bos (P-TMPL-5). Raises
    RequestError naming `chat_template`."""
    try:
        template = compiled_template_argument(source, named)
        check_chat_template(template, tokenizer, max_chars=max_prompt_chars)
    except ChatTemplateError as error:
        raise RequestError(f"chat_template: the template fails on a one-message probe chat: {error.template_message}",
                           param="chat_template") from None
    except ConfigError as error:
        raise RequestError(f"chat_template: {error}", param="chat_template") from None
    return template
