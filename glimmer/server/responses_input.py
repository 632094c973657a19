"""Responses API input items → chat messages, the shape the chat template renders.

- a string input is one user message; `instructions` become a system message first (developer messages in
  the input then join it, as on chat);
- message items keep their role; `input_text` / `output_text` parts become text (so do an assistant message's
  `refusal` parts, what the model said in refusing; elsewhere one is refused), `input_image` parts
  image_url parts; other parts (`input_file`, `input_audio`, …) are refused naming the part;
- a `reasoning` item (its `content` text, else its summary text, else the text its `encrypted_content` holds: what
  Glimmer returns there, with `include: ["reasoning.encrypted_content"]`, is the text encoded, not encrypted, for
  clients that replay only that when they store nothing), the assistant message and the
  `function_call` items that follow it make one assistant message: reasoning_content, content, tool_calls; but
  the template drops the content of a message with calls (§2.1), so an assistant message item followed by calls
  is a message of its own that did not end the turn (`end_turn: false`), as the model wrote it; so is one followed
  by another reasoning or assistant message item (the model's text to the user, then more reasoning, then its
  answer: one turn, its messages ending `<|eom|>` but the last); a reasoning item with no message or call after it
  in its turn (a turn max_output_tokens cut while the model reasoned) is its `to=self` message alone;
- a `function_call_output` item is a tool message answering its `call_id` (its `output` a string, or text and
  `input_image` parts; not missing, null or [], as chat refuses such a tool message), which must name a
  `function_call` item before it, in the input or in the responses it continues (OpenAI refuses an answer to no
  call, as does Glimmer; a result rendered before its call would be read as a result of nothing). The outputs
  answering one turn's calls render in the order of the calls, whatever their order in the input: the prompt
  matches a result to its call by position, OpenAI by call_id;
- every `function_call` item, in the input or in the responses it continues, needs a `function_call_output` after
  it (OpenAI: 400 "No tool output found for function call ..."): a call left unanswered would render as a turn
  whose result never came;
- nothing is sent twice: an item `id`, a `function_call`'s `call_id`, an output for one call, each once in the input
  and the responses it continues (OpenAI: 400 "Duplicate item found with id ..."); a call answered twice, or the
  previous response's items sent again beside `previous_response_id`, would render twice. Items sent again without
  their ids are caught too: a reasoning or assistant message item of the input saying what one of the continued
  responses says, while every item of the input before it says what the chain says (after a new item, the same
  words are new words);
- a string input must not be empty, and a message item needs its content (either would be an empty turn; an
  assistant message's, missing, null or [], an empty answer the model never wrote).
Anything else is refused with 400 naming `input[i]`: nothing is silently dropped.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from glimmer.engine.prompt_parts import MessageGroup
from glimmer.errors import ContextLengthError, RequestError
from glimmer.multimodal.errors import MediaContextLengthError
from glimmer.multimodal.sources import IMAGE_DETAILS, empty_url_error, file_id_error, image_detail_error
from glimmer.protocol.request_normalization import refusal_part_text, tool_results_in_call_order
from glimmer.server.chat_prompt import MediaLimitError
from glimmer.server.response_store import ImagePart
from glimmer.server.schemas import RESPONSES_NAMES_OF_CHAT_FIELDS

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input as a list of items (a string is one user message); RequestError for an empty string, which would
    render an empty user turn."""
    if value == "":
        raise RequestError("input: an empty string holds no message; send the user's text or a list of input items",
                           param="input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value)


@dataclass
class MessageSource:
    """Where one chat message came from in the Responses request: its item (or `instructions`), and the
    `function_call` items of its tool calls, in order."""

    path: str
    tool_calls: list[str] = field(default_factory=list)
    content: str = "content"  # the item's field that became the message's content (a function_call_output's output)
    images: int = 0  # the image parts of that content
    own_item: int | None = None  # the index of its item in the request's own input; None for one of the chain


_MESSAGE_PARAM = re.compile(r"messages\[(\d+)\](?:\.tool_calls\[(\d+)\](?:\.function)?)?")


def responses_error(error: RequestError, sources: list[MessageSource]) -> RequestError:
    """`error` (raised by the chat layer, naming chat fields such as `messages[2].content[0]`) naming the
    Responses request's own fields instead (`input[3].content[0]`, `reasoning.effort`), in its parts too where it
    says what made the prompt too long (`instructions`, `input`)."""
    if isinstance(error, ContextLengthError) and error.parts:
        error = error.naming([replace(part, name=_responses_field(part.name, sources) or part.name,
                                      param=_responses_field(part.param, sources) or part.param)
                              for part in error.parts])
    if isinstance(error, MediaLimitError):
        error = _counting_the_chain(error, sources)
    if isinstance(error, MediaContextLengthError):
        error = _images_of_the_chain(error, sources)
    param = error.param
    if param is None:
        return error
    renamed = _responses_field(param, sources)
    if renamed is None:
        return error
    # the field itself, not a longer name ending in it (chat_template_kwargs.reasoning_effort keeps its name)
    message = re.sub(rf"(?<![\w.]){re.escape(param)}(?!\w)", lambda _: renamed, str(error))
    return error.with_message(message, renamed)


def images_read(sources: list[MessageSource], media_read: dict[tuple[int, int], bytes]) -> dict[ImagePart, bytes]:
    """Where each image its client named by a path or URL is in the request's own input items (`MessageSource`'s
    `own_item`), with the bytes it was read as (`media_read`: by the chat part's place, `ChatPrompt.media_read`), what
    the responses continuing it render (`ResponseStore.put`'s `images_read`): the file or URL may hold another image
    by then (an agent's screenshot.png, overwritten each step), or none. OpenAI keeps an input image so."""
    return {(sources[i].own_item, sources[i].content, j): data for (i, j), data in media_read.items()
            if sources[i].own_item is not None}  # an image of the chain is its data already


def continued_messages(sources: list[MessageSource]) -> dict[str, MessageGroup]:
    """The chat messages (by index) of the responses previous_response_id continues, as a part a refusal of a prompt
    too long measures apart (`prompt_parts`' groups) with how to leave it: a short input after a long conversation
    was "shorten the input", which could not help."""
    return {_CHAIN: MessageGroup([i for i, source in enumerate(sources) if source.path == _CHAIN],
                                 fix="continue an earlier response, or send a shorter conversation as input without "
                                     "previous_response_id")}


def _counting_the_chain(error: MediaLimitError, sources: list[MessageSource]) -> RequestError:
    """`error` saying how many of the images (or videos) it counted came from the responses previous_response_id
    continues, where any did: the request's input may hold fewer than the limit."""
    chained = sum(1 for param in error.counted if (match := _MESSAGE_PARAM.match(param)) is not None
                  and int(match[1]) < len(sources) and sources[int(match[1])].path == _CHAIN)
    if not chained:
        return error
    return error.with_message(f"{error}; {chained} of the {error.kind}s counted are in the responses "
                              "previous_response_id continues, which the prompt holds too: send fewer, or start a "
                              f"new conversation without the {error.kind}s no longer needed", error.param)


def _images_of_the_chain(error: MediaContextLengthError, sources: list[MessageSource]) -> RequestError:
    """`error` (the images past the context) saying how many of them are in the responses previous_response_id
    continues, where any are, and how to leave that conversation: "send fewer images" could not help where the input
    holds fewer than they."""
    chained = sum(source.images for source in sources if source.path == _CHAIN)
    if not chained:
        return error
    return error.with_message(f"{error}; {chained} of its {sum(source.images for source in sources)} images are in the "
                              "responses previous_response_id continues, which the prompt holds too: "
                              f"{continued_messages(sources)[_CHAIN].fix}", error.param)


def _responses_field(param: str, sources: list[MessageSource]) -> str | None:
    """The Responses request's name of the chat field `param`; None where it is the same."""
    renamed = RESPONSES_NAMES_OF_CHAT_FIELDS.get(param)
    for chat_prefix in ("response_format.json_schema", "response_format"):  # text.format holds both levels
        if renamed is None and (param == chat_prefix or param.startswith(chat_prefix + ".")):
            renamed = "text.format" + param[len(chat_prefix):]
    match = _MESSAGE_PARAM.match(param)
    if renamed is None and match is not None and int(match[1]) < len(sources):
        source = sources[int(match[1])]
        call = int(match[2]) if match[2] is not None else None
        head = source.tool_calls[call] if call is not None and call < len(source.tool_calls) else source.path
        rest = param[match.end():]
        if call is None and re.match(r"\.content\b", rest):
            rest = f".{source.content}{rest[len('.content'):]}"
        renamed = head + rest
    return renamed


def chat_messages(items: list[dict[str, Any]], instructions: str | None,
                  sources: list[MessageSource] | None = None, continued: int = 0,
                  chain_as_sent: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Raises RequestError naming the item or part the model cannot take. `sources`, if given, receives where
    each message came from (for `responses_error`). The first `continued` items are those of the response
    named by `previous_response_id`, as the prompt renders them (`StoredResponse.rendered_items`: an image sent as a
    path or URL is the data it was read as); `chain_as_sent`, those items as their clients sent them, which an item
    sent again is compared with. The request's own `input[0]` follows them."""
    called: dict[str, str] = {}  # call_id → where, of the function_call items so far: an output answers an earlier call
    answered: dict[str, str] = {}  # call_id → where, of the function_call_output items
    item_ids: dict[str, str] = {}  # id → where, of the items that carry one
    echo = _ChainEcho()  # what the continued chain says, to catch it sent again without its ids
    turn_calls: set[str] = set()  # call_ids of the current assistant turn, which the outputs right after it answer
    turn_ended_at: str | None = None  # the message item after which no output of the turn's calls may come
    after_outputs = False  # the last item was a function_call_output: an assistant item starts a new turn
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    origins: list[MessageSource] = [MessageSource("instructions")] if instructions else []
    assistant: dict[str, Any] | None = None
    assistant_origin = MessageSource("input")

    def flush() -> None:
        """Append the assistant message being built. One holding reasoning alone (the turn went on with a call or
        another message, or ended there: max_output_tokens cut it while the model reasoned) is the message to `self`
        the model wrote (`to=self`, `<|eom|>`: §2.1 ends a non-user recipient's message so): as reasoning alone, the
        template would render an empty answer after it, a message the model never wrote, and joined to a next
        reasoning item one `to=self` message where the model wrote two. One whose reasoning is empty (its item sent
        back without text) is dropped: rendered, it would be an empty `to=self` message the model never wrote."""
        nonlocal assistant
        if assistant is not None and assistant["content"] is None and not assistant.get("tool_calls"):
            # reasoning alone; an empty one (a reasoning item sent back without its text) is nothing the model wrote
            reasoning = assistant["reasoning_content"]
            assistant = {"role": "assistant", "recipient": "self", "content": reasoning} if reasoning else None
        if assistant is not None:
            messages.append(assistant)
            origins.append(assistant_origin)
            assistant = None

    def flush_within_turn() -> None:
        """Flush the assistant message that another assistant item of its turn follows. Its text did not end the turn
        (`end_turn: false`, `<|eom|>`), as the model wrote it; the template ends one holding calls so itself."""
        if assistant is not None and assistant.get("content") and not assistant.get("tool_calls"):
            assistant["end_turn"] = False
        flush()

    def open_assistant(where: str) -> dict[str, Any]:
        nonlocal assistant_origin
        if assistant is None:
            assistant_origin = MessageSource(where)
            return {"role": "assistant", "content": None}
        return assistant

    for i, item in enumerate(items):
        own_item = i - continued if i >= continued else None
        where = _CHAIN if own_item is None else f"input[{own_item}]"
        kind = item.get("type", "message")
        _refuse_unknown_fields(item, kind, where)
        item_id = item.get("id")
        if item_id is not None and not isinstance(item_id, str):  # stored as sent, it was no `after` cursor to list by
            raise RequestError(f"{where}.id: must be a string (the id a response gave the item), not "
                               f"{type(item_id).__name__}; leave it out for a new item", param=f"{where}.id")
        _refuse_duplicate(item_ids, item_id, where, f"{where}.id", "item id", "each item is sent once")
        status = item.get("status")
        if status is not None and status not in _ITEM_STATUSES:  # stored as sent, input_items would list it so
            raise RequestError(f"{where}.status: {status!r} is not one of {', '.join(_ITEM_STATUSES)} (an output "
                               "item's status, sent back as it came); leave it out for a new item",
                               param=f"{where}.status")
        ends_turn = kind == "message" and item.get("role") != "assistant"
        if kind != "function_call_output" and (after_outputs or ends_turn):
            turn_calls, turn_ended_at = set(), where  # a new assistant turn, or a message that ends the turn
        after_outputs = kind == "function_call_output"
        if kind == "reasoning":
            flush_within_turn()  # each reasoning item is a message of its own, as the model wrote it
            assistant = open_assistant(where)
            text = _reasoning_text(item, where)
            echo.read("reasoning", text, where, refused=True)
            assistant["reasoning_content"] = text
        elif kind == "function_call":
            if assistant is not None and assistant.get("content") and not assistant.get("tool_calls"):
                flush_within_turn()  # the model's text before its calls: rendered, not dropped
            assistant = open_assistant(where)
            call = _tool_call(item, where)
            _refuse_duplicate(called, call["id"], where, f"{where}.call_id", "function_call call_id",
                              "each call has its own call_id, which its output answers")
            assistant.setdefault("tool_calls", []).append(call)
            turn_calls.add(call["id"])
            assistant_origin.tool_calls.append(where)
            echo.read_new(where)
        elif kind == "message" and item.get("role") == "assistant":
            if assistant is not None and (assistant.get("content") or assistant.get("tool_calls")):
                flush_within_turn()
            _check_phase(item, "assistant", where)
            assistant = open_assistant(where)
            assistant_origin.path = where  # after a reasoning item: the message item holds the content
            _check_content_given(item.get("content"), where)
            assistant["content"] = _text_of(item["content"], f"{where}.content", refusal=True)
            echo.read("assistant message", assistant["content"], where, refused=True)
        elif kind == "message":
            flush()
            role = item.get("role")
            if role is None:  # `{}`, or `{"type": "message"}` alone: Python's None would name no value the client sent
                raise RequestError(f"{where}.role: a message item needs its role, one of {', '.join(_MESSAGE_ROLES)}",
                                   param=f"{where}.role")
            if role not in _MESSAGE_ROLES:
                raise RequestError(f"{where}.role: {role!r} is not one of {', '.join(_MESSAGE_ROLES)}",
                                   param=f"{where}.role")
            _check_phase(item, role, where)
            content = _content(item.get("content"), where)
            messages.append({"role": role, "content": content})
            origins.append(MessageSource(where, images=_images_in(content), own_item=own_item))
            sent = chain_as_sent[i] if chain_as_sent is not None and i < continued else item
            echo.read_message(role, content if sent is item else _content(sent.get("content"), where), where)
        elif kind == "function_call_output":
            flush()
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RequestError(f"{where}.call_id: must name the function call answered", param=f"{where}.call_id")
            if call_id not in called:  # only then searched for: every output searching the rest was quadratic
                later = next((j for j in range(i + 1, len(items)) if items[j].get("type") == "function_call"
                              and items[j].get("call_id") == call_id), None)
                if later is not None:
                    raise RequestError(f"{where}.call_id: the function_call item with call_id {call_id!r} comes after "
                                       f"its output (at input[{later - continued}]); send the call's item before its "
                                       "output", param=f"{where}.call_id")
                raise RequestError(f"{where}.call_id: no function_call item with call_id {call_id!r} in the input "
                                   "or the responses it continues (previous_response_id); send the call's item "
                                   "before its output, or continue the response that made the call",
                                   param=f"{where}.call_id")
            _refuse_duplicate(answered, call_id, where, f"{where}.call_id", "function_call_output for call_id",
                              "each function_call has exactly one function_call_output")
            if call_id not in turn_calls:  # the prompt pairs a result with the calls of the turn right before it
                raise RequestError(f"{where}.call_id: the output of call {call_id!r} comes after the message "
                                   f"{_at(turn_ended_at or where)}, which ends the turn of its call; send each "
                                   "function_call_output right after the function_call items of its turn, before "
                                   "the next message", param=f"{where}.call_id")
            output = item.get("output")
            if output is None or output == []:  # chat refuses the tool message this would be (an empty result: "")
                raise RequestError(f"{where}.output: a function_call_output needs its output (a string or a "
                                   f"non-empty list of parts, got {'[]' if output == [] else 'null'}); send \"\" "
                                   "for a tool that returned nothing", param=f"{where}.output")
            has_image = isinstance(output, list) and any(isinstance(part, dict) and part.get("type") == "input_image"
                                                         for part in output)
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _parts(output, f"{where}.output") if has_image
                             else _text_of(output, f"{where}.output", "text and input_image parts")})
            origins.append(MessageSource(where, content="output", images=_images_in(messages[-1]["content"]),
                                         own_item=own_item))
            echo.read_new(where)
        else:
            raise RequestError(f"{where}.type: input items of type {kind!r} are not supported (message, reasoning, "
                               "function_call and function_call_output are)", param=f"{where}.type")
    flush()
    _refuse_unanswered_calls(called, answered)
    order = tool_results_in_call_order(messages)  # outputs answer calls by call_id, the prompt by position
    if sources is not None:
        sources[:] = [origins[i] for i in order]
    return [messages[i] for i in order]


_CHAIN = "previous_response_id"  # where the items of the responses a request continues are
_CHAIN_HINT = ("; the response named by previous_response_id holds it already: with previous_response_id, send only "
               "the new items (the outputs of its calls, the next message), not that response's items again")


def _at(where: str) -> str:
    return "in the responses previous_response_id continues" if where == _CHAIN else f"at {where}"


def _refuse_duplicate(seen: dict[str, str], key: Any, where: str, field: str, what: str, rule: str) -> None:
    """Records `key` (a string, or nothing to record) as seen at `where`; RequestError naming `field`, saying `rule`,
    when it was seen before: an item sent twice (an answer, a call, the previous response's items sent again beside
    previous_response_id) would render twice, and two answers to one call make the model read both. OpenAI refuses
    them too (400 "Duplicate item found with id ...", "Duplicate function_call_output for call_id ...")."""
    if not isinstance(key, str) or not key:
        return
    if key in seen:
        fix = _CHAIN_HINT if seen[key] == _CHAIN else "; remove the duplicate item"
        raise RequestError(f"{field}: duplicate {what} {key!r}, also {_at(seen[key])}: {rule}{fix}", param=field)
    seen[key] = where


@dataclass
class _ChainEcho:
    """What the items of the responses a request continues say, to catch them sent again without their ids beside
    previous_response_id (an SDK's copy of `response.output`, ids dropped, or the whole conversation again): they
    rendered twice, and the model read its last turn twice. Items with ids are caught by id (`_refuse_duplicate`),
    function calls by call_id; nothing marks a message or reasoning item as the same but its text. The input repeats
    the chain while each of its items says what an item of the chain says; once one says something new, the same
    words are new words (a model may answer "Hello there!" twice)."""

    said: set[tuple[str, str]] = field(default_factory=set)  # (kind, text) of the chain's messages and reasoning
    repeating: bool = True  # every item of the input so far says what the chain says

    def read(self, kind: str, text: str, where: str, *, refused: bool) -> None:
        """Records what an item of the chain says, or reads an item of the input at `where`; RequestError naming it
        when it is `refused` (a reasoning or assistant message item) and the input repeats the chain up to it."""
        if not text:
            return
        if where == _CHAIN:
            self.said.add((kind, text))
        elif (kind, text) not in self.said:
            self.repeating = False
        elif refused and self.repeating:
            article = "an" if kind[0] in "aeiou" else "a"
            raise RequestError(f"{where}: duplicate {kind} item: {article} {kind} of the responses "
                               f"previous_response_id continues says the same, so the prompt would hold it "
                               f"twice{_CHAIN_HINT}", param=where)

    def read_message(self, role: str, content: str | list[dict[str, Any]], where: str) -> None:
        """`read` for a user, system or developer message (never refused), by what it says (`_said`), which is worked
        out only where the chain says anything: a request continuing none hashes no images."""
        if where == _CHAIN or self.said:
            self.read(role, _said(content), where, refused=False)

    def read_new(self, where: str) -> None:
        """Reads an item of the input that the chain cannot hold (a call or an output its call_id makes new)."""
        if where != _CHAIN:
            self.repeating = False


def _images_in(content: str | list[dict[str, Any]]) -> int:
    """The image parts of a message's chat content."""
    return 0 if isinstance(content, str) else sum(part["type"] == "image_url" for part in content)


def _said(content: str | list[dict[str, Any]]) -> str:
    """What a message's chat content says, the same whatever form the client gave it: its text, which is how text
    parts render (joined, nothing between them); with images a digest of its parts, not their data URLs kept whole."""
    if isinstance(content, str):
        return content
    if all(part["type"] == "text" for part in content):
        return "".join(part["text"] for part in content)
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _refuse_unanswered_calls(called: dict[str, str], answered: dict[str, str]) -> None:
    """RequestError naming every call (by call_id and where it was made) with no function_call_output."""
    unanswered = [(call_id, where) for call_id, where in called.items() if call_id not in answered]
    if not unanswered:
        return
    listed = ", ".join(f"{call_id!r} ({'from previous_response_id' if where == 'previous_response_id' else where})"
                       for call_id, where in unanswered)
    raise RequestError(f"input: no tool output found for function call {listed}; add a function_call_output item "
                       "with each call's call_id and the tool's result to input", param="input")


_ITEM_STATUSES = ("in_progress", "completed", "incomplete")  # OpenAI's statuses of an item
# The fields of each input item kind (besides `type`); `id` and `status` are what output items carry back.
_ITEM_FIELDS = {
    "message": frozenset({"role", "content", "id", "status", "phase"}),
    "reasoning": frozenset({"summary", "content", "encrypted_content", "id", "status"}),
    "function_call": frozenset({"call_id", "name", "arguments", "id", "status"}),
    "function_call_output": frozenset({"call_id", "output", "id", "status"}),
}


_PHASES = ("commentary", "final_answer")


def _check_phase(item: dict[str, Any], role: str, where: str) -> None:
    """RequestError naming `where`.phase for a message item's `phase` other than OpenAI's two (or null), or one on a
    message of another role than the assistant's (OpenAI: "not used for user messages"). An assistant message's phase
    (commentary, inside its turn; final_answer, ending it), which clients resend on every assistant message as OpenAI
    asks, changes nothing in the prompt: the item's place in its turn already says which it is, and the prompt marks
    it so (`end_turn`)."""
    phase = item.get("phase")
    if phase is not None and role != "assistant":
        raise RequestError(f"{where}.phase: only an assistant message has a phase (commentary or final_answer), not a "
                           f"{role} message; leave it out", param=f"{where}.phase")
    if phase is not None and phase not in _PHASES:
        raise RequestError(f"{where}.phase: {phase!r} is not one of {', '.join(_PHASES)} (or null)",
                           param=f"{where}.phase")


def _refuse_unknown_fields(item: dict[str, Any], kind: Any, where: str) -> None:
    known = _ITEM_FIELDS.get(kind) if isinstance(kind, str) else None
    if known is None:
        return  # the item's type is refused next, naming it
    unknown = sorted(key for key, value in item.items() if key != "type" and key not in known and value is not None)
    if unknown:
        raise RequestError(f"{where}.{unknown[0]}: unknown field of a {kind} item; Glimmer refuses it rather than "
                           "drop it from the prompt", param=f"{where}.{unknown[0]}")


def _tool_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise RequestError(f"{where}: a function_call item needs string `name` and `call_id`", param=where)
    if not isinstance(arguments, str):  # missing, it would render a call with arguments the model never wrote
        got = "it has none" if arguments is None else f"got {type(arguments).__name__}"
        raise RequestError(f"{where}.arguments: a function_call item needs its arguments as a JSON string ({got}); "
                           'send "{}" for a call without arguments', param=f"{where}.arguments")
    if not call_id:  # no function_call_output can answer it (its empty call_id names no call)
        raise RequestError(f"{where}.call_id: must not be empty: it is the id the call's function_call_output "
                           "answers", param=f"{where}.call_id")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    for name in ("content", "summary"):
        if item.get(name) is not None and not isinstance(item[name], list):
            raise RequestError(f"{where}.{name}: must be a list of text parts", param=f"{where}.{name}")
    name = "content" if item.get("content") else "summary"
    parts = item.get(name) or []
    if not parts and item.get("encrypted_content"):
        return _unsealed_reasoning(item["encrypted_content"], f"{where}.encrypted_content")
    return "".join(_part_text(part, f"{where}.{name}[{j}]") for j, part in enumerate(parts))


_SEALED_REASONING_PREFIX = "glimmer-reasoning-v2:"  # base64url of a digest of the text, then the text
_SEALED_REASONING_DIGEST_BYTES = 6  # a whole number of base64 groups: the text's characters stay aligned
_UNCHECKED_REASONING_PREFIX = "glimmer-reasoning-v1:"  # base64url of the text alone: sealed before the digest, read
_ASCII_WHITESPACE = re.compile(r"[ \t\n\r\f\v]")  # a client's storage may wrap or end the value with some


def sealed_reasoning(text: str) -> str:
    """The `encrypted_content` of a reasoning item whose text is `text`: the text encoded, not encrypted (a client
    may read its own prompt), and marked, so that another server's encrypted reasoning is refused, not rendered; a
    digest of the text before it, so that one altered since is refused (`_unsealed_reasoning`)."""
    encoded = text.encode()
    return _SEALED_REASONING_PREFIX + base64.urlsafe_b64encode(_reasoning_digest(encoded) + encoded).decode()


def _reasoning_digest(encoded: bytes) -> bytes:
    return hashlib.sha256(encoded).digest()[:_SEALED_REASONING_DIGEST_BYTES]


def with_sealed_reasoning(item: dict[str, Any]) -> dict[str, Any]:
    """A stored reasoning item with its text in `encrypted_content` too (a copy), as `include:
    ["reasoning.encrypted_content"]` asks of the items `GET /v1/responses/{id}` and `input_items` return, where the
    response was made without it; any other item, or one that carries it already, as it is."""
    if item.get("type") != "reasoning" or item.get("encrypted_content"):
        return item
    return {**item, "encrypted_content": sealed_reasoning(_reasoning_text(item, "item"))}


def _unsealed_reasoning(value: Any, where: str) -> str:
    """The reasoning text of an `encrypted_content` `sealed_reasoning` made (ASCII whitespace around or inside it
    ignored), or of the earlier form without a digest; RequestError naming `where` for another, or for one altered
    since (a character outside base64's alphabet, or, in the current form, any the digest does not match)."""
    refused = RequestError(f"{where}: not the encrypted_content of a Glimmer response (another server's cannot be "
                           "read here); send the reasoning text in `content`", param=where)
    value = _ASCII_WHITESPACE.sub("", value) if isinstance(value, str) else ""
    has_digest = {_SEALED_REASONING_PREFIX: True, _UNCHECKED_REASONING_PREFIX: False}
    prefix = next((prefix for prefix in has_digest if value.startswith(prefix)), None)
    if prefix is None:
        raise refused
    try:
        # validate: a character outside the alphabet (a client's storage mangled it) is refused, not skipped, which
        # read the rest as other text
        decoded = base64.b64decode(value.removeprefix(prefix), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise refused from None
    if has_digest[prefix]:  # a cut or a changed character inside the alphabet: another digest
        digest, decoded = decoded[:_SEALED_REASONING_DIGEST_BYTES], decoded[_SEALED_REASONING_DIGEST_BYTES:]
        if digest != _reasoning_digest(decoded):
            raise refused
    try:
        return decoded.decode()
    except UnicodeDecodeError:
        raise refused from None


def _part_text(part: Any, where: str, accepted: str = "text parts", refusal: bool = False) -> str:
    """The text of a text part, or with `refusal` (an assistant message's content) of a `refusal` part, the text the
    model said to the user in refusing; RequestError for any other part, saying that `accepted` parts are taken
    there."""
    if isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("type") in (
            *_TEXT_PARTS, "reasoning_text", "summary_text"):
        return part["text"]
    if isinstance(part, dict) and part.get("type") == "refusal":
        return refusal_part_text(part, where, refusal, "send other text as an input_text part")
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    if kind in (*_TEXT_PARTS, "reasoning_text", "summary_text"):  # a text part without its text
        raise RequestError(f"{where}.text: a part of type {kind!r} needs a string `text`", param=f"{where}.text")
    raise RequestError(f"{where}: parts of type {kind!r} are not supported here ({accepted} are)", param=where)


def _text_of(content: Any, field: str, accepted: str = "text parts", refusal: bool = False) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(_part_text(part, f"{field}[{j}]", accepted, refusal) for j, part in enumerate(content))
    # `accepted` names the parts taken there: a function_call_output's output takes input_image parts too
    raise RequestError(f"{field}: must be a string or a list of {accepted}, not {type(content).__name__}",
                       param=field)


def _check_content_given(content: Any, where: str) -> None:
    """RequestError naming `where`.content when a message item, of any role, is without its content (missing, null
    or []): it would render an empty turn, for an assistant an answer the model never wrote. OpenAI refuses them."""
    if content is None or (isinstance(content, list) and not content):
        raise RequestError(f"{where}.content: a message item needs its content (a string or a non-empty list of "
                           "content parts)", param=f"{where}.content")


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A user / system / developer message's content in chat parts (images kept); RequestError when it is missing
    or [] (`_check_content_given`)."""
    _check_content_given(content, where)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}.content: must be a string or a list of content parts", param=f"{where}.content")
    return _parts(content, f"{where}.content")


def _parts(content: list[Any], field: str) -> list[dict[str, Any]]:
    """Text and input_image parts (of the list at `field`) as chat parts; RequestError naming any other part."""
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        param = f"{field}[{j}]"
        if isinstance(part, dict) and part.get("type") == "input_image":
            if part.get("file_id") is not None:  # beside an image_url, it was dropped without a word
                raise file_id_error(f"{param}.file_id", param=f"{param}.file_id")
            url = part.get("image_url")
            if not isinstance(url, str):
                raise RequestError(f"{param}: an input_image needs `image_url` as a string (a data: or https: URL); "
                                   "other forms are not supported", param=param)
            if not url.strip():  # as chat's empty url; its path here has no `.url`
                raise empty_url_error(f"{param}.image_url", param=f"{param}.image_url")
            detail = part.get("detail")
            if detail is not None and detail not in IMAGE_DETAILS:  # as chat refuses its image_url.detail
                raise image_detail_error(f"{param}.detail", detail, param=f"{param}.detail")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": _part_text(part, param, "text and input_image parts")})
    return parts
