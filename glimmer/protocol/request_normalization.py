"""Turning an OpenAI-style request's messages and tools into what the chat template expects.

Clients send history the OpenAI way: tool-call `arguments` as JSON strings, reasoning as `reasoning`, media
as `image_url` parts, tools with optional fields. The template wants mappings, `reasoning_content`,
`image`/`video` parts and complete tool objects (P-TMPL-6). Everything is normalized before rendering, so
a request the template cannot render fails here with a message naming the field instead of deep inside
jinja. Nothing is modified in place.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from glimmer.errors import RequestError
from glimmer.protocol.chat_template import REASONING_FIELDS
from glimmer.protocol.duplicate_keys import first_duplicate_key
from glimmer.protocol.headers import channel_of_recipient, is_valid_recipient
from glimmer.protocol.tokens import RECIPIENT_MAX
from glimmer.protocol.tool_registry import function_of
from glimmer.protocol.value_typing import (
    LoneSurrogateError,
    allowed_types,
    is_json_number,
    object_shape,
    root_schemas,
    strict_json_loads,
)

logger = logging.getLogger(__name__)

SchemaCheck = Callable[[Mapping[str, Any], str, bool], None]
"""Checks a JSON schema given the field holding it and whether it is strict (a tool declared `"strict": true`);
raises RequestError naming that field when it is invalid."""

RENDERED_ROLES = frozenset({"system", "user", "assistant", "tool"})
"""Roles the Muse Glimmer template renders; others render nothing (P-TMPL-7)."""

CONTENT_ROLES = frozenset({"system", "developer", "user", "tool"})
"""Roles whose messages must carry content: the template would render a missing one as an empty turn. An assistant
message may leave it null (beside tool calls or reasoning, or as a reply came back with nothing to show)."""

EMPTY_PARAMETERS_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}
"""The schema a tool without `parameters` gets (P-TMPL-6)."""

# image_pil: vLLM LLM.chat's; input_image: the Responses API's ({"image_url": URL}), which vLLM's chat takes too
MEDIA_PART_TYPES = {"image_url": "image", "video_url": "video", "image_pil": "image", "input_image": "image"}
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
"""Text part types a chat message takes: its own, and the Responses API's, as vLLM's chat reads them."""
RENDERED_PART_TYPES = frozenset({"text", "image", "video"})
"""Content part types the template renders (text, `<|patch|>`, `<|video|>`); other parts would render nothing."""

MAX_ARGUMENTS_DEPTH = 64
"""Tool-call arguments may nest objects and arrays this deep; deeper ones are refused (they only serve to
exhaust the renderer's recursion)."""


def normalize_messages(messages: Any, *, developer_as_system: bool = True,
                       refuse_unrendered: bool = False) -> list[dict[str, Any]]:
    """Copies of `messages` ready to render (P-TMPL-6, P-TMPL-7).

    - assistant tool-call `arguments` given as a JSON string are decoded (`""` is `{}`); arguments that are
      not a JSON object, or give a key twice in one object, raise RequestError naming the message index and field;
      a bare call (`{"id", "name", "arguments"}`) gets OpenAI's shape (`{"id", "type", "function": {"name",
      "arguments"}}`), which chat templates read;
    - `reasoning` fills a missing `reasoning_content` (unless `thinking`, which templates read before it, is given);
    - content is a string or a list of content parts (anything else raises RequestError); only an assistant
      message may leave it out, null or an empty list (which renders the empty turn null does). A text part needs a
      string `text`;
    - an assistant message's `refusal` (beside null content) is its content, and a `refusal` content part of an
      assistant message a text part: what the model said in refusing is the assistant's text (elsewhere RequestError);
    - a tool message names its tool: by `name`, else by a string `tool_call_id` that an earlier assistant message's
      tool call has as its `id` (else RequestError naming `messages[i].tool_call_id`); each call is answered once
      and the calls of one turn have distinct ids (`_CallsSoFar`);
    - the tool results answering one assistant turn come in the order of its calls (`tool_results_in_call_order`);
    - OpenAI `image_url` / `video_url` content parts become `image` / `video` parts; the part keeps its
      `image_url` / `video_url` entry for the media layer. A part the model cannot take (`input_audio`,
      `file`, an unknown type) raises RequestError naming it: it would render nothing;
    - an assistant message with both content and tool calls becomes two: its reasoning and content, not ending the
      turn (`end_turn: false`), then its calls (`_content_before_calls`);
    - `developer` messages are instructions, rendered as the system message (`developer_as_system`, on by
      default): with no system message the first developer message becomes one; every other developer
      message's text joins the first system message's, after a blank line, in message order;
    - other roles the template does not render pass unchanged (they render nothing) with a warning, unless
      `refuse_unrendered` (a serving API): then such a role, or an assistant turn holding something the template
      would drop, raises RequestError naming the message (`_refuse_unrendered`), and nothing is logged: a request
      that is refused leaves no warning.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise RequestError("messages must be a list of message objects", param="messages")
    normalized = []
    unrendered_roles: list[str] = []
    calls = _CallsSoFar()
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RequestError(f"messages[{index}] must be an object, got {type(message).__name__}",
                               param="messages")
        message = dict(message)
        role = message.get("role")
        if not isinstance(role, str):
            raise RequestError(f"messages[{index}].role must be a string", param=f"messages[{index}].role")
        if refuse_unrendered:
            _refuse_unrendered(message, index)
        elif role not in RENDERED_ROLES and role not in unrendered_roles and not (
                role == "developer" and developer_as_system):
            unrendered_roles.append(role)
        if role == "tool":
            if message.get("name") not in (None, ""):  # rendered as the header's `tool NAME` ("" reads as none)
                check_tool_name(message["name"], f"messages[{index}].name")
            # named here, as the template would name it by searching every earlier call for its id: for each of a
            # request's tool messages, which took minutes for a few thousand results (§2.1 renders the same)
            message["name"] = calls.check_result(message, index)
        if role != "assistant":
            calls.end_turn()
        content = message.get("content")
        if (content is None or content == []) and role in CONTENT_ROLES:  # [] renders the empty turn null would
            raise RequestError(f"messages[{index}].content: a {role} message needs its content (a string or a "
                               f"non-empty list of content parts, got {'null' if content is None else '[]'}); only "
                               "an assistant message may leave it out or null", param=f"messages[{index}].content")
        if isinstance(content, list):
            message["content"] = [_normalized_part(part, f"messages[{index}].content[{part_index}]", role)
                                  for part_index, part in enumerate(content)]
            if role in ("system", "developer"):
                _instruction_text(message["content"], index)  # text only, as developer messages always were
        elif content is not None and not isinstance(content, str):
            raise RequestError(f"messages[{index}].content must be a string or a list of content parts, got "
                               f"{type(content).__name__}", param=f"messages[{index}].content")
        # transformers' order: reasoning_content, then thinking, then reasoning
        if (message.get("reasoning_content") is None and message.get("thinking") is None
                and message.get("reasoning") is not None):
            message["reasoning_content"] = message["reasoning"]
        for key in ("reasoning_content", "thinking"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise RequestError(f"messages[{index}].{key} must be a string, got {type(message[key]).__name__}",
                                   param=f"messages[{index}].{key}")
        if role == "assistant":
            _check_recipient(message.get("recipient"), index)
            _refusal_as_content(message, index)
        if message.get("tool_calls") is not None:
            message["tool_calls"] = _normalized_tool_calls(message["tool_calls"], index)
            if role == "assistant":
                calls.add_calls(message["tool_calls"], index)
        normalized.append(message)
    normalized = _content_before_calls([normalized[i] for i in tool_results_in_call_order(normalized)])
    if unrendered_roles:  # P-TMPL-7; says nothing of dropping, since LLM.chat and the server never drop them
        logger.warning("messages with role(s) %s are not rendered by the chat template: they render nothing "
                       "(LLM.chat and glimmer serve %s)",
                       ", ".join(repr(role) if len(role) <= 64 else f"{role[:64]!r}… ({len(role):,} characters)"
                                 for role in unrendered_roles), _what_serving_apis_do(unrendered_roles))
    return _merged_instructions(normalized) if developer_as_system else normalized


def _what_serving_apis_do(unrendered_roles: list[str]) -> str:
    """What LLM.chat and glimmer serve do with messages of `unrendered_roles`, for the warning of a caller who keeps
    them: they map `developer` to the system instruction (docs/ERRATA.md, P-TMPL-7) and refuse the other roles."""
    developer = "developer" in unrendered_roles
    done = ["render developer messages as the system instruction"] if developer else []
    if len(unrendered_roles) > developer:  # a role besides developer (each is listed once)
        done.append("refuse the other roles" if developer else "refuse them")
    return " and ".join(done)


def _refusal_as_content(message: dict[str, Any], index: int) -> None:
    """An assistant message's `refusal` (OpenAI's field for what the model said in refusing, beside a null content)
    moved into its content: it is the assistant's text, as a /v1/responses refusal part is, and OpenAI keeps refusals
    in the conversation. RequestError naming it when it is not a string, or beside content, which a reply never has
    with a refusal (neither would say where the other goes)."""
    refusal = message.pop("refusal", None)
    if refusal is None or refusal == "":
        return
    field = f"messages[{index}].refusal"
    if not isinstance(refusal, str):
        raise RequestError(f"{field} must be a string, what the model said in refusing; got {type(refusal).__name__}",
                           param=field)
    if message.get("content"):
        raise RequestError(f"{field}: an assistant message holds its refusal or its content, not both (a reply has "
                           "one of them); send the text the model said as content, or as refusal with content null",
                           param=field)
    message["content"] = refusal


def _check_recipient(recipient: Any, index: int) -> None:
    """An assistant message's `recipient` is written into its header as `to=RECIPIENT` (null or "" is the user): a
    value that is not a well-formed recipient (P-HDR-2) would render a header the model reads as ill-formed, and a
    continued message's reply would be parsed for a channel the prompt does not open. RequestError naming it."""
    if recipient is None or recipient == "":
        return
    field = f"messages[{index}].recipient"
    if not isinstance(recipient, str):
        raise RequestError(f"{field} must be a string (\"user\", \"self\" or a tool's name), got "
                           f"{type(recipient).__name__}", param=field)
    if not is_valid_recipient(recipient):
        raise RequestError(f"{field} {recipient[:RECIPIENT_MAX]!r} is not a recipient a header can name: 1 to "
                           f"{RECIPIENT_MAX} characters without whitespace or '<' (\"user\", \"self\" or a tool's "
                           "name)", param=field)


def tool_results_in_call_order(messages: Sequence[Any]) -> list[int]:
    """The index of each message in the order they render: the tool messages right after an assistant turn (its
    consecutive assistant messages) in the order of that turn's tool calls, the rest as sent.

    The template matches a result to its call by position only (a tool message renders as `tool NAME`, with no call
    id), so results sent in another order than the calls (OpenAI matches them by id) would each be read as the other
    call's. The run is put in call order only when every one of its messages answers a distinct call of that turn by
    `tool_call_id` and the turn's call ids are distinct; otherwise (a result naming its tool by `name` alone, or
    answering a call of an earlier turn) nothing says which call each answers, and the run keeps the order sent.
    `messages` as sent or normalized; anything malformed keeps its place (normalization refuses it)."""
    order = list(range(len(messages)))
    index = 0
    while index < len(messages):
        call_ids: list[Any] = []
        while index < len(messages) and _role(messages[index]) == "assistant":
            tool_calls = messages[index].get("tool_calls")
            call_ids += [call.get("id") for call in tool_calls if isinstance(call, Mapping)] if isinstance(
                tool_calls, list) else []
            index += 1
        start = index
        while index < len(messages) and _role(messages[index]) == "tool":
            index += 1
        if start == index:
            index += 1  # neither an assistant's nor a tool message
            continue
        position = {call_id: n for n, call_id in enumerate(call_ids) if isinstance(call_id, str)}
        answered = [messages[i].get("tool_call_id") for i in range(start, index)]
        if (len(position) == len(call_ids) and all(isinstance(call_id, str) and call_id in position
                                                   for call_id in answered) and len(set(answered)) == len(answered)):
            order[start:index] = sorted(range(start, index), key=lambda i: position[messages[i]["tool_call_id"]])
    return order


def refuse_unmatched_tool_messages(messages: Sequence[Any], *, final_turn_is_history: bool = False) -> None:
    """RequestError for a tool message that answers no call of the assistant turn right before it, or for a call
    that the tool messages right after its turn do not answer (`messages` as sent; an assistant turn is its
    consecutive assistant messages, and its results the tool messages right after it). A result answers a call of
    its turn by `tool_call_id`, or, for a result whose id names none of them, by the tool's `name` (a call not yet
    answered). Checked in message order; within a turn, its results first.

    A result of no call (after a user message, after a turn that made no call, or one too many) would render as the
    output of a call the model never made; OpenAI refuses it (400 "messages with role 'tool' must be a response to a
    preceeding message with 'tool_calls'", and an id of no such call: "'tool_call_id' ... not found in 'tool_calls'
    of previous message"). The error names `messages[i].tool_call_id` when the message has an id (as the check of ids
    that name no earlier call at all, in `normalize_messages`), else `messages[i]`.

    A call without a result: the template would render the call and then whatever follows as if its result never
    came, and the model would answer from nothing; OpenAI refuses such a conversation (400 "An assistant message with
    'tool_calls' must be followed by tool messages responding to each 'tool_call_id'"). The error names the first such
    call, `messages[i].tool_calls[j]`. `final_turn_is_history`: the prompt ends inside or right after the
    conversation's final assistant turn (`continue_final_message`, `add_generation_prompt: false`), so no new turn
    follows its calls there and they are not checked. Malformed messages are left to `normalize_messages`."""
    index = 0
    while index < len(messages):
        if _role(messages[index]) not in ("assistant", "tool"):
            index += 1
            continue
        calls: list[tuple[str, Mapping[str, Any]]] = []
        while index < len(messages) and _role(messages[index]) == "assistant":
            tool_calls = messages[index].get("tool_calls")
            if isinstance(tool_calls, list):
                calls += [(f"messages[{index}].tool_calls[{j}]", call) for j, call in enumerate(tool_calls)
                          if isinstance(call, Mapping)]
            index += 1
        results: list[tuple[int, Mapping[str, Any]]] = []
        while index < len(messages) and _role(messages[index]) == "tool":
            results.append((index, messages[index]))
            index += 1
        if index == len(messages) and not results and final_turn_is_history:
            return
        unanswered, unmatched = _match_results(calls, results)
        if unmatched:
            raise _result_of_no_call(*unmatched[0], calls)
        if unanswered:
            field, call = unanswered[0]
            call_id = call.get("id")
            name = (function_of(call) or {}).get("name")
            answered_by = ("tool_call_id", call_id) if isinstance(call_id, str) else ("name", name)
            answer = f'{{"role": "tool", "{answered_by[0]}": {json.dumps(answered_by[1])}, "content": RESULT}}'
            raise RequestError(f"{field}: an assistant message with tool_calls must be followed by tool messages "
                               f"answering each call, and no tool message right after this turn answers the call "
                               f"of {name!r}{f' (id {call_id!r})' if isinstance(call_id, str) else ''}; send its "
                               f"result as {answer} right after the assistant message, or remove the call",
                               param=field)


def _match_results(calls: list[tuple[str, Mapping[str, Any]]], results: list[tuple[int, Mapping[str, Any]]]
                   ) -> tuple[list[tuple[str, Mapping[str, Any]]], list[tuple[int, Mapping[str, Any]]]]:
    """(the calls of one turn that none of its results answers, the results that answer none of its calls): a result
    answers by `tool_call_id`, else by `name` the first call of that tool not yet answered."""
    call_ids = {call.get("id") for _, call in calls if isinstance(call.get("id"), str)}
    by_id = {result.get("tool_call_id") for _, result in results if isinstance(result.get("tool_call_id"), str)}
    by_id &= call_ids
    pending = [(field, call) for field, call in calls if not (isinstance(call.get("id"), str) and call["id"] in by_id)]
    # tool name → the places in `pending` of its calls not yet answered, in call order: a result takes the first of
    # its name's at once (searching `pending` for each result was quadratic: 20,000 results took minutes)
    waiting: dict[str | None, deque[int]] = {}
    for n, (_, call) in enumerate(pending):
        name = (function_of(call) or {}).get("name")
        if name is None or isinstance(name, str):  # another type is refused by `normalize_messages`
            waiting.setdefault(name, deque()).append(n)
    answered: set[int] = set()
    unmatched = []
    for index, result in results:
        if isinstance(result.get("tool_call_id"), str) and result["tool_call_id"] in by_id:
            continue
        name = result.get("name")
        calls_of_tool = waiting.get(name) if name is None or isinstance(name, str) else None
        if calls_of_tool:
            answered.add(calls_of_tool.popleft())
        else:
            unmatched.append((index, result))
    return [call for n, call in enumerate(pending) if n not in answered], unmatched


def _result_of_no_call(index: int, result: Mapping[str, Any], calls: list[tuple[str, Mapping[str, Any]]]
                       ) -> RequestError:
    """The error for the tool message `messages[index]`, which answers none of `calls`, its turn's."""
    call_id = result.get("tool_call_id")
    if calls:
        made = ", ".join(f"{(function_of(call) or {}).get('name')!r}"
                         + (f" (id {call['id']!r})" if isinstance(call.get("id"), str) else "") for _, call in calls)
        before = f"the assistant turn right before it calls {made}, and each call has one result"
    else:
        before = "no assistant message with tool_calls comes right before it"
    if isinstance(call_id, str) and call_id:
        field = f"messages[{index}].tool_call_id"
        what = f"{field}: tool_call_id {call_id!r} answers no tool call"
    else:
        field = f"messages[{index}]"
        what = f"{field}: this tool message (name {result.get('name')!r}) answers no tool call"
    return RequestError(f"{what}: {before}; a tool message is the result of a call of the assistant message it "
                        "follows: send it right after that message, with that call's tool_call_id, or remove it",
                        param=field)


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


class _CallsSoFar:
    """The tool calls of the messages read so far, and their results: what the next tool message may answer.

    A tool message answers a call made before it (§2.1: its NAME is that call's function) and only once: two results
    of one call are two answers to one question, and OpenAI refuses them ("Duplicate value for 'tool_call_id'"). The
    calls of one turn (consecutive assistant messages) have distinct ids, else no result says which call it answers.
    An id may come back in a later turn (some servers number calls per turn, `search:0`): it is a new call then, which
    may be answered again. Each check raises RequestError naming the field."""

    def __init__(self) -> None:
        self.made: dict[str, str] = {}  # id → function name, of every call so far (the last call of an id wins)
        self.this_turn: dict[str, str] = {}  # id → field, of the calls of the current assistant turn
        self.answered: dict[str, int] = {}  # tool_call_id → the tool message answering it, since its call

    def end_turn(self) -> None:
        self.this_turn.clear()

    def add_calls(self, tool_calls: list[dict[str, Any]], index: int) -> None:
        for call_index, call in enumerate(tool_calls):
            call_id = call.get("id")
            if not isinstance(call_id, str):
                continue
            field = f"messages[{index}].tool_calls[{call_index}].id"
            if call_id in self.this_turn:
                raise RequestError(f"{field}: duplicate tool call id {call_id!r} (also {self.this_turn[call_id]}); the "
                                   "calls of one assistant turn need distinct ids, by which their tool messages "
                                   "answer them", param=field)
            self.this_turn[call_id] = field
            self.made[call_id] = call["function"]["name"]
            self.answered.pop(call_id, None)

    def check_result(self, message: Mapping[str, Any], index: int) -> str:
        """The name of the tool a tool message answers (§2.1): its `name`, else the function of the last earlier
        assistant tool call with its `tool_call_id` (a `name` beside such an id must be that function's). The
        template would otherwise render the raw id (or nothing), or another tool, as the tool's name, and the model
        would read a result of no call it made."""
        field = f"messages[{index}].tool_call_id"
        call_id = message.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise RequestError(f"{field} must be a string, the id of the tool call the result answers; got "
                               f"{type(call_id).__name__}", param=field)
        if call_id and call_id in self.answered:
            raise RequestError(f"{field}: duplicate tool_call_id {call_id!r}: messages[{self.answered[call_id]}] "
                               "answers the same tool call; each call has exactly one tool message, so send one "
                               "result per call", param=field)
        if call_id:
            self.answered[call_id] = index
        name = message.get("name")
        if name and call_id in self.made and name != self.made[call_id]:
            raise RequestError(f"messages[{index}].name: {name!r} is not the tool that call {call_id!r} called "
                               f"({self.made[call_id]!r}), and the result would render as the output of {name!r}; "
                               "send the call's name or leave name out", param=f"messages[{index}].name")
        if name:
            return name
        if not call_id:
            raise RequestError(f"messages[{index}]: a tool message needs the tool_call_id of the call it answers "
                               "(or the tool's name); without it the result would name no tool", param=field)
        if call_id not in self.made:
            raise RequestError(f"{field}: no earlier assistant message holds a tool call with id {call_id!r}; send "
                               "the assistant message with the call before its result (or give the tool's `name`)",
                               param=field)
        return self.made[call_id]


def prefix_message_index(messages: Any) -> int | None:
    """The index of the final message when it is an assistant message with `"prefix": true` (DeepSeek's and Kimi's
    assistant prefill: the reply continues that message, as vLLM's `continue_final_message` continues the final
    message), else None. RequestError naming `messages[i].prefix` for a prefix that is not a boolean (null is
    false), or true on a message that is not the final one or not an assistant's: no reply could continue it, and
    rendering it as a finished message would answer what the client did not ask. Malformed messages are left to
    `normalize_messages`."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        return None
    found = None
    for index, message in enumerate(messages):
        prefix = message.get("prefix") if isinstance(message, Mapping) else None
        if prefix is None or prefix is False:
            continue
        field = f"messages[{index}].prefix"
        if prefix is not True:
            raise RequestError(f"{field} must be true or false (true: the reply continues this final assistant "
                               f"message), not {prefix!r}", param=field)
        if message.get("role") != "assistant" or index != len(messages) - 1:
            raise RequestError(f"{field}: only the final message, an assistant's, can be a prefix (the reply "
                               f"continues it); this is {'a' if index == len(messages) - 1 else 'a non-final'} "
                               f"{message.get('role')!r} message: leave prefix out here", param=field)
        found = index
    return found


# Fields of an assistant message that hold something the model said, which the template cannot render: audio, a
# legacy function call. A serving API refuses them (non-empty) rather than drop what they hold. (A refusal is the
# assistant's text: `_refusal_as_content`.)
UNRENDERED_ASSISTANT_FIELDS = frozenset({"audio", "function_call"})


def _refuse_unrendered(message: Mapping[str, Any], i: int) -> None:
    """RequestError naming message `i` of a request (as sent, before `normalize_messages` merges developer messages)
    when its role is one the template does not render, or its assistant turn holds something it would drop (a
    non-empty `audio` or legacy `function_call`): a serving API refuses them rather than drop them
    from the prompt. Other fields the template does not read are metadata clients and agent frameworks send back
    as they got them (`name`, `annotations`, litellm's `provider_specific_fields`, ids) and are ignored, as
    OpenAI and vLLM ignore them."""
    role = message["role"]
    if role not in RENDERED_ROLES and role != "developer":
        raise RequestError(f"messages[{i}].role: {role!r} is not a role this model takes (system, "
                           "developer, user, assistant, tool)", param=f"messages[{i}].role")
    if role != "assistant":
        return
    for key in sorted(UNRENDERED_ASSISTANT_FIELDS & set(message)):
        if message[key]:
            raise RequestError(f"messages[{i}].{key}: an assistant message's {key} cannot be rendered (Muse "
                               "Glimmer's chat format has no place for it); leave it out or null",
                               param=f"messages[{i}].{key}")


def _content_before_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each assistant message holding content and tool calls as two messages: its reasoning and content, which do not
    end the turn, then its calls. The template drops the content of a message with calls (§2.1), and the model writes
    such a turn as its text to the user (`<|eom|>`), then its calls; a /v1/responses message item before calls
    renders so too."""
    split: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] != "assistant" or not message.get("tool_calls") or not message.get("content"):
            split.append(message)
            continue
        text = {key: value for key, value in message.items() if key != "tool_calls"}
        calls = {key: value for key, value in message.items() if key not in ("content", *REASONING_FIELDS)}
        split += [{**text, "end_turn": False}, calls]
    return split


def _merged_instructions(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Developer messages folded into the first system message (one becomes it when there is none)."""
    instructions = [i for i, m in enumerate(messages) if m["role"] in ("system", "developer")]
    if not any(messages[i]["role"] == "developer" for i in instructions):
        return messages
    systems = [i for i in instructions if messages[i]["role"] == "system"]
    target = systems[0] if systems else instructions[0]
    merged = [i for i in instructions if i == target or messages[i]["role"] == "developer"]
    texts = [_instruction_text(messages[i].get("content"), i) for i in merged]
    system = {**messages[target], "role": "system", "content": "\n\n".join(t for t in texts if t)}
    dropped = set(merged) - {target}
    return [system if i == target else m for i, m in enumerate(messages) if i not in dropped]


def _instruction_text(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text") or "") for p in content)
    raise RequestError(f"messages[{index}].content: system and developer messages take text only",
                       param=f"messages[{index}].content")


def _normalized_part(part: Any, field: str, role: str) -> Any:
    if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
        raise RequestError(f'{field} must be an object with a string "type" (text, image_url, video_url)',
                           param=field)
    kind = part["type"]
    if kind == "refusal":
        return {"type": "text", "text": refusal_part_text(part, field, role == "assistant",
                                                          f"send the {role} message's words as a text part")}
    if kind in TEXT_PART_TYPES:
        if not isinstance(part.get("text"), str):
            raise RequestError(f'{field}: a {kind} part needs a string "text"', param=field)
        return {**part, "type": "text"}
    if kind in MEDIA_PART_TYPES:
        return {**part, "type": MEDIA_PART_TYPES[kind]}
    if kind not in RENDERED_PART_TYPES:
        raise RequestError(f"{field}: content parts of type {kind!r} are not supported (this model takes "
                           "text, image_url and video_url parts); remove the part", param=field)
    return part


def refusal_part_text(part: Mapping[str, Any], field: str, in_assistant_message: bool, instead: str) -> str:
    """The words of a `refusal` content part (OpenAI's, for what the model said in refusing), which an assistant
    message takes as its text (chat's messages, /v1/responses' message items); RequestError naming it elsewhere,
    where the model's words would be read as another turn's (`instead` says what to send), or without its string."""
    if not in_assistant_message:
        raise RequestError(f"{field}: a refusal part is the model's refusal, taken in an assistant message only; "
                           f"{instead}", param=field)
    if not isinstance(part.get("refusal"), str):
        raise RequestError(f"{field}.refusal: a refusal part needs a string `refusal`", param=f"{field}.refusal")
    return part["refusal"]


def _normalized_tool_calls(tool_calls: Any, message_index: int) -> list[dict[str, Any]]:
    field = f"messages[{message_index}].tool_calls"
    if not isinstance(tool_calls, list):
        raise RequestError(f"{field} must be a list", param=field)
    normalized = []
    for call_index, call in enumerate(tool_calls):
        call_field = f"{field}[{call_index}]"
        if not isinstance(call, Mapping):
            raise RequestError(f"{call_field} must be an object, got {type(call).__name__} (a ToolCall of a chat "
                               'reply goes back as {"id": call.id, "type": "function", "function": {"name": '
                               'call.name, "arguments": call.arguments}}, or dataclasses.asdict(call))',
                               param=call_field)
        kind = call.get("type")
        if kind is not None and kind != "function":  # a custom tool's call has `custom`, no `function`
            raise RequestError(f"{call_field}.type {kind!r} is not supported; only 'function' tool calls are, as only "
                               "'function' tools are", param=f"{call_field}.type")
        function = function_of(call)
        assert function is not None
        check_tool_name(function.get("name"), f"{call_field}.function.name")  # rendered as `to=NAME`
        arguments = _decoded_arguments(function.get("arguments"), f"{call_field}.function.arguments")
        _check_argument_names(arguments, f"{call_field}.function.arguments")
        if call.get("function") is function:
            call = {**call, "function": {**function, "arguments": arguments}}
        else:  # a bare call ({"id", "name", "arguments"}, as `dataclasses.asdict` of a ToolCall): OpenAI's shape,
            # the one chat templates read (`tool_call.function.name`)
            call = {**{key: value for key, value in call.items() if key not in ("name", "arguments")},
                    "type": "function", "function": {"name": function["name"], "arguments": arguments}}
        normalized.append(call)
    return normalized


def _check_argument_names(arguments: Mapping[str, Any], field: str) -> None:
    """RequestError naming `field` for an argument name holding `"`: the template writes each name into an ATEM tag,
    `<atem:parameter name="NAME">`, whose name ends at the first `"` (P-ATEM-1), so the model would read a broken tag
    and no such argument (the model cannot write one either). A name that is no string (a Python caller's `{1: ...}`)
    is refused too."""
    for name in arguments:
        if not isinstance(name, str):  # a Python caller's dict: JSON objects have string keys only
            raise RequestError(f"{field}: the argument name {name!r} is a {type(name).__name__}, not a string; name "
                               "each argument with a string (JSON object keys are strings)", param=field)
        if '"' in name:
            raise RequestError(f"{field}: the argument name {name!r} holds '\"', which ends a parameter name in the "
                               "chat format (the model would read no such argument); rename it", param=field)


def _decoded_arguments(arguments: Any, field: str) -> dict[str, Any]:
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        _check_arguments_value(arguments, field)
        return dict(arguments)
    if not isinstance(arguments, str):
        raise RequestError(f"{field} must be a JSON object or a string holding one, got "
                           f"{type(arguments).__name__}", param=field)
    if not arguments.strip():
        return {}
    try:
        decoded = strict_json_loads(arguments)  # NaN, Infinity or 1e400 would render as nan / inf
    except LoneSurrogateError:
        raise lone_surrogate_error(field) from None
    except (ValueError, RecursionError) as error:
        raise RequestError(f"{field} is not valid JSON: {error}", param=field) from None
    if not isinstance(decoded, dict):
        raise RequestError(f"{field} must encode a JSON object, got {type(decoded).__name__}", param=field)
    _check_arguments_value(decoded, field)  # first: the depth it bounds bounds the search for a repeated key
    repeated = first_duplicate_key(arguments)
    if repeated is not None:  # the template would render the last value, another reader the first
        raise RequestError(f"{field}: the key {repeated!r} is given more than once in the same JSON object; send each "
                           "key once (JSON leaves which value counts undefined)", param=field)
    return decoded


def _check_arguments_value(arguments: Mapping[str, Any], field: str) -> None:
    """Raises RequestError for arguments nested deeper than MAX_ARGUMENTS_DEPTH, holding a lone surrogate (JSON's
    `\\ud800` escape decodes to one, and no tokenizer can encode it) or a value that is no JSON value (a
    `datetime.date` given in Python, which would render as `<date>`; NaN or an infinity, which a request body's
    `NaN`, `Infinity` or `1e400` decodes to, and which would render as `nan` / `inf`)."""
    pending: list[tuple[Any, int]] = [(arguments, 1)]
    while pending:  # iterative: the point is not to recurse on hostile depth
        value, depth = pending.pop()
        if isinstance(value, str):
            if not value.isascii() and not _is_encodable(value):
                raise lone_surrogate_error(field)
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise RequestError(f"{field} holds the number {value!r}, which is no JSON value (the prompt would show "
                               f"{value!r}, as the JSON-string form of the same arguments is refused); send a finite "
                               "number, or the text as a string", param=field)
        if value is None or isinstance(value, int | float):
            continue
        if not isinstance(value, Mapping | list | tuple):  # rendered as its `<TypeName>` placeholder otherwise
            raise RequestError(f"{field} holds a {type(value).__name__} ({str(value)[:40]!r}), which is no JSON value "
                               "and cannot be rendered; pass strings, numbers, booleans, null, lists and objects",
                               param=field)
        if depth > MAX_ARGUMENTS_DEPTH:
            raise RequestError(f"{field} nests objects and arrays more than {MAX_ARGUMENTS_DEPTH} levels deep",
                               param=field)
        items = list(value.items()) if isinstance(value, Mapping) else [(None, item) for item in value]
        for key, item in items:
            pending.append((item, depth + 1))
            if key is not None:
                pending.append((key, depth + 1))


def lone_surrogate_error(field: str | None, what: str = "") -> RequestError:
    """The 400 for `field` (or the body, for None) holding a lone surrogate; `what` comes before its name."""
    return RequestError(f"{what}{field or 'the request body'} holds a lone UTF-16 surrogate (an unpaired "
                        "\\uD800-\\uDFFF escape), which is no Unicode character; send valid Unicode text",
                        param=field)


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})  # a flat (bare) declaration's


def normalize_tools(tools: Any, *, check_schema: SchemaCheck | None = None) -> list[dict[str, Any]]:
    """The request's tools as complete OpenAI-style objects (P-TMPL-6), validated by P-REQ-8.

    Accepts `{"type": "function", "function": {...}}` and bare function objects. A missing description
    becomes `""`, missing parameters an empty object schema; declared parameters must describe an object (a call's
    arguments are one), as OpenAI requires: a schema whose types leave out `object` (`{"type": "string"}`) is refused,
    one that names no type (`{}`, properties alone) is read as an object schema. Names must be unique, 1..RECIPIENT_MAX
    characters, without whitespace, `<` or `"` (they are written into headers and ATEM tags); anything else
    raises RequestError whose param is the offending field (`tools[0].function.name`). None gives `[]`.

    check_schema(parameters, field, strict): called with each declared `parameters` schema, its field
    (`tools[0].function.parameters`) and whether the tool is strict; raises RequestError for a schema that is not
    valid JSON schema (for a strict tool, also one using keywords the caller cannot enforce). This layer
    has no JSON-schema compiler (the grammar engine's is the engine's), and value typing reads an invalid schema
    as "any value", so a serving API passes one: a bad schema is a bad request whatever `tool_choice` is.
    """
    if tools is None:
        return []
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise RequestError("tools must be a list of tool objects", param="tools")
    normalized = []
    seen_names: set[str] = set()
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise RequestError(f"tools[{index}] must be an object", param=f"tools[{index}]")
        if tool.get("type", "function") != "function":
            raise RequestError(f"tools[{index}].type {tool.get('type')!r} is not supported; only 'function' "
                               "tools are", param=f"tools[{index}].type")
        function = function_of(tool)
        if function is None or ("function" in tool and not isinstance(tool["function"], Mapping)):
            raise RequestError(f"tools[{index}].function must be an object", param=f"tools[{index}].function")
        if "function" not in tool and not _FUNCTION_FIELDS & tool.keys():  # `{"type": "function"}`, `funtion`: {...}
            raise RequestError(f'tools[{index}] declares no function: give the function\'s "name" (and its '
                               '"description" and "parameters") in a "function" object, {"type": "function", '
                               '"function": {"name": NAME, ...}}, or flat beside "type"', param=f"tools[{index}]")
        # a nested declaration's fields sit under .function, a flat (Responses) one's on the tool itself
        where = f"tools[{index}].function" if "function" in tool else f"tools[{index}]"
        name = function.get("name")
        _check_tool_name(name, where, seen_names)
        seen_names.add(name)
        description = function.get("description")
        if description is None:
            description = ""
        elif not isinstance(description, str):
            raise RequestError(f"{where}.description must be a string", param=f"{where}.description")
        if function.get("strict") is not None and not isinstance(function["strict"], bool):
            raise RequestError(f"{where}.strict must be a boolean", param=f"{where}.strict")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = dict(EMPTY_PARAMETERS_SCHEMA)
        else:
            _check_parameters(parameters, f"{where}.parameters", function.get("strict") is True, check_schema)
        complete = {**function, "name": name, "description": description, "parameters": dict(parameters)}
        normalized.append({"type": "function", "function": complete})
    return normalized


def _check_parameters(parameters: Any, field: str, strict: bool, check_schema: SchemaCheck | None) -> None:
    """A tool's declared `parameters`: a JSON schema that admits an object, since a call's arguments are an object
    of named parameters; under any other (`{"type": "string"}`) every call, a forced one's `{}` included, would be
    invalid. Then `check_schema`'s verdict. Raises RequestError naming `field`."""
    if not isinstance(parameters, Mapping):
        raise RequestError(f"{field} must be a JSON schema object", param=field)
    types = allowed_types(parameters, parameters)  # through a root `$ref`, `anyOf`/`oneOf` and `allOf`
    if types and "object" not in types:
        raise RequestError(f'{field} must be a JSON schema of type "object" (a call\'s arguments are an object of '
                           f"named parameters), or be omitted or {{}} for a function without parameters; this one "
                           f"admits {', '.join(sorted(types))}", param=field)
    properties, required = object_shape(parameters)
    _refuse_unwritable_parameter_names(properties, required, field)
    if check_schema is not None:
        check_schema(parameters, field, strict)
    if strict:
        reason = _root_keyword_a_call_cannot_hold(parameters, properties, required)
        if reason:
            raise RequestError(f"{field}: {reason}", param=field)


def _refuse_unwritable_parameter_names(properties: Mapping[str, Any], required: set[str], field: str) -> None:
    """RequestError naming the parameter for a declared parameter name holding `"`: a call writes each parameter's
    name into an ATEM tag, `<atem:parameter name="NAME">`, whose name ends at the first `"` (P-ATEM-1), so no call
    can pass it, and the model's attempt reads as another name (its value was lost). Such a name is refused in a
    call of the history too (`_check_argument_names`); nested object keys are JSON inside a value and may hold one.
    `properties`, `required`: the parameters object's (`object_shape`)."""
    for name in [*properties, *sorted(required - set(properties))]:
        if '"' in name:
            raise RequestError(f"{field}: the parameter name {name!r} holds '\"', which ends a parameter name in the "
                               "chat format (no call could pass it); rename it", param=f"{field}.properties.{name}")


def _root_keyword_a_call_cannot_hold(parameters: Mapping[str, Any], properties: Mapping[str, Any],
                                     required: set[str]) -> str | None:
    """A keyword of a strict tool's parameters object itself (`root_schemas`) that its calls are not held to: a call
    writes each declared property as an ATEM parameter of its own (P-ATEM-1), as the turn grammar allows them, so an
    `anyOf` or `oneOf` of object shapes, a `minProperties` beyond `required` or a `maxProperties` below the declared
    properties would be ignored (a call with none of an `anyOf`'s required keys was taken). `properties`, `required`:
    the parameters object's (`object_shape`), whose names are all writable (`_refuse_unwritable_parameter_names` ran
    first)."""
    for schema in root_schemas(parameters):
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                return (f"{keyword} at the root of a strict tool's parameters cannot be enforced (a call writes each "
                        "declared property as a parameter of its own); declare the properties and required keys of "
                        "one object, or make the tool non-strict, where it is a hint")
        minimum, maximum = schema.get("minProperties"), schema.get("maxProperties")
        if is_json_number(minimum) and minimum > len(required):
            return (f"minProperties {minimum} at the root of a strict tool's parameters cannot be enforced beyond the "
                    f"{len(required)} keys in required; list the keys in required, or leave minProperties out")
        if is_json_number(maximum) and maximum < len(properties):
            return (f"maxProperties {maximum} at the root of a strict tool's parameters cannot be enforced below the "
                    f"{len(properties)} properties it declares; declare at most {maximum}, or leave maxProperties out")
    return None


def _check_tool_name(name: Any, where: str, seen_names: set[str]) -> None:
    """P-REQ-8 for a declared tool (`where`: the declaration holding it): `check_tool_name`, and unique."""
    field = f"{where}.name"
    check_tool_name(name, field)
    if name in seen_names:
        raise RequestError(f"{field} {name!r} is declared twice; names must be unique", param=field)


def check_tool_name(name: Any, field: str) -> None:
    """P-REQ-8: 1..RECIPIENT_MAX characters, no whitespace, `<` or `"`; and not `self` or `user`, which header
    recipients read as the reasoning and answer channels (P-HDR-2). A name is written into headers (`to=NAME`, `tool
    NAME`) and ATEM attributes (`name="NAME"`), in a declaration or in the history alike: any other would render as
    another channel's message or an ill-formed header. Raises RequestError naming `field`."""
    if not isinstance(name, str) or not name:
        raise RequestError(f"{field} must be a non-empty string", param=field)
    if len(name) > RECIPIENT_MAX:
        raise RequestError(f"{field} {name[:RECIPIENT_MAX]!r}… is {len(name)} characters; the limit is "
                           f"{RECIPIENT_MAX}", param=field)
    if any(character.isspace() or character in '<"' for character in name):
        raise RequestError(f"{field} {name!r} may not contain whitespace, '<' or '\"'", param=field)
    if channel_of_recipient(name) != "tool":
        raise RequestError(f"{field} {name!r} is a channel's recipient (`to={name}` addresses the reasoning or "
                           "the answer, never a tool); rename the tool", param=field)
