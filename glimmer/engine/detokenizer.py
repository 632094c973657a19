"""Streaming detokenization: generated token ids → text deltas, whole characters only (P-TOK-3).

A byte-level BPE token is a run of bytes, and a multi-byte UTF-8 character may be split across tokens
(an emoji is often four byte tokens). Each token's bytes therefore go through an incremental UTF-8
decoder that holds back an incomplete character until its last byte arrives. The cost per token is the
length of its bytes; the growing sequence is never decoded again.

The deltas concatenate to exactly `Tokenizer.decode(ids)`: special tokens are kept (unless listed to skip:
`skip_special_tokens`, which drops them before their bytes are decoded, as `decode` does), nothing is inserted
between tokens, and invalid bytes become U+FFFD under the same rule (one per maximal invalid subpart)
that Rust's `String::from_utf8_lossy` applies inside `decode`.

Only byte-level tokenizers are accepted — every Muse Glimmer tokenizer is one (architecture.md §5.5).
Other decoders (SentencePiece's Metaspace, WordPiece) would need a re-decoding window whose output can
differ from a one-shot decode; Glimmer refuses them rather than stream text that may not add up.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence

from glimmer.engine.tokenizer import Tokenizer
from glimmer.errors import CheckpointError


class IncrementalDetokenizer:
    """Turns one sequence's generated ids into text deltas. One instance per sequence."""

    def __init__(self, tokenizer: Tokenizer, skip_token_ids: frozenset[int] = frozenset(),
                 prompt_token_ids: Sequence[int] = ()):
        """prompt_token_ids: the tokens before the generated ones. A prompt may end partway through a character (a
        token-id prompt, or an echoed one); its bytes begin the text, so that a character the first generated tokens
        complete comes out whole, and one they never complete as U+FFFD, as vLLM primes its detokenizer with the
        prompt's last tokens. Only the prompt's last few bytes are read."""
        if not tokenizer.is_byte_level:
            raise CheckpointError(
                f"{tokenizer.tokenizer_file} does not use a ByteLevel decoder; Glimmer streams text only "
                "from byte-level BPE tokenizers, which every Muse Glimmer checkpoint ships"
            )
        self._tokenizer = tokenizer
        self._skip_token_ids = skip_token_ids
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._utf8.decode(self._tail_bytes(prompt_token_ids))  # its text is the prompt's: only the held bytes stay

    def _tail_bytes(self, token_ids: Sequence[int]) -> bytes:
        """The bytes of the last tokens of `token_ids` (skipped ones left out), at least 4 where there are: a UTF-8
        character is at most 4 bytes and its first byte is never a continuation byte, so these leave held back what
        all of them would."""
        tail: list[bytes] = []
        size = 0
        for token_id in reversed(token_ids):
            if size >= 4:
                break
            if token_id not in self._skip_token_ids:
                tail.append(self._tokenizer.token_bytes(token_id))
                size += len(tail[-1])
        return b"".join(reversed(tail))

    def add(self, token_id: int) -> str:
        """The text completed by this token; "" while a character is still incomplete or the token is skipped."""
        if token_id in self._skip_token_ids:
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def add_at(self, token_id: int) -> tuple[str, int]:
        """`add`, and where in the text returned this token's own text starts (a legacy completion's `text_offset`):
        after the U+FFFD standing for bytes held back from earlier tokens when this token's first byte cannot continue
        their character; else at 0, a character begun by earlier tokens and completed by this one being its too."""
        if token_id in self._skip_token_ids:
            return "", 0
        data = self._tokenizer.token_bytes(token_id)
        held, _ = self._utf8.getstate()
        start = 0
        if held and data:
            try:
                codecs.getincrementaldecoder("utf-8")().decode(held + data[:1])
            except UnicodeDecodeError:  # the held bytes end as U+FFFDs of their own (two for a surrogate's b"\xed\xa0")
                start = len(held.decode("utf-8", errors="replace"))
        return self._utf8.decode(data), start

    def add_many(self, token_ids: Iterable[int]) -> str:
        """The text completed by these tokens, as one delta."""
        return self._utf8.decode(b"".join(self._tokenizer.token_bytes(token_id) for token_id in token_ids
                                          if token_id not in self._skip_token_ids))

    def flush(self) -> str:
        """End of sequence: the held-back bytes, as U+FFFD since they never formed a character."""
        return self._utf8.decode(b"", final=True)
