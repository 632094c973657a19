"""Build a Muse Glimmer model (or its DFlash drafter) from a checkpoint in any format `glimmer.checkpoint.formats`
opens (safetensors, GGUF, MLX, pickle on request): config, strict weight plan, fill.

With load_format "dummy" only config.json is read and every weight is drawn at random where the model
lives (as vLLM's flag does): any geometry, the released 30B one included, builds on a GPU in seconds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from glimmer.checkpoint.config import DrafterConfig, ModelConfig
from glimmer.checkpoint.drafter import CONVERTER_CONSTANTS_LAYOUT, open_drafter_checkpoint
from glimmer.checkpoint.formats import OpenedCheckpoint, open_checkpoint
from glimmer.checkpoint.host_memory import check_drafter_fits_in_host_memory, check_fits_in_host_memory
from glimmer.checkpoint.random_weights import randomize_parameters_
from glimmer.checkpoint.weights import (
    drop_vision_if_absent,
    expected_parameters,
    fill_parameters,
    plan_weights,
    untie_if_lm_head_stored,
)
from glimmer.errors import ConfigError
from glimmer.model.context import ForwardContext, KVGroupView
from glimmer.model.drafter import DFlashDrafter
from glimmer.model.kernels import cpu as cpu_kernels
from glimmer.model.kernels.decoder_stack import GROUPS
from glimmer.model.kernels.packed_linear import PROBE_BYTES, fastest_seconds, packing_pays, packs
from glimmer.model.kernels.support import references_forced
from glimmer.model.layers import GatedMLP
from glimmer.model.muse_glimmer import MuseGlimmerForConditionalGeneration
from glimmer.model.text import TextAttention, TextModel

LOAD_FORMATS = ("auto", "dummy")

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: MuseGlimmerForConditionalGeneration
    config: ModelConfig
    weight_layout: str


def load_model(
    checkpoint: str | os.PathLike | OpenedCheckpoint,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    progress: bool = True,
    load_format: str = "auto",
    seed: int = 0,
    mmproj: str | os.PathLike | None = None,
    allow_pickle: bool = False,
) -> LoadedModel:
    """Load and validate a checkpoint; raises ConfigError or CheckpointError naming what is wrong.

    load_format "auto" reads the checkpoint's weights; "dummy" draws them at random (from `seed`).
    """
    if load_format not in LOAD_FORMATS:
        raise ConfigError(f"load_format={load_format!r} is not supported; use one of {list(LOAD_FORMATS)}")
    dummy = load_format == "dummy"
    opened = checkpoint if isinstance(checkpoint, OpenedCheckpoint) else open_checkpoint(
        checkpoint, mmproj=mmproj, allow_pickle=allow_pickle, weights=not dummy)
    if dummy:
        return _dummy_model(opened.config, dtype, device, seed)
    files, layout = opened.tensors, opened.weight_layout
    config = untie_if_lm_head_stored(drop_vision_if_absent(opened.config, files, layout), files, layout)
    model = _meta_model(config, dtype)
    plan = plan_weights(config, files, expected_parameters(model, config), layout)
    check_fits_in_host_memory(model, device, dtype, quantized=opened.quantized)
    model = model.to_empty(device=device)
    fill_parameters(model, plan, files, progress=progress)
    if config.text.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    _prepare_for_device(model, device)
    model.eval().requires_grad_(False)
    stored = opened.stored_layout or layout
    logger.info("loaded %s (%s %s weights, %s config) on %s as %s", opened.path, opened.format, stored,
                config.config_layout, device, dtype)
    return LoadedModel(model=model, config=config, weight_layout=stored)


def _meta_model(config: ModelConfig, dtype: torch.dtype) -> MuseGlimmerForConditionalGeneration:
    """The model on the meta device (nothing allocated), its lm_head tied where the config ties it: the host-memory
    check counts a tied embedding once, as it is once it loads (counted twice, the 30B geometry's vocabulary tied
    added 5.4 GB of float32 to the weights said not to fit). Materializing unties it; the loaders tie it again."""
    with torch.device("meta"):
        model = MuseGlimmerForConditionalGeneration(config).to(dtype)
    if config.text.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model


def _dummy_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str, seed: int) -> LoadedModel:
    model = _meta_model(config, dtype)
    check_fits_in_host_memory(model, device, dtype)
    model = model.to_empty(device=device)
    if config.text.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    randomize_parameters_(model, seed)
    _prepare_for_device(model, device)
    model.eval().requires_grad_(False)
    logger.info("built %s with random (dummy) weights on %s as %s", config.config_layout, device, dtype)
    return LoadedModel(model=model, config=config, weight_layout="dummy")


def _prepare_for_device(model: MuseGlimmerForConditionalGeneration | DFlashDrafter, device: torch.device | str
                        ) -> None:
    """On CUDA, projections that share an input become one GEMM and norms fuse (the weights stay the same tensors,
    so the plain forward still runs); the CPU keeps the plain math here (see `prepare_for_cpu`)."""
    if torch.device(device).type == "cuda":
        model.fuse_for_inference()


PROBE_MAX_ROWS = 8
"""The largest decode batch the CPU's packing probe times (with one row): CPUs serve small batches."""


def prepare_for_cpu(model: MuseGlimmerForConditionalGeneration | DFlashDrafter, device: torch.device | str,
                    dtype: torch.dtype, max_num_seqs: int) -> bool:
    """The engine's CPU fast path: projections that share an input fused and the norms fused, as on CUDA (the C
    kernels of `kernels/cpu` then take the small ops), unless GLIMMER_KERNELS is `torch`. Then, timed on the model's
    own weights at one row and at min(max_num_seqs, 8) rows:
    - a float32 target model's decode steps run the C decoder stack (`kernels/decoder_stack.py`: every layer in one
      call) up to the batch where a decode step through it stops keeping up with the op-by-op step
      (`decoder_stack_rows`);
    - otherwise the projections' weights are packed for oneDNN where oneDNN works for `dtype` and its packed product
      is faster than the dense one (`packing_pays`). Packed weights replace the dense ones, so a packed model runs
      only the engine's cached forward: `load_model` leaves this to the engine, and its callers keep a model whose
      every forward and parameter is there.
    True if packed."""
    if torch.device(device).type != "cpu" or references_forced():
        return False
    model.fuse_for_inference()
    rows = sorted({1, max(1, min(max_num_seqs, PROBE_MAX_ROWS))})
    counts = " and ".join(map(str, rows))
    if dtype == torch.float32 and cpu_kernels.library() is not None:  # built and probed now, not in a request
        if isinstance(model, MuseGlimmerForConditionalGeneration) and model.bind_decoder_stack():
            text = model.model.language_model
            limit = decoder_stack_rows(text, max_num_seqs)
            if limit:
                text.decoder_stack.max_rows = limit
                logger.info("%s: decode steps of at most %d sequence%s run the C decoder stack, larger ones op by "
                            "op (timed at load; GLIMMER_KERNELS=torch keeps the plain math)", type(model).__name__,
                            limit, "" if limit == 1 else "s")
                return False
            text.decoder_stack = None
            logger.info("%s: decode steps run op by op (faster than the C decoder stack here at %s rows)",
                        type(model).__name__, counts)
    if not packs(device, dtype):
        return False
    if not packing_pays(list(projection_weights(model)), rows):
        logger.info("%s: projections keep their dense weights (faster than oneDNN's packed product here at %s "
                    "rows)", type(model).__name__, counts)
        return False
    model.pack_projections()
    logger.info("%s: projections packed for oneDNN (faster here at %s rows; GLIMMER_KERNELS=torch keeps the plain "
                "math)", type(model).__name__, counts)
    return True


STACK_MARGIN = 1.1
"""Decode steps of one and a few sequences run the C decoder stack where a step through it takes at most 1.1 times the
op-by-op step's time: its results do not depend on the thread count, and within timing noise a restart should not
flip between the two (larger batches need it faster: `decoder_stack_rows`)."""

SCRATCH_BLOCK_SIZE = 16


def decoder_stack_rows(text: TextModel, max_num_seqs: int, repeats: int = 5) -> int:
    """The most sequences a decode step of `text` (its decoder stack bound) may have to run through the stack, as timed
    on this machine; 0 where the stack loses already at one row and min(max_num_seqs, 8) rows together (with
    STACK_MARGIN, in two timings). Past those, batches of 16, 32, … up to max_num_seqs are timed in turn, and the
    first at which the stack is not faster (`stack_keeps_up` without a margin) ends the ladder: its products stream
    the weights once per pass of up to eight rows without a large GEMM's blocking, so at some batch the op-by-op
    step's products overtake it (on a 2-vCPU Xeon at hidden size 512, 8 layers: 1.47 times the op-by-op rate at 16
    sequences, 0.86 at 32)."""
    rows = sorted({1, max(1, min(max_num_seqs, PROBE_MAX_ROWS))})
    # timed again before giving the stack up: on a busy machine one timing can miss by more than the margin, and a
    # start should not lose a 2-3x faster decode step to one noisy reading
    if not (stack_keeps_up(text, rows, repeats) or stack_keeps_up(text, rows, repeats)):
        return 0
    limit = rows[-1]
    while limit < max_num_seqs:
        larger = min(2 * limit, max_num_seqs)
        if not stack_keeps_up(text, [larger], max(1, repeats // 2), margin=1.0):
            break
        limit = larger
    return limit


@torch.inference_mode()
def stack_keeps_up(text: TextModel, rows: Sequence[int], repeats: int = 5, margin: float = STACK_MARGIN) -> bool:
    """Whether a decode step of `text` (its decoder stack bound) through the stack takes at most `margin` times the
    op-by-op step's time on this machine, summed over a step at each row count in `rows`: each sequence's first
    token over a scratch KV cache, over the first layers until their weights reach PROBE_BYTES (at least one layer:
    a large model's step is timed in part, in a fraction of a second); each way `repeats` times, interleaved, the
    fastest counting."""
    stack = text.decoder_stack
    count, total = 0, 0
    for layer in stack.layers:
        if count and total >= PROBE_BYTES:
            break
        count += 1
        total += sum(w.numel() * w.element_size()
                     for w in (layer.qkvg_weight, layer.o_weight, layer.gate_up_weight, layer.down_weight))
    part = stack.first(count)
    steps = [_scratch_decode_step(text, n, count) for n in rows]
    best = fastest_seconds({
        "stack": lambda: [part(inputs, rotary, ctx) for inputs, rotary, ctx in steps],
        "op by op": lambda: [text.layers_op_by_op(inputs, rotary, ctx, count) for inputs, rotary, ctx in steps],
    }, repeats)
    return best["stack"] <= margin * best["op by op"]


def _scratch_decode_step(text: TextModel, rows: int, count: int
                         ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], ForwardContext]:
    """A decode step of `rows` sequences at their first position, each in a block of its own of a scratch cache for
    the first `count` layers: (embedded tokens, rotary, context)."""
    shape = text.decoder_stack.shape
    index = torch.arange(rows, dtype=torch.int64)
    table = index.view(rows, 1)
    view = KVGroupView(SCRATCH_BLOCK_SIZE, table, torch.zeros(rows, dtype=torch.int64), index * SCRATCH_BLOCK_SIZE)
    cache_shape = (rows, SCRATCH_BLOCK_SIZE, shape.num_kv_heads, shape.head_dim)
    ctx = ForwardContext(query_start_loc=torch.arange(rows + 1), seq_lens=torch.ones(rows, dtype=torch.int64),
                         positions=torch.zeros(rows, dtype=torch.int64), max_query_len=1,
                         kv_caches={layer.self_attn.layer_idx: (torch.zeros(cache_shape), torch.zeros(cache_shape))
                                    for layer in text.layers[:count]},
                         groups=dict.fromkeys(GROUPS, view))
    inputs = torch.randn(rows, shape.hidden_size)
    return inputs, text.rotary(ctx.positions, inputs.dtype), ctx


def projection_weights(model: nn.Module) -> Iterator[torch.Tensor]:
    """The dense weights a decode step multiplies by, fused as `fuse_for_inference` left them, in layer order."""
    for module in model.modules():
        if isinstance(module, TextAttention) and isinstance(module.qkvg_weight, torch.Tensor):
            yield from (module.qkvg_weight, module.o_proj.weight)
        elif isinstance(module, GatedMLP) and isinstance(module.gate_up_weight, torch.Tensor):
            yield from (module.gate_up_weight, module.down_proj.weight)


@dataclass
class LoadedDrafter:
    model: DFlashDrafter
    config: DrafterConfig
    weight_layout: str


def load_drafter(
    path: str | os.PathLike,
    target: ModelConfig,
    mask_token_id: Callable[[], int],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    progress: bool = True,
    load_format: str = "auto",
    seed: int = 0,
    target_model: nn.Module | None = None,
) -> LoadedDrafter:
    """Load a DFlash drafter (HF, native or GGUF layout) for `target`, strictly: a config that does not fit the
    target (hidden size, vocabulary, target layers, mask token) or weights that do not match the config are
    refused with the numbers (ConfigError / CheckpointError). `mask_token_id()` gives the target tokenizer's
    id of the released mask token, for configs that omit it. With load_format "dummy" only the config is read
    and the weights are drawn at random on the device. On the CPU, weights that would not fit in the host's memory
    beside `target_model`'s (loaded already) are refused before they load (ConfigError)."""
    if load_format not in LOAD_FORMATS:
        raise ConfigError(f"load_format={load_format!r} is not supported; use one of {list(LOAD_FORMATS)}")
    checkpoint = open_drafter_checkpoint(path, mask_token_id=mask_token_id, weights=load_format != "dummy")
    config = checkpoint.config
    # said here, once: the engine's earlier read of the config (weights=False) is silent
    if config.config_layout == CONVERTER_CONSTANTS_LAYOUT:
        logger.info("%s has no config.json: using the released drafter's hyper-parameters (converter constants)",
                    checkpoint.location)
    for warning in config.warnings:
        logger.warning("%s", warning)
    checkpoint.check_fits(target.text)
    with torch.device("meta"):
        model = DFlashDrafter(config).to(dtype)
    check_drafter_fits_in_host_memory(model, device, dtype, target=target_model)
    if checkpoint.files is None:
        model = model.to_empty(device=device)
        randomize_parameters_(model, seed, norm_neutral=1.0)  # every drafter norm is plain-scale (§10.1)
    else:
        expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        plan = plan_weights(config, checkpoint.files, expected, checkpoint.weight_layout)
        model = model.to_empty(device=device)
        fill_parameters(model, plan, checkpoint.files, progress=progress)
    model.eval().requires_grad_(False)
    _prepare_for_device(model, device)
    logger.info("loaded DFlash drafter %s (%s weights; %d layers, block %d, target layers %s) on %s as %s",
                checkpoint.location, "dummy" if checkpoint.files is None else checkpoint.weight_layout,
                config.num_hidden_layers, config.block_size, list(config.target_layer_ids), device, dtype)
    return LoadedDrafter(model=model, config=config, weight_layout=checkpoint.weight_layout)
