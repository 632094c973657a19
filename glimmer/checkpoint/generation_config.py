"""Generation defaults of a checkpoint: stop ids, bos/pad, and sampling defaults from generation_config.json.

Stop ids follow P-TOK-2. The release's generation_config.json lists `eos_token_id: [<|end_of_text|>,
<|eot|>]`; checkpoints converted by other tools often keep only the model config's single eos, under
which a chat turn would never stop at `<|eot|>`, so a lone configured id is completed with `<|eot|>`.
Ids are resolved through the tokenizer, never hard-coded (P-TOK-1).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glimmer.checkpoint.config import TextConfig
from glimmer.checkpoint.json_files import read_json_object
from glimmer.errors import ConfigError

logger = logging.getLogger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"
GENERATION_CONFIG_MODES = ("auto", "vllm")
"""vLLM's generation_config: "auto" takes the checkpoint's sampling defaults for what a request leaves out, "vllm"
plain SamplingParams() (OpenAI's defaults on the server)."""
FOLDER_MODE_REFUSED = ("a folder of its own generation_config.json, vLLM's third form, is not supported: edit the "
                       "checkpoint's file, or set the values in each request")


def check_generation_config_mode(mode: object) -> None:
    """ConfigError naming `generation_config` for a mode other than `GENERATION_CONFIG_MODES`'."""
    if mode not in GENERATION_CONFIG_MODES:
        raise ConfigError(f"generation_config={mode!r} is not supported; use "
                          f"{' or '.join(map(repr, GENERATION_CONFIG_MODES))} ({FOLDER_MODE_REFUSED})")

# SamplingParams' bounds (engine/sampling_params.py: MAX_TEMPERATURE, REPETITION_PENALTY_RANGE, float32's limits
# in the sampler), so that no default is one every request taking it would be refused for
MAX_TEMPERATURE = 3.4028234663852886e38
REPETITION_PENALTY_RANGE = (1e-8, 1e8)
EOT_TOKEN = "<|eot|>"
EOM_TOKEN = "<|eom|>"


@dataclass(frozen=True)
class GenerationDefaults:
    """What a checkpoint says about generating from it. Sampling fields are None when not configured."""

    stop_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    do_sample: bool | None = None
    max_new_tokens: int | None = None
    max_length: int | None = None

    def sampling_defaults(self) -> dict[str, float | int]:
        """The fields the checkpoint configures, as the defaults of a request that leaves them out: the server's
        and `LLM`'s, as vLLM's `generation_config="auto"` takes them (temperature, top_p, top_k, min_p,
        repetition_penalty, and max_new_tokens as `max_tokens`). `do_sample` is not one: as in vLLM, a request
        samples by its temperature (OpenAI's default 1), where transformers' `generate` with `do_sample: false`
        decodes greedily; ask for temperature 0 to match it."""
        fields = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                  "repetition_penalty": self.repetition_penalty, "max_tokens": self.max_new_tokens}
        return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True)
class EmbeddedGenerationConfig:
    """generation_config.json's fields as a checkpoint file carries them itself (a GGUF's metadata)."""

    fields: dict[str, Any]
    # field → the key it was read from (temperature → general.sampling.temp), which errors name
    source_keys: dict[str, str]


def load_generation_defaults(
    checkpoint_dir: str | os.PathLike[str],
    text_config: TextConfig,
    token_to_id: Callable[[str], int | None],
    embedded: EmbeddedGenerationConfig | None = None,
    *,
    tokenizer_eos_id: int | None = None,
    id_to_token: Callable[[int], str | None] | None = None,
) -> GenerationDefaults:
    """Read `generation_config.json` (optional) and resolve the stop ids (P-TOK-2).

    `embedded`: the same fields carried by the checkpoint itself (a GGUF's tokenizer metadata), used
    instead of the file; `checkpoint_dir` then names the checkpoint in errors, and a field its source key.
    `tokenizer_eos_id`: the tokenizer's eos_token id, the end-of-text stop id where config.json's eos_token_id is
    null and generation_config.json names none (vLLM stops at it whatever the configs say).
    `id_to_token`: the tokenizer's id -> token lookup (None: no token has that id); a stop id it finds no token for
    names no token (a padded vocabulary's rows, or a gap in the tokenizer's ids).
    Raises ConfigError naming the file when it is not valid JSON, a field has the wrong type, no stop id
    remains, or a stop id is outside the model's vocabulary or names no token.
    """
    if embedded is not None:
        path, config, source_keys = Path(checkpoint_dir), embedded.fields, embedded.source_keys
    else:
        path = Path(checkpoint_dir) / GENERATION_CONFIG_FILE
        config, source_keys = _read_generation_config(path), {}
    fields = _Fields(config, path, source_keys)

    configured_eos = fields.token_ids("eos_token_id")
    if configured_eos is None:
        configured_eos, key = text_config.eos_token_id, "eos_token_id"
        origin = f"config.json {key}"
        if not configured_eos:
            # transformers' generate then stops at no id and vLLM at the tokenizer's eos_token alone, which would let
            # a chat turn run on past its <|eot|>: the engine stops at both (P-TOK-2)
            configured_eos = (tokenizer_eos_id,) if tokenizer_eos_id is not None else ()
            logger.warning("config.json's eos_token_id is null and %s names none: generation stops at the "
                           "tokenizer's eos_token (where it names one) and at %s (the protocol's turn end)", path,
                           EOT_TOKEN)
    else:
        key = fields.key("eos_token_id")
        origin = f"{path} {key}"
    stop_ids = _stop_token_ids(configured_eos, origin, key, token_to_id)
    out_of_range = [i for i in stop_ids if i >= text_config.vocab_size]
    if out_of_range:
        raise ConfigError(
            f"{origin}: stop ids {out_of_range} are outside the model's vocabulary "
            f"(vocab_size={text_config.vocab_size}); the tokenizer and model do not match: "
            f"{_stop_ids_fix(key, tokenizer_eos_id, token_to_id)}"
        )
    # the model's rows past the tokenizer's tokens (a vocabulary padded to a multiple) are never sampled; nor are the
    # ids a tokenizer skips (its ids can have gaps, as check_tokenizer_fits says), so each id is looked up, not
    # compared with the tokenizer's token count
    no_token = [i for i in stop_ids if id_to_token(i) is None] if id_to_token is not None else []
    if no_token:
        raise ConfigError(
            f"{origin}: stop ids {no_token} name no token of the tokenizer, so generation never stops there; "
            f"{_stop_ids_fix(key, tokenizer_eos_id, token_to_id)}"
        )

    bos = fields.token_ids("bos_token_id", single=True)
    if bos is not None and bos[0] >= text_config.vocab_size:
        raise ConfigError(f"{path}: {fields.key('bos_token_id')}={bos[0]} is outside the model's vocabulary "
                          f"(vocab_size={text_config.vocab_size}); the tokenizer and model do not match")
    pad = fields.token_ids("pad_token_id", single=True, negative=True)
    if pad is not None and not 0 <= pad[0] < text_config.vocab_size:
        # a warning, not bos's error: nothing pads with it (config.py leaves config.json's alone for the same reason;
        # converted checkpoints often set it to vocab_size or -1), but a file naming no row of the model is worth a
        # look
        logger.warning("%s: %s=%d is outside the model's vocabulary (vocab_size=%d); Glimmer does not use it (it pads "
                       "nothing), so loading goes on, but the file may belong to another model", path,
                       fields.key("pad_token_id"), pad[0], text_config.vocab_size)
    return GenerationDefaults(
        stop_token_ids=stop_ids,
        bos_token_id=bos[0] if bos is not None else text_config.bos_token_id,
        pad_token_id=pad[0] if pad is not None else text_config.pad_token_id,
        temperature=fields.number("temperature", minimum=0.0, maximum=MAX_TEMPERATURE),
        top_p=fields.number("top_p", minimum=0.0, maximum=1.0, above_minimum=True),
        top_k=fields.integer("top_k", minimum=-1),  # -1 and 0 are off, as SamplingParams (and vLLM) read them
        min_p=fields.number("min_p", minimum=0.0, maximum=1.0),
        repetition_penalty=fields.number("repetition_penalty", *REPETITION_PENALTY_RANGE),
        do_sample=fields.boolean("do_sample"),
        max_new_tokens=fields.integer("max_new_tokens", minimum=1),
        max_length=fields.integer("max_length", minimum=1),
    )


def _stop_ids_fix(key: str, tokenizer_eos_id: int | None, token_to_id: Callable[[str], int | None]) -> str:
    """The fix for stop ids that are no tokens of the model: the ids to set `key` to, where the tokenizer has them."""
    ids = [i for i in dict.fromkeys((tokenizer_eos_id, token_to_id(EOT_TOKEN))) if i is not None]
    named = f", {ids}" if ids else ""
    return (f"set {key} to the tokenizer's eos_token and {EOT_TOKEN} ids{named}, or use the tokenizer the model was "
            "trained with")


def _stop_token_ids(
    configured: tuple[int, ...], origin: str, key: str, token_to_id: Callable[[str], int | None]
) -> tuple[int, ...]:
    """`origin`: where the ids were read ("<file> <key>"); `key`: the field to set, named in the fix."""
    stop_ids = tuple(dict.fromkeys(configured))
    eom_id = token_to_id(EOM_TOKEN)
    if eom_id is not None and eom_id in stop_ids:
        # <|eom|> ends a message but not the turn: the reasoning message and every non-final tool call
        # end with it, and the model goes on with the next message. Stopping there would end every turn
        # right after its reasoning (P-TOK-2, architecture.md §5.5).
        logger.warning(
            "%s lists %s (id %d) as a stop token; ignoring it, since the turn continues after it",
            origin,
            EOM_TOKEN,
            eom_id,
        )
        stop_ids = tuple(i for i in stop_ids if i != eom_id)
    if len(stop_ids) <= 1:
        eot_id = token_to_id(EOT_TOKEN)
        if eot_id is None:
            logger.warning("the tokenizer has no %s; turns stop only at %s", EOT_TOKEN, origin)
        elif eot_id not in stop_ids:
            stop_ids = (*stop_ids, eot_id)
    if not stop_ids:
        raise ConfigError(
            f"{origin} leaves no stop token (and the tokenizer has no {EOT_TOKEN}); set {key} to the end-of-text and "
            f"{EOT_TOKEN} ids"
        )
    return stop_ids


def _read_generation_config(path: Path) -> dict[str, Any]:
    config = read_json_object(path)
    if config is None:
        logger.info("%s not found; stop ids come from config.json", path)
        return {}
    return config


class _Fields:
    """Typed access to generation_config.json fields; a null or absent field reads as None. Errors name a field
    by its key in `source_keys` where it has one (a GGUF's general.sampling.temp), else as generation_config.json
    does."""

    def __init__(self, config: dict[str, Any], path: Path, source_keys: dict[str, str]):
        self._config = config
        self._path = path
        self._source_keys = source_keys

    def key(self, name: str) -> str:
        """What the checkpoint calls field `name`: its source key (a GGUF's), else generation_config.json's name."""
        return self._source_keys.get(name, name)

    def _invalid(self, name: str, expected: str) -> ConfigError:
        return ConfigError(f"{self._path}: {self.key(name)}={self._config[name]!r} is invalid; expected {expected}")

    def token_ids(self, name: str, single: bool = False, *, negative: bool = False) -> tuple[int, ...] | None:
        """negative: an id below 0 is read too (a pad_token_id of -1, which names no token), not refused."""
        value = self._config.get(name)
        if value is None:
            return None
        ids = value if isinstance(value, list) and not single else [value]
        if not ids or not all(_is_int(i) and (negative or i >= 0) for i in ids):
            raise self._invalid(
                name, "a token id" if single else "a token id or a non-empty list of token ids"
            )
        return tuple(ids)

    def number(self, name: str, minimum: float, maximum: float = math.inf, *, above_minimum: bool = False
               ) -> float | None:
        """above_minimum: the minimum itself is out of range too (top_p=0 would keep no token at all)."""
        value = self._config.get(name)
        if value is None:
            return None
        numeric = _is_int(value) or isinstance(value, float)
        if not numeric or not ((minimum < value if above_minimum else minimum <= value) and value <= maximum):
            raise self._invalid(name, f"a number in {'(' if above_minimum else '['}{minimum}, {maximum}]")
        return float(value)

    def integer(self, name: str, minimum: int) -> int | None:
        value = self._config.get(name)
        if value is None:
            return None
        if not _is_int(value) or value < minimum:
            raise self._invalid(name, f"an integer ≥ {minimum}")
        return value

    def boolean(self, name: str) -> bool | None:
        value = self._config.get(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self._invalid(name, "true or false")
        return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
