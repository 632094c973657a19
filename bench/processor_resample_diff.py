"""How far Glimmer's image/video preprocessing is from the reference processors, per resize backend.

The reference (transformers 5.23.0 MuseGlimmerImageProcessor / MuseGlimmerVideoProcessor) resizes with
torchvision's uint8 LANCZOS + antialias. Glimmer uses torch's own uint8 "lanczos" interpolate when torch
has it (the call torchvision makes on CPU, so it should be exact) and Pillow's LANCZOS otherwise. This
script runs both Glimmer backends and the reference on the same synthetic images and prints, per image:
the grids, and the max / mean absolute difference of `pixel_values` in uint8 levels (1 level = 2/255 in
normalised units), plus the fraction of values that differ.

Needs: transformers==5.23.0, torchvision >= 0.27 built for the installed torch, pillow, numpy.
Run from the repository root:

    PYTHONPATH=. python bench/processor_resample_diff.py [extra image files ...]

On a CPU-only torch with a CUDA torchvision wheel (as on the dev machines) pass --cpu-torchvision-shim:
it registers the two C++ op schemas torchvision's import expects, which is enough for its pure-Python
transforms. Nothing is downloaded; the images are generated.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from PIL import Image, ImageDraw


def register_torchvision_op_schemas() -> None:
    library = torch.library.Library("torchvision", "DEF")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    register_torchvision_op_schemas.library = library  # keep it alive


def synthetic_images() -> list[tuple[str, Image.Image]]:
    rng = np.random.default_rng(0)
    images = []

    def noise(height: int, width: int) -> Image.Image:
        return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))

    def gradient(height: int, width: int) -> Image.Image:
        rows, cols = np.mgrid[0:height, 0:width]
        red = cols * 255 // max(width - 1, 1)
        green = rows * 255 // max(height - 1, 1)
        return Image.fromarray(np.stack([red, green, (rows + cols) % 256], -1).astype(np.uint8))

    def smooth(height: int, width: int) -> Image.Image:
        small = rng.integers(0, 256, (max(height // 16, 2), max(width // 16, 2), 3), dtype=np.uint8)
        return Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)

    def edges(height: int, width: int) -> Image.Image:
        image = Image.new("RGB", (width, height), (250, 250, 245))
        draw = ImageDraw.Draw(image)
        for y in range(4, height, 12):
            for x in range(4, width, 9):
                if rng.random() < 0.6:
                    draw.rectangle([x, y, x + 5, y + 8], fill=(10, 10, 10))
        for x in range(0, width, 32):
            draw.line([(x, 0), (x, height)], fill=(200, 30, 30), width=1)
        return image

    def checker(height: int, width: int) -> Image.Image:
        rows, cols = np.mgrid[0:height, 0:width]
        board = (((rows // 3) + (cols // 3)) % 2 * 255).astype(np.uint8)
        return Image.fromarray(np.stack([board] * 3, -1))

    sizes = [
        (480, 640, "4:3 photo size, mild downscale"),
        (1080, 1920, "1080p, downscale both axes"),
        (3000, 4000, "12 MP, strong downscale"),
        (150, 230, "small, upscale both axes"),
        (37, 53, "tiny, upscale"),
        (600, 200, "tall 1:3"),
        (20, 4000, "very wide strip"),
        (1, 1, "single pixel"),
    ]
    for height, width, note in sizes:
        for name, make in (
            ("noise", noise),
            ("gradient", gradient),
            ("smooth", smooth),
            ("edges", edges),
            ("checker", checker),
        ):
            if height * width > 4_000_000 and name in ("edges",):
                continue
            images.append((f"{name} {width}×{height} ({note})", make(height, width)))
    return images


def levels(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    difference = (a.float() - b.float()).abs() * 127.5
    return float(difference.max()), float(difference.mean()), float((difference > 0.5).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", nargs="*", help="extra image files to include")
    parser.add_argument("--cpu-torchvision-shim", action="store_true", help="see the module docstring")
    parser.add_argument("--max-image-tokens", type=int, nargs="+", default=[4096, 64])
    args = parser.parse_args()
    if args.cpu_torchvision_shim:
        register_torchvision_op_schemas()

    try:
        import torchvision
    except ModuleNotFoundError:
        sys.exit("processor_resample_diff.py needs torchvision, which the reference processors resize with: "
                 f"pip install torchvision (>= 0.27, the build for torch {torch.__version__})")
    import transformers
    from transformers import MuseGlimmerImageProcessor, MuseGlimmerVideoProcessor

    import glimmer.multimodal.resize as glimmer_resize
    from glimmer.multimodal import DecodedVideo, MediaLimits, MediaSettings, process_image, process_video

    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, transformers {transformers.__version__}")
    print(f"torch has uint8 lanczos: {glimmer_resize.torch_has_lanczos()}")

    def with_backend(use_torch: bool, function, *function_args):
        original = glimmer_resize.torch_has_lanczos
        glimmer_resize.torch_has_lanczos = (lambda: True) if use_torch else (lambda: False)
        try:
            return function(*function_args)
        finally:
            glimmer_resize.torch_has_lanczos = original

    images = synthetic_images() + [(path, Image.open(path)) for path in args.images]
    limits = MediaLimits()
    header = f"{'image':58s} {'cap':>5s} {'grid':>12s}  {'torch max/mean/frac':>24s}  {'pillow max/mean/frac':>24s}"
    print("\nImages: |Glimmer − reference| in uint8 levels")
    print(header)
    worst = {"torch": 0.0, "pillow": 0.0}
    means = {"torch": [], "pillow": []}
    for cap in args.max_image_tokens:
        reference = MuseGlimmerImageProcessor(max_image_tokens=cap)
        settings = MediaSettings(max_image_tokens=cap)
        for name, image in images:
            started = time.perf_counter()
            expected = reference(images=[image], return_tensors="pt")
            reference_grid = tuple(expected["image_grid_thw"][0].tolist())
            cells = []
            for backend in ("torch", "pillow"):
                ours = with_backend(backend == "torch", process_image, image, settings, limits)
                if ours.grid_thw != reference_grid:
                    cells.append(f"GRID {ours.grid_thw} != {reference_grid}")
                    continue
                high, mean, fraction = levels(ours.pixel_values, expected["pixel_values"])
                worst[backend] = max(worst[backend], high)
                means[backend].append(mean)
                cells.append(f"{high:6.1f} {mean:8.4f} {fraction:7.2%}")
            elapsed = time.perf_counter() - started
            grid = str(reference_grid)
            print(f"{name[:58]:58s} {cap:5d} {grid:>12s}  {cells[0]:>24s}  {cells[1]:>24s}  ({elapsed:.2f}s)")

    print("\nVideos (decoded frame arrays with metadata; no decoder involved)")
    rng = np.random.default_rng(1)
    for frames_count, fps, height, width in ((8, 4.0, 90, 120), (61, 30.0, 360, 640), (5, 2.0, 480, 270)):
        frames = rng.integers(0, 256, (frames_count, height, width, 3), dtype=np.uint8)
        reference = MuseGlimmerVideoProcessor(max_video_frame_tokens=144, return_metadata=True)
        expected = reference(
            videos=[frames],
            video_metadata=[{"fps": fps, "total_num_frames": frames_count, "width": width, "height": height}],
            return_tensors="pt",
        )
        reference_grid = tuple(expected["video_grid_thw"][0].tolist())
        cells = []
        for backend in ("torch", "pillow"):
            ours = with_backend(backend == "torch", process_video, DecodedVideo(frames, fps), MediaSettings(), limits)
            if ours.grid_thw != reference_grid:
                cells.append(f"GRID {ours.grid_thw} != {reference_grid}")
                continue
            high, mean, fraction = levels(ours.pixel_values, expected["pixel_values_videos"])
            cells.append(f"{high:6.1f} {mean:8.4f} {fraction:7.2%}")
        clip = f"noise {frames_count} frames {width}×{height} @ {fps} fps"
        print(f"{clip:36s} grid {str(reference_grid):>12s}  torch {cells[0]}  pillow {cells[1]}")

    print("\nSummary (uint8 levels over all images and caps):")
    for backend in ("torch", "pillow"):
        if means[backend]:
            print(f"  {backend:6s}: max {worst[backend]:.1f}, mean of per-image means {np.mean(means[backend]):.4f}")
    sys.exit(0)


if __name__ == "__main__":
    main()
