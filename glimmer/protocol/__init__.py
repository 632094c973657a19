"""Pure-text Muse Glimmer protocol: chat rendering, request normalization, and output parsing.

Imports no torch (nor transformers): other engines can reuse it as is. protocol.md holds the requirements
(P-*) that the modules cite.
"""

from glimmer.protocol.builtin_template import builtin_template_source
from glimmer.protocol.chat_template import (
    DEFAULT_SPECIAL_TOKENS,
    ChatTemplate,
    ChatTemplateError,
    check_chat_template,
    compiled_template,
    render_chat,
)
from glimmer.protocol.control_tokens import RenderedPrompt
from glimmer.protocol.deltas import Delta, ParsedOutput, ToolCall, ToolCallDelta
from glimmer.protocol.openai_mapping import (
    ContentTokens,
    assistant_message,
    count_reasoning_tokens,
    finish_reason,
    stream_delta_objects,
)
from glimmer.protocol.output_parser import OutputParser, parse_output
from glimmer.protocol.reasoning_strength import (
    REASONING_EFFORTS,
    REASONING_STRENGTHS,
    resolve_reasoning_strength,
    strength_for_effort,
)
from glimmer.protocol.request_normalization import normalize_messages, normalize_tools
from glimmer.protocol.tokens import GENERATION_PROMPT, HEADER_SPAN, HOLD_MAX, RECIPIENT_MAX

__all__ = [
    "DEFAULT_SPECIAL_TOKENS",
    "GENERATION_PROMPT",
    "HEADER_SPAN",
    "HOLD_MAX",
    "REASONING_EFFORTS",
    "REASONING_STRENGTHS",
    "RECIPIENT_MAX",
    "ChatTemplate",
    "ChatTemplateError",
    "ContentTokens",
    "Delta",
    "OutputParser",
    "ParsedOutput",
    "RenderedPrompt",
    "ToolCall",
    "ToolCallDelta",
    "assistant_message",
    "builtin_template_source",
    "check_chat_template",
    "compiled_template",
    "count_reasoning_tokens",
    "finish_reason",
    "normalize_messages",
    "normalize_tools",
    "parse_output",
    "render_chat",
    "resolve_reasoning_strength",
    "stream_delta_objects",
    "strength_for_effort",
]
