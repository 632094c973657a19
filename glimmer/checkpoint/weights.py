"""Strict weight loading: plan every canonical parameter's source, check all of it, then fill the model.

The model is built on the meta device, so nothing is allocated until the plan has been checked; then
it is materialized on the target device and filled one source tensor at a time from memory-mapped
shards, keeping peak host memory near one tensor above the model itself.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from glimmer.checkpoint.config import DrafterConfig, ModelConfig
from glimmer.checkpoint.mapped_tensors import MappedTensors, non_finite_counts
from glimmer.checkpoint.safetensors_files import SafetensorsCheckpoint
from glimmer.checkpoint.weight_layouts import (
    SourceSlice,
    interleaved_to_rotate_half,
    locate,
)
from glimmer.checkpoint.weight_mismatch import MismatchAdvice, WeightMismatch
from glimmer.errors import CheckpointError

logger = logging.getLogger(__name__)

_FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}
_TIED_LM_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class WeightPlan:
    layout: str
    slices: dict[str, SourceSlice]
    unexpected: tuple[str, ...]


def expected_parameters(model: nn.Module, config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name → shape of every tensor the checkpoint must provide."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if config.text.tie_word_embeddings:
        expected.pop(_TIED_LM_HEAD, None)
    return expected


def untie_if_lm_head_stored(config: ModelConfig, files: SafetensorsCheckpoint, layout: str) -> ModelConfig:
    """A tied config whose checkpoint also stores an `lm_head`: transformers 5.23 loads that tensor and leaves the
    head untied (the tie only fills a head the checkpoint lacks), so Glimmer uses the stored head too."""
    if not config.text.tie_word_embeddings:
        return config
    head = locate(layout, _TIED_LM_HEAD, config)
    embedding = locate(layout, "model.language_model.embed_tokens.weight", config)
    if head is None or head.source not in files.tensors or (embedding and head.source == embedding.source):
        return config
    warning = (f"tie_word_embeddings is true but the checkpoint stores {head.source}; using it as an untied "
               "lm_head, as transformers does")
    logger.warning(warning)
    return dataclasses.replace(config, text=dataclasses.replace(config.text, tie_word_embeddings=False),
                               warnings=(*config.warnings, warning))


def drop_vision_if_absent(config: ModelConfig, files: SafetensorsCheckpoint, layout: str) -> ModelConfig:
    """A checkpoint whose config describes a vision tower but that ships no vision tensors is text-only."""
    if config.vision is None:
        return config
    probe = locate(layout, "model.vision_projection.weight", config)
    vision_sources = {probe.source} if probe else set()
    present = [n for n in files.names() if n in vision_sources or n.startswith(("vision_", "model.vision_"))]
    if present:
        return config
    warning = "config.json describes a vision tower but the checkpoint has no vision weights; loading text-only"
    logger.warning(warning)
    return dataclasses.replace(
        config,
        vision=None,
        image_token_id=None,
        video_token_id=None,
        out_hidden_size=None,
        projector_hidden_size=None,
        projector_hidden_act=None,
        warnings=(*config.warnings, warning),
    )


def plan_weights(
    config: ModelConfig | DrafterConfig, files: SafetensorsCheckpoint, expected: dict[str, tuple[int, ...]],
    layout: str,
) -> WeightPlan:
    """Map every expected parameter to its source; raise one error listing every problem found."""
    missing: list[str] = []
    unmapped: list[str] = []
    slices: dict[str, SourceSlice] = {}
    for target in expected:
        where = locate(layout, target, config)
        if where is None:
            unmapped.append(target)
        elif where.source not in files.tensors:
            missing.append(f"{where.source} (for {target}, shape {_expected_source_shape(where, expected[target])})")
        else:
            slices[target] = where

    by_source: dict[str, list[str]] = defaultdict(list)
    for target, where in slices.items():
        by_source[where.source].append(target)
    mismatched: list[str] = []
    unsupported: list[str] = []
    for source, targets in by_source.items():
        info = files.tensors[source]
        if info.dtype not in _FLOAT_DTYPES:
            unsupported.append(f"{source}: dtype {info.dtype}")
            continue
        want = _source_shape(source, targets, slices, expected)
        if want != info.shape:
            mismatched.append(f"{source}: expected shape {list(want)}, found {list(info.shape)}")

    unexpected = tuple(sorted(set(files.names()) - set(by_source)))
    found = WeightMismatch(unmapped, missing, [f"{n} {list(files.tensors[n].shape)}" for n in unexpected], mismatched,
                           unsupported)
    if found:
        raise CheckpointError(found.message(
            f"the weights in {files.directory} ({layout} layout) do not match the config", _safetensors_advice(layout)))
    return WeightPlan(layout=layout, slices=slices, unexpected=unexpected)


def _safetensors_advice(layout: str) -> MismatchAdvice:
    return MismatchAdvice(
        unmapped_title=f"parameters with no source in the {layout} layout",
        unsupported_title=(f"unsupported dtypes (Glimmer loads {', '.join(sorted(_FLOAT_DTYPES))}; quantized int8/fp8 "
                           "weights are not supported, use the unquantized checkpoint)"),
        other_model_fix=("the tensor names are another model's or another export layout's than the config describes; "
                         "load the weights with the config.json published beside them, or convert them to the "
                         "canonical Hugging Face export"),
        other_size_fix=("the config describes another size of model (hidden size, heads, vocabulary) than the weights "
                        "hold; load the weights with the config.json published beside them"),
        incomplete_fix=("the checkpoint is incomplete (a shard left out or a download cut short): download it again "
                        "with every shard its index names; or the config describes more (layers, a vision tower) "
                        "than these weights hold"),
        extra_fix=("the weights hold tensors the configured model does not have (another model's, or a larger "
                   "variant's); load them with the config.json published beside them"),
        unsupported_fix="load the unquantized checkpoint (BF16, F16 or F32 weights)",
        unmapped_fix="convert the weights to the canonical Hugging Face export, which names every parameter",
    )


def _expected_source_shape(where: SourceSlice, target_shape: tuple[int, ...]) -> list[int] | str:
    if where.rows is None:
        return list(target_shape)
    return f"rows {where.rows[0]}:{where.rows[1]} of a fused tensor"


def _source_shape(
    source: str, targets: list[str], slices: dict[str, SourceSlice], expected: dict[str, tuple[int, ...]]
) -> tuple[int, ...]:
    """The shape a source must have to hold all of its targets (fused sources stack them along dim 0)."""
    first = expected[targets[0]]
    if slices[targets[0]].rows is None:
        return first
    return (max(slices[t].rows[1] for t in targets), *first[1:])


def fill_parameters(
    model: nn.Module, plan: WeightPlan, files: SafetensorsCheckpoint, *, progress: bool = True
) -> None:
    """Copy every planned source into the (already materialized) model parameters, then refuse any that holds a
    NaN or an infinity: a damaged checkpoint, or values past the load dtype's range (float16), would otherwise
    load quietly and answer wrong. One device sync for the whole check."""
    params = dict(model.state_dict(keep_vars=True))
    by_source: dict[str, list[str]] = defaultdict(list)
    for target, where in plan.slices.items():
        by_source[where.source].append(target)
    order = sorted(by_source, key=lambda s: (str(files.tensors[s].file), s))
    total = sum(_numel(files.tensors[s].shape) for s in order)
    finite: dict[str, torch.Tensor] = {}
    with torch.no_grad(), tqdm(total=total, unit="param", unit_scale=True, desc="Loading weights",
                               disable=not progress) as bar:
        for source in order:
            # a tensor the reader computes (a dequantized NVFP4 weight) is computed where its parameter lives
            tensor = files.read(source, params[by_source[source][0]].device)
            for target in by_source[source]:
                where = plan.slices[target]
                part = tensor if where.rows is None else tensor[where.rows[0] : where.rows[1]]
                if where.rope_heads is not None:
                    part = interleaved_to_rotate_half(part, where.rope_heads)
                params[target].copy_(part)
                finite[target] = _all_finite(params[target])
            bar.update(tensor.numel())
            del tensor
    flags = torch.stack(list(finite.values())).tolist() if finite else []
    if not all(flags):
        raise _non_finite_error([t for t, ok in zip(finite, flags, strict=True) if not ok], params, plan, files)


def _all_finite(tensor: torch.Tensor, chunk: int = 1 << 26) -> torch.Tensor:
    """A 0-d bool tensor on the tensor's device (no sync); checked in chunks, so the check's own memory stays at
    `chunk` bytes beside a large weight (the 30B's lm_head would need 1.3 GB at once)."""
    flat = tensor.detach().reshape(-1)
    return torch.stack([torch.isfinite(part).all() for part in flat.split(chunk)]).all()


def _non_finite_error(targets: list[str], params: dict[str, torch.Tensor], plan: WeightPlan,
                      files: SafetensorsCheckpoint) -> CheckpointError:
    """Why these parameters are not finite: the checkpoint's own values, or the cast to the load dtype."""
    target, source = targets[0], plan.slices[targets[0]].source
    dtype = params[target].dtype
    info = files.tensors[source]
    renamed = f", stored as {info.stored_name!r}" if info.stored_name not in (None, source) else ""
    where = f"parameter {target} (checkpoint tensor {source!r}{renamed} in {info.file})"
    others = ""
    if len(targets) > 1:
        others = f" (so do {len(targets) - 1} more: {', '.join(targets[1:4])}{', …' if len(targets) > 4 else ''})"
    stored = files.read(source)
    if bool(torch.isfinite(stored).all()):
        largest = stored.abs().max().item()
        fitting = [name for name, wider in (("bfloat16", torch.bfloat16), ("float32", torch.float32))
                   if wider != dtype and torch.finfo(wider).max >= largest]
        fix = (f"load with dtype {' or '.join(fitting)}" if fitting else
               "no dtype Glimmer computes in holds them: the checkpoint is damaged")
        return CheckpointError(
            f"{where} has values up to {largest:.4g}, past the largest {dtype} ({torch.finfo(dtype).max:.4g}): "
            f"as {dtype} they would be infinite{others}; {fix}")
    # a tensor computed from several stored ones (a quantized weight): the one whose NaN it inherited, by its own name
    part = files.trace_non_finite(source) if isinstance(files, MappedTensors) else None
    computed = f", computed from {part}" if part is not None else ""
    return CheckpointError(
        f"{where} holds {non_finite_counts(stored)}{others}{computed}; the checkpoint is damaged: download or convert "
        "it again")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
