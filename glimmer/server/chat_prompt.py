"""From a chat request to prompt token ids, along the one path protocol.md describes.

normalize messages and tools (P-TMPL-6, P-REQ-8) → decide what `tool_choice` means for this request
(P-REQ-3..5) → load the images and videos (data URLs; local files and http(s) only as the operator
allows) → reasoning strength (P-EFF-1) → render with the checkpoint's template (P-TMPL-1..3) → expand
media placeholders and tokenize without adding special tokens, and check the single bos (P-TMPL-5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from glimmer.engine.sequence import MultimodalItem
from glimmer.engine.tool_choice import ToolChoiceController
from glimmer.errors import RequestError
from glimmer.multimodal.sources import load_media_reference, media_from_part
from glimmer.protocol import normalize_messages, normalize_tools, resolve_reasoning_strength
from glimmer.server.context import ServingContext
from glimmer.server.schemas import ChatCompletionRequest, NamedToolChoice

# Knobs the server resolves into `reasoning_strength` itself; the template gets the result, not them.
_REASONING_KNOBS = ("reasoning_strength", "reasoning_effort", "enable_thinking")


@dataclass
class ToolPlan:
    """What `tool_choice` means for one request.

    render_tools: declared in the prompt (None hides them: `none`, P-REQ-3).
    parser_tools: what the output parser resolves calls against (None: no calls, P-NAME-4).
    required_names: for `required` / named, the tools a valid call must name (P-REQ-4); else None.
    """

    render_tools: list[dict[str, Any]] | None
    parser_tools: list[dict[str, Any]] | None
    required_names: list[str] | None


@dataclass
class ChatPrompt:
    token_ids: list[int]
    tools: ToolPlan
    controller_factory: Callable[[], ToolChoiceController] | None
    multimodal: list[MultimodalItem]


def build_chat_prompt(request: ChatCompletionRequest, context: ServingContext) -> ChatPrompt:
    """Raises RequestError (400 naming the field) or ChatTemplateError (400 with the template's message)."""
    settings = context.settings
    messages = normalize_messages(request.messages, developer_as_system=settings.developer_as_system)
    tools = plan_tools(request, normalize_tools(request.tools))
    images, videos = load_media(messages, context)
    template_kwargs = dict(request.chat_template_kwargs or {})
    effort = request.reasoning_effort
    if effort is None and request.reasoning is not None:
        effort = request.reasoning.effort
    strength = resolve_reasoning_strength(
        reasoning_strength=request.reasoning_strength,
        reasoning_effort=effort,
        chat_template_kwargs=template_kwargs,
        enable_thinking=request.enable_thinking,
        default=settings.default_reasoning_strength,
    )
    for knob in _REASONING_KNOBS:
        template_kwargs.pop(knob, None)
    tokenizer = context.tokenizer
    text = context.template.render(messages, tools=tools.render_tools, special_tokens=tokenizer.special_tokens,
                                   reasoning_strength=strength, chat_template_kwargs=template_kwargs)
    multimodal: list[MultimodalItem] = []
    if images or videos:
        token_ids, multimodal = context.engine.engine.prepare_prompt(text, images, videos)
    else:
        token_ids = tokenizer.encode(text, add_special_tokens=False)
    _check_single_bos(token_ids, tokenizer.bos_token_id, tokenizer.bos_token)
    factory = None
    if tools.required_names is not None:
        factory = context.steering.controller_factory(tools.parser_tools or [], tools.required_names)
    return ChatPrompt(token_ids, tools, factory, multimodal)


def plan_tools(request: ChatCompletionRequest, tools: list[dict[str, Any]]) -> ToolPlan:
    """Raises RequestError for a `tool_choice` that needs tools the request does not declare."""
    choice = request.tool_choice
    if choice is None:
        choice = "auto"
    if choice == "none" or (choice == "auto" and not tools):
        return ToolPlan(None, None, None)
    if choice == "auto":
        return ToolPlan(tools, tools, None)
    if not tools:
        raise RequestError("tool_choice: a required or named tool choice needs `tools`", param="tool_choice")
    names = [tool["function"]["name"] for tool in tools]
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise RequestError(f"tool_choice: function {choice.function.name!r} is not among the declared tools "
                               f"({', '.join(names)})", param="tool_choice")
        return ToolPlan(tools, tools, [choice.function.name])
    return ToolPlan(tools, tools, names)


def load_media(messages: list[Mapping[str, Any]], context: ServingContext) -> tuple[list[Any], list[Any]]:
    """The images and videos of the messages, in the order the template renders their placeholders.

    Raises RequestError naming the part: on a model without a vision tower, over the per-request limits,
    or when a reference cannot be loaded under the operator's media policy.
    """
    settings = context.settings
    found: dict[str, list[Any]] = {"image": [], "video": []}
    limits = {"image": settings.max_images_per_request, "video": settings.max_videos_per_request}
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            media = media_from_part(part) if isinstance(part, Mapping) else None
            if media is None:
                continue
            kind, reference = media
            param = f"messages[{i}].content[{j}]"
            if not context.model_has_vision:
                raise RequestError(f"{param}: this model has no vision tower, so it cannot take {kind} input",
                                   param=param)
            if len(found[kind]) == limits[kind]:
                raise RequestError(f"{param}: more than {limits[kind]} {kind}s in one request (the server's "
                                   f"--max-{kind}s-per-request limit)", param=param)
            found[kind].append(load_media_reference(reference, kind, len(found[kind]), settings.media_policy))
    return found["image"], found["video"]


def _check_single_bos(token_ids: list[int], bos_id: int | None, bos_token: str | None) -> None:
    # P-TMPL-5: a second bos silently changes the output. The template writes one (checked at startup), so a
    # second one came from the request's text.
    if bos_id is not None and token_ids.count(bos_id) != 1:
        raise RequestError(f"messages: the rendered prompt holds {token_ids.count(bos_id)} {bos_token!r} tokens; "
                           f"message text may not contain {bos_token!r}", param="messages")
