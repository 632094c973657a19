"""Image → patch rows — architecture.md §6, pitfalls 14.18–14.19."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import glimmer.multimodal.resize as resize_module
from glimmer.errors import RequestError
from glimmer.multimodal import (
    MediaDecodeError,
    MediaLimitError,
    MediaLimits,
    MediaSettings,
    process_image,
)

SETTINGS = MediaSettings()
LIMITS = MediaLimits()
PATCH = 14
ROW = 2 * 3 * PATCH * PATCH  # 1176


def noise_image(height: int, width: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    array = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(array[:, :, 0] if mode == "L" else array)


def reference_pipeline(rgb: np.ndarray, max_tokens: int, reference_smart_resize, reference_image_patchify):
    """The reference's steps: smart_resize, torchvision's CPU uint8 LANCZOS (which is this very
    F.interpolate call, see glimmer/multimodal/resize.py), fused rescale+normalise, patchify."""
    image = torch.from_numpy(rgb.copy()).permute(2, 0, 1)[None]
    height, width = image.shape[-2:]
    target = reference_smart_resize(height, width, 28, max_tokens)
    if target != (height, width):
        image = F.interpolate(image, size=target, mode="lanczos", antialias=True, align_corners=False)
    mean = torch.tensor([0.5, 0.5, 0.5]) * (1.0 / (1 / 255))
    std = torch.tensor([0.5, 0.5, 0.5]) * (1.0 / (1 / 255))
    normalised = (image.float() - mean.view(-1, 1, 1)) / std.view(-1, 1, 1)
    patches, grid_h, grid_w = reference_image_patchify(normalised, PATCH, 2)
    return patches[0], (1, grid_h, grid_w)


@pytest.mark.parametrize(
    ("height", "width", "max_tokens"),
    [(480, 640, 4096), (150, 230, 64), (37, 53, 4096), (1, 1, 4096), (300, 5, 4096), (20, 4000, 4096), (56, 84, 4096)],
)
def test_pixel_values_equal_the_reference_pipeline(
    height, width, max_tokens, reference_smart_resize, reference_image_patchify
) -> None:
    image = noise_image(height, width, seed=height + width)
    result = process_image(image, MediaSettings(max_image_tokens=max_tokens), LIMITS)
    expected, grid = reference_pipeline(np.asarray(image), max_tokens, reference_smart_resize, reference_image_patchify)
    assert result.grid_thw == grid
    assert result.num_tokens == grid[1] * grid[2] // 4
    assert result.pixel_values.dtype == torch.float32
    assert torch.equal(result.pixel_values, expected)


def test_coco_sized_image_gives_391_tokens() -> None:
    result = process_image(noise_image(480, 640), SETTINGS, LIMITS)
    assert result.grid_thw == (1, 34, 46)
    assert result.num_tokens == 391
    assert result.pixel_values.shape == (34 * 46, ROW)


def test_patch_rows_are_raster_order_and_flattened_t_c_py_px() -> None:
    """Pixels encode their coordinates (R = row, G = column, B = 7); a 56×84 image is not resized."""
    height, width = 56, 84
    rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    array = np.stack([rows, cols, np.full_like(rows, 7)], axis=-1).astype(np.uint8)
    result = process_image(array, SETTINGS, LIMITS)
    assert result.grid_thw == (1, 4, 6)
    values = torch.round(result.pixel_values * 127.5 + 127.5).to(torch.int64)  # back to 0…255
    patches = values.view(4 * 6, 2, 3, PATCH, PATCH)  # (row, t, c, py, px)
    for grid_row in range(4):
        for grid_col in range(6):
            patch = patches[grid_row * 6 + grid_col]
            expected_rows = torch.arange(PATCH)[:, None].expand(PATCH, PATCH) + grid_row * PATCH
            expected_cols = torch.arange(PATCH)[None, :].expand(PATCH, PATCH) + grid_col * PATCH
            for t in range(2):  # the image is duplicated across the temporal patch
                assert torch.equal(patch[t, 0], expected_rows)
                assert torch.equal(patch[t, 1], expected_cols)
                assert torch.all(patch[t, 2] == 7)


def test_normalisation_maps_0_to_minus_1_and_255_to_1() -> None:
    array = np.zeros((28, 56, 3), dtype=np.uint8)
    array[:, 28:] = 255
    values = process_image(array, SETTINGS, LIMITS).pixel_values
    assert values.shape == (2 * 4, ROW)
    assert values.min() == -1.0 and values.max() == 1.0
    noisy = process_image(noise_image(300, 200), SETTINGS, LIMITS).pixel_values
    assert noisy.min() >= -1.0 and noisy.max() <= 1.0


def test_both_temporal_halves_of_an_image_row_are_equal() -> None:
    values = process_image(noise_image(100, 90), SETTINGS, LIMITS).pixel_values
    assert torch.equal(values[:, : ROW // 2], values[:, ROW // 2 :])


def test_transparency_is_composited_onto_white() -> None:
    array = np.zeros((28, 28, 4), dtype=np.uint8)  # fully transparent black
    values = process_image(Image.fromarray(array), SETTINGS, LIMITS).pixel_values
    assert torch.all(values == 1.0)


def test_an_rgba_array_is_composited_as_the_reference_composites_arrays(
    reference_array_to_rgb, reference_smart_resize, reference_image_patchify
) -> None:
    """QA: an RGBA array went through Pillow's alpha_composite, which rounds where the reference's float32 composite
    of an array truncates: pixel values a level apart on a third of the half-transparent pixels."""
    levels, alphas = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8), indexing="ij")
    rgba = np.stack([levels, levels[::-1], levels, alphas], axis=-1)  # every level under every alpha, 256×256
    result = process_image(rgba, MediaSettings(max_image_tokens=100), LIMITS)
    rgb = reference_array_to_rgb(rgba)
    expected, _ = reference_pipeline(rgb, 100, reference_smart_resize, reference_image_patchify)
    assert torch.equal(result.pixel_values, expected)


def test_greyscale_is_replicated_to_rgb() -> None:
    image = noise_image(28, 28, mode="L")
    values = process_image(image, SETTINGS, LIMITS).pixel_values.view(-1, 2, 3, PATCH, PATCH)
    assert torch.equal(values[:, :, 0], values[:, :, 1]) and torch.equal(values[:, :, 0], values[:, :, 2])


def test_encoded_bytes_equal_the_decoded_image() -> None:
    image = noise_image(90, 120)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    from_bytes = process_image(buffer.getvalue(), SETTINGS, LIMITS)
    assert torch.equal(from_bytes.pixel_values, process_image(image, SETTINGS, LIMITS).pixel_values)


def test_exif_orientation_is_applied_to_encoded_images(tmp_path) -> None:
    image = noise_image(56, 112)  # 112 wide, 56 high
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to view
    path = tmp_path / "rotated.jpg"
    image.save(path, format="JPEG", exif=exif)
    assert process_image(path, SETTINGS, LIMITS).grid_thw == (1, 8, 4)  # upright: 56 wide, 112 high
    assert process_image(str(path), SETTINGS, LIMITS).grid_thw == (1, 8, 4)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
@pytest.mark.parametrize("orientation", [1, 6, 8])
def test_tokens_from_the_header_of_a_turned_image_are_those_it_gets(fmt, orientation) -> None:
    """The header's count (what the media-token limit's error adds up for later images) is process_image's, a quarter
    turn included; a TIFF's was turned twice, Pillow's reader giving its size upright already."""
    from glimmer.multimodal.image import image_tokens_from_header

    exif = Image.Exif()
    exif[0x0112] = orientation
    encoded = io.BytesIO()
    noise_image(40, 300).save(encoded, format=fmt, exif=exif if fmt == "TIFF" else exif.tobytes())
    settings = MediaSettings(max_image_tokens=64)
    expected = process_image(encoded.getvalue(), settings, LIMITS).num_tokens
    assert image_tokens_from_header(encoded.getvalue(), settings, LIMITS) == expected


def test_tokens_from_a_png_header_decode_no_pixels(monkeypatch) -> None:
    """Pillow's PNG getexif decodes the whole image to look for EXIF after the pixels; counting from the header must
    not (it runs on images a request may never get to process, before their size is checked)."""
    from PIL import ImageFile

    from glimmer.multimodal.image import image_tokens_from_header

    encoded = io.BytesIO()
    noise_image(56, 112).save(encoded, format="PNG")  # no EXIF: Pillow's PNG getexif looks past the pixels
    expected = process_image(encoded.getvalue(), SETTINGS, LIMITS).num_tokens
    decoded = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self.size))
    assert image_tokens_from_header(encoded.getvalue(), SETTINGS, LIMITS) == expected
    assert decoded == []


def test_pillow_fallback_stays_close_to_torch_lanczos(monkeypatch) -> None:
    image = noise_image(300, 410, seed=3)
    exact = process_image(image, SETTINGS, LIMITS).pixel_values
    monkeypatch.setattr(resize_module, "torch_has_lanczos", lambda: False)
    fallback = process_image(image, SETTINGS, LIMITS).pixel_values
    levels = (fallback - exact).abs() * 127.5
    assert levels.max() <= 3  # 410×300 → 420×308 grows both axes: Pillow and torch agree within a few levels
    assert levels.mean() < 0.1


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        pytest.param(b"definitely not an image", "not an image format", id="garbage-bytes"),
        pytest.param(b"", "not an image format", id="empty-bytes"),
        pytest.param("MISSING", "no such file", id="missing-file"),
        pytest.param(np.zeros((10, 10, 3), dtype=np.int64), "must be uint8, or float in [0, 1]; got int64: convert "
                     "0..255 levels with array.astype(np.uint8)", id="int64-array"),
        pytest.param(np.zeros((10, 10, 3), dtype=np.uint16), "got uint16: pass 16-bit levels as (array >> 8)"
                     ".astype(np.uint8), or as floats array / 65535", id="uint16-array"),
        pytest.param(np.zeros((10, 10), dtype=bool), "got bool: pass a mask as array.astype(np.uint8) * 255",
                     id="bool-array"),
        pytest.param(np.full((10, 10, 3), 255.0, dtype=np.float32), "must hold values in [0, 1]", id="float-levels"),
        pytest.param(np.zeros((10, 10, 2), dtype=np.uint8), "must be (H, W)", id="two-channel-array"),
        pytest.param(np.zeros((0, 10, 3), dtype=np.uint8), "empty", id="empty-array"),
        pytest.param(12345, "unsupported image input of type int", id="wrong-type"),
    ],
)
def test_unusable_input_raises_a_decode_error_naming_the_item(payload, problem, tmp_path) -> None:
    if isinstance(payload, str) and payload == "MISSING":
        payload = tmp_path / "missing.png"
    with pytest.raises(MediaDecodeError) as raised:
        process_image(payload, SETTINGS, LIMITS, index=3)
    assert str(raised.value).startswith("image 3: ")
    assert problem in str(raised.value)
    assert isinstance(raised.value, RequestError)
    assert raised.value.param == "messages"


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_a_float_image_in_0_1_gives_the_pixels_of_its_uint8_levels(dtype) -> None:
    """QA: a float image cast to uint8 unscaled turned black. Floats in [0, 1] (torchvision's ToTensor, an image
    divided by 255) are levels × 255, rounded: exactly the levels they came from, in every float dtype."""
    levels = np.asarray(noise_image(45, 61, seed=5))
    expected = process_image(levels, SETTINGS, LIMITS).pixel_values
    floats = levels.astype(dtype) / dtype(255)
    assert torch.equal(process_image(floats, SETTINGS, LIMITS).pixel_values, expected)
    grey = levels[:, :, 0]
    assert torch.equal(process_image(Image.fromarray(grey.astype(np.float32) / 255), SETTINGS, LIMITS).pixel_values,
                       process_image(Image.fromarray(grey), SETTINGS, LIMITS).pixel_values)  # a mode F PIL image


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        pytest.param(np.full((8, 8, 3), 200.0), "an image array of float64 must hold values in [0, 1] (an image "
                     "rescaled by 1/255), but it holds values from 200.0 to 200.0; they look like 0..255 levels: "
                     "divide its values by 255, or pass 0..255 levels as uint8 (array.astype(np.uint8))",
                     id="levels-as-floats"),
        pytest.param(np.full((8, 8), -0.25, dtype=np.float32), "holds values from -0.25 to -0.25; bring them into "
                     "[0, 1]: clip an overshoot", id="negative"),
        pytest.param(np.array([[0.5, np.inf]] * 8, dtype=np.float32), "holds values from 0.5 to inf; bring them",
                     id="infinite"),
        pytest.param(np.array([[0.5, np.nan]] * 8, dtype=np.float32), "an image array of float32 holds NaN, which is "
                     "no pixel value", id="nan"),
        pytest.param(Image.fromarray(np.full((8, 8), 128.0, dtype=np.float32)), "a float (mode F) PIL image must "
                     "hold values in [0, 1]", id="pil-mode-f-levels"),
        pytest.param(torch.rand(3, 8, 8), "unsupported image input of type Tensor; send encoded bytes, a path, a PIL "
                     "image, or an array of uint8 levels or of floats in [0, 1] (for a torch tensor: tensor.numpy() of "
                     "an (H, W, C) tensor, tensor.permute(1, 2, 0).numpy() of a (C, H, W) one)", id="torch-tensor"),
    ],
)
def test_a_float_image_outside_0_1_is_refused_naming_the_image_and_the_fix(payload, problem) -> None:
    with pytest.raises(MediaDecodeError) as raised:
        process_image(payload, SETTINGS, LIMITS, index=2)
    assert str(raised.value).startswith("image 2: ") and problem in str(raised.value)


@pytest.mark.parametrize(("low", "high", "shown"), [(0.0, 1.0000001, "from 0.0 to 1.0000001"),
                                                    (-1e-9, 1.0, "from -1e-09 to 1.0")])
def test_a_float_image_straying_from_0_1_by_rounding_error_is_told_to_clip_not_to_divide_by_255(low, high, shown):
    """QA: "holds values from 1e-09 to 1; divide its values by 255": `%g` hid the overshoot, and dividing by 255 would
    have made the image black. The values are shown as exactly as the array holds them, and the fix is clipping."""
    values = np.full((8, 8), 0.5, dtype=np.float32)
    values[0, 0], values[0, 1] = low, high
    with pytest.raises(MediaDecodeError) as raised:
        process_image(values, SETTINGS, LIMITS)
    assert f"holds values {shown}; they stray from [0, 1] by less than half a level (1/510)" in str(raised.value)
    assert str(raised.value).endswith("clip them (np.clip(values, 0, 1))") and "divide" not in str(raised.value)
    clipped = process_image(np.clip(values, 0, 1), SETTINGS, LIMITS)
    assert torch.equal(clipped.pixel_values, process_image(np.rint(np.clip(values, 0, 1) * 255).astype(np.uint8),
                                                           SETTINGS, LIMITS).pixel_values)


def test_truncated_png_raises_a_decode_error() -> None:
    buffer = io.BytesIO()
    noise_image(64, 64).save(buffer, format="PNG")
    with pytest.raises(MediaDecodeError, match="image 0: the image data is corrupt or truncated"):
        process_image(buffer.getvalue()[:200], SETTINGS, LIMITS)


def test_a_corrupt_avif_raises_a_decode_error_and_its_header_counts_no_tokens() -> None:
    """Pillow's AVIF plugin reports a broken file as RuntimeError, which reached the server as a 500."""
    from glimmer.multimodal.image import image_tokens_from_header

    buffer = io.BytesIO()
    noise_image(40, 30).save(buffer, format="AVIF")
    corrupt = buffer.getvalue().replace(b"pitm", b"xxxx", 1)  # no primary item: libavif finds no image
    with pytest.raises(MediaDecodeError, match="image 0: the image data is corrupt or truncated"):
        process_image(corrupt, SETTINGS, LIMITS)
    assert image_tokens_from_header(corrupt, SETTINGS, LIMITS) is None


def test_a_pil_image_whose_lazy_decoding_fails_raises_a_decode_error() -> None:
    """Image.open decodes nothing: a truncated AVIF opened so fails in our conversion with Pillow's SyntaxError,
    which escaped `LLM.generate` as it is."""
    buffer = io.BytesIO()
    noise_image(40, 60).save(buffer, format="AVIF")
    opened = Image.open(io.BytesIO(buffer.getvalue()[: len(buffer.getvalue()) * 9 // 10]))
    with pytest.raises(MediaDecodeError, match="image 2: cannot convert the image to RGB .*Truncated data"):
        process_image(opened, SETTINGS, LIMITS, index=2)


def test_too_many_pixels_raises_a_limit_error_before_decoding() -> None:
    buffer = io.BytesIO()
    noise_image(100, 100).save(buffer, format="PNG")
    limits = MediaLimits(max_image_pixels=9_999)
    for payload in (buffer.getvalue(), noise_image(100, 100), np.zeros((100, 100, 3), dtype=np.uint8)):
        with pytest.raises(MediaLimitError, match=r"image 1: 100×100 = 10,000 pixels exceeds the limit of 9,999"):
            process_image(payload, SETTINGS, limits, index=1)


def bmp_claiming(width: int, height: int) -> bytes:
    """A 1×1 BMP whose header claims width × height pixels."""
    encoded = io.BytesIO()
    Image.new("RGB", (1, 1)).save(encoded, format="BMP")
    data = bytearray(encoded.getvalue())
    struct.pack_into("<ii", data, 18, width, height)  # BITMAPINFOHEADER's biWidth, biHeight
    return bytes(data)


def test_an_image_past_pillows_bomb_threshold_is_refused_naming_glimmers_limit() -> None:
    """16384 × 16384 is within --max-image-side but past Pillow's own threshold (2 × 89,478,485 pixels): the error
    names the limit the operator set, not Pillow's."""
    with pytest.raises(MediaLimitError) as raised:
        process_image(bmp_claiming(16_384, 16_384), SETTINGS, LIMITS, index=2)
    assert str(raised.value) == ("image 2: the image is larger than the limit of 100,000,000 pixels "
                                 "(--max-image-pixels); downscale the image before sending it")


def test_a_pixel_limit_above_pillows_bomb_threshold_is_honoured(monkeypatch) -> None:
    from PIL import ImageFile

    from glimmer.multimodal.image import image_tokens_from_header

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after the test
    limits = MediaLimits(max_image_pixels=300_000_000)
    bmp = bmp_claiming(16_384, 16_384)  # 268,435,456 pixels
    assert image_tokens_from_header(bmp, SETTINGS, limits) == SETTINGS.max_image_tokens
    decoded = []

    def load(self):
        decoded.append(self.size)
        raise OSError("stopped before decoding")

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    with pytest.raises(MediaDecodeError, match="stopped before decoding"):
        process_image(bmp, SETTINGS, limits)
    assert decoded == [(16_384, 16_384)]  # Glimmer's limit let it through to decoding
    with pytest.raises(MediaLimitError, match="301,465,600 pixels exceeds the limit of 300,000,000"):
        process_image(bmp_claiming(16_384, 18_400), SETTINGS, MediaLimits(max_image_pixels=300_000_000,
                                                                          max_image_side=20_000))
    assert decoded == [(16_384, 16_384)]


def test_a_16_bit_grey_png_is_scaled_to_8_bits_not_clipped_to_white():
    """Pillow opens a 16-bit grey PNG as mode I;16 and its convert("RGB") clips every value above 255 to white."""
    from glimmer.multimodal.image import pil_to_rgb

    deep = (np.arange(32 * 32).reshape(32, 32) * 64).astype(np.uint16)
    encoded = io.BytesIO()
    Image.fromarray(deep).save(encoded, "PNG")
    opened = Image.open(io.BytesIO(encoded.getvalue()))
    assert opened.mode.startswith("I;16")
    rgb = pil_to_rgb(opened, "image", 0)
    assert rgb.shape == (32, 32, 3) and np.array_equal(rgb[:, :, 0], (deep >> 8).astype(np.uint8))
    assert np.array_equal(rgb[:, :, 0], rgb[:, :, 2])
    small = Image.fromarray(np.full((4, 4), 200, dtype=np.int32))  # mode I holding 8-bit values: kept
    assert pil_to_rgb(small, "image", 0)[0, 0].tolist() == [200, 200, 200]


def test_a_16_bit_grey_png_s_transparent_value_is_composited_onto_white_as_the_reference_composites_it():
    """Its tRNS names one 16-bit grey value transparent; those pixels were scaled to their grey like the others."""
    from transformers.image_transforms import convert_to_rgb

    from glimmer.multimodal.image import load_rgb

    deep = (np.arange(8 * 8).reshape(8, 8) * 1000).astype(np.uint16)
    encoded = io.BytesIO()
    Image.fromarray(deep).save(encoded, "PNG", transparency=int(deep[2, 3]))
    opened = Image.open(io.BytesIO(encoded.getvalue()))
    assert opened.mode.startswith("I;16") and opened.info["transparency"] == deep[2, 3]
    rgb = load_rgb(encoded.getvalue(), 0, LIMITS)
    transparent = deep == deep[2, 3]
    assert np.array_equal(rgb[transparent], convert_to_rgb(opened, return_numpy=True)[transparent])
    assert np.array_equal(rgb[~transparent][:, 0], (deep[~transparent] >> 8).astype(np.uint8))


def test_a_pillow_without_an_avif_reader_refuses_data_naming_only_the_formats_it_reads(monkeypatch) -> None:
    """QA: Pillow before 11.2 (Glimmer takes 10.0 on) has no AVIF reader, and Image.open given the name "AVIF"
    raised KeyError('AVIF') for any data no earlier format took (a 500), and the refusal named AVIF as read."""
    from glimmer.multimodal.image import image_tokens_from_header

    Image.init()
    monkeypatch.delitem(Image.OPEN, "AVIF")
    with pytest.raises(MediaDecodeError) as raised:
        process_image(b"this is no image at all", SETTINGS, LIMITS)
    assert str(raised.value) == ("image 0: the data is not an image format Glimmer reads (PNG, JPEG, WebP, GIF, BMP, "
                                 "TIFF, ICO, JPEG 2000, QOI, PPM, TGA)")
    assert image_tokens_from_header(b"this is no image at all", SETTINGS, LIMITS) is None
    png = io.BytesIO()
    noise_image(28, 28).save(png, format="PNG")
    assert process_image(png.getvalue(), SETTINGS, LIMITS).grid_thw == (1, 2, 2)


def test_postscript_is_refused_without_reaching_ghostscript(monkeypatch) -> None:
    """Pillow reads EPS by running Ghostscript on it; a request's bytes must never reach another program."""
    from PIL import EpsImagePlugin

    ran = []
    monkeypatch.setattr(EpsImagePlugin, "has_ghostscript", lambda: True)
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", lambda *args, **kwargs: ran.append(args))
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nnewpath 0 0 moveto 10 10 lineto stroke\n%%EOF\n"
    with pytest.raises(MediaDecodeError, match="image 0: the data is not an image format Glimmer reads"):
        process_image(eps, SETTINGS, LIMITS)
    assert ran == []


@pytest.mark.parametrize("format_name", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "ICO", "AVIF", "JPEG2000",
                                         "QOI", "PPM", "TGA"])
def test_ordinary_image_formats_are_read(format_name) -> None:
    encoded = io.BytesIO()
    noise_image(48, 48).save(encoded, format=format_name)
    assert process_image(encoded.getvalue(), SETTINGS, LIMITS).grid_thw == (1, 2, 2)


@pytest.mark.parametrize("mode", ["RGB", "L", "P", "CMYK", "RGBA"])
def test_an_image_becomes_its_rgb_array_holding_the_pixels_about_once_more(mode) -> None:
    """np.asarray(image) went through tobytes, which held the pixels twice beside Pillow's own copy, and convert("RGB")
    copied an RGB image once more: a 10,000 × 10,000 image peaked 1.3 GiB over its decoded size. The array is copied
    from Pillow's band by band now, the pixels those of np.asarray(image.convert("RGB")), onto white where
    transparent, and writable (no copy for torch)."""
    import tracemalloc

    from glimmer.multimodal.image import pil_to_rgb

    levels = np.random.default_rng(3).integers(0, 256, (1500, 2001, 4), dtype=np.uint8)
    image = Image.fromarray(levels, "RGBA").convert(mode)
    if mode == "RGBA":
        image.putpixel((0, 0), (9, 9, 9, 0))  # transparent: white
        expected = np.asarray(Image.alpha_composite(Image.new("RGBA", image.size, "white"), image).convert("RGB"))
        assert expected[0, 0].tolist() == [255, 255, 255]
    else:
        expected = np.asarray(image.convert("RGB"))
    tracemalloc.start()
    try:
        rgb = pil_to_rgb(image, "image", 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(rgb, expected) and rgb.flags.writeable
    extra = 4 * 1500 * 2001 if mode == "RGBA" else 0  # the composite onto white is a Pillow image of its own
    assert peak < 1.5 * rgb.nbytes + extra
