"""The tokenizer, chat template and stop ids a Muse Glimmer GGUF carries in its `tokenizer.*` metadata.

llama.cpp's converter writes Muse Glimmer's tokenizer with `_set_vocab_gpt2` (conversion/muse_glimmer.py):
`tokenizer.ggml.model = "gpt2"` (byte-level BPE), the token strings in id order, their types (1 normal,
3 control = special, 4 user-defined = added non-special, 5 unused = padding up to the embedding rows),
the merges as "left right" strings, the bos / eos / eot / pad ids and `tokenizer.chat_template`. The
pre-tokenizer is named, not stored: Muse Glimmer's tokenizer is Llama 4's 200k tiktoken vocabulary
(architecture.md §5.5), which llama.cpp names 'llama4' and splits with the GPT-4o (o200k) pattern,
'gpt-4o' being the same split. Any other name is refused rather than guessed.

The rebuilt `tokenizers` tokenizer matches the Hugging Face tokenizer.json the GGUF was converted from:
byte-level BPE whose vocabulary holds every token at its GGUF id, `ignore_merges` as transformers sets it
for tiktoken vocabularies (a pre-token that is a whole vocabulary entry is not re-merged), the specials as
added tokens matched before the split, and a post-processor that prepends BOS when
`tokenizer.ggml.add_bos_token` is true (as the release's does, §5.5) and appends EOS when
`tokenizer.ggml.add_eos_token` is (as llama.cpp and transformers do; the release's does not).

Sampling defaults: `general.sampling.temp` / `top_p` / `top_k` / `min_p`, which llama.cpp's converters copy from
generation_config.json, become temperature / top_p / top_k / min_p, so a GGUF samples as its safetensors source.

Stop ids: eos and eot (`<|eot|>` ends the assistant turn), never eom (`<|eom|>` ends a message inside
the turn — architecture.md §5.5, §14.21).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from glimmer.checkpoint.generation_config import EmbeddedGenerationConfig
from glimmer.checkpoint.gguf_file import GGUFFile, unread_keys

logger = logging.getLogger(__name__)

# llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O split (llama-vocab.cpp), used for 'gpt-4o' and 'llama4'
O200K_SPLIT = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
PRE_TOKENIZERS = {"llama4": O200K_SPLIT, "gpt-4o": O200K_SPLIT}

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5
_NAMED_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
}
# <|eot|>, a stop id beside eos (architecture.md §5.5)
_EOT_KEY = "tokenizer.ggml.eot_token_id"


@dataclass(frozen=True)
class GGUFTokenizer:
    backend: Tokenizer
    # bos_token / eos_token / pad_token / unk_token → token string, as tokenizer_config.json names them
    named_tokens: dict[str, str]
    chat_template: str | None
    # tokenizer.chat_template.tool_use: the template llama.cpp renders a chat with tools with, where there is one
    tool_use_chat_template: str | None
    # a generation_config.json equivalent (eos_token_id: [eos, eot], bos_token_id, pad_token_id and the
    # general.sampling.* defaults as temperature, top_k, top_p), errors naming the GGUF keys
    generation_config: EmbeddedGenerationConfig


def read_gguf_tokenizer(file: GGUFFile) -> GGUFTokenizer:
    """Rebuild the tokenizer from `tokenizer.ggml.*`; CheckpointError names the key at fault."""
    model = file.string("tokenizer.ggml.model")
    if model != "gpt2":
        raise file.error(f"tokenizer.ggml.model={model!r} is not supported; Muse Glimmer's tokenizer is byte-level "
                         "BPE ('gpt2')")
    pre = file.string("tokenizer.ggml.pre") if file.has("tokenizer.ggml.pre") else None
    if pre not in PRE_TOKENIZERS:
        raise file.error(f"tokenizer.ggml.pre={pre!r} is not a pre-tokenizer Glimmer knows for Muse Glimmer; "
                         f"expected one of {sorted(PRE_TOKENIZERS)}")
    tokens = file.array("tokenizer.ggml.tokens", "STRING")
    types = file.array("tokenizer.ggml.token_type", "INTEGER") if file.has("tokenizer.ggml.token_type") else None
    if types is not None and len(types) != len(tokens):
        raise file.error(f"tokenizer.ggml.token_type has {len(types)} entries but tokenizer.ggml.tokens has "
                         f"{len(tokens)}")
    types = types or [NORMAL] * len(tokens)
    merges = []
    for index, merge in enumerate(file.array("tokenizer.ggml.merges", "STRING")):
        parts = merge.split(" ")
        if len(parts) != 2 or not all(parts):
            raise file.error(f"tokenizer.ggml.merges[{index}]={merge!r} is not two tokens separated by a space")
        merges.append((parts[0], parts[1]))

    vocab: dict[str, int] = {}
    for token_id, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == UNUSED:
            continue  # the converter's [PAD{i}] rows between the tokenizer's size and the embedding's
        if token in vocab:
            raise file.error(f"tokenizer.ggml.tokens lists {token!r} twice (ids {vocab[token]} and {token_id})")
        vocab[token] = token_id
    try:
        backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    except Exception as exc:  # the tokenizers library raises a bare Exception (e.g. a merge of unlisted tokens)
        raise file.error(f"tokenizer.ggml.tokens and tokenizer.ggml.merges do not form a BPE tokenizer: "
                         f"{exc}") from None
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZERS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    added = [(tokens[i], kind) for i, kind in enumerate(types) if kind in (CONTROL, USER_DEFINED)]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in added if k == CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in added if k == USER_DEFINED])

    named = {name: tokens[_token_id(file, key, types)] for name, key in _NAMED_IDS.items() if file.has(key)}
    if "eos_token" not in named:
        raise file.error("required metadata key tokenizer.ggml.eos_token_id is missing")
    add_bos = True
    if file.has("tokenizer.ggml.add_bos_token"):
        add_bos = file.boolean("tokenizer.ggml.add_bos_token")
    else:
        logger.warning("%s: tokenizer.ggml.add_bos_token is absent; prepending BOS as Muse Glimmer's tokenizer does",
                       file.path)
    if add_bos and "bos_token" not in named:
        raise file.error("tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing")
    # llama.cpp and transformers append EOS to a prompt when the file says so; Muse Glimmer's release does not
    add_eos = file.has("tokenizer.ggml.add_eos_token") and file.boolean("tokenizer.ggml.add_eos_token")
    if add_bos or add_eos:
        # one BOS before each segment, as the release's post-processor does (§5.5), and one EOS after, if asked
        bos, eos = named.get("bos_token") if add_bos else None, named["eos_token"] if add_eos else None

        def segment(text: str, type_id: int) -> str:
            return " ".join(f"{piece}:{type_id}" for piece in (bos, text, eos) if piece)

        backend.post_processor = processors.TemplateProcessing(
            single=segment("$A", 0), pair=f"{segment('$A', 0)} {segment('$B', 1)}",
            special_tokens=[(token, vocab[token]) for token in (bos, eos) if token],
        )
    stop_keys = [key for key in (_NAMED_IDS["eos_token"], _EOT_KEY) if file.has(key)]
    generation: dict[str, Any] = {"eos_token_id": [_token_id(file, key, types) for key in stop_keys]}
    for key, name in (("bos_token_id", "bos_token"), ("pad_token_id", "pad_token")):
        if name in named:
            generation[key] = vocab[named[name]]
    generation |= _sampling_defaults(file)
    template, tool_use = (file.string(key) if file.has(key) else None
                          for key in ("tokenizer.chat_template", "tokenizer.chat_template.tool_use"))
    # errors about these fields (generation_config.py) name the keys they were read from
    source_keys = _SAMPLING_SOURCE_KEYS | {"eos_token_id": " and ".join(stop_keys),
                                           "bos_token_id": _NAMED_IDS["bos_token"],
                                           "pad_token_id": _NAMED_IDS["pad_token"]}
    return GGUFTokenizer(backend, named, template, tool_use, EmbeddedGenerationConfig(generation, source_keys))


def _token_id(file: GGUFFile, key: str, types: list[int]) -> int:
    """The id `key` holds, which must be a token of tokenizer.ggml.tokens (not one of the converter's padding rows);
    CheckpointError names the key."""
    token_id = file.integer(key)
    if not 0 <= token_id < len(types) or types[token_id] == UNUSED:
        raise file.error(f"{key}={token_id} is not a token of tokenizer.ggml.tokens")
    return token_id


# llama.cpp's converters write the model's sampling defaults (its generation_config.json) under these keys
# (gguf.Keys.General.SAMPLING_*); they are the defaults of a request that leaves the field out, as
# generation_config.json's are for a safetensors checkpoint
# (`general.sampling.penalty_repeat` is llama.cpp's penalty over the last `penalty_last_n` tokens, not
# transformers' repetition_penalty over the whole sequence, so it is not read as one)
_SAMPLING_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
                  "general.sampling.min_p": "min_p"}
_SAMPLING_PREFIX = "general.sampling."
_SAMPLING_TOP_K = "general.sampling.top_k"
_SAMPLING_SOURCE_KEYS = {name: key for key, name in _SAMPLING_KEYS.items()} | {"top_k": _SAMPLING_TOP_K}


def _sampling_defaults(file: GGUFFile) -> dict[str, Any]:
    """temperature / top_p / min_p / top_k from general.sampling.*, where present (generation_config validates
    them)."""
    defaults: dict[str, Any] = {name: file.number(key) for key, name in _SAMPLING_KEYS.items() if file.has(key)}
    if file.has(_SAMPLING_TOP_K):
        defaults["top_k"] = file.integer(_SAMPLING_TOP_K)
    # the others (penalty_repeat, penalty_last_n, mirostat, xtc_*, sequence) are llama.cpp's own samplers: a request
    # does not run them, so they are said to be ignored, as the muse-glimmer.* keys Glimmer does not read are
    unread = unread_keys(file, _SAMPLING_PREFIX, _SAMPLING_SOURCE_KEYS.values())
    if unread:
        logger.warning("%s: ignoring sampling defaults Glimmer does not read (llama.cpp's own samplers; set them in "
                       "each request where Glimmer has one): %s", file.path, ", ".join(unread))
    return defaults
