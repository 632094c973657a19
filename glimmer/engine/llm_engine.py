"""The synchronous engine: requests in, step deltas out. `LLM` and the server both drive it.

Each `step()` schedules a batch (continuous batching: requests join and leave between steps), runs
it, samples, and turns new tokens into text deltas with stop handling. With speculative decoding a step
verifies the tokens proposed for each sequence and may yield several tokens per sequence (each its own
delta, stop rules applied token by token). Nothing here blocks on I/O; the async server calls `step()`
from one background thread.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from glimmer.cancellation import CancelToken
from glimmer.checkpoint.chat_template_source import ChatTemplateSource, find_checkpoint_chat_template
from glimmer.checkpoint.drafter import RELEASED_MASK_TOKEN, open_drafter_checkpoint
from glimmer.checkpoint.formats import open_checkpoint
from glimmer.checkpoint.generation_config import (
    GENERATION_CONFIG_FILE,
    GenerationDefaults,
    load_generation_defaults,
)
from glimmer.checkpoint.host_memory import check_kv_cache_fits_in_host_memory, kv_cache_room_in_host_memory
from glimmer.checkpoint.resolve import download_drafter, resolve_checkpoint
from glimmer.engine.bad_words import BadWordIds, bad_word_ids, banned_after
from glimmer.engine.completion_rules import (
    all_stop_ids,
    generation_budget,
    silent_stop_ids,
    stop_strings_armed,
    stop_token_ids,
    token_stop,
)
from glimmer.engine.config_checks import check_engine_config, check_weight_format
from glimmer.engine.cpu_threads import fit_threads_to_cpu_quota
from glimmer.engine.detokenizer import IncrementalDetokenizer
from glimmer.engine.draft_policy import draft_choices
from glimmer.engine.fork_guard import check_not_forked, mark_model_started
from glimmer.engine.grammar import ControllerFactory, GrammarCompiler, GrammarMasks
from glimmer.engine.kv_cache_manager import KVCacheLayout, KVCacheManager, page_geometry
from glimmer.engine.kv_planner import (
    CPU_DEFAULT_KV_BYTES,
    CPU_DEFAULT_KV_SIZING,
    CPU_HEADROOM_BYTES,
    DraftKV,
    KVDemand,
    block_bytes,
    cpu_default_kv_bytes,
    longest_context_held,
    plan_kv_layout,
    wanted_blocks,
)
from glimmer.engine.lookahead import LaunchedStep, runs_ahead
from glimmer.engine.model_loader import LoadedDrafter, LoadedModel, load_drafter, load_model, prepare_for_cpu
from glimmer.engine.model_runner import ModelRunner, StepLogits
from glimmer.engine.multimodal_inputs import MediaTokenIds, attach_media, refuse_stray_placeholders
from glimmer.engine.outputs import StepDelta
from glimmer.engine.proposers import DFlashProposer
from glimmer.engine.rejection_sampler import Proposal, verify
from glimmer.engine.sampler import PenaltyIds, SamplingRow, TokenLogprobs, sample, sample_on_device, seeded_generator
from glimmer.engine.sampling_params import SamplingParams
from glimmer.engine.scheduler import ScheduledStep, Scheduler, SchedulerConfig
from glimmer.engine.sequence import MultimodalItem, Sequence
from glimmer.engine.spec_decode import SpeculativeConfig, SpeculativeDecoder, check_verification_budget
from glimmer.engine.stop_strings import StopStringMatcher
from glimmer.engine.tokenizer import load_checkpoint_tokenizer
from glimmer.engine.working_memory import WorkingMemory, device_free_bytes, measure_working_memory
from glimmer.errors import (
    KV_CACHE_MEMORY_OPTION,
    CheckpointError,
    ConfigError,
    ConstraintFailure,
    GlimmerError,
    PromptTextTooLongError,
    RequestError,
    option_and_keyword,
)
from glimmer.multimodal import MediaLimits, MediaProcessor, checkpoint_media_settings
from glimmer.multimodal.placeholders import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from glimmer.protocol import ChatTemplate

logger = logging.getLogger(__name__)


def warn_of_default_repetition_penalty(defaults: GenerationDefaults, penalized: str, turn_off: str) -> None:
    """Warn, where the checkpoint's generation_config sets a repetition_penalty other than 1, that `penalized` (the
    requests that take the checkpoint's defaults) are penalized, and how to `turn_off` the penalty. Only the caller
    knows which requests those are: the server's that leave it out, `LLM`'s calls without SamplingParams under
    generation_config="auto", and none under "vllm"."""
    if (defaults.repetition_penalty or 1.0) != 1.0:
        logger.warning("%s sets repetition_penalty=%s: %s are penalized, which reads their prompt's ids every step "
                       "(somewhat slower decoding); %s", GENERATION_CONFIG_FILE, defaults.repetition_penalty,
                       penalized, turn_off)


def log_sampling_defaults(defaults: GenerationDefaults, takers: str, opt_out: str, *,
                          max_tokens_scope: str = "") -> None:
    """Say at start which of the checkpoint's sampling defaults `takers` (the requests or calls that leave a field
    out) are given, and how to `opt_out`, as vLLM logs that its generation config overrides its defaults; nothing
    where the checkpoint sets none. Only the caller knows who takes them (none under generation_config="vllm"), and
    `max_tokens_scope`, written after the max_tokens default, where only some of `takers` take that one."""
    fields = defaults.sampling_defaults()
    if fields:
        shown = [f"{name}={value}" + (f" {max_tokens_scope}" if name == "max_tokens" and max_tokens_scope else "")
                 for name, value in fields.items()]
        logger.info("%s take the checkpoint's sampling defaults: %s (%s)", takers, ", ".join(shown), opt_out)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_REPLAN_MARGIN_BYTES = 256 << 20  # taken off a KV cache sized again beyond the shortfall (`_working_shortfall`)
# left out of a GPU's first KV cache sizing for the kernels its first steps load (CUDA loads a kernel's module at its
# first launch, outside PyTorch's allocator): the 30B's start-up on an H200 kept 0.02-0.07 GiB beyond its plan for it
_KERNEL_LOADING_BYTES = 128 << 20
CUDA_MAX_NUM_SEQS, CPU_MAX_NUM_SEQS = 256, 64  # max_num_seqs when the config leaves it unset
# max_num_batched_tokens when the config leaves it unset, raised to max_num_seqs where that is more
CUDA_MAX_NUM_BATCHED_TOKENS, CPU_MAX_NUM_BATCHED_TOKENS = 8192, 2048


def _dtype_name(dtype: object) -> object:
    """`dtype` as EngineConfig keeps it: a name of `_DTYPES`, or None for the device's default. vLLM's spellings
    ("auto", "float", "half") and torch dtypes are taken; other names are left for `resolved_dtype` to refuse, and
    other types are refused here (ConfigError)."""
    if isinstance(dtype, torch.dtype):
        names = {value: name for name, value in _DTYPES.items()}
        if dtype not in names:
            raise ConfigError(f"dtype={dtype} is not supported; choose one of {sorted(_DTYPES)} (or 'auto')")
        return names[dtype]
    if isinstance(dtype, str):
        return {"auto": None, "float": "float32", "half": "float16"}.get(dtype, dtype)
    if dtype is not None:
        raise ConfigError(f"dtype={dtype!r} is not supported; pass one of {sorted(_DTYPES)}, 'auto' (or None), or "
                          "that torch dtype")
    return dtype


@dataclass
class EngineConfig:
    """How to load and run a model. `None` fields are derived from the model and the device."""

    model: str
    # float32 | bfloat16 | float16 (or that torch.dtype; float and half as vLLM spells them); None or "auto":
    # bfloat16 on CUDA, float32 on CPU
    dtype: str | torch.dtype | None = None
    device: str | None = None  # cpu | cuda | cuda:N; default cuda when available
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = 16  # None: vLLM's default (the platform's block size, 16 on CUDA), 16
    kv_cache_memory: int | str | None = None  # bytes ('8GiB' as text) for the KV cache; default from free memory
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool | None = True  # None: vLLM's default, on
    enforce_eager: bool = False  # on CUDA, do not replay decode steps from captured CUDA graphs
    # plain decode step N+1 is launched before step N's tokens are read (lookahead.py), and the text of step N's
    # tokens is made while step N+1 runs; default on CUDA (the CPU computes synchronously)
    async_scheduling: bool | None = None
    # auto: the checkpoint's weights; dummy: random weights from config.json alone; vLLM's safetensors, pt, gguf: auto,
    # for a checkpoint of that format (config_checks.VLLM_LOAD_FORMATS)
    load_format: str = "auto"
    seed: int | None = 0  # seeds the generator unseeded requests share (and dummy weights); None: a fresh one
    chat_template: str | None = None  # operator override file (P-TMPL-1)
    mmproj: str | None = None  # a GGUF model's vision projector file (images only)
    allow_pickle: bool = False  # read *.bin / *.pt weights, through torch.load(weights_only=True) only
    media_limits: MediaLimits = field(default_factory=MediaLimits)
    progress: bool = True
    # vLLM's shape: {"method": "dflash", "model": DIR, "num_speculative_tokens": 15, ...} (spec_decode.py)
    speculative_config: SpeculativeConfig | Mapping[str, Any] | str | None = None

    def __post_init__(self) -> None:
        self.dtype = _dtype_name(self.dtype)
        if self.enable_prefix_caching is None:  # vLLM's default for the engine argument: the prefix cache is on
            self.enable_prefix_caching = True
        if self.block_size is None:
            self.block_size = EngineConfig.block_size
        if self.seed is None:  # vLLM's seed=None: unseeded requests (and dummy weights) differ from run to run
            self.seed = random.SystemRandom().randrange(2**63)
        check_engine_config(self)

    def resolved_device(self) -> torch.device:
        name = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(name)
        except RuntimeError as exc:
            raise ConfigError(f"device={name!r} is not a valid torch device; use 'cpu', 'cuda' or 'cuda:N'") from exc
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} was requested but CUDA is not available here; use device='cpu'")
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise ConfigError(f"device={name!r} was requested but this machine has {count} CUDA device(s), "
                              f"cuda:0 to cuda:{count - 1} (CUDA_VISIBLE_DEVICES counts); choose one of them")
        if device.type not in ("cpu", "cuda"):
            raise ConfigError(f"device={name!r} is not supported; use 'cpu' or 'cuda'")
        return device

    def resolved_dtype(self, device: torch.device) -> torch.dtype:
        name = self.dtype or ("bfloat16" if device.type == "cuda" else "float32")
        if name not in _DTYPES:
            raise ConfigError(f"dtype={name!r} is not supported; choose one of {sorted(_DTYPES)} (or 'auto')")
        return _DTYPES[name]


class StepError(GlimmerError):
    """A step failed after it was scheduled. The state of `request_ids` is unknown, so the caller aborts them;
    the rest of the engine (other requests, the KV cache) is unharmed, and `deltas` holds what the step gave
    the other requests. `whole_batch`: the model or the sampler failed, not one sequence's own steering or
    bookkeeping, so the device itself may be at fault."""

    def __init__(self, request_ids: list[str], cause: BaseException, *, whole_batch: bool,
                 deltas: list[StepDelta] | None = None, causes: dict[str, Exception] | None = None):
        super().__init__(f"a step failed for {len(request_ids)} request(s): {type(cause).__name__}: {cause}")
        self.request_ids = request_ids
        self.whole_batch = whole_batch
        self.deltas = deltas or []
        self._causes = causes or {}
        self._cause = cause

    def cause_of(self, request_id: str) -> BaseException:
        """What failed `request_id`: its own steering or bookkeeping error where it had one, else the step's."""
        return self._causes.get(request_id, self._cause)


@dataclass(slots=True)  # one per token: no __dict__ to make
class _AcceptedToken:
    """A sampled token already appended to its sequence, whose text is not made yet (`_release_text`)."""

    seq: Sequence
    token: int
    logprobs: TokenLogprobs | None
    finish_reason: str | None
    stop_reason: int | None


@dataclass
class _Completion:
    """Output-side state of one sequence: text released so far, stop handling, logprobs."""

    detokenizer: IncrementalDetokenizer
    stops: StopStringMatcher
    min_tokens: int = 0
    # the request's own stop ids whose text is left out when one ends it (vLLM's include_stop_str_in_output=False);
    # special tokens stay in the text whatever ended the turn (P-TOK-3)
    silent_stop_ids: frozenset[int] = frozenset()
    num_tokens: int = 0  # released so far
    text: str = ""
    decoded_chars: int = 0  # the text decoded so far, `text` and what stop strings hold back or cut
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    num_prompt_tokens: int = 0
    # per prompt position when prompt logprobs were asked for (the first is None); delivered with the first delta
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    prompt_logprobs_sent: bool = False

    def take_prompt_logprobs(self) -> list[TokenLogprobs | None] | None:
        if self.prompt_logprobs is None or self.prompt_logprobs_sent:
            return None
        self.prompt_logprobs_sent = True
        return self.prompt_logprobs


@dataclass
class _StepOutcome:
    """What a step gives back as it appends tokens: deltas, the sequences it finished, and the requests whose
    own steering or bookkeeping failed (with the error)."""

    deltas: list[StepDelta] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    failures: dict[str, Exception] = field(default_factory=dict)
    _ending: set[int] = field(default_factory=set)  # ids of `finished`

    def end(self, seq: Sequence) -> None:
        """`seq` ends with this step (once, whichever stop comes first)."""
        if id(seq) not in self._ending:
            self._ending.add(id(seq))
            self.finished.append(seq)

    def ends(self, seq: Sequence) -> bool:
        return id(seq) in self._ending


def _going_on(seqs: list[Sequence], outcome: _StepOutcome) -> list[Sequence]:
    """Those of `seqs` that sampled this step and go on: not ended (by it or before) and not failed."""
    return [seq for seq in seqs
            if not seq.is_finished and not outcome.ends(seq) and seq.request_id not in outcome.failures]


def _whole_batch_error(seqs: list[Sequence], cause: Exception, outcome: _StepOutcome) -> StepError:
    """The error of a step whose model or sampler failed: every request of `seqs` is at fault."""
    failed = sorted({seq.request_id for seq in seqs} | set(outcome.failures))
    return StepError(failed, cause, whole_batch=True, deltas=[d for d in outcome.deltas if d.request_id not in failed],
                     causes=outcome.failures)


def _deltas_or_failure(outcome: _StepOutcome) -> list[StepDelta]:
    """A finished step's deltas; or, if some requests' own steering or bookkeeping failed, the error naming them
    (the others' deltas ride on it)."""
    if outcome.failures:
        cause = next(iter(outcome.failures.values()))
        raise StepError(sorted(outcome.failures), cause, whole_batch=False,
                        deltas=[d for d in outcome.deltas if d.request_id not in outcome.failures],
                        causes=outcome.failures) from cause
    return outcome.deltas


def _refuse_a_first_step_without_allowed_ids(params: SamplingParams, banned_words: BadWordIds,
                                             held_ids: frozenset[int]) -> None:
    """RequestError where the request's first token could be none of its `allowed_token_ids`: the words of one token
    ban theirs at every step, and min_tokens bans `held_ids` (`all_stop_ids`) at first (nothing would be left to
    sample; the sampler's row would be all -inf and its token id 0)."""
    by_words = set(banned_after(banned_words, ()))
    if by_words.issuperset(params.allowed_token_ids):
        raise RequestError("bad_words: bans every id of allowed_token_ids (words of one token are banned at every "
                           "step); allow an id no bad word is", param="bad_words")
    if not params.min_tokens or not held_ids.union(by_words).issuperset(params.allowed_token_ids):
        return
    raise RequestError("allowed_token_ids: with min_tokens it must hold an id that is no stop id (before min_tokens "
                       "tokens the request's and the checkpoint's stop ids may not be sampled, ignore_eos or not)"
                       + (" and that bad_words does not ban (a word of one token is banned at every step)"
                          if by_words.intersection(params.allowed_token_ids) else ""), param="allowed_token_ids")


def _refuse_an_unallowed_token(seq: Sequence) -> None:
    """The ConstraintFailure of a sequence whose next token could be none of its `allowed_token_ids`: the sampler never
    chooses an id it masks unless it masked every one (a row all -inf gives id 0). The first step is checked when the
    request is added (`_refuse_a_first_step_without_allowed_ids`); a later one is left without an id by a word of
    several tokens, whose last token is banned right after the output spells the rest of it."""
    longest = max((len(ids) for ids in seq.bad_word_ids), default=1)
    tail = seq.output_token_ids[len(seq.output_token_ids) - longest + 1:]
    raise ConstraintFailure(f"bad_words: after the output's tokens {tail}, the words ban every id of "
                            "allowed_token_ids that may follow them, leaving nothing to sample; allow an id no word "
                            "ends with, or leave out the word that spells those tokens", param="bad_words")


_BESIDE_A_GRAMMAR = (
    ("min_tokens", "decides where the text ends; drop min_tokens or the constraint"),
    ("allowed_token_ids", "decides which tokens may follow; drop one"),
    ("bad_words", "could force a banned token; drop one"),
)
"""Sampling fields `add_request` refuses beside a grammar over the output, and why."""


def _default_batch_limits(config: EngineConfig, on_cuda: bool) -> tuple[int, int]:
    """max_num_seqs and max_num_batched_tokens, each the device's default where left unset, except that a default
    never leaves a step's token budget below max_num_seqs (logged): each decoding sequence takes a token of a step's
    budget. So, as vLLM defaults them, a budget set alone lowers max_num_seqs' default and a max_num_seqs set alone
    raises the budget's (vLLM refuses a budget below max_num_seqs)."""
    device = "CUDA" if on_cuda else "CPU's"
    default_seqs, default_tokens = ((CUDA_MAX_NUM_SEQS, CUDA_MAX_NUM_BATCHED_TOKENS) if on_cuda else
                                    (CPU_MAX_NUM_SEQS, CPU_MAX_NUM_BATCHED_TOKENS))
    seqs, tokens = config.max_num_seqs, config.max_num_batched_tokens
    if not seqs:
        seqs = default_seqs if tokens is None else min(tokens, default_seqs)
        if seqs < default_seqs:
            logger.info("max_num_seqs=%d (max_num_batched_tokens; the %s default is %d), since each decoding sequence "
                        "takes a token of a step's budget", seqs, device, default_seqs)
    if not tokens:
        tokens = max(seqs, default_tokens)
        if tokens > default_tokens:
            logger.info("max_num_batched_tokens=%d (max_num_seqs; the %s default is %d), so that max_num_seqs "
                        "sequences can decode in one step", tokens, device, default_tokens)
    return seqs, tokens


class LLMEngine:
    def __init__(self, config: EngineConfig):
        check_not_forked("loading an engine")  # in a fork of a process that had loaded one it would hang
        self.config = config
        self.device = config.resolved_device()
        self.dtype = config.resolved_dtype(self.device)
        self.checkpoint_dir = resolve_checkpoint(config.model, weights=config.load_format != "dummy",
                                                 allow_pickle=config.allow_pickle)
        # a directory, or a GGUF file; with dummy weights only the config, tokenizer and template are read
        self.checkpoint = open_checkpoint(self.checkpoint_dir, mmproj=config.mmproj, allow_pickle=config.allow_pickle,
                                          weights=config.load_format != "dummy")
        check_weight_format(config.load_format, self.checkpoint.format, self.checkpoint_dir)
        self.max_model_len = self._resolve_max_model_len()  # before the weights load: a wrong one is refused at once
        # the tokenizer before the weights too: a drafter config without its mask token takes the target's token's id
        self.tokenizer = load_checkpoint_tokenizer(self.checkpoint, self.checkpoint.config)
        # generation_config.json too: a field refused was refused once the weights had loaded (minutes for the 30B);
        # the stop, bos and pad ids and the vocabulary it is checked against are config.json's, which loading keeps
        embedded = self.checkpoint.tokenizer
        self.generation_defaults: GenerationDefaults = load_generation_defaults(
            self.checkpoint_dir, self.checkpoint.config.text, self.tokenizer.token_to_id,
            embedded=embedded.generation_config if embedded is not None else None,
            tokenizer_eos_id=self.tokenizer.eos_token_id, id_to_token=self.tokenizer.id_to_token,
        )
        self.drafter: LoadedDrafter | None = None
        self.num_speculative_tokens = 0
        spec_config = None
        if config.speculative_config is not None:
            spec_config = SpeculativeConfig.parse(config.speculative_config)
            self.num_speculative_tokens = self._check_drafter_config(spec_config)
        if self.device.type == "cpu":  # before loading and the CPU path's timings, which the thread count changes
            fit_threads_to_cpu_quota()  # (sets the count, starts no thread; refuses an OMP_NUM_THREADS OpenMP ignores)
        mark_model_started()  # what follows starts the model's threads: forks of this process refuse engines
        self.loaded: LoadedModel = load_model(self.checkpoint, dtype=self.dtype, device=self.device,
                                              progress=config.progress, load_format=self._weights_load_format,
                                              seed=config.seed)
        on_cuda = self.device.type == "cuda"
        max_num_seqs, max_num_batched_tokens = _default_batch_limits(config, on_cuda)
        prepare_for_cpu(self.loaded.model, self.device, self.dtype, max_num_seqs)
        self.model_config = self.loaded.config
        self._eos_token_id = self.tokenizer.eos_token_id  # once: the property asks the tokenizer's backend each time
        text = self.model_config.text
        # the ids that are tokens: logit rows past the tokenizer's (a vocabulary padded to a multiple) are never
        # sampled, and no request may name them
        self.token_count = min(self.tokenizer.vocab_size, text.vocab_size)
        self.scheduler_config = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=self.max_model_len,
        )
        if spec_config is not None:
            self._load_drafter(spec_config)
        self.media = self._media_processor()
        self.media_token_ids = MediaTokenIds.resolve(self.model_config.image_token_id, self.model_config.video_token_id,
                                                     self.tokenizer.token_to_id)
        self._working: WorkingMemory | None = None  # measured when a GPU's free memory sizes the KV cache
        self._build_cache_and_runner(spec_config)
        shortfall = self._working_shortfall()
        if shortfall > 0:
            # start-up (graph capture, the products' workspaces, kernels loaded) kept more than planned: a cache that
            # much smaller, or the largest steps would run out of memory in service. The first budget less the
            # shortfall, not the free memory less it: what start-up keeps for good (loaded kernels, cuBLAS
            # workspaces) is already missing from the free memory, and was counted twice (an H100's 9.5 GB cache came
            # out 7.3 GB after a 0.70 GiB shortfall)
            budget = max(self._kv_budget - shortfall - _REPLAN_MARGIN_BYTES, 0)
            logger.warning("start-up kept %.2f GiB more device memory than planned beside the KV cache; sizing the "
                           "cache again, %.2f GiB smaller", shortfall / 2**30, (self._kv_budget - budget) / 2**30)
            self.runner = self.speculator = self.kv = None
            device_free_bytes(self.device)
            self._build_cache_and_runner(spec_config, budget=budget)
            still = self._working_shortfall()
            if still > 0:
                logger.warning("start-up still keeps %.2f GiB more device memory than planned beside the KV cache: "
                               "the largest steps may run out of memory; lower %s or give %s",
                               still / 2**30, option_and_keyword("--gpu-memory-utilization"),
                               KV_CACHE_MEMORY_OPTION)
        self.scheduler = Scheduler(self.scheduler_config, self.kv, self.speculator)
        self._chat_template: ChatTemplate | None = None
        self._chat_template_source: ChatTemplateSource | CheckpointError | None = None  # found, or why not
        self._grammars: GrammarCompiler | None = None
        self._grammars_lock = threading.Lock()
        self._grammar_masks: GrammarMasks | None = None
        # unseeded requests draw from one generator, in one launch a step (a seeded request has its own); its seed
        # is drawn from the engine's, so that it is not the stream of a request whose seed equals the engine's
        self._shared_generator = torch.Generator(self.device).manual_seed(
            int(torch.randint(0, 2**62, (1,), generator=seeded_generator(torch.device("cpu"), config.seed))))
        self._seqs: dict[str, list[Sequence]] = {}
        self._completions: dict[int, _Completion] = {}
        self.async_scheduling = config.async_scheduling if config.async_scheduling is not None else on_cuda
        self._unreleased: list[_AcceptedToken] = []
        self._launched: LaunchedStep | None = None  # a decode step running ahead of the host (lookahead.py)
        logger.info(
            "engine ready: %s on %s (%s), max_model_len=%d, KV cache: %s", self.checkpoint_dir, self.device,
            self.dtype, self.max_model_len, self.kv_layout.describe(),
        )
        logger.info("Maximum concurrency for %d tokens per request: %.2fx", self.max_model_len,
                    self.kv_layout.sequences_held(self.max_model_len))

    def _build_cache_and_runner(self, spec_config: SpeculativeConfig | None, budget: int | None = None) -> None:
        """Size and allocate the KV cache (in `budget` bytes where given), then the runner over it (its graphs
        captured) and the speculator. The budget spent is kept (`_kv_budget`): a second sizing starts from it."""
        text, demand = self.model_config.text, self._kv_demand()
        if budget is None:
            budget = self._kv_budget_bytes(block_bytes(text, self.dtype, demand), wanted_blocks(text, demand))
        self._kv_budget = budget
        self.kv_layout = self._plan_kv_cache(demand, budget)
        self.kv = KVCacheManager(self.kv_layout, enable_prefix_caching=self.config.enable_prefix_caching)
        capture = self.drafter.config.target_layer_ids if self.drafter else ()
        self.runner = ModelRunner(self.loaded.model, self.kv_layout, self.kv, self.device, self.dtype,
                                  max_num_seqs=self.scheduler_config.max_num_seqs,
                                  max_model_len=self.max_model_len, use_cuda_graphs=not self.config.enforce_eager,
                                  capture_layers=capture, query_lens=self._graph_query_lens(),
                                  progress=self.config.progress, token_count=self.token_count,
                                  encoder_cache_rows=self._encoder_cache_rows())
        self.speculator = None
        if self.drafter is not None:
            proposer = DFlashProposer(self.drafter.model, self.loaded.model, self.kv, self.device, self.dtype,
                                      max_num_seqs=self.scheduler_config.max_num_seqs, token_count=self.token_count,
                                      use_cuda_graphs=not self.config.enforce_eager, progress=self.config.progress)
            self.speculator = SpeculativeDecoder(spec_config, proposer, self.num_speculative_tokens, capture)

    def _encoder_cache_rows(self) -> int | None:
        """Vision feature rows the runner caches at most (None without vision): two full prefill chunks' worth, or
        the largest item, if more, so that a step's items are encoded once however it is chunked."""
        if self.media is None:
            return None
        return max(2 * self.scheduler_config.max_num_batched_tokens, self.media.largest_item_tokens())

    def _graph_query_lens(self) -> tuple[int, ...]:
        """Tokens per sequence of the decode-shaped steps the runner replays from graphs (ModelRunner)."""
        return tuple(1 + k for k in draft_choices(self.num_speculative_tokens))

    def _working_shortfall(self) -> int:
        """Bytes by which the memory left free once the engine started falls short of what was planned for its
        steps beside the KV cache (0 or less: none), where a GPU's free memory sized the cache."""
        if self._working is None:
            return 0
        return int(self._kept_free_bytes() + self._working.steps - device_free_bytes(self.device))

    def _kept_free_bytes(self) -> int:
        """What a GPU whose free memory sizes the KV cache keeps free besides the steps' working memory: the share
        `gpu_memory_utilization` leaves out, and the verification reserve."""
        total = torch.cuda.mem_get_info(self.device)[1]
        return int((1 - self.config.gpu_memory_utilization) * total) + self._speculation_reserve_bytes()

    # configuration ----------------------------------------------------------------------------------

    @property
    def _weights_load_format(self) -> str:
        """The loader's load format: "dummy", or "auto" for a format checked against the checkpoint's at start."""
        return "dummy" if self.config.load_format == "dummy" else "auto"

    def _resolve_max_model_len(self) -> int:
        text = self.checkpoint.config.text
        limit = text.max_position_embeddings
        why = ""
        exact = limit if text.rope_scaling is None else text.rope_scaling.exact_positions(limit)
        if exact < limit:
            limit = exact
            # the reference switches every position, cached keys included, to longrope's long factors past it
            why = (" (rope_parameters.original_max_position_embeddings: past it the reference's longrope table "
                   "changes for the whole sequence, which a KV cache cannot follow)")
        requested = self.config.max_model_len
        if requested is None:
            if why:
                logger.warning("max_model_len is %d, not max_position_embeddings=%d%s", limit,
                               text.max_position_embeddings, why)
            return limit
        if requested < 2 or requested > limit:
            raise ConfigError(f"max_model_len={requested} must be between 2 and the model's {limit}{why}; give "
                              f"{option_and_keyword('--max-model-len')} in that range, or leave it out for {limit}")
        return requested

    def _check_drafter_config(self, spec_config: SpeculativeConfig) -> int:
        """The tokens the drafter proposes a step, from its config alone, before the target's weights load (minutes
        for the 30B): a drafter of another model, a num_speculative_tokens its block cannot hold, or a token budget
        that cannot verify what it proposes, is refused at once. `_load_drafter` checks again on what it loads."""
        drafter = open_drafter_checkpoint(self._drafter_location(spec_config, weights=False),
                                          mask_token_id=self._mask_token_id, weights=False)
        drafter.check_fits(self.checkpoint.config.text)
        proposed = spec_config.proposed_tokens(drafter.config)
        if self.config.max_num_batched_tokens is not None:  # one given (the default's is checked as the drafter loads)
            check_verification_budget(self.config.max_num_batched_tokens, proposed)
        return proposed

    def _load_drafter(self, spec: SpeculativeConfig) -> None:
        """Load the drafter for speculative decoding and check the configuration can run it (ConfigError)."""
        path = self._drafter_location(spec, weights=self.config.load_format != "dummy")
        self.drafter = load_drafter(
            path, self.model_config, self._mask_token_id,
            dtype=self.dtype, device=self.device, progress=self.config.progress,
            load_format=self._weights_load_format, seed=self.config.seed, target_model=self.loaded.model,
        )
        prepare_for_cpu(self.drafter.model, self.device, self.dtype, self.scheduler_config.max_num_seqs)
        # read before the target loaded too: its files may have changed since
        k = spec.proposed_tokens(self.drafter.config)
        budget = self.scheduler_config.max_num_batched_tokens
        check_verification_budget(budget, k)
        if budget < self.scheduler_config.max_num_seqs * (k + 1):
            logger.warning("max_num_batched_tokens=%d is below max_num_seqs x (1 + num_speculative_tokens) = %d: "
                           "steps with many sequences verify fewer proposed tokens, and a seeded sampled request "
                           "is then reproducible in distribution, not token for token", budget,
                           self.scheduler_config.max_num_seqs * (k + 1))
        limit = spec.disable_by_batch_size
        if limit is not None and limit < self.scheduler_config.max_num_seqs:
            logger.warning("speculative_config.disable_by_batch_size=%d is below max_num_seqs=%d: steps with more "
                           "decoding sequences propose nothing, and a seeded sampled request is then reproducible in "
                           "distribution, not token for token (its draws depend on whether its steps proposed)",
                           limit, self.scheduler_config.max_num_seqs)
        self.num_speculative_tokens = k

    @staticmethod
    def _drafter_location(spec: SpeculativeConfig, weights: bool) -> Path:
        """The drafter's path: `spec.model`, or the local copy of the Hub id it names (its config, and its weights
        where `weights`). Raises CheckpointError naming speculative_config.model."""
        path = spec.drafter_path()
        if path is not None:
            return path
        try:  # a Hub id (config_checks refused anything else)
            return download_drafter(spec.model, weights=weights)
        except CheckpointError as exc:
            raise CheckpointError(f"speculative_config.model: {exc}") from None

    def _mask_token_id(self) -> int:
        """The target tokenizer's id of the released mask token, for a drafter config that names none."""
        return self.tokenizer.require_token_id(RELEASED_MASK_TOKEN)

    def _speculation_reserve_bytes(self) -> int:
        """Device memory speculation needs besides the KV cache at most: float32 logits (raw, constrained and
        as probabilities) for every verified position of a full batch, the proposals' distributions, and the
        target hidden states kept for the drafter's pending context."""
        if self.drafter is None:
            return 0
        seqs, k = self.scheduler_config.max_num_seqs, self.num_speculative_tokens
        config, element = self.drafter.config, torch.empty((), dtype=self.dtype).element_size()
        # steps without proposals keep up to a block of target hidden states per sequence (draft_context.py), and
        # a catch-up concatenates them once more
        pending = 2 * seqs * config.block_size * len(config.target_layer_ids) * config.hidden_size * element
        return 4 * self.model_config.text.vocab_size * seqs * (3 * (k + 1) + k) + pending

    def _kv_demand(self) -> KVDemand:
        draft = None
        if self.drafter is not None:
            config = self.drafter.config
            element = torch.empty((), dtype=self.dtype).element_size()
            draft = DraftKV(config.num_hidden_layers * 2 * self.config.block_size * config.num_key_value_heads
                            * config.head_dim * element, config.max_visible_distance)
        return KVDemand(self.config.block_size, self.max_model_len, self.scheduler_config.max_num_seqs,
                        self.scheduler_config.max_num_batched_tokens, draft)

    def _plan_kv_cache(self, demand: KVDemand, budget: int) -> KVCacheLayout:
        """The KV layout `budget` bytes give `demand` (kv_planner.py); ConfigError where it cannot hold one
        sequence."""
        text = self.model_config.text
        layout, short = plan_kv_layout(text, self.dtype, demand, budget)
        if short:
            per_block = block_bytes(text, self.dtype, demand)
            bs = demand.block_size
            reserved = self._speculation_reserve_bytes()
            spec_note = (f" after {reserved:,} bytes set aside for verifying {self.num_speculative_tokens} proposed "
                         f"tokens of up to max_num_seqs={self.scheduler_config.max_num_seqs} sequences"
                         if reserved and self._kv_sized_by_free_gpu_memory else "")
            # a block bigger than the context is mostly empty: where the budget holds the context's keys and values,
            # the block size is what does not fit
            oversized = f"lower block_size={bs} (a block larger than max_model_len is mostly empty), " if (
                bs > self.max_model_len and budget >= sum(per_block.values()) // bs * self.max_model_len) else ""
            longest = longest_context_held(text, self.dtype, demand, budget)
            context = (f"lower the context to {longest} tokens or less "
                       f"({option_and_keyword('--max-model-len', str(longest), str(longest))})" if longest is not None
                       else f"lower the context ({option_and_keyword('--max-model-len')})")
            raise ConfigError(
                f"the KV cache ({budget:,} bytes{spec_note}) cannot hold one sequence of "
                f"max_model_len={self.max_model_len} tokens (available/needed: {short}, a page is {bs} positions of "
                f"{page_geometry(text).page_layers} layers); {oversized}{context}, {self._more_kv_cache_fix()}"
            )
        return layout

    @property
    def _kv_sized_by_free_gpu_memory(self) -> bool:
        """Whether the GPU's free memory sizes the KV cache: on a GPU, where kv_cache_memory gives no size."""
        return self.config.kv_cache_memory is None and self.device.type == "cuda"

    def _more_kv_cache_fix(self) -> str:
        """How to give the KV cache more bytes, for a refusal: `kv_cache_memory` where it was given or the CPU's default
        sized the cache (gpu_memory_utilization sizes a GPU's alone, and only where kv_cache_memory is not given)."""
        if not self._kv_sized_by_free_gpu_memory:
            return f"or give the KV cache more ({KV_CACHE_MEMORY_OPTION})"
        return (f"free device memory, or give the KV cache more ({KV_CACHE_MEMORY_OPTION}, or "
                f"{option_and_keyword('--gpu-memory-utilization', 'FRACTION')})")

    def _kv_budget_bytes(self, per_block: dict[str, int], wanted: dict[str, int]) -> int:
        if self.config.kv_cache_memory is not None:  # a positive number of bytes (config_checks.py)
            self._check_kv_cache_fits(self.config.kv_cache_memory)
            return self.config.kv_cache_memory
        if self.device.type == "cuda":
            if self._working is None:
                self._working = measure_working_memory(
                    self.loaded.model, self.device, self.dtype, block_size=self.config.block_size,
                    max_num_seqs=self.scheduler_config.max_num_seqs,
                    max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
                    capture_layers=self.drafter.config.target_layer_ids if self.drafter else (),
                    query_lens=self._graph_query_lens(), graphs=not self.config.enforce_eager,
                    vision_grids=tuple(self.media.largest_grids()) if self.media is not None else (),
                    encoder_cache_rows=self._encoder_cache_rows() or 0)
                logger.info("steps beside the KV cache need up to %.2f GiB (%s)", self._working.total / 2**30,
                            ", ".join(f"{name} {value / 2**30:.2f}" for name, value in
                                      dataclasses.asdict(self._working).items()))
            reserve = self._kept_free_bytes() + self._working.total + _KERNEL_LOADING_BYTES
            return max(device_free_bytes(self.device) - reserve, sum(per_block.values()))
        # on the CPU, enough for every sequence at full length, capped so the default stays modest
        if self.config.gpu_memory_utilization != EngineConfig.gpu_memory_utilization:
            logger.warning("gpu_memory_utilization=%s sizes the KV cache on a GPU only; on the CPU give %s instead",
                           self.config.gpu_memory_utilization, KV_CACHE_MEMORY_OPTION)
        wanted_bytes = sum(wanted[g] * per_block[g] for g in per_block)
        room = kv_cache_room_in_host_memory(self._weighed_models())
        budget = cpu_default_kv_bytes(wanted_bytes, None if room is None else room.bytes)
        if budget < min(CPU_DEFAULT_KV_BYTES, wanted_bytes):
            logger.warning("the CPU's default KV cache (%s: %s bytes for max_num_seqs=%d, max_model_len=%d) is "
                           "lowered to %s bytes: the weights leave %s bytes of %s, less %d MiB for the steps; give "
                           "%s to choose its size", CPU_DEFAULT_KV_SIZING,
                           f"{min(CPU_DEFAULT_KV_BYTES, wanted_bytes):,}", self.scheduler_config.max_num_seqs,
                           self.max_model_len, f"{budget:,}", f"{max(room.bytes, 0):,}", room.memory.describe(),
                           CPU_HEADROOM_BYTES >> 20, KV_CACHE_MEMORY_OPTION)
        return budget

    def _weighed_models(self) -> list[torch.nn.Module]:
        """The models whose weights share the CPU's memory with the KV cache: the model, and a drafter's."""
        return [self.loaded.model, *([self.drafter.model] if self.drafter is not None else [])]

    def _check_kv_cache_fits(self, kv_bytes: int) -> None:
        """ConfigError, before anything is allocated, for a KV cache `kv_cache_memory` gives that the device cannot
        hold: beside the weights in the CPU's memory and swap, or in the GPU's free memory less the verification
        reserve."""
        if self.device.type != "cuda":
            check_kv_cache_fits_in_host_memory(kv_bytes, self._weighed_models())
            return
        room = device_free_bytes(self.device) - self._speculation_reserve_bytes()
        if kv_bytes > room:
            raise ConfigError(f"kv_cache_memory={kv_bytes:,} bytes is more than the GPU memory free after the weights "
                              f"({self.device}) and the verification reserve ({max(room, 0):,} bytes); give the KV "
                              f"cache less ({KV_CACHE_MEMORY_OPTION})")

    def _media_processor(self) -> MediaProcessor | None:
        vision = self.model_config.vision
        if vision is None:
            return None
        settings = checkpoint_media_settings(self.checkpoint_dir, vision, self.checkpoint.preprocessor_config)
        # media tokens beyond the context can never be served: stop decoding a request's items there, each counted
        # whole, as prepare_token_prompt writes its expansion
        return MediaProcessor(settings, self.config.media_limits, max_model_len=self.max_model_len,
                              count_tokens=lambda text: len(self.tokenizer.encode(text, add_special_tokens=False)))

    @property
    def chat_template(self) -> ChatTemplate:
        """The checkpoint's (or the operator's) chat template, compiled and probed once (P-TMPL-1): CheckpointError
        where there is none or it does not compile, ConfigError or ChatTemplateError where it breaks the protocol
        with this tokenizer (`check_chat_template`, what the server's start and `glimmer inspect` check)."""
        if self._chat_template is None:
            # unbounded by max_prompt_chars, as before the engine probed it: a context too short for any chat (a
            # tiny --max-model-len) is the chat's refusal, naming the flag, not the template's
            self._chat_template = self._template_source().probed(self.tokenizer)
        return self._chat_template

    def _template_source(self) -> ChatTemplateSource:
        """Where the chat template is (the operator's or the checkpoint's), found once: CheckpointError where there
        is none, kept too, so that a caller's own template (`named_chat_templates`) does not search the files again
        on every request."""
        if self._chat_template_source is None:
            try:
                self._chat_template_source = find_checkpoint_chat_template(  # logs origin and sha256
                    self.checkpoint_dir, self.config.chat_template, self.checkpoint.tokenizer)
            except CheckpointError as error:
                self._chat_template_source = error
        if isinstance(self._chat_template_source, CheckpointError):
            raise self._chat_template_source
        return self._chat_template_source

    @property
    def named_chat_templates(self) -> Mapping[str, str]:
        """The checkpoint tokenizer's templates by name (ChatTemplateSource.named): a caller's `chat_template`
        argument that is one of the names renders with that template, as in transformers. Found without compiling
        or probing the default template, which a caller's own template does not need: none where the checkpoint has
        no template."""
        try:
            return self._template_source().named
        except CheckpointError:
            return {}

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles structured-output and tool_choice grammars; built on first use (it indexes the vocabulary,
        seconds for a large one) and shared by the threads that compile requests."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self.model_config.text.vocab_size,
                                                 self.generation_defaults.stop_token_ids)
            return self._grammars

    # prompts ----------------------------------------------------------------------------------------

    @property
    def max_prompt_chars(self) -> int:
        """Longer prompt texts cannot fit the context with room for one token, whatever they say: they are
        refused before the tokenizer spends time on them."""
        return (self.max_model_len - 1) * self.tokenizer.max_token_chars

    def check_prompt_chars(self, text: str, *, truncated: bool = False) -> None:
        """Raises RequestError for a prompt that is not a string of valid Unicode (a lone surrogate cannot be
        tokenized), PromptTextTooLongError (a context-length refusal) for one longer than `max_prompt_chars` unless
        `truncated` (its request's truncate_prompt_tokens keeps only its last tokens: as in vLLM, a text of any length
        is tokenized and cut to them)."""
        if not isinstance(text, str):
            raise RequestError(f"the prompt must be a string, not {type(text).__name__}", param="prompt")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(f"the prompt is not valid Unicode: {exc.reason} at character {exc.start}",
                               param="prompt") from None
        if len(text) > self.max_prompt_chars and not truncated:
            raise PromptTextTooLongError(self.max_model_len, len(text), self.max_prompt_chars)

    def encode_prompt(self, text: str, literals: Mapping[str, str] | None = None, *, truncated: bool = False
                      ) -> list[int]:
        """Token ids of a text prompt. BOS is added unless the text already starts with it: a prompt rendered
        by the chat template does, and a second BOS silently alters the output (P-TMPL-5). `literals`: caller
        text to keep plain (`protocol.RenderedPrompt.literals`).

        Raises RequestError, before tokenizing, for a text longer than `max_prompt_chars` (unless `truncated`:
        `check_prompt_chars`).
        """
        self.check_prompt_chars(text, truncated=truncated)
        # the post-processor's bos where the files name none: a template that writes it as text gets no second one
        bos = self.tokenizer.prompt_bos_token
        if literals is None:  # a caller's text: its BOS spelling is text where split_special_tokens makes it so
            starts_with_bos = bos is not None and text.startswith(bos) and not self.tokenizer.split_special_tokens
            return self.tokenizer.encode_input_text(text, add_special_tokens=not starts_with_bos)
        return self.tokenizer.encode(text, add_special_tokens=not (bos is not None and text.startswith(bos)),
                                     literals=literals)

    def prepare_prompt(
        self, text: str, images: list | tuple = (), videos: list | tuple = (), *,
        literals: Mapping[str, str] | None = None, cancel: CancelToken | None = None, truncated: bool = False,
    ) -> tuple[list[int], list[MultimodalItem]]:
        """Token ids and media items for a text prompt whose `<|patch|>` / `<|video|>` placeholders match the
        images and videos given (one placeholder per item, in order). `literals` and `truncated` as for
        `encode_prompt`; `cancel` stops the media processing between items and frames (raising Cancelled)."""
        if not images and not videos:
            return self.encode_prompt(text, literals, truncated=truncated), []
        if literals is None and self.tokenizer.split_special_tokens:
            raise RequestError(
                "the checkpoint's tokenizer_config.json sets split_special_tokens, so a text prompt's "
                f"{IMAGE_PLACEHOLDER} / {VIDEO_PLACEHOLDER} placeholders are text, as transformers tokenizes them, "
                "and mark no media; give the prompt as token ids (prompt_token_ids) with its multi_modal_data, or "
                "use chat", param="prompt")
        media = self._media_for(videos, param="messages")
        self.check_prompt_chars(text, truncated=truncated)  # before decoding media that could not fit anyway
        processed = media.process(text, images, videos, cancel=cancel)
        token_ids = self.encode_prompt(processed.text, literals, truncated=truncated)
        return token_ids, attach_media(token_ids, processed, self.media_token_ids)

    def prepare_token_prompt(
        self, token_ids: list[int], images: list | tuple = (), videos: list | tuple = (), *, param: str = "prompt",
        cancel: CancelToken | None = None,
    ) -> tuple[list[int], list[MultimodalItem]]:
        """Token ids and media items for a prompt given as token ids with its media (vLLM's `{"prompt_token_ids",
        "multi_modal_data"}`): one image placeholder id per image and one video placeholder id per video, in order,
        as the chat template renders them, each replaced by its item's expansion, token for token what
        `prepare_prompt` makes of the same prompt as text. RequestError naming `param` when the placeholder ids do
        not match the items (an expanded prompt, from a tokenized expansion, included)."""
        if not images and not videos:
            return token_ids, []
        media = self._media_for(videos, param=param)
        media_ids = self.media_token_ids
        kinds = {media_ids.image: (IMAGE_PLACEHOLDER, "image", len(images)),
                 media_ids.video: (VIDEO_PLACEHOLDER, "video", len(videos))}
        for token_id, (placeholder, kind, given) in kinds.items():
            found = token_ids.count(token_id)
            if found != given:
                raise RequestError(
                    f"{param}.prompt_token_ids holds {found} {kind} placeholder(s) ({placeholder}, id {token_id}) for "
                    f"{given} {kind}(s) in multi_modal_data: put one where each {kind} goes, in order, as the chat "
                    "template renders them; Glimmer expands each to the item's tokens (a prompt already expanded "
                    "holds one per patch: give its text, or its ids before expansion)",
                    param=f"{param}.prompt_token_ids")
        order = "".join(kinds[token_id][0] for token_id in token_ids if token_id in kinds)
        processed = media.process(order, images, videos, cancel=cancel)
        expansions = {media_ids.image: iter(processed.image_expansions),
                      media_ids.video: iter(processed.video_expansions)}
        expanded: list[int] = []
        for token_id in token_ids:
            if token_id in expansions:
                expanded += self.tokenizer.encode(next(expansions[token_id]), add_special_tokens=False)
            else:
                expanded.append(token_id)
        return expanded, attach_media(expanded, processed, self.media_token_ids)

    def truncate_prompt(
        self, token_ids: list[int], multimodal: list[MultimodalItem], params: SamplingParams,
    ) -> tuple[list[int], list[MultimodalItem]]:
        """The prompt's last `params.truncate_prompt_tokens` tokens (-1: max_model_len) and its media items, as vLLM
        truncates a prompt (from the left); as given where that is None or the prompt is no longer. Run where the
        prompt's ids are decided, so that the request's usage, echo and prompt_logprobs see the truncated prompt. An
        item whose expansion (its markers and placeholder tokens, `MultimodalItem.span`) is all cut off is dropped; the
        others are moved with the tokens kept.

        Raises RequestError naming truncate_prompt_tokens for a value past max_model_len (vLLM's server's 400) or a
        cut inside an image's or video's expansion (its features would no longer fit its placeholders, or they would
        stand without the start marker, or an end marker without them)."""
        if params.truncate_prompt_tokens is None:
            return token_ids, multimodal
        params.validate()  # a SamplingParams is mutable: 0 set after construction would keep the whole prompt
        keep = self.max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens
        if keep > self.max_model_len:
            raise RequestError(f"truncate_prompt_tokens: {keep} is more than max_model_len={self.max_model_len}; give "
                               "at most that many tokens, or -1 for max_model_len", param="truncate_prompt_tokens")
        cut = len(token_ids) - keep
        if cut <= 0:
            return token_ids, multimodal
        kept = []
        for index, item in enumerate(multimodal):
            start, end = item.span
            if end <= cut:
                continue
            if start < cut:
                raise RequestError(
                    f"truncate_prompt_tokens: keeping the prompt's last {keep} of its {len(token_ids)} tokens would "
                    f"cut into its image or video {index} (positions {start} to {end - 1}, its markers and the "
                    f"placeholder tokens its features fill); keep at most {len(token_ids) - end} tokens (after it) or "
                    f"at least {len(token_ids) - start} (from its start)", param="truncate_prompt_tokens")
            kept.append(dataclasses.replace(item, runs=tuple((offset - cut, length) for offset, length in item.runs),
                                            span=(start - cut, end - cut)))
        return token_ids[cut:], kept

    def _media_for(self, videos: list | tuple, *, param: str) -> MediaProcessor:
        """The media processor, for a prompt with media (and `videos`); RequestError naming `param` when the model
        takes none, or no videos."""
        if self.media is None:
            raise RequestError("this checkpoint has no vision tower; images and videos cannot be used"
                               + self.model_config.no_vision_fix, param=param)
        if videos and self.model_config.video_unsupported_reason:
            raise RequestError(f"this model cannot take videos: {self.model_config.video_unsupported_reason}",
                               param=param)
        return self.media

    # requests ---------------------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        multimodal: list[MultimodalItem] | None = None,
        controller_factory: ControllerFactory | None = None,
        *,
        clamp_max_tokens: bool = False,
        generated: int = 0,
        hidden_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        """Queue a request; raises RequestError (naming the field) if it can never be served.

        controller_factory, if given, builds one grammar controller per completion to constrain its tokens (a
        chat turn's grammar); otherwise `params.structured_outputs`, if set, constrains the raw text.
        clamp_max_tokens: a max_tokens past max_model_len ends the output there (finish_reason "length"), as
        vLLM's offline LLM does, instead of refusing the request as the server does (a 400); so does a min_tokens
        past it.
        generated: how many of the last prompt ids the model generated (a beam's, in beam search): placeholder ids
        among them are embedded as decoding embeds them, not refused as the prompt's own.
        hidden_token_ids: special tokens left out of the text, as `skip_special_tokens` leaves out all (a chat reply's
        hidden ones, `Tokenizer.hidden_in_replies`): dropped before their bytes are decoded, so a character whose bytes
        they split comes out whole.
        """
        if request_id in self._seqs:
            raise RequestError(f"request id {request_id!r} is already in use", param="request_id")
        if not isinstance(params, SamplingParams):
            raise RequestError(f"sampling params must be a SamplingParams, not {type(params).__name__}",
                               param="sampling_params")
        params.validate()  # a SamplingParams is mutable: fields set after construction are checked here
        # the request keeps its own copy, as vLLM's does: a caller that changes the object afterwards (to reuse it for
        # its next request) changes nothing of this one
        params = params.clone()
        if not prompt_token_ids:
            raise RequestError("the prompt is empty", param="prompt")
        tokens = self.token_count
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < tokens]
        if bad:
            raise RequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {tokens})", param="prompt")
        bad = [t for t in params.stop_token_ids if not 0 <= t < tokens]
        if bad:  # could never be sampled: the request would silently run past where it was meant to stop
            raise RequestError(f"stop_token_ids: ids {bad[:5]} are outside the vocabulary [0, {tokens}); a stop id "
                               "must be a token the model can generate",
                               param="stop_token_ids")
        bad = [t for t in params.logit_bias or {} if t >= tokens]
        if bad:
            raise RequestError(f"logit_bias: token ids {bad[:5]} are outside the vocabulary [0, {tokens})",
                               param="logit_bias")
        bad = [t for t in params.allowed_token_ids or () if t >= tokens]
        if bad:
            raise RequestError(f"allowed_token_ids: token ids {bad[:5]} are outside the vocabulary [0, {tokens})",
                               param="allowed_token_ids")
        if not multimodal:
            refuse_stray_placeholders(prompt_token_ids[:len(prompt_token_ids) - generated], self.media_token_ids)
        prompt_len = len(prompt_token_ids)
        max_tokens = self.generation_budget(prompt_len, params, clamp_max_tokens=clamp_max_tokens)
        if controller_factory is None and params.structured_outputs is not None:
            controller_factory = self.grammars.structured_outputs(params.structured_outputs)
        if controller_factory is not None:
            # thinking_token_budget and strict tools make a grammar too: a message naming only two of the four sent
            # a client that set neither looking for what it did wrong
            for name, why in _BESIDE_A_GRAMMAR:
                if getattr(params, name):
                    raise RequestError(f"{name}: cannot be combined with a grammar over the output (structured "
                                       "outputs, a required or named tool choice, strict tools or "
                                       f"thinking_token_budget): the grammar {why}", param=name)
        banned_words = bad_word_ids(self.tokenizer, params.bad_words) if params.bad_words else ()
        stop_ids = stop_token_ids(params, self.generation_defaults.stop_token_ids)
        held_ids = all_stop_ids(params, self.generation_defaults.stop_token_ids)
        if params.allowed_token_ids:
            _refuse_a_first_step_without_allowed_ids(params, banned_words, held_ids)
        seqs = []
        for index in range(params.n):
            generator = self._shared_generator if params.seed is None else seeded_generator(
                self.device, params.seed + index)
            seq = Sequence(
                request_id=request_id,
                prompt_token_ids=list(prompt_token_ids),
                params=params,
                stop_token_ids=stop_ids,
                max_total_tokens=prompt_len + max_tokens,
                generator=generator,
                multimodal=list(multimodal or []),
                index=index,
                controller=controller_factory(stop_ids) if controller_factory is not None else None,
                bad_word_ids=banned_words,
                held_ids=held_ids,
                counts_prefix_lookup=generated == 0,
            )
            skipped = frozenset(self.tokenizer.all_special_ids) if params.skip_special_tokens else hidden_token_ids
            self._completions[id(seq)] = _Completion(
                detokenizer=IncrementalDetokenizer(self.tokenizer, skip_token_ids=skipped,
                                                   prompt_token_ids=prompt_token_ids),
                stops=StopStringMatcher(params.stop, params.include_stop_str_in_output),
                min_tokens=params.min_tokens,
                silent_stop_ids=silent_stop_ids(params, self.tokenizer.all_special_ids),
                num_prompt_tokens=prompt_len,
                prompt_logprobs=[None] * prompt_len if params.prompt_logprobs is not None else None,
            )
            seqs.append(seq)
        self._seqs[request_id] = seqs
        for seq in seqs:
            self.scheduler.add(seq)

    def generation_budget(self, prompt_len: int, params: SamplingParams, *, clamp_max_tokens: bool = False) -> int:
        """How many tokens a request whose prompt has `prompt_len` tokens may generate in this engine's context
        (completion_rules.generation_budget, whose errors it raises)."""
        return generation_budget(self.max_model_len, prompt_len, params, clamp_max_tokens=clamp_max_tokens)

    def abort(self, request_id: str, index: int | None = None) -> list[StepDelta]:
        """Stop a request (or only its completion `index`) now and free its KV blocks (its full ones stay findable in
        the prefix cache, as a finished request's).

        Returns the final deltas of what it stopped (finish_reason 'abort').
        """
        seqs = self._seqs.get(request_id, [])
        deltas = []
        for seq in seqs:
            if seq.is_finished or (index is not None and seq.index != index):
                continue
            try:  # a stop the server decides (a stop string, P-HDR-8) ends a request here: its blocks are cached too
                self.scheduler.cache_full_blocks(seq)
            except Exception:  # (after a failed step, say) the blocks are freed all the same, only not cached
                logger.warning("request %s: its drafter context could not be written as it was aborted; its last "
                               "KV blocks are not offered to the prefix cache", request_id, exc_info=True)
            self.scheduler.finish(seq)
            done = self._completions.pop(id(seq), None)
            if done is not None:  # else its final delta went out already (its text ended in a failed step)
                deltas.append(StepDelta(request_id, seq.index, [], done.stops.flush(), finish_reason="abort",
                                        num_prompt_tokens=done.num_prompt_tokens,
                                        num_cached_tokens=seq.num_cached_tokens,
                                        first_scheduled_time=seq.first_scheduled_time))
        self._forget_if_done(request_id)
        return deltas

    @property
    def has_unfinished_requests(self) -> bool:
        """Whether `step()` has work left: sequences to run, text to release, or a step launched ahead whose tokens
        are not read yet. That step's sequences may all have ended since it was launched (a stop id, an abort): it is
        read all the same, or an idle engine would keep it (its sequences, its logits) until the next request, and
        the draft policy would time it from its launch, the idle time included."""
        return self.scheduler.has_work or bool(self._unreleased) or self._launched is not None

    # stepping ---------------------------------------------------------------------------------------

    def step(self) -> list[StepDelta]:
        """Run one scheduled batch.

        Tokens are appended and their token-level stops (stop ids, max_tokens, grammar) decided as soon as they
        are sampled; their text (detokenizing, stop strings, deltas) is made in the same call, or with
        `async_scheduling` in the next one, while the device computes that step. A stop string found then
        finishes its sequence, and the token the sequence got in the running step is dropped: the output is the
        same either way. With `async_scheduling`, plain decode steps also run ahead of the host: the next one is
        launched before this one's tokens are read (`lookahead.py`).

        Raises StepError naming the requests at fault: those whose grammar masks, steering or bookkeeping failed
        (the others' deltas ride on the error), or every request of the batch if running the model or the
        sampler failed.
        """
        check_not_forked("an engine step")
        started = time.perf_counter()
        if self._launched is not None:
            return self._step_ahead(*self._successor(self._launched), self._launched)
        step = self.scheduler.schedule()
        if self._can_launch_ahead(step):
            return self._step_ahead(step, None, None)
        outcome = _StepOutcome()  # filled as the step goes: what it released before a failure goes out
        try:
            self._run_step(step, started, outcome)
        except Exception as exc:
            self._retire_finished(outcome)  # those that ended before the failure (their final delta is out)
            raise _whole_batch_error(step.seqs, exc, outcome) from exc
        return _deltas_or_failure(outcome)

    def _run_step(self, step: ScheduledStep, started: float, outcome: _StepOutcome) -> None:
        if step.is_empty:  # only text left to release
            self._release_text(outcome)
            self._retire(step, outcome)
            return
        masks = self._start_grammar_masks(step)
        output = self.runner.execute(step)
        self._record_prompt_logprobs(step, output.prompt_logprobs)
        if self.async_scheduling:
            self._release_text(outcome)  # the previous step's text, while the device runs this one
        if self.speculator is not None:
            self.speculator.stage_context(step, output)  # a step without proposals: its drafter context, too
        try:
            bitmask = masks.result() if masks is not None else None
            grammar_failure = None
        except Exception as exc:  # the grammar engine failed: the constrained requests end, the others sample
            bitmask, grammar_failure = None, exc
        committed = self._emit(step, output, bitmask, grammar_failure, outcome)
        if not self.async_scheduling:
            self._release_text(outcome)
        step.commit(committed)
        if self.speculator is not None:  # the drafter context of what was committed, before its blocks are offered
            decoding = _going_on([step.seqs[i] for i in output.sampling], outcome)
            running = len(self.scheduler.running) - len(outcome.finished)
            self.speculator.after_step(step, output, committed, decoding, running, started)
        self._retire(step, outcome)

    # running ahead (lookahead.py) ------------------------------------------------------------------------

    def _can_launch_ahead(self, step: ScheduledStep) -> bool:
        """Whether `step` (just scheduled) may run ahead of the host: every running sequence decodes one plain
        token, and no waiting request could join the batch before the step after it."""
        scheduler = self.scheduler
        return (
            self.async_scheduling
            and not step.is_empty
            and len(step.seqs) == len(scheduler.running)
            and not (scheduler.waiting and len(scheduler.running) < scheduler.config.max_num_seqs)
            and all(n == 1 and step.samples(i) and runs_ahead(seq)
                    for i, (seq, n) in enumerate(zip(step.seqs, step.num_new_tokens, strict=True)))
        )

    def _successor(self, launched: LaunchedStep) -> tuple[ScheduledStep | None, int | None]:
        """The decode step after `launched`, planned before its tokens are read, or None when that step must be
        read first (a waiting request could be admitted, the KV pools are short, or the draft policy wants
        proposals, which are drafted from the tokens); and the drafts per sequence the policy chose for it, if
        it was asked."""
        scheduler = self.scheduler
        if scheduler.waiting and len(scheduler.running) < scheduler.config.max_num_seqs:
            return None, None
        step = ScheduledStep([], [])
        for seq in launched.step.seqs:
            if seq.is_finished or seq.num_tokens + seq.num_pending_tokens >= seq.max_total_tokens:
                continue  # ended (aborted, or a stop since), or the token on its way is its last
            if not self.kv.try_allocate(seq, 1):
                return None, None  # (blocks it took stay its own: the step planned after the read uses them)
            step.add(seq, 1)
        if not step.seqs:
            return None, None
        if self.speculator is None:
            return step, None
        proposals = self.speculator.policy.choose(len(step.seqs))
        return (None if proposals else step), proposals

    def _step_ahead(self, step: ScheduledStep | None, proposals: int | None, launched: LaunchedStep | None
                    ) -> list[StepDelta]:
        """Launch `step` (if any) with the tokens of `launched` as its inputs, then read `launched` (if any)
        and release the text, while `step` runs. `proposals`: what the draft policy chose for the step after
        `launched` when it was asked (`_successor`)."""
        outcome = _StepOutcome()
        self._launched = None
        released = False
        try:
            if step is not None:
                if launched is not None and self.speculator is not None:
                    # the running step proposes nothing for the one launched now: its drafter bookkeeping is
                    # done before that step stages its own context
                    self.speculator.after_step(launched.step, launched.output, launched.step.num_new_tokens, [],
                                               0, launched.launched_s, proposals=0)
                self._launched = self._launch(step, launched)
            if launched is not None:
                self._accept_launched(launched, outcome)
                if step is None and self.speculator is not None:
                    # read with no step after it: the drafter proposes for the next one, as after a synchronous step
                    running = len(self.scheduler.running) - len(outcome.finished)
                    self.speculator.after_step(launched.step, launched.output, launched.step.num_new_tokens,
                                               _going_on(launched.step.seqs, outcome), running, launched.launched_s,
                                               proposals=proposals)
            released = True
            self._release_text(outcome)
            self._retire(None, outcome)  # the blocks of `launched` were offered as its tokens were read
        except Exception as exc:
            if not released:  # the text made before the failure still goes out (to the requests not at fault)
                self._release_text(outcome)
            self._retire_finished(outcome)
            self._launched = None  # its sequences are among the failed ones
            seqs = [*(step.seqs if step is not None else []), *(launched.step.seqs if launched is not None else [])]
            raise _whole_batch_error(seqs, exc, outcome) from exc
        return _deltas_or_failure(outcome)

    def _launch(self, step: ScheduledStep, previous: LaunchedStep | None) -> LaunchedStep:
        """Run a plain decode step and choose its tokens on the device; its inputs are `previous`'s tokens."""
        launched_s = time.perf_counter()
        inputs = previous.input_ids_for(step) if previous is not None else None
        output = self.runner.execute(step, inputs)
        if self.speculator is not None:
            self.speculator.stage_context(step, output)  # the drafter's context, from the device's hidden states
        rows = [self._sampling_row(seq) for seq in step.seqs]
        # each row's input token is its pending token: penalties count it as the last output token
        sampled = sample_on_device(output.logits, rows, pending=inputs)
        launched = LaunchedStep.start(step, output, rows, *sampled, launched_s)
        for seq in step.seqs:
            seq.num_computed_tokens += 1
            seq.num_pending_tokens += 1
        return launched

    def _accept_launched(self, launched: LaunchedStep, outcome: _StepOutcome) -> None:
        """Append the tokens `launched` chose, except to sequences that ended since it was launched."""
        result = launched.read()
        for seq, token, entry in zip(launched.step.seqs, result.token_ids, result.logprobs, strict=True):
            seq.num_pending_tokens -= 1
            if seq.is_finished or seq.request_id in outcome.failures:
                continue
            if self._emit_tokens(seq, [token], [entry], outcome) and not outcome.ends(seq):
                self.scheduler.register_computed_blocks(seq)

    def _record_prompt_logprobs(self, step: ScheduledStep, scored_rows: dict[int, list[TokenLogprobs]]) -> None:
        """Keep the prompt logprobs this step's chunks scored (before their tokens count as computed)."""
        for i, scored in scored_rows.items():
            seq = step.seqs[i]
            recorded = self._completions[id(seq)].prompt_logprobs
            start = seq.num_computed_tokens + 1  # the row at position p scores the token at p + 1
            recorded[start : start + len(scored)] = scored

    def _start_grammar_masks(self, step: ScheduledStep) -> Future | None:
        """Fill the grammar masks of the rows this step samples, on a worker thread while the model runs
        (with speculative decoding, one row per verified position)."""
        sampled = [seq for i, seq in enumerate(step.seqs) if step.samples(i)]
        if all(seq.controller is None for seq in sampled):
            return None
        if self._grammar_masks is None:
            self._grammar_masks = GrammarMasks(self.model_config.text.vocab_size, self.scheduler_config.max_num_seqs)
        controllers = [seq.controller for seq in sampled]
        if self.speculator is None:
            return self._grammar_masks.fill_async(controllers)
        return self._grammar_masks.fill_verification_async(controllers, [list(seq.spec_token_ids) for seq in sampled])

    def _emit(
        self, step: ScheduledStep, output: StepLogits, bitmask: torch.Tensor | None,
        grammar_failure: Exception | None, outcome: _StepOutcome,
    ) -> list[int]:
        """Choose the next token(s) of every sequence that samples and append them (never past a stop); return
        how many of each sequence's scheduled tokens are now committed (proposed tokens that were rejected,
        or dropped at a stop, are not). A sequence whose grammar or bookkeeping failed goes to
        `outcome.failures` (its request ends; the others go on). Token-level stops end a sequence here;
        stop strings end it when its text is released (`_release_text`)."""
        committed = list(step.num_new_tokens)
        dropped = set()
        for i in output.sampling:
            seq = step.seqs[i]
            if outcome.ends(seq):  # by a stop string in the previous step's text (async): this token comes after
                committed[i] -= step.spec_tokens(i)
                seq.keep_spec_tokens(0)
                dropped.add(i)
            elif seq.samples_nothing:
                outcome.deltas.append(self._finish_unsampled(seq))
                outcome.end(seq)
                dropped.add(i)
            elif grammar_failure is not None and seq.controller is not None:
                outcome.failures.setdefault(seq.request_id, grammar_failure)
                committed[i] -= step.spec_tokens(i)  # its proposals are never verified
                seq.keep_spec_tokens(0)
                dropped.add(i)
        if dropped:
            output, bitmask = self._without_rows_of(step, output, bitmask, dropped)
        if not output.sampling:
            return committed
        if self.speculator is None or not any(step.spec_tokens(i) for i in output.sampling):
            # nothing to verify: ordinary sampling (the same draws as verifying no proposal)
            result = sample(output.logits, [self._sampling_row(step.seqs[i]) for i in output.sampling], bitmask)
            for i, token, logprobs in zip(output.sampling, result.token_ids, result.logprobs, strict=True):
                self._emit_tokens(step.seqs[i], [token], [logprobs], outcome)
            return committed
        proposals = []
        for i in output.sampling:
            seq = step.seqs[i]
            drafts = list(seq.spec_token_ids)
            proposals.append(Proposal([self._sampling_row(seq, drafts[:j]) for j in range(len(drafts) + 1)], drafts,
                                      seq.spec_draft_probs))
        for i, verdict in zip(output.sampling, verify(output.logits, proposals, bitmask), strict=True):
            seq, proposed = step.seqs[i], step.spec_tokens(i)
            appended = self._emit_tokens(seq, verdict.token_ids, verdict.logprobs, outcome)
            committed[i] += min(verdict.num_accepted, appended) - proposed
            self.speculator.record_verification(proposed, verdict.num_accepted)
            seq.keep_spec_tokens(0)
        return committed

    def _sampling_row(self, seq: Sequence, proposed: list[int] | tuple[int, ...] = ()) -> SamplingRow:
        """What sampling the next token needs — after the `proposed` tokens, when verifying them."""
        outputs = seq.output_token_ids + list(proposed) if proposed else seq.output_token_ids
        banned = seq.banned_ids(outputs)
        if seq.params.uses_penalties and seq.penalty_ids is None:
            seq.penalty_ids = PenaltyIds(seq.output_token_ids)
        return SamplingRow(seq.params, seq.prompt_token_ids, outputs, seq.generator, banned, self.token_count,
                           seq.prompt_id_array if seq.params.repetition_penalty != 1 else None, seq.penalty_ids)

    def _emit_tokens(
        self, seq: Sequence, tokens: list[int], logprobs: list[TokenLogprobs | None], outcome: _StepOutcome
    ) -> int:
        """Append tokens one by one until one finishes the sequence by a token-level stop (or its steering or
        bookkeeping fails: its request alone ends); returns how many were appended."""
        for j, (token, entry) in enumerate(zip(tokens, logprobs, strict=True)):
            try:
                finished = self._accept_token(seq, token, entry)
            except Exception as exc:
                outcome.failures.setdefault(seq.request_id, exc)
                return j
            if finished:
                outcome.end(seq)
                return j + 1
        return len(tokens)

    @staticmethod
    def _without_rows_of(
        step: ScheduledStep, output: StepLogits, bitmask: torch.Tensor | None, dropped: set[int]
    ) -> tuple[StepLogits, torch.Tensor | None]:
        """The step's logits (and grammar mask rows) without those of the sequence indices `dropped`."""
        keep, sampling, row = [], [], 0
        for i in output.sampling:
            rows = 1 + step.spec_tokens(i)
            if i not in dropped:
                keep.extend(range(row, row + rows))
                sampling.append(i)
            row += rows
        kept = StepLogits(output.logits[keep], sampling, output.prompt_logprobs, output.hidden)
        return kept, bitmask[keep] if bitmask is not None else None

    def _finish_unsampled(self, seq: Sequence) -> StepDelta:
        """The final delta of a max_tokens=0 sequence, whose prompt is computed (the caller retires it). Its text is
        "", as vLLM's, even where the prompt ends partway through a character: no output token carries those bytes."""
        done = self._completions.pop(id(seq))
        return StepDelta(seq.request_id, seq.index, [], "", finish_reason="length",
                         num_prompt_tokens=done.num_prompt_tokens, num_cached_tokens=seq.num_cached_tokens,
                         prompt_logprobs=done.take_prompt_logprobs(),
                         first_scheduled_time=seq.first_scheduled_time)

    def _forget_if_done(self, request_id: str) -> None:
        if all(s.is_finished for s in self._seqs.get(request_id, [])):
            self._seqs.pop(request_id, None)

    def _accept_token(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None) -> bool:
        """Append a sampled token and decide the stops that need no text (True: the sequence ends); the text
        waits for `_release_text`. ConstraintFailure where the token is none the request allows: its allowed ids were
        all banned there (`_refuse_an_unallowed_token`)."""
        if seq.allowed_ids is not None and token not in seq.allowed_ids:
            _refuse_an_unallowed_token(seq)
        seq.output_token_ids.append(token)
        stop = token_stop(seq, token, self._eos_token_id, seq.controller is not None and seq.controller.observe(token))
        if stop is None:
            self._unreleased.append(_AcceptedToken(seq, token, logprobs, None, None))
            return False
        self._unreleased.append(_AcceptedToken(seq, token, logprobs, *stop))
        return True

    def _release_text(self, outcome: _StepOutcome) -> None:
        """Make the deltas of the accepted tokens: their text, with stop strings. A stop string ends its
        sequence (into `outcome.finished`, unless a token-level stop already ended it); the tokens after it
        are never released. A sequence whose text fails goes to `outcome.failures`; the others go on."""
        accepted, self._unreleased = self._unreleased, []
        for item in accepted:
            seq = item.seq
            done = self._completions.get(id(seq))
            if done is None:
                continue  # aborted, failed or ended by a stop string since it was sampled
            try:
                delta = self._release_token_text(item, done)
            except Exception as exc:
                outcome.failures.setdefault(seq.request_id, exc)
                self._completions.pop(id(seq), None)  # its request is aborted: nothing more of it goes out
                continue
            outcome.deltas.append(delta)
            if delta.finish_reason is not None:
                self._completions.pop(id(seq))
                if not seq.is_finished:  # (retired already if a token-level stop ended it a step ago)
                    outcome.end(seq)  # by a stop string: the token it got since is dropped
                self._forget_if_done(seq.request_id)

    def _release_token_text(self, item: _AcceptedToken, done: _Completion) -> StepDelta:
        if item.logprobs is not None:
            done.logprobs.append(item.logprobs)
        done.num_tokens += 1
        finish_reason, stop_reason = item.finish_reason, item.stop_reason
        silent = stop_reason is not None and item.token in done.silent_stop_ids
        armed = not done.min_tokens or stop_strings_armed(done.num_tokens, done.min_tokens)
        decoded, start = ("", 0) if silent else done.detokenizer.add_at(item.token)
        starts = [done.decoded_chars + start] if item.logprobs is not None else []
        done.decoded_chars += len(decoded)
        text, stop_string = done.stops.feed(decoded, armed=armed)
        if stop_string is None and finish_reason is not None:
            # the U+FFFD of bytes left incomplete can complete a stop string too: then it ends the text as any does
            tail, stop_string = done.stops.feed(done.detokenizer.flush(), armed=armed)
            text += tail if stop_string is not None else tail + done.stops.flush()
        if stop_string is not None:
            finish_reason, stop_reason = "stop", stop_string
        done.text += text
        return StepDelta(
            request_id=item.seq.request_id,
            index=item.seq.index,
            token_ids=[item.token],
            text=text,
            logprobs=[item.logprobs] if item.logprobs is not None else [],
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            num_prompt_tokens=done.num_prompt_tokens,
            num_cached_tokens=item.seq.num_cached_tokens,
            prompt_logprobs=done.take_prompt_logprobs(),
            token_text_starts=starts,
            first_scheduled_time=item.seq.first_scheduled_time,
        )

    def _retire(self, step: ScheduledStep | None, outcome: _StepOutcome) -> None:
        """After a step that ran and was committed: the scheduler's bookkeeping of its blocks and of the sequences it
        ended (`Scheduler.postprocess`)."""
        self.scheduler.postprocess(step, outcome.finished, outcome.failures)
        self._forget_finished(outcome)

    def _retire_finished(self, outcome: _StepOutcome) -> None:
        """After a step that failed: free the blocks of the sequences it ended; their text may still wait
        (`_release_text`)."""
        self.scheduler.retire(outcome.finished)
        self._forget_finished(outcome)

    def _forget_finished(self, outcome: _StepOutcome) -> None:
        for seq in outcome.finished:
            self._forget_if_done(seq.request_id)

    # introspection ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        return {
            "waiting": len(self.scheduler.waiting),
            "running": len(self.scheduler.running),
            "kv_blocks": self.kv.usage(),
            "kv_usage": self.kv.usage_fraction(),
            "kv_reserved_pages": self.scheduler.reserved_pages,
            "kv_growth_ratio": self.scheduler.growth_ratio,
            "prefix_cache_hit_rate": self.kv.prefix_cache_hit_rate(),
            "prefix_cache_queries": self.kv.prefix_cache_queried_tokens,
            "prefix_cache_hits": self.kv.prefix_cache_hit_tokens,
            "preemptions": self.scheduler.num_preemptions,
            "spec_decode": self.speculator.stats.snapshot() if self.speculator is not None else None,
        }


