"""Content keys of the prefix cache and the encoder cache: SHA-256 over a canonical byte encoding.

A key stands for contents that a later request reuses as its own: a KV block (its parent's key, its token
ids and the media in it) or vision features (pixels and grid). Two contents sharing a key would answer one
request with another's context, so keys must resist chosen inputs, not only chance: Python's `hash` is 64
bits and easy to invert for integers and tuples (vLLM's CVE-2025-25183 is this flaw). Every encoding here is
fixed-width or length-prefixed, so different contents never encode to the same bytes.
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections.abc import Sequence

KEY_BYTES = 32


def digest(*parts: bytes) -> bytes:
    """SHA-256 of the concatenated parts (callers make the concatenation unambiguous)."""
    return hashlib.sha256(b"".join(parts)).digest()


def token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32: the form hashed into a block key and stored with a cached block."""
    packed = array.array("I", token_ids)  # C unsigned int: 4 bytes on every platform torch supports
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _uint32(value: int) -> bytes:
    return value.to_bytes(4, "little")


def root_key(cache_salt: str | None) -> bytes:
    """The parent key of a sequence's first block. The salt enters here, so every block key of a chain
    depends on it and requests with different salts (or none) never share a block."""
    if cache_salt is None:
        return digest(b"glimmer-prefix-root\x00")
    return digest(b"glimmer-prefix-root\x01", cache_salt.encode("utf-8", "surrogatepass"))


def encoder_key(content_hash: bytes, cache_salt: str | None) -> bytes:
    """Key of a media item's vision features in the encoder cache: its content hash, salted as block keys are,
    so that requests with different salts never reuse (nor probe by timing) each other's encoded images."""
    if cache_salt is None:
        return content_hash
    return digest(root_key(cache_salt), content_hash)


def block_key(parent: bytes, tokens: bytes, media_keys: Sequence[bytes]) -> bytes:
    """Key of a full KV block from its parent's key, its `token_bytes` and the keys of the media whose
    placeholders it holds: O(block) work, so a sequence's keys are computed block by block as it grows."""
    return digest(parent, _uint32(len(tokens)), tokens, _uint32(len(media_keys)), *media_keys)
