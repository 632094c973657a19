"""vLLM's arguments that Glimmer's `SamplingParams` and `StructuredOutputsParams` do not take: each with the values
that change nothing, which are taken and dropped (a vLLM script passing its defaults runs as written), and what to do
instead, which a refusal of any other value says (`UnsupportedArgumentError`, a TypeError as Python's own for an
unknown argument)."""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from glimmer.default_model import model_location
from glimmer.errors import KV_CACHE_MEMORY_OPTION, UnsupportedArgumentError

ChangesNothing = Callable[[Any, Mapping[str, Any]], bool]
"""Whether an argument's value (given the other keyword arguments) changes nothing in Glimmer."""
Shaped = TypeVar("Shaped", bound=type)
Method = TypeVar("Method", bound=Callable[..., Any])


@dataclass(frozen=True)
class VllmArgument:
    """One of vLLM's arguments: which of its values change nothing here, and what to do instead of the others."""

    changes_nothing: ChangesNothing
    instead: str


def _only(*values: object) -> ChangesNothing:
    """Changes nothing at these values alone, compared with their type (True is not 1, nor 0 False)."""
    return lambda value, given: any(type(value) is type(expected) and value == expected for expected in values)


def _any_value(value: object, given: Mapping[str, Any]) -> bool:
    return True


def _none_or_empty(value: object, given: Mapping[str, Any]) -> bool:
    """Changes nothing left out or empty (a mapping of options: none given)."""
    return value is None or value == {}


def _names_every_one_of(*names: str) -> ChangesNothing:
    """Changes nothing when the list (vLLM's CORS methods) has `*` or names each of `names`."""
    return lambda value, given: "*" in value or {name.upper() for name in value} >= set(names)


def _best_of_changes_nothing(value: object, given: Mapping[str, Any]) -> bool:
    """None or n (1 without n): as many completions drawn as returned (the server's rule for /v1/completions too).
    A best_of below n is refused, as vLLM refused it (it cannot return n of fewer)."""
    return value is None or (type(value) is int and value == given.get("n", 1))


def _stream_interval_changes_nothing(value: object, given: Mapping[str, Any]) -> bool:
    return value is None or (type(value) is int and value >= 1)


def _max_logprobs_changes_nothing(value: object, given: Mapping[str, Any]) -> bool:
    """SamplingParams' own limit (imported here: sampling_params.py imports this module)."""
    from glimmer.engine.sampling_params import MAX_LOGPROBS

    return type(value) is int and value == MAX_LOGPROBS


def _tokenizer_changes_nothing(value: object, given: Mapping[str, Any]) -> bool:
    """None, or the model itself: the same string, or a path to the same file or directory (`./model/` for `model`,
    a str for a Path, the embedded model's directory for `glimmer-nano`)."""
    model = given.get("model")
    if value is None or value == model:
        return True
    if not isinstance(value, str | os.PathLike) or not isinstance(model, str | os.PathLike):
        return False
    tokenizer_path, model_path = model_location(value), model_location(model)
    return tokenizer_path.exists() and model_path.exists() and tokenizer_path.resolve() == model_path.resolve()


def _prefix_cache_reading_changes_nothing(value: object, given: Mapping[str, Any]) -> bool:
    """None (vLLM skips the cache for prompt_logprobs), or the same choice: Glimmer computes a prompt with
    prompt_logprobs in full and reads every other from the prefix cache."""
    return value is None or (type(value) is bool and value == (given.get("prompt_logprobs") is not None))


def _quantization_changes_nothing(value: object, given: Mapping[str, Any]) -> bool:
    """None, vLLM's 'compressed-tensors' for a checkpoint whose config.json says it is one, or its 'gguf' for a GGUF
    file (which vLLM sets itself for one): each read then as it is without the argument."""
    if value is None:
        return True
    if value not in ("compressed-tensors", "gguf") or not isinstance(given.get("model"), str | os.PathLike):
        return False
    if value == "gguf":
        from glimmer.checkpoint.gguf_file import is_gguf_path

        return is_gguf_path(model_location(given["model"]))
    from glimmer.checkpoint.compressed_tensors import is_compressed_tensors_config
    from glimmer.checkpoint.json_files import read_json_object
    from glimmer.checkpoint.resolve import resolve_checkpoint
    from glimmer.errors import GlimmerError

    try:
        path = resolve_checkpoint(given["model"], weights=False)
        raw = read_json_object(path / "config.json") if path.is_dir() else None
    except GlimmerError:
        return False
    return raw is not None and is_compressed_tensors_config(raw)


VLLM_ONLY_ARGUMENTS: dict[str, VllmArgument] = {
    "best_of": VllmArgument(_best_of_changes_nothing, (
        "not supported (vLLM samples best_of completions and returns the n of them most likely, so it refuses a "
        "best_of below n); leave it out or set it equal to n, or sample n=best_of completions with logprobs=0 and "
        "keep the best by CompletionOutput.cumulative_logprob")),
    "use_beam_search": VllmArgument(_only(False), (
        "beam search is LLM.beam_search(prompts, BeamSearchParams(beam_width=..., max_tokens=...)), as in vLLM since "
        "it left SamplingParams; leave it out here")),
    "length_penalty": VllmArgument(_only(1.0, 1), (
        "an option of beam search: pass it as BeamSearchParams(length_penalty=...) to LLM.beam_search; leave it out "
        "here")),
    "early_stopping": VllmArgument(_only(False), (
        "an option of beam search, which (as vLLM's BeamSearchParams) takes none: every beam runs to max_tokens or a "
        "stop id; leave it out")),
    "guided_decoding": VllmArgument(_only(None), (
        "pass it under vLLM's newer name, structured_outputs=StructuredOutputsParams(...), which takes "
        "GuidedDecodingParams' json, regex, choice, grammar or json_object")),
    "logits_processors": VllmArgument(_only(None, []), (
        "not supported (Python callbacks on every step's logits); logit_bias={token_id: bias} biases tokens, "
        "structured_outputs constrains the text")),
    "detokenize": VllmArgument(_only(True), "Glimmer always detokenizes (each CompletionOutput has its text and its "
                                           "token_ids); leave it out"),
    # Glimmer's text never has spaces between special tokens (P-REQ-1: vLLM's False); vLLM's True adds none either
    # with a fast tokenizer (every Muse checkpoint's tokenizer.json), whose decoder alone spaces tokens: byte-level
    # BPE puts nothing between them
    "spaces_between_special_tokens": VllmArgument(_only(True, False), (
        "True or False alone, and either changes nothing (Glimmer's text has no spaces between special tokens, as "
        "vLLM's has none with a byte-level tokenizer as Muse's); leave it out")),
    "output_kind": VllmArgument(_any_value, (
        "LLM.generate and LLM.chat return each request's final output (as vLLM's LLM does whatever output_kind "
        "says), so any value changes nothing")),
    "extra_args": VllmArgument(_only(None, {}), "not supported (it carries arguments to vLLM plugins); leave it out"),
    "thinking_token_budget": VllmArgument(_only(None, -1), (
        "in Glimmer an argument of LLM.chat, which bounds the reasoning of a chat reply: LLM.chat(messages, "
        "sampling_params, thinking_token_budget=N)")),
    "logprob_token_ids": VllmArgument(_only(None), (
        "not supported; logprobs=k gives the k most likely tokens' logprobs (k <= 20); to score given tokens after a "
        "prompt, end the prompt with each: llm.generate({'prompt_token_ids': ids + [token_id]}, "
        "SamplingParams(max_tokens=0, prompt_logprobs=0))[0].prompt_logprobs[-1].logprob")),
    "prompt_logprob_token_ids": VllmArgument(_only(None), (
        "not supported; prompt_logprobs=k gives each prompt token's own logprob and the k most likely at its "
        "position (RequestOutput.prompt_logprobs)")),
    "prompt_logprob_start": VllmArgument(_only(None, 0), "not supported; prompt_logprobs scores every prompt token: "
                                                        "slice RequestOutput.prompt_logprobs"),
    "flat_logprobs": VllmArgument(_only(False), (
        "Glimmer's logprobs are one flat list already, a TokenLogprobs(token_id, logprob, top, rank) per token, not "
        "vLLM's FlatLogprobs; leave it out")),
    "repetition_detection": VllmArgument(_only(None), (
        "not supported (vLLM ends a completion that repeats an N-gram); bound the length with max_tokens, or "
        "discourage repeats with repetition_penalty or frequency_penalty")),
    "stream_interval": VllmArgument(_stream_interval_changes_nothing, (
        "LLM.generate and LLM.chat return each request's final output, not a stream, so None or any interval "
        ">= 1 changes nothing; leave it out")),
    "skip_clone": VllmArgument(_only(False), ("an internal flag of vLLM that makes clone() a shallow copy; Glimmer's "
                                             "clone() always copies deeply; leave it out")),
    "skip_reading_prefix_cache": VllmArgument(_prefix_cache_reading_changes_nothing, (
        "not supported; Glimmer reads a prompt from the prefix cache unless prompt_logprobs is set (vLLM's default, "
        "None); a cache_salt of the request's own keeps it off the blocks other requests cached")),
    "routed_experts_prompt_start": VllmArgument(_only(0), ("Glimmer returns no expert routing (vLLM's "
                                                          "enable_return_routed_experts); leave it out")),
    "trace_decode_token_ids": VllmArgument(_only(None), (
        "not supported (vLLM emits these tokens instead of sampling); to score given tokens, end the prompt with "
        "them: llm.generate({'prompt_token_ids': ids + tokens}, SamplingParams(max_tokens=0, prompt_logprobs=0))")),
}
"""Arguments of vLLM's SamplingParams that Glimmer's does not take. The ones it shares with vLLM
(`include_stop_str_in_output`, `skip_special_tokens`, `prompt_logprobs`, `logit_bias`, ...) are its fields."""


_ONE_GRAMMAR_ENGINE = "Glimmer compiles every constraint with llguidance (vLLM's 'guidance' backend) and has no other"
_JSON_LAYOUT = ("not supported: Glimmer lays JSON out as json.dumps writes it (', ' and ': ', no other whitespace) "
                "whatever the schema; leave it out")
VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS: dict[str, VllmArgument] = {
    "disable_any_whitespace": VllmArgument(_only(False), _JSON_LAYOUT),
    "whitespace_pattern": VllmArgument(_only(None), _JSON_LAYOUT),
    "disable_additional_properties": VllmArgument(_only(False), (
        "not supported; write \"additionalProperties\": false into the schema's objects")),
    "structural_tag": VllmArgument(_only(None), (
        "not supported; for tool calls declare the tools (LLM.chat(..., tools=..., tool_choice='required')), whose "
        "calls are then valid by construction; for other text give json, regex, choice or grammar")),
    # vLLM's GuidedDecodingParams', which structured_outputs replaces (see guided_decoding above)
    "backend": VllmArgument(_only(None), f"{_ONE_GRAMMAR_ENGINE}; leave it out"),
    "disable_fallback": VllmArgument(_only(True, False), (
        "True or False alone, and either changes nothing (Glimmer has one grammar engine and never falls back to "
        "another: a schema it cannot compile is refused); leave it out")),
}
"""Arguments of vLLM's StructuredOutputsParams (and GuidedDecodingParams) that Glimmer's does not take. `json`,
`regex`, `choice`, `grammar` and `json_object` are its fields."""


def takes_vllm_arguments(vllm_only: Mapping[str, VllmArgument]) -> Callable[[Shaped], Shaped]:
    """A decorator of a dataclass whose construction takes the keyword arguments of vLLM's class of that name as
    `vllm_only` says: each is dropped where its value changes nothing, and refused with what to do instead
    otherwise; any other unknown argument is refused naming the closest field. A dropped value never reaches the
    dataclass' __init__, so the instance holds its fields alone (dataclasses.replace, copy and pickle see only
    those). Setting an attribute after construction follows the same rule: `params.logits_processors = [...]` (or a
    misspelled field) would otherwise be a new attribute nothing reads. A keyword-only dataclass (`kw_only=True`)
    refuses arguments given by position with a TypeError saying so."""

    def decorate(cls: Shaped) -> Shaped:
        dataclass_init = cls.__init__
        names = [f.name for f in fields(cls)]
        keyword_only = all(f.kw_only for f in fields(cls))

        @functools.wraps(dataclass_init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if args and keyword_only:
                raise TypeError(f"{cls.__name__} takes keyword arguments only ({cls.__name__}({names[0]}=..., "
                                f"{names[1]}=...)), not {len(args)} by position: vLLM's {cls.__name__} orders its "
                                "arguments otherwise, so a value by position would mean another argument there")
            dataclass_init(self, *args, **glimmer_arguments(cls.__name__, names, vllm_only, kwargs))

        def __setattr__(self: Any, name: str, value: Any) -> None:
            if name in names or name.startswith("_"):
                object.__setattr__(self, name, value)
            else:  # vLLM's argument at a value that changes nothing is dropped, as at construction; else refused
                glimmer_arguments(cls.__name__, names, vllm_only, {**{n: getattr(self, n) for n in names},
                                                                     name: value})

        cls.__init__ = __init__
        cls.__setattr__ = __setattr__
        return cls

    return decorate


def glimmer_arguments(callee: str, known: list[str], vllm_only: Mapping[str, VllmArgument], kwargs: dict[str, Any]
                       ) -> dict[str, Any]:
    """`kwargs` without vLLM's arguments that change nothing. Raises UnsupportedArgumentError naming the first
    argument that is no field of `cls`: with Glimmer's way to do it for one of vLLM's, with the closest field or
    vLLM argument for a misspelled one."""
    taken = {}
    for name, value in kwargs.items():
        if name in known:
            taken[name] = value
            continue
        argument = vllm_only.get(name)
        if argument is not None and argument.changes_nothing(value, kwargs):
            continue
        if argument is not None:
            raise UnsupportedArgumentError(f"{name}: an argument of vLLM's {callee} that Glimmer's does not "
                                           f"take; {argument.instead}", param=name)
        close = difflib.get_close_matches(name, [*known, *vllm_only], n=1)  # vLLM's taken ones are misspelled too
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnsupportedArgumentError(f"{name}: {callee} has no argument {name!r}; {hint}its arguments are "
                                       f"{', '.join(known)}", param=name)
    return taken


def method_takes_vllm_arguments(vllm_only: Mapping[str, VllmArgument]) -> Callable[[Method], Method]:
    """A method of `LLM` (`generate`, `chat`) that also takes vLLM's arguments of the same method that Glimmer's has
    no parameter for, as `takes_vllm_arguments` does for a dataclass: dropped where the value changes nothing, else
    refused with what to do instead; any other unknown keyword is refused naming the closest parameter."""

    def decorate(method: Method) -> Method:
        signature = inspect.signature(method)
        known = [name for name in signature.parameters if name != "self"]
        # vLLM's arguments the method names among its own parameters, to keep vLLM's positional order (beam_search's
        # lora_request): taken by position or name, and checked as the others are
        own_vllm_only = {name: vllm_only[name] for name in known if name in vllm_only}

        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            callee = f"{type(self).__name__}.{method.__name__}"
            taken = glimmer_arguments(callee, known, vllm_only, kwargs)
            if own_vllm_only:
                try:
                    given = signature.bind_partial(self, *args, **taken).arguments
                except TypeError:  # the call itself names what is wrong with its arguments
                    given = {}
                glimmer_arguments(callee, [], own_vllm_only,
                                  {name: given[name] for name in own_vllm_only if name in given})
            return method(self, *args, **taken)

        return wrapper  # type: ignore[return-value]

    return decorate


_LORA = VllmArgument(_only(None), "LoRA adapters are not supported (the checkpoint's weights serve every request); "
                                  "leave it out")
_TOKENIZATION_KWARGS = VllmArgument(_none_or_empty, (
    "not supported: prompts are tokenized as the checkpoint's tokenizer does (no truncation); tokenize yourself "
    "(llm.get_tokenizer()) and pass {'prompt_token_ids': ids}"))
VLLM_ONLY_GENERATE_ARGUMENTS: dict[str, VllmArgument] = {
    "lora_request": _LORA,
    "prompt_adapter_request": VllmArgument(_only(None), "prompt adapters are not supported; leave it out"),
    "priority": VllmArgument(lambda value, given: value is None or (
        isinstance(value, list | tuple) and all(type(p) is int and p == 0 for p in value)), (
        "scheduling priorities are not supported (requests are served first come, first served); leave it out")),
    "tokenization_kwargs": _TOKENIZATION_KWARGS,
    # older vLLM's, since removed there
    "prompt_token_ids": VllmArgument(_only(None), (
        "vLLM's older way to pass token ids; pass them as the prompts: generate([ids, ...]) or "
        "generate({'prompt_token_ids': ids})")),
    "guided_options_request": VllmArgument(_only(None), (
        "vLLM's older way to constrain the text; pass SamplingParams(structured_outputs=StructuredOutputsParams("
        "json=..., regex=..., choice=... or grammar=...))")),
}
"""Arguments of vLLM's `LLM.generate` that Glimmer's does not take."""
VLLM_ONLY_CHAT_ARGUMENTS: dict[str, VllmArgument] = {
    "lora_request": _LORA,
    "chat_template_content_format": VllmArgument(_only("auto"), (
        "Glimmer hands the template each message's content as it is given (a string, or OpenAI content parts), "
        "which the Muse template reads either way; leave it out (or 'auto')")),
    "mm_processor_kwargs": VllmArgument(_none_or_empty, (
        "not supported per call: image sizes are the checkpoint's processor settings (or the server's "
        "--max-image-pixels); leave it out")),
    "tokenization_kwargs": _TOKENIZATION_KWARGS,
}
"""Arguments of vLLM's `LLM.chat` that Glimmer's does not take (`documents`, `chat_template`, `tools`, ... it takes)."""
VLLM_ONLY_BEAM_SEARCH_ARGUMENTS: dict[str, VllmArgument] = {
    "lora_request": _LORA,
    "concurrency_limit": VllmArgument(_only(None), (
        "Glimmer searches every prompt's beams in the same engine steps; pass fewer prompts per call to bound the "
        "batch, and leave it out")),
}
"""Arguments of vLLM's `LLM.beam_search` that Glimmer's does not take."""


def _ignore_patterns_change_nothing(value: object, given: Mapping[str, Any]) -> bool:
    """None, or patterns (one, or a list) that each hold a `/`: they match files in a subfolder alone (vLLM's default
    'original/**/*', a Llama checkpoint's second copy), and Glimmer reads only the weight files of the checkpoint's
    top folder."""
    patterns = [value] if isinstance(value, str) else value
    return value is None or (isinstance(patterns, list | tuple) and all(
        isinstance(pattern, str) and "/" in pattern for pattern in patterns))


def _structured_outputs_config_changes_nothing(value: object, given: Mapping[str, Any]) -> bool:
    """vLLM's structured_outputs_config left out (None, LLM's default), or with its backend 'auto' or 'guidance'
    (Glimmer's llguidance) and its other fields at their defaults, or disable_fallback either way (there is no other
    engine to fall back to)."""
    defaults = {"backend": ("auto", "guidance"), "disable_fallback": (True, False),
                "disable_any_whitespace": (False,), "disable_additional_properties": (False,)}
    return value is None or isinstance(value, dict) and all(key in defaults and any(
        type(field) is type(allowed) and field == allowed for allowed in defaults[key]) for key, field in value.items())


_GUIDED_DECODING_BACKEND = VllmArgument(_only(None, "auto", "guidance"), (
    f"{_ONE_GRAMMAR_ENGINE}; leave it out, or 'auto' or 'guidance'"))
_STRUCTURED_OUTPUTS_CONFIG = VllmArgument(_structured_outputs_config_changes_nothing, (
    f"{_ONE_GRAMMAR_ENGINE} and lays JSON out as json.dumps writes it: give backend 'auto' or 'guidance', "
    "disable_fallback either way, disable_any_whitespace and disable_additional_properties false, or leave it "
    "out"))
_LORA_OPTION = VllmArgument(_any_value, (
    "an option of enable_lora, which Glimmer takes only as False (as vLLM, it changes nothing without LoRA); "
    "LoRA adapters are not supported: merge the adapter into the weights and pass that checkpoint"))
_GENERATIVE_ONLY = "Glimmer runs generative models only, not vLLM's pooling runner; leave it out"


_DECODER_ONLY = VllmArgument(_only(None), (
    "Muse Glimmer is decoder-only: give the prompt alone as a string, token ids or a prompt dict"))
VLLM_ONLY_PROMPT_KEYS: dict[str, VllmArgument] = {
    "multi_modal_uuids": VllmArgument(_none_or_empty, (
        "Glimmer identifies each image and video by its content (the prefix and encoder caches hash it), so a cached "
        "item is not named by an id; give the media in multi_modal_data and leave it out")),
    "prompt_embeds": VllmArgument(_only(None), (
        "not supported: prompts are text or token ids, with images and videos in multi_modal_data; leave it out")),
    "token_type_ids": VllmArgument(_only(None), (
        "Glimmer runs generative models only, which read no token types (vLLM's cross-encoders do); leave it out")),
    "encoder_prompt": _DECODER_ONLY,
    "decoder_prompt": _DECODER_ONLY,
}
"""Keys of vLLM's prompt dicts (`TextPrompt`, `TokensPrompt`, its encoder-decoder and embeddings prompts) that
Glimmer's do not take (PROMPT_KEYS are those it does)."""


def _level_1_to_3(value: object) -> bool:
    """vLLM's compilation level (or mode, or optimization level) 1, 2 or 3, which change no output here."""
    return type(value) is int and 1 <= value <= 3


_DOWNLOAD_REVISION = ("download the revision first (hf download MODEL --revision R) and pass its "
                      "directory")
_ONE_GPU = ("Glimmer runs a model on one device (multi-GPU serving goes through an existing distributed engine); "
            "leave it out or 1")
VLLM_ONLY_LLM_ARGUMENTS: dict[str, VllmArgument] = {
    "tensor_parallel_size": VllmArgument(_only(None, 1), _ONE_GPU),
    "pipeline_parallel_size": VllmArgument(_only(None, 1), _ONE_GPU),
    "trust_remote_code": VllmArgument(_only(True, False), (
        "Glimmer never runs a checkpoint's Python code; leave it out")),
    "tokenizer": VllmArgument(_tokenizer_changes_nothing, (
        "the tokenizer is read from the model's directory (tokenizer.json, or a GGUF's own); leave it out")),
    "tokenizer_mode": VllmArgument(_only("auto"), "the tokenizer is the checkpoint's tokenizer.json (the "
                                                  "`tokenizers` library); leave it out"),
    "quantization": VllmArgument(_quantization_changes_nothing, (
        "a quantized checkpoint is read by its format (GGUF, MLX, compressed-tensors NVFP4 by its "
        "quantization_config); leave it out, or pass 'compressed-tensors' with a compressed-tensors NVFP4 "
        "checkpoint or 'gguf' with a GGUF model")),
    "kv_cache_dtype": VllmArgument(_only("auto"), "the KV cache holds the model's dtype; leave it out"),
    "swap_space": VllmArgument(lambda value, given: isinstance(value, int | float) and not isinstance(value, bool)
                               and 0 <= value < math.inf, (
        "a number of GiB, 0 or more (Glimmer recomputes preempted requests instead of swapping them, so any such "
        "number changes nothing); leave it out")),
    "num_gpu_blocks_override": VllmArgument(_only(None), (
        f"Glimmer sizes the KV cache in bytes, not blocks: give {KV_CACHE_MEMORY_OPTION}, N "
        "blocks being N x block_size tokens of keys and values; leave it out")),
    "cpu_offload_gb": VllmArgument(_only(0, 0.0), "weights are not offloaded to the CPU; leave it out"),
    "max_seq_len_to_capture": VllmArgument(lambda value, given: value is None or (type(value) is int and value >= 1), (
        "a context length (a positive integer), which changes nothing: CUDA graphs cover every context length "
        "(max_model_len); leave it out")),
    "enable_chunked_prefill": VllmArgument(_only(None, True), (
        "prefills are always chunked (max_num_batched_tokens tokens a step); leave it out")),
    "disable_log_stats": VllmArgument(_only(True, False), (
        "Glimmer logs no periodic statistics to turn off (`glimmer serve` exports its metrics at /metrics); leave it "
        "out")),
    "disable_custom_all_reduce": VllmArgument(_only(True, False), _ONE_GPU),
    "limit_mm_per_prompt": VllmArgument(_none_or_empty, (
        "set media limits with media_limits=MediaLimits(...) (glimmer.multimodal.settings)")),
    "hf_overrides": VllmArgument(_none_or_empty, (
        "not supported: the checkpoint's config.json is read as it is (a wrong field is refused, never patched); "
        "edit a copy of the checkpoint's config instead")),
    "revision": VllmArgument(_only(None), _DOWNLOAD_REVISION),
    "tokenizer_revision": VllmArgument(_only(None), _DOWNLOAD_REVISION),
    "code_revision": VllmArgument(_only(None), "Glimmer never runs a checkpoint's Python code; leave it out"),
    "download_dir": VllmArgument(_only(None), (
        "a Hub model is downloaded to the Hugging Face cache (set HF_HUB_CACHE to move it), or download it yourself "
        "(hf download MODEL --local-dir DIR) and pass the directory")),
    "hf_token": VllmArgument(_only(None, True), "log in (hf auth login) or set HF_TOKEN in the environment"),
    "max_logprobs": VllmArgument(_max_logprobs_changes_nothing, (
        "Glimmer's limit on SamplingParams(logprobs=k) is fixed at vLLM's default, 20; leave it out")),
    "logprobs_mode": VllmArgument(_only("raw_logprobs"), (
        "Glimmer's logprobs are the model's own, before temperature, penalties and filtering (vLLM's default, "
        "'raw_logprobs'); leave it out")),
    "enable_lora": VllmArgument(_only(False), "LoRA adapters are not supported; merge the adapter into the weights "
                                              "and pass that checkpoint"),
    "max_lora_rank": _LORA_OPTION,
    "max_loras": _LORA_OPTION,
    "max_cpu_loras": _LORA_OPTION,
    "fully_sharded_loras": _LORA_OPTION,
    "lora_dtype": _LORA_OPTION,
    "enable_sleep_mode": VllmArgument(_only(False), "LLM.sleep is not supported; leave it out"),
    "skip_tokenizer_init": VllmArgument(_only(False), "Glimmer always loads the checkpoint's tokenizer (chat and "
                                                      "stop strings need it); leave it out"),
    "distributed_executor_backend": VllmArgument(_only(None, "mp", "uni"), (
        "Glimmer runs a model on one device, in this process (multi-GPU serving goes through an existing distributed "
        "engine); leave it out, or 'mp' or 'uni'")),
    "data_parallel_size": VllmArgument(_only(None, 1), _ONE_GPU),
    "enable_expert_parallel": VllmArgument(_only(False), (
        "Glimmer runs a model on one device (multi-GPU serving goes through an existing distributed engine), and "
        "Muse Glimmer is dense, with no experts; leave it out")),
    # vLLM's LLM takes a level alone as an int too (compilation_config=3)
    "compilation_config": VllmArgument(lambda value, given: _none_or_empty(value, given) or _level_1_to_3(value) or (
        isinstance(value, dict) and all(key in ("level", "mode") and _level_1_to_3(level)
                                        for key, level in value.items())), (
        "Glimmer compiles with its own settings, so vLLM's level (or mode) 1, 2 or 3 alone changes nothing, as -O1 "
        "to -O3; for level 0 (no CUDA graphs) pass enforce_eager=True (--enforce-eager)")),
    "served_model_name": VllmArgument(_any_value, "the name the server reports; the offline LLM has none to set, so "
                                                  "any value changes nothing"),
    "mm_processor_kwargs": VllmArgument(_none_or_empty, (
        "not supported: image sizes are the checkpoint's processor settings; leave it out")),
    "override_generation_config": VllmArgument(_none_or_empty, (
        "give the values in SamplingParams or in each request's sampling fields (or generation_config='vllm', "
        "--generation-config vllm, to ignore the checkpoint's generation_config.json)")),
    "optimization_level": VllmArgument(lambda value, given: _level_1_to_3(value), (
        "1, 2 or 3 alone, and each changes nothing (Glimmer runs its own kernels and, on CUDA, replays captured "
        "decode graphs at any level); for vLLM's level 0 (-O0, no CUDA graphs) pass enforce_eager=True "
        "(--enforce-eager)")),
    "cuda_graph_sizes": VllmArgument(lambda value, given: value is None or (isinstance(value, list | tuple) and all(
        type(size) is int and size >= 1 for size in value)), (
        "batch sizes (positive integers), which change no output: Glimmer captures decode graphs for its own batch "
        "sizes up to max_num_seqs; leave it out")),
    "max_cudagraph_capture_size": VllmArgument(lambda value, given: value is None or (
        type(value) is int and value >= 1), (
        "a batch size (a positive integer), which changes no output: Glimmer captures decode graphs for its own "
        "batch sizes up to max_num_seqs; leave it out")),
    "max_num_partial_prefills": VllmArgument(_only(1), (
        "not supported: a step's max_num_batched_tokens go to the running sequences first, then to as many waiting "
        "prompts (whole, or a chunk) as fit; leave it out or 1")),
    "max_long_partial_prefills": VllmArgument(_only(1), (
        "an option of max_num_partial_prefills, which Glimmer does not take; leave it out or 1")),
    "long_prefill_token_threshold": VllmArgument(_only(0), (
        "an option of max_num_partial_prefills, which Glimmer does not take; leave it out or 0")),
    "attention_backend": VllmArgument(lambda value, given: value is None or isinstance(value, str), (
        "a backend's name, which changes nothing: Glimmer runs its own attention kernels (their plain torch "
        "reference on the CPU); leave it out")),
    "disable_sliding_window": VllmArgument(_only(False), (
        "not supported: Muse Glimmer's sliding-window layers are part of the model, and running them over the "
        "whole context would change its outputs; leave it out")),
    "disable_cascade_attn": VllmArgument(_only(True, False), (
        "True or False alone, and either changes nothing (Glimmer has no cascade attention); leave it out")),
    "enable_prompt_embeds": VllmArgument(_only(False), (
        "not supported: prompts are text, token ids, or chat messages with images and videos; leave it out")),
    "logits_processors": VllmArgument(_only(None, []), (
        "not supported (Python code on every step's logits); a request's logit_bias biases tokens, structured "
        "outputs constrain the text")),
    "use_tqdm_on_load": VllmArgument(_only(True, False), (
        "True or False alone, and either changes nothing but whether a loading bar shows (Glimmer's shows unless "
        "LLM(progress=False)); leave it out")),
    "prefix_caching_hash_algo": VllmArgument(lambda value, given: value in ("builtin", "sha256", "sha256_cbor"), (
        "'builtin', 'sha256' or 'sha256_cbor', which change no output: Glimmer keys its prefix cache by SHA-256 of "
        "each block's parent key, token ids and media whatever the name (engine/cache_keys.py); leave it out")),
    "calculate_kv_scales": VllmArgument(_only(False), (
        "an option of an fp8 KV cache, which Glimmer has not (the KV cache holds the model's dtype); leave it out")),
    "enable_eplb": VllmArgument(_only(False), (
        "Muse Glimmer is dense, with no experts to balance, and runs on one device; leave it out")),
    "kv_transfer_config": VllmArgument(_none_or_empty, (
        "not supported (the KV cache stays in this process: no disaggregated prefill); leave it out")),
    "ignore_patterns": VllmArgument(_ignore_patterns_change_nothing, (
        "Glimmer reads the weight files of the checkpoint's top folder (safetensors, or a GGUF) and skips none by "
        "pattern, so patterns of a subfolder (vLLM's default 'original/**/*') change nothing; to leave out a file "
        "of the top folder, pass a copy of the checkpoint without it")),
    "tokenizer_pool_size": VllmArgument(lambda value, given: type(value) is int and value >= 0, (
        "a number of tokenizer workers (0 or more), which changes no token: Glimmer tokenizes on the server's own "
        "threads; leave it out")),
    "task": VllmArgument(_only("auto", "generate"), "Glimmer runs generative models only; leave it out"),
    "convert": VllmArgument(_only("auto", "none"), _GENERATIVE_ONLY),
    "pooler_config": VllmArgument(_none_or_empty, _GENERATIVE_ONLY),
    "override_pooler_config": VllmArgument(_none_or_empty, _GENERATIVE_ONLY),
    # vLLM's structured outputs options (the server's too, among its serving options)
    "guided_decoding_backend": _GUIDED_DECODING_BACKEND,
    "structured_outputs_config": _STRUCTURED_OUTPUTS_CONFIG,
    "reasoning_parser": VllmArgument(_only(None, ""), (
        "LLM.chat reads the model's reasoning with its own channel parser (ChatOutput.reasoning) and a structured "
        "output constrains the answer after it, while LLM.generate constrains the raw text from its start (vLLM's "
        "parser would leave reasoning there free); leave it out")),
    "scheduling_policy": VllmArgument(_only("fcfs"), (
        "scheduling priorities are not supported: requests are served first come, first served (vLLM's 'fcfs'); "
        "leave it out or 'fcfs'")),
    "disable_async_output_proc": VllmArgument(_only(True, False), (
        "True or False alone, and either changes nothing (outputs are the same either way); leave it out")),
    "max_parallel_loading_workers": VllmArgument(lambda value, given: value is None or (
        type(value) is int and value >= 1), "a count of workers (None or >= 1), which changes no weight; leave it out"),
    "model_impl": VllmArgument(_only("auto"), "Glimmer runs its own Muse Glimmer model; leave it out or 'auto'"),
    "config_format": VllmArgument(_only("auto", "hf"), (
        "the config is the checkpoint's config.json (or a GGUF's metadata); leave it out or 'auto'")),
    "runner": VllmArgument(_only("auto", "generate"), "Glimmer runs generative models only; leave it out"),
}
"""Arguments of vLLM's `LLM(...)` (its engine arguments) that Glimmer's does not take; the ones it shares
(`dtype`, `max_model_len`, `gpu_memory_utilization`, `enforce_eager`, `seed`, ...) are `EngineConfig` fields."""


VLLM_SERVING_ARGUMENTS: dict[str, VllmArgument] = {
    "enable_auto_tool_choice": VllmArgument(_any_value, "tool calls are parsed under any tool_choice"),
    "tool_call_parser": VllmArgument(_any_value, "tool calls are parsed by the model's own ATEM parser"),
    "reasoning_parser": VllmArgument(_any_value, "reasoning is parsed by the model's own channel parser"),
    "disable_log_requests": VllmArgument(_any_value, "prompts and outputs are never logged"),
    "max_log_len": VllmArgument(_any_value, "prompts and outputs are never logged"),
    "disable_fastapi_docs": VllmArgument(_any_value, "no /docs pages are served"),
    "enable_prompt_tokens_details": VllmArgument(_any_value, "usage always has prompt_tokens_details"),
    "enable_log_requests": VllmArgument(_only(False), (
        "Glimmer never logs requests' prompts or outputs (/metrics counts requests and tokens); leave it out")),
    "response_role": VllmArgument(_only("assistant"), "replies always come from the assistant role; leave it out"),
    "allowed_methods": VllmArgument(_names_every_one_of("GET", "POST", "DELETE"), (
        "CORS allows the methods of Glimmer's routes (GET, POST, DELETE) to the --allowed-origins; leave it out")),
    "allowed_headers": VllmArgument(lambda value, given: "*" in value, (
        "CORS allows every request header (the OpenAI JS SDK sends X-Stainless-*) to the --allowed-origins; "
        "leave it out")),
    "allow_credentials": VllmArgument(_only(False), (
        "CORS never allows credentials (cookies): clients send the API key as `Authorization: Bearer KEY`; "
        "leave it out")),
    "return_tokens_as_token_ids": VllmArgument(_only(False), (
        "not supported: logprobs name each token by its text and bytes, as OpenAI's do; leave it out")),
    "chat_template_content_format": VLLM_ONLY_CHAT_ARGUMENTS["chat_template_content_format"],
    "guided_decoding_backend": _GUIDED_DECODING_BACKEND,
    "structured_outputs_config": _STRUCTURED_OUTPUTS_CONFIG,
    "enable_force_include_usage": VllmArgument(_only(False), (
        "not supported: a streamed reply ends with its usage where the request asks for it "
        "(stream_options: {\"include_usage\": true}), and a reply that is not streamed always has it; leave it out")),
    "disable_frontend_multiprocessing": VllmArgument(_any_value, "the server and the engine run in one process"),
    "tool_parser_plugin": VllmArgument(_any_value, "tool calls are parsed by the model's own ATEM parser"),
    "api_server_count": VllmArgument(_only(1), (
        "one server process serves the engine, in the same process; run more servers behind a load balancer, and "
        "leave it out or 1")),
    "headless": VllmArgument(_only(False), (
        "not supported: the engine runs inside the server's process (no engine-only node); leave it out")),
    "enable_log_outputs": VllmArgument(_only(False), (
        "Glimmer never logs requests' prompts or outputs (/metrics counts requests and tokens); leave it out")),
    "log_config_file": VllmArgument(_only(None), (
        "not supported: --log-level sets Glimmer's logging and --uvicorn-log-level uvicorn's; leave it out")),
    "enable_tokenizer_info_endpoint": VllmArgument(_only(False), (
        "not supported (no /tokenizer_info route): /tokenize and /detokenize are served, and the checkpoint's "
        "tokenizer.json is the tokenizer; leave it out")),
    "exclude_tools_when_tool_choice_none": VllmArgument(_any_value, (
        "tools are always left out of the prompt under tool_choice \"none\" (chat completions and /v1/responses)")),
    "lora_modules": VllmArgument(_only(None), (
        "LoRA adapters are not supported (the checkpoint's weights serve every request): merge the adapter into "
        "the weights (peft's merge_and_unload) and serve that checkpoint")),
    "enable_server_load_tracking": VllmArgument(_only(False), (
        "not supported (no /load route): /metrics has the running and waiting requests; leave it out")),
    "enable_ssl_refresh": VllmArgument(_only(False), (
        "not supported: the certificate is read when the server starts; restart it to serve a new one, and leave it "
        "out")),
}
"""Options of `vllm serve` beside its engine arguments that `glimmer serve` has no option for: Glimmer reads tool calls
and reasoning with the model's own protocol parser (ATEM), always and under any tool_choice; it never logs prompts;
it serves no /docs page; usage always has prompt_tokens_details."""


_NO_METRICS_SERVER = "run-batch serves no Prometheus metrics (vLLM's --enable-metrics address)"
VLLM_RUN_BATCH_ARGUMENTS: dict[str, VllmArgument] = {
    **{name: VLLM_SERVING_ARGUMENTS[name] for name in (
        "reasoning_parser", "disable_log_requests", "max_log_len", "enable_prompt_tokens_details",
        "enable_log_requests", "response_role")},
    "output_tmp_dir": VllmArgument(_any_value, "the records are written straight to --output-file, never uploaded"),
    "enable_force_include_usage": VllmArgument(_any_value, "every response of a batch has its usage"),
    "enable_metrics": VllmArgument(_only(False), (
        "run-batch serves no Prometheus metrics (`glimmer serve` serves /metrics); leave it out")),
    "url": VllmArgument(_any_value, _NO_METRICS_SERVER),
    "port": VllmArgument(_any_value, _NO_METRICS_SERVER),
}
"""Options of `vllm run-batch` beside its engine arguments that `glimmer run-batch` has no option for: those of
`vllm serve` it shares (VLLM_SERVING_ARGUMENTS), and its own, for uploading the output and serving metrics."""


_POOLING = ("Glimmer runs generative models only, not vLLM's pooling runner (embeddings, classification, reward or "
            "cross-encoder scores)")
VLLM_ONLY_LLM_METHODS: dict[str, str] = {
    "embed": _POOLING,
    "encode": f"{_POOLING}; tokenize with llm.get_tokenizer().encode(text)",
    "classify": _POOLING,
    "reward": _POOLING,
    "score": (f"{_POOLING}; a text's likelihood under the model is llm.generate({{'prompt_token_ids': ids}}, "
              "SamplingParams(max_tokens=0, prompt_logprobs=0))[0].prompt_logprobs"),
    "llm_engine": "Glimmer's engine is llm.engine (an LLMEngine: add_request, step, abort, stats())",
    "set_tokenizer": "the tokenizer is the checkpoint's own (tokenizer.json); pass a checkpoint directory with the "
                     "tokenizer you want",
    "get_metrics": "the engine's counters are llm.engine.stats() (the server exports its metrics at /metrics)",
    "reset_prefix_cache": "not supported; cache_salt='...' in SamplingParams keeps a request off blocks others cached",
    "sleep": "not supported; delete the LLM to free its memory",
    "wake_up": "not supported; delete the LLM to free its memory, and make a new one",
    "start_profile": "not supported; wrap the call in torch.profiler.profile()",
    "stop_profile": "not supported; wrap the call in torch.profiler.profile()",
    "collective_rpc": "Glimmer runs a model on one device, in this process: the model is llm.engine.loaded.model",
    "apply_model": "Glimmer runs a model on one device, in this process: call your function on "
                   "llm.engine.loaded.model",
}
"""Methods and attributes of vLLM's `LLM` that Glimmer's has not, with what to do instead: the AttributeError of
reading one says it."""
