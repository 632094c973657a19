"""Sampling parameters, in the shape vLLM users know, validated at construction and again when a request
is submitted (the dataclass is mutable)."""

from __future__ import annotations

import copy
import math
import numbers
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from glimmer.engine.vllm_arguments import (
    VLLM_ONLY_ARGUMENTS,
    VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS,
    takes_vllm_arguments,
)
from glimmer.errors import RequestError

MAX_LOGPROBS = 20
# why vLLM's logprobs=-1 (every token of the vocabulary) is refused, in the API and on the server
EVERY_TOKEN_LOGPROBS_REFUSAL = (f"-1 (vLLM's every token of the vocabulary) is not supported; give the number of most "
                                f"likely tokens wanted, at most {MAX_LOGPROBS}")
MAX_N = 16384
"""Most completions of one prompt: a bound, so that an absurd `n` is refused instead of building that many
sequences (the server's own limit, `--max-n`, is lower)."""
GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this are greedy (vLLM's threshold): dividing logits by a subnormal one overflows them."""
MAX_TEMPERATURE = 3.4028234663852886e38
"""float32's largest value: the sampler divides float32 logits by the temperature, and a larger one becomes inf
there (logits / inf are 0 and NaN, and every draw was token 0)."""
REPETITION_PENALTY_RANGE = (1e-8, 1e8)
"""Repetition penalties allowed. A logit divided by the penalty and then by a temperature (at least 1e-5) stays
finite in float32 for any logit below 1e25 only within this range (a penalty below float32's smallest normal
overflowed the repeated logits to inf, a NaN distribution: token 0 every step); past it nothing changes anyway,
a repeated token's logit is already 1e8 times larger or smaller."""
SEED_RANGE = (-(2**63), 2**64)
"""Seeds a torch generator takes: [-2^63, 2^64)."""
LOGIT_BIAS_RANGE = (-100.0, 100.0)
"""What OpenAI accepts as a token's bias; -100 bans a token, +100 all but forces it."""
MAX_LOGIT_BIAS_ENTRIES = 4096
LOGIT_BIAS_SIZE_RULE = f"must be a dict of token id → bias with at most {MAX_LOGIT_BIAS_ENTRIES} entries"


def logit_bias_fits(bias: object) -> bool:
    """Whether `bias` is a dict of at most MAX_LOGIT_BIAS_ENTRIES entries (LOGIT_BIAS_SIZE_RULE), told before any
    entry is read: a request of a million biases (a 4 MB body) had each converted before its refusal."""
    return isinstance(bias, dict) and len(bias) <= MAX_LOGIT_BIAS_ENTRIES


CHAT_ALLOWED_TOKEN_IDS_REFUSAL = (
    "allowed_token_ids: not taken by chat, whose reply is written in the protocol's framing tokens (headers, "
    "channels, the end of the turn), which it would ban; use it with LLM.generate or /v1/completions on a prompt you "
    "render (LLM.get_tokenizer().apply_chat_template), or constrain a chat answer with response_format")
MAX_ALLOWED_TOKEN_IDS = 1 << 20
"""Most ids in `allowed_token_ids`: a bound past any vocabulary's size (the 30B's has 202,048)."""
ALLOWED_TOKEN_IDS_SIZE_RULE = (f"must be a non-empty list of at most {MAX_ALLOWED_TOKEN_IDS} token ids "
                               "(None: every token)")
MAX_STOP_TOKEN_IDS = 4096
"""Most ids in `stop_token_ids`, as many as `logit_bias` entries: each is converted on submission and every step's
token looked up among them."""
STOP_TOKEN_IDS_SIZE_RULE = f"must be a list of at most {MAX_STOP_TOKEN_IDS} token ids"
MAX_BAD_WORDS, MAX_BAD_WORD_CHARS = 1024, 1000
"""Most words in `bad_words`, and most characters in one (each is tokenized at submission and checked every step)."""
BAD_WORDS_SIZE_RULE = f"must be a list of at most {MAX_BAD_WORDS} strings (None or [] for none)"
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def structured_constraint_given(kind: str, value: object) -> bool:
    """Whether the structured-outputs constraint `kind` (a StructuredOutputsParams field, e.g. "regex") is given as
    `value`: not None, and for `json_object` not False (`json_object: false` asks for no JSON object). Any other
    field's False, or a 0 (which equals False), is a value given, refused naming its field."""
    return value is not None and not (kind == "json_object" and value is False)


_OPTIONAL_IN_FROM_OPTIONAL = ("n", "temperature", "top_p", "presence_penalty", "frequency_penalty",
                              "repetition_penalty")
"""The arguments for which vLLM's `SamplingParams.from_optional` reads None as the default."""
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
"""Fields the sampler reads as floats: an int given for one is taken, once checked, as the float it is (as the server
takes JSON numbers): the sampler's tensor of int temperatures was int64, which 2**63 overflowed in the step."""
_NUMBER_FIELDS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens", "seed", "logprobs",
                  "presence_penalty", "frequency_penalty", "repetition_penalty", "n", "prompt_logprobs",
                  "truncate_prompt_tokens")


def _vllm_logit_bias(logit_bias: dict[Any, Any]) -> dict[Any, Any]:
    """`logit_bias` as vLLM's `from_optional` reads it: an id string (OpenAI's keys) as its int, a bias clamped to
    [-100, 100]; whatever is no id or no number (NaN included) is left for `validate` to refuse."""
    low, high = LOGIT_BIAS_RANGE
    return {int(token) if isinstance(token, str) and token.isdecimal() else token:
            min(high, max(low, bias)) if isinstance(bias, numbers.Real) and (is_int(bias) or not math.isnan(bias))
            else bias
            for token, bias in logit_bias.items()}


def _check(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise RequestError(f"{param}: {message}", param=param)


def is_number(value: object) -> bool:
    """Whether `value` is a finite int or float; an int too large for a float is none (math.isfinite raised
    OverflowError on it)."""
    if is_int(value):
        return abs(value) <= sys.float_info.max
    return isinstance(value, float) and math.isfinite(value)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def plain_number(value: object) -> object:
    """A NumPy scalar (`numpy.int64(5)`, `numpy.float32(0.5)`) as the Python int or float it holds, so that a
    count or a temperature computed with NumPy is checked and used as that number; anything else as given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or type(value) in (int, float):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


_RESPONSE_FORMAT_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""OpenAI's rule for `response_format.json_schema.name` (its API refuses another name with a 400)."""


@takes_vllm_arguments(VLLM_ONLY_STRUCTURED_OUTPUTS_ARGUMENTS)
@dataclass
class StructuredOutputsParams:
    """What the generated text must be, in vLLM's shape: exactly one of the constraints.

    json: a JSON schema (a dict or its JSON text); the text is one JSON value valid against it.
    regex: the text matches this regular expression (Rust `regex` syntax), whole.
    choice: the text is one of these strings.
    grammar: a context-free grammar, in Lark or GBNF (llama.cpp) syntax.
    json_object: the text is one JSON object.
    strict: for `json`, False ignores JSON-schema keywords the grammar engine does not implement (OpenAI's
        non-strict `response_format`); True refuses such a schema.

    With `LLM.generate` (and /v1/completions) the constraint applies to the raw text; with `LLM.chat` (and
    /v1/chat/completions) to the answer only, after free reasoning.
    """

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    strict: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise RequestError naming the first invalid field (run at construction and again when a SamplingParams
        holding it is submitted: a field set afterwards, a second constraint beside the first, is checked too)."""
        # first: a json_object of another type (0, 1) counts as a constraint given, and beside another one would be
        # refused as a second constraint rather than for its type
        _check(self.json_object is None or isinstance(self.json_object, bool), "structured_outputs.json_object",
               "must be a boolean")
        given = self._given_kinds()
        _check(len(given) == 1, "structured_outputs",
               f"give exactly one of {', '.join(_STRUCTURED_KINDS)} (got {', '.join(given) or 'none'})")
        _check(self.json is None or isinstance(self.json, str | dict), "structured_outputs.json",
               "must be a JSON schema (an object or its JSON text)")
        _check(self.regex is None or (isinstance(self.regex, str) and self.regex != ""), "structured_outputs.regex",
               "must be a non-empty string")
        _check(self.choice is None or (isinstance(self.choice, list) and self.choice != []
                                       and all(isinstance(c, str) for c in self.choice)),
               "structured_outputs.choice", "must be a non-empty list of strings")
        _check(self.grammar is None or (isinstance(self.grammar, str) and self.grammar.strip() != ""),
               "structured_outputs.grammar", "must be a non-empty grammar text")
        _check(isinstance(self.strict, bool), "structured_outputs.strict", "must be a boolean")

    @property
    def kind(self) -> str:
        return self._given_kinds()[0]

    def _given_kinds(self) -> list[str]:
        """The constraints set (`structured_constraint_given`)."""
        return [kind for kind in _STRUCTURED_KINDS if structured_constraint_given(kind, getattr(self, kind))]

    @classmethod
    def from_response_format(cls, response_format: object) -> StructuredOutputsParams | None:
        """OpenAI's `response_format` (`text`, `json_object`, `json_schema`); None for text.

        Raises RequestError naming the field at fault.
        """
        if not isinstance(response_format, dict):
            raise RequestError("response_format: must be an object with a `type`", param="response_format")
        kind = response_format.get("type")
        allowed_keys = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
        if not isinstance(kind, str) or kind not in allowed_keys:  # a list or object would not hash
            raise RequestError(f"response_format.type: {kind!r} is not one of 'text', 'json_object', 'json_schema'",
                               param="response_format.type")
        unknown = sorted(set(response_format) - allowed_keys[kind])
        if unknown:
            raise RequestError(f"response_format.{unknown[0]}: unknown field for type {kind!r}",
                               param=f"response_format.{unknown[0]}")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls(json_object=True)
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise RequestError("response_format.json_schema: required for type 'json_schema'; an object with "
                               "`name` and `schema`", param="response_format.json_schema")
        unknown = sorted(set(spec) - {"name", "description", "schema", "strict"})
        if unknown:
            raise RequestError(f"response_format.json_schema.{unknown[0]}: unknown field",
                               param=f"response_format.json_schema.{unknown[0]}")
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise RequestError("response_format.json_schema.name: required, a non-empty string",
                               param="response_format.json_schema.name")
        if not _RESPONSE_FORMAT_NAME.fullmatch(spec["name"]):
            raise RequestError(f"response_format.json_schema.name: {spec['name'][:80]!r} is not a name OpenAI takes: "
                               "letters a-z and A-Z, digits, '_' and '-', at most 64 of them",
                               param="response_format.json_schema.name")
        description = spec.get("description")
        if description is not None and not isinstance(description, str):  # never shown to the model: its type is all
            raise RequestError("response_format.json_schema.description: must be a string",
                               param="response_format.json_schema.description")
        schema = spec.get("schema")
        if schema is None:  # optional in OpenAI's chat API (any JSON value); null is the field left out
            schema = {}
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema: must be a JSON schema object",
                               param="response_format.json_schema.schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise RequestError("response_format.json_schema.strict: must be a boolean",
                               param="response_format.json_schema.strict")
        return cls(json=schema, strict=strict is True)


@takes_vllm_arguments(VLLM_ONLY_ARGUMENTS)
@dataclass(kw_only=True)
class SamplingParams:
    """How to pick tokens and when to stop. Its arguments are keyword-only (vLLM's first is `n`, not `temperature`).

    temperature: 0 means greedy (argmax), as does any temperature below 1e-5; otherwise logits are divided by
        it before sampling.
    top_p, top_k, min_p: nucleus, top-k (0 or -1 = off) and min-p filtering, applied after temperature in
        vLLM's order: min-p, top-k, then top-p on what those two left.
    max_tokens: the most tokens to generate (None: up to the model's context length; 0: none, the prompt
        is only scored, see prompt_logprobs).
    stop: strings that end generation; the stop string itself is not included in the text.
    stop_token_ids: extra token ids that end generation (the checkpoint's stop ids always apply
        unless ignore_eos is set).
    seed: per-request seed; the same seed gives the same tokens whatever else runs in the batch. -1 is None, no
        seed, as in vLLM.
    logprobs: if set, return each generated token's logprob and the `logprobs` most likely
        alternatives, from the model's own distribution (before temperature and penalties). True is 1, as in vLLM.
    prompt_logprobs: if set, also return each prompt token's logprob (the first is None: nothing predicts
        it) and the `prompt_logprobs` most likely alternatives at its position, from the same distribution.
        The prompt is then computed in full: the prefix cache is not used for it.
    skip_special_tokens: leave special tokens out of the text (token ids and logprobs are unaffected). None (the
        default): `generate` keeps them (P-TOK-3); `LLM.chat` hides all but the turn framing from the parsed reply,
        as the server's chat does (P-REQ-1). `LLM.chat` always generates with them and applies this to the reply.
    include_stop_str_in_output: keep the matched stop string at the end of the text, and the text of a
        `stop_token_ids` token that ended it (special tokens, the turn framing, are always kept: P-TOK-3).
    logit_bias: token id → a bias in [-100, 100] added to its logit before penalties, temperature and
        filtering, as OpenAI and vLLM apply it (greedy decoding included; logprobs stay the model's own).
    allowed_token_ids: the only ids that may be sampled, as in vLLM (every other token's logit is -inf after the
        bias and penalties; greedy decoding included; logprobs stay the model's own). A non-empty list; not with
        structured_outputs (a grammar constrains the tokens itself) or in `LLM.chat` (a reply needs its framing).
    truncate_prompt_tokens: keep only the prompt's last k tokens (vLLM's left truncation), of the prompt as the
        model reads it (after tokenizing, media expansion, or the chat template); -1 is max_model_len. The truncated
        prompt is the request's: its prompt_token_ids, usage, prompt_logprobs and prefix caching. At most
        max_model_len; a cut inside an image's or video's placeholder tokens is refused.
    bad_words: words the output may not hold, as in vLLM (bad_words.py): a word's last token is banned right after
        the output's tokens spell the rest of it, bare or after a space. Non-empty strings; not with
        structured_outputs (the grammar could force a banned token).
    presence_penalty, frequency_penalty: OpenAI-style, over generated tokens, in [-2, 2].
    repetition_penalty: HF-style multiplicative penalty over prompt and generated tokens (1 = off).
    n: number of independent completions of the same prompt (at most 16384).
    structured_outputs: constrain the text by a grammar (see StructuredOutputsParams).
    cache_salt: a non-empty string mixed into the prefix-cache key of the prompt's first block: only requests
        with the same salt share cached KV blocks (one salt per tenant keeps tenants apart). None: shared with
        every other request that has no salt.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None
    cache_salt: str | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    bad_words: list[str] | None = None

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_optional(cls, **arguments: Any) -> SamplingParams:
        """vLLM's constructor for values that may be None (an OpenAI request's): None is the default for `n`,
        `temperature`, `top_p` and the three penalties; `logit_bias` keys may be id strings (OpenAI's) and biases are
        clamped to [-100, 100], as vLLM's does. The other arguments are taken as `SamplingParams(...)` takes them.
        Raises what `SamplingParams(...)` raises."""
        for name in _OPTIONAL_IN_FROM_OPTIONAL:
            if name in arguments and arguments[name] is None:
                del arguments[name]
        if logit_bias_fits(arguments.get("logit_bias")):
            arguments["logit_bias"] = _vllm_logit_bias(arguments["logit_bias"])  # (a larger one is refused as it is)
        return cls(**arguments)

    def clone(self) -> SamplingParams:
        """A deep copy (vLLM's `clone()`): changing it, its stop lists or its constraint leaves this one as it is."""
        return copy.deepcopy(self)

    def validate(self) -> None:
        """Raise RequestError naming the first invalid field (run at construction and on submission). `stop` and
        `stop_token_ids` set after construction are taken as at construction (one string as a list of it, a tuple
        as a list, None as none; `allowed_token_ids` and `bad_words` as lists likewise), and NumPy scalars are taken
        as the Python numbers they hold."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None or isinstance(self.stop, tuple):
            self.stop = list(self.stop or [])
        if self.stop_token_ids is None or isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.allowed_token_ids, tuple | set | frozenset | range):
            self.allowed_token_ids = list(self.allowed_token_ids)
        if isinstance(self.bad_words, tuple):
            self.bad_words = list(self.bad_words)
        # sized before any entry is read: a server's request of a million ids or biases (a 4 MB body) had each one
        # converted, on the event loop that every other stream waits for, before it was refused for its size
        if self.allowed_token_ids is not None:
            count = len(self.allowed_token_ids) if isinstance(self.allowed_token_ids, list) else 0
            _check(0 < count <= MAX_ALLOWED_TOKEN_IDS, "allowed_token_ids", ALLOWED_TOKEN_IDS_SIZE_RULE)
        if self.logit_bias is not None:
            _check(logit_bias_fits(self.logit_bias), "logit_bias", LOGIT_BIAS_SIZE_RULE)
        if isinstance(self.stop_token_ids, list):
            _check(len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS, "stop_token_ids", STOP_TOKEN_IDS_SIZE_RULE)
        for name in _NUMBER_FIELDS:
            setattr(self, name, plain_number(getattr(self, name)))
        for name in ("stop_token_ids", "allowed_token_ids"):
            if isinstance(getattr(self, name), list):
                setattr(self, name, [plain_number(t) for t in getattr(self, name)])
        if isinstance(self.logit_bias, dict):
            self.logit_bias = {plain_number(t): plain_number(b) for t, b in self.logit_bias.items()}
        if is_int(self.seed) and self.seed == -1:  # vLLM's "no seed": a fresh draw each request, not stream -1
            self.seed = None
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is True:  # vLLM's: one most likely alternative, as OpenAI's `logprobs: true` asks
                setattr(self, name, 1)
        _check(isinstance(self.stop, list), "stop", "must be a string or a list of strings")
        _check(isinstance(self.stop_token_ids, list), "stop_token_ids", "must be a list of token ids")
        _check(is_number(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE, "temperature",
               f"must be a number from 0 to float32's largest value, {MAX_TEMPERATURE!r} (the sampler divides "
               "float32 logits by it)")
        _check(is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        _check(
            isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and self.top_k >= -1,
            "top_k",
            "must be an integer >= -1 (0 or -1 disables it)",
        )
        _check(is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        if self.max_tokens is not None:
            _check(
                isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool) and self.max_tokens >= 0,
                "max_tokens",
                "must be an integer >= 0",
            )
        _check(is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens",
                   f"{self.min_tokens} is more than max_tokens={self.max_tokens}; lower min_tokens to at most "
                   f"{self.max_tokens}, or raise max_tokens")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
        _check(
            all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "must be non-negative integers",
        )
        if self.seed is not None:
            _check(is_int(self.seed) and SEED_RANGE[0] <= self.seed < SEED_RANGE[1], "seed",
                   "must be an integer in [-2**63, 2**64)")
            extra = self.n - 1 if is_int(self.n) and self.n > 1 else 0
            _check(self.seed + extra < SEED_RANGE[1], "seed",
                   f"seed + n - 1 must be below 2**64, since completion i draws with seed + i; with n={extra + 1} "
                   f"the seed may be at most {SEED_RANGE[1] - 1 - extra}")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            _check(isinstance(getattr(self, name), bool), name, "must be a boolean")
        _check(self.skip_special_tokens is None or isinstance(self.skip_special_tokens, bool), "skip_special_tokens",
               "must be a boolean (or None for the default)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(not (is_int(value) and value == -1), name, EVERY_TOKEN_LOGPROBS_REFUSAL)
            if value is not None:
                _check(
                    isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_LOGPROBS,
                    name,
                    f"must be an integer between 0 and {MAX_LOGPROBS}",
                )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(is_number(value) and -2 <= value <= 2, name, "must be in [-2, 2]")
        low, high = REPETITION_PENALTY_RANGE
        _check(
            is_number(self.repetition_penalty) and low <= self.repetition_penalty <= high,
            "repetition_penalty",
            f"must be a number in [{low:g}, {high:g}] (1 = off; beyond that range float32 logits overflow)",
        )
        for name in _FLOAT_FIELDS:
            setattr(self, name, float(getattr(self, name)))
        _check(is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"must be an integer in [1, {MAX_N}]")
        _check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
               "structured_outputs", "must be a StructuredOutputsParams")
        if self.structured_outputs is not None:
            self.structured_outputs.validate()
        _check(self.structured_outputs is None or not self.min_tokens, "min_tokens",
               "cannot be combined with structured_outputs: the grammar decides where the text ends; drop one")
        if self.cache_salt is not None:
            _check(isinstance(self.cache_salt, str) and self.cache_salt != "", "cache_salt",
                   "must be a non-empty string (leave it out for no salt)")
        if self.allowed_token_ids is not None:
            bad = [t for t in self.allowed_token_ids if not (is_int(t) and t >= 0)]
            _check(not bad, "allowed_token_ids", f"{bad[0]!r} is not a token id (an integer >= 0)" if bad else "")
            _check(self.structured_outputs is None, "allowed_token_ids",
                   "cannot be combined with structured_outputs: the grammar decides which tokens may follow; drop one")
        if self.truncate_prompt_tokens is not None:
            _check(is_int(self.truncate_prompt_tokens) and (self.truncate_prompt_tokens >= 1
                                                             or self.truncate_prompt_tokens == -1),
                   "truncate_prompt_tokens", f"must be an integer >= 1 (the prompt's last tokens kept) or -1 "
                   f"(max_model_len), not {self.truncate_prompt_tokens!r} (None: no truncation)")
        if self.bad_words is not None:
            _check(isinstance(self.bad_words, list) and len(self.bad_words) <= MAX_BAD_WORDS, "bad_words",
                   BAD_WORDS_SIZE_RULE)
            bad = [w for w in self.bad_words if not (isinstance(w, str) and w.strip() and len(w) <= MAX_BAD_WORD_CHARS)]
            _check(not bad, "bad_words", f"{bad[0]!r} is not a word: each must be a string of 1 to "
                   f"{MAX_BAD_WORD_CHARS} characters, not all whitespace" if bad else "")
            _check(self.structured_outputs is None or not self.bad_words, "bad_words",
                   "cannot be combined with structured_outputs: the grammar could force a banned token; drop one")
        if self.logit_bias is not None:
            low, high = LOGIT_BIAS_RANGE
            for token, bias in self.logit_bias.items():
                _check(is_int(token) and token >= 0, "logit_bias",
                       f"key {token!r} is not a token id (an integer >= 0)")
                _check(is_number(bias) and low <= bias <= high, "logit_bias",
                       f"the bias of token {token} must be a number in [{low:g}, {high:g}]")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
