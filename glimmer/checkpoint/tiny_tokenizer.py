"""A tiny byte-level BPE tokenizer with the Muse special tokens, for test and demo checkpoints.

It has the shape of the release tokenizer (architecture.md §5.5) at a size a test can afford: an
o200k-style split regex, byte-level BPE, the Muse special tokens as added tokens, a post-processor that
prepends `<|begin_of_text|>` (so the double-BOS trap of P-TMPL-5 is real in tests), and the
`tokenizer_config.json` / `special_tokens_map.json` that transformers expects. The merges are trained
deterministically on a small embedded corpus (prose, code, JSON, ATEM tool calls), so tokens split text
the way a real vocabulary does: common words whole, rare characters byte by byte.

The special tokens sit at ids of this tokenizer's own choosing, in an order unlike the release's
(200000 + i). Code that hard-codes an id instead of resolving the token string (P-TOK-1) fails on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from glimmer.checkpoint.gguf_tokenizer import O200K_SPLIT

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
PAD_TOKEN = "<|finetune_right_pad|>"
EOT_TOKEN = "<|eot|>"
EOM_TOKEN = "<|eom|>"
IMAGE_TOKEN = "<|patch|>"
VIDEO_TOKEN = "<|video|>"
# the DFlash drafter's mask token in the release — architecture.md §1.4
DFLASH_MASK_TOKEN = "<|reserved_special_token_1818|>"

# Deliberately not the release order: there bos/eos/eom/eot are 200000/1/7/8 and <|image|> precedes
# <|patch|>. Offsets from a "first special id" are wrong here too (P-TOK-1).
SPECIAL_TOKENS = (
    "<|reserved_special_token_0|>",
    EOT_TOKEN,
    "<|start|>",
    "<|message|>",
    EOM_TOKEN,
    EOS_TOKEN,
    BOS_TOKEN,
    IMAGE_TOKEN,
    "<|image_start|>",
    "<|image_end|>",
    VIDEO_TOKEN,
    "<|vid_start|>",
    "<|vid_end|>",
    "<|vid_frame_separator|>",
    "<|image|>",
    PAD_TOKEN,
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>",
    DFLASH_MASK_TOKEN,
)

# 256 byte tokens + 224 merges; with the specials the vocabulary stays under the 512 rows of the tiny
# model in architecture.md §12.3.
BASE_VOCAB_SIZE = 480
MODEL_MAX_LENGTH = 131072

# The release tokenizer's geometry (architecture.md §5.5, §9): 200,000 base tokens, then 2,048 specials at
# 200000 + i; those not kept are named <|reserved_special_token_i|>. A tokenizer written with
# `release_ids=True` has exactly these ids, so the released config's token ids (bos 200000, <|patch|>
# 200092, …) hold for it; its base vocabulary is the tiny one padded with unreachable filler entries.
RELEASE_BASE_VOCAB_SIZE = 200_000
RELEASE_NUM_SPECIAL_TOKENS = 2048
RELEASE_SPECIAL_IDS = {
    BOS_TOKEN: 200000,
    EOS_TOKEN: 200001,
    EOM_TOKEN: 200007,
    EOT_TOKEN: 200008,
    PAD_TOKEN: 200018,
    "<|start|>": 200022,
    "<|message|>": 200023,
    "<|image_start|>": 200080,
    "<|image_end|>": 200081,
    "<|vid_start|>": 200082,
    "<|vid_end|>": 200083,
    "<|vid_frame_separator|>": 200087,
    "<|image|>": 200090,
    VIDEO_TOKEN: 200091,
    IMAGE_TOKEN: 200092,
}
# U+2581 lies outside the byte-level alphabet, so no text ever pre-tokenizes into a filler entry
_FILLER_PREFIX = "\u2581unused"

# The o200k split (llama.cpp's GPT-4o pre-tokenizer, which GGUF files name 'llama4' for this vocabulary):
# letters with attached case/contractions, 1–3 digit groups, punctuation runs, newlines, and whitespace
# that leaves one space to lead the next word.
SPLIT_PATTERN = O200K_SPLIT

TRAINING_CORPUS = (
    """The lighthouse keeper wrote in her log every evening. The weather was calm, the sea was grey, and
the ships that passed the point were few. She thought about the people on board: where they were going,
what they would find there, and whether anyone was waiting for them. In the winter the days were short
and the nights were long, but the light had to shine all the same. It is the work that matters, she
would say, not the person who does it. When the storm came in March, the waves broke over the rocks and
the wind took the roof off the shed. She kept the lamp burning through the night, and in the morning a
fishing boat came into the harbour with all of its crew safe. They're grateful, and they'll remember.
"""
    """Reasoning strength: high. The user asked about the weather in Paris on Friday, so I should call the
weather tool with the city and the date, then answer in one short paragraph. Let me check the calendar
first; the meeting is at 10:30 and the flight leaves at 18:45.
You are a helpful assistant. Knowledge cutoff: 2026-01-04. Current date: 2026-03-15.
# Valid recipients: "self", "calendar.*", "weather.*", "user".
assistant to=self
assistant to=user
assistant to=calendar.lookup
tool calendar.lookup
"""
    """def tokenize(text: str, *, add_special_tokens: bool = False) -> list[int]:
    \"\"\"Return the token ids of the text.\"\"\"
    ids = []
    for piece in split(text):
        if piece in vocab:
            ids.append(vocab[piece])
        else:
            ids.extend(encode_bytes(piece.encode("utf-8")))
    return ids


class Request:
    def __init__(self, prompt: str, max_tokens: int = 128) -> None:
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.output_ids: list[int] = []

    def is_finished(self) -> bool:
        return len(self.output_ids) >= self.max_tokens
"""
    """{"name": "weather.forecast", "description": "Get the forecast for a city.", "parameters": {"type":
"object", "properties": {"city": {"type": "string", "description": "The city name."}, "days": {"type":
"integer", "description": "How many days to forecast."}}, "required": ["city"]}}
{"id": "call_0", "type": "function", "function": {"name": "calendar.lookup", "arguments": {"day":
"Friday", "limit": 3}}}
{"role": "user", "content": "What is the weather in Paris?"}
{"role": "assistant", "content": null, "tool_calls": [], "reasoning_content": "Check the forecast."}
{"temperature": 0.7, "top_p": 0.95, "top_k": 50, "max_tokens": 512, "stream": true}
"""
    """<atem:function_calls>
<atem:invoke name="calendar.lookup">
<atem:parameter name="day">Friday</atem:parameter>
<atem:parameter name="limit">3</atem:parameter>
</atem:invoke>
</atem:function_calls>
<atem:function_calls>
<atem:invoke name="weather.forecast">
<atem:parameter name="city">Paris</atem:parameter>
<atem:parameter name="days">2</atem:parameter>
</atem:invoke>
<atem:invoke name="weather.forecast">
<atem:parameter name="city">Tokyo</atem:parameter>
<atem:parameter name="days">1</atem:parameter>
</atem:invoke>
</atem:function_calls>
<tool_output name="weather.forecast">
{"city": "Paris", "forecast": [{"day": "Friday", "high": 14, "low": 6, "sky": "rain"}]}
</tool_output>
"""
    """Un café crème, s'il vous plaît. Die Straße ist naß. 東京の天気は晴れです。東京は大きい都市です。
Привет, как дела? 你好，世界！😀 Have a nice day! 😀 ½ °C → ±3 µm.
"""
)


@dataclass(frozen=True)
class TinyTokenizerInfo:
    """What a checkpoint writer needs to know about the tokenizer it just wrote.

    `vocab_size` counts every token, added ones included; a model's embedding may be larger.
    """

    vocab_size: int
    special_token_ids: dict[str, int]

    @property
    def bos_token_id(self) -> int:
        return self.special_token_ids[BOS_TOKEN]

    @property
    def eos_token_id(self) -> int:
        return self.special_token_ids[EOS_TOKEN]

    @property
    def pad_token_id(self) -> int:
        return self.special_token_ids[PAD_TOKEN]

    @property
    def eot_token_id(self) -> int:
        return self.special_token_ids[EOT_TOKEN]

    @property
    def eom_token_id(self) -> int:
        return self.special_token_ids[EOM_TOKEN]

    @property
    def image_token_id(self) -> int:
        return self.special_token_ids[IMAGE_TOKEN]

    @property
    def video_token_id(self) -> int:
        return self.special_token_ids[VIDEO_TOKEN]

    @property
    def dflash_mask_token_id(self) -> int:
        return self.special_token_ids[DFLASH_MASK_TOKEN]


def release_special_tokens() -> list[str]:
    """The 2,048 special tokens of the release, in id order (index i has id 200000 + i)."""
    by_id = {token_id - RELEASE_BASE_VOCAB_SIZE: token for token, token_id in RELEASE_SPECIAL_IDS.items()}
    return [by_id.get(i, f"<|reserved_special_token_{i}|>") for i in range(RELEASE_NUM_SPECIAL_TOKENS)]


def _train_tokenizer(corpus: Iterable[str], base_vocab_size: int, *, release_ids: bool = False) -> Tokenizer:
    """Train the tokenizer in memory. Deterministic: the BPE trainer breaks count ties by pair."""
    tokenizer = Tokenizer(models.BPE(ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=base_vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    if tokenizer.get_vocab_size() != base_vocab_size:
        raise RuntimeError(
            f"the tokenizer's corpus yields {tokenizer.get_vocab_size()} tokens, not {base_vocab_size}; "
            "extend the corpus or ask for fewer tokens"
        )
    if release_ids:
        tokenizer = _pad_base_vocabulary(tokenizer, RELEASE_BASE_VOCAB_SIZE)
    specials = release_special_tokens() if release_ids else SPECIAL_TOKENS
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    # like the release: one BOS before each segment — architecture.md §5.5
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def _pad_base_vocabulary(tokenizer: Tokenizer, size: int) -> Tokenizer:
    """The same tokenizer with filler entries up to `size` base tokens, so added tokens start at `size`."""
    state = json.loads(tokenizer.to_str())
    vocab = state["model"]["vocab"]
    for token_id in range(len(vocab), size):
        vocab[f"{_FILLER_PREFIX}{token_id}"] = token_id
    return Tokenizer.from_str(json.dumps(state))


def _added_token_entry(token: str) -> dict[str, object]:
    return {
        "content": token,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def _special_map_entry(token: str) -> dict[str, object]:
    return {"content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def _write_text(path: Path, text: str) -> None:
    # bytes, so that no platform translates newlines: two writes must be byte-identical
    path.write_bytes(text.encode("utf-8"))


def _write_json(path: Path, value: object) -> None:
    _write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def write_tiny_tokenizer(
    out_dir: str | os.PathLike[str],
    corpus: Iterable[str] = (TRAINING_CORPUS,),
    base_vocab_size: int = BASE_VOCAB_SIZE,
    *,
    release_ids: bool = False,
) -> TinyTokenizerInfo:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `out_dir`.

    The merges are trained on `corpus` (default: the small embedded one) up to `base_vocab_size` tokens
    before the special tokens; the nano model trains its tokenizer on its own conversations. With
    `release_ids`, the vocabulary has the release's size and special-token ids (202,048 tokens; see
    RELEASE_SPECIAL_IDS). Two calls with the same corpus write byte-identical files. The directory is
    created if needed; existing files are replaced. Raises RuntimeError when the corpus is too small for
    `base_vocab_size`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(corpus, base_vocab_size, release_ids=release_ids)
    specials = release_special_tokens() if release_ids else SPECIAL_TOKENS
    special_token_ids = {token: tokenizer.token_to_id(token) for token in specials}

    _write_text(out / "tokenizer.json", tokenizer.to_str(pretty=True) + "\n")
    _write_json(
        out / "tokenizer_config.json",
        {
            "added_tokens_decoder": {
                str(special_token_ids[token]): _added_token_entry(token)
                for token in sorted(specials, key=special_token_ids.__getitem__)
            },
            "bos_token": BOS_TOKEN,
            "clean_up_tokenization_spaces": False,
            "eos_token": EOS_TOKEN,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": MODEL_MAX_LENGTH,
            "pad_token": PAD_TOKEN,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    _write_json(
        out / "special_tokens_map.json",
        {
            "bos_token": _special_map_entry(BOS_TOKEN),
            "eos_token": _special_map_entry(EOS_TOKEN),
            "pad_token": _special_map_entry(PAD_TOKEN),
        },
    )
    return TinyTokenizerInfo(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True), special_token_ids=special_token_ids
    )
