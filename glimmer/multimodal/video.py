"""Videos → patch rows and per-group timestamps — architecture.md §7.

Decoding uses PyAV (`av` on PyPI), whose wheels bundle their own FFmpeg. The reference decodes with
torchcodec, which links against a system FFmpeg that must match the torch build; that makes it hard to
install reproducibly, so we do not use it. Both decode through FFmpeg, but the YUV→RGB conversion can
differ slightly between them (PyAV's swscale `rgb24` path versus torchcodec's own).

What we do, and where it departs from the reference:

* Stream: of several video streams, the one FFmpeg's `av_find_best_stream` picks, as torchcodec does (a track
  flagged default, one of several frames), not a thumbnail or cover picture track before it.
* Frame count: one demux pass counts the stream's packets, as torchcodec's exact mode does (leaving out
  those an edit list discards); the container header's count (`stream.frames`, used by transformers' PyAV
  reader) can be missing or wrong. The packets left out (empty or discarded) are bounded as frames are, and the
  other streams' (audio, subtitles, data) are demuxed and dropped in Python, bounded and cancellable (`_video_packets`).
* Frame rate: as torchcodec's exact mode measures it, the frames over the span their packets cover (the first's
  pts to the last's pts + duration), not the rate the header declares: a variable-frame-rate clip, or a Matroska
  file whose header declares another rate, samples as many frames as the reference's. A stream without timestamps
  (or of one instant) takes its declared rate: the average, then the guessed one, then 24 as the reference does.
* Sampling: the reference's rule — n = min(⌊total·fps/video_fps⌋, num_frames, total), rounded down to an
  even count but at least 2 (and at most total), at `linspace(0, total−1, n)` truncated.
* Timestamps: the reference prints frame_index / fps. We print each sampled frame's real presentation
  timestamp, relative to the first frame, so variable-frame-rate video and streams with gaps get true
  times. For constant-rate video they are equal. Decoded frame arrays (`DecodedVideo`) have no
  timestamps, so they use index / fps. Either is held in float32, as the reference's are (torch tensors):
  "{timestamp:.1f}" prints some times differently in float64 (60 fps frame 63 is 1.05 s, "1.0" in float32,
  "1.1" in float64).
* Only a demuxer allow-list of ordinary video containers is opened (no playlists or concat scripts,
  which could make FFmpeg open other files), and FFmpeg reads bytes or a file Python opened, never a name it would
  read as a URL (`_open`).
* Rotation: a frame is turned upright by its display matrix (a phone's portrait video is stored landscape,
  with a matrix saying turn it a quarter), as the reference's decoder does: torchcodec ≥ 0.11 rotates by the
  matrix's counter-clockwise angle rounded to a quarter turn, and ignores a mirroring in it (`_upright`).
* Decoded frames of floats in [0, 1] are their levels × 255, as an image's are (image.py). The reference video
  processor would rescale them by 1/255 a second time (its `is_scaled_video` is never called), giving a grey
  screen; a float frame array outside [0, 1] is refused, as a float image is.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

import av
import numpy as np
import torch
from PIL import Image

from glimmer.cancellation import CancelToken
from glimmer.checkpoint.config import is_finite
from glimmer.multimodal.errors import MediaDecodeError, MediaLimitError
from glimmer.multimodal.image import array_to_rgb, as_frame_tensor, is_image_data, pil_to_rgb
from glimmer.multimodal.patches import patch_rows
from glimmer.multimodal.resize import resize_frames, smart_resize
from glimmer.multimodal.settings import MediaLimits, MediaSettings

logger = logging.getLogger(__name__)

# the reference's fallback when a video's frame rate is unknown — §7 sampling step 1
DEFAULT_VIDEO_FPS = 24.0

# FFmpeg demuxers we open (names as in `ffmpeg -demuxers`; "mov" covers mp4/m4v/3gp/mj2)
ALLOWED_DEMUXERS = "mov,matroska,webm,avi,mpegts,flv,ogg,gif,mpeg,asf,ivf,nut,h264,hevc,m4v"


# what DecodedVideo.frames may be, as an image array may be (image.py), with a frame axis first
_FRAME_ARRAYS = "a (T, H, W), (T, H, W, 1), (T, H, W, 3) or (T, H, W, 4) array of uint8 levels or of floats in [0, 1]"


@dataclass(frozen=True)
class DecodedVideo:
    """Frames already decoded by the caller: an array of T frames of any form an image array takes ((T, H, W, 3)
    uint8 levels, or floats in [0, 1] scaled by 255 as an image's are; grey; RGBA composited onto white), or a list
    of PIL images.

    `fps` is the frames' rate; None means unknown, and the reference's 24 is assumed (with a warning).
    """

    frames: np.ndarray | Sequence[Image.Image]
    fps: float | None = None


VideoInput = Union[bytes, bytearray, memoryview, str, os.PathLike, DecodedVideo, np.ndarray, tuple]  # noqa: UP007


@dataclass(frozen=True)
class ProcessedVideo:
    pixel_values: torch.Tensor  # (grid_t·grid_h·grid_w, T·3·p·p) float32 in [−1, 1]
    grid_thw: tuple[int, int, int]  # (grid_t, grid_h, grid_w): grid_t = frame groups of temporal_patch_size
    tokens_per_group: int  # `<|video|>` placeholders per frame group: grid_h·grid_w / merge²
    group_timestamps_s: tuple[float, ...]  # one per frame group: its first frame's time

    @property
    def num_tokens(self) -> int:
        return self.grid_thw[0] * self.tokens_per_group


def sample_frame_indices(total_frames: int, video_fps: float, settings: MediaSettings) -> list[int]:
    """Indices of the frames to keep — the reference's `sample_frames` (architecture.md §7)."""
    temporal = settings.temporal_patch_size
    wanted = total_frames * settings.video_sample_fps / video_fps  # inf for a vanishing video_fps: int() would raise
    count = min(int(min(wanted, total_frames)), settings.video_max_frames, total_frames)
    count = max(temporal, count // temporal * temporal)
    count = min(count, total_frames)
    return torch.linspace(0, total_frames - 1, count).long().tolist()


def frame_timestamps_s(frame_indices: Sequence[int], video_fps: float) -> list[float]:
    """The times of frames at a constant rate as the reference computes them (`VideoMetadata.timestamps`): each
    index, a long tensor's element, divided by fps in torch's float32, not float64."""
    return (torch.tensor(frame_indices, dtype=torch.long) / float(video_fps)).tolist()


def group_timestamps(frame_timestamps_s: Sequence[float], grid_t: int, temporal_patch_size: int) -> tuple[float, ...]:
    """One timestamp per frame group: every temporal_patch_size-th sampled frame, padded with the last."""
    stamps = list(frame_timestamps_s[::temporal_patch_size])[:grid_t]
    while len(stamps) < grid_t:
        stamps.append(stamps[-1] if stamps else 0.0)
    return tuple(stamps)


def _frame_rate(stream: av.video.stream.VideoStream, timestamped: bool) -> float | None:
    # a raw elementary stream (.h264, .hevc) has no timestamps: its average rate is the demuxer's assumed 25,
    # its guessed rate the one the bitstream declares
    rates = (stream.average_rate, stream.guessed_rate) if timestamped else (stream.guessed_rate, stream.average_rate)
    for rate in rates:
        if rate is not None and rate > 0:
            return float(rate)
    return None


def _measured_frame_rate(frames: int, first_pts: int | None, end_pts: int | None,
                         time_base: Fraction | None) -> float | None:
    """The rate torchcodec's exact mode gives the reference (`average_fps`): the frames over the span their packets
    cover, from the first's pts to the end (pts + duration) of the last, each in float64 seconds (pts × time base).
    None where there is no span (no timestamps, one instant), for which torchcodec takes the stream's declared rate."""
    if not frames or first_pts is None or end_pts is None or not time_base:
        return None
    seconds_per_tick = float(time_base)
    span_s = end_pts * seconds_per_tick - first_pts * seconds_per_tick
    return frames / span_s if span_s > 0 else None


@contextlib.contextmanager
def _open(source: bytes | str | os.PathLike) -> Iterator[av.container.InputContainer]:
    """The container of encoded bytes or of a file. A path is opened by Python and FFmpeg reads the open file: FFmpeg
    reads a name as a URL of its own protocols (`pipe:0` is standard input, `http://...` a download past the media
    fetch policy's hosts, limits and time, `tcp://...?listen` a server socket waiting for a peer), which a path that
    is no file must never become. Raises OSError (FileNotFoundError) for a path that cannot be opened."""
    with contextlib.ExitStack() as stack:
        file = io.BytesIO(source) if isinstance(source, bytes) else stack.enter_context(open(os.fspath(source), "rb"))
        yield stack.enter_context(av.open(file, options={"format_whitelist": ALLOWED_DEMUXERS}))


def is_video_data(data: bytes) -> bool:
    """Whether FFmpeg recognizes `data` as a container with a video stream from its header."""
    try:
        with _open(data) as container:
            return bool(container.streams.video)
    except Exception:  # PyAV raises many kinds for data that is not a video
        return False


def _target_size(height: int, width: int, settings: MediaSettings) -> tuple[int, int]:
    return smart_resize(height, width, settings.resize_factor, settings.max_video_frame_tokens)


def _upright(rgb: np.ndarray, rotation_degrees: float) -> np.ndarray:
    """A decoded (H, W, 3) frame turned by its display matrix's counter-clockwise angle (`VideoFrame.rotation`), rounded
    to a quarter turn half away from zero as torchcodec's `rotation_from_degrees` rounds it."""
    quarter_turns = int(math.copysign(math.floor(abs(rotation_degrees) / 90 + 0.5), rotation_degrees)) % 4
    return np.rot90(rgb, quarter_turns) if quarter_turns else rgb


def _check_source_frames(count: int, index: int, limits: MediaLimits) -> None:
    if count > limits.max_video_source_frames:
        raise MediaLimitError(
            "video",
            index,
            f"the video has more than {limits.max_video_source_frames:,} frames, the most this server decodes; "
            "send a shorter clip",
        )


def _check_frameless_packets(count: int, index: int, limits: MediaLimits) -> None:
    """Packets that hold no frame (empty, or cut by an edit list) cost a demux step each as frames do, and a file
    of a few bytes a packet holds millions (a NUT packet with no data is about one byte): they are bounded as
    frames are, by `max_video_source_frames`."""
    if count > limits.max_video_source_frames:
        raise MediaLimitError(
            "video",
            index,
            f"the video has more than {limits.max_video_source_frames:,} packets that hold no frame (empty, or cut "
            "by an edit list), the most this server reads; re-encode it, or send a shorter clip",
        )


# packets of a clip's other streams (audio, subtitles, data) read for each frame `max_video_source_frames` allows:
# a 48 kHz audio track is about 47 packets a second, so one track under a video of 1 fps or more fits
OTHER_STREAM_PACKETS_PER_FRAME = 64


def _video_packets(container: av.container.InputContainer, stream: av.video.stream.VideoStream, index: int,
                   limits: MediaLimits, cancel: CancelToken | None) -> Iterator[av.Packet]:
    """The packets of `stream`, the decoder's flush packet last. Every stream is demuxed here, not in PyAV's loop:
    `container.demux(stream)` skips the other streams' packets in C, where no cancellation is checked and none is
    counted, so a file of millions of empty audio packets held a worker thread for tens of seconds. Each packet
    checks `cancel`; the other streams' are bounded by OTHER_STREAM_PACKETS_PER_FRAME × max_video_source_frames.

    Raises MediaLimitError past that bound, Cancelled once `cancel` is cancelled."""
    other_packets, other_limit = 0, OTHER_STREAM_PACKETS_PER_FRAME * limits.max_video_source_frames
    for packet in container.demux():
        if cancel is not None:
            cancel.check()
        if packet.stream.index == stream.index:  # a flush packet's stream_index is 0 whatever its stream
            yield packet
            continue
        other_packets += 1
        if other_packets > other_limit:
            raise MediaLimitError("video", index, f"the file has more than {other_limit:,} packets in streams other "
                                                  "than its video (audio, subtitles, data), the most this server "
                                                  "reads; re-encode it without them, or send a shorter clip")


def decode_video_file(
    source: bytes | str | os.PathLike, settings: MediaSettings, limits: MediaLimits, index: int = 0,
    cancel: CancelToken | None = None,
) -> tuple[torch.Tensor, list[float]]:
    """Decode the sampled frames of an encoded video, already resized: (F, 3, h, w) uint8 and their times.

    Raises MediaDecodeError for unreadable or unsupported data, MediaLimitError for too many pixels, frames or packets
    without a frame, Cancelled (checked at every packet and frame) once `cancel` is cancelled.
    """
    try:
        with _open(source) as container:
            if not container.streams.video:
                raise MediaDecodeError("video", index, "the file has no video stream")
            # the stream torchcodec decodes for the reference: FFmpeg's best (a default track, one of several frames),
            # not a cover picture or thumbnail track before it
            stream = container.streams.best("video") or container.streams.video[0]
            stream_index = stream.index
            if stream.codec_context is None:  # PyAV has no decoder for the stream's codec id (unknown or corrupt)
                raise MediaDecodeError("video", index, "the video's codec is unknown or has no decoder here; "
                                                       "re-encode it (H.264, VP9 or AV1)")
            header_width, header_height = stream.codec_context.width, stream.codec_context.height
            if header_width and header_height:  # some containers leave it to the first decoded frame
                limits.check_frame_size("video", index, header_width, header_height)
            total_frames = timed_frames = frameless_packets = 0
            first_pts = end_pts = None  # the span the timed packets cover: the first's pts, the last's pts + duration
            for packet in _video_packets(container, stream, index, limits, cancel):
                # a packet an MP4 edit list cuts (a clip cut without re-encoding) is decoded and its frame dropped:
                # no frame, and torchcodec, the reference's decoder, does not count it either
                if packet.size and not packet.is_discard:
                    total_frames += 1
                    _check_source_frames(total_frames, index, limits)
                    if packet.pts is not None:
                        timed_frames += 1
                        first_pts = packet.pts if first_pts is None else min(first_pts, packet.pts)
                        packet_end = packet.pts + (packet.duration or 0)
                        end_pts = packet_end if end_pts is None else max(end_pts, packet_end)
                else:
                    frameless_packets += 1
                    _check_frameless_packets(frameless_packets, index, limits)
            # in a container only timed packets are frames; in a raw elementary stream no packet is timed
            total_frames = timed_frames or total_frames
            video_fps = _measured_frame_rate(timed_frames, first_pts, end_pts, stream.time_base) or _frame_rate(
                stream, timestamped=timed_frames > 0)
        if total_frames == 0:
            raise MediaDecodeError("video", index, "the video stream has no frames")
        if video_fps is None:
            logger.warning(
                "video %d: unknown frame rate; assuming %s fps as the reference does", index, DEFAULT_VIDEO_FPS
            )
            video_fps = DEFAULT_VIDEO_FPS
        wanted = sample_frame_indices(total_frames, video_fps, settings)
        wanted_set, last_wanted = set(wanted), wanted[-1]

        frames, times, decoded = [], [], 0
        with _open(source) as container:
            stream = container.streams[stream_index]
            stream.thread_type = "AUTO"
            target = None
            frames_of_packets = (frame for packet in _video_packets(container, stream, index, limits, cancel)
                                 for frame in packet.decode())
            for frame_index, frame in enumerate(frames_of_packets):
                if cancel is not None:
                    cancel.check()
                decoded += 1
                if frame_index in wanted_set:
                    limits.check_frame_size("video", index, frame.width, frame.height)
                    rgb = _upright(frame.to_ndarray(format="rgb24"), frame.rotation)
                    target = target or _target_size(rgb.shape[0], rgb.shape[1], settings)
                    frames.append(resize_frames(as_frame_tensor(rgb[None]), *target))
                    times.append(frame.time if frame.time is not None else frame_index / video_fps)
                if frame_index >= last_wanted:
                    break
    except (MediaDecodeError, MediaLimitError):
        raise
    except FileNotFoundError:
        raise MediaDecodeError("video", index, f"no such file: {os.fspath(source)!r}") from None
    except (av.FFmpegError, OSError, ValueError, EOFError) as error:
        if is_image_data(source):  # an image sent where a video goes: say so
            raise MediaDecodeError("video", index, "the data is an image, not a video; send it as an image "
                                                   "(an image_url part, or multi_modal_data's \"image\"), or an "
                                                   "animated one as MP4 or WebM, or as DecodedVideo frames") from None
        raise MediaDecodeError(
            "video", index, f"not a video FFmpeg can decode (MP4, WebM, MKV, AVI, MPEG-TS, ...): {_reason(error)}"
        ) from None
    if len(frames) < len(wanted):
        raise MediaDecodeError(
            "video",
            index,
            f"only {decoded} of the {total_frames} frames in the container could be decoded; the file is "
            "corrupt or truncated",
        )
    first = times[0]
    # float32, as the reference holds a time (`frame_timestamps_s`)
    return torch.cat(frames), torch.tensor([time - first for time in times], dtype=torch.float64).float().tolist()


def _reason(error: Exception) -> str:
    """Why FFmpeg (or the file) failed, in its own words but without what only a debugger needs: PyAV's text is
    `[Errno 1094995529] Invalid data found when processing input: '<none>'` (FFmpeg's error code and the stream's
    name, none for bytes); its `strerror` is the phrase alone."""
    strerror = getattr(error, "strerror", None)  # av.FFmpegError's and OSError's
    reason = strerror if isinstance(strerror, str) and strerror.strip() else str(error)
    reason = (reason.strip().splitlines() or [type(error).__name__])[0]
    return reason[:1].lower() + reason[1:]


def _decoded_frames(video: DecodedVideo, settings: MediaSettings, limits: MediaLimits, index: int):
    frames = video.frames
    if isinstance(frames, np.ndarray):
        if not (frames.ndim == 3 or (frames.ndim == 4 and frames.shape[3] in (1, 3, 4))):
            raise MediaDecodeError("video", index, f"frames must be {_FRAME_ARRAYS}; got {frames.dtype} {frames.shape}")
        if frames.ndim == 3 and frames.shape[2] in (1, 3, 4):
            # one image's (H, W, C) array, which the reference reads as a one-frame video, would be read here as
            # grey frames of 1 to 4 pixels wide, a silently other video
            count, _, last = frames.shape
            raise MediaDecodeError("video", index, f"frames of shape {frames.shape} read as (T, H, W) would be {count} "
                                                   f"grey frames {last} pixel{'s' * (last > 1)} wide; for one (H, W, "
                                                   f"{last}) image as a one-frame video pass frames[None], or send it "
                                                   "as an image; for grey frames pass (T, H, W, 1)")
        # the dtype is checked (and floats scaled) frame by frame, by array_to_rgb, as an image's
        total_frames, height, width = frames.shape[:3]
    else:
        if isinstance(frames, torch.Tensor):
            # its layout is not known here: torch keeps frames (T, C, H, W), arrays here are (T, H, W, C)
            raise MediaDecodeError("video", index, f"frames must be {_FRAME_ARRAYS} or a list of PIL images, not a "
                                                   "torch tensor: pass frames.numpy() of a (T, H, W, C) tensor, "
                                                   "frames.permute(0, 2, 3, 1).numpy() of a (T, C, H, W) one")
        if not isinstance(frames, Sequence) or not all(isinstance(frame, Image.Image) for frame in frames):
            raise MediaDecodeError("video", index, f"frames must be {_FRAME_ARRAYS} or a list of PIL images")
        sizes = {frame.size for frame in frames}
        if len(sizes) > 1:
            raise MediaDecodeError("video", index, f"all frames must have the same size; got {sorted(sizes)}")
        total_frames = len(frames)
        width, height = sizes.pop() if sizes else (0, 0)
    if total_frames == 0:
        raise MediaDecodeError("video", index, "the video has no frames")
    limits.check_frame_size("video", index, width, height)
    _check_source_frames(total_frames, index, limits)
    fps = video.fps
    if fps is None:
        logger.warning(
            "video %d: no fps given with the frames; assuming %s as the reference does", index, DEFAULT_VIDEO_FPS
        )
        fps = DEFAULT_VIDEO_FPS
    elif isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not is_finite(fps) or fps <= 0:
        raise MediaDecodeError("video", index, f"fps={fps!r} is invalid; expected a positive number")
    wanted = sample_frame_indices(total_frames, fps, settings)
    if isinstance(frames, np.ndarray):
        selected = np.stack([array_to_rgb(frames[i], "video", index, "a video frame array") for i in wanted])
    else:
        selected = np.stack([pil_to_rgb(frames[i], "video", index) for i in wanted])
    times = frame_timestamps_s(wanted, fps)
    if not all(map(math.isfinite, times)):  # a rate float32 holds as 0, or whose 1 / fps overflows it
        raise MediaDecodeError("video", index, f"fps={fps!r} is too small: the frames' times (index / fps, in float32 "
                                               "as the reference holds them) are not finite, and the prompt would read "
                                               "'Time: nans'; give the frames' real rate")
    resized = resize_frames(as_frame_tensor(selected), *_target_size(height, width, settings))
    return resized, times


def _frame_indices(indices: object, index: int) -> list[int]:
    """A (frames, metadata) video's `frames_indices` (a list, array or tensor of frame numbers) as ints. Raises
    MediaDecodeError naming it for anything else: a number, a string, nested lists, fractions."""
    try:
        values = np.asarray(indices)
    except (TypeError, ValueError, RuntimeError):  # ragged lists, a tensor on a device
        values = None
    if values is None or values.ndim != 1 or values.dtype.kind not in "iuf" or (
            values.dtype.kind == "f" and not np.all(np.mod(values, 1) == 0)):
        raise MediaDecodeError("video", index, "metadata frames_indices must be a list of integers, the frames' "
                                               "indices (0, 1, ... for every frame)")
    return [int(value) for value in values]


def _from_frames_and_metadata(frames: object, metadata: Mapping, index: int) -> DecodedVideo:
    """vLLM's `(frames, metadata)` video: every frame of the video, at `metadata["fps"]`. Frames already sampled
    (`do_sample_frames` false, `frames_indices` other than 0..T-1, or a `total_num_frames` other than T) are
    refused: sampling them again would keep other frames than the reference keeps, and their times would be wrong."""
    count = len(frames) if isinstance(frames, np.ndarray | Sequence) else None
    indices = metadata.get("frames_indices")
    if indices is not None:
        indices = _frame_indices(indices, index)
    total = metadata.get("total_num_frames")
    every_frame = ("a (frames, metadata) video must hold every frame of the video (frames already sampled are not "
                   "supported: the model samples its own); pass all decoded frames, or the encoded video")
    if metadata.get("do_sample_frames") is False or (
            indices is not None and count is not None and indices != list(range(count))):
        raise MediaDecodeError("video", index, every_frame)
    if total is not None and count is not None and not (
            isinstance(total, numbers.Real) and not isinstance(total, bool) and total == count):
        # 32 frames sampled from a clip of metadata total_num_frames=300 were read as the whole clip, at its fps
        raise MediaDecodeError("video", index, f"metadata total_num_frames={total!r} but {count} frames were "
                                               f"given: {every_frame}")
    return DecodedVideo(frames, fps=metadata.get("fps"))


def is_frames_with_metadata(value: object) -> bool:
    """Whether `value` is one video as vLLM's multi_modal_data takes it with its metadata, `(frames, metadata)`: a
    pair whose second item is a mapping, or None for metadata not known (its `_get_video_with_metadata`), not two
    videos."""
    return isinstance(value, tuple) and len(value) == 2 and (value[1] is None or isinstance(value[1], Mapping))


def is_frame_list(value: object) -> bool:
    """Whether `value` is a list of PIL images: one video's frames, as vLLM's multi_modal_data reads such a list (its
    `_parse_video_data`), not as that many videos."""
    return isinstance(value, list) and bool(value) and all(isinstance(frame, Image.Image) for frame in value)


STACKED_ITEM_NDIM = {"image": 4, "video": 5}
"""The dimensions of an array stacking several items of a kind: (N, H, W, C) images, (N, T, H, W, C) videos."""


def unstacked(value: object, kind: str) -> list | None:
    """The items of an array (or tensor) stacking several of `kind` along its first axis, one per index, as vLLM's
    multi_modal_data reads such an array (its `_parse_image_data` / `_parse_video_data`), not as one item; None for
    anything else."""
    if isinstance(value, np.ndarray | torch.Tensor) and value.ndim == STACKED_ITEM_NDIM[kind]:
        return list(value)
    return None


def process_video(video: VideoInput, settings: MediaSettings, limits: MediaLimits, index: int = 0,
                  cancel: CancelToken | None = None) -> ProcessedVideo:
    """Decode, sample, resize (one size per video), normalise and patchify one video.

    `index` is the video's position in the request, used in error messages; `cancel` stops the decoding.
    """
    if isinstance(video, bytearray | memoryview):
        video = bytes(video)
    if isinstance(video, np.ndarray) or is_frame_list(video):  # frames alone, as vLLM takes them: the rate is unknown
        video = DecodedVideo(video)
    if is_frames_with_metadata(video):
        video = _from_frames_and_metadata(video[0], video[1] or {}, index)
    if isinstance(video, DecodedVideo):
        frames, times = _decoded_frames(video, settings, limits, index)
    elif isinstance(video, bytes | str | os.PathLike):
        frames, times = decode_video_file(video, settings, limits, index, cancel)
    else:
        raise MediaDecodeError(
            "video",
            index,
            f"unsupported video input of type {type(video).__name__}; send encoded bytes, a path, DecodedVideo "
            "frames, a frames array, a list of PIL images or (frames, {\"fps\": ...})",
        )
    rows, grid = patch_rows(frames, settings)
    return ProcessedVideo(
        pixel_values=rows,
        grid_thw=grid,
        tokens_per_group=grid[1] * grid[2] // settings.merge_size**2,
        group_timestamps_s=group_timestamps(times, grid[0], settings.temporal_patch_size),
    )
