"""The exponential noise of the sampler's draws (`sampler.draw`), one row per sequence, each from its own generator.

torch fills a row with `noise[j].exponential_(generator=g)`: one launch per row, 15 µs of host time each, so 4 ms
a step at 256 rows, longer than the rest of sampling. On a GPU, one Triton kernel writes every row with the bits
torch's `exponential_` writes: its CUDA kernel draws Philox4x32-10 words keyed by the generator's seed at its
offset, in a grid-stride order fixed by the tensor's size and the GPU's resident threads, and turns each word into
-log(u). The kernel reads each generator's (seed, offset) on the host and advances the offset by what torch's call
would; the draws that follow are unchanged. It is checked against torch once per GPU (`exponential_exact`: every
float value a word can take through the transform, and whole rows at several sizes, seeds and offsets, with the
offsets they leave); where anything differs, or a generator is not a CUDA one, the rows run torch's calls.
"""

from __future__ import annotations

import logging

import torch

from glimmer.model.kernels.support import use_triton

logger = logging.getLogger(__name__)

BLOCK = 1024
TORCH_BLOCK = 256  # threads per block of torch's random kernels (DistributionTemplates.h)
_exact: dict[int, bool] = {}


def torch_launch(width: int, device_index: int) -> tuple[int, int]:
    """(threads, offset increment) of torch's CUDA `exponential_` on `width` contiguous float32 elements: blocks of
    256 threads, at most as many as the GPU keeps resident; each thread draws four words per lap of the grid, and
    the generator's offset advances by four per lap."""
    props = torch.cuda.get_device_properties(device_index)
    resident = props.multi_processor_count * (props.max_threads_per_multi_processor // TORCH_BLOCK)
    threads = min(resident, -(-width // TORCH_BLOCK)) * TORCH_BLOCK
    return threads, ((width - 1) // (threads * 4) + 1) * 4


def exponential_rows_(noise: torch.Tensor, generators: list[torch.Generator | None]) -> bool:
    """Fill row j of `noise` (rows, width), float32 on a GPU, as `noise[j].exponential_(generator=generators[j])`
    for j in order would, and advance the generators as those calls would (a generator may recur: each row
    takes the offset the rows before it left). False, with nothing done, where the kernel cannot stand in: a
    generator that is None or of another device, an offset torch's own calls would not leave (not a multiple of
    4), a tensor that is not contiguous float32, or the kernel not found exact on this GPU."""
    if not (noise.dim() == 2 and noise.dtype == torch.float32 and noise.is_contiguous() and use_triton(noise)):
        return False
    index = noise.device.index if noise.device.index is not None else torch.cuda.current_device()
    if any(g is None or g.device.type != "cuda" or (g.device.index or 0) != index for g in generators):
        return False
    if not noise.numel() or not exponential_exact(index):
        return not noise.numel()
    threads, increment = torch_launch(noise.shape[1], index)
    seeds, offsets, after = [], [], {}
    for generator in generators:
        offset = after.get(id(generator), None)
        if offset is None:
            offset = generator.get_offset()
        if offset % 4:
            return False
        seeds.append(generator.initial_seed())
        offsets.append(offset)
        after[id(generator)] = offset + increment
    _launch(noise, seeds, offsets, threads)
    for generator in generators:
        if id(generator) in after:
            generator.set_offset(after.pop(id(generator)))
    return True


def _launch(noise: torch.Tensor, seeds: list[int], offsets: list[int], threads: int) -> None:
    from glimmer.model.kernels.jit import exponential as impl

    as_signed = [s - (1 << 64) if s >= 1 << 63 else s for s in seeds]  # the seed's 64 bits, as int64
    seed_tensor = torch.tensor(as_signed, dtype=torch.int64).to(noise.device, non_blocking=True)
    offset_tensor = torch.tensor(offsets, dtype=torch.int64).to(noise.device, non_blocking=True)
    rows, width = noise.shape
    impl.exponential_rows[(rows, -(-width // BLOCK))](noise, seed_tensor, offset_tensor, width, threads, BLOCK=BLOCK)


def every_word_value(device: torch.device, chunk: int = 1 << 22):
    """Every float32 value a 32-bit word rounds to, in chunks of at most `chunk`: the integers below 2^24, for each
    exponent 24–31 its multiples of 2^(e - 23), and 2^32 (84 million values, 16 MB a chunk)."""
    spans = [(0, 1 << 24, 1), *((1 << e, 1 << (e + 1), 1 << (e - 23)) for e in range(24, 32)),
             (1 << 32, 1 + (1 << 32), 1)]
    for start, stop, step in spans:
        for first in range(start, stop, step * chunk):
            yield torch.arange(first, min(stop, first + step * chunk), step, device=device,
                               dtype=torch.int64).to(torch.float32)


def exponential_exact(device_index: int) -> bool:
    """Whether the kernel writes torch's bits on this GPU: the transform of every value a word can take, and whole
    rows at several widths (one lap of the grid and several), seeds and offsets, each leaving torch's offset.
    Measured once, then remembered; a kernel that fails to compile or run counts as inexact (a warning says why)."""
    if device_index in _exact:
        return _exact[device_index]
    device = torch.device("cuda", device_index)
    try:
        from glimmer.model.kernels.jit import exponential as impl

        wrong = 0
        guard = torch.tensor(-5.960464477539063e-08, device=device)
        for words in every_word_value(device):
            u = words * 2.3283064365386963e-10 + 1.1641532182693481e-10
            want = -torch.where(u >= 0.9999999403953552, guard, torch.log(u))
            got = torch.empty_like(words)
            impl.exponential_of_words[(-(-words.numel() // BLOCK),)](words, got, words.numel(), BLOCK=BLOCK)
            wrong += int((got.view(torch.int32) != want.view(torch.int32)).sum())
        threads_cap = torch_launch(1 << 40, device_index)[0]
        for width in (1, 1000, 202_048, threads_cap * 4 + 17):
            for seed, offset in ((0, 0), (12345, 8), ((1 << 64) - 3, 4 * 10**9 + 4)):
                reference = torch.Generator(device).manual_seed(seed)
                reference.set_offset(offset)
                want = torch.empty(width, device=device).exponential_(generator=reference)
                ours = torch.Generator(device).manual_seed(seed)
                ours.set_offset(offset)
                got = torch.empty(1, width, device=device)
                if not exponential_rows_unchecked(got, ours):
                    wrong += width
                wrong += int((got[0].view(torch.int32) != want.view(torch.int32)).sum())
                wrong += int(ours.get_offset() != reference.get_offset())
        torch.cuda.synchronize(device)
    except Exception as exc:  # Triton's or the driver's refusal, whichever form it takes
        logger.warning("the sampler's noise kernel does not run on this GPU (%s: %s); draws keep torch's calls",
                       type(exc).__name__, exc)
        _exact[device_index] = False
        return False
    _exact[device_index] = wrong == 0
    if wrong:
        logger.warning("the sampler's noise kernel differs from torch's exponential_ in %d places on this GPU; draws "
                       "keep torch's calls (one launch per row)", wrong)
    return _exact[device_index]


def exponential_rows_unchecked(noise: torch.Tensor, generator: torch.Generator) -> bool:
    """One row of `noise` (1, width) from `generator`, by the kernel without the probe (the probe's own use)."""
    threads, increment = torch_launch(noise.shape[1], noise.device.index or 0)
    offset = generator.get_offset()
    if offset % 4:
        return False
    _launch(noise, [generator.initial_seed()], [offset], threads)
    generator.set_offset(offset + increment)
    return True
