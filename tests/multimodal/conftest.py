"""Oracles lifted from the reference (transformers 5.23.0) without importing it.

The reference processors import torchvision at module level, which cannot be installed here. Their
size, sampling, patchify and placeholder functions are plain Python/torch, so the tests compile those
function definitions straight from the installed source files and call them as oracles.
"""

from __future__ import annotations
import __future__

import ast
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
VideoMetadata = pytest.importorskip("transformers.video_utils").VideoMetadata
REFERENCE_DIR = Path(transformers.__file__).parent / "models" / "muse_glimmer"


def _parse(source: str) -> ast.Module:
    """ast.parse, tried again on CPython 3.11's spurious "AST constructor recursion depth mismatch": its
    recursion-depth bookkeeping is not thread-safe, and threads left by earlier tests (servers, engines) may be
    compiling at the same moment. A real syntax problem fails every time."""
    for _ in range(2):
        try:
            return ast.parse(source)
        except SystemError:
            pass
    return ast.parse(source)


def _reference_function(file: str, name: str, owner: str | None = None, **names: object) -> Callable:
    """`file` is relative to the muse_glimmer folder; `names` are further globals the function uses."""
    tree = _parse((REFERENCE_DIR / file).read_text())
    scope = tree.body
    if owner is not None:
        scope = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == owner).body
    node = next(node for node in scope if isinstance(node, ast.FunctionDef) and node.name == name)
    node.decorator_list = []
    module = ast.Module(body=[node], type_ignores=[])
    namespace = {
        "itertools": itertools,
        "math": math,
        "torch": torch,
        "logger": SimpleNamespace(warning_once=lambda *args, **kwargs: None),
        **names,
    }
    # the annotations name classes we do not have; postponed evaluation never looks them up
    flags = __future__.annotations.compiler_flag
    exec(compile(module, f"<reference {file}:{name}>", "exec", flags=flags, dont_inherit=True), namespace)
    return namespace[name]


@pytest.fixture(scope="session")
def reference_smart_resize() -> Callable:
    return _reference_function("image_processing_muse_glimmer.py", "smart_resize")


@pytest.fixture(scope="session")
def reference_image_patchify() -> Callable:
    method = _reference_function("image_processing_muse_glimmer.py", "patchify", owner="MuseGlimmerImageProcessor")
    return lambda images, patch_size, temporal_patch_size: method(None, images, patch_size, temporal_patch_size)


@pytest.fixture(scope="session")
def reference_video_patchify() -> Callable:
    method = _reference_function("video_processing_muse_glimmer.py", "patchify", owner="MuseGlimmerVideoProcessor")
    return lambda videos, patch_size, temporal_patch_size: method(None, videos, patch_size, temporal_patch_size)


@pytest.fixture(scope="session")
def reference_sample_frames() -> Callable:
    method = _reference_function("video_processing_muse_glimmer.py", "sample_frames", owner="MuseGlimmerVideoProcessor")

    def sample(total_frames: int, video_fps: float | None, fps: float, num_frames: int, temporal: int) -> list[int]:
        metadata = SimpleNamespace(total_num_frames=total_frames, fps=video_fps)
        return method(None, metadata, temporal_patch_size=temporal, num_frames=num_frames, fps=fps).tolist()

    return sample


def _torchvision_to_dtype(image: torch.Tensor, dtype: torch.dtype, scale: bool = False) -> torch.Tensor:
    """torchvision's `transforms.v2.functional.to_dtype` with scale=True between uint8 and float32, the two uses
    the reference's `convert_to_rgb` makes of it: levels × 1/255 one way, × (255 + 1 − 1e-3) truncated the other."""
    assert scale and {image.dtype, dtype} == {torch.uint8, torch.float32}
    if dtype == torch.float32:
        return image.to(dtype).mul_(1.0 / 255)
    return image.mul(float(255) + 1.0 - 1e-3).to(dtype)


@pytest.fixture(scope="session")
def reference_array_to_rgb() -> Callable:
    """The reference image processor's conversion of an (H, W, C) uint8 array (not a PIL image) to RGB:
    `TorchvisionBackend.convert_to_rgb`, which composites RGBA onto white."""
    from transformers.image_utils import ChannelDimension

    method = _reference_function(
        "../../image_processing_backends.py", "convert_to_rgb", owner="TorchvisionBackend",
        ChannelDimension=ChannelDimension,
        tvF=SimpleNamespace(grayscale_to_rgb=lambda image: image, to_dtype=_torchvision_to_dtype),
    )

    def convert(array):
        channels_first = torch.from_numpy(array.copy()).permute(2, 0, 1)
        return method(None, channels_first, ChannelDimension.FIRST).permute(1, 2, 0).numpy()

    return convert


@pytest.fixture(scope="session")
def reference_processor() -> SimpleNamespace:
    """The reference MuseGlimmerProcessor's replace_image_token / replace_video_token on a stand-in `self`."""
    replace_image = _reference_function(
        "processing_muse_glimmer.py", "replace_image_token", owner="MuseGlimmerProcessor"
    )
    replace_video = _reference_function(
        "processing_muse_glimmer.py", "replace_video_token", owner="MuseGlimmerProcessor"
    )
    this = SimpleNamespace(
        image_token="<|patch|>",
        image_start_token="<|image_start|>",
        image_end_token="<|image_end|>",
        video_token="<|video|>",
        video_sep_token="<|vid_frame_separator|>",
        video_start_token="<|vid_start|>",
        video_end_token="<|vid_end|>",
        image_processor=SimpleNamespace(merge_size=2),
        video_processor=SimpleNamespace(
            merge_size=2, temporal_patch_size=2, frame_timestamp_format="Time: {timestamp:.1f}s"
        ),
    )

    def image(grid_thw: list[int]) -> str:
        return replace_image(this, {"image_grid_thw": torch.tensor([grid_thw])}, 0)

    def video(grid_thw: list[int], frame_indices: list[int], fps: float) -> str:
        # the reference's own metadata: its timestamps divide the indices, a long tensor as its sample_frames returns
        # them, by fps in torch's float32
        metadata = VideoMetadata(total_num_frames=frame_indices[-1] + 1, fps=fps,
                                 frames_indices=torch.tensor(frame_indices, dtype=torch.long))
        return replace_video(this, {"video_grid_thw": torch.tensor([grid_thw]), "video_metadata": [metadata]}, 0)

    return SimpleNamespace(image=image, video=video)


def write_video(
    path: Path,
    frames,
    *,
    fps: int = 4,
    codec: str = "ffv1",
    container: str = "matroska",
    times_ms: list[int] | None = None,
    rotation: int | None = None,
) -> Path:
    """Encode (T, H, W, 3) uint8 frames with PyAV. ffv1/bgr0 in Matroska is lossless, so decoding gives the
    frames back exactly; `times_ms` sets explicit presentation timestamps (variable frame rate); `rotation` writes a
    display matrix turning the frames that many degrees counter-clockwise for display, as a phone's portrait video
    carries one."""
    import fractions

    import av

    with av.open(str(path), "w", format=container) as output:
        stream = output.add_stream(codec, rate=fps)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "bgr0" if codec == "ffv1" else "yuv420p"
        if rotation is not None:
            stream.set_display_rotation(rotation)
        if times_ms is not None:
            stream.codec_context.time_base = fractions.Fraction(1, 1000)
        for index, array in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(array, format="rgb24")
            if times_ms is not None:
                frame.pts = times_ms[index]
                frame.time_base = fractions.Fraction(1, 1000)
            for packet in stream.encode(frame):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return path


@pytest.fixture(scope="session")
def video_writer() -> Callable[..., Path]:
    return write_video
