"""From a chat request to prompt token ids, along the one path protocol.md describes.

normalize messages and tools (P-TMPL-6, P-REQ-8) → decide what `tool_choice` means for this request
(P-REQ-3..5) and compile the turn's grammar (tool_choice, structured outputs, thinking budget) → load the
images and videos (data URLs; local files and http(s) only as the operator allows) → reasoning strength
(P-EFF-1) → render with the checkpoint's template (P-TMPL-1..3), control-token text in the request kept apart
from the template's markup (unless the operator allows it) → expand media placeholders and tokenize without
adding special tokens, the request's control-token text as plain text, and check the single bos (P-TMPL-5).

Rendering is `LLM.chat`'s (`engine.chat_rendering`), vLLM's `add_generation_prompt` and `continue_final_message`
included, with the same rules and refusals: the prompt ends with the generation prompt by default, after the final
message with `add_generation_prompt: false`, inside the final (assistant) message with `continue_final_message`, and
then the reply is parsed as that message's continuation (P-TMPL-8, `ChatPrompt.continue_recipient`). A request's
own `chat_template` replaces the checkpoint's only where the operator trusts requests with one (`chat_template`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import Future, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from anyio import CapacityLimiter

from glimmer.cancellation import CANCEL_CHECK_S, CancelToken
from glimmer.engine.apply_chat_template import generation_prompt
from glimmer.engine.chat_rendering import (
    RENDERING_ARGUMENT_NAMES,
    STRENGTH_KWARGS,
    ChatRendering,
    check_continued_call_is_read,
    check_final_message_is_the_assistants,
    check_media_before_the_cut,
    checked_template_argument,
    refuse_turn_grammar,
    render_conversation,
)
from glimmer.engine.grammar import ControllerFactory, chat_answer_grammar, check_tool_parameters
from glimmer.engine.prompt_parts import MessageGroup, prompt_text_parts, removable_parts
from glimmer.engine.sampling_params import StructuredOutputsParams
from glimmer.engine.sequence import MultimodalItem
from glimmer.errors import PromptPart, PromptTextTooLongError, RequestError
from glimmer.multimodal.sources import (
    is_remote_reference,
    load_media_reference,
    media_from_part,
    media_part_paths,
    media_parts,
    naming_media_parts,
    url_scheme,
)
from glimmer.protocol import (
    ChatTemplate,
    normalize_tools,
    resolve_reasoning_strength,
    strength_for_effort,
)
from glimmer.protocol.request_normalization import prefix_message_index
from glimmer.protocol.tool_choice import ToolPlan, plan_tools
from glimmer.server.context import ServingContext
from glimmer.server.schemas import ChatCompletionRequest, NamedToolChoice
from glimmer.server.structured_outputs import requested_structured_outputs


@dataclass
class ChatPrompt:
    token_ids: list[int]
    tools: ToolPlan
    controller_factory: ControllerFactory | None
    multimodal: list[MultimodalItem]
    constrained_answer: bool = False  # structured outputs: the answer's text is the grammar's, taken as written
    continue_recipient: str | None = None  # continue_final_message: the channel the prompt ends inside (P-TMPL-8)
    continue_prefix: str = ""  # and that message's body in the prompt, which a tool channel's parse starts from
    rendering: ChatRendering | None = None  # how it was rendered, to measure its parts (`prompt_parts`)
    # with ResponsesTurn.keep_media_read, the bytes each image part named by a path or URL (not a data: URL) was
    # read as, by where the part is, (i, j) of `messages[i].content[j]`: what a stored response keeps of it, the
    # file or URL being free to change
    media_read: dict[tuple[int, int], bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class ResponsesTurn:
    """What a /v1/responses request adds to the chat request it is built and run as (None for a chat completion).

    `continued`: the messages of the responses its previous_response_id continues, which a refusal of a prompt too
    long measures apart (`prompt_parts`); `keep_media_read`: the prompt keeps the bytes its images were read as
    (`ChatPrompt.media_read`), for the response to be stored; `response_id`: the id of the response its run makes,
    which names the engine's request (`chat.start_chat_run`), None where it makes none (input_tokens counts it)."""

    continued: Mapping[str, MessageGroup]
    keep_media_read: bool = False
    response_id: str | None = None


def build_chat_prompt(request: ChatCompletionRequest, context: ServingContext,
                      cancel: CancelToken | None = None, turn: ResponsesTurn | None = None) -> ChatPrompt:
    """Raises RequestError (400 naming the field), ChatTemplateError (400 with the template's message), or
    Cancelled once `cancel` is cancelled (checked between media items and frames). `turn`: what a /v1/responses
    request adds (`ResponsesTurn`)."""
    prefix = prefix_message_index(request.messages)  # RequestError naming a misplaced prefix
    with _naming_the_prefix(request, prefix):
        return _built_chat_prompt(request, context, cancel, prefix, turn)


def _built_chat_prompt(request: ChatCompletionRequest, context: ServingContext, cancel: CancelToken | None,
                       prefix: int | None, turn: ResponsesTurn | None) -> ChatPrompt:
    settings = context.settings
    _refuse_rendering_fields_in_kwargs(request.chat_template_kwargs or {})  # the defaults' were checked at start
    # the server's defaults under the request's own (vLLM's --default-chat-template-kwargs)
    template_kwargs = {**settings.default_chat_template_kwargs, **(request.chat_template_kwargs or {})}
    continue_final_message = _continues_final_message(request, prefix)
    ends_with_generation_prompt = generation_prompt(request.add_generation_prompt, continue_final_message)
    if continue_final_message:
        check_final_message_is_the_assistants(request.messages)
    choice = request.tool_choice
    tools = plan_tools(normalize_tools(request.tools, check_schema=check_tool_parameters),
                       choice.model_dump() if isinstance(choice, NamedToolChoice) else choice)
    effort = request.reasoning_effort
    if request.reasoning is not None and request.reasoning.effort is not None:
        if effort is not None and effort.lower() != request.reasoning.effort.lower():  # P-EFF-2: any case
            raise RequestError(f"reasoning.effort: {request.reasoning.effort!r} contradicts reasoning_effort "
                               f"{effort!r}; send one of them", param="reasoning.effort")
        effort = request.reasoning.effort
        strength_for_effort(effort, "reasoning.effort")  # refused naming the field the client sent
    strength = resolve_reasoning_strength(
        reasoning_strength=request.reasoning_strength,
        reasoning_effort=effort,
        chat_template_kwargs=template_kwargs,
        enable_thinking=request.enable_thinking,
        default=settings.default_reasoning_strength,
    )
    for knob in STRENGTH_KWARGS:
        template_kwargs.pop(knob, None)
    rendering = ChatRendering(chat_template(request, context), tools.render_tools, strength, template_kwargs,
                              settings.allow_control_tokens_in_content, ends_with_generation_prompt,
                              continue_final_message)
    structured, param = requested_structured_outputs(request)
    refuse_turn_grammar(rendering.prompt_end, tools, structured_param=param if structured is not None else None,
                        thinking_token_budget=request.thinking_token_budget)
    tokenizer = context.tokenizer
    _, rendered, final = render_conversation(request.messages, rendering, tokenizer)
    if final is not None:
        check_continued_call_is_read(final, rendering)
        check_media_before_the_cut(request.messages, final)
    engine = context.engine.engine
    truncated = request.truncate_prompt_tokens is not None  # its end is kept, of a text of any length
    try:  # before any media fetching, decoding or tokenizing
        engine.check_prompt_chars(rendered.text, truncated=truncated)
    except PromptTextTooLongError as error:
        parts = prompt_text_parts(request.messages, rendering, tokenizer, groups=_measured_apart(turn))
        raise error.naming(parts) from None
    with naming_media_parts(request.messages):  # an item's error names its content part
        images, videos, media_read = load_media(request.messages, context, cancel,
                                                keep_read=turn is not None and turn.keep_media_read)
        # as LLM.chat's: a bos only the post-processor names (prompt_start_token) is added there too
        token_ids, multimodal = engine.prepare_prompt(rendered.text, images, videos, literals=rendered.literals,
                                                      cancel=cancel, truncated=truncated)
    _check_single_bos(token_ids, tokenizer.prompt_bos_token_id, tokenizer.prompt_bos_token)
    return ChatPrompt(token_ids, tools, turn_controller_factory(request, tools, context, structured, param),
                      multimodal, constrained_answer=structured is not None,
                      continue_recipient=final.recipient if final is not None else None,
                      continue_prefix=final.body if final is not None else "", rendering=rendering,
                      media_read=media_read)


def _continues_final_message(request: ChatCompletionRequest, prefix: int | None) -> bool:
    """Whether the prompt ends inside the final message: `continue_final_message`, or an assistant prefix (DeepSeek's
    and Kimi's `"prefix": true` on the final message, at `prefix`, which vLLM continues so for the models whose API
    has it). RequestError naming `messages[i].prefix` for a prefix beside `add_generation_prompt: true`, which ends
    the prompt after it instead."""
    if prefix is not None and request.add_generation_prompt:
        raise RequestError(f"messages[{prefix}].prefix: the reply continues a prefix message, and "
                           "add_generation_prompt true starts a new turn after it instead; leave add_generation_prompt "
                           "out or false", param=f"messages[{prefix}].prefix")
    return request.continue_final_message or prefix is not None


@contextmanager
def _naming_the_prefix(request: ChatCompletionRequest, prefix: int | None) -> Iterator[None]:
    """Errors of continuing the final message name its `prefix` where that (not `continue_final_message`) asked for
    it, as the client sent: "nothing to continue", tool calls in it, a tool continued with no tools declared, a turn
    grammar (forced tool call, structured output) that cannot start inside a message."""
    if request.continue_final_message:
        prefix = None
    try:
        yield
    except RequestError as error:
        if prefix is None or error.param != "continue_final_message":
            raise
        field = f"messages[{prefix}].prefix"
        message = str(error).removeprefix("continue_final_message: ")
        raise error.with_message(f"{field} (the reply continues this message): {message}", field) from None


def _measured_apart(turn: ResponsesTurn | None) -> Mapping[str, MessageGroup] | None:
    """The messages a refusal of a prompt too long measures apart, by name (`removable_parts`' groups)."""
    return turn.continued if turn is not None else None


def prompt_parts(messages: list[dict[str, Any]], prompt: ChatPrompt, context: ServingContext,
                 turn: ResponsesTurn | None = None) -> list[PromptPart]:
    """The tokens each part of a chat request made of its prompt, to say which made it too long: `tools`,
    `chat_template_kwargs`, each system message (`messages[i]`; more than four together, `system messages`) and the
    messages a /v1/responses turn continues (`ResponsesTurn.continued`, under `previous_response_id`; their images
    and videos with them) the tokens the prompt loses rendered without it, other images and videos their whole
    expansions (placeholder tokens, start and end markers, a video's timestamps and separators), and `messages` the
    rest (the template's own markup included). A part the template cannot render without is left out (counted in
    `messages`). Renders and tokenizes the conversation once more for each part: for a refused prompt only."""
    tokenizer = context.tokenizer
    groups = _measured_apart(turn)
    measured = removable_parts(messages, prompt.rendering, tokenizer,
                               lambda rendered: len(tokenizer.encode(rendered.text, literals=rendered.literals)),
                               groups=groups)
    if measured is None:
        return []
    _, parts = measured
    media_tokens = {"image": 0, "video": 0}
    group_of = {f"messages[{i}]": name for name, group in (groups or {}).items() for i in group.indices}
    group_media = dict.fromkeys(groups or {}, 0)  # a group's images and videos count in its part
    paths = {kind: iter(kind_paths) for kind, kind_paths in media_part_paths(messages).items()}
    for item in prompt.multimodal:  # by kind: attach_media made all images, then all videos
        message = next(paths[item.kind]).partition(".")[0]  # `messages[i]` of `messages[i].content[j]`
        group = group_of.get(message)
        if group is not None:  # its rendered text counted the item's placeholder: the rest of its span
            group_media[group] += item.span[1] - item.span[0] - 1
        else:
            media_tokens[item.kind] += item.span[1] - item.span[0]
    parts = [replace(part, size=part.size + group_media[part.name]) if part.name in group_media else part
             for part in parts]
    parts += [PromptPart("images", media_tokens["image"], "messages"),
              PromptPart("videos", media_tokens["video"], "messages")]
    parts.append(PromptPart("messages", len(prompt.token_ids) - sum(max(part.size, 0) for part in parts), "messages"))
    return parts


def chat_template(request: ChatCompletionRequest, context: ServingContext) -> ChatTemplate:
    """The template the request renders with: the server's, or the request's own `chat_template` where the operator
    trusts requests with one (`--trust-request-chat-template`, as vLLM's). That one runs in the sandbox every
    template runs in (P-TMPL-2), and must pass the check the server's passed at start: its prompt ends with the
    generation prompt the parser reads (P-TMPL-8) and holds one bos (P-TMPL-5).

    Raises RequestError naming `chat_template`: the server does not trust requests with one, or it fails to compile,
    to render the check's probe conversation, or the check."""
    if request.chat_template is None:
        return context.template
    if not context.settings.trust_request_chat_template:
        raise RequestError("chat_template: this server does not render chat templates sent in requests (a template is "
                           "code the server runs); leave chat_template out to use the model's own, or start the "
                           "server with --trust-request-chat-template if its clients are trusted",
                           param="chat_template")
    return checked_template_argument(request.chat_template, context.tokenizer, context.engine.engine.max_prompt_chars,
                                     context.engine.engine.named_chat_templates)


def turn_controller_factory(request: ChatCompletionRequest, tools: ToolPlan, context: ServingContext,
                            structured: StructuredOutputsParams | None, param: str) -> ControllerFactory | None:
    """The turn's grammar (P-REQ-5, P-REQ-6), compiled; None when nothing constrains the turn. `structured`: the
    answer's constraint and the field it came from (`requested_structured_outputs`).

    Raises RequestError naming the field whose schema, regex or grammar the grammar engine refuses.
    """
    answer = chat_answer_grammar(structured, param) if structured is not None else None
    constraint = tools.turn_constraint(answer, parallel_calls=request.parallel_tool_calls is not False,
                                       thinking_token_budget=request.thinking_token_budget)
    if constraint is None:
        return None
    return context.grammars.turn(constraint, param or "tools")


def prompt_threads(messages: Any, context: ServingContext) -> CapacityLimiter | None:
    """The worker threads to build the prompt of a chat of `messages` on (`in_worker_thread`'s `threads`): where it
    fetches media over http(s), the running loop's pool kept for such prompts (`ServingContext.remote_media_threads`),
    so that slow image hosts hold none of the threads every other request's prompt is built on; else the default pool
    (None). A part with no reference is left for `load_media` to refuse."""
    if not context.settings.media_policy.allows_remote or not isinstance(messages, list):
        return None
    for media_part in media_parts(messages):
        try:
            media = media_from_part(media_part.part, media_part.path)
        except RequestError:
            continue
        if media is not None and is_remote_reference(media[1]):
            return context.remote_media_threads()
    return None


def _over_the_media_limit(param: str, kind: str, limit: int) -> str:
    """The refusal of the `kind` part at `param`, one past the `limit` of them a request: at 0 none is taken ("more
    than 0 images" read as a count the request could meet). The limit is glimmer serve's or run-batch's, which the
    routes do not know: each command's flags are named with it, as the media sources name theirs."""
    if limit == 0:
        return (f"{param}: {kind}s are disabled (glimmer serve --max-{kind}s-per-request 0 or --limit-mm-per-prompt "
                f"{kind}=0, run-batch --limit-mm-per-prompt {kind}=0); send the request without {kind}s")
    return (f"{param}: more than {limit} {kind}s in one request (the limit: glimmer serve --max-{kind}s-per-request "
            "or --limit-mm-per-prompt, run-batch --limit-mm-per-prompt)")


class MediaLimitError(RequestError):
    """More images (or videos) in one request than the server takes: `param` the first part over the limit,
    `counted` the parts of its `kind` taken before it."""

    def __init__(self, message: str, param: str, kind: str, counted: tuple[str, ...]):
        super().__init__(message, param=param)
        self.kind = kind
        self.counted = counted


def load_media(messages: list[Mapping[str, Any]], context: ServingContext, cancel: CancelToken | None = None, *,
               keep_read: bool = False) -> tuple[list[Any], list[Any], dict[tuple[int, int], bytes]]:
    """The images and videos of the messages (as the client sent them, so that an error names the client's part),
    in the order the template renders their placeholders, and with `keep_read` the bytes read for each image part
    naming a path or URL other than a data: URL, by where it is (`ChatPrompt.media_read`; otherwise none are kept: an
    image's file can be far larger than what the prompt holds of it).

    Raises RequestError naming the part: on a model without a vision tower, over the per-request limits,
    or when a reference cannot be loaded under the operator's media policy. Every part is checked before any is
    loaded, so a request refused for a later part (one over the limits, one without its URL) fetches nothing.
    """
    settings = context.settings
    references: list[tuple[Any, str, int]] = []  # load_media_reference's first arguments: the item's index by kind
    places: list[tuple[int, int]] = []  # where the part of each reference is (`MediaPart.at`)
    counted: dict[str, list[str]] = {"image": [], "video": []}  # the parts of each kind taken so far
    limits = {"image": settings.max_images_per_request, "video": settings.max_videos_per_request}
    for media_part in media_parts(messages):
        kind, part, at = media_part
        param = media_part.path
        if not context.model_has_vision:
            raise RequestError(f"{param}: this model has no vision tower, so it cannot take {kind} input"
                               f"{context.no_vision_fix}",
                               param=param)
        if kind == "video" and context.video_unsupported_reason:  # refused before the video is fetched and decoded
            raise RequestError(f"{param}: this model cannot take videos: {context.video_unsupported_reason}",
                               param=param)
        _, reference = media_from_part(part, param)
        if len(counted[kind]) == limits[kind]:
            raise MediaLimitError(_over_the_media_limit(param, kind, limits[kind]), param=param, kind=kind,
                                  counted=tuple(counted[kind]))
        references.append((reference, kind, len(counted[kind])))
        places.append(at)
        counted[kind].append(param)
    found: dict[str, list[Any]] = {"image": [], "video": []}
    read: dict[tuple[int, int], bytes] = {}
    for (reference, kind, _), at, item in zip(references, places, _loaded(references, context, cancel), strict=True):
        found[kind].append(item)
        if keep_read and kind == "image" and isinstance(reference, str) and url_scheme(reference) != "data":
            read[at] = item
    return found["image"], found["video"], read


def _loaded(references: list[tuple[Any, str, int]], context: ServingContext,
            cancel: CancelToken | None) -> Iterator[Any]:
    """The media of `references` (reference, kind, index among the request's items of its kind), in their order.
    Where two or more are http(s) URLs, they are downloaded beside each other on the server's fetch threads
    (`ServingContext.media_fetches`), so a request's slow images take about one's time, not one's time each; the
    others load here. The error raised is the first
    failing item's in this order, whichever failed first; the downloads after it are then stopped."""
    policy = context.settings.media_policy
    remote = [place for place, (reference, _, _) in enumerate(references) if is_remote_reference(reference)]
    rest = CancelToken() if cancel is None else cancel.child()  # cancelled when an item fails: the later ones stop
    fetches = {place: context.media_fetches.submit(load_media_reference, *references[place], policy, rest)
               for place in remote} if len(remote) > 1 else {}
    try:
        for place, item in enumerate(references):
            if cancel is not None:
                cancel.check()
            fetch = fetches.get(place)
            yield _downloaded(fetch, cancel) if fetch is not None else load_media_reference(*item, policy, rest)
    finally:
        rest.cancel()  # nothing is left to load where every item was: this stops the rest after a failure
        for fetch in fetches.values():
            fetch.cancel()


def _downloaded(fetch: Future, cancel: CancelToken | None) -> Any:
    """`fetch`'s result, or Cancelled once `cancel` is, though the download still waits in the queue of
    `ServingContext.media_fetches` behind other prompts' (it looks every CANCEL_CHECK_S)."""
    while cancel is not None and not wait([fetch], timeout=CANCEL_CHECK_S).done:
        cancel.check()
    return fetch.result()


def _refuse_rendering_fields_in_kwargs(chat_template_kwargs: Mapping[str, Any]) -> None:
    """RequestError for a request field given in `chat_template_kwargs`, where vLLM also reads it: the template
    never would, and a prompt rendered without it would be a silent wrong answer."""
    for name in RENDERING_ARGUMENT_NAMES:
        if name in chat_template_kwargs:
            raise RequestError(f"chat_template_kwargs may not set {name!r}: it is no template variable but a field "
                               f"of the /v1/chat/completions request; send {name!r} at the top level of the "
                               "request, beside messages", param="chat_template_kwargs")


def _check_single_bos(token_ids: list[int], bos_id: int | None, bos_token: str | None) -> None:
    # P-TMPL-5: a second bos silently changes the output. The template writes one (checked at startup), so a
    # second one came from the request's text.
    if bos_id is not None and token_ids.count(bos_id) != 1:
        raise RequestError(f"messages: the rendered prompt holds {token_ids.count(bos_id)} {bos_token!r} tokens; "
                           f"message text may not contain {bos_token!r}", param="messages")
