"""The offline Python API, shaped like vLLM's: `LLM(model=...)`, `llm.generate(prompts, SamplingParams(...))`.

Generation of many prompts runs on the same continuous-batching engine as the server.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import inspect
import itertools
import operator
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm.auto import tqdm

from glimmer.checkpoint.generation_config import check_generation_config_mode
from glimmer.engine.apply_chat_template import (
    FinalMessageTag,
    checked_documents,
    generation_prompt,
    tool_schemas,
)
from glimmer.engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams, warn_if_beams_recompute
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
from glimmer.engine.config_checks import media_fetch_policy
from glimmer.engine.detokenizer import IncrementalDetokenizer
from glimmer.engine.fork_guard import check_not_forked
from glimmer.engine.grammar import ControllerFactory, chat_answer_grammar, check_tool_parameters
from glimmer.engine.interrupt_guard import InterruptsBetweenSteps
from glimmer.engine.llm_engine import (
    EngineConfig,
    LLMEngine,
    StepError,
    log_sampling_defaults,
    warn_of_default_repetition_penalty,
)
from glimmer.engine.llm_tokenizer import LLMTokenizer, is_token_id
from glimmer.engine.outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput, StepDelta
from glimmer.engine.prompt_parts import prompt_text_parts
from glimmer.engine.prompts import PROMPT_KEYS, PromptType
from glimmer.engine.sampling_params import CHAT_ALLOWED_TOKEN_IDS_REFUSAL, SamplingParams, StructuredOutputsParams
from glimmer.engine.sequence import MultimodalItem
from glimmer.engine.stop_strings import first_to_end
from glimmer.engine.tokenizer import Tokenizer
from glimmer.engine.vllm_arguments import (
    VLLM_ONLY_BEAM_SEARCH_ARGUMENTS,
    VLLM_ONLY_CHAT_ARGUMENTS,
    VLLM_ONLY_GENERATE_ARGUMENTS,
    VLLM_ONLY_LLM_ARGUMENTS,
    VLLM_ONLY_LLM_METHODS,
    VLLM_ONLY_PROMPT_KEYS,
    glimmer_arguments,
    method_takes_vllm_arguments,
)
from glimmer.errors import ConfigError, PromptPart, PromptTextTooLongError, RequestError, UnsupportedArgumentError
from glimmer.multimodal.sources import (
    collect_media,
    file_url_path,
    load_media_reference,
    naming_media_parts,
    url_scheme,
)
from glimmer.multimodal.video import is_frame_list, is_frames_with_metadata, unstacked
from glimmer.protocol import (
    Delta,
    OutputParser,
    ParsedOutput,
    ToolCall,
    normalize_tools,
    resolve_reasoning_strength,
)
from glimmer.protocol.chat_template import REASONING_FIELDS
from glimmer.protocol.openai_mapping import answer_characters_before, offset_of_answer_character
from glimmer.protocol.tool_choice import ToolPlan, plan_tools
from glimmer.protocol.turn_grammar import MAX_THINKING_TOKEN_BUDGET

_Prepared = tuple[str | None, list[int], list[MultimodalItem]]
_CONTINUABLE_FIELDS = ("content", *REASONING_FIELDS)
"""What `LLM.chat(continue_final_message=...)` can continue: True or "content" the answer (or the message to the
final message's `recipient`), a reasoning field the reasoning."""


@functools.cache
def _own_keywords() -> frozenset[str]:
    """The keyword parameters `LLM.__init__` names itself (`dtype`, `device`, the media ones, ...)."""
    parameters = inspect.signature(LLM.__init__).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


_ENCODING_HINT = ("; this is a tokenizer's encoding ({'input_ids', 'attention_mask'}, what apply_chat_template returns "
                  "by default, as transformers 5's): pass its ['input_ids'], or call apply_chat_template(..., "
                  "return_dict=False)")
"""Added to the error about a prompt that is a tokenizer's encoding, which `generate` does not take."""


@dataclass
class ChatOutput:
    """One conversation's reply, parsed by the protocol: reasoning, answer and tool calls, plus the raw output.

    The fields are the first completion's; `choices` holds every completion (`n` of the SamplingParams) parsed
    the same way, each with its own one-completion `output`. `output` holds each completion raw, special tokens
    (its framing) included whatever `skip_special_tokens` says (that applies to the parsed fields, P-REQ-1), ending
    where the server ends the reply: where a stop string ended the answer (its text before the stop string, through
    it with `include_stop_str_in_output`, the string as stop_reason), at the token of another role's header (P-HDR-8)
    or, with `parallel_tool_calls=False`, of the end of the first call (no stop_reason), each with finish_reason
    "stop" in the engine's words, as vLLM's raw outputs (the server's, "tool_calls" after calls, is
    `finish_reason`'s), else at the turn's end or max_tokens as generated.
    What vLLM code reads of the RequestOutput its `LLM.chat` returns (`outputs`, `prompt`, `prompt_token_ids`,
    `request_id`, `num_cached_tokens`, `prompt_logprobs`, `metrics`, `finished`) is `output`'s, so such code runs:
    `outputs[0].text` is the raw turn there as here, `content` the answer."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]
    output: RequestOutput
    choices: list[ChatOutput] = field(default_factory=list)
    stop_string: str | None = None  # the stop string that ended the answer (stop strings match the answer only)

    # vLLM's LLM.chat returns RequestOutputs: what vLLM code reads of one (`out.outputs[0].text`) is `output`'s
    @property
    def outputs(self) -> list[CompletionOutput]:
        """`output.outputs`: every completion, the raw turn as vLLM's `LLM.chat` returns it, each ending where the
        server ends its reply (at a stop string in the answer, another role's header or, with
        `parallel_tool_calls=False`, the first call; see the class)."""
        return self.output.outputs

    @property
    def prompt(self) -> str | None:
        return self.output.prompt

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.output.prompt_token_ids

    @property
    def request_id(self) -> str:
        return self.output.request_id

    @property
    def num_cached_tokens(self) -> int:
        return self.output.num_cached_tokens

    @property
    def prompt_logprobs(self) -> list[PositionLogprobs | None] | None:
        return self.output.prompt_logprobs

    @property
    def metrics(self) -> RequestMetrics | None:
        return self.output.metrics

    @property
    def finished(self) -> bool:
        return self.output.finished

    @property
    def finish_reason(self) -> str | None:
        """As the OpenAI API reports it, and the server (P-API-2): `length` where the engine's limit ended the turn
        (a reply the server ends early says `stop` raw, see the class), else `tool_calls` when calls were made,
        else the raw completion's (`stop`)."""
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


def _cut_at_stop(content: str | None, stop: list[str], include: bool, armed_from: int = 0,
                 breaks: Collection[int] = ()) -> tuple[str | None, str | None, int | None]:
    """(the answer up to its first stop string, kept if `include`; that stop string; where it starts in the answer),
    or (content, None, None).

    As on the server, with `min_tokens` a stop string counts only if it ends past the answer's first `armed_from`
    characters, those in the text of the first min_tokens tokens (`_unarmed_answer_characters`). Nor does one count
    across `breaks` (`_content_breaks`)."""
    if not content or not stop:
        return content, None, None
    found = []
    for s in stop:
        at = content.find(s)
        while at >= 0 and (at + len(s) <= armed_from or any(at < position < at + len(s) for position in breaks)):
            at = content.find(s, at + 1)
        if at >= 0:
            found.append((at, s))
    if not found:
        return content, None, None
    at, matched = first_to_end(found)
    return content[: at + len(matched) if include else at] or None, matched, at


def _unarmed_answer_characters(parser: OutputParser, armed_after: int) -> int:
    """How many of the answer characters `parser` released lie in the turn's first `armed_after` characters (the text
    of the first min_tokens tokens; -1 without min_tokens): a stop string ending in them does not count, however long
    the parser held their text back (a possible header) before releasing it, as on the server
    (`ChoiceStream._armed_from`) and in vLLM, where a stop string counts if it ends in a token after the
    min_tokens-th."""
    return answer_characters_before(parser.content_spans, armed_after)


def _content_breaks(deltas: Iterable[Delta]) -> list[int]:
    """Where, in the answer of a turn read as `deltas` (`_ServerReading.finish`), reasoning or a call came between
    two pieces of it: no stop string counts across such a place, as the server releases the answer text it holds back
    for a possible stop string before another kind's output (server/choice_stream.py)."""
    breaks: list[int] = []
    length = 0
    for kind, payload in (event for delta in deltas for event in delta.events):
        if kind == "content":
            length += len(payload)
        elif length and (not breaks or breaks[-1] != length):
            breaks.append(length)
    return breaks


class _ServerReading:
    """A generated turn read a token's text at a time as the server's chat reads it (server/choice_stream.py), to
    tell where the server ends the reply: at a header of another role (the model is inventing the next user turn or a
    tool result, P-HDR-8), with `single_call` (`parallel_tool_calls=False`) at the first finished call, and at the
    first stop string in the answer (P-REQ-2) that ends past the text of the first `min_tokens` tokens, counted
    neither across reasoning nor a call between two pieces of the answer (`_content_breaks`). `reading`:
    OutputParser's arguments. The one reading of a completion, as it is generated and after (`finish`): its parser
    logs each of its warnings once."""

    def __init__(self, reading: Mapping[str, Any], *, single_call: bool, stop: list[str], include_stop: bool,
                 min_tokens: int):
        self._parser = OutputParser(**reading)
        self._single_call = single_call
        self._stop = stop
        self._include_stop = include_stop
        self._min_tokens = min_tokens
        self._longest = max((len(s) for s in stop), default=0)
        self._deltas: list[Delta] = []
        self._content = ""
        self._tokens = 0
        self._characters = 0
        self._armed_after = -1 if not min_tokens else None  # where the min_tokens-th token's text ends, once read
        # why the server ends the reply: "stop" (a stop string in the answer), "header" (another role's), "call" (the
        # first, with single_call)
        self.ended_by: str | None = None

    def feed(self, text: str, tokens: int = 1) -> str | None:
        """Read the text that the turn's next `tokens` tokens released; returns why the server ends the reply there
        (`ended_by`), or None. Text read once the reply ended is no part of it. Several tokens read as one (a step's
        text, which comes with its last token) arm the stop strings at the end of their text: a stop string that
        min_tokens holds off is never taken for one that counts."""
        if self.ended_by is not None:
            return None
        self._tokens += tokens
        self._characters += len(text)
        if self._armed_after is None and self._tokens >= self._min_tokens:
            self._armed_after = self._characters
        delta = self._parser.feed(text)
        self._deltas.append(delta)
        parser = self._parser
        if parser.other_role_header_seen:
            self.ended_by = "header"
        elif self._single_call and (parser.valid_call_names or parser.unresolved_call_count):
            self.ended_by = "call"
        elif self._stop and delta.content:
            self._content += delta.content
            recent = self._content[-(self._longest + len(delta.content)):]
            if self._armed_after is not None and any(s in recent for s in self._stop):
                unarmed = _unarmed_answer_characters(parser, self._armed_after)
                breaks = _content_breaks(self._deltas)
                if _cut_at_stop(self._content, self._stop, self._include_stop, unarmed, breaks)[1] is not None:
                    self.ended_by = "stop"
        return self.ended_by

    def ends_in(self, delta: StepDelta) -> bool:
        """Whether the server ends the reply within the engine's `delta` of the turn (read token by token where it
        says where each token's text ends)."""
        start = 0
        for end, tokens in _token_text_runs(delta.text_ends()):
            if self.feed(delta.text[start:end], tokens) is not None:
                return True
            start = end
        return start < len(delta.text) and self.feed(delta.text[start:], 0) is not None  # text no token released

    @property
    def characters(self) -> int:
        """How many characters of the turn the reply holds: those read, through the token the server ends it at."""
        return self._characters

    def finish(self) -> tuple[list[Delta], OutputParser]:
        """The deltas of the reply read, the parser's last included (what `ParsedOutput.from_deltas` assembles and
        `_content_breaks` reads), and the parser, whose `content_spans` place the answer in the turn. Called once,
        when the turn's text is all read."""
        self._deltas.append(self._parser.finish())
        return self._deltas, self._parser


def _token_text_runs(text_ends: list[int]) -> list[tuple[int, int]]:
    """(where a token's text ends, how many tokens released it) per token whose text ends after the one before's: the
    tokens of one step's delta release their text with the last (`StepDelta.text_ends`)."""
    runs: list[tuple[int, int]] = []
    tokens = 0
    for i, end in enumerate(text_ends):
        tokens += 1
        if i + 1 == len(text_ends) or text_ends[i + 1] != end:
            runs.append((end, tokens))
            tokens = 0
    return runs


def _armed_after(token_ends: list[int], min_tokens: int, stop: list[str]) -> int:
    """Where the text of the turn's min_tokens-th token ends (`token_ends`: where each token's text ends), after which
    a stop string counts; -1 without min_tokens or stop strings, the turn's end if it has fewer tokens."""
    min_tokens = min(min_tokens, len(token_ends))
    return token_ends[min_tokens - 1] if stop and min_tokens else -1


def _completion_ended_at_stop(completion: CompletionOutput, token_ends: list[int], content_spans: list[tuple[int, int]],
                              start: int, stop_string: str, include: bool) -> CompletionOutput:
    """The raw `completion` (its text the turn whose tokens end at `token_ends`) ended where `stop_string` ended its
    answer, as vLLM's generation ends at a stop string: its text before the stop string (through it if `include`),
    its tokens through the one the stop string ends in, finish_reason `stop` and the string as stop_reason, in the
    engine's words as vLLM's raw outputs (`ChatOutput.finish_reason` is the server's, `tool_calls` after calls).
    `start` is where the stop string starts in the answer (`_cut_at_stop`), `content_spans` where the answer lies in
    the turn."""
    first = offset_of_answer_character(content_spans, start + 1)
    last = offset_of_answer_character(content_spans, start + len(stop_string))
    assert first is not None and last is not None, "the stop string was found in the answer these spans hold"
    tokens = bisect.bisect_left(token_ends, last) + 1
    return _completion_cut(completion, tokens, last if include else first - 1, stop_string)


def _completion_ended_by_the_server(completion: CompletionOutput, tokens: int, text_end: int) -> CompletionOutput:
    """The raw `completion` ended at its `tokens`-th token, whose text ends at `text_end`, where the server ends the
    reply for another reason than a stop string (another role's header, P-HDR-8, or with `parallel_tool_calls=False`
    the first call): its text and tokens through that token, finish_reason `stop` (the engine's words, as vLLM's raw
    outputs; `ChatOutput.finish_reason` is the server's, `tool_calls` after calls) and no stop_reason."""
    return _completion_cut(completion, tokens, text_end, None)


def _completion_cut(completion: CompletionOutput, tokens: int, text_end: int,
                    stop_reason: str | None) -> CompletionOutput:
    """The raw `completion` ended early: its first `text_end` characters and `tokens` tokens (and their logprobs),
    finish_reason `stop` and `stop_reason`."""
    return replace(completion, text=completion.text[:text_end], token_ids=completion.token_ids[:tokens],
                   finish_reason="stop", stop_reason=stop_reason,
                   logprobs=None if completion.logprobs is None else completion.logprobs[:tokens])


def _token_pieces(tokenizer: Tokenizer, text: str, token_ids: list[int], hidden: frozenset[int]) -> list[str]:
    """Per token of the turn `token_ids`, the text it released in `text` (found by detokenizing the turn again, the
    `hidden` special tokens left out as the engine left them out), as the server's chat reads the turn. What the
    turn's end released (bytes left incomplete) joins the last piece."""
    detokenizer = IncrementalDetokenizer(tokenizer, skip_token_ids=hidden)
    pieces: list[str] = []
    start = 0
    for token_id in token_ids:
        end = start + len(detokenizer.add(token_id))
        pieces.append(text[start:end])
        start = end
    if pieces:
        pieces[-1] += text[start:]
    return pieces


class LLM:
    """Load a Muse Glimmer checkpoint and generate from it.

    model: a checkpoint directory or a Hugging Face Hub id. dtype: "float32" | "bfloat16" | "float16" or that
    torch.dtype ("float" and "half" as vLLM spells them); "auto" or None: bfloat16 on CUDA, float32 on CPU.
    device: "cpu" | "cuda" (default: cuda if available). seed (default 0): where the seeds of requests without
    their own come from, so a run repeats; None draws a fresh one each time (vLLM's seed=None).
    generation_config: "auto" (default) takes the sampling defaults of a call without SamplingParams from
    the checkpoint's generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, and
    max_new_tokens as max_tokens), as the server does; "vllm" uses plain `SamplingParams()`.
    Other keyword arguments are `EngineConfig` fields (max_model_len, max_num_seqs,
    max_num_batched_tokens, kv_cache_memory (or vLLM's kv_cache_memory_bytes), block_size, enable_prefix_caching, seed,
    chat_template); `progress=False`
    hides the progress bars of loading, and those of `generate` and `chat` unless their `use_tqdm` asks for one.
    Media arguments are `glimmer serve`'s media flags in snake_case: allowed_local_media_path (a list of
    directories), allow_remote_media, allowed_media_domains (a list of hosts), max_media_bytes (64 MiB; bytes or
    '16MiB') and media_fetch_timeout (10 s); `media_limits=MediaLimits(...)` holds the pixel and frame bounds.
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
        max_media_bytes: int | str | None = None,
        media_fetch_timeout: float | None = None,
        **engine_options: Any,
    ):
        check_generation_config_mode(generation_config)
        # a path as its text; anything else as given, for the config check to name (str(None) was a path 'None')
        model = os.fspath(model) if isinstance(model, os.PathLike) else model
        if "kv_cache_memory_bytes" in engine_options:  # vLLM's name for kv_cache_memory (bytes; a size here too)
            if "kv_cache_memory" in engine_options:
                raise ConfigError("kv_cache_memory and kv_cache_memory_bytes (vLLM's name for it) are both given; "
                                  "pass one of them")
            engine_options["kv_cache_memory"] = engine_options.pop("kv_cache_memory_bytes")
        # vLLM's engine arguments Glimmer has no field for: dropped where they change nothing, else refused naming
        # what to do instead (`model` rides along for `tokenizer=model`); a misspelled option names the closest
        # LLM's own keyword parameters are listed and matched too (`dtyp` is "did you mean 'dtype'"), though they
        # never reach engine_options
        known = sorted({f.name for f in dataclasses.fields(EngineConfig)} | _own_keywords())
        engine_options = glimmer_arguments("LLM", known, VLLM_ONLY_LLM_ARGUMENTS, {"model": model, **engine_options})
        del engine_options["model"]
        media_policy = media_fetch_policy(allowed_local_media_path, allow_remote_media, allowed_media_domains,
                                          max_media_bytes, media_fetch_timeout)
        self.engine = LLMEngine(EngineConfig(model=model, dtype=dtype, device=device, **engine_options))
        if generation_config == "auto":  # under "vllm" no call takes the checkpoint's defaults
            log_sampling_defaults(self.engine.generation_defaults, "generate and chat calls without SamplingParams",
                                  "LLM(..., generation_config='vllm') for vLLM's plain defaults")
            warn_of_default_repetition_penalty(self.engine.generation_defaults, "generate and chat calls without "
                                               "SamplingParams", "pass SamplingParams, or LLM(..., "
                                               "generation_config='vllm') for vLLM's plain defaults")
        self.media_policy = media_policy
        self.generation_config = generation_config
        self._ids = itertools.count()
        self._tokenizer = LLMTokenizer(self.engine)
        # one call steps the engine at a time: another thread's call stepping it too took this call's outputs
        # (KeyError) or built a step of both calls' requests from two threads (a StepError)
        self._run_lock = threading.Lock()
        self._running: tuple[int, str] | None = None  # the thread whose call holds `_run_lock`, and the call's name

    def __getattr__(self, name: str) -> Any:
        """Raises AttributeError for any attribute LLM has not; for one of vLLM's (`embed`, `llm_engine`, ...) it
        says what to do instead."""
        message = f"{type(self).__name__!r} object has no attribute {name!r}"
        instead = VLLM_ONLY_LLM_METHODS.get(name)
        if instead is not None:
            message += f"; vLLM's LLM.{name}: {instead}"
        raise AttributeError(message, name=name, obj=self)

    def __reduce__(self) -> Any:
        """Raises TypeError: an LLM is not pickled (a multiprocessing pool's argument) or deep-copied, which failed
        deep inside the engine ("ctypes objects containing pointers cannot be pickled")."""
        raise TypeError("an LLM cannot be pickled or deep-copied: it holds the model's weights and KV cache; make "
                        "one LLM in each process that generates (LLM(model=...)) and send it prompts and "
                        "SamplingParams, which pickle, as its outputs do")

    def __copy__(self) -> LLM:
        """A second LLM object on the same engine (and lock), as `copy.copy` made it before pickling was refused."""
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use without SamplingParams: the checkpoint's generation_config.json
        sampling fields under generation_config="auto", plain `SamplingParams()` under "vllm"."""
        if self.generation_config == "vllm":
            return SamplingParams()
        return SamplingParams(**self.engine.generation_defaults.sampling_defaults())

    def get_tokenizer(self) -> LLMTokenizer:
        """The tokenizer as vLLM's `get_tokenizer()` gives it, with Hugging Face's defaults: `encode(text)` adds
        BOS, so `generate({"prompt_token_ids": tok.encode(text)})` is `generate(text)`. Its `.tokenizer` is the
        engine's own `Tokenizer` (whose `encode` adds nothing unless asked). The same object on every call, as vLLM's,
        so that a setting made on it (`padding_side = "left"`) holds."""
        return self._tokenizer

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a text prompt; BOS is added unless the text already starts with it (P-TMPL-5)."""
        return self.engine.encode_prompt(text)

    def _prepare_dict_prompt(self, prompt: dict[str, Any], name: str, truncated: bool) -> _Prepared:
        """A prompt dict's text, token ids and media; errors name it as `name` ("prompt" or "prompts[i]");
        `truncated` as for `_normalize_prompts`."""
        for key, value in prompt.items():
            vllm_key = VLLM_ONLY_PROMPT_KEYS.get(key)
            if vllm_key is not None and not vllm_key.changes_nothing(value, prompt):
                raise UnsupportedArgumentError(f"{name}.{key}: a key of vLLM's prompt dicts that Glimmer's do not "
                                               f"take; {vllm_key.instead}", param=f"{name}.{key}")
        unknown = sorted(map(str, set(prompt) - PROMPT_KEYS - set(VLLM_ONLY_PROMPT_KEYS)))
        if unknown:
            raise RequestError(f"{name}: unknown key(s) {unknown}; a prompt dict takes "
                               f"{', '.join(sorted(PROMPT_KEYS))}{_ENCODING_HINT if 'input_ids' in prompt else ''}",
                               param=name)
        if prompt.get("mm_processor_kwargs"):
            raise UnsupportedArgumentError(f"{name}.mm_processor_kwargs: not supported per prompt: image sizes are "
                                           "the checkpoint's processor settings; leave it out (or None, {})",
                                           param=f"{name}.mm_processor_kwargs")
        data = prompt.get("multi_modal_data")
        if data is None:
            data = {}
        elif not isinstance(data, Mapping):
            raise RequestError(f"{name}.multi_modal_data must be a dict of the media by kind, {{\"image\": ..., "
                               f"\"video\": ...}} (each an item or a list of items), not {type(data).__name__}",
                               param=f"{name}.multi_modal_data")
        unknown = sorted(map(str, set(data) - {"image", "video"}))
        if unknown:
            raise RequestError(f"multi_modal_data keys {unknown} are not supported; use 'image' and 'video'",
                               param=f"{name}.multi_modal_data")
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, list | tuple) or not all(map(is_token_id, ids)):
                hint = _ENCODING_HINT if isinstance(ids, Mapping) and "input_ids" in ids else ""
                raise RequestError(f"{name}.prompt_token_ids must be a list of token ids (integers){hint}",
                                   param=f"{name}.prompt_token_ids")
            images, videos = (self._loaded_urls(_as_list(data.get(kind), kind), kind)
                              for kind in ("image", "video"))
            ids, items = self.engine.prepare_token_prompt([operator.index(t) for t in ids], images, videos,
                                                          param=name)
            return prompt.get("prompt"), ids, items
        text = prompt.get("prompt")
        if not isinstance(text, str):
            raise RequestError(f"{name} needs a 'prompt' string or 'prompt_token_ids'", param=name)
        images, videos = (self._loaded_urls(_as_list(data.get(kind), kind), kind)
                          for kind in ("image", "video"))
        ids, items = self.engine.prepare_prompt(text, images, videos, truncated=truncated)
        return text, ids, items

    def _loaded_urls(self, items: list, kind: str) -> list:
        """multi_modal_data items with each data: URL decoded to its bytes and each http(s) URL fetched (when
        `allow_remote_media` allows it), as `chat` reads them (RequestError if one is malformed, disallowed or cannot be
        fetched); a file: URL becomes the path it names, read as a path is; paths, bytes, images and frames are left
        for the engine to open."""
        return [self._loaded_url(item, kind, index) if isinstance(item, str) else item
                for index, item in enumerate(items)]

    def _loaded_url(self, item: str, kind: str, index: int) -> Any:
        # not load_media_reference for a path or a file: URL: generate's multi_modal_data is the Python caller's own,
        # and a path in it is opened as given, which allowed_local_media_path (chat's guard on a request's paths) does
        # not govern
        scheme = url_scheme(item)
        if scheme in ("data", "http", "https"):
            return load_media_reference(item, kind, index, self.media_policy)
        return file_url_path(item, kind, index) if scheme == "file" else item

    def _normalize_prompts(self, listed: SequenceABC[PromptType], names: list[str],
                           truncated: SequenceABC[bool] | None = None) -> list[_Prepared]:
        """Each prompt's text, token ids and media (`listed` and `names` from `_listed_prompts`). `truncated[i]`:
        prompt i's truncate_prompt_tokens keeps only its last tokens, so that a text of any length is tokenized
        (`LLMEngine.check_prompt_chars`)."""
        out: list[_Prepared] = []
        for i, (prompt, name) in enumerate(zip(listed, names, strict=True)):
            cut = bool(truncated and truncated[i])
            with _naming_the_prompt(name):
                if isinstance(prompt, str):
                    out.append((prompt, self.engine.encode_prompt(prompt, truncated=cut), []))
                elif isinstance(prompt, list | tuple) and all(map(is_token_id, prompt)):
                    out.append((None, [operator.index(t) for t in prompt], []))
                elif isinstance(prompt, dict):
                    out.append(self._prepare_dict_prompt(prompt, name, cut))
                else:
                    raise RequestError(f"{name} is not a string, a list of token ids (integers) or a prompt dict",
                                       param=name)
        return out

    @method_takes_vllm_arguments(VLLM_ONLY_GENERATE_ARGUMENTS)
    def generate(
        self,
        prompts: PromptType | SequenceABC[PromptType],
        sampling_params: SamplingParams | SequenceABC[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for every prompt, batched continuously; outputs keep the prompts' order.

        `use_tqdm`, as vLLM's: True shows a progress bar of the prompts finished (on stderr), False none, and a
        callable makes the bar (`functools.partial(tqdm, leave=False)`: called with `total` and `desc`). None (the
        default) shows it unless the LLM was made with `progress=False`: vLLM's default, True, unless told quiet."""
        check_not_forked("LLM.generate")
        listed, names = _listed_prompts(prompts)
        count = len(listed)
        if sampling_params is None:
            params_list = [self.get_default_sampling_params()] * count
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * count
        else:
            if not isinstance(sampling_params, SequenceABC) or isinstance(sampling_params, str):
                raise RequestError("sampling_params must be a SamplingParams or a list of them (one per prompt), "
                                   f"not {type(sampling_params).__name__}", param="sampling_params")
            params_list = list(sampling_params)
            if len(params_list) != count:
                raise RequestError(f"sampling_params: {len(params_list)} for {count} prompts; give one, or "
                                   "one per prompt", param="sampling_params")
            _check_sampling_params(params_list)
        normalized = self._normalize_prompts(listed, names, [params.truncate_prompt_tokens is not None
                                                             for params in params_list])
        params_list = [_salted(params, prompt, name) for params, prompt, name in
                       zip(params_list, listed, names, strict=True)]
        return self._run("generate", normalized, params_list, use_tqdm, names)

    @method_takes_vllm_arguments(VLLM_ONLY_BEAM_SEARCH_ARGUMENTS)
    def beam_search(
        self,
        prompts: PromptType | SequenceABC[PromptType],
        params: BeamSearchParams,
        lora_request: Any = None,
        use_tqdm: bool | Callable[..., Any] | None = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """vLLM's beam search: per prompt (as `generate` takes them), a BeamSearchOutput of the `params.beam_width`
        best sequences, best first (see glimmer/engine/beam_search.py). Each step runs every live beam as a request
        for one token with `logprobs=2 * beam_width`; the prefix cache shares the prompt's and the beams' KV. A
        max_tokens past max_model_len ends the beams there, as in `generate`. `use_tqdm` (default False, as vLLM's)
        shows the prompts whose search ended. The arguments stand in vLLM's order, so that its positional calls
        (`beam_search(prompts, params, None, True)`) mean the same here; `lora_request` and `concurrency_limit` are
        taken at the values that change nothing (None) and otherwise refused saying what to do instead."""
        check_not_forked("LLM.beam_search")
        if not isinstance(params, BeamSearchParams):
            raise RequestError(f"params must be a BeamSearchParams(beam_width=..., max_tokens=...), not "
                               f"{type(params).__name__}", param="params")
        params.validate()
        listed, names = _listed_prompts(prompts)
        normalized = self._normalize_prompts(listed, names)
        stop_ids = params.stop_ids(self.engine.generation_defaults.stop_token_ids)
        step_params = params.step_params()
        searches, salted = [], []
        for (_, ids, _), prompt, name in zip(normalized, listed, names, strict=True):
            with _naming_the_prompt(name):
                budget = self.engine.generation_budget(len(ids), SamplingParams(max_tokens=params.max_tokens),
                                                       clamp_max_tokens=True)
            searches.append(BeamSearch(ids, params, stop_ids, budget))
            salted.append(_salted(step_params, prompt, name))
        warn_if_beams_recompute(self.engine)
        bar = self._progress_bar(use_tqdm, len(searches))
        try:
            while not all(search.done for search in searches):
                stepping = [(search, number, search.live_beams()) for number, search in enumerate(searches)
                            if not search.done]
                beams = [(None, beam, normalized[number][2]) for _, number, live in stepping for beam in live]
                # each beam's errors name its search's prompt, not the beam's place among the live ones
                outputs = iter(self._run("beam_search", beams,
                                         [salted[number] for _, number, live in stepping for _ in live],
                                         False, [names[number] for _, number, live in stepping for _ in live],
                                         generated=[search.steps for search, _, live in stepping for _ in live]))
                for search, _, live in stepping:
                    search.advance([next(outputs).outputs[0].logprobs[0] for _ in live])
                    bar.update(1 if search.done else 0)
        finally:
            bar.close()
        return [search.results(self.engine.tokenizer, self.engine.tokenizer.eos_token_id) for search in searches]

    def _run(self, call: str, prompts: list[_Prepared], params_list: list[SamplingParams],
             use_tqdm: bool | Callable[..., Any] | None, names: list[str],
             controller_factories: list[ControllerFactory | None] | None = None, generated: list[int] | None = None,
             hidden: list[frozenset[int]] | None = None,
             server_readings: list[list[_ServerReading]] | None = None) -> list[RequestOutput]:
        """Generate every prompt. As vLLM's offline LLM, a max_tokens past max_model_len ends the output there
        (finish_reason "length"); only a prompt with no room for one token is refused. Errors about a prompt
        name it as the caller does, `names[i]` ("prompt", "prompts[1]", "messages", ...); `call` is the method
        the caller called ("generate", "chat", "beam_search"), which a refusal names. `generated` and
        `hidden`, per prompt: LLMEngine.add_request's `generated` and `hidden_token_ids`; `server_readings`, per
        prompt: per completion, the reading of its turn, which reads every delta of it and ends it (aborted,
        finish_reason "abort") as soon as the server's chat would end it (`_ServerReading.ends_in`). Calls from
        several threads run one after another; a call made inside another on the same thread (from a `use_tqdm`
        callable) is refused, as it would wait for itself. Ctrl-C lands between queuing requests and between steps
        (`InterruptsBetweenSteps`), where no KV block is half taken or half freed."""
        if self._running is not None and self._running[0] == threading.get_ident():
            raise RuntimeError(f"LLM.{call} was called while LLM.{self._running[1]} runs on this LLM in the same "
                               "thread (from its use_tqdm callable?): make the call after that one returns")
        with self._run_lock, InterruptsBetweenSteps() as interrupts:
            self._running = (threading.get_ident(), call)
            try:
                return self._run_alone(prompts, params_list, use_tqdm, names, interrupts, controller_factories,
                                       generated, hidden, server_readings)
            finally:
                self._running = None

    def _run_alone(self, prompts: list[_Prepared], params_list: list[SamplingParams],
                   use_tqdm: bool | Callable[..., Any] | None, names: list[str], interrupts: InterruptsBetweenSteps,
                   controller_factories: list[ControllerFactory | None] | None,
                   generated: list[int] | None = None,
                   hidden: list[frozenset[int]] | None = None,
                   server_readings: list[list[_ServerReading]] | None = None) -> list[RequestOutput]:
        """`_run`, with no other call of this LLM stepping its engine; a Ctrl-C `interrupts` noted is raised after a
        request is queued or a step is taken in."""
        results: dict[str, RequestOutput] = {}
        readings: dict[str, list[_ServerReading]] = {}  # per request of server_readings, each completion's
        order = []
        factories = controller_factories or [None] * len(prompts)
        bar = self._progress_bar(use_tqdm, len(prompts))
        try:  # a request refused (or an interrupt) after others were queued aborts those too
            for i, ((text, ids, items), params, factory, name) in enumerate(
                    zip(prompts, params_list, factories, names, strict=True)):
                request_id = f"llm-{next(self._ids)}"
                arrival_time = time.time()
                # listed before it is queued: an interrupt (Ctrl-C) that lands once the engine holds the request,
                # before this call knows it, still aborts it (aborting an id never queued does nothing)
                order.append(request_id)
                with _naming_the_prompt(name):
                    ids, items = self.engine.truncate_prompt(ids, items, params)
                    self.engine.add_request(request_id, ids, params, items, factory, clamp_max_tokens=True,
                                            generated=generated[i] if generated else 0,
                                            hidden_token_ids=hidden[i] if hidden else frozenset())
                results[request_id] = RequestOutput(
                    request_id=request_id,
                    prompt=text,
                    prompt_token_ids=ids,
                    outputs=[CompletionOutput(index=i, text="", token_ids=[], finish_reason=None,
                                              logprobs=[] if params.logprobs is not None else None)
                             for i in range(params.n)],
                    metrics=RequestMetrics(arrival_time=arrival_time, last_token_time=arrival_time),
                )
                if server_readings:
                    readings[request_id] = server_readings[i]
                interrupts.check()
            while self.engine.has_unfinished_requests:
                deltas = self._step()
                received = time.time()
                for delta in deltas:
                    request = results[delta.request_id]
                    if request.outputs[delta.index].finished:  # ended below where the server ends it, in this step
                        continue
                    self._receive(request, delta, received, bar)
                    reading = readings.get(delta.request_id)
                    if reading is not None and reading[delta.index].ends_in(delta) and delta.finish_reason is None:
                        # the server's chat ends it there too, by the same abort (P-REQ-2, P-HDR-8)
                        for final in self.engine.abort(delta.request_id, delta.index):
                            self._receive(request, final, received, bar)
                interrupts.check()
        except BaseException:
            for request_id in order:
                self.engine.abort(request_id)
            raise
        finally:
            bar.close()
        return [results[r] for r in order]

    def _receive(self, request: RequestOutput, delta: StepDelta, received: float, bar: Any) -> None:
        """Add the engine's `delta` of `request`, received at `received`, to its completion; `bar` counts the request
        once all its completions ended."""
        request.metrics.record_delta(delta, received)
        out = request.outputs[delta.index]
        out.token_ids.extend(delta.token_ids)
        out.text += delta.text
        if out.logprobs is not None:
            out.logprobs.extend(PositionLogprobs(entry, self.engine.tokenizer) for entry in delta.logprobs)
        request.num_cached_tokens = delta.num_cached_tokens
        if delta.prompt_logprobs is not None and delta.index == 0:
            request.prompt_logprobs = [None if entry is None else PositionLogprobs(
                entry, self.engine.tokenizer) for entry in delta.prompt_logprobs]
        if delta.finish_reason is not None:
            out.finish_reason = delta.finish_reason
            out.stop_reason = delta.stop_reason
            if request.finished:
                request.metrics.finished_time = received
                bar.update(1)

    def _step(self) -> list[StepDelta]:
        """One engine step. A step that failed only by the requests' own fault (a constraint that failed while
        generating: ConstraintFailure) raises that RequestError, naming its field, as a refusal up front would; the
        StepError is its `__cause__`. Any other failure stays a StepError."""
        try:
            return self.engine.step()
        except StepError as exc:
            causes = [exc.cause_of(request_id) for request_id in exc.request_ids]
            if causes and all(isinstance(cause, RequestError) for cause in causes):
                raise causes[0] from exc
            raise

    def _progress_bar(self, use_tqdm: bool | Callable[..., Any] | None, total: int) -> Any:
        """The bar of `total` prompts that `use_tqdm` asks for (None: shown unless `progress=False`); a callable
        makes it. Raises RequestError naming `use_tqdm` for anything but a boolean, None or a callable, and for a
        callable whose result is no bar (it lacks `update` or `close`)."""
        if callable(use_tqdm):
            bar = use_tqdm(total=total, desc="Generating")
            missing = [name for name in ("update", "close") if not callable(getattr(bar, name, None))]
            if missing:
                raise RequestError(f"use_tqdm: the callable made a {type(bar).__name__!r}, which has no "
                                   f"{' or '.join(missing)} method; pass a callable that makes a tqdm bar (tqdm, "
                                   "functools.partial(tqdm, leave=False))", param="use_tqdm")
            return bar
        if use_tqdm is not None and not isinstance(use_tqdm, bool):
            raise RequestError(f"use_tqdm must be True, False, None or a callable that makes a tqdm bar, not "
                               f"{use_tqdm!r}", param="use_tqdm")
        shown = self.engine.config.progress if use_tqdm is None else use_tqdm
        return tqdm(total=total, desc="Generating", disable=not shown)

    @method_takes_vllm_arguments(VLLM_ONLY_CHAT_ARGUMENTS)
    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., Any] | None = None,  # third by position too, as in vLLM's LLM.chat
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        response_format: dict[str, Any] | None = None,
        thinking_token_budget: int | None = None,
        reasoning_effort: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool | str = False,
        allow_control_tokens_in_content: bool = False,
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
        `parallel_tool_calls=False` returns at most one call. A required or named `tool_choice` whose reply max_tokens
        cut short before its call was written raises ToolChoiceUnsatisfiedError (the server's 500, P-REQ-4) naming
        the choice and max_tokens to raise. The SamplingParams' `stop` strings end the answer
        only, as on the server (P-REQ-2): reasoning and tool calls may hold them; the answer is cut at the first
        (`ChatOutput.stop_string` names it), and so is the raw turn (`outputs[0]`), as vLLM's generation ends at a
        stop string: its text before the stop string (through it with `include_stop_str_in_output`), its tokens
        through the one the stop string ends in, the string as stop_reason and finish_reason "stop" (the engine's
        word, as vLLM's raw outputs; `ChatOutput.finish_reason` is the server's, "tool_calls" after calls). The engine
        reads each completion as it generates it and ends it at that token, as the server ends it (with `n` > 1,
        each its own); so it does at a header the model writes for another role (P-HDR-8) and, with
        `parallel_tool_calls=False`, at the first call, the raw turn ending at that token with finish_reason "stop"
        and no stop_reason. As on the server (P-REQ-1),
        the turn is generated with its special tokens, which the parser reads; `skip_special_tokens` then decides
        what the parsed reply shows: None (default) or True hides every special token but the framing, False
        hides none. A max_tokens past max_model_len ends the turn there (finish_reason "length"), as in vLLM.

        As vLLM's: `chat_template` is a template source to render with instead of the checkpoint's, or the name of
        one of the checkpoint's named templates (LLMEngine.named_chat_templates);
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
        only) makes it those tokens instead. `use_tqdm` is `generate`'s.
        """
        check_not_forked("LLM.chat")
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
            chat_template, self.engine.tokenizer, self.engine.max_prompt_chars, self.engine.named_chat_templates)
        plan = plan_tools(normalize_tools(tool_schemas(tools), check_schema=check_tool_parameters), tool_choice)
        strength = resolve_reasoning_strength(reasoning_effort=reasoning_effort,
                                              chat_template_kwargs=chat_template_kwargs)
        kwargs = {k: v for k, v in (chat_template_kwargs or {}).items() if k not in STRENGTH_KWARGS}
        if documents is not None:
            kwargs["documents"] = checked_documents(documents, template)
        rendering = ChatRendering(template, plan.render_tools, strength, kwargs, allow_control_tokens_in_content,
                                  ends_with_generation_prompt, continue_final_message)
        turns = {id(params): self._chat_turn(plan, params, response_format, parallel_tool_calls,
                                             thinking_token_budget, rendering.prompt_end) for params in requested}
        prepared: list[_Prepared] = []
        continued: list[FinalMessageTag | None] = []  # per conversation, the message its prompt ends inside
        for index, conversation in enumerate(conversations):
            which = index if len(conversations) > 1 else None  # one conversation's parts are named as they are
            if continue_final_message:
                check_final_message_is_the_assistants(conversation, which)
            with _naming_the_conversation(which):
                _, rendered, final = render_conversation(conversation, rendering, self.engine.tokenizer)
            if final is not None:
                check_continued_call_is_read(final, rendering, which)
                check_media_before_the_cut(conversation, final, which)
            continued.append(final)
            truncated = requested[index].truncate_prompt_tokens is not None
            try:  # before loading media, as the server checks it: a prompt too long is refused naming what made it so
                self.engine.check_prompt_chars(rendered.text, truncated=truncated)
            except PromptTextTooLongError as error:
                parts = prompt_text_parts(conversation, rendering, self.engine.tokenizer, {"documents": "documents"})
                raise error.naming(_in_conversation(parts, which)) from None
            images, videos = [], []
            # an item's error names its content part, in its conversation
            with _naming_the_conversation(which), naming_media_parts(conversation):
                for kind, reference in collect_media(conversation):
                    target = images if kind == "image" else videos
                    target.append(load_media_reference(reference, kind, len(target), self.media_policy))
                ids, items = self.engine.prepare_prompt(rendered.text, images, videos, literals=rendered.literals,
                                                        truncated=truncated)
            prepared.append((rendered.display_text, ids, items))
        chat_turns = [turns[id(params)] for params in requested]
        # the special tokens a reply hides are left out of its text by the engine (before their bytes are decoded)
        hidden = [frozenset() if turn.skip_special_tokens is False else self.engine.tokenizer.hidden_in_replies
                  for turn in chat_turns]
        names = ["messages"] if len(prepared) == 1 else [f"messages[{i}]" for i in range(len(prepared))]
        # P-TMPL-8: a continued message's reply is read inside its channel, a tool's from the message's body
        readings = [{"tools": plan.parser_tools, "continue_recipient": final.recipient if final else None,
                     "continue_prefix": final.body if final else "", "verbatim_content": turn.constrained_answer}
                    for turn, final in zip(chat_turns, continued, strict=True)]
        # each completion ends where the server's chat ends it: at a stop string in its answer (P-REQ-2), at another
        # role's header (P-HDR-8), with parallel_tool_calls=False at the first call; its reply is what this reading
        # read (it is read once)
        server_readings = [[_ServerReading(reading, single_call=not parallel_tool_calls, stop=turn.stop,
                                           include_stop=turn.include_stop, min_tokens=turn.params.min_tokens)
                            for _ in range(turn.params.n)] for turn, reading in zip(chat_turns, readings, strict=True)]
        outputs = self._run("chat", prepared, [turn.params for turn in chat_turns], use_tqdm, names,
                            [turn.controller_factory for turn in chat_turns], hidden=hidden,
                            server_readings=server_readings)
        chats = []
        for number, (output, turn, servers) in enumerate(zip(outputs, chat_turns, server_readings, strict=True)):
            choices = []
            for completion, server in zip(output.outputs, servers, strict=True):
                pieces = _token_pieces(self.engine.tokenizer, completion.text, completion.token_ids, hidden[number])
                token_ends = list(itertools.accumulate(map(len, pieces)))
                # with min_tokens, a stop string counts if it ends past the min_tokens-th token's text
                armed_after = _armed_after(token_ends, turn.params.min_tokens, turn.stop)
                # the reply the server reads: what the model wrote after the point where it ends the reply (a call
                # made for an invented user turn, reasoning after the stop string) is no part of it
                deltas, reader = server.finish()
                parsed = ParsedOutput.from_deltas(deltas)
                breaks = _content_breaks(deltas) if turn.stop else []
                content, stop_string, stop_at = _cut_at_stop(parsed.content, turn.stop, turn.include_stop,
                                                             _unarmed_answer_characters(reader, armed_after), breaks)
                context_full = len(output.prompt_token_ids) + len(completion.token_ids) >= self.engine.max_model_len
                # `parallel_tool_calls=False`: the first call, as the server returns it under any tool_choice
                calls = list(parsed.tool_calls)[: None if parallel_tool_calls else 1]
                # the raw turn ends where the stop string ended the answer, as vLLM's generation ends at a stop string
                if stop_at is not None:
                    completion = _completion_ended_at_stop(completion, token_ends, reader.content_spans, stop_at,
                                                           stop_string, turn.include_stop)
                elif server.ended_by is not None:  # the raw turn ends at the token the server ends the reply at
                    tokens = bisect.bisect_left(token_ends, server.characters) + 1
                    completion = _completion_ended_by_the_server(completion, tokens, server.characters)
                choice = ChatOutput(parsed.reasoning, content, calls, replace(output, outputs=[completion]),
                                    stop_string=stop_string)
                where = f"choice {completion.index}" + (f" of conversation {number}" if len(conversations) > 1 else "")
                unsatisfied = plan.unsatisfied([call.name for call in calls], choice.finish_reason, where=where,
                                               context_full_at=self.engine.max_model_len if context_full else None)
                if unsatisfied is not None:  # P-REQ-4, as the server answers it
                    raise unsatisfied
                choices.append(choice)
            first = choices[0]
            output = replace(output, outputs=[choice.output.outputs[0] for choice in choices])
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
        if params.allowed_token_ids:
            raise RequestError(CHAT_ALLOWED_TOKEN_IDS_REFUSAL, param="allowed_token_ids")
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
                or not 0 <= thinking_token_budget <= MAX_THINKING_TOKEN_BUDGET):
            raise RequestError("thinking_token_budget: must be an integer from 0 to 2**64 - 1 (the grammar engine's "
                               "largest count); a budget past the context caps nothing", param="thinking_token_budget")
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


def _listed_prompts(prompts: PromptType | SequenceABC[PromptType]) -> tuple[SequenceABC[PromptType], list[str]]:
    """`generate`'s and `beam_search`'s prompts as a list (one prompt: a list of it), and what their errors call
    each, as the caller passed them ("prompt" for one, "prompts[i]" for one of a list); RequestError where they are
    neither."""
    if _is_single_prompt(prompts):
        return [prompts], ["prompt"]  # type: ignore[list-item]
    if not isinstance(prompts, SequenceABC) or isinstance(prompts, str):
        raise RequestError("prompts must be a string, a list of token ids, a prompt dict, or a list of them",
                           param="prompts")
    return prompts, [f"prompts[{i}]" for i in range(len(prompts))]


def _is_single_prompt(prompts: object) -> bool:
    """Whether `generate` was given one prompt (a string, a prompt dict or one list of token ids), not a list."""
    return isinstance(prompts, str | dict) or (
        isinstance(prompts, list | tuple) and bool(prompts) and all(map(is_token_id, prompts)))


@contextlib.contextmanager
def _naming_the_prompt(name: str) -> Iterator[None]:
    """Errors about the prompt (raised by the engine for chat messages or a prompt) re-raised naming `name`
    (`RequestError.naming_prompt`)."""
    try:
        yield
    except RequestError as error:
        renamed = error.naming_prompt(name)
        if renamed is error:
            raise
        raise renamed from error


def _in_conversation(parts: list[PromptPart], index: int | None) -> list[PromptPart]:
    """`parts` of the `index`-th of several conversations, named in it (`messages[index]`, `messages[index][j]`);
    None: one conversation, whose parts are named as they are."""
    if index is None:
        return parts
    return [PromptPart(_path_in_conversation(part.name, index), part.size, _path_in_conversation(part.param, index))
            for part in parts]


def _path_in_conversation(path: str, index: int) -> str:
    """`path` (`messages`, `messages[j]...`) in the `index`-th of several conversations, `messages[index]...`; a path
    outside the messages (`tools`) as it is."""
    if path == "messages" or path.startswith("messages["):
        return f"messages[{index}]{path.removeprefix('messages')}"
    return path


@contextlib.contextmanager
def _naming_the_conversation(index: int | None) -> Iterator[None]:
    """Errors about a message (`messages[j]...`) of the `index`-th of several conversations re-raised naming it
    `messages[index][j]...`, in message and param (they named message j of the first conversation); None: one
    conversation, whose errors name its messages as they are."""
    try:
        yield
    except RequestError as error:
        param = error.param or ""
        if index is None or not param.startswith("messages["):
            raise
        named = _path_in_conversation(param, index)
        message = str(error)
        error.args = (named + message.removeprefix(param) if message.startswith(param) else
                      f"messages[{index}]: {message}",)
        error.param = named
        raise


def _salted(params: SamplingParams, prompt: object, name: str) -> SamplingParams:
    """`params` with the `cache_salt` of a prompt dict (where vLLM takes it). Raises RequestError naming
    `name.cache_salt` for a salt that is no non-empty string, or that differs from `params.cache_salt`."""
    if not isinstance(prompt, Mapping) or prompt.get("cache_salt") is None:
        return params
    salt = prompt["cache_salt"]
    if not isinstance(salt, str) or not salt:
        raise RequestError(f"{name}.cache_salt must be a non-empty string", param=f"{name}.cache_salt")
    if params.cache_salt not in (None, salt):
        raise RequestError(f"{name}.cache_salt={salt!r} differs from its SamplingParams' cache_salt="
                           f"{params.cache_salt!r}; give one", param=f"{name}.cache_salt")
    return replace(params, cache_salt=salt)


def _refuse_rendering_arguments_in_kwargs(chat_template_kwargs: Mapping[str, Any]) -> None:
    """RequestError for an argument of `LLM.chat` given in its `chat_template_kwargs`, where vLLM's `LLM.chat` also
    reads it: the template never would, and a prompt rendered without it would be a silent wrong answer; and for a
    key that is no string, which no template variable is named by."""
    for key in chat_template_kwargs:
        if not isinstance(key, str):
            raise RequestError(f"chat_template_kwargs: the key {key!r} is no string; a template variable is named by "
                               "one", param="chat_template_kwargs")
    for name in RENDERING_ARGUMENT_NAMES:
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
        for j, message in enumerate(conversation if isinstance(conversation, list | tuple) else []):
            if isinstance(message, ChatOutput):  # as an OpenAI client sends its reply back, which this one is not
                where = f"messages[{j}]" if len(conversations) == 1 else f"messages[{i}][{j}]"
                raise RequestError(f"{where} is an LLM.chat reply (a ChatOutput), not a message; it goes back as "
                                   '{"role": "assistant", "content": reply.content, "reasoning": reply.reasoning, '
                                   '"tool_calls": [dataclasses.asdict(call) for call in reply.tool_calls]}',
                                   param=where)
    return conversations


def _as_list(value: Any, kind: str) -> list:
    """multi_modal_data's items of `kind`, as vLLM parses them: an item alone, or a list of them."""
    if value is None:
        return []
    if is_frames_with_metadata(value):
        return [value]  # one video as vLLM takes it, (frames, metadata), not two items
    if kind == "video" and is_frame_list(value):
        return [value]  # one video's frames, not a video a frame
    stacked = unstacked(value, kind)
    if stacked is not None:
        return stacked
    return list(value) if isinstance(value, list | tuple) else [value]
