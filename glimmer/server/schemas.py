"""Request bodies of the OpenAI-compatible endpoints, validated once at the edge.

Unknown fields are refused (400 naming them) rather than ignored: a field Glimmer does not know might change
the output, and silently ignoring it (structured outputs, say) gives a client a wrong answer that looks
right. Three groups of known fields:

- honored: everything that maps to rendering, sampling (`logit_bias` included) or the response shape, vLLM's
  sampling extras included (`top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`,
  `include_stop_str_in_output`, `skip_special_tokens`, `prompt_logprobs`, `truncate_prompt_tokens`, `bad_words`;
  `allowed_token_ids` on completions), and vLLM's beam search (`use_beam_search`, `length_penalty`, `early_stopping`:
  server/beam_search.py);
- accepted and ignored, because they cannot change the output: `user`, `metadata` (held to OpenAI's limits), `store`,
  `service_tier` (a chat completion reports "default", the one tier that serves every request, as OpenAI reports
  the tier that served it) and `prompt_cache_retention` (values as the SDK types them),
  `safety_identifier`, `prompt_cache_key`, `prompt_cache_options`; and
  `spaces_between_special_tokens`, which the server always overrides to false (P-REQ-1);
- refused unless they hold a value that changes nothing (`REFUSED_UNLESS_DEFAULT`): the legacy `functions` /
  `function_call`, audio, predicted outputs, `verbosity` but "medium" (OpenAI's default), `suffix`, `best_of`.

Structured outputs (`response_format`, `structured_outputs`, `guided_*`) are checked in `structured_outputs.py`.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections.abc import Callable, Collection
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from glimmer.engine.sampling_params import (
    ALLOWED_TOKEN_IDS_SIZE_RULE,
    BAD_WORDS_SIZE_RULE,
    EVERY_TOKEN_LOGPROBS_REFUSAL,
    LOGIT_BIAS_SIZE_RULE,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_LOGPROBS,
    MAX_STOP_TOKEN_IDS,
    SEED_RANGE,
    STOP_TOKEN_IDS_SIZE_RULE,
    structured_constraint_given,
)
from glimmer.engine.vllm_arguments import VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS
from glimmer.errors import RequestError
from glimmer.protocol.duplicate_keys import refuse_duplicate_keys
from glimmer.protocol.request_normalization import lone_surrogate_error
from glimmer.server.settings import MAX_STOP_STRINGS, STOP_STRINGS_SIZE_RULE

# Every integer field has a range here, so that no value reaches a C conversion (torch, tokenizers) unchecked:
# a top_k of 2**63 once overflowed inside the sampler and stopped the engine. Tighter, server-specific limits
# (max_tokens against the context length) are checked later with messages that name them; `n` has only its
# server-specific range (1 to max_n), checked before any use, so that every bad n gets the same message.
INT32_MAX = 2**31 - 1
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
PositiveCount = Annotated[int, Field(ge=1, le=INT32_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Seed = Annotated[int, Field(ge=SEED_RANGE[0], lt=SEED_RANGE[1])]  # seed + n - 1 is checked by SamplingParams
TopK = Annotated[int, Field(ge=-1, le=INT32_MAX)]
LogprobCount = Annotated[int, Field(ge=0, le=MAX_LOGPROBS)]
LOGPROB_COUNT_FIELDS = frozenset({"logprobs", "top_logprobs", "prompt_logprobs"})  # the LogprobCount fields
_Item = TypeVar("_Item")
Items = Annotated[list[_Item], Field(fail_fast=True)]
"""A list of a request body: validation stops at its first bad item, the one the error names. Collecting an error for
each bad item made a 4 MB body of a million of them hold the event loop (every request and stream) for a minute."""


_UNSENT_NULLS = "unsent nulls"
"""The key of `validate_json`'s validation context naming the body's model and its null fields taken as not sent."""


class RequestBody(BaseModel):
    """A request body (or a part of one): unknown fields refused, types strict, null as unset (`drop_nulls`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _as_sent(cls, data: Any, info: ValidationInfo) -> Any:
        """The fields sent: the nulls `validate_json`'s `unsent_nulls` names dropped first (of the body alone, not of
        an object inside it), then the others `drop_nulls` drops; of the unknown fields, only the first is validated
        (refused, named by the 400): an error built for each of a 4 MB body's hundreds of thousands held the event
        loop (every request and stream) for seconds."""
        if not isinstance(data, dict):
            return data
        model, unsent_nulls = (info.context or {}).get(_UNSENT_NULLS, (None, ()))
        if model is cls:
            data = {key: value for key, value in data.items() if value is not None or key not in unsent_nulls}
        data = drop_nulls(cls, data)
        known = declared_fields(cls)
        unknown = next((key for key in data if key not in known), None)
        if unknown is None:
            return data
        return {key: value for key, value in data.items() if key in known or key == unknown}


def drop_nulls(model: type[BaseModel], data: Any) -> Any:
    """A field sent as null that cannot hold None is a field not sent, as the OpenAI reference types its optional
    fields ("… or null") and SDKs send None that way: `n: null` means the default n, not a 400. A field that
    can hold None keeps it, which may differ from its default (completions `max_tokens: null` is "up to the
    context" or the checkpoint's max_new_tokens, its default 16)."""
    if not isinstance(data, dict):
        return data
    fields = model.model_fields
    return {key: value for key, value in data.items()
            if value is not None or key not in fields or _takes_none(fields[key].annotation)}


def declared_fields(model: type[BaseModel]) -> frozenset[str]:
    """The field names a body of `model` is sent with (a field's alias where it has one)."""
    return frozenset(field.alias or name for name, field in model.model_fields.items())


def _takes_none(annotation: Any) -> bool:
    return annotation is None or type(None) in typing.get_args(annotation) or annotation is Any


class StreamOptions(RequestBody):
    include_usage: bool = False  # a last chunk with the whole usage; every other chunk has `"usage": null`
    continuous_usage_stats: bool = False  # vLLM's: every chunk carries the usage so far
    # OpenAI's padding of streamed chunks against side channels, which Glimmer never adds: either value changes nothing
    include_obfuscation: bool | None = None


def chunk_usage(options: StreamOptions | None, usage_so_far: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The `usage` field of a streamed chunk (the last, usage-only chunk aside): the usage so far with
    `continuous_usage_stats`, null with `include_usage` alone (as OpenAI streams it), else no field."""
    if options is None:
        return {}
    if options.continuous_usage_stats:
        return {"usage": usage_so_far()}
    return {"usage": None} if options.include_usage else {}


class PromptCacheOptions(RequestBody):
    """OpenAI's `prompt_cache_options` (the successor of `prompt_cache_retention`): hints for its prompt cache, which
    cannot change the output; checked as OpenAI types them and otherwise ignored."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


class NamedFunction(RequestBody):
    name: str


class NamedToolChoice(RequestBody):
    type: Literal["function"]
    function: NamedFunction


class ReasoningOptions(RequestBody):
    """The Responses-style `reasoning: {"effort": ...}` some clients send to chat completions (P-EFF-1)."""

    effort: str | None = None


class StructuredOutputsFields(RequestBody):
    """vLLM's `structured_outputs` object: one of the constraints (see StructuredOutputsParams)."""

    json_schema: str | dict[str, Any] | None = Field(default=None, alias="json")  # `json` would shadow BaseModel's
    regex: str | None = None
    choice: Items[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # vLLM's other fields (of VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS, `backend` being GuidedDecodingParams'): taken
    # where their value changes nothing, else refused saying what to do instead, as StructuredOutputsParams takes them
    disable_any_whitespace: Any = None
    disable_additional_properties: Any = None
    whitespace_pattern: Any = None
    structural_tag: Any = None
    disable_fallback: Any = None

    def constraints(self) -> dict[str, Any]:
        """The constraints given, by their StructuredOutputsParams names, and vLLM's other fields given."""
        given = self.model_dump(by_alias=True, include=self.model_fields_set)
        return {name: value for name, value in given.items()
                if name in VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS or structured_constraint_given(name, value)}


Metadata = Annotated[dict[str, str], Field(fail_fast=True)]  # OpenAI's: string values; refused at the first bad one
# the SDK's tiers (chat and Responses alike); one serves them all here, "default"
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]
SERVED_SERVICE_TIER = "default"  # the tier a chat completion or response reports serving it, as OpenAI reports one
PromptCacheRetention = Literal["in_memory", "24h"]  # the SDK's values of the deprecated field
Verbosity = Literal["low", "medium", "high"]  # the SDK's; Glimmer takes only the default, which changes nothing
DEFAULT_VERBOSITY = "medium"
_METADATA_MAX_PAIRS, _METADATA_MAX_KEY_CHARS, _METADATA_MAX_VALUE_CHARS = 16, 64, 512  # OpenAI's limits


def check_metadata(metadata: dict[str, str]) -> None:
    """RequestError for `metadata` over OpenAI's limits (a client moving to OpenAI would meet the 400 there; the
    Responses API echoes it)."""
    if len(metadata) > _METADATA_MAX_PAIRS:
        raise RequestError(f"metadata: {len(metadata)} key-value pairs, at most {_METADATA_MAX_PAIRS} are allowed",
                           param="metadata")
    for key, value in metadata.items():
        if len(key) > _METADATA_MAX_KEY_CHARS:
            raise RequestError(f"metadata: the key {key[:20]!r}... is {len(key)} characters long, at most "
                               f"{_METADATA_MAX_KEY_CHARS} are allowed", param="metadata")
        if len(value) > _METADATA_MAX_VALUE_CHARS:
            raise RequestError(f"metadata.{key}: the value is {len(value)} characters long, at most "
                               f"{_METADATA_MAX_VALUE_CHARS} are allowed", param=f"metadata.{key}")


class _SamplingFields(RequestBody):
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: TopK | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: Seed | None = None
    n: int = 1  # its range (1 to the server's max_n) is checked first thing, by `sampling`, in one message
    stop: str | Annotated[Items[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    min_tokens: Count = 0
    ignore_eos: bool = False
    # the lists and dicts SamplingParams caps are capped here too, so entries past the cap are never validated on
    # the event loop; request_error words the refusal as SamplingParams does (_SIZE_RULES)
    stop_token_ids: Annotated[Items[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None  # chat: default true (framing aside, see choice_stream); completions: false
    prompt_logprobs: LogprobCount | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # refused at its first bad value
    logit_bias: Annotated[dict[str, float], Field(fail_fast=True, max_length=MAX_LOGIT_BIAS_ENTRIES)] | None = None
    # completions only: chat refuses it (sampling.py)
    allowed_token_ids: Annotated[Items[TokenId], Field(max_length=MAX_ALLOWED_TOKEN_IDS)] | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None  # 0: SamplingParams names it
    # vLLM's; chat: over the whole raw turn, never its framing (bad_words.py)
    bad_words: Annotated[Items[str], Field(max_length=MAX_BAD_WORDS)] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: StructuredOutputsFields | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: Items[str] | None = None
    guided_grammar: str | None = None
    cache_salt: str | None = None
    request_id: str | None = None  # vLLM's: the response id is built on it, unless X-Request-Id is sent (request_id.py)
    # vLLM's beam search (server/beam_search.py): n is the beam width
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool = False
    # accepted and ignored: they cannot change the output
    user: str | None = None
    metadata: Metadata | None = None  # within OpenAI's limits (check_metadata)
    store: bool | None = None
    service_tier: ServiceTier | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: PromptCacheRetention | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    spaces_between_special_tokens: bool | None = None  # P-REQ-1: always false


class ChatCompletionRequest(_SamplingFields):
    messages: Items[dict[str, Any]] = Field(min_length=1)
    tools: Items[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    reasoning_strength: str | None = None
    reasoning: ReasoningOptions | None = None
    enable_thinking: bool | None = None
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None  # vLLM's: {} (no overrides) alone, as LLM.generate takes it
    # vLLM's: where the prompt ends (None: with the generation prompt unless the final message is continued)
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    chat_template: str | None = None  # vLLM's: the request's own template, if the server trusts requests with one
    echo: bool = False  # vLLM's: the final (assistant) message's content before each choice's (chat.echoed)
    max_tokens: PositiveCount | None = None
    max_completion_tokens: PositiveCount | None = None
    logprobs: bool = False
    top_logprobs: LogprobCount | None = None
    thinking_token_budget: Count | None = None
    # refused unless default (see REFUSED_UNLESS_DEFAULT)
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Items[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    verbosity: Verbosity | None = None  # "medium" (OpenAI's default) asks for nothing different: taken


class CompletionRequest(_SamplingFields):
    # token ids are checked against the vocabulary before any use, naming the one at fault (`completions._prompts`)
    prompt: str | Items[str] | Items[int] | Items[Items[int]]
    max_tokens: Count | None = 16  # 0 scores the prompt (echo, prompt_logprobs) without sampling
    logprobs: LogprobCount | None = None
    add_special_tokens: bool = True  # vLLM's: false reads a text prompt without the bos (token ids are taken as given)
    # refused unless default (see REFUSED_UNLESS_DEFAULT)
    echo: bool = False
    # refused unless default (see REFUSED_UNLESS_DEFAULT)
    suffix: str | None = None
    best_of: PositiveCount | None = None


REFUSED_UNLESS_DEFAULT: dict[str, str] = {
    "functions": "the legacy `functions` field is not supported; declare `tools` instead",
    "function_call": "the legacy `function_call` field is not supported; use `tool_choice` instead",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "verbosity": "only 'medium', OpenAI's default, is supported: Glimmer's model has no verbosity control; ask for "
                 "brevity or detail in the messages instead",
    "suffix": "`suffix` (insertion) is not supported",
}
NO_OP_VALUES: dict[str, Any] = {"verbosity": DEFAULT_VERBOSITY}  # taken beside null: what asks for nothing different


def parse_body(model: type[RequestBody], body: bytes, unsent_nulls: Collection[str] = ()) -> Any:
    """Validate a chat or completion body; raises RequestError naming the first field at fault (HTTP 400).
    `unsent_nulls`: see `validate_json`."""
    request = validate_json(model, body, unsent_nulls=unsent_nulls)
    _refuse_unsupported(request)
    return request


def validate_json(model: type[BaseModel], body: bytes, hints: dict[str, str] | None = None, *,
                  unsent_nulls: Collection[str] = ()) -> Any:
    """The body as `model`; raises RequestError naming the first field at fault (HTTP 400), or a key an object of
    the body gives twice. `hints`: see `request_error` (the chat and completion fields' by default). `unsent_nulls`:
    fields of the body (a RequestBody's) taken as not sent where they are null, so that the body is read as it came
    (its size already checked, its numbers as written) rather than written again without them."""
    context = {_UNSENT_NULLS: (model, frozenset(unsent_nulls))} if unsent_nulls else None
    try:
        validated = model.model_validate_json(body, context=context)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        if first["type"] == "json_invalid" and "recursion limit exceeded" in first["msg"]:
            raise _nested_too_deep(body) from None
        if first["type"] == "json_invalid":
            named = _lone_surrogate(body)  # a body that is not UTF-8 is refused as read, body.read_body
            if named is not None:
                raise named from None
        raise request_error(error, _UNION_FIELD_HINTS if hints is None else hints,
                            fields=declared_fields(model)) from None
    refuse_duplicate_keys(body)
    return validated


JSON_DEPTH_LIMIT = 200
"""How deep objects and arrays may nest in a request body, the body itself the first level: pydantic-core's JSON
parser stops at this fixed recursion limit, before any field is read."""


def _nested_too_deep(body: bytes) -> RequestError:
    """The RequestError for a body pydantic-core refused as nested past JSON_DEPTH_LIMIT: valid JSON (a deep schema
    or tool parameters, say), not "not valid JSON". Names the top-level field holding the deepest value when
    Python's parser (whose own limit is Python's recursion limit) can read the body."""
    try:
        value = json.loads(body)
    except RecursionError:  # deeper than Python's parser reads too: whether the rest is valid JSON is unknown
        value, read = None, False
    except ValueError as error:  # pydantic-core stopped at the depth before it reached the error
        return RequestError(f"the request body is not valid JSON: {error}", param=None)
    else:
        read = True
    fields = value.items() if isinstance(value, dict) else ()
    depths = {key: _depth(item) for key, item in fields}
    field = max(depths, key=depths.__getitem__) if depths else None
    valid = "the body is valid JSON, but " if read else ""
    return RequestError(f"{field or 'the request body'}: objects and arrays nest more than {JSON_DEPTH_LIMIT} levels "
                        "deep here (the body itself the first level), more than the server's JSON parser reads; "
                        f"{valid}flatten them (a JSON schema can define a repeated part once in $defs and point to it "
                        "with $ref)", param=field)


def _depth(value: Any) -> int:
    """How many levels of objects and arrays `value` nests (0 for a scalar), counted without recursing."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            pending += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


LONE_SURROGATE = re.compile("[\ud800-\udfff]")
"""A UTF-16 surrogate in a str: Python's JSON parser reads an unpaired `\\ud800` escape into one, which no UTF-8 text
can hold."""


def _lone_surrogate(body: bytes) -> RequestError | None:
    """The RequestError naming the first string of `body` (in document order) that holds a lone UTF-16 surrogate, a
    `\\ud800` escape without its pair: pydantic-core refuses such a body as invalid JSON, naming no field, where
    Python's parser reads it. None when Python's parser cannot read `body` either, or finds no lone surrogate."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while pending:  # iterative, and children pushed in reverse: the first lone surrogate of the body is named
        item, loc = pending.pop()
        if isinstance(item, str) and LONE_SURROGATE.search(item):
            return lone_surrogate_error(_field_path(loc) or None)
        if isinstance(item, dict):
            if any(LONE_SURROGATE.search(key) for key in item):  # a key holding one is named by its object
                return lone_surrogate_error(_field_path(loc) or None, "a key of ")
            pending += [(child, (*loc, key)) for key, child in reversed(item.items())]
        elif isinstance(item, list):
            pending += [(child, (*loc, index)) for index, child in reversed(list(enumerate(item)))]
    return None


def _field_path(loc: tuple[str | int, ...]) -> str:
    """A field's dotted path as error messages name it: `messages[0].content`."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


_UNION_FIELD_HINTS = {
    "tool_choice": "must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": NAME}}",
    "stop": "must be a string or a list of strings",
    "prompt": "must be a string, a list of strings, a list of token ids or a list of lists of token ids",
    "guided_json": "must be a JSON schema (an object or its JSON text)",
    "structured_outputs.json": "must be a JSON schema (an object or its JSON text)",
}

# what a field the schema caps (Field(max_length=...)) must be, as SamplingParams words its own refusal: pydantic's
# too_long says "List should have at most 4096 items after validation, not 4097"
_SIZE_RULES = {"stop_token_ids": STOP_TOKEN_IDS_SIZE_RULE, "allowed_token_ids": ALLOWED_TOKEN_IDS_SIZE_RULE,
               "logit_bias": LOGIT_BIAS_SIZE_RULE, "bad_words": BAD_WORDS_SIZE_RULE, "stop": STOP_STRINGS_SIZE_RULE}


# chat fields the Responses API names otherwise: it calls chat's limit max_output_tokens and holds reasoning_effort,
# response_format and verbosity in objects (OpenAI's 400 says they moved there); a Responses error names its own
# (`responses_input.responses_error`), and an unknown field sent to either gets the other's hint (`_did_you_mean`)
RESPONSES_NAMES_OF_CHAT_FIELDS = {"messages": "input", "max_completion_tokens": "max_output_tokens",
                                  "max_tokens": "max_output_tokens", "reasoning_effort": "reasoning.effort",
                                  "response_format": "text.format", "verbosity": "text.verbosity"}


def _renamed_fields() -> dict[str, tuple[str, ...]]:
    """A field's name on another endpoint → its names here, in the order a hint prefers them: chat's and Responses'
    names of one field both ways (`RESPONSES_NAMES_OF_CHAT_FIELDS`; a Responses object by its top-level field), and
    /v1/completions' max_tokens for chat's max_completion_tokens. `messages` is left to `_posted_to_another_endpoint`
    (a body posted to the wrong endpoint)."""
    renamed: dict[str, list[str]] = {"max_completion_tokens": ["max_tokens"]}
    for chat, responses in RESPONSES_NAMES_OF_CHAT_FIELDS.items():
        if chat != "messages":
            renamed.setdefault(chat, []).append(responses)
            renamed.setdefault(responses.split(".")[0], []).append(chat)
    return {name: tuple(names) for name, names in renamed.items()}


_RENAMED_FIELDS = _renamed_fields()
_RESPONSES_OBJECTS = {name.split(".")[0] for name in RESPONSES_NAMES_OF_CHAT_FIELDS.values() if "." in name}


# the field that carries a request's input on each endpoint: a body missing its own and sending another's was posted
# to the wrong endpoint (a chat body to /v1/completions)
_INPUT_FIELD_ENDPOINTS = {"messages": "/v1/chat/completions", "prompt": "/v1/completions", "input": "/v1/responses"}


def _posted_to_another_endpoint(errors: list[Any]) -> RequestError | None:
    """The RequestError for a body whose endpoint's input field (`prompt`) is missing and that sends another
    endpoint's (`messages`, an unknown field here); None for any other body."""
    missing = [error["loc"][0] for error in errors if error["type"] == "missing" and len(error["loc"]) == 1]
    sent = [error["loc"][0] for error in errors if error["type"] == "extra_forbidden" and len(error["loc"]) == 1]
    own = next((name for name in missing if name in _INPUT_FIELD_ENDPOINTS), None)
    other = next((name for name in sent if name in _INPUT_FIELD_ENDPOINTS), None)
    if own is None or other is None:
        return None
    return RequestError(f"{own}: missing, and `{other}` is a {_INPUT_FIELD_ENDPOINTS[other]} field: send this body "
                        f"to {_INPUT_FIELD_ENDPOINTS[other]}, or give {own} (this endpoint is "
                        f"{_INPUT_FIELD_ENDPOINTS[own]})", param=own)


def _did_you_mean(name: str, fields: Collection[str]) -> str:
    """' (did you mean FIELD?)' for an unknown top-level field that is another endpoint's name of one of `fields` or
    a misspelling of one; '' otherwise."""
    renamed = [field for field in _RENAMED_FIELDS.get(name, ()) if field.split(".")[0] in fields]
    if name in _RESPONSES_OBJECTS and renamed:  # `text` holds what chat sends as two fields
        return f" (did you mean {' or '.join(renamed)}?)"
    close = renamed or difflib.get_close_matches(name, list(fields), n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


def request_error(error: ValidationError, hints: dict[str, str] = _UNION_FIELD_HINTS,
                  fields: Collection[str] = ()) -> RequestError:
    """The RequestError naming the first field of a pydantic validation error (HTTP 400); `hints`: what a field
    (by its dotted path) whose value matches none of its union's shapes must be; `fields`: the body's top-level
    fields, one of which an unknown top-level field may have meant."""
    errors = error.errors(include_url=False)
    first = errors[0]
    loc = first["loc"]
    if first["type"] == "json_invalid":
        return RequestError(f"the request body is not valid JSON: {first['msg']}", param=None)
    if not loc:
        return RequestError("the request body must be a JSON object", param=None)
    wrong_endpoint = _posted_to_another_endpoint(errors)
    if wrong_endpoint is not None:
        return wrong_endpoint
    param = _field_path(loc)
    if first["type"] == "extra_forbidden":
        hint = _did_you_mean(param, fields) if len(loc) == 1 else ""
        return RequestError(f"{param}: unknown field{hint}; Glimmer refuses fields it does not know rather than "
                            "ignore something that might change the output", param=param)
    if first["type"] == "greater_than_equal" and first["input"] == -1 and param in LOGPROB_COUNT_FIELDS:
        return RequestError(f"{param}: {EVERY_TOKEN_LOGPROBS_REFUSAL}", param=param)  # vLLM's server takes -1
    if first["type"] == "less_than_equal" and param in LOGPROB_COUNT_FIELDS:  # vLLM's --max-logprobs raises it there
        return RequestError(f"{param}: more than the server's limit of {MAX_LOGPROBS} most likely tokens; ask for "
                            f"{MAX_LOGPROBS} or fewer (vLLM's --max-logprobs does not raise it here)", param=param)
    if first["type"] == "int_type" and isinstance(first["input"], bool) and param in LOGPROB_COUNT_FIELDS:
        # vLLM's server reads true as 1, false as 0; chat's `logprobs` is the boolean, this field a count
        return RequestError(f"{param}: {str(first['input']).lower()} is not a number; give the number of most likely "
                            f"tokens wanted, 0 to {MAX_LOGPROBS} (chat completions' logprobs is the boolean)",
                            param=param)
    field = loc[0]
    # a union's (stop's) list member that is too long is not its first error: the string member's is
    if field in _SIZE_RULES and any(e["type"] == "too_long" and e["loc"][:1] == (field,) for e in errors):
        return RequestError(f"{field}: {_SIZE_RULES[field]}", param=field)
    hinted = next((field for field in hints if param == field or param.startswith((f"{field}.", f"{field}["))), None)
    if hinted is not None:  # pydantic names the union member it tried last (`guided_json.str`), not a field
        return RequestError(f"{hinted}: {hints[hinted]}", param=hinted)
    return RequestError(f"{param}: {first['msg']}", param=param)


def _refuse_unsupported(request: RequestBody) -> None:
    for name, reason in REFUSED_UNLESS_DEFAULT.items():
        value = getattr(request, name, None)
        # `is`, not `in (None, False)`: 0 and 0.0 equal False, and a number here is no way of leaving a field unset
        if value is not None and value is not False and value != NO_OP_VALUES.get(name):
            raise RequestError(f"{name}: {reason}", param=name)
    if request.stream_options is not None and not request.stream:
        raise RequestError("stream_options: only allowed when stream is true", param="stream_options")
    check_metadata(request.metadata or {})
    if isinstance(request, ChatCompletionRequest):
        _refuse_unsupported_chat(request)
    elif request.best_of not in (None, request.n):  # OpenAI refuses a best_of below n too: it cannot pick n of fewer
        raise RequestError(f"best_of: {request.best_of} is not supported; leave it unset or equal to n "
                           f"({request.n})", param="best_of")


def _refuse_unsupported_chat(request: ChatCompletionRequest) -> None:
    if request.modalities is not None and request.modalities != ["text"]:
        raise RequestError(f"modalities: {request.modalities} is not supported; only ['text'] is",
                           param="modalities")
    if request.mm_processor_kwargs:
        key = next(iter(request.mm_processor_kwargs))
        raise RequestError(f"mm_processor_kwargs.{key}: not supported per request: image and video sizes are the "
                           "checkpoint's processor settings (bounded by the server's --max-image-pixels); leave "
                           "mm_processor_kwargs out, or send {}", param=f"mm_processor_kwargs.{key}")
    for index, tool in enumerate(request.tools or []):
        _refuse_unknown_tool_fields(tool, index)


TOOL_FIELDS = frozenset({"type", "function"})
FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})
"""The fields of a chat tool declaration (`{"type": "function", "function": {...}}`) and of its function (also
accepted bare, beside `type`). Their values are checked by `normalize_tools`."""


def _refuse_unknown_tool_fields(tool: dict[str, Any], index: int) -> None:
    """RequestError naming the first field of `tools[index]` (or of its `function`) that a tool declaration does
    not have: as everywhere else, a field Glimmer does not know is refused rather than ignored. Null is unset. A tool of
    another type (the SDK's `custom`) is refused naming its `type`: its own fields are no unknown fields of it."""
    kind = tool.get("type")
    if kind is not None and kind != "function":
        raise RequestError(f"tools[{index}].type {kind!r} is not supported; only 'function' tools are",
                           param=f"tools[{index}].type")
    function = tool.get("function")
    if isinstance(function, dict):
        checked = [(f"tools[{index}]", tool, TOOL_FIELDS), (f"tools[{index}].function", function, FUNCTION_FIELDS)]
    else:  # a bare function object; a `function` that is not an object is refused by normalize_tools
        checked = [(f"tools[{index}]", tool, TOOL_FIELDS | FUNCTION_FIELDS)]
    for where, fields, known in checked:
        unknown = sorted(key for key, value in fields.items() if key not in known and value is not None)
        if unknown:
            field = f"{where}.{unknown[0]}"
            raise RequestError(f"{field}: unknown field; a chat tool is {{\"type\": \"function\", \"function\": "
                               "{\"name\", \"description\", \"parameters\", \"strict\"}}, and Glimmer refuses fields "
                               "it does not know rather than ignore something that might change the output",
                               param=field)
