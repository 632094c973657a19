"""`LLM.get_tokenizer()`: the engine's tokenizer behind the calls vLLM users make on a Hugging Face tokenizer, with
transformers 5's meaning (glimmer/engine/llm.py's `LLM` hands it out)."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Mapping
from collections.abc import Sequence as SequenceABC
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken

from glimmer.engine.apply_chat_template import (
    ChatEncoding,
    OutputShape,
    checked_documents,
    generation_prompt,
    given_conversation,
    split_conversations,
    tool_schemas,
)
from glimmer.engine.chat_rendering import (
    STRENGTH_KWARGS,
    ChatRendering,
    compiled_template_argument,
    render_conversation,
)
from glimmer.engine.tokenizer import NAMED_TOKEN_NAMES, SIDES, Tokenizer, positive_length
from glimmer.errors import RequestError
from glimmer.protocol import normalize_tools, resolve_reasoning_strength
from glimmer.protocol.tool_choice import plan_tools

if TYPE_CHECKING:
    from glimmer.engine.llm_engine import LLMEngine

_SETTABLE = ("model_max_length", "padding_side", "truncation_side", "pad_token", "pad_token_id")
"""The attributes a script may set on `LLMTokenizer`, as on transformers' tokenizer."""

_BACKEND = "tokenizers.Tokenizer.from_file(str(tok.tokenizer_file))"
_NO_NEW_TOKENS = ("Glimmer adds no tokens: the vocabulary is the checkpoint's tokenizer.json, which the model's "
                  "embedding rows match")
TRANSFORMERS_ONLY_ATTRIBUTES: dict[str, str] = {
    "backend_tokenizer": f"the checkpoint's `tokenizers` tokenizer is {_BACKEND} (where that is its tokenizer.json)",
    "decoder": f"the checkpoint's decoder is {_BACKEND}.decoder",
    "init_kwargs": "tokenizer_config.json's fields are json.loads(tok.tokenizer_file.with_name("
                   "'tokenizer_config.json').read_text())",
    "add_bos_token": "what encode() adds around a text is tok.encode('') (tokenizer.json's post-processor decides)",
    "add_eos_token": "what encode() adds around a text is tok.encode('') (tokenizer.json's post-processor decides)",
    "clean_up_tokenization_spaces": "decode() and batch_decode() take clean_up_tokenization_spaces=; None (their "
                                    "default) follows tokenizer_config.json",
    "max_len_single_sentence": "it is tok.model_max_length - tok.num_special_tokens_to_add()",
    "max_len_sentences_pair": "text pairs are not supported; encode the texts one by one",
    "pad": "tok(texts, padding=True) pads as it encodes (padding_side as tok.padding_side)",
    "encode_plus": "call the tokenizer: tok(text) (transformers 5 has no encode_plus either)",
    "batch_encode_plus": "call the tokenizer: tok(texts) (transformers 5 has no batch_encode_plus either)",
    "get_special_tokens_mask": "it is [int(i in tok.all_special_ids) for i in ids]",
    "additional_special_tokens": "transformers 5 calls them extra_special_tokens",
    "additional_special_tokens_ids": "transformers 5 calls them extra_special_tokens_ids",
    "all_special_tokens_extended": "transformers 5 has all_special_tokens (strings) alone; the AddedToken of each "
                                   "added token is in added_tokens_decoder",
    "special_tokens_map_extended": "transformers 5 has special_tokens_map alone",
    "add_tokens": _NO_NEW_TOKENS,
    "add_special_tokens": _NO_NEW_TOKENS,
    "save_pretrained": "copy the checkpoint's tokenizer files (the directory of tok.tokenizer_file), or save "
                       "transformers.AutoTokenizer.from_pretrained(that directory)",
}
"""transformers' tokenizer attributes `LLMTokenizer` has not, with what to use instead: the AttributeError of reading
one says it."""

_PAIRS = "text pairs are not supported: encode the texts one by one"
_FROM_TRANSFORMERS = ("Glimmer's tokenizer does not compute it; load transformers.AutoTokenizer.from_pretrained() "
                      "on the checkpoint's tokenizer files (the directory of tok.tokenizer_file) for it")
TRANSFORMERS_ONLY_CALL_ARGUMENTS: dict[str, str] = {
    "text_pair": _PAIRS, "text_target": _PAIRS, "text_pair_target": _PAIRS,
    "return_offsets_mapping": _FROM_TRANSFORMERS, "return_special_tokens_mask": _FROM_TRANSFORMERS,
    "return_token_type_ids": _FROM_TRANSFORMERS, "return_overflowing_tokens": _FROM_TRANSFORMERS,
    "stride": _FROM_TRANSFORMERS, "is_split_into_words": _FROM_TRANSFORMERS,
    "return_attention_mask": "leave it out: the call's result always holds attention_mask "
                             "(enc.pop('attention_mask') drops it)",
    "return_length": "leave it out: a sequence's length is len() of its ids",
    "pad_to_multiple_of": "pad to that multiple with padding='max_length' and max_length set to it",
    "verbose": "leave it out: Glimmer's call gives no warnings to silence",
}
"""Arguments of transformers' tokenizer call (and `encode`) that `LLMTokenizer`'s do not take, with what to do instead:
the TypeError of passing one says it."""


class LLMTokenizer:
    """The engine's tokenizer behind the calls vLLM users make on a Hugging Face tokenizer, with its defaults:
    `encode` and `__call__` add BOS (`add_special_tokens=True`), `decode` and `batch_decode` keep special tokens
    unless told, `vocab_size` counts the base vocabulary and `len()` every token, and `apply_chat_template` renders
    with the checkpoint's template exactly as `LLM.chat` does, and `all_special_ids` are transformers' (the named
    tokens). The attributes transformers reads from tokenizer_config.json are its values, with its defaults
    (`model_max_length`, `padding_side` and `truncation_side`, which `__call__` and `apply_chat_template` follow and
    a script may set), as are `special_tokens_map`, `added_tokens_decoder`, `name_or_path` and `chat_template`.
    One object per LLM (`get_tokenizer()`). Other attributes (`bos_token_id`, `eos_token_id`, `pad_token_id`,
    `token_to_id`, ...) are the `Tokenizer`'s."""

    is_fast = True  # the `tokenizers` library's tokenizer, as transformers' fast one

    def __init__(self, engine: LLMEngine):
        # the engine, not the LLM, which holds this tokenizer: no cycle, so `del llm` frees the model at once
        self._engine = engine
        self.tokenizer: Tokenizer = engine.tokenizer
        shape = self.tokenizer.shape
        self._model_max_length = shape.model_max_length
        self._padding_side = shape.padding_side
        self._truncation_side = shape.truncation_side
        self._pad_token = self.tokenizer.pad_token

    def __reduce__(self) -> Any:
        """Raises TypeError saying what to send another process instead: this object renders and encodes with its
        LLM's engine, which does not pickle (it failed deep inside the engine, "ctypes objects containing pointers").
        `copy.copy` and `copy.deepcopy` share the engine."""
        raise TypeError(f"an LLMTokenizer cannot be pickled: it encodes with its LLM's engine; in another "
                        f"process load the checkpoint's tokenizer (transformers.AutoTokenizer.from_pretrained("
                        f"{str(self._engine.checkpoint_dir)!r})), or send its .tokenizer (encode and decode), which "
                        f"pickles")

    def __copy__(self) -> LLMTokenizer:
        """A tokenizer on the same engine whose settings (`padding_side`, ...) are its own."""
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict[int, Any]) -> LLMTokenizer:
        """As `copy.copy` (transformers scripts deep-copy a tokenizer to set another padding side): the engine, whose
        tokenizer no setting changes, is shared, not copied."""
        return self.__copy__()

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and name != "tokenizer":
            model_specific = self.tokenizer.extra.model_specific
            if name in model_specific:  # transformers' attribute of a model-specific token: `tok.image_token`
                return model_specific[name]
            if name.removesuffix("_id") in model_specific:
                return self.tokenizer.token_to_id(model_specific[name.removesuffix("_id")])
            with contextlib.suppress(AttributeError):
                return getattr(self.tokenizer, name)
        # named as the class the caller holds, not the engine's Tokenizer it was looked up on
        message = f"{type(self).__name__!r} object has no attribute {name!r}"
        instead = TRANSFORMERS_ONLY_ATTRIBUTES.get(name)
        if instead is not None:
            message += f" (transformers' tokenizer.{name}): {instead}"
        raise AttributeError(message, name=name, obj=self)

    def __setattr__(self, name: str, value: Any) -> None:
        """Sets one of `SETTABLE` (or a new attribute of the caller's); refuses, with AttributeError, to cover an
        attribute read from the tokenizer (`tok.eos_token_id = 5` would change what the script reads, not what
        the tokenizer does: a silent wrong answer)."""
        if not name.startswith("_") and name not in _SETTABLE and name != "tokenizer" and hasattr(self, name):
            hint = ("; to render with another template pass chat_template=... to apply_chat_template or LLM.chat"
                    if name == "chat_template" else "")
            raise AttributeError(f"LLMTokenizer.{name} cannot be set: it is the checkpoint's; what can be set is "
                                 f"{', '.join(_SETTABLE)}{hint}")
        super().__setattr__(name, value)

    @property
    def pad_token(self) -> str | None:
        """The token `__call__` and `apply_chat_template` pad with: the checkpoint's, or one a script sets, as on
        transformers' tokenizer (`tok.pad_token = tok.eos_token`, or `tok.pad_token_id = ...`)."""
        return self._pad_token

    @pad_token.setter
    def pad_token(self, token: str | None) -> None:
        if token is not None and (not isinstance(token, str) or self.tokenizer.token_to_id(token) is None):
            raise ValueError(f"pad_token={token!r} is not a token of this tokenizer (Glimmer adds no tokens); set "
                             "one of its tokens, as tok.pad_token = tok.eos_token")
        self._pad_token = token

    @property
    def pad_token_id(self) -> int | None:
        return None if self._pad_token is None else self.tokenizer.token_to_id(self._pad_token)

    @pad_token_id.setter
    def pad_token_id(self, token_id: int | None) -> None:
        token = None if token_id is None else self.tokenizer.id_to_token(token_id) if is_token_id(token_id) else ""
        if token_id is not None and not token:
            raise ValueError(f"pad_token_id={token_id!r} is not a token id of this tokenizer")
        self._pad_token = token

    def __len__(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def model_max_length(self) -> int:
        """transformers' attribute: the limit of `truncation=True` (and `padding='max_length'`) without `max_length`
        in `__call__` (tokenizer_config.json's, else 1e30: none), settable (`tok.model_max_length = 512`)."""
        return self._model_max_length

    @model_max_length.setter
    def model_max_length(self, limit: int) -> None:
        self._model_max_length = positive_length(limit)

    @property
    def padding_side(self) -> str:
        """Where `__call__` and `apply_chat_template` pad: 'right' or 'left' (tokenizer_config.json's, else 'right'),
        settable as transformers' (`tok.padding_side = "left"`)."""
        return self._padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        self._padding_side = _checked_side("padding_side", side)

    @property
    def truncation_side(self) -> str:
        """Where `__call__` and `apply_chat_template` cut with `truncation=True`: 'right' or 'left'
        (tokenizer_config.json's, else 'right'), settable as transformers'."""
        return self._truncation_side

    @truncation_side.setter
    def truncation_side(self, side: str) -> None:
        self._truncation_side = _checked_side("truncation_side", side)

    @property
    def name_or_path(self) -> str:
        """The model as `LLM(model=...)` was given it (a directory or a Hub id), as transformers' `name_or_path`."""
        return str(self._engine.config.model)

    @property
    def chat_template(self) -> str:
        """The source of the chat template `LLM.chat` and `apply_chat_template` render with (the checkpoint's, or
        the `chat_template` LLM was given), as transformers' `chat_template`."""
        return self._engine.chat_template.source

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens the checkpoint sets, name → token, in transformers' order (its
        `special_tokens_map`: `{'bos_token': '<|begin_of_text|>', ...}`), then the model-specific ones
        tokenizer_config.json names (an `image_token` field, an `extra_special_tokens` dict), as transformers 5's."""
        named = ((name, getattr(self, name)) for name in NAMED_TOKEN_NAMES)
        return {name: token for name, token in named if token is not None} | dict(self.tokenizer.extra.model_specific)

    @property
    def extra_special_tokens(self) -> list[str]:
        """tokenizer_config.json's `extra_special_tokens` list (or its older `additional_special_tokens`), as
        transformers 5's attribute ([] where the file lists none)."""
        return list(self.tokenizer.extra.listed)

    @property
    def extra_special_tokens_ids(self) -> list[int]:
        """The ids of `extra_special_tokens`, as transformers 5's attribute."""
        return [self.tokenizer.require_token_id(token) for token in self.extra_special_tokens]

    @property
    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        """Every added token's id → its `tokenizers.AddedToken`, ascending by id (transformers'
        `added_tokens_decoder`)."""
        return self.tokenizer.added_tokens_decoder()

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        """Every added token's text → its id, ascending by id (transformers' `added_tokens_encoder`)."""
        return self.get_added_vocab()

    def get_added_vocab(self) -> dict[str, int]:
        """Every added token's text → its id, ascending by id (transformers' `get_added_vocab()`)."""
        return {added.content: token_id for token_id, added in self.added_tokens_decoder.items()}

    def convert_tokens_to_string(self, tokens: SequenceABC[str]) -> str:
        """The text of vocabulary entries (`tokenize`'s output) joined as the tokenizer's decoder joins them, as
        transformers' `convert_tokens_to_string` (`['Hello', 'Ġworld']` → 'Hello world'). Raises TypeError for
        anything but a list of strings."""
        if isinstance(tokens, str) or not isinstance(tokens, list | tuple) or not all(
                isinstance(token, str) for token in tokens):
            raise TypeError("LLMTokenizer.convert_tokens_to_string() takes a list of token strings (as tokenize() "
                            f"returns), not {type(tokens).__name__}")
        return self.tokenizer.tokens_to_text(tokens)

    @property
    def vocab_size(self) -> int:
        """Tokens of the base vocabulary, without the added ones (transformers' `vocab_size`); `len()` counts all."""
        return self.tokenizer.base_vocab_size

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens the checkpoint sets (bos, eos, unk, sep, pad, cls, mask, then the model-specific
        ones of `special_tokens_map`) and `extra_special_tokens`, each once, in transformers' order: its
        `all_special_tokens`, so that a script stripping them leaves what it leaves with transformers (the framing
        tokens stay unless the config lists them). Every token flagged special, which
        `decode(skip_special_tokens=True)` leaves out as transformers' does, is in `tokenizer.all_special_ids`."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self.extra_special_tokens]))

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of `all_special_tokens` (transformers' `all_special_ids`): what `convert_ids_to_tokens` skips."""
        return [self.tokenizer.require_token_id(token) for token in self.all_special_tokens]

    def encode(self, text: str, add_special_tokens: bool = True, *, padding: bool | str = False,
               truncation: bool | str | None = None, max_length: int | None = None, padding_side: str | None = None,
               return_tensors: str | None = None, **transformers_only: Any) -> Any:
        """Token ids of `text`, BOS first unless `add_special_tokens=False` (as transformers' `encode`); `padding`,
        `truncation`, `max_length`, `padding_side` and `return_tensors` as in `__call__` (a tensor has a batch axis, as
        there). Raises TypeError for another argument of transformers' (`return_offsets_mapping`, ...), saying what to
        do instead."""
        _refuse_transformers_only("encode", transformers_only)
        if not isinstance(text, str):
            raise TypeError(f"LLMTokenizer.encode() takes a string, not {type(text).__name__}")
        if not isinstance(add_special_tokens, bool):
            # transformers' second positional argument is text_pair: `tok(a, b)` means a pair there
            raise TypeError(f"add_special_tokens must be True or False, not {add_special_tokens!r}; a second text "
                            "(transformers' text_pair) is not supported: encode the texts one by one")
        if padding is False and truncation in (None, False) and max_length is None and return_tensors is None:
            return self.tokenizer.encode_input_text(text, add_special_tokens=add_special_tokens)
        return self(text, add_special_tokens, padding=padding, truncation=truncation, max_length=max_length,
                    padding_side=padding_side, return_tensors=return_tensors)["input_ids"]

    def __call__(self, text: str | list[str], add_special_tokens: bool = True, *, padding: bool | str = False,
                 truncation: bool | str | None = None, max_length: int | None = None, padding_side: str | None = None,
                 return_tensors: str | None = None, **transformers_only: Any) -> ChatEncoding:
        """{"input_ids": ids, "attention_mask": mask} of a text, or lists of them for a list of texts, as transformers'
        call: `padding` (True or 'longest', 'max_length') pads with the pad token on `padding_side` ('left' or 'right';
        None: the tokenizer's `padding_side`), `truncation=True` cuts on `truncation_side` to `max_length` (or
        `model_max_length`), as does a `max_length` given without
        `padding` or `truncation` (as transformers' default; `truncation=False` keeps every token), `return_tensors`
        'pt' or 'np' gives tensors with a batch axis. The result's keys read as attributes too (`enc.input_ids`).
        Raises RequestError (a ValueError) naming the argument for a value transformers refuses or Glimmer does not
        support (as `apply_chat_template`), and TypeError for another argument of transformers'
        (`return_offsets_mapping`, ...), saying what to do instead."""
        _refuse_transformers_only("__call__", transformers_only)
        texts = list(text) if isinstance(text, list | tuple) else [text]
        if truncation is None:  # transformers: a max_length given alone cuts to it
            truncation = max_length is not None and padding is False
        shape = OutputShape(padding, truncation, max_length, return_tensors, return_dict=True)
        limit = shape.truncation_limit(self.model_max_length)
        ids = [self._encoded_within(t, add_special_tokens, limit) for t in texts]
        return replace(shape, truncation=False).apply(
            ids, batched=isinstance(text, list | tuple), default_max_length=self.model_max_length,
            pad_token_id=self.pad_token_id,
            padding_side=self.padding_side if padding_side is None else _checked_side("padding_side", padding_side))

    def _encoded_within(self, text: str, add_special_tokens: bool, limit: int | None) -> list[int]:
        """`encode(text)` with at most `limit` tokens (None: all), the text's own cut on `truncation_side` and the
        special tokens the post-processor adds around them (BOS) kept, as transformers' fast tokenizer truncates."""
        framed = self.encode(text, add_special_tokens)
        if limit is None or len(framed) <= limit:
            return framed
        plain = self.encode(text, add_special_tokens=False)
        start = next(i for i in range(len(framed) - len(plain) + 1) if framed[i:i + len(plain)] == plain)
        prefix, suffix = framed[:start], framed[start + len(plain):]
        keep = max(0, limit - len(prefix) - len(suffix))
        kept = plain[:keep] if self.truncation_side == "right" else plain[len(plain) - keep:]
        return prefix + kept + suffix

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        """The vocabulary entries of `text`'s tokens, without BOS unless asked (as transformers' `tokenize`)."""
        if not isinstance(text, str):
            raise TypeError(f"LLMTokenizer.tokenize() takes a string, not {type(text).__name__}")
        ids = self.tokenizer.encode_input_text(text, add_special_tokens=add_special_tokens)
        return [self.tokenizer.id_to_token(i) for i in ids]

    def decode(self, ids: int | SequenceABC[int] | SequenceABC[SequenceABC[int]], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None,
               spaces_between_special_tokens: bool = True) -> str | list[str]:
        """Text of `ids` (an id, a list of ids, or a 1-D array or tensor of them), or the texts of a batch of them (a
        list of id lists, of 1-D arrays or of tensors, or a 2-D array or tensor), or of an encoding's `input_ids` (the
        dict this tokenizer's call or `apply_chat_template` returns), as transformers 5's `decode`, which
        tells a batch by its first item once arrays and tensors are lists; `skip_special_tokens` leaves out every
        token flagged special (`tokenizer.all_special_ids`: framing and media tokens too, as transformers' decode).
        `clean_up_tokenization_spaces` has transformers 5's meaning (None: the tokenizer config's default, False for
        Muse), which leaves the text of a BPE tokenizer, as Muse's, as it is: True changes nothing unless
        tokenizer_config.json sets `clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`.
        `spaces_between_special_tokens` (which vLLM's detokenizer passes) is taken, of any value, and changes
        nothing, as in transformers' tokenizer.json tokenizers, whose decoder alone spaces the tokens.
        Raises TypeError naming `LLMTokenizer.decode` for ids of another kind."""
        return self._decode_any(ids, skip_special_tokens, clean_up_tokenization_spaces, "LLMTokenizer.decode()")

    def batch_decode(self, sequences: SequenceABC[SequenceABC[int]], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None,
                     spaces_between_special_tokens: bool = True) -> list[str]:
        """The texts of `sequences` (a list of id lists, or a 2-D array or tensor) as `decode` gives them; one
        sequence gives a list of its text (as transformers 5's `batch_decode`)."""
        texts = self._decode_any(sequences, skip_special_tokens, clean_up_tokenization_spaces,
                                 "LLMTokenizer.batch_decode()")
        return [texts] if isinstance(texts, str) else texts

    def _decode_any(self, ids: Any, skip_special_tokens: bool, clean_up: bool | None, call: str) -> str | list[str]:
        if isinstance(ids, Mapping) and "input_ids" in ids:  # an encoding, as transformers 5 decodes its input_ids
            ids = ids["input_ids"]
        ids = python_ids(ids)
        # one sequence or a batch, as transformers 5 tells them: by the first item alone
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return [self._decode(token_id_list(sequence, f"{call} (sequence {index})"), skip_special_tokens,
                                 clean_up) for index, sequence in enumerate(ids)]
        return self._decode(token_id_list(ids, call), skip_special_tokens, clean_up)

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
        id_list = token_id_list(ids, "LLMTokenizer.convert_ids_to_tokens()")
        if is_token_id(ids):
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

    @cached_property
    def max_token_id(self) -> int:
        """The largest token id, as on vLLM's tokenizer (`get_tokenizer()` there): the vocabulary's largest id, or
        `vocab_size` where that is larger. Found once, as vLLM caches it (the vocabulary does not change)."""
        return max(max(self.get_vocab().values()), self.vocab_size)

    @property
    def max_chars_per_token(self) -> int:
        """The most characters of one vocabulary entry (added tokens included), as on vLLM's tokenizer."""
        return self.tokenizer.max_token_chars

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        """How many ids `encode(text)` adds around a text's own (BOS), as transformers' and vLLM's call. Raises
        ValueError for `pair=True`: text pairs are not supported (`encode` takes one text)."""
        if pair:
            raise ValueError("num_special_tokens_to_add(pair=True): text pairs are not supported; encode the texts "
                             "one by one (num_special_tokens_to_add() counts what each gets)")
        return len(self.encode(""))

    def get_chat_template(self, chat_template: str | None = None, tools: list[dict[str, Any]] | None = None) -> str:
        """The source of the template `apply_chat_template(chat_template=...)` renders with, as transformers' and
        vLLM's call: the checkpoint's (or the one LLM was given) for None, the checkpoint's named template of that
        name, else `chat_template` itself. `tools` selects no other template (Glimmer renders a chat with tools with
        the same one). Raises TypeError for a `chat_template` that is no string."""
        if chat_template is None:
            return self.chat_template
        if not isinstance(chat_template, str):
            raise TypeError(f"chat_template must be a template's source or the name of one of the checkpoint's "
                            f"templates (a string), not {type(chat_template).__name__}")
        return self._engine.named_chat_templates.get(chat_template, chat_template)

    @property
    def model_input_names(self) -> list[str]:
        """The keys `__call__` returns, as transformers' `model_input_names`."""
        return ["input_ids", "attention_mask"]

    @property
    def vocab(self) -> dict[str, int]:
        """`get_vocab()`, as transformers' `vocab`."""
        return self.get_vocab()

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
        return_dict: bool = True,
        return_assistant_tokens_mask: bool = False,
        tokenizer_kwargs: Mapping[str, Any] | None = None,
        allow_control_tokens_in_content: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The prompt of a conversation (a list of message dicts) as `LLM.chat` renders it, or of each of a batch of
        them (a list of such lists): as transformers 5 returns it, a dict of its token ids and attention mask
        (`tokenize=True`, `return_dict=True`: `{"input_ids": [...], "attention_mask": [...]}`, BOS once, from the
        template), the ids alone (`return_dict=False`), or its text (`tokenize=False`, which ignores `return_dict`, as
        there). Media parts are not expanded into placeholder tokens here.

        The named arguments are transformers 5's, with its meaning (glimmer/engine/apply_chat_template.py): `tools`
        (schemas, or Python functions converted as transformers converts them), `documents` (the template's
        variable), `chat_template` (a template source to render with instead of the checkpoint's, or the name of one of
        the checkpoint's named templates: tokenizer_config.json's list, `additional_chat_templates/`),
        `add_generation_prompt`, `continue_final_message`, `tokenize`, `sanitize_control_tokens`, `padding`,
        `truncation`, `max_length`, `return_tensors` ('pt' or 'np') and `return_dict` ({"input_ids",
        "attention_mask"}, a `ChatEncoding` that reads as transformers' `BatchEncoding`; only with `tokenize=True`, as
        in transformers). `conversation` may be passed as `messages`. Every other keyword argument is a chat template
        variable, as in transformers and as `LLM.chat`'s `chat_template_kwargs` (`reasoning_effort` included).

        `tokenize=True` and `return_dict=True` are transformers 5's defaults. Glimmer's own: the generation prompt
        unless `continue_final_message` is set (`add_generation_prompt=None`; transformers' default is False), and
        control-token text tokenized as plain text (below; transformers' default reads it as the tokens).

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
        template = (self._engine.chat_template if chat_template is None
                    else compiled_template_argument(chat_template, self._engine.named_chat_templates))
        plan = plan_tools(normalize_tools(tool_schemas(tools)), None)
        strength = resolve_reasoning_strength(reasoning_effort=None, chat_template_kwargs=kwargs)
        template_kwargs = {k: v for k, v in kwargs.items() if k not in STRENGTH_KWARGS}
        if documents is not None:
            template_kwargs["documents"] = checked_documents(documents, template)
        rendering = ChatRendering(template, plan.render_tools, strength, template_kwargs,
                                  allow_control_tokens_in_content or sanitize_control_tokens is False,
                                  ends_with_generation_prompt, continue_final_message)
        tokenizer = self._engine.tokenizer
        prompts = [render_conversation(messages, rendering, tokenizer)[1] for messages in conversations]
        if shape is None:
            texts = [prompt.display_text for prompt in prompts]
            return texts if batched else texts[0]
        ids = [self._engine.encode_prompt(prompt.text, literals=prompt.literals) for prompt in prompts]
        return shape.apply(ids, batched=batched, default_max_length=self._engine.max_model_len,
                           pad_token_id=self.pad_token_id, padding_side=self.padding_side,
                           truncation_side=self.truncation_side)


def _refuse_transformers_only(call: str, arguments: Mapping[str, Any]) -> None:
    """Raises TypeError naming the first of `arguments` (those `call` was given beyond its own) and, for one of
    transformers' (`TRANSFORMERS_ONLY_CALL_ARGUMENTS`), what to do instead; nothing when there are none."""
    for name in arguments:
        instead = TRANSFORMERS_ONLY_CALL_ARGUMENTS.get(name)
        message = f"LLMTokenizer.{call}() got an unexpected keyword argument {name!r}"
        raise TypeError(message if instead is None else f"{message} (transformers' {name}=): {instead}")


def _checked_side(name: str, side: object) -> str:
    """`side` if it is 'right' or 'left'; raises ValueError naming `name` otherwise (as transformers refuses it)."""
    if side not in SIDES:
        raise ValueError(f"{name} must be 'right' or 'left', not {side!r}")
    return side  # type: ignore[return-value]


def python_ids(ids: Any) -> Any:
    """`ids` with each NumPy array or scalar and torch tensor in it, at any depth of lists and tuples, as the Python
    int or lists it holds, and tuples as lists: what transformers 5's `decode` converts (its `to_py_obj`) before it
    tells one sequence from a batch, so that a list of 1-element tensors (`list(torch.tensor([[300], [301]]))`) is a
    batch of two sequences, as there, and a list of 1-D arrays a batch too."""
    if hasattr(ids, "tolist"):
        return ids.tolist()
    if isinstance(ids, list | tuple):
        return [python_ids(item) for item in ids]
    return ids


def token_id_list(ids: Any, call: str) -> list[int]:
    """`ids` (a token id, a list or tuple of them, a NumPy array or a torch tensor) as a list of ints. Raises
    TypeError naming `call` and what was given instead."""
    if hasattr(ids, "tolist"):  # a NumPy array or scalar, a torch tensor
        ids = ids.tolist()
    if is_token_id(ids):
        if operator.index(ids) < 0:
            raise TypeError(f"{call} takes token ids (integers >= 0), not {ids!r}")
        return [operator.index(ids)]
    if not isinstance(ids, list | tuple):
        raise TypeError(f"{call} takes token ids (an int, a list of ints, or a 1-D array or tensor of them), not "
                        f"{type(ids).__name__}")
    bad = next((index for index, i in enumerate(ids) if not is_token_id(i) or operator.index(i) < 0), None)
    if bad is not None:
        raise TypeError(f"{call} takes token ids (integers >= 0); item {bad} is {ids[bad]!r}")
    return [operator.index(i) for i in ids]


def is_token_id(value: object) -> bool:
    """An integer of any integral type (int, numpy.int64, ...) but not a bool."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True
