"""The offline Python API, shaped like vLLM's: `LLM(model=...)`, `llm.generate(prompts, SamplingParams(...))`.

Generation of many prompts runs on the same continuous-batching engine as the server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import operator
import os
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlparse

from tqdm.auto import tqdm

from glimmer.engine.apply_chat_template import (
    REASONING_FIELDS,
    FinalMessageTag,
    OutputShape,
    checked_documents,
    generation_prompt,
    given_conversation,
    split_conversations,
    tool_schemas,
)
from glimmer.engine.chat_rendering import (
    ChatRendering,
    check_final_message_is_the_assistants,
    check_media_before_the_cut,
    checked_template_argument,
    refuse_turn_grammar,
    render_conversation,
)
from glimmer.engine.detokenizer import IncrementalDetokenizer
from glimmer.engine.grammar import ControllerFactory, chat_answer_grammar, check_json_schema
from glimmer.engine.llm_engine import EngineConfig, LLMEngine
from glimmer.engine.outputs import CompletionOutput, RequestOutput
from glimmer.engine.sampling_params import SamplingParams, StructuredOutputsParams
from glimmer.engine.sequence import MultimodalItem
from glimmer.engine.tokenizer import Tokenizer, without_hidden_tokens
from glimmer.errors import ConfigError, RequestError
from glimmer.multimodal.sources import MediaFetchPolicy, collect_media, load_media_reference, naming_media_parts
from glimmer.protocol import (
    ChatTemplate,
    ToolCall,
    compiled_template,
    normalize_tools,
    parse_output,
    resolve_reasoning_strength,
)
from glimmer.protocol.chat_template import RENDERING_ARGUMENTS
from glimmer.protocol.tool_choice import ToolPlan, plan_tools

PromptType = str | list[int] | dict[str, Any]
PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "multi_modal_data"})
GENERATION_CONFIG_MODES = ("auto", "vllm")
_Prepared = tuple[str | None, list[int], list[MultimodalItem]]
_STRENGTH_KWARGS = ("reasoning_strength", "reasoning_effort", "enable_thinking")  # resolved, not passed on
_RENDERING_ARGUMENTS = ("add_generation_prompt", *sorted(RENDERING_ARGUMENTS))
"""`LLM.chat`'s arguments that vLLM's `LLM.chat` also reads from `chat_template_kwargs`; no template variables."""
_NAMED_TOKENS_IN_TRANSFORMERS_ORDER = ("bos_token", "eos_token", "unk_token", "pad_token")
"""The named tokens a checkpoint can set, in the order of transformers' `SPECIAL_TOKENS_ATTRIBUTES` (whose sep, cls
and mask a Muse tokenizer has none of, and Glimmer does not read)."""
_CONTINUABLE_FIELDS = ("content", *REASONING_FIELDS)
"""What `LLM.chat(continue_final_message=...)` can continue: True or "content" the answer (or the message to the
final message's `recipient`), a reasoning field the reasoning."""


@dataclass
class ChatOutput:
    """One conversation's reply, parsed by the protocol: reasoning, answer and tool calls, plus the raw output.

    The fields are the first completion's; `choices` holds every completion (`n` of the SamplingParams) parsed
    the same way, each with its own one-completion `output`. `output` is the turn as generated, special tokens
    (its framing) included whatever `skip_special_tokens` says; that applies to the parsed fields (P-REQ-1)."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]
    output: RequestOutput
    choices: list[ChatOutput] = field(default_factory=list)
    stop_string: str | None = None  # the stop string that ended the answer (stop strings match the answer only)

    @property
    def finish_reason(self) -> str | None:
        """As the OpenAI API reports it: `stop` when a stop string ended the answer, else `length`, else
        `tool_calls` when calls were made, else `stop`."""
        if self.stop_string is not None:
            return "stop"
        if self.output.finish_reason == "length":
            return "length"
        return "tool_calls" if self.tool_calls else self.output.finish_reason


@dataclass
class _ChatTurn:
    """How `LLM.chat` generates and reads one conversation's turn under one SamplingParams."""

    params: SamplingParams  # what the engine runs: no stop strings, the grammar in `controller_factory`
    controller_factory: ControllerFactory | None
    constrained_answer: bool
    stop: list[str]
    include_stop: bool
    skip_special_tokens: bool | None  # the caller's: False shows every special token in the reply, else framing only


def _cut_at_stop(content: str | None, stop: list[str], include: bool, raw_text: str = "",
                 armed_after: int = -1) -> tuple[str | None, str | None]:
    """(the answer up to its first stop string, kept if `include`; that stop string), or (content, None).

    As on the server, with `min_tokens` a stop string counts only if it ends after character `armed_after` of the
    turn's `raw_text` (where the (min_tokens − 1)-th token's text ends); the answer is found in it by its text."""
    if not content or not stop:
        return content, None
    base = raw_text.rfind(content) if armed_after >= 0 else -1
    found = []
    for s in stop:
        at = content.find(s)
        while at >= 0 and base >= 0 and base + at + len(s) <= armed_after:
            at = content.find(s, at + 1)
        if at >= 0:
            found.append((at, s))
    if not found:
        return content, None
    at, matched = min(found, key=lambda item: item[0])
    return content[: at + len(matched) if include else at] or None, matched


def _armed_after(tokenizer: Tokenizer, token_ids: list[int], min_tokens: int, hidden: Mapping[int, str]) -> int:
    """Where the text of the (min_tokens − 1)-th generated token ends in the visible turn (-1: every stop string
    counts)."""
    if min_tokens < 2:
        return -1
    detokenizer = IncrementalDetokenizer(tokenizer, frozenset(hidden))
    return len(detokenizer.add_many(token_ids[: min_tokens - 1]))


class LLM:
    """Load a Muse Glimmer checkpoint and generate from it.

    model: a checkpoint directory or a Hugging Face Hub id. dtype: "float32" | "bfloat16" | "float16" or that
    torch.dtype ("float" and "half" as vLLM spells them); "auto" or None: bfloat16 on CUDA, float32 on CPU.
    device: "cpu" | "cuda" (default: cuda if available). seed (default 0): where the seeds of requests without
    their own come from, so a run repeats; None draws a fresh one each time (vLLM's seed=None).
    generation_config: "auto" (default) takes the sampling defaults of a call without SamplingParams from
    the checkpoint's generation_config.json (temperature, top_p, top_k), as the server does; "vllm" uses
    plain `SamplingParams()`.
    Other keyword arguments are `EngineConfig` fields (max_model_len, max_num_seqs,
    max_num_batched_tokens, kv_cache_memory, block_size, enable_prefix_caching, seed, chat_template).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        dtype: Any = None,
        device: str | None = None,
        allowed_local_media_path: list[str] | None = None,
        allow_remote_media: bool = False,
        generation_config: str = "auto",
        allowed_media_domains: list[str] | None = None,
        **engine_options: Any,
    ):
        if generation_config not in GENERATION_CONFIG_MODES:
            raise ConfigError(f"generation_config={generation_config!r} is not supported; use "
                              f"{' or '.join(map(repr, GENERATION_CONFIG_MODES))}")
        known = {f.name for f in dataclasses.fields(EngineConfig)} - {"model", "dtype", "device"}
        unknown = sorted(set(engine_options) - known)
        if unknown:
            raise TypeError(f"LLM() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; engine "
                            f"options are {', '.join(sorted(known))}")
        # a path as its text; anything else as given, for the config check to name (str(None) was a path 'None')
        model = os.fspath(model) if isinstance(model, os.PathLike) else model
        self.engine = LLMEngine(EngineConfig(model=model, dtype=dtype, device=device, **engine_options))
        self.media_policy = MediaFetchPolicy.create(allowed_local_media_path, allow_remote=allow_remote_media,
                                                    allowed_domains=allowed_media_domains)
        self.generation_config = generation_config
        self._ids = itertools.count()

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use without SamplingParams: the checkpoint's generation_config.json
        sampling fields under generation_config="auto", plain `SamplingParams()` under "vllm"."""
        if self.generation_config == "vllm":
            return SamplingParams()
        return SamplingParams(**self.engine.generation_defaults.sampling_defaults())

    def get_tokenizer(self) -> LLMTokenizer:
        """The tokenizer as vLLM's `get_tokenizer()` gives it, with Hugging Face's defaults: `encode(text)` adds
        BOS, so `generate({"prompt_token_ids": tok.encode(text)})` is `generate(text)`. Its `.tokenizer` is the
        engine's own `Tokenizer` (whose `encode` adds nothing unless asked)."""
        return LLMTokenizer(self)

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a text prompt; BOS is added unless the text already starts with it (P-TMPL-5)."""
        return self.engine.encode_prompt(text)

    def _prepare_dict_prompt(self, prompt: dict[str, Any], name: str) -> _Prepared:
        """A prompt dict's text, token ids and media; errors name it as `name` ("prompt" or "prompts[i]")."""
        unknown = sorted(map(str, set(prompt) - PROMPT_KEYS))
        if unknown:
            raise RequestError(f"{name}: unknown key(s) {unknown}; a prompt dict takes "
                               f"{', '.join(sorted(PROMPT_KEYS))}", param=name)
        if "prompt_token_ids" in prompt:
            if prompt.get("multi_modal_data"):
                raise RequestError("multi_modal_data needs a text prompt with placeholders, not token ids",
                                   param=f"{name}.multi_modal_data")
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, list | tuple) or not all(map(_is_token_id, ids)):
                raise RequestError(f"{name}.prompt_token_ids must be a list of token ids (integers)",
                                   param=f"{name}.prompt_token_ids")
            return prompt.get("prompt"), [operator.index(t) for t in ids], []
        text = prompt.get("prompt")
        if not isinstance(text, str):
            raise RequestError(f"{name} needs a 'prompt' string or 'prompt_token_ids'", param=name)
        data = prompt.get("multi_modal_data") or {}
        unknown = set(data) - {"image", "video"}
        if unknown:
            raise RequestError(f"multi_modal_data keys {sorted(unknown)} are not supported; use 'image' and 'video'",
                               param=f"{name}.multi_modal_data")
        images, videos = (self._decoded_data_urls(_as_list(data.get(kind)), kind) for kind in ("image", "video"))
        ids, items = self.engine.prepare_prompt(text, images, videos)
        return text, ids, items

    def _decoded_data_urls(self, items: list, kind: str) -> list:
        """multi_modal_data items with each data: URL decoded to its bytes, as `chat` reads it (RequestError if it is
        malformed); paths, bytes, images and frames are left for the engine to open."""
        return [load_media_reference(item, kind, index, self.media_policy)
                if isinstance(item, str) and urlparse(item).scheme.lower() == "data" else item
                for index, item in enumerate(items)]

    def _normalize_prompts(self, prompts: PromptType | SequenceABC[PromptType]) -> list[_Prepared]:
        single = _is_single_prompt(prompts)
        if single:
            prompts = [prompts]  # type: ignore[list-item]
        if not isinstance(prompts, SequenceABC) or isinstance(prompts, str):
            raise RequestError("prompts must be a string, a list of token ids, a prompt dict, or a list of them",
                               param="prompts")
        out: list[_Prepared] = []
        for i, prompt in enumerate(prompts):
            name = "prompt" if single else f"prompts[{i}]"
            with _naming_the_prompt(name):
                if isinstance(prompt, str):
                    out.append((prompt, self.encode_prompt(prompt), []))
                elif isinstance(prompt, list | tuple) and all(map(_is_token_id, prompt)):
                    out.append((None, [operator.index(t) for t in prompt], []))
                elif isinstance(prompt, dict):
                    out.append(self._prepare_dict_prompt(prompt, name))
                else:
                    raise RequestError(f"{name} is not a string, a list of token ids (integers) or a prompt dict",
                                       param=name)
        return out

    def generate(
        self,
        prompts: PromptType | SequenceABC[PromptType],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate completions for every prompt, batched continuously; outputs keep the prompts' order."""
        normalized = self._normalize_prompts(prompts)
        if sampling_params is None:
            params_list = [self.get_default_sampling_params()] * len(normalized)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(normalized)
        else:
            if not isinstance(sampling_params, SequenceABC) or isinstance(sampling_params, str):
                raise RequestError("sampling_params must be a SamplingParams or a list of them (one per prompt), "
                                   f"not {type(sampling_params).__name__}", param="sampling_params")
            params_list = list(sampling_params)
            if len(params_list) != len(normalized):
                raise RequestError(
                    f"got {len(params_list)} SamplingParams for {len(normalized)} prompts", param="sampling_params"
                )
            _check_sampling_params(params_list)
        return self._run(normalized, params_list, use_tqdm,
                         prompt_field="prompt" if _is_single_prompt(prompts) else "prompts")

    def _run(self, prompts: list[_Prepared], params_list: list[SamplingParams], use_tqdm: bool,
             controller_factories: list[ControllerFactory | None] | None = None,
             prompt_field: str = "messages") -> list[RequestOutput]:
        """Generate every prompt. As vLLM's offline LLM, a max_tokens past max_model_len ends the output there
        (finish_reason "length"); only a prompt with no room for one token is refused. Errors about a prompt
        name it as `prompt_field[i]` (as `prompt_field` alone for one "prompt" or one conversation)."""
        results: dict[str, RequestOutput] = {}
        order = []
        factories = controller_factories or [None] * len(prompts)
        try:  # a request refused (or an interrupt) after others were queued aborts those too
            for i, ((text, ids, items), params, factory) in enumerate(
                    zip(prompts, params_list, factories, strict=True)):
                request_id = f"llm-{next(self._ids)}"
                with _naming_the_prompt(prompt_field if prompt_field == "prompt" or len(prompts) == 1 and
                                        prompt_field == "messages" else f"{prompt_field}[{i}]"):
                    self.engine.add_request(request_id, ids, params, items, factory, clamp_max_tokens=True)
                order.append(request_id)
                results[request_id] = RequestOutput(
                    request_id=request_id,
                    prompt=text,
                    prompt_token_ids=ids,
                    outputs=[CompletionOutput(index=i, text="", token_ids=[], finish_reason=None,
                                              logprobs=[] if params.logprobs is not None else None)
                             for i in range(params.n)],
                )
            with tqdm(total=len(order), desc="Generating", disable=not use_tqdm) as bar:
                while self.engine.has_unfinished_requests:
                    for delta in self.engine.step():
                        request = results[delta.request_id]
                        out = request.outputs[delta.index]
                        out.token_ids.extend(delta.token_ids)
                        out.text += delta.text
                        if out.logprobs is not None:
                            out.logprobs.extend(delta.logprobs)
                        request.num_cached_tokens = delta.num_cached_tokens
                        if delta.prompt_logprobs is not None and delta.index == 0:
                            request.prompt_logprobs = delta.prompt_logprobs
                        if delta.finish_reason is not None:
                            out.finish_reason = delta.finish_reason
                            out.stop_reason = delta.stop_reason
                            if request.finished:
                                bar.update(1)
        except BaseException:
            for request_id in order:
                self.engine.abort(request_id)
            raise
        return [results[r] for r in order]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        response_format: dict[str, Any] | None = None,
        thinking_token_budget: int | None = None,
        reasoning_effort: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool | str = False,
        allow_control_tokens_in_content: bool = False,
        use_tqdm: bool = False,
    ) -> list[ChatOutput]:
        """Render each conversation with the checkpoint's chat template, generate, and parse the reply.

        `messages` is one conversation (a list of message dicts) or a list of them; `sampling_params` one
        SamplingParams for all or a list of one per conversation (as vLLM's). Content parts may hold
        images and videos: OpenAI `image_url` / `video_url` parts (data: URLs, or local paths under
        `allowed_local_media_path`), or `{"type": "image", "image": <PIL image>}`. Returns one ChatOutput
        per conversation, in order.

        As in the OpenAI API: `tool_choice` ("auto", "none", "required" or {"type": "function", "function":
        {"name": ...}}) with `parallel_tool_calls`, and `response_format` (or `sampling_params.structured_outputs`)
        to constrain the answer while reasoning stays free; `thinking_token_budget` caps reasoning (0: none).
        `parallel_tool_calls=False` returns at most one call. The SamplingParams' `stop` strings end the answer
        only, as on the server (P-REQ-2): reasoning and tool calls may hold them; the answer is cut at the first
        (`ChatOutput.stop_string` names it; the turn itself is generated to its end). As on the server (P-REQ-1),
        the turn is generated with its special tokens, which the parser reads; `skip_special_tokens` then decides
        what the parsed reply shows: None (default) or True hides every special token but the framing, False
        hides none. A max_tokens past max_model_len ends the turn there (finish_reason "length"), as in vLLM.

        As vLLM's: `chat_template` is a template source to render with instead of the checkpoint's;
        `continue_final_message=True` ends the prompt inside the final message, which must be an assistant's, so
        that the reply continues its content (without repeating it) and is parsed as that message's continuation,
        in its channel: `content` for an answer, `reasoning` for a message to "self", and for a message to a tool
        that tool's call, read from the message's text on (the whole call);
        `add_generation_prompt=False` ends the prompt after the final message, with no new turn's header. By
        default (None) the generation prompt ends the prompt unless the final message is continued; True with
        `continue_final_message` is refused, as in vLLM. `continue_final_message="reasoning_content"` continues the
        final message's reasoning instead (the reply's `reasoning` then begins with the continuation), as do
        "reasoning" and "thinking": each finds the reasoning under any of the three keys. A prompt that
        does not end with the generation prompt cannot be combined with a grammar over the turn (`response_format`,
        `structured_outputs`, a required or named `tool_choice`, strict tools, `thinking_token_budget`).

        Control-token text in the messages, tools or template kwargs (`<|start|>`, `<|eot|>`, ...) is tokenized
        as plain text, so that it cannot forge turns; `allow_control_tokens_in_content=True` (trusted input
        only) makes it those tokens instead.
        """
        conversations = _conversations(messages)
        if isinstance(sampling_params, list | tuple):
            if len(sampling_params) != len(conversations):
                raise RequestError(f"sampling_params: {len(sampling_params)} for {len(conversations)} conversations; "
                                   "give one, or one per conversation", param="sampling_params")
            _check_sampling_params(list(sampling_params))
            requested = list(sampling_params)
        else:
            if sampling_params is not None:
                _check_sampling_params([sampling_params])
            requested = [sampling_params or self.get_default_sampling_params()] * len(conversations)
        if not isinstance(parallel_tool_calls, bool):
            raise RequestError("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise RequestError("chat_template_kwargs must be a dict (or None)", param="chat_template_kwargs")
        _refuse_rendering_arguments_in_kwargs(chat_template_kwargs or {})
        ends_with_generation_prompt = generation_prompt(add_generation_prompt, continue_final_message)
        if isinstance(continue_final_message, str) and continue_final_message not in _CONTINUABLE_FIELDS:
            raise RequestError(f"continue_final_message={continue_final_message!r}: LLM.chat continues "
                               f"{' or '.join(map(repr, _CONTINUABLE_FIELDS))} (True: 'content')",
                               param="continue_final_message")
        template = self.engine.chat_template if chat_template is None else checked_template_argument(
            chat_template, self.engine.tokenizer, self.engine.max_prompt_chars)
        plan = plan_tools(normalize_tools(tools, check_schema=check_json_schema), tool_choice)
        strength = resolve_reasoning_strength(reasoning_effort=reasoning_effort,
                                              chat_template_kwargs=chat_template_kwargs)
        kwargs = {k: v for k, v in (chat_template_kwargs or {}).items() if k not in _STRENGTH_KWARGS}
        rendering = ChatRendering(template, plan.render_tools, strength, kwargs, allow_control_tokens_in_content,
                                  ends_with_generation_prompt, continue_final_message)
        turns = {id(params): self._chat_turn(plan, params, response_format, parallel_tool_calls,
                                             thinking_token_budget, rendering.prompt_end) for params in requested}
        prepared: list[_Prepared] = []
        continued: list[FinalMessageTag | None] = []  # per conversation, the message its prompt ends inside
        for index, conversation in enumerate(conversations):
            if continue_final_message:
                check_final_message_is_the_assistants(conversation, index if len(conversations) > 1 else None)
            normalized, rendered, final = render_conversation(conversation, rendering, self.engine.tokenizer)
            if final is not None:
                check_media_before_the_cut(normalized, final, index if len(conversations) > 1 else None)
            continued.append(final)
            images, videos = [], []
            with naming_media_parts(conversation):  # an item's error names its content part
                for kind, reference in collect_media(normalized):
                    target = images if kind == "image" else videos
                    target.append(load_media_reference(reference, kind, len(target), self.media_policy))
                ids, items = self.engine.prepare_prompt(rendered.text, images, videos, literals=rendered.literals)
            prepared.append((rendered.display_text, ids, items))
        chat_turns = [turns[id(params)] for params in requested]
        outputs = self._run(prepared, [turn.params for turn in chat_turns], use_tqdm,
                            [turn.controller_factory for turn in chat_turns])
        chats = []
        for output, turn, final in zip(outputs, chat_turns, continued, strict=True):
            choices = []
            hidden = {} if turn.skip_special_tokens is False else self.engine.tokenizer.hidden_in_replies
            for completion in output.outputs:
                text = without_hidden_tokens(completion.text, completion.token_ids, hidden)
                # P-TMPL-8: a continued message's reply is read inside its channel, a tool's from the message's body
                parsed = parse_output(text, plan.parser_tools, continue_recipient=final.recipient if final else None,
                                      continue_prefix=final.body if final else "",
                                      verbatim_content=turn.constrained_answer)
                alone = replace(output, outputs=[completion])
                armed_after = _armed_after(self.engine.tokenizer, completion.token_ids, turn.params.min_tokens,
                                           hidden) if turn.stop else -1
                content, stop_string = _cut_at_stop(parsed.content, turn.stop, turn.include_stop, text, armed_after)
                # `parallel_tool_calls=False`: the first call, as the server returns it under any tool_choice
                calls = list(parsed.tool_calls)[: None if parallel_tool_calls else 1]
                choices.append(ChatOutput(parsed.reasoning, content, calls, alone, stop_string=stop_string))
            first = choices[0]
            chats.append(ChatOutput(first.reasoning, first.content, first.tool_calls, output, choices,
                                    first.stop_string))
        return chats

    def _chat_turn(self, plan: ToolPlan, params: SamplingParams, response_format: Any, parallel_tool_calls: bool,
                   thinking_token_budget: int | None, prompt_end: str | None) -> _ChatTurn:
        """How one SamplingParams' conversations are generated and read: the turn's grammar (the answer's
        constraint, from `response_format` or `params.structured_outputs`), and the stop strings, which match the
        answer only (P-REQ-2): they are looked for in the parsed content, not in the raw turn, where reasoning or a
        tool call could hold them. `prompt_end`: the argument that ends the prompt elsewhere than at the generation
        prompt, where a turn's grammar starts (RequestError naming it if the turn has one), or None."""
        structured, param = params.structured_outputs, "structured_outputs"
        if response_format is not None:
            requested = StructuredOutputsParams.from_response_format(response_format)
            if requested is not None and structured is not None:
                raise RequestError("response_format: give it or sampling_params.structured_outputs, not both",
                                   param="response_format")
            if requested is not None:
                structured, param = requested, "response_format"
        if thinking_token_budget is not None and (
                not isinstance(thinking_token_budget, int) or isinstance(thinking_token_budget, bool)
                or thinking_token_budget < 0):
            raise RequestError("thinking_token_budget: must be an integer >= 0", param="thinking_token_budget")
        refuse_turn_grammar(prompt_end, plan, structured_param=param if structured is not None else None,
                            thinking_token_budget=thinking_token_budget)
        answer = chat_answer_grammar(structured, param) if structured is not None else None
        constraint = plan.turn_constraint(answer, parallel_calls=parallel_tool_calls,
                                          thinking_token_budget=thinking_token_budget)
        factory = self.engine.grammars.turn(constraint, param) if constraint is not None else None
        # P-REQ-1: the engine keeps every special token (the framing the parser reads); the reply hides them after
        return _ChatTurn(replace(params, structured_outputs=None, stop=[], skip_special_tokens=False), factory,
                         structured is not None, list(params.stop), params.include_stop_str_in_output,
                         params.skip_special_tokens)


class LLMTokenizer:
    """The engine's tokenizer behind the calls vLLM users make on a Hugging Face tokenizer, with its defaults:
    `encode` and `__call__` add BOS (`add_special_tokens=True`), `decode` and `batch_decode` keep special tokens
    unless told, `vocab_size` counts the base vocabulary and `len()` every token, and `apply_chat_template` renders
    with the checkpoint's template exactly as `LLM.chat` does, and `all_special_ids` are transformers' (the named
    tokens). Other attributes (`bos_token_id`, `eos_token_id`, `pad_token_id`, `token_to_id`, ...) are the
    `Tokenizer`'s."""

    def __init__(self, llm: LLM):
        self._llm = llm
        self.tokenizer: Tokenizer = llm.engine.tokenizer

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_"):
            with contextlib.suppress(AttributeError):
                return getattr(self.tokenizer, name)
        # named as the class the caller holds, not the engine's Tokenizer it was looked up on
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __len__(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def vocab_size(self) -> int:
        """Tokens of the base vocabulary, without the added ones (transformers' `vocab_size`); `len()` counts all."""
        return self.tokenizer.base_vocab_size

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens the checkpoint sets (bos, eos, unk, pad), each once, in transformers' order: its
        `all_special_tokens`, so that a script stripping them leaves what it leaves with transformers (the framing
        tokens stay). Every token flagged special, which `decode(skip_special_tokens=True)` leaves out as
        transformers' does, is in `tokenizer.all_special_ids`."""
        named = (getattr(self.tokenizer, name) for name in _NAMED_TOKENS_IN_TRANSFORMERS_ORDER)
        return list(dict.fromkeys(token for token in named if token is not None))

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of `all_special_tokens` (transformers' `all_special_ids`): what `convert_ids_to_tokens` skips."""
        return [self.tokenizer.require_token_id(token) for token in self.all_special_tokens]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, BOS first unless `add_special_tokens=False` (as transformers' `encode`)."""
        if not isinstance(text, str):
            raise TypeError(f"LLMTokenizer.encode() takes a string, not {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, Any]:
        """{"input_ids": ids} of a text, or a list of id lists for a list of texts (as transformers' call)."""
        if isinstance(text, list | tuple):
            return {"input_ids": [self.encode(t, add_special_tokens) for t in text]}
        return {"input_ids": self.encode(text, add_special_tokens)}

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        """The vocabulary entries of `text`'s tokens, without BOS unless asked (as transformers' `tokenize`)."""
        if not isinstance(text, str):
            raise TypeError(f"LLMTokenizer.tokenize() takes a string, not {type(text).__name__}")
        ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return [self.tokenizer.id_to_token(i) for i in ids]

    def decode(self, ids: int | SequenceABC[int] | SequenceABC[SequenceABC[int]], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str | list[str]:
        """Text of `ids` (an id, a list of ids, or a 1-D array or tensor of them), or the texts of a batch of them (a
        list of id lists, of 1-D arrays or of tensors, or a 2-D array or tensor), as transformers 5's `decode`, which
        tells a batch by its first item once arrays and tensors are lists; `skip_special_tokens` leaves out every
        token flagged special (`tokenizer.all_special_ids`: framing and media tokens too, as transformers' decode).
        `clean_up_tokenization_spaces` has transformers 5's meaning (None: the tokenizer config's default, False for
        Muse), which leaves the text of a BPE tokenizer, as Muse's, as it is: True changes nothing unless
        tokenizer_config.json sets `clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`.
        Raises TypeError naming `LLMTokenizer.decode` for anything else."""
        return self._decode_any(ids, skip_special_tokens, clean_up_tokenization_spaces, "LLMTokenizer.decode()")

    def batch_decode(self, sequences: SequenceABC[SequenceABC[int]], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None) -> list[str]:
        """The texts of `sequences` (a list of id lists, or a 2-D array or tensor) as `decode` gives them; one
        sequence gives a list of its text (as transformers 5's `batch_decode`)."""
        texts = self._decode_any(sequences, skip_special_tokens, clean_up_tokenization_spaces,
                                 "LLMTokenizer.batch_decode()")
        return [texts] if isinstance(texts, str) else texts

    def _decode_any(self, ids: Any, skip_special_tokens: bool, clean_up: bool | None, call: str) -> str | list[str]:
        ids = _python_ids(ids)
        # one sequence or a batch, as transformers 5 tells them: by the first item alone
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return [self._decode(_token_id_list(sequence, f"{call} (sequence {index})"), skip_special_tokens,
                                 clean_up) for index, sequence in enumerate(ids)]
        return self._decode(_token_id_list(ids, call), skip_special_tokens, clean_up)

    def _decode(self, ids: list[int], skip_special_tokens: bool, clean_up: bool | None) -> str:
        if skip_special_tokens:
            special = set(self.tokenizer.all_special_ids)
            ids = [i for i in ids if i not in special]
        return self.tokenizer.cleaned_up_as_transformers(self.tokenizer.decode(ids), clean_up)

    def convert_ids_to_tokens(self, ids: int | SequenceABC[int],
                              skip_special_tokens: bool = False) -> str | None | list[str | None]:
        """The vocabulary entry of an id (None past the vocabulary), or of each of a list of ids, those of
        `all_special_ids` (the named tokens, not the framing) left out with `skip_special_tokens`, as transformers'
        call (unlike its `decode`, which leaves out every token flagged special)."""
        id_list = _token_id_list(ids, "LLMTokenizer.convert_ids_to_tokens()")
        if _is_token_id(ids):
            return self.tokenizer.id_to_token(id_list[0])
        special = set(self.all_special_ids) if skip_special_tokens else set()
        return [self.tokenizer.id_to_token(i) for i in id_list if i not in special]

    def convert_tokens_to_ids(self, tokens: str | SequenceABC[str]) -> int | None | list[int | None]:
        """The id of a vocabulary entry, or of each of a list of them; one not in the vocabulary is the unknown
        token's id, None without one (as transformers' call)."""
        if isinstance(tokens, str):
            return self._token_id(tokens)
        if not isinstance(tokens, list | tuple) or not all(isinstance(t, str) for t in tokens):
            raise TypeError("LLMTokenizer.convert_tokens_to_ids() takes a token string or a list of them")
        return [self._token_id(t) for t in tokens]

    def _token_id(self, token: str) -> int | None:
        token_id = self.tokenizer.token_to_id(token)
        return self.tokenizer.unk_token_id if token_id is None else token_id

    def get_vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]] | list[list[dict[str, Any]]] | None = None,
        tools: list[dict[str, Any] | Callable[..., Any]] | None = None,
        *,
        documents: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        sanitize_control_tokens: bool | None = None,
        padding: bool | str = False,
        truncation: bool | str = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_dict: bool = False,
        return_assistant_tokens_mask: bool = False,
        tokenizer_kwargs: Mapping[str, Any] | None = None,
        allow_control_tokens_in_content: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The prompt of a conversation (a list of message dicts) as `LLM.chat` renders it, or of each of a batch of
        them (a list of such lists, giving a list): its token ids (`tokenize=True`, BOS once, from the template) or
        its text. Media parts are not expanded into placeholder tokens here.

        The named arguments are transformers 5's, with its meaning (glimmer/engine/apply_chat_template.py): `tools`
        (schemas, or Python functions converted as transformers converts them), `documents` (the template's
        variable), `chat_template` (a template source to render with instead of the checkpoint's),
        `add_generation_prompt`, `continue_final_message`, `tokenize`, `sanitize_control_tokens`, `padding`,
        `truncation`, `max_length`, `return_tensors` ('pt' or 'np') and `return_dict` ({"input_ids",
        "attention_mask"}; only with `tokenize=True`, as in transformers). `conversation` may be passed as
        `messages`. Every other keyword argument is a chat template variable, as in transformers and as
        `LLM.chat`'s `chat_template_kwargs` (`reasoning_effort` included).

        Defaults are Glimmer's, as before transformers 5: the ids as a list (`return_dict=False`), and the
        generation prompt unless `continue_final_message` is set (`add_generation_prompt=None`).

        `continue_final_message=True` ends the prompt inside the final message's content: what the template writes
        after it (its `<|eot|>` or `<|eom|>`, whatever `end_turn` says) is left out, so the model continues the
        body of that message's channel: `to=user` for an answer, the `recipient` for a message to another channel.
        A string names the field to continue: `"reasoning_content"` (or `"reasoning"`, `"thinking"`: each finds the
        reasoning under any of the three keys) ends the prompt inside the reasoning (a `to=self` message) and leaves
        out the content that would follow it. As in transformers the final message may have
        any role, it cannot be combined with `add_generation_prompt=True`, and a field the template leaves out
        (the content of an assistant message with `tool_calls`) cannot be continued.

        Control-token text in the messages, tools or template kwargs is tokenized as plain text (as transformers'
        `sanitize_control_tokens=True`); `allow_control_tokens_in_content=True` or `sanitize_control_tokens=False`
        (trusted input only) makes it those tokens. Padding and truncation are on the right; without `max_length`
        their limit is the engine's `max_model_len` (transformers: the tokenizer's `model_max_length`).

        Raises RequestError (a ValueError) naming the argument for values transformers refuses and for those not
        supported here: `return_assistant_tokens_mask=True` (the template marks no `{% generation %}` spans),
        `tokenizer_kwargs`, `return_tensors` other than 'pt' or 'np'.
        """
        conversations, batched = split_conversations(given_conversation(conversation, kwargs))
        if return_assistant_tokens_mask:
            raise RequestError("return_assistant_tokens_mask=True is not supported: the chat template marks no "
                               "{% generation %} spans to build the mask from", param="return_assistant_tokens_mask")
        if tokenizer_kwargs:
            raise RequestError(f"tokenizer_kwargs {sorted(tokenizer_kwargs)} are not supported; padding, truncation, "
                               "max_length and return_tensors are arguments of apply_chat_template",
                               param="tokenizer_kwargs")
        ends_with_generation_prompt = generation_prompt(add_generation_prompt, continue_final_message)
        if sanitize_control_tokens and not tokenize:
            raise RequestError("sanitize_control_tokens=True applies to token ids: it needs tokenize=True (the text "
                               "of a prompt holds no tokens to sanitize)", param="sanitize_control_tokens")
        if sanitize_control_tokens and allow_control_tokens_in_content:
            raise RequestError("sanitize_control_tokens=True contradicts allow_control_tokens_in_content=True; give "
                               "one", param="sanitize_control_tokens")
        shape = OutputShape(padding, truncation, max_length, return_tensors, return_dict) if tokenize else None
        template = self._llm.engine.chat_template if chat_template is None else _template_argument(chat_template)
        plan = plan_tools(normalize_tools(tool_schemas(tools)), None)
        strength = resolve_reasoning_strength(reasoning_effort=None, chat_template_kwargs=kwargs)
        template_kwargs = {k: v for k, v in kwargs.items() if k not in _STRENGTH_KWARGS}
        if documents is not None:
            template_kwargs["documents"] = checked_documents(documents)
        rendering = ChatRendering(template, plan.render_tools, strength, template_kwargs,
                                  allow_control_tokens_in_content or sanitize_control_tokens is False,
                                  ends_with_generation_prompt, continue_final_message)
        tokenizer = self._llm.engine.tokenizer
        prompts = [render_conversation(messages, rendering, tokenizer)[1] for messages in conversations]
        if shape is None:
            texts = [prompt.display_text for prompt in prompts]
            return texts if batched else texts[0]
        ids = [self._llm.engine.encode_prompt(prompt.text, literals=prompt.literals) for prompt in prompts]
        return shape.apply(ids, batched=batched, default_max_length=self._llm.engine.max_model_len,
                           pad_token_id=self.tokenizer.pad_token_id)


def _template_argument(source: Any) -> ChatTemplate:
    """The `chat_template` argument compiled (transformers also takes the name of one of several templates a
    tokenizer holds; a checkpoint gives Glimmer one, P-TMPL-1). Raises RequestError, ChatTemplateError."""
    if not isinstance(source, str):
        raise RequestError(f"chat_template must be a jinja template source (a string), not {type(source).__name__}",
                           param="chat_template")
    return compiled_template(source)


def _is_single_prompt(prompts: object) -> bool:
    """Whether `generate` was given one prompt (a string, a prompt dict or one list of token ids), not a list."""
    return isinstance(prompts, str | dict) or (
        isinstance(prompts, list | tuple) and bool(prompts) and all(map(_is_token_id, prompts)))


def _python_ids(ids: Any) -> Any:
    """`ids` with each NumPy array or scalar and torch tensor in it, at any depth of lists and tuples, as the Python
    int or lists it holds, and tuples as lists: what transformers 5's `decode` converts (its `to_py_obj`) before it
    tells one sequence from a batch, so that a list of 1-element tensors (`list(torch.tensor([[300], [301]]))`) is a
    batch of two sequences, as there, and a list of 1-D arrays a batch too."""
    if hasattr(ids, "tolist"):
        return ids.tolist()
    if isinstance(ids, list | tuple):
        return [_python_ids(item) for item in ids]
    return ids


def _token_id_list(ids: Any, call: str) -> list[int]:
    """`ids` (a token id, a list or tuple of them, a NumPy array or a torch tensor) as a list of ints. Raises
    TypeError naming `call` and what was given instead."""
    if hasattr(ids, "tolist"):  # a NumPy array or scalar, a torch tensor
        ids = ids.tolist()
    if _is_token_id(ids) and operator.index(ids) >= 0:
        return [operator.index(ids)]
    if not isinstance(ids, list | tuple):
        raise TypeError(f"{call} takes token ids (an int, a list of ints, or a 1-D array or tensor of them), not "
                        f"{type(ids).__name__}")
    bad = next((index for index, i in enumerate(ids) if not _is_token_id(i) or operator.index(i) < 0), None)
    if bad is not None:
        raise TypeError(f"{call} takes token ids (integers >= 0); item {bad} is {ids[bad]!r}")
    return [operator.index(i) for i in ids]


def _is_token_id(value: object) -> bool:
    """An integer of any integral type (int, numpy.int64, ...) but not a bool."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


@contextlib.contextmanager
def _naming_the_prompt(name: str) -> Iterator[None]:
    """Errors about the prompt (raised by the engine for chat messages or a prompt) re-raised naming `name`."""
    try:
        yield
    except RequestError as error:
        if error.param not in ("messages", "prompt") or error.param == name or name == "messages":
            raise
        message = str(error).replace("shorten the messages", "shorten the prompt")
        raise RequestError(message if name == "prompt" else f"{name}: {message}", param=name) from error


def _refuse_rendering_arguments_in_kwargs(chat_template_kwargs: Mapping[str, Any]) -> None:
    """RequestError for an argument of `LLM.chat` given in its `chat_template_kwargs`, where vLLM's `LLM.chat` also
    reads it: the template never would, and a prompt rendered without it would be a silent wrong answer."""
    for name in _RENDERING_ARGUMENTS:
        if name in chat_template_kwargs:
            raise RequestError(f"chat_template_kwargs may not set {name!r}: it is an argument of LLM.chat, not a "
                               f"template variable; pass LLM.chat(messages, {name}=...)", param="chat_template_kwargs")


def _check_sampling_params(params_list: list[Any]) -> None:
    for i, params in enumerate(params_list):
        if not isinstance(params, SamplingParams):
            raise RequestError(f"sampling_params[{i}] must be a SamplingParams, not {type(params).__name__} (build "
                               "one with SamplingParams(max_tokens=..., ...))", param="sampling_params")


def _conversations(messages: Any) -> list[Any]:
    """`messages` as a list of conversations: one conversation (a list of message dicts) or a list of them."""
    if isinstance(messages, Mapping):
        raise RequestError("messages must be a list of message objects; got one message object: wrap it in a list",
                           param="messages")
    if not isinstance(messages, list | tuple) or not messages:
        raise RequestError("messages must be a non-empty list of message objects (one conversation) or a list of "
                           "such lists", param="messages")
    conversations = [messages] if isinstance(messages[0], Mapping) else list(messages)
    for i, conversation in enumerate(conversations):
        if isinstance(conversation, list | tuple) and not conversation:
            raise RequestError(f"messages[{i}]: a conversation needs at least one message", param="messages")
    return conversations


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]
