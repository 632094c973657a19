"""Prefix-cache keys (SHA-256 chains), hit verification against stored token ids, and cache salts."""

from __future__ import annotations

import logging
import struct

import pytest
import torch

from glimmer import LLM, SamplingParams
from glimmer.engine import cache_keys, kv_cache_manager
from glimmer.engine.block_pool import KVBlockPool
from glimmer.engine.kv_cache_manager import FULL, KVCacheLayout, KVCacheManager
from glimmer.engine.sequence import Sequence

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
LAYOUT = KVCacheLayout(block_size=16, num_pages=16, pages_per_block={FULL: 1}, sliding_window=32)


@pytest.fixture(scope="module")
def llm(tiny_checkpoint, same_cpu_kernels_in_module):
    return LLM(str(tiny_checkpoint), progress=False)


@pytest.fixture(scope="module")
def uncached(tiny_checkpoint, same_cpu_kernels_in_module):
    return LLM(str(tiny_checkpoint), progress=False, enable_prefix_caching=False)


def _keys(token_ids: list[int], cache_salt: str | None = None) -> list[bytes]:
    seq = Sequence("s", token_ids, SamplingParams(cache_salt=cache_salt), frozenset(), len(token_ids) + 1)
    KVCacheManager(LAYOUT).update_block_hashes(seq)
    return seq.block_hashes


def test_keys_grown_token_by_token_equal_keys_computed_at_once():
    tokens = torch.randint(0, 480, (70,), generator=torch.Generator().manual_seed(1)).tolist()
    seq = Sequence("s", tokens[:20], SamplingParams(cache_salt="t"), frozenset(), 100)
    kv = KVCacheManager(LAYOUT)
    kv.update_block_hashes(seq)
    for token in tokens[20:]:
        seq.output_token_ids.append(token)
        kv.update_block_hashes(seq)
    assert seq.block_hashes == _keys(tokens, "t")
    assert len(seq.block_hashes) == 4 and all(len(key) == cache_keys.KEY_BYTES for key in seq.block_hashes)


def test_a_salt_changes_every_block_key():
    tokens = list(range(64))
    unsalted, alice, bob = _keys(tokens), _keys(tokens, "alice"), _keys(tokens, "bob")
    assert _keys(tokens, "alice") == alice
    assert not set(unsalted) & set(alice) and not set(alice) & set(bob) and not set(unsalted) & set(bob)


def test_a_cached_block_is_found_only_with_the_tokens_stored_under_its_key():
    pool = KVBlockPool(2)
    block = pool.allocate()
    key = cache_keys.block_key(cache_keys.root_key(None), cache_keys.token_bytes([1, 2, 3]), ())
    pool.register(block, key, cache_keys.token_bytes([1, 2, 3]))
    assert pool.lookup(key, cache_keys.token_bytes([1, 2, 3])) == block
    assert pool.lookup(key, cache_keys.token_bytes([3, 2, 1])) is None


def _order_blind_key(parent: bytes, tokens: bytes, media_keys) -> bytes:
    """A deliberately weak key function standing in for the old `hash((parent, chunk, media))`: blocks that hold
    the same tokens in any order collide, as two chosen chunks could under a 64-bit non-cryptographic hash."""
    ids = sorted(struct.unpack(f"<{len(tokens) // 4}I", tokens))
    return cache_keys.digest(parent, cache_keys.token_bytes(ids), *media_keys)


def test_a_forced_key_collision_is_a_miss_and_both_prompts_are_computed_correctly(
    llm, uncached, monkeypatch, caplog
):
    monkeypatch.setattr(kv_cache_manager, "block_key", _order_blind_key)
    shared = torch.randint(0, 480, (32,), generator=torch.Generator().manual_seed(5)).tolist()  # two blocks
    victim = shared + [7]
    attacker = shared[15::-1] + shared[:15:-1] + [7]  # each block reversed: other tokens, the same weak keys
    assert _keys(victim) == _keys(attacker) and victim != attacker
    expected = [out.token_ids for out in uncached.generate([victim, attacker], GREEDY)]
    assert expected[0] != expected[1]  # reusing the victim's blocks would give the attacker the victim's answer

    first = llm.generate([victim], GREEDY)[0]
    with caplog.at_level(logging.WARNING, logger="glimmer.engine.block_pool"):
        second = llm.generate([attacker], GREEDY)[0]
    assert second.num_cached_tokens == 0 and "other tokens" in caplog.text
    assert [first.token_ids, second.token_ids] == expected
    again = llm.generate([victim], GREEDY)[0]
    assert again.num_cached_tokens == 32 and again.token_ids == expected[0]


def test_requests_share_cached_blocks_only_with_the_same_cache_salt(llm, uncached):
    prompt = list(range(120, 201))  # 5 full blocks and one token to compute
    expected = uncached.generate([prompt], GREEDY)[0].token_ids
    runs = [llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, cache_salt=salt))[0]
            for salt in ("alice", "bob", None, "alice", None, "bob")]
    assert [run.num_cached_tokens for run in runs] == [0, 0, 0, 80, 80, 80]
    assert all(run.token_ids == expected for run in runs)


def test_chat_passes_the_cache_salt_through_sampling_params(llm):
    messages = [{"role": "system", "content": "You answer in one word. " * 8}, {"role": "user", "content": "Hi."}]
    kwargs = {"chat_template_kwargs": {"current_date": "2026-01-01"}}

    def cached(salt: str) -> int:
        params = SamplingParams(temperature=0, max_tokens=4, cache_salt=salt)
        return llm.chat(messages, params, **kwargs)[0].output.num_cached_tokens

    assert cached("tenant-1") == 0
    assert cached("tenant-2") == 0
    assert cached("tenant-1") > 0
