"""The attention inputs of one layer from its fused q|k|v|gate projection, with k and v stored in the cache.

Per token: split the projection into heads; QK-norm q and k (weightless RMSNorm in fp32, cast back,
architecture.md §2.5.2); q · qk_scale_factor in the model dtype (§2.5.3); RoPE on both unless the layer
is NoPE (§2.5.4; rotate-half pairs (j, j + d/2), cos/sin already in the model dtype); then write k and v
to their cache slots. Returns q (N, q_heads, d). The Triton kernel does all of it in one launch and
rounds to the model dtype after each op exactly where the reference does; for float32 on the CPU, one C call
(`kernels/cpu`) does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glimmer.model.kernels import cpu
from glimmer.model.kernels.support import launch_options, next_power_of_2, use_triton


@dataclass(frozen=True)
class HeadLayout:
    """Where q, k, v and the gate sit in a fused projection row: [q heads | k heads | v heads | gate]."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def split(self, qkvg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views q (N, h, d), k (N, kv, d), v (N, kv, d), gate (N, h·d) of a fused projection."""
        n = qkvg.shape[0]
        q, k, v, gate = qkvg.split((self.q_size, self.kv_size, self.kv_size, self.q_size), dim=-1)
        return (q.view(n, self.num_heads, self.head_dim), k.view(n, self.num_kv_heads, self.head_dim),
                v.view(n, self.num_kv_heads, self.head_dim), gate)


def qk_norm_rope_store(
    qkvg: torch.Tensor,
    layout: HeadLayout,
    eps: float,
    q_scale: float,
    rotary: tuple[torch.Tensor, torch.Tensor] | None,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """q (N, heads, d) ready for attention; k and v written at `slot_mapping`. rotary None: a NoPE layer."""
    if use_triton(qkvg, key_cache) and layout.head_dim == next_power_of_2(layout.head_dim) and qkvg.stride(-1) == 1:
        return qk_norm_rope_store_triton(qkvg, layout, eps, q_scale, rotary, key_cache, value_cache, slot_mapping)
    if cpu_supports(qkvg, layout, rotary, key_cache, value_cache):
        return qk_norm_rope_store_cpu(qkvg, layout, eps, q_scale, rotary, key_cache, value_cache, slot_mapping)
    return qk_norm_rope_store_torch(qkvg, layout, eps, q_scale, rotary, key_cache, value_cache, slot_mapping)


def qk_norm_rope_store_torch(
    qkvg: torch.Tensor,
    layout: HeadLayout,
    eps: float,
    q_scale: float,
    rotary: tuple[torch.Tensor, torch.Tensor] | None,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    from glimmer.model.attention import write_kv_cache
    from glimmer.model.layers import apply_rotary, weightless_rms_norm

    # q and k heads side by side as one (N, q_heads + kv_heads, d) view: each head is normed and rotated on its
    # own, so one pass over both gives the bits of two (and half the ops, which is what costs on the CPU)
    n, num_heads, qk_size = qkvg.shape[0], layout.num_heads, layout.q_size + layout.kv_size
    v = qkvg[:, qk_size : qk_size + layout.kv_size].view(n, layout.num_kv_heads, layout.head_dim)
    qk = weightless_rms_norm(qkvg[:, :qk_size].view(n, num_heads + layout.num_kv_heads, layout.head_dim), eps)
    if q_scale != 1.0:
        qk[:, :num_heads].mul_(q_scale)
    if rotary is not None:
        cos, sin = rotary
        qk = apply_rotary(qk, cos, sin)
    write_kv_cache(key_cache, value_cache, slot_mapping, qk[:, num_heads:], v)
    return qk[:, :num_heads]


def cpu_supports(qkvg: torch.Tensor, layout: HeadLayout, rotary: tuple[torch.Tensor, torch.Tensor] | None,
                 key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    kv_row = (layout.num_kv_heads, layout.head_dim)
    return (
        qkvg.dim() == 2
        and qkvg.stride(-1) == 1
        and qkvg.shape[1] >= 2 * (layout.q_size + layout.kv_size)
        and key_cache.is_contiguous() and value_cache.is_contiguous()
        and tuple(key_cache.shape[2:]) == kv_row and value_cache.shape == key_cache.shape
        and (rotary is None or (layout.head_dim % 2 == 0 and all(
            t.is_contiguous() and t.shape == (qkvg.shape[0], layout.head_dim) for t in rotary)))
        and cpu.runs(qkvg, key_cache, value_cache, *(rotary or ()))
    )


def qk_norm_rope_store_cpu(
    qkvg: torch.Tensor,
    layout: HeadLayout,
    eps: float,
    q_scale: float,
    rotary: tuple[torch.Tensor, torch.Tensor] | None,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    lib=None,
) -> torch.Tensor:
    lib = cpu.library() if lib is None else lib
    n = qkvg.shape[0]
    q = qkvg.new_empty((n, layout.num_heads, layout.head_dim))
    slots = slot_mapping.to(torch.int64).contiguous()
    cos, sin = rotary if rotary is not None else (None, None)
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    bad = lib.glimmer_qk_norm_rope_store(
        qkvg.data_ptr(), qkvg.stride(0), n, layout.num_heads, layout.num_kv_heads, layout.head_dim, eps, q_scale,
        cpu.pointer(cos), cpu.pointer(sin), key_cache.data_ptr(), value_cache.data_ptr(), num_slots, slots.data_ptr(),
        q.data_ptr(), cpu.threads())
    if bad:
        raise IndexError(f"slot_mapping[{bad - 1}] = {int(slots[bad - 1])} is outside the KV cache's {num_slots} slots")
    return q


def probe_cpu(lib) -> str | None:
    """The C kernel against the reference (cpu.library's load-time check): a RoPE and a NoPE layer."""
    generator = torch.Generator().manual_seed(0)
    layout = HeadLayout(num_heads=4, num_kv_heads=2, head_dim=8)
    qkvg = torch.randn(3, 2 * (layout.q_size + layout.kv_size) + 5, generator=generator)[:, 5:]
    angles = torch.randn(3, 8, generator=generator)
    for rotary in ((angles.cos(), angles.sin()), None):
        caches = [torch.zeros(4, 2, 2, 8) for _ in range(4)]
        slots = torch.tensor([5, 0, 7])
        got = qk_norm_rope_store_cpu(qkvg, layout, 1e-6, 0.5, rotary, caches[0], caches[1], slots, lib=lib)
        want = qk_norm_rope_store_torch(qkvg, layout, 1e-6, 0.5, rotary, caches[2], caches[3], slots)
        if not (torch.allclose(got, want, rtol=1e-5, atol=1e-5) and torch.allclose(caches[0], caches[2], atol=1e-5)
                and torch.equal(caches[1], caches[3])):
            return "qk_norm_rope_store"
    return None


def heads_per_program(num_heads: int) -> int:
    """Heads one program takes: 8 (the 30B's 34 q and k heads in 5 programs a token, not 34 one-warp programs
    whose launch and wait cost more than their work at large batches), fewer for models with fewer heads."""
    return min(8, next_power_of_2(num_heads))


def qk_norm_rope_store_triton(
    qkvg: torch.Tensor,
    layout: HeadLayout,
    eps: float,
    q_scale: float,
    rotary: tuple[torch.Tensor, torch.Tensor] | None,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    from glimmer.model.kernels.jit import qk_norm_rope as impl

    n = qkvg.shape[0]
    q = torch.empty((n, layout.num_heads, layout.head_dim), dtype=qkvg.dtype, device=qkvg.device)
    if n == 0:
        return q
    cos, sin = rotary if rotary is not None else (q, q)
    heads = heads_per_program(layout.num_heads + layout.num_kv_heads)
    impl.qk_norm_rope_store[(n, -(-(layout.num_heads + layout.num_kv_heads) // heads))](
        qkvg, qkvg.stride(0), cos, sin, cos.stride(0), q, q.stride(0), q.stride(1),
        key_cache, value_cache, key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), slot_mapping,
        eps, q_scale,
        NUM_HEADS=layout.num_heads, NUM_KV_HEADS=layout.num_kv_heads, HEAD_DIM=layout.head_dim,
        BLOCK_SIZE=key_cache.shape[1], HEADS=heads, USE_ROPE=rotary is not None, num_warps=4 if heads >= 8 else 1,
        **launch_options(qkvg),
    )
    return q
