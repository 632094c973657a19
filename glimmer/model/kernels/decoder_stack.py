"""A CPU decode step's decoder layers in one C call (`glimmer_decode_layers` in `cpu/decoder_stack.c`).

On a 2-vCPU Xeon the weights of a float32 decode step at hidden size 512 and 8 layers stream in 3–4 ms, and the
step's other work (per layer two projections through torch, four C kernels through ctypes and the Python between
them) took another 2.5–3.5 ms, as long again. The stack does every layer's products, norms, RoPE, cache stores and
attention in one parallel region, with its own products that read each weight row once for up to eight
sequences (faster here than `F.linear` at eight rows: MKL's small-row product does not reach the memory rate).

The reference is `TextModel`'s per-op forward (`_forward_fused`: the same formulas op by op, each op checked against
the plain modules); tests/model/test_decoder_stack.py compares the two. Sums run in another order than torch's, so
results agree to float32 rounding, not bit for bit. It takes decode steps only (each sequence one token), in
float32 on the CPU with the C kernels built; every other step runs the per-op forward.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glimmer.model.context import FULL, SLIDING, ForwardContext, KVGroupView
from glimmer.model.kernels import cpu
from glimmer.model.kernels.paged_attention import paged_attention_torch
from glimmer.model.kernels.qk_norm_rope import HeadLayout, qk_norm_rope_store_torch
from glimmer.model.kernels.residual_norm import NormSpec, residual_norm_torch
from glimmer.model.kernels.silu_mul import silu_mul_torch
from glimmer.model.kernels.support import references_forced

GROUPS = (FULL, SLIDING)
"""The KV groups' names (ForwardContext.groups), in the order the C step's block-table sets are given."""

_P, _I64, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double


class LayerArgs(ctypes.Structure):
    """`glimmer_layer` in decoder_stack.c, field for field."""

    _fields_ = [
        ("qkvg_weight", _P), ("qkvg_bias", _P), ("o_weight", _P), ("o_bias", _P), ("gate_up_weight", _P),
        ("down_weight", _P), ("post_attention_scale", _P), ("pre_feedforward_scale", _P),
        ("post_feedforward_scale", _P), ("following_scale", _P), ("post_attention_eps", _D),
        ("pre_feedforward_eps", _D), ("post_feedforward_eps", _D), ("following_eps", _D), ("key_cache", _P),
        ("value_cache", _P), ("num_blocks", _I64), ("group", _I64), ("window", _I64), ("rope", _I64),
        ("capture", _P),
    ]


class StepArgs(ctypes.Structure):
    """`glimmer_step` in decoder_stack.c, field for field."""

    _fields_ = [
        ("rows", _I64), ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64), ("head_dim", _I64), ("inter", _I64),
        ("qk_eps", _D), ("q_scale", _D), ("attention_scale", _D), ("cos", _P), ("sin", _P),
        ("seq_lens", _P), ("block_size", _I64 * 2), ("tables", _P * 2), ("table_width", _I64 * 2),
        ("kv_start", _P * 2), ("slots", _P * 2),
        ("input_scale", _P), ("input_eps", _D), ("barrier_spin_ns", _I64), ("barrier_sleeps", _P),
    ]


@dataclass(frozen=True)
class StackLayer:
    """One decoder layer as the stack reads it: the fused dense weights (as `fuse_for_inference` forms them) and the
    norms after each sublayer, the last being the next layer's input norm (or the final norm)."""

    layer_idx: int
    qkvg_weight: torch.Tensor
    qkvg_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor
    down_weight: torch.Tensor
    post_attention: NormSpec
    pre_feedforward: NormSpec
    post_feedforward: NormSpec
    following: NormSpec
    group_name: str
    sliding_window: int | None
    uses_rope: bool


@dataclass(frozen=True)
class StackShape:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    qk_norm_eps: float
    qk_scale_factor: float


@dataclass
class TeamSize:
    """How many threads the stack's next step runs on: all of torch's while they meet at the step's barriers, or one
    where one is measured faster.

    After two steps in a row of the same batch in which SLEEPY_WAITS of the barrier waits outlasted their spin (other
    processes hold the cores and keep descheduling a thread the others wait for; one such step may be a quiet machine's
    stray interrupt; waits after the attention phase, whose items may be fewer than the threads or uneven, do not
    count), PROBE_STEPS steps run on one thread, which waits for nobody, and their time is compared with the two
    sleepy steps'. Faster: one thread for `alone_steps` steps in all, then all of them again, to look. Not faster
    (threads that wait for slower ones on a quiet machine: efficiency cores beside performance cores, a static split
    of uneven work): all threads, with sleepy steps left alone for a hold-off that doubles at each lost probe (from
    `alone_steps` to 64 times it), so a machine where waits always sleep spends 2 of every 4,000 or more steps
    probing. A probe across a change of batch compares nothing, and holds off INCONCLUSIVE_HOLD_OFF steps. On a
    2-vCPU machine with other processes busy, one thread decoded 1.5-2x as fast as two, and quiet, two
    threads 1.7x as fast as one (bench/MEASUREMENTS.md, CPU decode). Where OMP_NUM_THREADS is set, that count is the
    user's and always runs."""

    SLEEPY_WAITS = 2
    PROBE_STEPS = 2
    INCONCLUSIVE_HOLD_OFF = 8
    alone_steps: int = 64
    alone_left: int = 0
    hold_off: int = 0
    """All-thread steps still to run before sleepy steps are acted on again (after a lost probe)."""
    last: int | None = None
    """The threads the last step ran on (its logits run on as many); None before the first."""

    def __post_init__(self) -> None:
        self._sleepy: list[tuple[int, float]] = []  # (rows, seconds) of the latest all-thread steps in a row that slept
        self._probe: list[tuple[int, float]] | None = None  # the probe's one-thread steps, while one runs
        self._next_hold_off = self.alone_steps  # after the next lost probe

    @staticmethod
    def _user_set() -> bool:
        return bool(os.environ.get("OMP_NUM_THREADS", "").strip())

    def threads(self, available: int) -> int:
        self.last = available
        if available > 1 and not self._user_set():
            if self._probe is not None:
                self.last = 1
            elif self.alone_left > 0:
                self.alone_left -= 1
                self.last = 1
        return self.last

    def record(self, threads: int, barrier_sleeps: int, rows: int, seconds: float) -> None:
        """What the step of `rows` sequences just run on `threads` threads saw: how many of its barrier waits slept,
        and how long it took."""
        if self._user_set():
            return
        if threads == 1:
            if self._probe is not None:
                self._probe.append((rows, seconds))
                if len(self._probe) == self.PROBE_STEPS:
                    self._decide()
            return
        if self.hold_off > 0:
            self.hold_off -= 1
            return
        if barrier_sleeps < self.SLEEPY_WAITS:
            self._sleepy = []
            return
        self._sleepy = [step for step in self._sleepy if step[0] == rows] + [(rows, seconds)]
        if len(self._sleepy) == 2:
            self._probe = []

    def _decide(self) -> None:
        """Whether the probe's one thread beat the two sleepy all-thread steps on the same batch."""
        probe, sleepy = self._probe or [], self._sleepy
        self._probe, self._sleepy = None, []
        if len({rows for rows, _ in probe + sleepy}) != 1:
            # the batch changed: nothing to compare; all threads, and a short hold-off, so that a batch changing every
            # few steps cannot keep half the steps probing on one thread
            self.hold_off = self.INCONCLUSIVE_HOLD_OFF
            return
        if sum(s for _, s in probe) / len(probe) < sum(s for _, s in sleepy) / len(sleepy):
            self.alone_left = max(0, self.alone_steps - self.PROBE_STEPS)
            self._next_hold_off = self.alone_steps
        else:
            self.hold_off = self._next_hold_off
            self._next_hold_off = min(2 * self.hold_off, 64 * self.alone_steps)


class DecoderStack:
    """A text model's decoder layers bound to `glimmer_decode_layers`: the weights' addresses are taken once, so the
    model's weights must not be replaced after (an inference model is fused once, after loading)."""

    def __init__(self, shape: StackShape, input_norm: NormSpec, layers: list[StackLayer], max_rows: int | None = None):
        self.shape = shape
        self.layers = layers
        self.input_norm = input_norm
        # the most sequences a step it takes may have (None: any): its products stream the weights once per pass of
        # up to eight rows and compute the passes without the blocking of a large-batch GEMM, so past some batch
        # the op-by-op step (torch's products) is faster; the engine times where (`decoder_stack_rows`)
        self.max_rows = max_rows
        self.team = TeamSize()
        self._args = (LayerArgs * len(layers))()
        for args, layer in zip(self._args, layers, strict=True):
            args.qkvg_weight, args.qkvg_bias = layer.qkvg_weight.data_ptr(), cpu.pointer(layer.qkvg_bias)
            args.o_weight, args.o_bias = layer.o_weight.data_ptr(), cpu.pointer(layer.o_bias)
            args.gate_up_weight, args.down_weight = layer.gate_up_weight.data_ptr(), layer.down_weight.data_ptr()
            for name in ("post_attention", "pre_feedforward", "post_feedforward", "following"):
                spec = getattr(layer, name)
                setattr(args, f"{name}_scale", spec.scale.data_ptr())
                setattr(args, f"{name}_eps", spec.eps)
            args.group = GROUPS.index(layer.group_name)
            args.window = layer.sliding_window or 0
            args.rope = int(layer.uses_rope)

    def first(self, count: int) -> DecoderStack:
        """The stack of the first `count` layers (the last one's following norm stays the next layer's input norm)."""
        return DecoderStack(self.shape, self.input_norm, self.layers[:count], self.max_rows)

    @staticmethod
    def fits(shape: StackShape, input_norm: NormSpec, layers: list[StackLayer]) -> bool:
        """Whether the stack computes these layers: float32 CPU tensors laid out as the C step reads them, the
        C kernels built, and widths of at least two (a product reads weight rows in pairs)."""
        tensors = [input_norm.scale]
        for layer in layers:
            tensors += [t for t in (layer.qkvg_weight, layer.qkvg_bias, layer.o_weight, layer.o_bias,
                                    layer.gate_up_weight, layer.down_weight) if t is not None]
            tensors += [spec.scale for spec in (layer.post_attention, layer.pre_feedforward, layer.post_feedforward,
                                                layer.following)]
        return (
            bool(layers)
            and all(t.is_contiguous() for t in tensors)
            and all(layer.group_name in GROUPS for layer in layers)
            and shape.num_heads % shape.num_kv_heads == 0
            and min(shape.hidden_size, shape.intermediate_size) >= 2
            and cpu.runs(*tensors)
        )

    def takes(self, inputs_embeds: torch.Tensor, ctx: ForwardContext) -> bool:
        """Whether this step is one the stack runs: a decode step of at most `max_rows` sequences over every layer's
        cache, in float32 on the CPU, with GLIMMER_KERNELS not `torch` (which may be set after loading)."""
        if not (ctx.one_query_per_sequence and inputs_embeds.dtype == torch.float32
                and inputs_embeds.device.type == "cpu" and inputs_embeds.is_contiguous()
                and (self.max_rows is None or inputs_embeds.shape[0] <= self.max_rows)
                and not references_forced()):
            return False
        head = (self.shape.num_kv_heads, self.shape.head_dim)
        for layer in self.layers:
            caches = ctx.kv_caches.get(layer.layer_idx)
            if (caches is None or layer.group_name not in ctx.groups or caches[0].dtype != torch.float32
                    or caches[0].shape[1] != ctx.groups[layer.group_name].block_size
                    or tuple(caches[0].shape[2:]) != head or caches[1].shape != caches[0].shape
                    or not (caches[0].is_contiguous() and caches[1].is_contiguous())):
                return False
        return True

    def __call__(self, inputs_embeds: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                 ctx: ForwardContext, lib: ctypes.CDLL | None = None) -> torch.Tensor:
        """The final-normed hidden states of a decode step (`takes`), the caches written as the per-op forward
        writes them; the residual stream after each of ctx.capture_layers goes to ctx.captured.

        Raises IndexError when a slot or block table points outside a cache (nothing is written then)."""
        shape, rows = self.shape, inputs_embeds.shape[0]
        out = torch.empty_like(inputs_embeds)
        step = StepArgs(rows=rows, hidden=shape.hidden_size, heads=shape.num_heads, kv_heads=shape.num_kv_heads,
                        head_dim=shape.head_dim, inter=shape.intermediate_size, qk_eps=shape.qk_norm_eps,
                        q_scale=shape.qk_scale_factor, attention_scale=shape.head_dim**-0.5,
                        input_scale=self.input_norm.scale.data_ptr(), input_eps=self.input_norm.eps,
                        barrier_spin_ns=cpu.barrier_spin_ns())
        cos, sin = (t.contiguous() for t in rotary)
        seq_lens = ctx.seq_lens.to(torch.int64).contiguous()
        step.cos, step.sin, step.seq_lens = cos.data_ptr(), sin.data_ptr(), seq_lens.data_ptr()
        keep = [cos, sin, seq_lens]  # alive until the call returns
        for index, name in enumerate(GROUPS):
            group = ctx.groups.get(name)
            if group is None:
                continue
            step.block_size[index] = group.block_size
            tables = group.block_tables.to(torch.int64).contiguous()
            starts = group.kv_start_pos.to(torch.int64).contiguous()
            slots = group.slot_mapping.to(torch.int64).contiguous()
            step.tables[index], step.table_width[index] = tables.data_ptr(), tables.shape[1]
            step.kv_start[index], step.slots[index] = starts.data_ptr(), slots.data_ptr()
            keep += [tables, starts, slots]
        for args, layer in zip(self._args, self.layers, strict=True):
            key_cache, value_cache = ctx.kv_caches[layer.layer_idx]
            args.key_cache, args.value_cache = key_cache.data_ptr(), value_cache.data_ptr()
            args.num_blocks = key_cache.shape[0]
            if layer.layer_idx in ctx.capture_layers:
                ctx.captured[layer.layer_idx] = captured = torch.empty_like(inputs_embeds)
                args.capture = captured.data_ptr()
            else:
                args.capture = None
        sleeps = ctypes.c_int64(0)
        step.barrier_sleeps = ctypes.addressof(sleeps)
        threads = self.team.threads(cpu.threads())
        lib = cpu.library() if lib is None else lib
        started = time.perf_counter()
        bad = lib.glimmer_decode_layers(ctypes.byref(step), self._args, len(self.layers),
                                        inputs_embeds.data_ptr(), out.data_ptr(), threads)
        self.team.record(threads, sleeps.value, inputs_embeds.shape[0], time.perf_counter() - started)
        if bad < 0:
            raise MemoryError("decoder stack: no memory for the step's work buffers")
        if bad:
            row = bad - 1
            raise IndexError(f"decoder stack: sequence {row}'s cache slot or block table points outside the KV cache "
                             f"(seq_len {int(seq_lens[row])})")
        return out


def stack_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (rows, in) · Wᵀ + b by the stack's own product (`glimmer_linear`), float32 contiguous tensors on the CPU with
    the C kernels built: what bench/cpu_decode.py times beside torch's products, and what tests check against
    `F.linear`."""
    out = x.new_empty((x.shape[0], weight.shape[0]))
    cpu.library().glimmer_linear(x.data_ptr(), x.shape[0], weight.data_ptr(), cpu.pointer(bias), weight.shape[0],
                                 weight.shape[1], out.data_ptr(), cpu.threads())
    return out


def decoder_stack_torch(stack: DecoderStack, inputs_embeds: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                        ctx: ForwardContext) -> torch.Tensor:
    """The reference: the stack's layers through each op's torch reference, in `TextModel._forward_fused`'s order."""
    shape = stack.shape
    layout = HeadLayout(shape.num_heads, shape.num_kv_heads, shape.head_dim)
    residual, h = residual_norm_torch(None, inputs_embeds, None, stack.input_norm)
    for layer in stack.layers:
        key_cache, value_cache = ctx.kv_caches[layer.layer_idx]
        group = ctx.groups[layer.group_name]
        qkvg = F.linear(h, layer.qkvg_weight, layer.qkvg_bias)
        q = qk_norm_rope_store_torch(qkvg, layout, shape.qk_norm_eps, shape.qk_scale_factor,
                                     rotary if layer.uses_rope else None, key_cache, value_cache, group.slot_mapping)
        gate = qkvg[:, qkvg.shape[1] - layout.q_size :]
        attended = paged_attention_torch(q, key_cache, value_cache, group, ctx, layer.sliding_window,
                                         shape.head_dim**-0.5, gate)
        residual, h = residual_norm_torch(F.linear(attended, layer.o_weight, layer.o_bias), residual,
                                          layer.post_attention, layer.pre_feedforward)
        mlp = F.linear(silu_mul_torch(F.linear(h, layer.gate_up_weight)), layer.down_weight)
        residual, h = residual_norm_torch(mlp, residual, layer.post_feedforward, layer.following)
        if layer.layer_idx in ctx.capture_layers:
            ctx.captured[layer.layer_idx] = residual
    return h


def random_stack(shape: StackShape, groups: list[tuple[str, int | None, bool]], generator: torch.Generator,
                 biases: bool = False) -> DecoderStack:
    """A stack of random weights and norms, one layer per (group name, sliding window, uses RoPE) of `groups`."""
    def tensor(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator) / size[-1] ** 0.5

    def norm(offset: float) -> NormSpec:
        return NormSpec(torch.randn(shape.hidden_size, generator=generator) * 0.3, 1e-6, offset)

    q, kv, hidden, inter = (shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim,
                            shape.hidden_size, shape.intermediate_size)
    layers = [
        StackLayer(layer_idx=i, qkvg_weight=tensor(2 * q + 2 * kv, hidden),
                   qkvg_bias=tensor(2 * q + 2 * kv) if biases else None, o_weight=tensor(hidden, q),
                   o_bias=tensor(hidden) if biases else None, gate_up_weight=tensor(2 * inter, hidden),
                   down_weight=tensor(hidden, inter), post_attention=norm(1.0), pre_feedforward=norm(1.0),
                   post_feedforward=norm(1.0), following=norm(1.0 if i + 1 < len(groups) else 0.0),
                   group_name=name, sliding_window=window, uses_rope=rope)
        for i, (name, window, rope) in enumerate(groups)
    ]
    return DecoderStack(shape, norm(1.0), layers)


def probe_cpu(lib) -> str | None:
    """The C step against the reference (cpu.library's load-time check): a sliding RoPE layer and a full NoPE one,
    odd widths, biases, GQA 2:1, three sequences of which one's listed blocks start past position 0."""
    generator = torch.Generator().manual_seed(0)
    shape = StackShape(hidden_size=37, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=19,
                       qk_norm_eps=1e-6, qk_scale_factor=0.7)
    stack = random_stack(shape, [(SLIDING, 5, True), (FULL, None, False)], generator, biases=True)
    ctx = ForwardContext(query_start_loc=torch.tensor([0, 1, 2, 3]), seq_lens=torch.tensor([7, 13, 1]),
                         positions=torch.tensor([6, 12, 0]), max_query_len=1, capture_layers=(0,))
    # (sequence 1 sits in block 0 of the full cache; the others' padding entries point there too, masked)
    ctx.groups = {
        FULL: KVGroupView(block_size=4, block_tables=torch.tensor([[3, 1, 0, 0], [5, 2, 4, 0], [6, 0, 0, 0]]),
                            kv_start_pos=torch.tensor([0, 0, 0]), slot_mapping=torch.tensor([6, 0, 24])),
        SLIDING: KVGroupView(block_size=4, block_tables=torch.tensor([[3, 1, 0, 0], [2, 4, 5, 0], [6, 0, 0, 0]]),
                               kv_start_pos=torch.tensor([0, 4, 0]), slot_mapping=torch.tensor([6, 20, 24])),
    }
    angles = torch.randn(3, 8, generator=generator)
    rotary = (angles.cos(), angles.sin())
    inputs = torch.randn(3, 37, generator=generator)
    results = []
    for run in (lambda: stack(inputs, rotary, ctx, lib=lib), lambda: decoder_stack_torch(stack, inputs, rotary, ctx)):
        caches = torch.randn(2, 2, 7, 4, 2, 8, generator=torch.Generator().manual_seed(1))
        ctx.kv_caches = {0: (caches[0, 0], caches[0, 1]), 1: (caches[1, 0], caches[1, 1])}
        ctx.captured = {}
        results.append((run(), caches, ctx.captured[0]))
    (got, got_caches, got_captured), (want, want_caches, want_captured) = results
    if not (torch.allclose(got, want, rtol=1e-4, atol=1e-4) and torch.allclose(got_caches, want_caches, atol=1e-5)
            and torch.allclose(got_captured, want_captured, rtol=1e-4, atol=1e-4)):
        return "decoder_stack"
    return None
