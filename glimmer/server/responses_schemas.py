"""The body of `POST /v1/responses`, validated once at the edge, and its translation to a chat request.

As for chat, unknown fields are refused (400 naming them); fields that cannot change the output are checked as
OpenAI checks them, echoed in the response object and otherwise ignored (`user`, `metadata`, `service_tier`,
`safety_identifier`, `prompt_cache_key`, `prompt_cache_retention`, `prompt_cache_options`, whose `prewarm: true`
is refused; `max_tool_calls`, which bounds calls to OpenAI's built-in tools, not function calls, and Glimmer has only
function tools; `stream_options.include_obfuscation` is accepted with `stream: true`, not echoed); and fields Glimmer
cannot honour are refused unless unset (or `background: false`): `background`, `conversation`,
`prompt`, `context_management`, `truncation: "auto"`, `text.verbosity` but "medium" (OpenAI's
default, taken and echoed), tools other than functions. `include` may name
`message.output_text.logprobs` (the answer's token logprobs, with `top_logprobs` alternatives each, as chat's
`logprobs` and `top_logprobs`), `reasoning.encrypted_content` (reasoning items carry their text in `content`,
which round-trips through `input`, and in `encrypted_content` too, encoded, for clients that replay only that) and
`message.input_image.image_url` (the input images' URLs, which input_items always lists).
"""

from __future__ import annotations

from typing import Any, Literal

from glimmer.engine.chat_rendering import RENDERING_ARGUMENT_NAMES
from glimmer.engine.grammar import check_tool_parameters
from glimmer.errors import RequestError
from glimmer.protocol import normalize_tools
from glimmer.server.schemas import (
    DEFAULT_VERBOSITY,
    Count,
    Items,
    LogprobCount,
    Metadata,
    PositiveCount,
    PromptCacheRetention,
    RequestBody,
    Seed,
    ServiceTier,
    TopK,
    check_metadata,
)

RESPONSES_FIELD_HINTS = {
    "tool_choice": 'must be "none", "auto", "required" or {"type": "function", "name": NAME}',
    "input": "must be a string or a list of input items",
}


class ResponsesReasoning(RequestBody):
    effort: str | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # the full reasoning text, as the summary too
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # deprecated: OpenAI's old name
    # which earlier reasoning the model reads: Glimmer renders all of it back ("all_turns"; check_reasoning_modes)
    context: Literal["auto", "current_turn", "all_turns"] | None = None
    mode: str | None = None  # the SDK's "standard" or "pro" (any string): Glimmer runs "standard" only


class ResponsesPromptCacheOptions(RequestBody):
    """OpenAI's `prompt_cache_options` on /v1/responses: hints for its prompt cache (checked as the SDK types them,
    echoed, and otherwise ignored), except `prewarm: true`, a request to fill the cache without generating, which
    Glimmer cannot do (check_supported refuses it rather than generate)."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None
    comparison_response_id: str | None = None  # asks for cache diagnostics, which Glimmer has none of
    prewarm: bool | None = None


class ResponsesStreamOptions(RequestBody):
    """OpenAI's `stream_options` on /v1/responses: `include_obfuscation` alone, OpenAI's padding of streamed events
    against side channels, which Glimmer never adds (either value changes nothing). Chat's `include_usage` and vLLM's
    `continuous_usage_stats` are unknown fields here: a response's usage comes once, in its last event."""

    include_obfuscation: bool | None = None


class ResponsesFunctionChoice(RequestBody):
    type: Literal["function"]
    name: str


class ResponsesRequest(RequestBody):
    model: str | None = None
    input: str | Items[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: Items[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: PositiveCount | None = None
    top_logprobs: LogprobCount | None = None  # alternatives per answer token, with `include` OUTPUT_TEXT_LOGPROBS
    temperature: float | None = None
    top_p: float | None = None
    reasoning: ResponsesReasoning | None = None
    stream: bool = False
    store: bool | None = None
    include: Items[str] | None = None
    text: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Glimmer / vLLM extras, as on chat completions
    top_k: TopK | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: Seed | None = None
    reasoning_strength: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    skip_special_tokens: bool | None = None
    cache_salt: str | None = None  # as vLLM's Responses API: only requests with the same salt share cached blocks
    request_id: str | None = None  # vLLM's: the response's id, as sent (request_id.response_id)
    # accepted, echoed and ignored: they cannot change the output
    user: str | None = None
    metadata: Metadata | None = None
    service_tier: ServiceTier | None = None  # echoed as "default", the one tier that serves them all
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: PromptCacheRetention | None = None
    prompt_cache_options: ResponsesPromptCacheOptions | None = None  # `prewarm: true` refused (check_supported)
    stream_options: ResponsesStreamOptions | None = None  # only with `stream: true` (check_supported)
    # OpenAI's bound on calls to its built-in tools (web search, file search, ...), which function calls do not count
    # against: Glimmer has function tools only, so no value changes what the model may call
    max_tool_calls: Count | None = None
    # refused unless unset (see _REFUSED)
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None
    # chat's rendering fields: refused whatever their value, naming the endpoint that takes them (check_supported)
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    chat_template: Any = None


class InputTokensRequest(RequestBody):
    """The body of `POST /v1/responses/input_tokens`: the fields of a create request that shape its prompt (as
    OpenAI's, `input` may be left out), plus Glimmer's `chat_template_kwargs`."""

    model: str | None = None
    input: str | Items[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: Items[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ResponsesReasoning | None = None
    text: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    conversation: Any = None  # refused, as on create
    chat_template_kwargs: dict[str, Any] | None = None

    def as_create_request(self) -> dict[str, Any]:
        """The body of the create request whose prompt this counts."""
        return {**self.model_dump(exclude_none=True), "input": [] if self.input is None else self.input}


_REFUSED = {
    "background": "background responses are not supported; leave `background` unset",
    "conversation": "conversations are not supported; chain responses with `previous_response_id`",
    "prompt": "stored prompt templates are not supported; send `input` and `instructions`",
    "context_management": "`context_management` (compaction) is not supported",
}
OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
ENCRYPTED_REASONING = "reasoning.encrypted_content"
# the input images' URLs, which input_items always lists as sent: asking for them changes nothing
INPUT_IMAGE_URLS = "message.input_image.image_url"
INCLUDABLE = (OUTPUT_TEXT_LOGPROBS, ENCRYPTED_REASONING, INPUT_IMAGE_URLS)


def check_supported(request: ResponsesRequest) -> None:
    """Raises RequestError naming a field Glimmer cannot honour (HTTP 400) rather than ignore it."""
    for name, reason in _REFUSED.items():
        value = getattr(request, name)
        if value is not None and value is not False:
            raise RequestError(f"{name}: {reason}", param=name)
    check_metadata(request.metadata or {})
    if request.stream_options is not None and not request.stream:  # as chat's: it shapes a stream only
        raise RequestError("stream_options: only allowed when stream is true", param="stream_options")
    if request.prompt_cache_options is not None and request.prompt_cache_options.prewarm:
        raise RequestError("prompt_cache_options.prewarm: preparing the prompt cache without generating is not "
                           "supported (Glimmer caches a prompt's blocks as it answers it); leave `prewarm` unset or "
                           "false", param="prompt_cache_options.prewarm")
    reasoning_summary(request)
    _check_reasoning_modes(request.reasoning or ResponsesReasoning())
    if request.truncation == "auto":
        raise RequestError("truncation: 'auto' (dropping input to fit) is not supported; Glimmer refuses a prompt "
                           "over the context instead", param="truncation")
    check_include(request.include or [])
    text = request.text or {}
    unknown = set(text) - {"format", "verbosity"}
    if unknown:
        field = f"text.{sorted(unknown)[0]}"
        raise RequestError(f"{field}: unknown field", param=field)
    chat_response_format(request)  # checks text.format's shape
    if text.get("verbosity") not in (None, DEFAULT_VERBOSITY):
        raise RequestError(f"text.verbosity: {text['verbosity']!r} is not supported; only 'medium', OpenAI's default, "
                           "is (Glimmer's model has no verbosity control): ask for brevity or detail in the "
                           "instructions instead", param="text.verbosity")
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise RequestError("max_output_tokens: must be at least 1", param="max_output_tokens")
    for name in RENDERING_ARGUMENT_NAMES:
        if getattr(request, name) is not None:  # "unknown field" would not say which endpoint takes it
            raise RequestError(f"{name}: {_chat_only(name)}", param=name)
        if name in (request.chat_template_kwargs or {}):  # chat's own message sends the client to the top level
            raise RequestError(f"chat_template_kwargs may not set {name!r}: it is no template variable but "
                               f"{_chat_only(name)}", param="chat_template_kwargs")


def _chat_only(name: str) -> str:
    return ("a field of /v1/chat/completions, which /v1/responses does not take (a response always starts a new "
            f"assistant turn with the model's template); use /v1/chat/completions for {name!r}")


REASONING_CONTEXT, REASONING_MODE = "all_turns", "standard"  # the effective ones, which responses report


def _check_reasoning_modes(reasoning: ResponsesReasoning) -> None:
    """RequestError for a `reasoning.context` or `reasoning.mode` other than what Glimmer does (or `auto`)."""
    if reasoning.context == "current_turn":
        raise RequestError("reasoning.context: 'current_turn' is not supported: the reasoning of earlier turns is "
                           "rendered back to the model as sent ('all_turns'); use 'auto' or 'all_turns', or leave "
                           "earlier reasoning items out of the input", param="reasoning.context")
    if reasoning.mode not in (None, REASONING_MODE):
        raise RequestError(f"reasoning.mode: {reasoning.mode!r} is not supported; Glimmer runs the "
                           f"{REASONING_MODE!r} mode only (use reasoning.effort for more or less reasoning)",
                           param="reasoning.mode")


def check_include(values: list[str]) -> None:
    """RequestError naming `include` for a value Glimmer has nothing to include for."""
    for value in values:
        if value not in INCLUDABLE:
            raise RequestError(f"include: {value!r} is not supported (only {', '.join(INCLUDABLE)})",
                               param="include")


def reasoning_summary(request: ResponsesRequest) -> str | None:
    """The reasoning summary asked for (`reasoning.summary`, or its deprecated name `generate_summary`): "auto" or
    "detailed", both the reasoning text whole, or None. RequestError for "concise", which Glimmer cannot make."""
    reasoning = request.reasoning or ResponsesReasoning()
    if reasoning.generate_summary is not None and reasoning.summary not in (None, reasoning.generate_summary):
        raise RequestError("reasoning.generate_summary: the deprecated name of reasoning.summary, given another "
                           "value; send `summary` only", param="reasoning.generate_summary")
    summary = reasoning.summary or reasoning.generate_summary
    if summary == "concise":
        field = "reasoning.summary" if reasoning.summary else "reasoning.generate_summary"
        raise RequestError(f"{field}: 'concise' is not supported; Glimmer cannot condense the model's reasoning, it "
                           "returns it whole: use 'auto' or 'detailed' (the reasoning text as the summary too), or "
                           "leave it unset (the text in the reasoning item's content only)", param=field)
    return summary


def chat_response_format(request: ResponsesRequest) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`: `json_object` as it is, `json_schema` (`name`, `schema`,
    `description`, `strict` beside `type`) nested under `json_schema`; None for `text` or no format. The chat layer
    checks the rest (errors it raises are renamed to text.format by `responses_error`)."""
    text_format = (request.text or {}).get("format")
    if text_format is None:
        return None
    if not isinstance(text_format, dict):
        raise RequestError("text.format: must be an object with a `type`", param="text.format")
    kind = text_format.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise RequestError(f"text.format.type: {kind!r} is not one of 'text', 'json_object', 'json_schema'",
                           param="text.format.type")
    if kind != "json_schema":
        unknown = sorted(set(text_format) - {"type"})
        if unknown:
            raise RequestError(f"text.format.{unknown[0]}: unknown field for type {kind!r}",
                               param=f"text.format.{unknown[0]}")
        return None if kind == "text" else {"type": "json_object"}
    if text_format.get("schema") is None:  # required in the Responses API (optional only in chat's response_format)
        raise RequestError("text.format.schema: required for type 'json_schema', a JSON schema object",
                           param="text.format.schema")
    return {"type": "json_schema", "json_schema": {key: value for key, value in text_format.items() if key != "type"}}


_TOOL_FEATURES = {  # the SDK's FunctionToolParam fields for OpenAI features Glimmer has not: their plain value is taken
    "defer_loading": (False, "loading a tool only when a tool search finds it is not supported (the model is shown "
                             "every declared tool); leave it out or false"),
    "allowed_callers": (["direct"], "programmatic tool calling is not supported (the model calls tools itself); "
                                    'leave it out or ["direct"]'),
    "output_schema": (None, "a schema of the tool's outputs is not supported (the chat template shows the model "
                            "none); leave it out"),
}


def _check_tool_features(tool: dict[str, Any], i: int) -> None:
    """RequestError naming a field of OpenAI's function tools whose value asks for what Glimmer cannot do."""
    for name, (plain, reason) in _TOOL_FEATURES.items():
        if tool.get(name) is not None and tool[name] != plain:
            raise RequestError(f"tools[{i}].{name}: {reason}", param=f"tools[{i}].{name}")


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (`{"type": "function", "name", "description", "parameters", "strict"}`) in the
    chat shape, `strict` included (true: calls follow the schema, by grammar, under any tool_choice)."""
    if tools is None:
        return None
    converted = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise RequestError(f"tools[{i}].type: {tool.get('type')!r} tools are not supported; only 'function' "
                               "tools are", param=f"tools[{i}].type")
        _check_tool_features(tool, i)
        unknown = set(tool) - {"type", "name", "description", "parameters", "strict", *_TOOL_FEATURES}
        if "function" in unknown:  # the chat completions shape, the usual mistake
            raise RequestError(f"tools[{i}].function: unknown field; Responses function tools are flat "
                               '({"type": "function", "name": ..., "parameters": ...}), not nested under '
                               '"function" as on chat completions', param=f"tools[{i}].function")
        if unknown:
            field = f"tools[{i}].{sorted(unknown)[0]}"
            raise RequestError(f"{field}: unknown field", param=field)
        function = {key: tool[key] for key in ("name", "description", "parameters", "strict")
                    if tool.get(key) is not None}
        converted.append({"type": "function", "function": function})
    # P-REQ-8 and valid schemas on the flat declarations (name, description, parameters, strict), so errors name
    # their fields (tools[0].name, tools[0].parameters)
    normalize_tools(tools, check_schema=check_tool_parameters)
    return converted
