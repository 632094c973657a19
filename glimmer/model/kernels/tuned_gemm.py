"""Dense products of a few rows through the cuBLASLt algorithm measured fastest for their shape (CUDA, bf16/fp16).

For a decode step's few rows, the kernel cuBLAS picks by default is often not its fastest one for the shape. On
an H200 at the 30B's shapes (bf16, µs a weight, read from memory): gate|up at 32 rows 141.6 by default against
128.1 for another of cuBLASLt's candidates, at 64 rows 136.5 against 128.5; q|k|v|gate at 8 rows 35.8 against
31.2; the lm_head at 2–64 rows 650–740 against 606–644. At 256 rows the default was the fastest of all.

So, when the engine starts (`choose_products`), for each batch size it replays from a CUDA graph and each weight
shape of a decode step, cuBLAS's default (`F.linear`) is timed against the algorithms cuBLASLt's heuristic offers
for that shape, over the model's own weights of that shape (a sequence of different weights, as a step reads them
from memory, not from L2). An algorithm replaces `F.linear` for that shape only where it is at least
`MIN_GAIN` faster, returns the same bits on every call, and its error against a float32 product stays within
the rounding of `F.linear`'s own (`close_to_reference`); split-K algorithms sum their partial products in float32
(the heuristic is asked for no other reduction). Every other product stays `F.linear`.

A product faster alone is not always faster in its step: the kernels beside it change how its start and end
overlap theirs (on an H200 the 30B's choices at 128 rows, each faster alone, made the step 0.6 ms slower). So the
engine then times each batch size's whole decode step with the new choices and with `F.linear`, and where the
step is not faster it gives them up (`forgo`; engine/cuda_graphs.py).

The choices are kept in the user's cache (`$XDG_CACHE_HOME/glimmer/gemm/`, one file per GPU model, SM count,
cuBLASLt and torch version, and model geometry: a step check holds for one model's step), so a restart makes the
same choices (the same products, the same bits) without measuring again; each kept algorithm is checked with
cuBLASLt before use.

cuBLASLt is reached through ctypes, in the library torch itself has loaded: no build step, no dependency.
`GLIMMER_GEMM=cublas` keeps every product on `F.linear` (A/B timing, bisecting a numerical difference); so does
`GLIMMER_KERNELS=torch`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from glimmer.model.kernels.support import cuda_index, gemm_tuning_allowed, side_stream

logger = logging.getLogger(__name__)

MIN_GAIN = 0.03  # an algorithm must be this much faster than F.linear to replace it (timing noise is about 1%)
MAX_HEURISTIC_ALGOS = 8
# one per GPU, never freed (captured graphs keep its address), shared by every product: they all run on the
# engine's one stream, one after another
WORKSPACE_BYTES = 16 << 20
TIMED_WEIGHTS = 8  # distinct weights of a shape timed in sequence (their sum is well over an H200's 50 MB of L2)
ALIGNMENT_BYTES = 16  # the alignment every chosen algorithm is asked to accept, and each call checks
DTYPES = {torch.bfloat16: 14, torch.float16: 2}  # cudaDataType_t: CUDA_R_16BF, CUDA_R_16F
CACHE_FORMAT = 1

# cuBLASLt's enumerations (cublasLt.h, cublas_api.h, library_types.h)
_COMPUTE_32F, _SCALE_32F = 68, 0  # CUBLAS_COMPUTE_32F, CUDA_R_32F
_DESC_TRANSA, _DESC_TRANSB, _OP_N, _OP_T = 3, 4, 0, 1
_PREF_MAX_WORKSPACE_BYTES, _PREF_REDUCTION_SCHEME_MASK = 1, 3
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # of A, B, C, D
_REDUCTION_COMPUTE_TYPE = 2  # split-K partial sums in float32, in the workspace


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_bytes", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


@functools.cache
def library() -> ctypes.CDLL | None:
    """The cuBLASLt that torch loaded, with the signatures used here; None where there is none (CPU builds, ROCm,
    not Linux)."""
    if torch.version.cuda is None or not torch.cuda.is_available() or not os.path.exists("/proc/self/maps"):
        return None
    torch.cuda.current_blas_handle()  # torch's cuBLAS, and with it cuBLASLt, is loaded and initialised
    with open("/proc/self/maps") as maps:
        paths = [line.split()[-1] for line in maps if "libcublasLt.so" in line]
    if not paths:
        return None
    lib = ctypes.CDLL(paths[0])
    p, size, i, u64, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64
    signatures = {
        "cublasLtCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulDescCreate": [ctypes.POINTER(p), i, i],
        "cublasLtMatmulDescSetAttribute": [p, i, p, size],
        "cublasLtMatrixLayoutCreate": [ctypes.POINTER(p), i, u64, u64, i64],
        "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulPreferenceSetAttribute": [p, i, p, size],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i, ctypes.POINTER(_Heuristic), ctypes.POINTER(i)],
        "cublasLtMatmulAlgoCheck": [p, p, p, p, p, p, ctypes.POINTER(_Algo), ctypes.POINTER(_Heuristic)],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, ctypes.POINTER(_Algo), p, size, p],
    }
    for name, args in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, ctypes.c_int
    lib.cublasLtGetVersion.argtypes, lib.cublasLtGetVersion.restype = [], ctypes.c_size_t
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


@functools.cache
def _handle(device_index: int) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    with torch.cuda.device(device_index):
        _check(library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    return handle


@functools.cache
def _workspace(device_index: int) -> torch.Tensor:
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=torch.device("cuda", device_index))


def allocate_kept_workspaces(device: torch.device) -> None:
    """Allocate now what running products keeps allocated for good: cuBLAS's workspace for the side stream that
    warm-ups, captures and timings run on (cuBLAS keeps one per stream), and the chosen products' workspace. The
    engine calls it before it measures the free memory that sizes the KV cache, which then already lacks them."""
    device = torch.device("cuda", cuda_index(device))
    stream = side_stream(device)
    if gemm_tuning_allowed() and library() is not None:
        _workspace(device.index)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        x = torch.ones((2, 8), device=device, dtype=torch.bfloat16)
        F.linear(x, x)
    torch.cuda.current_stream(device).wait_stream(stream)


@dataclass(frozen=True)
class ProductShape:
    """y (rows, out_features) = x (rows, in_features) · Wᵀ, W (out_features, in_features) row-major."""

    rows: int
    out_features: int
    in_features: int
    dtype: torch.dtype

    @property
    def key(self) -> str:
        return f"{self.rows}x{self.out_features}x{self.in_features}:{str(self.dtype).removeprefix('torch.')}"


class Descriptors:
    """cuBLASLt's description of one ProductShape, column-major as cuBLAS sees it: yᵀ (out, rows) = W (out, in) ·
    xᵀ, with W read transposed from its row-major storage (ld = in) — the product F.linear asks cuBLAS for."""

    def __init__(self, shape: ProductShape):
        lib, data = library(), DTYPES[shape.dtype]
        self.operation = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.operation), _COMPUTE_32F, _SCALE_32F), "desc")
        for attribute, value in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            op = ctypes.c_int(value)
            _check(lib.cublasLtMatmulDescSetAttribute(self.operation, attribute, ctypes.byref(op), 4), "desc attr")
        self.weight = self._layout(data, shape.in_features, shape.out_features, shape.in_features)
        self.rows = self._layout(data, shape.in_features, shape.rows, shape.in_features)
        self.out = self._layout(data, shape.out_features, shape.rows, shape.out_features)

    @staticmethod
    def _layout(data: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _check(library().cublasLtMatrixLayoutCreate(ctypes.byref(layout), data, rows, cols, ld), "layout")
        return layout

    def heuristic_algos(self, device_index: int) -> list[_Heuristic]:
        """cuBLASLt's candidates (best guess first) that fit the workspace, accept 16-byte alignment and, where they
        split the sum, add the parts in float32."""
        lib = library()
        preference = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "preference")
        settings = [(_PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE_BYTES)),
                    (_PREF_REDUCTION_SCHEME_MASK, ctypes.c_uint32(_REDUCTION_COMPUTE_TYPE))]
        settings += [(attribute, ctypes.c_uint32(ALIGNMENT_BYTES)) for attribute in _PREF_MIN_ALIGNMENT]
        for attribute, value in settings:
            _check(lib.cublasLtMatmulPreferenceSetAttribute(preference, attribute, ctypes.byref(value),
                                                            ctypes.sizeof(value)), "preference attr")
        results = (_Heuristic * MAX_HEURISTIC_ALGOS)()
        count = ctypes.c_int()
        status = lib.cublasLtMatmulAlgoGetHeuristic(_handle(device_index), self.operation, self.weight, self.rows,
                                                    self.out, self.out, preference, MAX_HEURISTIC_ALGOS, results,
                                                    ctypes.byref(count))
        if status != 0:  # no algorithm for this shape
            return []
        return [results[i] for i in range(count.value) if results[i].state == 0]

    def accepts(self, algo: _Algo, device_index: int) -> bool:
        """Whether cuBLASLt runs `algo` on these descriptors (a kept algorithm is checked before its first use)."""
        result = _Heuristic()
        status = library().cublasLtMatmulAlgoCheck(_handle(device_index), self.operation, self.weight, self.rows,
                                                   self.out, self.out, ctypes.byref(algo), ctypes.byref(result))
        return status == 0 and result.workspace_bytes <= WORKSPACE_BYTES


class LtProduct:
    """One shape's product through one cuBLASLt algorithm: `self(x, weight)` returns x · weightᵀ."""

    def __init__(self, shape: ProductShape, descriptors: Descriptors, algo: _Algo, device_index: int):
        self.shape, self.descriptors, self.algo = shape, descriptors, algo
        self.device_index = device_index
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._handle = _handle(device_index)
        self._workspace = _workspace(device_index)

    @property
    def algo_hex(self) -> str:
        return bytes(self.algo).hex()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = torch.empty((self.shape.rows, self.shape.out_features), dtype=x.dtype, device=x.device)
        d = self.descriptors
        status = library().cublasLtMatmul(
            self._handle, d.operation, ctypes.byref(self._alpha), weight.data_ptr(), d.weight, x.data_ptr(), d.rows,
            ctypes.byref(self._beta), out.data_ptr(), d.out, out.data_ptr(), d.out, ctypes.byref(self.algo),
            self._workspace.data_ptr(), WORKSPACE_BYTES, torch.cuda.current_stream(x.device).cuda_stream)
        _check(status, f"matmul of {self.shape.key}")
        return out


# the measured choices, per (GPU, shape): a memo of measurements, filled only by `choose_products`, and the
# geometry (the model's product shapes, hashed) whose cache file holds them
_chosen: dict[tuple[int, ProductShape], LtProduct | None] = {}
_geometry: dict[int, str] = {}


def tuned_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> LtProduct | None:
    """The chosen cuBLASLt product for x · weightᵀ, or None where F.linear is the one to run (no choice measured
    for this shape, a bias, a tensor autograd tracks, or a layout the algorithm was not chosen for)."""
    if not _chosen or not x.is_cuda or bias is not None:
        return None
    in_features = weight.shape[-1]
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != in_features:
        return None
    shape = ProductShape(x.numel() // in_features if in_features else 0, weight.shape[0], in_features, x.dtype)
    product = _chosen.get((x.device.index or 0, shape))
    if product is None or weight.dtype != x.dtype or weight.device != x.device:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None
    if not (x.is_contiguous() and weight.is_contiguous()
            and x.data_ptr() % ALIGNMENT_BYTES == 0 and weight.data_ptr() % ALIGNMENT_BYTES == 0):
        return None
    return product


def tuned_linear(x: torch.Tensor, weight: torch.Tensor, product: LtProduct) -> torch.Tensor:
    """x (..., in) · weightᵀ → (..., out) through `product` (from `tuned_product` for these tensors)."""
    return product(x, weight).view(*x.shape[:-1], weight.shape[0])


# measuring ---------------------------------------------------------------------------------------------------


@dataclass
class ProductChoice:
    shape: ProductShape
    algo_hex: str | None  # None: F.linear stays
    cublas_us: float | None = None
    chosen_us: float | None = None
    measured: bool = False  # in this call (not read from the cache): the engine then checks it in a whole step


def choose_products(weights: Iterable[torch.Tensor], rows: Iterable[int], progress: bool = False
                    ) -> list[ProductChoice]:
    """For every row count of `rows` (above 1: one row runs the GEMV of linear.py) and every shape among `weights`
    (CUDA, bf16/fp16, contiguous), choose between F.linear and cuBLASLt's candidates as the module's docstring
    says, from the cache file where it holds the choice, else by measuring. Returns the choices, measured or
    read (empty where tuning is off or cuBLASLt is unavailable). Call it outside any CUDA graph capture."""
    if not gemm_tuning_allowed():
        _chosen.clear()  # an engine started with tuning off runs F.linear everywhere, whatever was chosen before
        return []
    groups: dict[tuple[int, int, int, torch.dtype], list[torch.Tensor]] = {}
    for weight in weights:
        if (weight.is_cuda and weight.dim() == 2 and weight.dtype in DTYPES and weight.is_contiguous()
                and weight.data_ptr() % ALIGNMENT_BYTES == 0):
            groups.setdefault((weight.device.index or 0, *weight.shape, weight.dtype), []).append(weight)
    counts = sorted({r for r in rows if r > 1})
    if not groups or not counts or library() is None:
        return []
    choices = []
    for device_index in sorted({key[0] for key in groups}):
        shapes = sorted((n, k, str(dtype), len(members)) for (dev, n, k, dtype), members in groups.items()
                        if dev == device_index)
        _geometry[device_index] = hashlib.sha256(repr(shapes).encode()).hexdigest()[:12]
        cache = ChoiceCache(device_index, _geometry[device_index])
        work = [(count, key, members) for count in counts for key, members in groups.items() if key[0] == device_index]
        started, measured = time.perf_counter(), 0
        for count, (_, out_features, in_features, dtype), members in tqdm(
                work, desc="Choosing GEMM algorithms", unit="shape", disable=not progress):
            shape = ProductShape(count, out_features, in_features, dtype)
            if (device_index, shape) in _chosen:
                product = _chosen[(device_index, shape)]
                choices.append(ProductChoice(shape, product.algo_hex if product else None))
                continue
            choice = cache.choice(shape)
            product = _restore(shape, choice, device_index) if choice is not None else None
            if choice is None or (choice.algo_hex is not None and product is None):
                choice, product = _measure(shape, members, device_index)
                cache.record(choice)
                measured += 1
            _chosen[(device_index, shape)] = product
            choices.append(choice)
        cache.save()
        kept = sum(_chosen[(device_index, ProductShape(count, n, k, dtype))] is not None
                   for count, (_, n, k, dtype), _ in work)
        logger.info("GEMM algorithms on GPU %d: cuBLASLt's chosen for %d of %d decode product shapes (%d measured in "
                    "%.1f s, the rest from %s)", device_index, kept, len(work), measured,
                    time.perf_counter() - started, cache.path)
    return choices


def _restore(shape: ProductShape, choice: ProductChoice, device_index: int) -> LtProduct | None:
    """A cached choice as a product, if cuBLASLt still accepts its algorithm; None for F.linear or a refused one."""
    if choice.algo_hex is None:
        return None
    try:
        raw = bytes.fromhex(choice.algo_hex)
    except ValueError:  # a damaged file: measured again
        return None
    if len(raw) != ctypes.sizeof(_Algo):
        return None
    algo = _Algo.from_buffer_copy(raw)
    descriptors = Descriptors(shape)
    if not descriptors.accepts(algo, device_index):
        logger.warning("cuBLASLt refuses the cached algorithm for %s; measuring again", shape.key)
        return None
    return LtProduct(shape, descriptors, algo, device_index)


def _measure(shape: ProductShape, weights: Sequence[torch.Tensor], device_index: int
             ) -> tuple[ProductChoice, LtProduct | None]:
    device = torch.device("cuda", device_index)
    timed = list(weights[:: max(1, len(weights) // TIMED_WEIGHTS)][:TIMED_WEIGHTS])
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.cuda.device(device), torch.inference_mode():
        x = torch.randn((shape.rows, shape.in_features), device=device, dtype=shape.dtype, generator=generator)
        cublas_us = _graph_time_us(lambda: [F.linear(x, w) for w in timed], device) / len(timed)
        exact = _float32_product(x, timed[0])
        cublas_error = (F.linear(x, timed[0]).float() - exact).abs().max().item()
        descriptors = Descriptors(shape)
        best: tuple[float, LtProduct] | None = None
        for candidate in descriptors.heuristic_algos(device_index):
            product = LtProduct(shape, descriptors, candidate.algo, device_index)
            try:
                first, second = product(x, timed[0]), product(x, timed[0])
                if not torch.equal(first, second) or not close_to_reference(first, exact, cublas_error):
                    continue
                us = _graph_time_us(lambda p=product: [p(x, w) for w in timed], device) / len(timed)
            except RuntimeError as exc:  # an algorithm cuBLASLt offered and then refused: not a candidate
                logger.debug("cuBLASLt candidate for %s failed: %s", shape.key, exc)
                continue
            if best is None or us < best[0]:
                best = (us, product)
    if best is not None and best[0] < (1 - MIN_GAIN) * cublas_us:
        return ProductChoice(shape, best[1].algo_hex, cublas_us, best[0], measured=True), best[1]
    return ProductChoice(shape, None, cublas_us, best[0] if best else None, measured=True), None


REFERENCE_CHUNK_BYTES = 128 << 20
"""The float32 copy of a weight that the exactness check's reference product holds at once: the check runs after the
KV cache took the GPU's memory, and a whole copy of the 30B's output embedding is 5.4 GB."""


def _float32_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x · weightᵀ in float32, the weight widened a slice of output features at a time (`REFERENCE_CHUNK_BYTES`)."""
    step = max(1, REFERENCE_CHUNK_BYTES // (4 * weight.shape[1]))
    wide = x.float()
    return torch.cat([wide @ part.float().T for part in weight.split(step)], dim=1)


def close_to_reference(out: torch.Tensor, exact: torch.Tensor, cublas_error: float) -> bool:
    """Whether a candidate's output is as close to the float32 product as F.linear's: its largest error within
    twice F.linear's or one rounding step (of its dtype) of the largest output, whichever is larger."""
    error = (out.float() - exact).abs().max().item()
    return error <= max(2 * cublas_error, torch.finfo(out.dtype).eps * exact.abs().max().item())


def _graph_time_us(launches: Callable[[], object], device: torch.device, replays: int = 5) -> float:
    """Median GPU time of `launches` replayed from a CUDA graph (so the host's launch cost is not timed)."""
    stream = side_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        launches()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        launches()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    del graph
    return sorted(times)[len(times) // 2]


@contextlib.contextmanager
def cublas_only(device_index: int, rows: int) -> Iterator[None]:
    """Within this block, products of `rows` rows on this GPU run F.linear (the engine times a decode step both
    ways before it keeps the choices: `forgo`)."""
    hidden = {key: product for key, product in _chosen.items() if key[0] == device_index and key[1].rows == rows}
    _chosen.update(dict.fromkeys(hidden))
    try:
        yield
    finally:
        _chosen.update(hidden)


def forgo(device_index: int, rows: int, reason: str) -> None:
    """Products of `rows` rows on this GPU run F.linear from now on, in this process and in the cache file: each
    was faster alone, but a whole decode step with them was not (the kernels around a product change its time)."""
    forgone = [key for key, product in _chosen.items()
               if key[0] == device_index and key[1].rows == rows and product is not None]
    if not forgone:
        return
    cache = ChoiceCache(device_index, _geometry.get(device_index, ""))
    for key in forgone:
        _chosen[key] = None
        cache.forgo(key[1], reason)
    cache.save()


# the choices on disk -------------------------------------------------------------------------------------------


class ChoiceCache:
    """The choices made on this kind of GPU with this cuBLASLt and torch, as JSON in the user's cache. An unreadable
    or foreign file is measured over; one that cannot be written leaves the choices in this process only."""

    def __init__(self, device_index: int, geometry: str = ""):
        """geometry: names the model's product shapes; a batch size's choices were checked in that model's step."""
        props = torch.cuda.get_device_properties(device_index)
        identity = (f"{props.name}-sm{props.major}{props.minor}-{props.multi_processor_count}sm-"
                    f"cublasLt{library().cublasLtGetVersion()}-torch{torch.__version__}-{geometry}")
        try:
            root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        except RuntimeError:  # no home directory: the temporary one
            root = Path(tempfile.gettempdir()) / f"glimmer-cache-{os.getuid()}"
        self.path = Path(root) / "glimmer" / "gemm" / (re.sub(r"[^A-Za-z0-9.+-]+", "_", identity) + ".json")
        self.entries: dict[str, dict] = {}
        self.dirty = False
        try:
            data = json.loads(self.path.read_text())
            if isinstance(data, dict) and data.get("format") == CACHE_FORMAT and isinstance(data.get("choices"), dict):
                self.entries = data["choices"]
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            logger.warning("GEMM choices: cannot read %s (%s); measuring again", self.path, exc)

    def choice(self, shape: ProductShape) -> ProductChoice | None:
        entry = self.entries.get(shape.key)
        if not isinstance(entry, dict) or not isinstance(entry.get("algo"), str | None):
            return None
        return ProductChoice(shape, entry["algo"], entry.get("cublas_us"), entry.get("chosen_us"))

    def record(self, choice: ProductChoice) -> None:
        self.entries[choice.shape.key] = {
            "algo": choice.algo_hex,
            "cublas_us": None if choice.cublas_us is None else round(choice.cublas_us, 2),
            "chosen_us": None if choice.chosen_us is None else round(choice.chosen_us, 2),
        }
        self.dirty = True

    def forgo(self, shape: ProductShape, reason: str) -> None:
        entry = self.entries.setdefault(shape.key, {})
        entry.update(algo=None, forgone=reason)
        self.dirty = True

    def save(self) -> None:
        """Written under a temporary name and renamed, so processes starting at once never read a partial file."""
        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, partial = tempfile.mkstemp(dir=self.path.parent, suffix=".partial")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"format": CACHE_FORMAT, "choices": self.entries}, f, indent=0, sort_keys=True)
                os.replace(partial, self.path)
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)
            self.dirty = False
        except OSError as exc:
            logger.warning("GEMM choices: cannot write %s (%s); they hold for this process only", self.path, exc)
