"""A scheduled step's batch layout as host tensors: built once, then copied to the device in a few copies.

The eager runner copies them into fresh device tensors; CUDA-graph replay copies them into the graph's
static buffers. Either way the step costs one copy of the flat integer fields and one per KV group's
block table, from pinned memory and without waiting for the GPU.

Rows past the real batch (`padded_seqs`) are graph padding: `padding_tokens` tokens each (one for a decode
graph, 1 + k for a graph verifying k proposed tokens) at positions 0, 1, … that read and write only the
spare "null" block of each pool, which no sequence owns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from glimmer.engine.kv_cache_manager import DRAFT, KVCacheManager
from glimmer.engine.scheduler import ScheduledStep
from glimmer.model.context import ForwardContext, KVGroupView


@dataclass
class StepInputs:
    """Host copies of a step's inputs. `flat` packs, in order: input_ids (N), positions (N),
    query_start_loc (B + 1), seq_lens (B), then per group (in `groups` order) kv_start_pos (B) and
    slot_mapping (N), each padded to an even length (`_aligned`); `tables` holds each group's (B, width) block
    table."""

    num_seqs: int
    num_tokens: int
    max_query_len: int
    groups: tuple[str, ...]
    flat: torch.Tensor
    tables: dict[str, torch.Tensor]

    @staticmethod
    def field_sizes(num_seqs: int, num_tokens: int, num_groups: int) -> list[int]:
        return [num_tokens, num_tokens, num_seqs + 1, num_seqs] + [num_seqs, num_tokens] * num_groups

    @staticmethod
    def flat_size(num_seqs: int, num_tokens: int, num_groups: int) -> int:
        return sum(map(_aligned, StepInputs.field_sizes(num_seqs, num_tokens, num_groups)))

    def context(
        self,
        flat: torch.Tensor,
        tables: dict[str, torch.Tensor],
        block_size: int,
        kv_caches: dict[int, tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, ForwardContext]:
        """(input_ids, ForwardContext) over a device copy of `flat` and device block tables."""
        sizes = self.field_sizes(self.num_seqs, self.num_tokens, len(self.groups))
        fields = [field[:size] for field, size in zip(flat.split([_aligned(s) for s in sizes]), sizes, strict=True)]
        groups = {
            group: KVGroupView(block_size, tables[group], fields[4 + 2 * i], fields[5 + 2 * i])
            for i, group in enumerate(self.groups)
        }
        return fields[0], ForwardContext(
            query_start_loc=fields[2],
            seq_lens=fields[3],
            positions=fields[1],
            max_query_len=self.max_query_len,
            kv_caches=kv_caches,
            groups=groups,
        )


def target_groups(kv: KVCacheManager) -> tuple[str, ...]:
    """The KV groups of the target model's layers (the drafter's group is read by the drafter alone)."""
    return tuple(g for g in kv.pools if g != DRAFT)


def build_step_inputs(
    step: ScheduledStep, kv: KVCacheManager, null_blocks: dict[str, int], padded_seqs: int | None = None,
    padding_tokens: int = 1, ids_on_device: bool = False,
) -> StepInputs:
    """Lay out `step` (after the scheduler allocated its blocks), padded with null rows to `padded_seqs`.

    `ids_on_device`: a decode step launched before its input tokens reach the host (`lookahead.py`); its
    input ids are left 0 here and copied in on the device."""
    groups = target_groups(kv)
    bs = kv.block_size
    ids: list[int] = []
    positions: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    starts: dict[str, list[int]] = {g: [] for g in groups}
    slots: dict[str, list[int]] = {g: [] for g in groups}
    rows: dict[str, list[list[int]]] = {g: [] for g in groups}
    for seq, n in zip(step.seqs, step.num_new_tokens, strict=True):
        first = seq.num_computed_tokens
        if n == 1:  # a decode token: the same layout without the per-position loops
            ids.append(0 if ids_on_device else seq.token_at(first))
            positions.append(first)
            for group in groups:
                visible, start, slot = kv.decode_blocks(seq, group, first)
                rows[group].append(visible)
                starts[group].append(start)
                slots[group].append(slot)
        else:
            ids += seq.step_token_ids(first, first + n)
            positions.extend(range(first, first + n))
            for group in groups:
                visible, start, new_slots = kv.step_blocks(seq, group, n)
                rows[group].append(visible)
                starts[group].append(start)
                slots[group].extend(new_slots)
        query_start.append(query_start[-1] + n)
        seq_lens.append(first + n)
    padding = (padded_seqs or len(step.seqs)) - len(step.seqs)
    if padding:
        q = padding_tokens
        ids.extend([0] * (q * padding))
        positions.extend(list(range(q)) * padding)
        query_start.extend(range(query_start[-1] + q, query_start[-1] + q * padding + 1, q))
        seq_lens.extend([q] * padding)
        for group in groups:
            null = null_blocks[group]
            rows[group].extend([null] * -(-q // bs) for _ in range(padding))
            starts[group].extend([0] * padding)
            slots[group].extend([null * bs + j % bs for j in range(q)] * padding)
    flat: list[int] = []
    for field in [ids, positions, query_start, seq_lens] + [f for g in groups for f in (starts[g], slots[g])]:
        flat += field
        flat += [0] * (_aligned(len(field)) - len(field))
    tables = {}
    for group in groups:
        width = max(map(len, rows[group]))
        # columns past a row's blocks lie past its seq_len: never read in place, masked by the reference
        padding_row = [null_blocks[group]] * width
        table: list[int] = []
        for row in rows[group]:
            table += row
            table += padding_row[len(row) :]
        tables[group] = _pinned(table).view(-1, width)
    return StepInputs(
        num_seqs=len(seq_lens),
        num_tokens=len(ids),
        max_query_len=max([*step.num_new_tokens, padding_tokens if padding else 1]),
        groups=groups,
        flat=_pinned(flat),
        tables=tables,
    )


def _aligned(size: int) -> int:
    """A field's length in `flat`: rounded up to even, so every field starts 16 bytes in (int64). A kernel reading
    a field then sees the same pointer alignment at every step shape: Triton compiles a variant per alignment,
    and a mixed step whose seq_lens started 8 bytes off compiled one while every request of the batch waited."""
    return size + size % 2


def _pinned(values: list) -> torch.Tensor:
    # through numpy: several times faster than torch.tensor on a long list of ints
    tensor = torch.from_numpy(np.array(values, dtype=np.int64))
    return tensor.pin_memory() if torch.cuda.is_available() else tensor
