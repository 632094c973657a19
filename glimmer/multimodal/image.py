"""Images → patch rows for the vision tower — architecture.md §6.

Accepted inputs: encoded bytes or a file path in one of `IMAGE_FORMATS`, a PIL image, or an array (H, W),
(H, W, 1), (H, W, 3) or (H, W, 4) of uint8 levels or of floats in [0, 1]. Pillow is asked for those formats only,
and of them only for those the installed Pillow has a reader for (`_readable_formats`: AVIF's came with Pillow 11.2):
it can read others, but some hand the data to another program (PostScript to Ghostscript), which a request's bytes
must never reach.

Float pixels (an array, or a PIL image of mode "F") are an image already rescaled to [0, 1], as torchvision's
`ToTensor` leaves it and as transformers' `to_pil_image` reads floats in [0, 1]: they become levels × 255, rounded
to the nearest (transformers truncates, which from float16 loses a level on about half the values; rounding gives
back exactly the levels an image divided by 255 came from). Floats outside [0, 1], or NaN, are refused: cast to
uint8 they would be another picture (a 0..1 image cast so is black).

Conversion to RGB follows the reference image processor given a PIL image: transparency is composited
onto white, grey is replicated. (transformers' loading of a URL or path instead drops alpha: `load_image` with
`convert("RGB")`, and the torchvision backend's `load_image_as_tensor` with torchcodec's RGB mode, which also
scales 16-bit PNG samples by rounding where Pillow keeps their top byte; white matches the processor itself and
what other engines do.) An RGBA array is composited onto white as the reference composites an array, in float32
(`_array_onto_white`), not with Pillow. Encoded files are turned upright by their EXIF orientation, as
`load_image` and torchcodec do (Pillow also reads an orientation given only in XMP, which torchcodec ignores).
Animated images use their first frame.
"""

from __future__ import annotations

import io
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Union

import numpy as np
import torch
from PIL import ExifTags, Image, ImageOps

from glimmer.multimodal.errors import MediaDecodeError, MediaLimitError
from glimmer.multimodal.patches import patch_rows
from glimmer.multimodal.resize import resize_frames, smart_resize
from glimmer.multimodal.settings import MediaLimits, MediaSettings

# Pillow's names of the ordinary raster formats it may open (its JPEG reader opens phones' MPO files too)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF", "ICO", "AVIF", "JPEG2000", "QOI", "PPM", "TGA")

_FORMAT_NAMES = {"WEBP": "WebP", "JPEG2000": "JPEG 2000"}  # as the error names them; the others as Pillow does


def _readable_formats() -> tuple[str, ...]:
    """The `IMAGE_FORMATS` this Pillow has a reader for: AVIF's came with Pillow 11.2 (Glimmer takes 10.0 on), and
    `Image.open` given a format name it has no reader for raises KeyError for any data that no earlier format
    took."""
    Image.init()
    return tuple(name for name in IMAGE_FORMATS if name in Image.OPEN)


ImageInput = Union[bytes, bytearray, memoryview, str, os.PathLike, Image.Image, np.ndarray]  # noqa: UP007

_pillow_threshold_lock = threading.Lock()


def _let_pillow_open(max_image_pixels: int) -> None:
    """Make Pillow's own decompression-bomb error (a size above 2 × `Image.MAX_IMAGE_PIXELS`, a process-wide
    setting with no per-call form) fire only above twice `max_image_pixels`, so that Glimmer's limit, checked on
    the header before decoding, decides.

    Pillow's check stays as the backstop for sizes read inside a file before Glimmer can see them (a WebP canvas
    allocated while opening, an ICO entry's embedded PNG, a GIF frame wider than its screen). The threshold is
    only ever raised, never lowered or restored, so no thread sees it lower than its own limit needs; None
    (Pillow's check switched off by the program) is left as it is."""
    with _pillow_threshold_lock:
        if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_image_pixels:
            Image.MAX_IMAGE_PIXELS = max_image_pixels


@dataclass(frozen=True)
class ProcessedImage:
    pixel_values: torch.Tensor  # (grid_h·grid_w, T·3·p·p) float32 in [−1, 1]
    grid_thw: tuple[int, int, int]  # (1, grid_h, grid_w) in patches
    num_tokens: int  # `<|patch|>` placeholders: grid_h·grid_w / merge²


def image_grid(height: int, width: int, settings: MediaSettings) -> tuple[int, int, int]:
    """The (1, grid_h, grid_w) patch grid an image of this size gets, without touching pixels."""
    target_height, target_width = smart_resize(height, width, settings.resize_factor, settings.max_image_tokens)
    return 1, target_height // settings.patch_size, target_width // settings.patch_size


def image_token_count(height: int, width: int, settings: MediaSettings) -> int:
    """`<|patch|>` tokens for an image of this size, without processing it."""
    _, grid_h, grid_w = image_grid(height, width, settings)
    return grid_h * grid_w // settings.merge_size**2


def image_tokens_from_header(image: ImageInput, settings: MediaSettings, limits: MediaLimits) -> int | None:
    """The `<|patch|>` tokens `process_image` would give, from the size in the file's header (no pixel decoded);
    None where the header cannot be read or the size is beyond `limits` (processing would refuse it)."""
    if isinstance(image, np.ndarray):
        height, width = image.shape[:2] if image.ndim >= 2 else (0, 0)
    elif isinstance(image, Image.Image):
        height, width = image.height, image.width
    elif isinstance(image, bytes | bytearray | memoryview | str | os.PathLike):
        source = image if isinstance(image, str | os.PathLike) else io.BytesIO(bytes(image))
        _let_pillow_open(limits.max_image_pixels)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(source, formats=_readable_formats()) as opened:
                    # orientations 5-8 turn the image a quarter, as `ImageOps.exif_transpose` does in decoding;
                    # the base class's getexif reads what the header holds, where PNG's decodes every pixel first
                    # to look for EXIF after them
                    exif = Image.Image.getexif(opened)
                    quarter_turn = exif.get(ExifTags.Base.Orientation) in (5, 6, 7, 8)
                    # newer Pillow's TIFF reader gives the upright size already (its tags hold the stored one)
                    tags = getattr(opened, "tag_v2", None)
                    if tags is not None and opened.size != (tags.get(256), tags.get(257)):
                        quarter_turn = False
                    height, width = (opened.width, opened.height) if quarter_turn else (opened.height, opened.width)
        except (OSError, SyntaxError, ValueError, EOFError, RuntimeError, Image.DecompressionBombError):
            return None
    else:
        return None
    try:
        limits.check_frame_size("image", 0, width, height)
    except (MediaDecodeError, MediaLimitError):
        return None
    return image_token_count(height, width, settings)


def _open_encoded(source: bytes | str | os.PathLike, index: int, limits: MediaLimits) -> Image.Image:
    """Open and fully decode an encoded image, upright per EXIF; every failure becomes MediaDecodeError."""
    _let_pillow_open(limits.max_image_pixels)
    try:
        with warnings.catch_warnings():
            # we enforce our own pixel limit below, before decoding; Pillow's bomb error only past twice it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source,
                               formats=_readable_formats())
            limits.check_frame_size("image", index, image.width, image.height)  # the header's size: nothing decoded
            image.load()
            return ImageOps.exif_transpose(image)
    except (MediaLimitError, MediaDecodeError):
        raise
    except Image.DecompressionBombError:  # a size past twice our limit (`_let_pillow_open`), inside the file
        raise MediaLimitError("image", index, f"the image is larger than the limit of {limits.max_image_pixels:,} "
                                              "pixels (--max-image-pixels); downscale the image before sending it"
                              ) from None
    except FileNotFoundError:
        raise MediaDecodeError("image", index, f"no such file: {os.fspath(source)!r}") from None
    except Image.UnidentifiedImageError:
        names = ", ".join(_FORMAT_NAMES.get(name, name) for name in _readable_formats())
        raise MediaDecodeError("image", index, f"the data is not an image format Glimmer reads ({names})") from None
    except (OSError, SyntaxError, ValueError, EOFError, RuntimeError) as error:
        # Pillow reports truncated or corrupt data as OSError, some broken headers as SyntaxError, and its AVIF
        # plugin (libavif) any failure to decode as RuntimeError
        raise MediaDecodeError("image", index, f"the image data is corrupt or truncated ({error})") from None


def is_image_data(data: bytes | str | os.PathLike) -> bool:
    """Whether Pillow recognizes `data` (bytes, or a file's path) as an image from its header (nothing is decoded)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            Image.open(io.BytesIO(data) if isinstance(data, bytes) else data, formats=_readable_formats()).close()
    except Image.DecompressionBombError:
        return True  # an image, if a far too large one: the size limits will say so
    except Exception:  # Pillow raises many kinds for data that is not an image
        return False
    return True


def starts_with_image_signature(prefix: bytes) -> bool:
    """Whether `prefix`, a file's first bytes (16 are enough), opens as one of the readable formats does: Pillow's
    own check of each format's magic number (the `accept` it registers), which `Image.open` asks before reading
    on. TGA has no signature, so its bytes never match."""
    return any(accept and accept(prefix[:16]) for accept in (Image.OPEN[name][1] for name in _readable_formats()))


def pil_to_rgb(image: Image.Image, kind: str, index: int) -> np.ndarray:
    """(H, W, 3) uint8 RGB; transparency is composited onto white as the reference processor does. A 16-bit grey image
    (a 16-bit PNG opens so) is scaled to 8 bits: Pillow's `convert` clips it, every pixel above 255 turning white
    (pixels of its tRNS transparent value are white). A float image (mode "F") is read as floats in [0, 1]
    (`_unit_floats_to_levels`), which Pillow's `convert` would cast to black. Raises MediaDecodeError naming `kind`
    `index` for floats outside [0, 1] or NaN, and for pixels that cannot be decoded or converted: `Image.open`
    decodes nothing, so a lazily opened file's corrupt data fails here, as `_open_encoded` reports it."""
    try:
        return _pil_to_rgb(image, kind, index)
    except MediaDecodeError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError, RuntimeError) as error:
        raise MediaDecodeError(kind, index, f"cannot convert the image to RGB ({error})") from None


def _pil_to_rgb(image: Image.Image, kind: str, index: int) -> np.ndarray:
    if image.mode == "F":
        grey = _unit_floats_to_levels(np.asarray(image), kind, index, "a float (mode F) PIL image",
                                     "divide its values by 255, or convert one of 0..255 levels with "
                                     "image.convert(\"L\") first")
        return np.repeat(grey[:, :, None], 3, axis=2)
    if image.mode.startswith("I;16") or (image.mode == "I" and np.asarray(image).max(initial=0) > 255):
        values = np.asarray(image).astype(np.int64)
        grey = (values.clip(0, 65535) >> 8).astype(np.uint8)
        key = image.info.get("transparency")
        if isinstance(key, int) and not isinstance(key, bool):  # a 16-bit grey PNG's tRNS: the transparent value
            grey[values == key] = 255  # composited onto white, as the reference composites it
        return np.repeat(grey[:, :, None], 3, axis=2)
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return _rgb_array(Image.alpha_composite(white, rgba).convert("RGB"))
    return _rgb_array(image if image.mode == "RGB" else image.convert("RGB"))


_BAND_BYTES = 1 << 20  # Pillow's pixels copied into the array this many at a time


def _rgb_array(image: Image.Image) -> np.ndarray:
    """The (H, W, 3) uint8 array of an RGB image, copied a band of rows at a time. `np.asarray(image)` goes through
    `tobytes`, which holds the pixels twice more (its chunks and their join) beside Pillow's own copy (4 bytes a
    pixel), and `convert("RGB")` of an RGB image copies it once more: a 10,000 × 10,000 PNG peaked 1.3 GiB over the
    process's memory before, 0.75 GiB now (Pillow's 0.37 GiB and the array's 0.28 GiB). The pixels are the same."""
    array = np.empty((image.height, image.width, 3), dtype=np.uint8)
    band_rows = max(1, _BAND_BYTES // (4 * max(image.width, 1)))
    for top in range(0, image.height, band_rows):
        bottom = min(top + band_rows, image.height)
        array[top:bottom] = np.asarray(image.crop((0, top, image.width, bottom)))
    return array


def _unit_floats_to_levels(values: np.ndarray, kind: str, index: int, what: str, levels_fix: str) -> np.ndarray:
    """Float pixels in [0, 1] → uint8 levels (× 255, rounded to the nearest; module docstring). Raises
    MediaDecodeError naming `kind` `index` and `what` the input is, for NaN or a value outside [0, 1], with the fix
    that fits its values (`_range_fix`; `levels_fix` for 0..255 levels)."""
    if values.size == 0:
        return values.astype(np.uint8)  # the caller's size checks say what is wrong with it
    if np.isnan(values).any():
        raise MediaDecodeError(kind, index, f"{what} holds NaN, which is no pixel value; check how the image was "
                                            "computed (np.nan_to_num replaces NaN)")
    low, high = values.min(), values.max()
    if not (0 <= low and high <= 1):
        shown = f"from {low!s} to {high!s}"  # str() of a numpy float is as exact as its dtype: 1.0000001, not 1
        raise MediaDecodeError(kind, index, f"{what} must hold values in [0, 1] (an image rescaled by 1/255), but "
                                            f"it holds values {shown}; {_range_fix(low, high, levels_fix)}")
    scaled = values.astype(np.promote_types(values.dtype, np.float32), copy=False) * 255
    return np.rint(scaled, out=scaled).astype(np.uint8)


HALF_LEVEL = 1 / 510
"""Floats this far outside [0, 1] round to level 0 or 255 all the same: the rounding error of arithmetic on an image
in [0, 1] (a colour conversion, a resize), which clipping removes without changing a pixel."""


def _range_fix(low: float, high: float, levels_fix: str) -> str:
    """The fix for float pixels from `low` to `high`, not all in [0, 1]: clipping for an overshoot under half a level;
    `levels_fix` for values reaching far past 1 from 0 (0..255 levels: an image of levels whose brightest pixel is 2
    is black); else bringing them into [0, 1], whose way the values alone do not tell."""
    if -HALF_LEVEL <= low and high <= 1 + HALF_LEVEL:
        return ("they stray from [0, 1] by less than half a level (1/510), rounding error of arithmetic on an image "
                "in [0, 1]: clip them (np.clip(values, 0, 1))")
    if -0.5 <= low and 2 < high <= 255.5:
        return f"they look like 0..255 levels: {levels_fix}"
    return ("bring them into [0, 1]: clip an overshoot of arithmetic on an image in [0, 1] (np.clip(values, 0, 1)), "
            "undo a normalization (by mean and std, or to [-1, 1]), or rescale other levels (16-bit ones by 1/65535)")


def _integer_levels_fix(dtype: np.dtype) -> str:
    """How to pass pixels of another integer (or bool) dtype as uint8 levels; casting them blindly would wrap
    16-bit levels around 256 or make a mask's true pixels level 1, nearly black."""
    if dtype == np.uint16:
        return "pass 16-bit levels as (array >> 8).astype(np.uint8), or as floats array / 65535"
    if dtype == np.bool_:
        return "pass a mask as array.astype(np.uint8) * 255"
    return "convert 0..255 levels with array.astype(np.uint8), or rescale other levels into floats in [0, 1]"


def array_to_rgb(array: np.ndarray, kind: str, index: int, what: str) -> np.ndarray:
    """An (H, W), (H, W, 1), (H, W, 3) or (H, W, 4) array of uint8 levels or floats in [0, 1] → (H, W, 3) uint8 RGB:
    floats scaled to levels (module docstring), grey replicated, transparency composited onto white. `what` names the
    array in errors ("an image array", "a video frame array"); MediaDecodeError names `kind` `index`."""
    if array.dtype.kind == "f":
        array = _unit_floats_to_levels(array, kind, index, f"{what} of {array.dtype}",
                                      "divide its values by 255, or pass 0..255 levels as uint8 "
                                      "(array.astype(np.uint8))")
    elif array.dtype != np.uint8:
        raise MediaDecodeError(kind, index, f"{what} must be uint8, or float in [0, 1]; got {array.dtype}: "
                                            f"{_integer_levels_fix(array.dtype)}")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim == 2:
        return np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim == 3 and array.shape[2] == 3:
        return array
    if array.ndim == 3 and array.shape[2] == 4:
        return _array_onto_white(array)
    raise MediaDecodeError(
        kind, index, f"{what} must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4); got {array.shape}"
    )


def _array_onto_white(rgba: np.ndarray) -> np.ndarray:
    """(H, W, 4) uint8 → (H, W, 3) uint8, transparency composited onto white as the reference's image processor
    composites an array or tensor (`TorchvisionBackend.convert_to_rgb`): in float32 at levels × 1/255, and back by
    torchvision's `to_dtype`, × (255 + 1 − 1e-3) truncated. Pillow's `alpha_composite`, which it uses for a PIL image,
    rounds instead: a level apart on about a third of the half-transparent pixels."""
    values = torch.tensor(rgba, dtype=torch.float32).mul_(1.0 / 255)
    colour, alpha = values[..., :3], values[..., 3:]
    return (colour * alpha + (1 - alpha)).mul_(255.0 + 1.0 - 1e-3).to(torch.uint8).numpy()


def load_rgb(image: ImageInput, index: int, limits: MediaLimits) -> np.ndarray:
    """Decode any accepted input into an (H, W, 3) uint8 RGB array.

    Raises MediaDecodeError for unreadable or unsupported input, MediaLimitError for too many pixels.
    """
    if isinstance(image, bytearray | memoryview):
        image = bytes(image)
    if isinstance(image, bytes | str | os.PathLike):
        image = _open_encoded(image, index, limits)
    if isinstance(image, Image.Image):
        limits.check_frame_size("image", index, image.width, image.height)
        return pil_to_rgb(image, "image", index)
    if isinstance(image, np.ndarray):
        if image.ndim >= 2:
            limits.check_frame_size("image", index, image.shape[1], image.shape[0])
        return array_to_rgb(image, "image", index, "an image array")
    # a tensor's layout is not known here: torch keeps images (C, H, W), arrays here are (H, W, C)
    tensor_fix = (" (for a torch tensor: tensor.numpy() of an (H, W, C) tensor, tensor.permute(1, 2, 0).numpy() "
                  "of a (C, H, W) one)") if isinstance(image, torch.Tensor) else ""
    raise MediaDecodeError(
        "image",
        index,
        f"unsupported image input of type {type(image).__name__}; send encoded bytes, a path, "
        f"a PIL image, or an array of uint8 levels or of floats in [0, 1]{tensor_fix}",
    )


def as_frame_tensor(frames: np.ndarray) -> torch.Tensor:
    """(F, H, W, 3) uint8 array → (F, 3, H, W) uint8 tensor sharing memory where it can (channels-last strides)."""
    frames = np.ascontiguousarray(frames)
    if not frames.flags.writeable:  # Pillow's and callers' read-only buffers; torch wants writable memory
        frames = frames.copy()
    return torch.from_numpy(frames).permute(0, 3, 1, 2)


def process_image(image: ImageInput, settings: MediaSettings, limits: MediaLimits, index: int = 0) -> ProcessedImage:
    """Decode, resize (aspect-preserving, multiples of 28 px), normalise and patchify one image.

    `index` is the image's position in the request, used in error messages.
    """
    rgb = load_rgb(image, index, limits)
    height, width = rgb.shape[:2]
    target_height, target_width = smart_resize(height, width, settings.resize_factor, settings.max_image_tokens)
    frames = as_frame_tensor(rgb[None])
    rows, grid = patch_rows(resize_frames(frames, target_height, target_width), settings)
    return ProcessedImage(pixel_values=rows, grid_thw=grid, num_tokens=grid[1] * grid[2] // settings.merge_size**2)
