"""Token ids of the text between a prompt's special tokens, kept across prompts.

An agent sends its whole conversation with every turn: the tools' declarations and each earlier message render to
the same text as the turn before, and only the tail is new. Special tokens split a text before anything else runs
(added tokens are matched first; the normalizer, pre-tokenizer and model then see each piece between them on its
own), so a prompt's ids are its pieces' ids joined around the special tokens' ids, and a piece seen before needs no
tokenizing. `PieceIds` keeps them, least recently used first out, within a budget of bytes: each entry's text, ids
and place in the cache, so that many short pieces (a conversation of one-word messages) cost what they hold.

This holds for a tokenizer whose pipeline sees each piece alone (`pieces_encode_alone`); a Metaspace pre-tokenizer
that prefixes only the text's first piece, a special token matched after normalization or only as a whole word, or a
non-special added token (matched beside the special ones) would break it, and such a tokenizer encodes each text
whole.
"""

from __future__ import annotations

import json
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

PIECE_CACHE_BYTES = 16 << 20  # 16 MiB of kept pieces, their ids and the cache's own entries
ENTRY_BYTES = 200  # an OrderedDict's memory for a key (its node, slot, spare room): 196 bytes under churn, CPython 3.11


def pieces_encode_alone(backend: HFTokenizer) -> bool:
    """Whether `backend` tokenizes each piece between its special tokens as it tokenizes that piece alone: every
    added token is special, matched in the raw text anywhere (not normalized, not single-word), and no Metaspace
    pre-tokenizer prefixes only the first piece (`prepend_scheme: first`)."""
    added = backend.get_added_tokens_decoder().values()
    if any(not token.special or token.normalized or token.single_word for token in added):
        return False
    return not _prefixes_first_piece_only(json.loads(backend.to_str()).get("pre_tokenizer"))


def _prefixes_first_piece_only(pre_tokenizer: Any) -> bool:
    if isinstance(pre_tokenizer, list):
        return any(_prefixes_first_piece_only(item) for item in pre_tokenizer)
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "Metaspace" and pre_tokenizer.get("prepend_scheme") == "first":
        return True
    return _prefixes_first_piece_only(pre_tokenizer.get("pretokenizers"))


class PieceIds:
    """Token ids of text pieces, tokenized by `backend` (no special tokens added) and kept within `max_bytes` of
    memory (`entry_bytes`). Thread-safe: prompts are tokenized on several worker threads."""

    def __init__(self, backend: HFTokenizer, max_bytes: int = PIECE_CACHE_BYTES):
        self._backend = backend
        self._max_bytes = max_bytes
        self._kept: OrderedDict[str, array] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[PieceIds], tuple[HFTokenizer, int]]:
        """Pickled (with its Tokenizer, sent to another process) as an empty cache of the same backend and size: its
        lock cannot be pickled, and the kept ids, up to megabytes, are rebuilt where they are used."""
        return PieceIds, (self._backend, self._max_bytes)

    def ids(self, pieces: Sequence[str]) -> list[list[int]]:
        """Each piece's ids: kept ones from the cache, the others tokenized together (and kept)."""
        found: dict[str, list[int]] = {}
        with self._lock:
            for piece in pieces:
                kept = self._kept.get(piece)
                if kept is not None:
                    self._kept.move_to_end(piece)
                    found[piece] = kept.tolist()
        missing = list(dict.fromkeys(piece for piece in pieces if piece not in found))
        if missing:
            for piece in missing:  # one at a time: encode_batch would start the tokenizers' thread pool, after which
                # a fork makes the library warn and turn its parallelism off
                found[piece] = self._backend.encode(piece, add_special_tokens=False).ids
            self._keep({piece: found[piece] for piece in missing})
        return [found[piece] for piece in pieces]

    def _keep(self, new: dict[str, list[int]]) -> None:
        with self._lock:
            for piece, ids in new.items():
                kept = array("i", ids)
                size = entry_bytes(piece, kept)
                if size > self._max_bytes or piece in self._kept:
                    continue
                self._kept[piece] = kept
                self._bytes += size
            while self._bytes > self._max_bytes:
                self._bytes -= entry_bytes(*self._kept.popitem(last=False))


def entry_bytes(piece: str, ids: array) -> int:
    """The memory a kept piece takes: its text (1, 2 or 4 bytes a character), its ids and its cache entry. A budget of
    characters alone let a million pieces of four characters (350 bytes each in all) keep 190 MiB."""
    return sys.getsizeof(piece) + sys.getsizeof(ids) + ENTRY_BYTES
