"""The Muse Glimmer text decoder (architecture.md §2), named as the canonical checkpoint names it.

Deltas from a Gemma2-style decoder, each visible below: weightless embedding norm; four centered
(1+w) sandwich norms with two eps values; weightless fp32 QK-norm, then q·qk_scale_factor, then RoPE,
then the usual 1/sqrt(head_dim); NoPE and RoPE layers, each full or sliding-window attention (the release
puts NoPE exactly on its full-attention layers); an elementwise sigmoid output gate before o_proj; a
plain-scale final norm.
"""

from __future__ import annotations

import torch
from torch import nn

from glimmer.checkpoint.config import TextConfig
from glimmer.model import kernels
from glimmer.model.attention import paged_attention
from glimmer.model.context import FULL, SLIDING, ForwardContext
from glimmer.model.kernels.decoder_stack import DecoderStack, StackLayer, StackShape
from glimmer.model.kernels.linear import linear
from glimmer.model.kernels.packed_linear import PackedLinear, can_pack
from glimmer.model.kernels.qk_norm_rope import HeadLayout
from glimmer.model.kernels.residual_norm import NormSpec
from glimmer.model.layers import (
    CenteredRMSNorm,
    GatedMLP,
    NormedEmbedding,
    RotaryTable,
    ScaledRMSNorm,
    apply_rotary,
    fuse_linears,
    release_packed,
    weightless_rms_norm,
)


class TextAttention(nn.Module):
    def __init__(self, config: TextConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qk_norm_eps = config.rms_norm_eps
        self.qk_scale_factor = config.qk_scale_factor
        self.uses_rope = config.rope_layers[layer_idx]
        is_sliding = config.layer_types[layer_idx] == "sliding_attention"
        self.group_name = SLIDING if is_sliding else FULL
        self.sliding_window = config.sliding_window if is_sliding else None
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.q_size, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.kv_size, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.kv_size, bias=bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=bias)
        # the output gate never has a bias, whatever attention_bias says (§3)
        self.gate_proj = nn.Linear(config.hidden_size, config.q_size, bias=False)
        self.layout = HeadLayout(self.num_heads, self.num_kv_heads, self.head_dim)
        self.qkvg_weight: torch.Tensor | PackedLinear | None = None
        self.qkvg_bias: torch.Tensor | None = None
        self.o_packed: PackedLinear | None = None

    def fuse_projections(self) -> None:
        """q, k, v and the gate share their input: one GEMM (the weights stay the modules' tensors, as views)."""
        if self.qkvg_weight is None:
            self.qkvg_weight, self.qkvg_bias = fuse_linears(self.q_proj, self.k_proj, self.v_proj, self.gate_proj)

    def pack_projections(self) -> None:
        """After `fuse_projections`, on the CPU: the fused product and o_proj read weights packed for oneDNN, which
        replace the dense ones (every forward reads the packed ones)."""
        if isinstance(self.qkvg_weight, torch.Tensor) and can_pack(self.qkvg_weight):
            self.qkvg_weight = PackedLinear(self.qkvg_weight, self.qkvg_bias)
            self.qkvg_bias = None
            self.o_packed = PackedLinear(self.o_proj.weight, self.o_proj.bias)
            release_packed(self.q_proj, self.k_proj, self.v_proj, self.gate_proj, self.o_proj)

    def _output_projection(self, out: torch.Tensor) -> torch.Tensor:
        if self.o_packed is not None:
            return self.o_packed(out)
        return linear(out, self.o_proj.weight, self.o_proj.bias)

    def forward(
        self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], ctx: ForwardContext
    ) -> torch.Tensor:
        caches = ctx.kv_caches.get(self.layer_idx)
        if self.qkvg_weight is not None and caches is not None:
            return self._forward_fused(hidden, rotary, ctx, caches)
        n = hidden.shape[0]
        if self.qkvg_weight is not None:  # fused (and maybe packed) weights: the same products, one GEMM
            q, k, v, gate = self.layout.split(linear(hidden, self.qkvg_weight, self.qkvg_bias))
        else:
            q = self.q_proj(hidden).view(n, self.num_heads, self.head_dim)
            k = self.k_proj(hidden).view(n, self.num_kv_heads, self.head_dim)
            v = self.v_proj(hidden).view(n, self.num_kv_heads, self.head_dim)
            gate = self.gate_proj(hidden)
        # QK-norm in fp32, cast back, then the extra q scale in the model dtype (§2.5.2-3)
        q = weightless_rms_norm(q, self.qk_norm_eps) * self.qk_scale_factor
        k = weightless_rms_norm(k, self.qk_norm_eps)
        if self.uses_rope:
            cos, sin = rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # elementwise gate (from the same normed input) applied before o_proj (§2.5.8)
        out = paged_attention(
            q,
            k,
            v,
            ctx,
            layer_idx=self.layer_idx,
            group_name=self.group_name,
            sliding_window=self.sliding_window,
            scale=self.head_dim**-0.5,
            gate=gate,
        )
        return self._output_projection(out)

    def _forward_fused(
        self,
        hidden: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        ctx: ForwardContext,
        caches: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """The same formulas in three launches and two GEMMs: projection, norm+RoPE+cache store, attention+gate."""
        qkvg = linear(hidden, self.qkvg_weight, self.qkvg_bias)
        key_cache, value_cache = caches
        group = ctx.groups[self.group_name]
        q = kernels.qk_norm_rope_store(qkvg, self.layout, self.qk_norm_eps, self.qk_scale_factor,
                                       rotary if self.uses_rope else None, key_cache, value_cache,
                                       group.slot_mapping)
        gate = qkvg[:, qkvg.shape[1] - self.layout.q_size :]
        out = kernels.paged_attention(q, key_cache, value_cache, group, ctx, self.sliding_window,
                                      self.head_dim**-0.5, gate)
        return self._output_projection(out)


class TextDecoderLayer(nn.Module):
    def __init__(self, config: TextConfig, layer_idx: int):
        super().__init__()
        self.self_attn = TextAttention(config, layer_idx)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = CenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        # the two post norms use post_norm_eps (1e-8 in the release), not rms_norm_eps — §2.1, §14.2
        self.post_attention_layernorm = CenteredRMSNorm(config.hidden_size, config.post_norm_eps)
        self.pre_feedforward_layernorm = CenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = CenteredRMSNorm(config.hidden_size, config.post_norm_eps)

    def forward(
        self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], ctx: ForwardContext
    ) -> torch.Tensor:
        h = self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rotary, ctx))
        x = x + h
        h = self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        return x + h


class TextModel(nn.Module):
    """Embedding → decoder layers → final norm. Returns the final-normed hidden states."""

    def __init__(self, config: TextConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = NormedEmbedding(config.vocab_size, config.hidden_size, config.rms_norm_eps)
        self.layers = nn.ModuleList(TextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = ScaledRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryTable(config.head_dim, config.rope_theta, config.rope_scaling,
                                  config.max_position_embeddings)
        self.fused = False
        # formed by fuse_for_inference: the first layer's input norm, then per layer its post-attention,
        # pre-feedforward and post-feedforward norms and the norm after it (the next input norm, or the final one)
        self.input_spec: NormSpec | None = None
        self.layer_specs: list[tuple[NormSpec, NormSpec, NormSpec, NormSpec]] = []
        self.decoder_stack: DecoderStack | None = None  # bound by bind_decoder_stack (CPU, float32)

    def fuse_for_inference(self) -> None:
        """Fused projections and the one-pass sandwich norms of `_forward_fused`.

        Reads the weights once: norms' scales and packed projections are formed here, so an inference model
        is fused after its weights are loaded and not changed after. Fusing twice changes nothing."""
        if self.fused:
            return
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()
        following = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        self.input_spec = self.layers[0].input_layernorm.spec
        self.layer_specs = [
            (layer.post_attention_layernorm.spec, layer.pre_feedforward_layernorm.spec,
             layer.post_feedforward_layernorm.spec, after.spec)
            for layer, after in zip(self.layers, following, strict=True)
        ]
        self.fused = True

    def pack_projections(self) -> None:
        """After `fuse_for_inference`, on the CPU: every projection reads weights packed for oneDNN (see
        `engine.model_loader.prepare_for_cpu`, which decides whether that pays on this machine)."""
        for layer in self.layers:
            layer.self_attn.pack_projections()
            layer.mlp.pack_projections()

    def bind_decoder_stack(self) -> bool:
        """After `fuse_for_inference`, with dense float32 weights on the CPU: decode steps run every layer in one C
        call (`kernels/decoder_stack.py`), reading these weights in place. True if bound; False where the C kernels
        do not run (another dtype or device, no compiler, packed weights, GLIMMER_KERNELS=torch)."""
        if not self.fused:
            raise RuntimeError("bind_decoder_stack needs the fused model: call fuse_for_inference first")
        config = self.config
        attention = self.layers[0].self_attn
        shape = StackShape(hidden_size=config.hidden_size, num_heads=attention.num_heads,
                           num_kv_heads=attention.num_kv_heads, head_dim=attention.head_dim,
                           intermediate_size=config.intermediate_size, qk_norm_eps=attention.qk_norm_eps,
                           qk_scale_factor=attention.qk_scale_factor)
        layers = []
        for layer, specs in zip(self.layers, self.layer_specs, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            if not (isinstance(attn.qkvg_weight, torch.Tensor) and isinstance(mlp.gate_up_weight, torch.Tensor)):
                return False  # packed for oneDNN: no dense weights to read
            layers.append(StackLayer(
                layer_idx=attn.layer_idx, qkvg_weight=attn.qkvg_weight, qkvg_bias=attn.qkvg_bias,
                o_weight=attn.o_proj.weight, o_bias=attn.o_proj.bias, gate_up_weight=mlp.gate_up_weight,
                down_weight=mlp.down_proj.weight, post_attention=specs[0], pre_feedforward=specs[1],
                post_feedforward=specs[2], following=specs[3], group_name=attn.group_name,
                sliding_window=attn.sliding_window, uses_rope=attn.uses_rope))
        if not DecoderStack.fits(shape, self.input_spec, layers):
            return False
        self.decoder_stack = DecoderStack(shape, self.input_spec, layers)
        return True

    def forward(self, inputs_embeds: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if self.fused:
            return self._forward_fused(inputs_embeds, ctx)
        x = inputs_embeds
        rotary = self.rotary(ctx.positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, rotary, ctx)
            if i in ctx.capture_layers:
                ctx.captured[i] = x
        return self.norm(x)

    def _forward_fused(self, inputs_embeds: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The decoder layers of §2.4 with each post-norm, residual add and the next pre-norm in one pass."""
        rotary = self.rotary(ctx.positions, inputs_embeds.dtype)
        if self.decoder_stack is not None and self.decoder_stack.takes(inputs_embeds, ctx):
            return self.decoder_stack(inputs_embeds, rotary, ctx)
        return self.layers_op_by_op(inputs_embeds, rotary, ctx, len(self.layers))

    def layers_op_by_op(self, inputs_embeds: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                        ctx: ForwardContext, count: int) -> torch.Tensor:
        """The fused forward's first `count` layers op by op (all of them in a forward; fewer where the engine
        times a decode step against the decoder stack's, `engine.model_loader.stack_keeps_up`)."""
        residual, h = kernels.residual_norm(None, inputs_embeds, None, self.input_spec)
        for i, (layer, specs) in enumerate(zip(self.layers[:count], self.layer_specs[:count], strict=True)):
            post_attention, pre_feedforward, post_feedforward, following = specs
            a = layer.self_attn(h, rotary, ctx)
            residual, h = kernels.residual_norm(a, residual, post_attention, pre_feedforward)
            m = layer.mlp(h)
            residual, h = kernels.residual_norm(m, residual, post_feedforward, following)
            if i in ctx.capture_layers:
                ctx.captured[i] = residual
        return h
