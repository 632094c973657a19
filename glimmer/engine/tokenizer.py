"""The checkpoint's tokenizer: text ↔ token ids, special tokens resolved by name.

A thin layer over the `tokenizers` library that reads a checkpoint's `tokenizer.json` and the special
token names from `tokenizer_config.json` (and, for an older one without `added_tokens_decoder`,
`special_tokens_map.json`). It behaves like transformers'
fast tokenizer with `skip_special_tokens=False, clean_up_tokenization_spaces=False`, the only mode an
engine wants: special tokens carry the turn framing (P-TOK-3).

Ids are never hard-coded anywhere in Glimmer (P-TOK-1); callers resolve them here by token string.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from glimmer.checkpoint.broken_links import refuse_broken_link, refuse_lfs_pointer
from glimmer.checkpoint.json_files import read_json_object
from glimmer.engine.token_pieces import PieceIds, pieces_encode_alone
from glimmer.errors import CheckpointError, ConfigError
from glimmer.multimodal.placeholders import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from glimmer.protocol.tokens import FRAMING_MARKERS

if TYPE_CHECKING:
    from glimmer.checkpoint.config import ModelConfig
    from glimmer.checkpoint.formats import OpenedCheckpoint

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# the named special tokens a checkpoint can set, in the order of transformers' `SPECIAL_TOKENS_ATTRIBUTES`
NAMED_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TOKENIZATION_SPACES = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                       (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))
"""transformers' `clean_up_tokenization`: each replacement in turn, designed for WordPiece text."""


@dataclass(frozen=True)
class CleanUpSettings:
    """tokenizer_config.json's `clean_up_tokenization_spaces` (transformers' `decode` default) and
    `clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output` (without it transformers 5 never
    cleans up a BPE tokenizer's text); both False when the file leaves them out, as there."""

    by_default: bool = False
    even_for_bpe: bool = False


@dataclass(frozen=True)
class ExtraSpecialTokens:
    """tokenizer_config.json's special tokens beyond the seven named ones, as transformers 5 reads them: `listed`, its
    `extra_special_tokens` list (or the older `additional_special_tokens` when that is absent or empty), and
    `model_specific`, name → token, from each other `*_token` string field and from an `extra_special_tokens` dict,
    which transformers makes named special tokens of their own (`tok.image_token`, in `special_tokens_map`)."""

    listed: tuple[str, ...] = ()
    model_specific: Mapping[str, str] = dataclass_field(default_factory=dict)

    def tokens(self) -> list[str]:
        return [*self.model_specific.values(), *self.listed]


# what an added token's lstrip / rstrip takes beside it: Rust's char::is_whitespace (Unicode White_Space), which the
# tokenizers library strips with; Python's str.strip() also takes U+001C..U+001F, text the backend keeps
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
    "\u2028\u2029\u202f\u205f\u3000"
VERY_LARGE_INTEGER = int(1e30)
"""transformers' `model_max_length` when tokenizer_config.json gives none: inputs of any length."""
NO_LENGTH_LIMIT = int(1e20)
"""transformers' LARGE_INTEGER: a length limit above it is none (a tokenizer_config.json without `model_max_length`
gives VERY_LARGE_INTEGER), and padding='max_length' to it pads nothing, as transformers pads nothing there."""


def positive_length(value: object) -> int:
    """`value` as a `model_max_length`: an int >= 1, or a float that is one (JSON writes 1e30 as a float); ValueError
    otherwise."""
    length = int(value) if isinstance(value, float) and value.is_integer() else value
    try:
        length = operator.index(length) if not isinstance(length, bool) else 0  # type: ignore[arg-type]
    except TypeError:
        length = 0
    if length < 1:
        raise ValueError(f"model_max_length must be a positive integer, not {value!r}")
    return length
SIDES = ("right", "left")


@dataclass(frozen=True)
class ShapeSettings:
    """tokenizer_config.json's fields that say how transformers' tokenizer cuts and pads, with its defaults when the
    file leaves them out: `model_max_length` (the limit of `truncation=True` without `max_length`), `padding_side` and
    `truncation_side`."""

    model_max_length: int = VERY_LARGE_INTEGER
    padding_side: str = "right"
    truncation_side: str = "right"


def load_checkpoint_tokenizer(opened: OpenedCheckpoint, config: ModelConfig) -> Tokenizer:
    """The tokenizer of an opened checkpoint (a GGUF's embedded one, else the directory's tokenizer.json), checked
    against `config` by `check_tokenizer_fits`: what loading and `glimmer inspect` both use.

    Raises CheckpointError for a tokenizer whose decoder is not a lone ByteLevel one: the model would load and every
    request fail as its text is made (detokenizer.py streams byte-level tokens only)."""
    embedded = opened.tokenizer
    if embedded is not None:
        tokenizer = Tokenizer.from_backend(embedded.backend, embedded.named_tokens, opened.path)
    else:
        tokenizer = Tokenizer.from_dir(opened.path)
    if not tokenizer.is_byte_level:
        raise CheckpointError(f"{tokenizer.tokenizer_file} does not decode with a ByteLevel decoder (its decoder: "
                              f"{tokenizer.decoder_type}); Glimmer makes text only from byte-level BPE tokenizers, "
                              "which every Muse Glimmer checkpoint ships: use the tokenizer.json published with the "
                              "model")
    check_tokenizer_fits(tokenizer, config)
    return tokenizer


def check_tokenizer_fits(tokenizer: Tokenizer, config: ModelConfig) -> None:
    """ConfigError unless `tokenizer` belongs to the model of `config`: no more tokens than its vocabulary, no
    token id past it, and its media placeholder ids (`image_token_id`, `video_token_id`, when the model has a
    vision tower) are the tokenizer's `<|patch|>` and `<|video|>`. Otherwise the model would load and every
    request using such a token or an image fail with an error blaming the request."""
    text = config.text
    if tokenizer.vocab_size > text.vocab_size:
        raise ConfigError(f"the tokenizer has {tokenizer.vocab_size} tokens but text_config.vocab_size="
                          f"{text.vocab_size}; the tokenizer does not belong to this model")
    # the count alone misses a tokenizer whose ids have gaps: it can still name rows the embedding lacks
    token, largest_id = max(tokenizer.get_vocab().items(), key=lambda item: item[1], default=("", -1))
    if largest_id >= text.vocab_size:
        raise ConfigError(f"the tokenizer's token {token!r} has id {largest_id} but text_config.vocab_size="
                          f"{text.vocab_size}; the tokenizer does not belong to this model")
    if config.vision is None:
        return
    for field, token in (("image_token_id", IMAGE_PLACEHOLDER), ("video_token_id", VIDEO_PLACEHOLDER)):
        configured, actual = getattr(config, field), tokenizer.token_to_id(token)
        if configured is not None and configured != actual:
            found = f"is {actual}" if actual is not None else "is not in the tokenizer"
            fix = (f"set {field} to {actual} if the vision tower was trained with this tokenizer, else load the "
                   "config.json and tokenizer.json published together") if actual is not None else (
                "load the tokenizer.json published with this config.json")
            raise ConfigError(f"config.json {field}={configured} but the tokenizer's {token} {found}: the config and "
                              f"the tokenizer do not belong together; {fix}")


def _check_bos_agrees(backend: HFTokenizer, named_bos: tuple[str, Path] | None, origin: Path) -> None:
    """CheckpointError when the tokenizer's post-processor begins a text prompt with another token than the named
    `bos_token` (`named_bos`: it and the file naming it) that chat templates write: text and chat prompts would start
    differently (the same conversation sent as text or as messages would give other outputs), and a rendered prompt
    could hold two BOS tokens."""
    prefix, _ = post_processor_frame_of(backend)
    if named_bos is None or not prefix or prefix[0] == backend.token_to_id(named_bos[0]):
        return
    bos, named_in = named_bos
    raise CheckpointError(f"bos_token={bos!r} (from {named_in}) is id {backend.token_to_id(bos)}, but the "
                          f"post-processor of {origin} begins a prompt with {backend.id_to_token(prefix[0])!r} (id "
                          f"{prefix[0]}): text and chat prompts would start differently; the files do not belong "
                          "together")


def post_processor_frame_of(backend: HFTokenizer) -> tuple[list[int], list[int]]:
    """The ids the post-processor puts before and after a text (`add_special_tokens=True`; a bos in front, for
    Muse): ([], []) where it adds nothing."""
    plain = backend.encode("a", add_special_tokens=False).ids
    framed = backend.encode("a", add_special_tokens=True).ids
    return next(((framed[:i], framed[i + len(plain):]) for i in range(len(framed) - len(plain) + 1)
                 if framed[i:i + len(plain)] == plain), ([], []))


def _check_framing_markers(backend: HFTokenizer, origin: Path) -> None:
    """CheckpointError when a protocol marker (`<|start|>`, `<|eot|>`, ...) the vocabulary has does not encode as that
    one token: an entry that is not an added token is split by the pre-tokenizer like any text, so every prompt's
    markup would be other tokens than the model was trained on, without an error (P-TOK-1)."""
    for marker in FRAMING_MARKERS:
        marker_id = backend.token_to_id(marker)
        ids = backend.encode(marker, add_special_tokens=False).ids
        if marker_id is not None and ids != [marker_id]:
            raise CheckpointError(f"{origin}: {marker!r} (id {marker_id}) encodes as {len(ids)} tokens, not as itself: "
                                  "the protocol's markers must be special tokens (tokenizer.json's added_tokens; "
                                  "CONTROL in a GGUF's tokenizer.ggml.token_type), or every prompt's markup is "
                                  "tokenized as text")


def _named_token(name: str) -> property:
    """A `Tokenizer` property: the spelling of the named token `name` (tokenizer_config.json's), None where unset."""
    return property(lambda self: self._named_tokens.get(name))


def _named_token_id(name: str) -> property:
    """A `Tokenizer` property: the id of the named token `name`, None where unset."""
    return property(lambda self: self._named_token_id(name))


class Tokenizer:
    """A loaded tokenizer. Build it with `Tokenizer.from_dir`."""

    def __init__(self, backend: HFTokenizer, named_tokens: dict[str, str], tokenizer_file: Path,
                 clean_up: CleanUpSettings = CleanUpSettings(), shape: ShapeSettings = ShapeSettings(),
                 extra: ExtraSpecialTokens = ExtraSpecialTokens(), split_special_tokens: bool = False):
        self._backend = backend
        # tokenizer_config.json's: a caller's text prompt is tokenized with special-token spellings as text
        # (`encode_input_text`), as transformers' tokenizer call tokenizes it
        self.split_special_tokens = split_special_tokens
        self._named_tokens = named_tokens
        self.extra = extra
        self.tokenizer_file = tokenizer_file
        self._clean_up = clean_up
        self.shape = shape
        self._byte_level_decode = _ByteLevelInverse.for_backend(backend)
        self._token_bytes_cache: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load `tokenizer.json` and the special token names from a checkpoint directory.

        Raises CheckpointError when tokenizer.json is missing or unreadable, when a config file is not
        valid JSON, when a named or extra special token is not in the vocabulary, or when an added token's entry in
        tokenizer_config.json names no token of tokenizer.json or has a flag that is not true or false.
        """
        directory = Path(path)
        tokenizer_file = directory / TOKENIZER_FILE
        refuse_broken_link(tokenizer_file)
        if not tokenizer_file.is_file():
            raise CheckpointError(
                f"{tokenizer_file} not found; a checkpoint needs the tokenizer.json that came with the model"
            )
        refuse_lfs_pointer(tokenizer_file)  # else "not a valid tokenizers file: expected value at line 1 column 1"
        try:
            backend = HFTokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the Rust side raises a bare Exception for any parse failure
            raise CheckpointError(f"{tokenizer_file} is not a valid tokenizers file: {exc}") from exc
        # a truncation or padding saved in the file would cut or pad every prompt; transformers turns both off for
        # every call that does not ask for them, which no prompt Glimmer encodes does
        backend.no_truncation()
        backend.no_padding()

        config_file = directory / TOKENIZER_CONFIG_FILE
        config = read_json_object(config_file, error=CheckpointError) or {}
        _check_added_tokens_decoder(config, config_file, backend, tokenizer_file)
        _apply_added_token_flags(config, config_file, backend, tokenizer_file)
        # transformers 5 reads special_tokens_map.json only for a config without `added_tokens_decoder` (older files)
        map_file = directory / SPECIAL_TOKENS_MAP_FILE
        refuse_broken_link(map_file)  # unread or not, a file of the snapshot missing: a download cut short
        legacy_map = ({} if "added_tokens_decoder" in config
                      else read_json_object(map_file, error=CheckpointError) or {})
        named_in = _read_named_tokens(config, config_file, legacy_map, map_file)
        named_tokens = {name: token for name, (token, _) in named_in.items()}
        for name, (token, origin) in named_in.items():
            if backend.token_to_id(token) is None:
                raise CheckpointError(f"{name}={token!r} (from {origin}) is not a token of {tokenizer_file}; the "
                                      "files do not belong together")
        _check_bos_agrees(backend, named_in.get("bos_token"), tokenizer_file)
        _check_framing_markers(backend, tokenizer_file)
        extra = _read_extra_special_tokens(config, config_file, legacy_map, map_file)
        for token in extra.listed:
            if backend.token_to_id(token) is None:
                # transformers would add it as a new token, which this model has no embedding row for
                raise CheckpointError(f"the special token {token!r} of {config_file} is not a token of "
                                      f"{tokenizer_file}; the files do not belong together")
        extra = _without_unknown_model_specific(extra, backend, config_file)
        split_special_tokens = _read_split_special_tokens(config, config_file)
        tokenizer = cls(backend, named_tokens, tokenizer_file, _read_clean_up_settings(config),
                        _read_shape_settings(config, config_file), extra, split_special_tokens)
        logger.info(
            "loaded tokenizer %s: %d tokens, bos=%r eos=%r pad=%r",
            tokenizer_file,
            tokenizer.vocab_size,
            tokenizer.bos_token,
            tokenizer.eos_token,
            tokenizer.pad_token,
        )
        return tokenizer

    @classmethod
    def from_backend(cls, backend: HFTokenizer, named_tokens: dict[str, str], origin: Path) -> Tokenizer:
        """A tokenizer built by a checkpoint reader (a GGUF's `tokenizer.ggml.*`); `origin` names it in errors.

        Raises CheckpointError when a named special token is not in the vocabulary.
        """
        for name, token in named_tokens.items():
            if backend.token_to_id(token) is None:
                raise CheckpointError(f"{name}={token!r} is not a token of the tokenizer in {origin}")
        bos = named_tokens.get("bos_token")
        _check_bos_agrees(backend, None if bos is None else (bos, origin), origin)
        _check_framing_markers(backend, origin)
        tokenizer = cls(backend, named_tokens, origin)
        logger.info("built tokenizer from %s: %d tokens, bos=%r eos=%r", origin, tokenizer.vocab_size,
                    tokenizer.bos_token, tokenizer.eos_token)
        return tokenizer

    def encode(self, text: str, *, add_special_tokens: bool = False,
               literals: Mapping[str, str] | None = None) -> list[int]:
        """Token ids of `text`. Special-token spellings in the text become those special tokens.

        Rendered chat prompts already hold their BOS, so the default adds nothing (P-TMPL-5); with
        `add_special_tokens=True` the post-processor prepends another, as transformers' tokenizer call does.

        `literals` maps placeholders in `text` to what a caller wrote there (`protocol.RenderedPrompt`): each is
        tokenized as that text, special-token spellings included, so that only the rest of `text` (the
        template's markup) yields special tokens. Text without placeholders is tokenized as without literals.
        """
        if literals and any(placeholder in text for placeholder in literals):
            return self._encode_with_literals(text, literals, add_special_tokens)
        if add_special_tokens or self._piece_ids is None:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        # the pieces between special tokens, each tokenized once across prompts (token_pieces.py)
        split = list(self._split_at_special_tokens(text))
        pieces = iter(self._piece_ids.ids([piece for piece, _ in split if piece]))
        ids: list[int] = []
        for piece, special_id in split:
            if piece:
                ids += next(pieces)
            if special_id is not None:
                ids.append(special_id)
        return ids

    def encode_input_text(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of a caller's text prompt (a completion's, `LLM.generate`'s, the tokenizer call's), as
        transformers' tokenizer call makes them: special-token spellings become those tokens, or stay text where
        tokenizer_config.json sets `split_special_tokens`. A rendered chat prompt is `encode(text, literals=...)`:
        its template's markup stays control tokens whatever the setting."""
        if self.split_special_tokens:
            return self._literal_backend.encode(text, add_special_tokens=add_special_tokens).ids
        return self.encode(text, add_special_tokens=add_special_tokens)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` as plain text: special-token spellings stay text (`<|eot|>` is its characters)."""
        return self._literal_backend.encode(text, add_special_tokens=False).ids

    def _encode_with_literals(self, text: str, literals: Mapping[str, str], add_special_tokens: bool) -> list[int]:
        """Split `text` at its special tokens as the backend does, then tokenize each piece in between, with
        its placeholders restored, with special-token matching off (the backend would tokenize each piece on
        its own too: added tokens split the text before the model runs)."""
        placeholder = re.compile("|".join(map(re.escape, literals)))
        pieces: list[int] = []
        for piece, special_id in self._split_at_special_tokens(text):
            pieces += self._encode_literal_piece(piece, placeholder, literals)
            if special_id is not None:
                pieces.append(special_id)
        if not add_special_tokens:
            return pieces
        before, after = self._post_processor_frame
        return before + pieces + after

    def _split_at_special_tokens(self, text: str) -> Iterator[tuple[str, int | None]]:
        """(the text before a special token, that token's id) in order, then (the rest, None): `text` split at its
        special tokens as the backend splits it, a token that strips whitespace on a side taking it from its
        piece, and one flagged `single_word` splitting it only where no word character is beside it."""
        start = 0
        for match in self._special_pattern.finditer(text):
            token = self._special_tokens[match.group()]
            if token.single_word and not _stands_alone(text, match.start(), match.end()):
                continue  # the backend passes over it too, and goes on after it
            piece_end = len(text[start:match.start()].rstrip(WHITESPACE)) + start if token.lstrip else match.start()
            yield text[start:piece_end], self._backend.token_to_id(token.content)
            start = match.end()
            if token.rstrip:
                start = len(text) - len(text[start:].lstrip(WHITESPACE))
        yield text[start:], None

    @cached_property
    def prompt_start_token(self) -> str | None:
        """The token tokenizer.json's post-processor begins a prompt with (the bos `add_special_tokens=True` adds),
        None where it adds none before the text. It is the named `bos_token` where both are set (checked at load);
        a checkpoint may set it alone (a bos named only in special_tokens_map.json, which transformers 5 leaves
        unread beside `added_tokens_decoder`)."""
        prefix, _ = self._post_processor_frame
        return self._backend.id_to_token(prefix[0]) if prefix else None

    @cached_property
    def _post_processor_frame(self) -> tuple[list[int], list[int]]:
        """What the post-processor adds before and after a text's ids, found once (`post_processor_frame_of`)."""
        return post_processor_frame_of(self._backend)

    @property
    def prompt_bos_token(self) -> str | None:
        """The bos a prompt begins with, which P-TMPL-5 keeps to one: the named `bos_token`, else the post-processor's
        (`prompt_start_token`), which `LLMEngine.encode_prompt` adds to a rendered prompt without it."""
        return self.bos_token if self.bos_token is not None else self.prompt_start_token

    @property
    def prompt_bos_token_id(self) -> int | None:
        """The id of `prompt_bos_token`; None where a prompt begins with no bos."""
        token = self.prompt_bos_token
        return None if token is None else self._backend.token_to_id(token)

    @cached_property
    def _piece_ids(self) -> PieceIds | None:
        """The ids of the pieces between special tokens, kept across prompts; None for a backend that does not see
        each piece alone (`pieces_encode_alone`), whose texts are tokenized whole."""
        return PieceIds(self._backend) if pieces_encode_alone(self._backend) else None

    def _encode_literal_piece(self, piece: str, placeholder: re.Pattern[str], literals: Mapping[str, str]) -> list[int]:
        if not piece:
            return []
        return self.encode_text(placeholder.sub(lambda match: literals[match.group()], piece))

    @cached_property
    def _special_added_tokens(self) -> dict[int, AddedToken]:
        """id -> added token of every special token: each flagged special in tokenizer.json, and the protocol's
        framing markers whatever their flag (P-TOK-3: they carry the turn's framing). The one source of
        `all_special_ids`, `control_tokens`, the split at special tokens and the literal backend: a marker flagged
        `special: false` that one of them missed would let caller text forge a turn's framing."""
        decoder = self._backend.get_added_tokens_decoder()
        return {token_id: added for token_id, added in decoder.items()
                if added.special or added.content in FRAMING_MARKERS}

    @cached_property
    def _special_tokens(self) -> dict[str, AddedToken]:
        return {added.content: added for added in self._special_added_tokens.values()}

    @cached_property
    def _special_pattern(self) -> re.Pattern[str]:
        spellings = sorted(self._special_tokens, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, spellings)) if spellings else "(?!)")

    @cached_property
    def _literal_backend(self) -> HFTokenizer:
        """A copy of the backend that tokenizes special-token spellings as plain text. The backend matches an added
        token not flagged special even so, so every special token (`_special_added_tokens`) is flagged special in the
        copy first."""
        state = json.loads(self._backend.to_str())
        for added in state["added_tokens"]:
            if added["id"] in self._special_added_tokens:
                added["special"] = True
        backend = HFTokenizer.from_str(json.dumps(state))
        backend.encode_special_tokens = True
        return backend

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters of text one token can stand for, so that a text of C characters has at least
        C / max_token_chars tokens. A byte-level token string spells one byte per character, and a text has
        at least as many bytes as characters; an added token stands for its own spelling."""
        return max(len(token) for token in self._backend.get_vocab(with_added_tokens=True))

    @property
    def control_tokens(self) -> tuple[str, ...]:
        """Spellings of the special tokens (framing whatever its flag, media, reserved): what caller text may not
        produce."""
        return tuple(self._special_tokens)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept verbatim with nothing inserted between tokens (P-TOK-3).

        Incomplete or invalid UTF-8 renders as U+FFFD; ids outside the vocabulary are dropped, as
        transformers does.
        """
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def cleaned_up_as_transformers(self, text: str, clean_up_tokenization_spaces: bool | None) -> str:
        """`text` (decoded) as transformers 5's `decode(..., clean_up_tokenization_spaces=...)` leaves it: cleaned of
        the spaces before punctuation and contractions (`TOKENIZATION_SPACES`) when asked, or by tokenizer_config's
        default when None, except for a BPE model (every Muse tokenizer), whose text transformers leaves as it is
        (the clean-up would strip spaces the text holds) unless the config forces it."""
        wanted = self._clean_up.by_default if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        if not wanted or (type(self._backend.model).__name__ == "BPE" and not self._clean_up.even_for_bpe):
            return text
        for spaced, joined in TOKENIZATION_SPACES:
            text = text.replace(spaced, joined)
        return text

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of `token_id` (byte-level spelling, e.g. 'Ġthe'), or None if out of range."""
        if token_id < 0:
            return None
        return self._backend.id_to_token(token_id)

    def require_token_id(self, token: str) -> int:
        """The id of a token the caller cannot work without. Raises ConfigError naming it and the file."""
        token_id = self._backend.token_to_id(token)
        if token_id is None:
            raise ConfigError(
                f"the tokenizer in {self.tokenizer_file} has no token {token!r}, which Muse Glimmer needs; "
                "use the tokenizer that came with the checkpoint"
            )
        return token_id

    # the named tokens (tokenizer_config.json's `bos_token`, ...) and their ids; None where unset
    bos_token = _named_token("bos_token")
    eos_token = _named_token("eos_token")
    pad_token = _named_token("pad_token")
    unk_token = _named_token("unk_token")
    sep_token = _named_token("sep_token")
    cls_token = _named_token("cls_token")
    mask_token = _named_token("mask_token")
    bos_token_id = _named_token_id("bos_token")
    eos_token_id = _named_token_id("eos_token")
    pad_token_id = _named_token_id("pad_token")
    unk_token_id = _named_token_id("unk_token")
    sep_token_id = _named_token_id("sep_token")
    cls_token_id = _named_token_id("cls_token")
    mask_token_id = _named_token_id("mask_token")

    @property
    def special_tokens(self) -> dict[str, str]:
        """The named tokens a chat template receives as variables, those that are set: bos, eos, unk, sep, pad, cls,
        mask, then the model-specific ones tokenizer_config.json names (`image_token`), as transformers 5 passes its
        `special_tokens_map` to the template."""
        named = {name: self._named_tokens[name] for name in NAMED_TOKEN_NAMES if name in self._named_tokens}
        return named | dict(self.extra.model_specific)

    def get_vocab(self) -> dict[str, int]:
        """Every token's vocabulary entry → its id, added tokens included (transformers' `get_vocab()`)."""
        return self._backend.get_vocab(with_added_tokens=True)

    def added_tokens_decoder(self) -> dict[int, AddedToken]:
        """Every added token's id → its AddedToken (content and flags), ascending by id."""
        return dict(sorted(self._backend.get_added_tokens_decoder().items()))

    def tokens_to_text(self, tokens: Sequence[str]) -> str:
        """The text of vocabulary entries (`['Hello', 'Ġworld']` → 'Hello world'), joined by the tokenizer's decoder
        as transformers' `convert_tokens_to_string` joins them (with spaces when tokenizer.json has no decoder)."""
        decoder = self._backend.decoder
        return " ".join(tokens) if decoder is None else decoder.decode(list(tokens))

    @property
    def vocab_size(self) -> int:
        """Number of tokens, added tokens included (transformers' `len(tokenizer)`)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def base_vocab_size(self) -> int:
        """Number of tokens without the added ones (transformers' `vocab_size`)."""
        return self._backend.get_vocab_size(with_added_tokens=False)

    @cached_property
    def all_special_ids(self) -> tuple[int, ...]:
        """Ids of every added token flagged special in tokenizer.json, and of the protocol's framing markers whatever
        their flag (`_special_added_tokens`; a tokenizer flagging `<|eot|>` `special: false` had every grammar-backed
        chat turn refused and its `<|eot|>` kept as text), ascending.

        This is the set `skip_special_tokens` would drop (as transformers' `decode` drops them), wider than
        transformers' `all_special_ids` (named tokens only, `LLMTokenizer.all_special_ids`): for Muse it includes the
        framing and media tokens and the reserved ones.
        """
        return tuple(sorted(self._special_added_tokens))

    @cached_property
    def hidden_in_replies(self) -> frozenset[int]:
        """The special tokens a chat reply does not show: every one but the framing markers the output parser reads
        (P-REQ-1). The server's chat and `LLM.chat` have the engine leave them out of the text
        (`LLMEngine.add_request`'s `hidden_token_ids`)."""
        return frozenset(i for i in self.all_special_ids if self.decode([i]) not in FRAMING_MARKERS)

    @property
    def decoder_type(self) -> str | None:
        """tokenizer.json's decoder `type` ('ByteLevel' for every Muse tokenizer), None without a decoder."""
        decoder = self._backend.decoder
        return None if decoder is None else json.loads(decoder.__getstate__()).get("type")

    @property
    def is_byte_level(self) -> bool:
        """True when tokens map to raw bytes through the ByteLevel alphabet (GPT-2 style; Muse is)."""
        return self._byte_level_decode is not None

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes `decode` produces for this token alone, before UTF-8 decoding.

        Only for byte-level tokenizers (see `is_byte_level`). Ids outside the vocabulary give b"", as
        `decode` drops them. Cached: the incremental detokenizer calls this once per generated token.
        """
        cached = self._token_bytes_cache.get(token_id)
        if cached is not None:
            return cached
        if self._byte_level_decode is None:
            raise CheckpointError(
                f"{self.tokenizer_file} is not byte-level; its tokens have no byte spelling"
            )
        token = self.id_to_token(token_id)
        token_bytes = b"" if token is None else self._byte_level_decode(token)
        self._token_bytes_cache[token_id] = token_bytes
        return token_bytes

    def _named_token_id(self, name: str) -> int | None:
        token = self._named_tokens.get(name)
        return None if token is None else self._backend.token_to_id(token)


# the symbols (So) Unicode counts Alphabetic (Other_Alphabetic): circled and squared Latin letters, Ⓐ and 🅰
_ALPHABETIC_SYMBOLS = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))


def _is_word_character(char: str) -> bool:
    """Rust's regex `\\w`, by which the tokenizers library tells a word: Alphabetic, a mark, a decimal digit, a
    connector punctuation (`_`) or a joiner (Python's `\\w` leaves marks out and takes other numbers, `½`, in).
    Alphabetic is the letters, the letter numbers (Nl) and Other_Alphabetic, whose characters are marks but for
    `_ALPHABETIC_SYMBOLS`."""
    category = unicodedata.category(char)
    return (char.isalpha() or category[0] == "M" or category in ("Nd", "Nl", "Pc")
            or char in "\u200c\u200d"
            or (category == "So" and any(low <= ord(char) <= high for low, high in _ALPHABETIC_SYMBOLS)))


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Whether `text[start:end]` has no word character beside it: where the backend matches an added token flagged
    `single_word` (tokenizers' AddedVocabulary::find_matches)."""
    return ((start == 0 or not _is_word_character(text[start - 1]))
            and (end == len(text) or not _is_word_character(text[end])))


class _ByteLevelInverse:
    """Token string → bytes, exactly as tokenizers' ByteLevel decoder does it.

    GPT-2's byte-level alphabet maps each byte to a printable character: printable Latin-1 bytes to
    themselves, the other 68 bytes to U+0100 onwards in byte order. The decoder maps a token back
    character by character; a token with any character outside the alphabet (an added token holding a
    space, say) contributes its UTF-8 bytes unchanged.
    """

    def __init__(self) -> None:
        printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        chars = {byte: chr(byte) for byte in printable}
        for offset, byte in enumerate(b for b in range(256) if b not in chars):
            chars[byte] = chr(256 + offset)
        self._byte_of_char = {char: byte for byte, char in chars.items()}

    def __call__(self, token: str) -> bytes:
        try:
            return bytes(self._byte_of_char[char] for char in token)
        except KeyError:
            return token.encode("utf-8")

    @classmethod
    def for_backend(cls, backend: HFTokenizer) -> _ByteLevelInverse | None:
        """The inverse if `backend` decodes with a lone ByteLevel decoder, else None."""
        decoder = backend.decoder
        if decoder is None:
            return None
        decoder_type = json.loads(decoder.__getstate__()).get("type")
        return cls() if decoder_type == "ByteLevel" else None


def _read_named_tokens(config: Mapping[str, object], path: Path, legacy_map: Mapping[str, object],
                       map_path: Path) -> dict[str, tuple[str, Path]]:
    """The named special tokens' strings (`NAMED_TOKEN_NAMES`: bos, eos, unk, sep, pad, cls, mask), each with the file
    it came from, as transformers 5 reads them: tokenizer_config.json's (`config`, read from `path`), each name
    `legacy_map` sets (null included) taken from it instead. `legacy_map` is special_tokens_map.json (`map_path`) of
    a config without `added_tokens_decoder`, {} beside one: transformers 5 (and so vLLM) reads the map only for such
    older configs, so a name the map alone sets is None there, and a chat template's `bos_token` renders nothing."""
    fields = {name: (config.get(name), path) for name in NAMED_TOKEN_NAMES}
    fields |= {name: (legacy_map[name], map_path) for name in NAMED_TOKEN_NAMES if name in legacy_map}
    return {name: (_token_content(value, origin, name), origin) for name, (value, origin) in fields.items()
            if value is not None}


def _check_added_tokens_decoder(config: Mapping[str, object], path: Path, backend: HFTokenizer,
                                tokenizer_file: Path) -> None:
    """CheckpointError for an entry of tokenizer_config.json's `added_tokens_decoder` that is no token of
    tokenizer.json: transformers adds it to the vocabulary (a row the model has no embedding for) and encodes its
    spelling as that token, where this tokenizer would split it into characters; or whose flag (`ADDED_TOKEN_FLAGS`)
    is not true or false."""
    decoder = config.get("added_tokens_decoder")
    if decoder is None:
        return
    if not isinstance(decoder, Mapping):
        raise CheckpointError(f"{path}: added_tokens_decoder={decoder!r:.80} is invalid; expected an object of token "
                              "ids to AddedToken objects")
    for token_id, entry in decoder.items():
        name = f"added_tokens_decoder[{token_id!r}]"
        if not (token_id.isascii() and token_id.isdecimal()):  # transformers fails on int(key) for it
            raise CheckpointError(f"{path}: {name}: the key is not a token id; each key is the id of its token in "
                                  f"{tokenizer_file}, as a string of digits")
        content = _token_content(entry, path, name)
        for flag in ADDED_TOKEN_FLAGS:
            if isinstance(entry, Mapping) and flag in entry and not isinstance(entry[flag], bool):
                raise CheckpointError(f"{path}: {name}.{flag}={entry[flag]!r} is not true or false")
        if backend.token_to_id(content) is None:
            raise CheckpointError(f"{path}: {name} is {content!r}, which is not a token of {tokenizer_file} "
                                  "(transformers would add it as a new token, which the model has no row for); the "
                                  "files do not belong together")


ADDED_TOKEN_FLAGS = ("special", "lstrip", "rstrip", "single_word", "normalized")


def _apply_added_token_flags(config: Mapping[str, object], path: Path, backend: HFTokenizer,
                             tokenizer_file: Path) -> None:
    """Give each added token of `backend` the flags tokenizer_config.json's `added_tokens_decoder` (read from `path`,
    checked by `_check_added_tokens_decoder`) sets for it, where they differ from tokenizer.json's, as transformers'
    tokenizer (and so vLLM's) takes them: it adds each such entry again, and the backend keeps the token's id with
    the config's flags. A `<|start|>` that strips the spaces before it in one file and not in the other tokenized
    `a <|start|>` otherwise than transformers. The changes are logged in one warning."""
    decoder = config.get("added_tokens_decoder") or {}
    current = {added.content: added for added in backend.get_added_tokens_decoder().values()}
    changes: list[tuple[AddedToken, str]] = []
    for entry in decoder.values():
        if not isinstance(entry, Mapping):
            continue  # a bare string: transformers makes an AddedToken of it with tokenizer.json's own flags
        before = current.get(entry["content"])
        special = entry.get("special", False)
        # a token tokenizer.json flags special stays so: the backend keeps it among its special tokens (transformers'
        # decode with skip_special_tokens drops it) whatever the config says
        wanted = AddedToken(entry["content"], single_word=entry.get("single_word", False),
                            lstrip=entry.get("lstrip", False), rstrip=entry.get("rstrip", False),
                            normalized=entry.get("normalized", not special),
                            special=special or (before is not None and before.special))
        changed = [flag for flag in ADDED_TOKEN_FLAGS
                   if before is None or getattr(before, flag) != getattr(wanted, flag)]
        if changed:
            had = "not an added token there" if before is None else ", ".join(
                f"{flag}={getattr(before, flag)}" for flag in changed)
            changes.append((wanted, f"{wanted.content!r}: " + ", ".join(
                f"{flag}={getattr(wanted, flag)}" for flag in changed) + f" (tokenizer.json: {had})"))
    if not changes:
        return
    backend.add_tokens([wanted for wanted, _ in changes])  # at once: each call rebuilds the backend's matcher
    shown = "; ".join(change for _, change in changes[:3]) + (f"; and {len(changes) - 3} more" if len(changes) > 3
                                                              else "")
    logger.warning("%s: added_tokens_decoder sets other flags than %s for %d token(s), and transformers (so vLLM too) "
                   "uses the config's, as Glimmer does: %s", path, tokenizer_file, len(changes), shown)


def _read_extra_special_tokens(config: Mapping[str, object], path: Path, legacy_map: Mapping[str, object],
                               map_path: Path) -> ExtraSpecialTokens:
    """The special tokens of tokenizer_config.json (`config`, read from `path`) beyond the named ones, as transformers
    5's `from_pretrained` reads them: `extra_special_tokens` (a list, or a dict of named ones), else the older name
    `additional_special_tokens`; and every other field named `*_token` whose value is a string. `legacy_map`, the
    special_tokens_map.json (`map_path`) of a config without `added_tokens_decoder` ({} otherwise), adds its
    `extra_special_tokens` list to the config's, gives its `additional_special_tokens` where the config lists none,
    and names model-specific tokens before the config's (whose value wins). Raises CheckpointError naming the file and
    the field for a list that is no list, or an entry that is no token."""
    listed, model_specific = _extra_fields(legacy_map, map_path, strings_only=False)
    listed_here, named_here = _extra_fields(config, path, strings_only=True)
    model_specific |= named_here
    map_listed = legacy_map.get("extra_special_tokens")
    if listed_here:
        listed = listed_here + [token for token in listed if token not in listed_here] if isinstance(
            map_listed, list) else listed_here
    elif "extra_special_tokens" in config and not isinstance(map_listed, list):
        listed = []  # an explicit empty list keeps the map's older `additional_special_tokens` out, as there
    return ExtraSpecialTokens(tuple(listed), model_specific)


def _extra_fields(config: Mapping[str, object], path: Path, *, strings_only: bool) -> tuple[list[str], dict[str, str]]:
    """One file's extra special tokens: its list (`extra_special_tokens`, else `additional_special_tokens`) and its
    model-specific tokens (each other `*_token` field, and an `extra_special_tokens` dict). `strings_only`: a
    `*_token` field counts only as a string (tokenizer_config.json; special_tokens_map.json's may be AddedToken
    dicts)."""
    kinds = str if strings_only else (str, dict)
    listed = config.get("extra_special_tokens")
    model_specific = {name: _token_content(value, path, name) for name, value in config.items()
                      if name.endswith("_token") and name not in NAMED_TOKEN_NAMES and isinstance(value, kinds)}
    if isinstance(listed, dict):
        model_specific |= {name: _token_content(value, path, f"extra_special_tokens.{name}")
                           for name, value in listed.items()}
        listed = None
    key = "extra_special_tokens"
    if not listed:  # the older name, which errors name as the file does
        key, listed = "additional_special_tokens", config.get("additional_special_tokens")
    if not isinstance(listed, list | tuple | type(None)):
        raise CheckpointError(f"{path}: {key}={listed!r} is invalid; expected a list of tokens")
    return [_token_content(value, path, key) for value in listed or ()], model_specific


def _without_unknown_model_specific(extra: ExtraSpecialTokens, backend: HFTokenizer, path: Path) -> ExtraSpecialTokens:
    """`extra` without the model-specific fields whose value is no token of `backend`, each named in a warning: any
    string field whose name ends in `_token` counts as one, so such a field may be no token at all (transformers
    would add it to the vocabulary, which this model has no embedding row for)."""
    unknown = [name for name, token in extra.model_specific.items() if backend.token_to_id(token) is None]
    for name in unknown:
        logger.warning("%s: %s=%r is not a token of the tokenizer; it is left out of the special tokens (transformers "
                       "would add it as a new token, which the model has no row for)", path, name,
                       extra.model_specific[name])
    kept = {name: token for name, token in extra.model_specific.items() if name not in unknown}
    return ExtraSpecialTokens(extra.listed, kept) if unknown else extra


def _read_clean_up_settings(config: Mapping[str, object]) -> CleanUpSettings:
    """The decode clean-up fields of tokenizer_config.json, read as transformers reads them (for their truth)."""
    return CleanUpSettings(bool(config.get("clean_up_tokenization_spaces")),
                           bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))


def _read_split_special_tokens(config: Mapping[str, object], path: Path) -> bool:
    """tokenizer_config.json's `split_special_tokens` (False where absent, as in transformers). Raises
    CheckpointError for a value that is not true or false. Where true, a text prompt's special-token spellings are
    text, as transformers' tokenizer call makes them; a chat prompt keeps its template's control tokens, where
    transformers' `apply_chat_template(tokenize=True)` and vLLM would split those too: logged as a warning."""
    split = config.get("split_special_tokens", False)
    if not isinstance(split, bool):
        raise CheckpointError(f"split_special_tokens={split!r} in {path} is not true or false")
    if split:
        logger.warning("%s sets split_special_tokens: special-token spellings in a text prompt (completions, "
                       "LLM.generate, the tokenizer call) are tokenized as text, as transformers does. Chat prompts "
                       "keep the chat template's control tokens (user text in them is always plain text), where "
                       "transformers' apply_chat_template(tokenize=True) and vLLM would tokenize the template's own "
                       "markup as text too", path)
    return split


def _read_shape_settings(config: Mapping[str, object], path: Path) -> ShapeSettings:
    """The truncation and padding fields of tokenizer_config.json (`path`), transformers' defaults for those it leaves
    out. Raises CheckpointError naming the field and the file for a side other than 'right' or 'left' (transformers
    refuses the file too) and for a `model_max_length` that is no positive integer."""
    limit = config.get("model_max_length")
    if limit is not None:
        try:
            limit = positive_length(limit)
        except ValueError:
            raise CheckpointError(f"model_max_length={limit!r} in {path} is not a positive integer") from None
    sides = {}
    for name in ("padding_side", "truncation_side"):
        sides[name] = config.get(name, "right")
        if sides[name] not in SIDES:
            raise CheckpointError(f"{name}={sides[name]!r} in {path} is not 'right' or 'left'")
    return ShapeSettings(VERY_LARGE_INTEGER if limit is None else limit, **sides)


def _token_content(value: object, path: Path, name: str) -> str:
    """A special token given as a string or as an AddedToken dict (`{"content": ...}`)."""
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise CheckpointError(f"{path}: {name}={value!r} is invalid; expected a token string or AddedToken")
    return value
