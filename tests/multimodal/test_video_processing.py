"""Video → sampled frames, patch rows and timestamps — architecture.md §7. Test videos are made with PyAV."""

from __future__ import annotations

import contextlib
import io
import logging
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from glimmer.cancellation import Cancelled, CancelToken
from glimmer.errors import RequestError
from glimmer.multimodal import (
    DecodedVideo,
    MediaDecodeError,
    MediaLimitError,
    MediaLimits,
    MediaProcessor,
    MediaSettings,
    process_image,
    process_video,
    sample_frame_indices,
    video_expansion,
)
from glimmer.multimodal.patches import patch_rows
from glimmer.multimodal.video import OTHER_STREAM_PACKETS_PER_FRAME

LIMITS = MediaLimits()
SMALL = MediaSettings(max_video_frame_tokens=16)  # 120×90 frames → 6×8 patches, 12 tokens per group


def distinct_frames(count: int, height: int = 90, width: int = 120, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, height, width, 3), dtype=np.uint8)


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(1, 3000),
    video_fps=st.sampled_from([1.0, 2.0, 4.0, 10.0, 23.976, 24.0, 25.0, 29.97, 30.0, 59.94, 60.0, 120.0]),
    fps=st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0]),
    max_frames=st.sampled_from([2, 8, 32, 96]),
)
def test_sampling_matches_the_reference(total, video_fps, fps, max_frames, reference_sample_frames) -> None:
    ours = sample_frame_indices(total, video_fps, MediaSettings(video_sample_fps=fps, video_max_frames=max_frames))
    assert ours == reference_sample_frames(total, video_fps, fps, max_frames, 2)


def test_sampling_example_8_frames_at_4_fps_sampled_at_2() -> None:
    assert sample_frame_indices(8, 4.0, MediaSettings()) == [0, 2, 4, 7]


def test_sampling_caps_at_num_frames() -> None:
    indices = sample_frame_indices(30 * 600, 30.0, MediaSettings())  # ten minutes
    assert len(indices) == 96 and indices[0] == 0 and indices[-1] == 30 * 600 - 1


def test_a_vanishing_frame_rate_samples_every_frame_up_to_the_cap() -> None:
    """total · fps / video_fps overflowed to infinity and int() raised OverflowError, a crash of `LLM.generate`."""
    assert sample_frame_indices(6, 1e-308, MediaSettings()) == sample_frame_indices(6, 1e-3, MediaSettings())
    video = process_video(DecodedVideo(distinct_frames(6, 28, 28), fps=1e-30), SMALL, LIMITS)
    assert video.grid_thw == (3, 2, 2) and video.group_timestamps_s == (0.0, pytest.approx(2e30), pytest.approx(4e30))


@pytest.mark.parametrize("fps", [1e-308, 1e-40])
def test_a_frame_rate_whose_frame_times_leave_float32_is_refused_naming_it(fps) -> None:
    """Frame times are index / fps in float32, as the reference holds them: a rate float32 holds as 0 (1e-308) gave
    the first frame group 'Time: nans' in the prompt, one whose 1 / fps overflows it (1e-40) 'Time: infs'."""
    with pytest.raises(MediaDecodeError, match=rf"fps={fps!r} is too small: the frames' times"):
        process_video(DecodedVideo(distinct_frames(6, 28, 28), fps=fps), SMALL, LIMITS)


def test_a_video_path_is_read_as_a_file_never_as_an_ffmpeg_url(tmp_path, video_writer, monkeypatch) -> None:
    """A path was handed to FFmpeg, which reads a name as a URL of its protocols: LLM.generate's multi_modal_data video
    "http://127.0.0.1:port/clip.mp4" was downloaded past the media fetch policy (remote media off, loopback refused,
    no size or time limit), "pipe:0" read standard input until it closed, "tcp://...?listen" waited for a peer. A
    path is a file's name: one that is no file is 'no such file', and a file named like a URL is that file."""
    import socket
    import threading

    connections = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def answer() -> None:  # closes at once whatever connects, so that the old code failed instead of waiting
            with contextlib.suppress(OSError):
                while True:
                    connection, _ = listener.accept()
                    connections.append(connection)
                    connection.close()

        threading.Thread(target=answer, daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/clip.mkv"
        with pytest.raises(MediaDecodeError, match=f"no such file: '{url}'"):
            process_video(url, SMALL, LIMITS)
    assert connections == []
    frames = distinct_frames(4)
    video_writer(tmp_path / "http:clip.mkv", frames, fps=4)
    monkeypatch.chdir(tmp_path)
    expected = process_video(DecodedVideo(frames, fps=4.0), SMALL, LIMITS)
    assert torch.equal(process_video("http:clip.mkv", SMALL, LIMITS).pixel_values, expected.pixel_values)


def test_spec_example_from_a_file(tmp_path, video_writer) -> None:
    """8 frames of 120×90 at 4 fps, sampled at 2 fps: 4 frames, grid [2, 6, 8], groups at 0.0 s and 1.0 s."""
    frames = distinct_frames(8)
    path = video_writer(tmp_path / "clip.mkv", frames, fps=4)
    video = process_video(path, SMALL, LIMITS)
    assert video.grid_thw == (2, 6, 8)
    assert video.tokens_per_group == 12 and video.num_tokens == 24
    assert video.group_timestamps_s == (0.0, 1.0)
    assert video.pixel_values.shape == (2 * 6 * 8, 1176)


def test_file_and_decoded_frames_give_identical_rows(tmp_path, video_writer) -> None:
    """ffv1 is lossless, so the decoded file must give exactly the rows of the same frames passed as arrays."""
    frames = distinct_frames(8, seed=1)
    from_file = process_video(video_writer(tmp_path / "clip.mkv", frames, fps=4), SMALL, LIMITS)
    from_array = process_video(DecodedVideo(frames, fps=4.0), SMALL, LIMITS)
    from_pil = process_video(DecodedVideo([Image.fromarray(f) for f in frames], fps=4.0), SMALL, LIMITS)
    assert torch.equal(from_file.pixel_values, from_array.pixel_values)
    assert torch.equal(from_pil.pixel_values, from_array.pixel_values)
    assert from_file.group_timestamps_s == from_array.group_timestamps_s == (0.0, 1.0)


def test_float_pil_frames_in_0_1_give_the_rows_of_their_levels_and_others_are_refused() -> None:
    """A mode F frame (floats) was cast to black; in [0, 1] it is its levels × 255, outside refused naming the video."""
    grey = distinct_frames(4, seed=2)[:, :, :, 0]
    levels = process_video(DecodedVideo([Image.fromarray(f) for f in grey], fps=4.0), SMALL, LIMITS)
    floats = process_video(DecodedVideo([Image.fromarray(f.astype(np.float32) / 255) for f in grey], fps=4.0),
                           SMALL, LIMITS)
    assert torch.equal(floats.pixel_values, levels.pixel_values)
    with pytest.raises(MediaDecodeError, match=r"video 1: a float \(mode F\) PIL image must hold values in \[0, 1\]"):
        process_video(DecodedVideo([Image.fromarray(f.astype(np.float32)) for f in grey], fps=4.0), SMALL, LIMITS,
                      index=1)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_frames_in_0_1_give_the_rows_of_their_levels_as_an_image_does(dtype, reference_video_patchify) -> None:
    """QA: a DecodedVideo of float frames (torchvision's ToTensor range) was refused, though an image of the same
    floats is taken as its levels × 255. It is now taken as an image is, giving the rows of its uint8 levels, which
    are the reference's rescale, normalize and patchify of those levels (transformers' video processor would rescale
    the floats by 1/255 a second time: its `is_scaled_video` is never called)."""
    levels = distinct_frames(4, 28, 56, seed=3)
    floats = process_video(DecodedVideo(levels.astype(dtype) / dtype(255), fps=2.0), MediaSettings(), LIMITS)
    assert torch.equal(floats.pixel_values, process_video(DecodedVideo(levels, fps=2.0), MediaSettings(),
                                                          LIMITS).pixel_values)
    normalised = (torch.from_numpy(levels).permute(0, 3, 1, 2).float() * (1 / 255) - 0.5) / 0.5
    expected, *grid = reference_video_patchify(normalised[None], 14, 2)
    assert tuple(grid) == floats.grid_thw
    torch.testing.assert_close(floats.pixel_values, expected[0], rtol=0, atol=1e-6)


def test_grey_and_rgba_frame_arrays_are_read_as_images_of_them_are() -> None:
    """Every array form an image takes, with a frame axis first: grey replicated, transparency onto white."""
    grey = distinct_frames(4, seed=4)[:, :, :, 0]
    as_rgb = process_video(DecodedVideo(np.repeat(grey[..., None], 3, axis=3), fps=4.0), SMALL, LIMITS)
    for frames in (grey, grey[..., None]):
        assert torch.equal(process_video(DecodedVideo(frames, fps=4.0), SMALL, LIMITS).pixel_values,
                           as_rgb.pixel_values)
    rgb = distinct_frames(4, seed=5)
    opaque, clear = (np.concatenate([rgb, np.full((4, 90, 120, 1), alpha, np.uint8)], axis=3) for alpha in (255, 0))
    assert torch.equal(process_video(DecodedVideo(opaque, fps=4.0), SMALL, LIMITS).pixel_values,
                       process_video(DecodedVideo(rgb, fps=4.0), SMALL, LIMITS).pixel_values)
    assert torch.equal(process_video(DecodedVideo(clear, fps=4.0), SMALL, LIMITS).pixel_values,
                       process_video(DecodedVideo(np.full_like(rgb, 255), fps=4.0), SMALL, LIMITS).pixel_values)


def test_encoded_bytes_are_accepted(tmp_path, video_writer) -> None:
    path = video_writer(tmp_path / "clip.mp4", distinct_frames(8), fps=4, codec="libx264", container="mp4")
    video = process_video(path.read_bytes(), SMALL, LIMITS)
    assert video.grid_thw == (2, 6, 8)
    assert video.group_timestamps_s == (0.0, 1.0)


def test_raw_h264_stream_without_timestamps_is_decoded_at_its_own_rate(tmp_path, video_writer) -> None:
    """A raw .h264 stream (an allowed demuxer) has no packet timestamps; each packet is a frame, and its rate is
    the bitstream's 4 fps, not the demuxer's assumed 25."""
    path = video_writer(tmp_path / "clip.h264", distinct_frames(8), fps=4, codec="libx264", container="h264")
    video = process_video(path.read_bytes(), SMALL, LIMITS)
    assert video.grid_thw == (2, 6, 8)
    assert video.group_timestamps_s == (0.0, 1.0)


def test_rows_pair_consecutive_sampled_frames(reference_video_patchify) -> None:
    """Group g holds sampled frames 2g and 2g+1 in its (t, c, py, px) rows — the reference's patchify."""
    frames = np.stack([np.full((28, 56, 3), 10 * i, dtype=np.uint8) for i in range(8)])
    video = process_video(DecodedVideo(frames, fps=2.0), MediaSettings(), LIMITS)
    assert video.grid_thw == (4, 2, 4)
    values = torch.round(video.pixel_values * 127.5 + 127.5).view(4, 2 * 4, 2, 3 * 14 * 14)
    for group in range(4):
        assert torch.all(values[group, :, 0] == 10 * (2 * group))
        assert torch.all(values[group, :, 1] == 10 * (2 * group + 1))

    normalised = (torch.from_numpy(frames).permute(0, 3, 1, 2).float() - 127.5) / 127.5
    expected, *grid = reference_video_patchify(normalised[None], 14, 2)
    assert tuple(grid) == video.grid_thw
    assert torch.equal(video.pixel_values, expected[0])


def test_odd_frame_count_repeats_the_last_frame(reference_video_patchify) -> None:
    frames = torch.from_numpy(distinct_frames(3, 28, 28)).permute(0, 3, 1, 2)
    rows, grid = patch_rows(frames, MediaSettings())
    assert grid == (2, 2, 2)
    normalised = (frames.float() - 127.5) / 127.5
    expected, *reference_grid = reference_video_patchify(normalised[None], 14, 2)
    assert tuple(reference_grid) == grid
    assert torch.equal(rows, expected[0])
    last_group = rows[4:].view(4, 2, -1)
    assert torch.equal(last_group[:, 0], last_group[:, 1])


def test_single_frame_video_is_one_group_like_an_image(tmp_path, video_writer) -> None:
    frames = distinct_frames(1, 56, 84)
    video = process_video(video_writer(tmp_path / "one.mkv", frames), MediaSettings(), LIMITS)
    assert video.grid_thw[0] == 1
    assert video.group_timestamps_s == (0.0,)
    image = process_image(frames[0], MediaSettings(max_image_tokens=144), LIMITS)
    assert torch.equal(video.pixel_values, image.pixel_values)


@pytest.mark.parametrize("rotation", [90, -90, 180])
def test_a_rotated_video_is_turned_upright_as_the_references_decoder_turns_it(tmp_path, video_writer, rotation) -> None:
    """QA: a phone's portrait video (stored landscape, with a display matrix turning it a quarter) was read on its
    side: the picture sideways and the grid transposed. The reference's decoder, torchcodec (≥ 0.11), turns each frame
    by the matrix's counter-clockwise angle (torch.rot90 of the (H, W, C) frame)."""
    frames = distinct_frames(4, 56, 112)
    path = video_writer(tmp_path / "rotated.mkv", frames, rotation=rotation)
    upright = np.ascontiguousarray(np.rot90(frames, rotation // 90, axes=(1, 2)))
    expected = process_video(DecodedVideo(upright, fps=4.0), SMALL, LIMITS)
    video = process_video(path, SMALL, LIMITS)
    assert video.grid_thw == expected.grid_thw
    assert torch.equal(video.pixel_values, expected.pixel_values)


def cut_without_reencoding(source, target, cut_s: float):
    """Remux `source` into an MP4 that starts `cut_s` in, as `ffmpeg -ss CUT -i IN -c copy OUT` cuts a clip: the
    packets before the cut stay, at negative times, and the MP4's edit list has them decoded and their frames
    dropped (AV_PKT_FLAG_DISCARD)."""
    import av

    with av.open(str(source)) as inp, av.open(str(target), "w", format="mp4") as out:
        stream = inp.streams.video[0]
        copy = out.add_stream_from_template(stream)
        shift = round(cut_s / stream.time_base)
        for packet in inp.demux(stream):
            if packet.dts is None:  # the demuxer's final flush packet
                continue
            packet.pts, packet.dts, packet.stream = packet.pts - shift, packet.dts - shift, copy
            out.mux(packet)
    return target


def test_a_clip_cut_without_reencoding_samples_its_kept_frames_as_the_reference(
    tmp_path, video_writer, reference_sample_frames
) -> None:
    """QA: the packets an MP4 edit list discards were counted as frames, so the last frame sampled was one that is
    never decoded and every such clip was refused as "corrupt or truncated". torchcodec leaves them out."""
    levels = np.arange(30, dtype=np.uint8)[:, None, None, None] * 8  # frame i is grey level 8·i
    frames = np.broadcast_to(levels, (30, 56, 56, 3)).copy()
    source = video_writer(tmp_path / "source.mp4", frames, fps=10, codec="libx264", container="mp4")
    video = process_video(cut_without_reencoding(source, tmp_path / "cut.mp4", 0.4), SMALL, LIMITS)
    kept = 30 - 4
    indices = reference_sample_frames(kept, 10.0, SMALL.video_sample_fps, SMALL.video_max_frames, 2)
    assert video.grid_thw[0] == -(-len(indices) // 2)
    assert video.group_timestamps_s == tuple(float(torch.tensor(i) / 10.0) for i in indices[::2])
    first_level = video.pixel_values[0, 0].item() * 127.5 + 127.5
    assert abs(first_level - 8 * 4) <= 3  # the first frame shown is the first kept one (lossy H.264)


def test_timestamps_are_the_real_presentation_times(tmp_path, video_writer) -> None:
    """A variable-frame-rate clip: the reference would print index/fps (0.0, 0.5, 1.0); we print true times."""
    times_ms = [0, 250, 500, 2000, 2250, 2500]
    path = video_writer(tmp_path / "vfr.mkv", distinct_frames(6), fps=4, times_ms=times_ms)
    video = process_video(path, MediaSettings(max_video_frame_tokens=16, video_sample_fps=4.0), LIMITS)
    assert video.grid_thw[0] == 3
    assert video.group_timestamps_s == (0.0, 0.5, 2.25)


def _torchcodec_average_fps(path) -> float:
    """torchcodec's exact-mode `average_fps`, what the reference samples by: its scan's frame count over
    max(pts + duration) − min(pts) of the stream's packets, each in seconds of pts × time base (torchcodec's
    `scanFileAndUpdateMetadataAndIndex` and `get_average_fps`)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        packets = [p for p in container.demux(stream) if p.size and not p.is_discard]
        tick = float(stream.time_base)
        end = max(p.pts + (p.duration or 0) for p in packets) * tick
        return len(packets) / (end - min(p.pts for p in packets) * tick)


def test_a_variable_frame_rate_clip_samples_as_many_frames_as_the_reference(tmp_path, video_writer,
                                                                             reference_sample_frames) -> None:
    """The reference's decoder measures the rate over the frames' timestamps; the header's declared rate (25 here,
    as Matroska muxers write it) sampled 2 frames of a 10 s clip where the reference samples 18."""
    times_ms = [40 * i for i in range(20)] + [800 + 460 * i for i in range(20)]
    path = video_writer(tmp_path / "vfr.mkv", distinct_frames(40, 28, 28), fps=25, times_ms=times_ms)
    settings = MediaSettings(max_video_frame_tokens=16)
    indices = reference_sample_frames(40, _torchcodec_average_fps(path), settings.video_sample_fps,
                                      settings.video_max_frames, 2)
    assert len(indices) > 2  # the header's 25 fps would sample 2
    assert process_video(path, settings, LIMITS).grid_thw[0] == len(indices) // 2


def test_timestamps_start_at_zero_when_the_stream_does_not(tmp_path, video_writer) -> None:
    path = video_writer(tmp_path / "late.mkv", distinct_frames(4), fps=4, times_ms=[1000, 1250, 1500, 1750])
    video = process_video(path, MediaSettings(max_video_frame_tokens=16, video_sample_fps=4.0), LIMITS)
    assert video.group_timestamps_s == (0.0, 0.5)


@pytest.mark.parametrize(("total", "video_fps"), [(601, 60.0), (121, 20.0), (1201, 120.0)])
def test_timestamps_print_as_the_references_float32_times(total, video_fps, reference_sample_frames,
                                                         reference_processor) -> None:
    """QA: a 10 s clip at 60 fps printed the group at frame 63 as "Time: 1.1s" (63 / 60 in float64) where the
    reference prints "Time: 1.0s" (its times are float32 tensors): another prompt than the reference's."""
    frames = np.zeros((total, 28, 28, 3), dtype=np.uint8)
    video = process_video(DecodedVideo(frames, fps=video_fps), SMALL, LIMITS)
    indices = reference_sample_frames(total, video_fps, SMALL.video_sample_fps, SMALL.video_max_frames, 2)
    expected = reference_processor.video(list(video.grid_thw), indices, video_fps)
    assert video_expansion(video.group_timestamps_s, video.tokens_per_group, SMALL.frame_timestamp_format) == expected


def test_a_files_timestamps_print_as_the_references_float32_times(tmp_path, video_writer, reference_sample_frames,
                                                                 reference_processor) -> None:
    """The presentation times of a constant-rate file print as the reference's index / fps: 1.05 s as 1.0."""
    path = video_writer(tmp_path / "clip60.mkv", np.zeros((601, 28, 28, 3), dtype=np.uint8), fps=60)
    video = process_video(path, SMALL, LIMITS)
    expected = reference_processor.video(list(video.grid_thw), reference_sample_frames(601, 60.0, 2.0, 96, 2), 60.0)
    assert "Time: 1.0s" in expected
    assert video_expansion(video.group_timestamps_s, video.tokens_per_group, SMALL.frame_timestamp_format) == expected


def test_frames_without_fps_assume_24_like_the_reference(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        video = process_video(DecodedVideo(distinct_frames(48), fps=None), SMALL, LIMITS)
    assert "assuming 24.0" in caplog.text
    assert video.grid_thw[0] == 2  # 48 frames at 24 fps = 2 s → 4 frames at 2 fps
    assert video.group_timestamps_s == (0.0, float(torch.tensor(31) / 24.0))  # in float32, as the reference's


def test_a_frames_array_alone_is_a_video_at_the_references_24_fps(caplog) -> None:
    """vLLM's multi_modal_data takes a video as its (T, H, W, 3) frames; it was refused as an unsupported input."""
    frames = distinct_frames(48)
    with caplog.at_level(logging.WARNING):
        video = process_video(frames, SMALL, LIMITS)
    assert "assuming 24.0" in caplog.text
    expected = process_video(DecodedVideo(frames, fps=24.0), SMALL, LIMITS)
    assert torch.equal(video.pixel_values, expected.pixel_values)
    assert (video.grid_thw, video.group_timestamps_s) == (expected.grid_thw, expected.group_timestamps_s)


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        pytest.param(b"not a video at all" * 20, "not a video FFmpeg can decode", id="garbage-bytes"),
        pytest.param(b"", "not a video FFmpeg can decode", id="empty-bytes"),
        pytest.param("PNG", r"the data is an image, not a video; send it as an image", id="an-image-file"),
        pytest.param("PNG-BYTES", r"the data is an image, not a video; send it as an image \(an image_url part",
                     id="image-bytes"),
        pytest.param("MISSING", "no such file", id="missing-file"),
        pytest.param(DecodedVideo(np.zeros((4, 8, 8, 2), dtype=np.uint8), fps=2.0),
                     r"frames must be a \(T, H, W\), \(T, H, W, 1\), \(T, H, W, 3\) or \(T, H, W, 4\) array of uint8 "
                     r"levels or of floats in \[0, 1\]", id="two-channel-array"),
        pytest.param(DecodedVideo(np.zeros((4, 8, 8, 3), dtype=np.uint16), fps=2.0),
                     r"a video frame array must be uint8, or float in \[0, 1\]; got uint16: pass 16-bit levels as",
                     id="uint16-array"),
        pytest.param(DecodedVideo(np.full((4, 8, 8, 3), 255.0, dtype=np.float32), fps=2.0),
                     r"a video frame array of float32 must hold values in \[0, 1\] .* they look like 0\.\.255 levels",
                     id="float-levels"),
        pytest.param(DecodedVideo(torch.zeros(4, 3, 8, 8), fps=2.0), r"not a torch tensor: pass frames\.numpy\(\)",
                     id="torch-tensor"),
        pytest.param(DecodedVideo(np.zeros((0, 8, 8, 3), dtype=np.uint8), fps=2.0), "no frames", id="no-frames"),
        pytest.param(DecodedVideo(np.zeros((2, 8, 8, 3), dtype=np.uint8), fps=0.0), "fps=0.0", id="zero-fps"),
        pytest.param(DecodedVideo(np.zeros((2, 8, 8, 3), dtype=np.uint8), fps="30"), "fps='30' is invalid",
                     id="string-fps"),
        pytest.param(DecodedVideo(np.zeros((2, 8, 8, 3), dtype=np.uint8), fps=True), "fps=True", id="bool-fps"),
        pytest.param(DecodedVideo(np.zeros((2, 8, 8, 3), dtype=np.uint8), fps=float("inf")), "fps=inf",
                     id="infinite-fps"),
        # past the largest float: math.isfinite raised OverflowError
        pytest.param(DecodedVideo(np.zeros((2, 8, 8, 3), dtype=np.uint8), fps=10**400), "fps=10{400} is invalid",
                     id="integer-fps-past-float"),
        pytest.param((np.zeros((2, 8, 8, 3), dtype=np.uint8), {"fps": Fraction(10**400, 3)}),
                     r"fps=Fraction\(10{400}, 3\) is invalid", id="fraction-fps-past-float"),
        pytest.param(
            DecodedVideo([Image.new("RGB", (8, 8)), Image.new("RGB", (9, 8))], fps=2.0), "same size", id="mixed-sizes"
        ),
        pytest.param(3.5, "unsupported video input of type float", id="wrong-type"),
        # a generator of frames was consumed by the type check, then had no len(): a TypeError
        pytest.param(DecodedVideo((Image.new("RGB", (8, 8)) for _ in range(2)), fps=2.0), "or a list of PIL images",
                     id="generator-of-frames"),
    ],
)
def test_unusable_input_raises_a_decode_error_naming_the_item(payload, problem, tmp_path) -> None:
    if isinstance(payload, str) and payload == "PNG":
        payload = tmp_path / "still.png"
        Image.new("RGB", (32, 32)).save(payload)
    elif isinstance(payload, str) and payload == "MISSING":
        payload = tmp_path / "missing.mp4"
    elif isinstance(payload, str) and payload == "PNG-BYTES":
        encoded = io.BytesIO()
        Image.new("RGB", (32, 32)).save(encoded, "PNG")
        payload = encoded.getvalue()
    with pytest.raises(MediaDecodeError, match=problem) as raised:
        process_video(payload, SMALL, LIMITS, index=2)
    assert str(raised.value).startswith("video 2: ")
    assert isinstance(raised.value, RequestError)


def test_of_several_video_streams_the_one_ffmpeg_finds_best_is_read_as_the_reference_reads_it(tmp_path,
                                                                                              video_writer) -> None:
    """torchcodec decodes the stream av_find_best_stream picks; the first one was read, here a one-frame thumbnail
    track before the clip (no track flagged default: the one with several frames is best)."""
    import av

    clip = distinct_frames(12, 48, 64)
    path = tmp_path / "two.mkv"
    with av.open(str(path), "w", format="matroska") as output:
        thumbnail, video = output.add_stream("ffv1", rate=1), output.add_stream("ffv1", rate=4)
        thumbnail.height, thumbnail.width, video.height, video.width = 16, 16, 48, 64
        thumbnail.pix_fmt = video.pix_fmt = "bgr0"
        for stream, frames in ((thumbnail, distinct_frames(1, 16, 16, seed=1)), (video, clip)):
            for array in frames:
                output.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
            output.mux(stream.encode())
    with av.open(str(path)) as opened:
        assert opened.streams.best("video").index == 1
    alone = video_writer(tmp_path / "alone.mkv", clip)
    expected, got = process_video(alone, SMALL, LIMITS), process_video(path, SMALL, LIMITS)
    assert got.grid_thw == expected.grid_thw and torch.equal(got.pixel_values, expected.pixel_values)


def test_a_video_sent_as_an_image_is_refused_saying_so(tmp_path, video_writer) -> None:
    """As an image sent as a video is: it said only that the data is not an image format Glimmer reads."""
    clip = video_writer(tmp_path / "clip.mkv", distinct_frames(4)).read_bytes()
    processor = MediaProcessor(SMALL, LIMITS)
    with pytest.raises(MediaDecodeError, match=r"^image 0: the data is a video, not an image; send it as a video "
                                                r"\(a video_url part"):
        processor.process("<|patch|>", [clip])
    png = io.BytesIO()
    Image.fromarray(distinct_frames(1)[0]).save(png, "PNG")
    with pytest.raises(MediaDecodeError, match="^image 0: the image data is corrupt or truncated"):
        processor.process("<|patch|>", [png.getvalue()[:len(png.getvalue()) // 2]])


def test_truncated_file_raises_a_decode_error(tmp_path, video_writer) -> None:
    data = video_writer(tmp_path / "clip.mp4", distinct_frames(8), codec="libx264", container="mp4").read_bytes()
    with pytest.raises(MediaDecodeError, match="video 0: "):
        process_video(data[: len(data) // 3], SMALL, LIMITS)


def test_a_stream_of_an_unknown_codec_raises_a_decode_error(tmp_path, video_writer) -> None:
    """A codec id FFmpeg has no decoder for leaves PyAV's stream without a codec context; reading its size from
    that was an AttributeError, a 500 from the server."""
    data = video_writer(tmp_path / "clip.avi", distinct_frames(4, 16, 64), codec="mpeg4", container="avi").read_bytes()
    unknown = data.replace(b"FMP4", b"ZZZZ")  # the AVI stream header's and format's fourcc
    with pytest.raises(MediaDecodeError, match="video 1: the video's codec is unknown or has no decoder here"):
        process_video(unknown, SMALL, LIMITS, index=1)


def test_a_pil_frame_whose_lazy_decoding_fails_raises_a_decode_error(tmp_path) -> None:
    """Image.open decodes nothing: a truncated PNG frame opened so failed in the conversion with a bare OSError."""
    Image.fromarray(distinct_frames(1)[0]).save(tmp_path / "frame.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "frame.png").read_bytes()[:300])
    frames = [Image.open(tmp_path / "frame.png"), Image.open(tmp_path / "cut.png")]
    with pytest.raises(MediaDecodeError, match="video 1: cannot convert the image to RGB .*truncated"):
        process_video(DecodedVideo(frames, fps=2.0), SMALL, LIMITS, index=1)


def test_too_many_source_frames_raises_a_limit_error(tmp_path, video_writer) -> None:
    path = video_writer(tmp_path / "clip.mkv", distinct_frames(8, 28, 28))
    limits = MediaLimits(max_video_source_frames=7)
    with pytest.raises(MediaLimitError, match="video 0: the video has more than 7 frames"):
        process_video(path, SMALL, limits)
    with pytest.raises(MediaLimitError, match="more than 7 frames"):
        process_video(DecodedVideo(distinct_frames(8, 28, 28), fps=4.0), SMALL, limits)


def _with_empty_packets(frames: np.ndarray, empty: int) -> bytes:
    """A NUT file of `frames` (MPEG-4 Part 2, 10 fps) followed by `empty` packets that hold no data, about a byte
    each in NUT: a few MiB hold millions."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="nut") as output:
        stream = output.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.time_base = Fraction(1, 10)
        for array in frames:
            output.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        output.mux(stream.encode())
        for step in range(len(frames), len(frames) + empty):
            packet = av.Packet(0)
            packet.stream, packet.pts, packet.dts, packet.time_base = stream, step, step, Fraction(1, 10)
            output.mux(packet)
    return buffer.getvalue()


def test_packets_without_a_frame_are_bounded_as_frames_are(tmp_path, video_writer) -> None:
    """Empty packets and those an edit list discards were not counted: a file of a byte a packet made the decoder read
    millions of them (2 MB of empty NUT packets, 3 s) under the 18,000-frame limit."""
    limits = MediaLimits(max_video_source_frames=10)
    with pytest.raises(MediaLimitError, match="video 0: the video has more than 10 packets that hold no frame"):
        process_video(_with_empty_packets(distinct_frames(2, 16, 16), 11), SMALL, limits)
    levels = np.arange(30, dtype=np.uint8)[:, None, None, None] * 8
    source = video_writer(tmp_path / "source.mp4", np.broadcast_to(levels, (30, 56, 56, 3)).copy(), fps=10,
                          codec="libx264", container="mp4")
    # 25 packets discarded (and the demuxer's final flush packet, empty), 5 frames kept
    cut = cut_without_reencoding(source, tmp_path / "cut.mp4", 2.5)
    with pytest.raises(MediaLimitError, match="video 0: the video has more than 10 packets that hold no frame"):
        process_video(cut, SMALL, limits)
    assert process_video(cut, SMALL, MediaLimits(max_video_source_frames=30)).grid_thw[0] >= 1


def _with_audio_packets(frames: np.ndarray, audio_packets: int) -> bytes:
    """A NUT file of `frames` (MPEG-4 Part 2, 10 fps) followed by `audio_packets` empty packets of a PCM audio stream:
    about two bytes each, a few MiB hold millions."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="nut") as output:
        stream = output.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.time_base = Fraction(1, 10)
        audio = output.add_stream("pcm_s16le", rate=8000)
        for array in frames:
            output.mux(stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")))
        output.mux(stream.encode())
        for step in range(audio_packets):
            packet = av.Packet(0)
            packet.stream, packet.pts, packet.dts, packet.time_base = audio, step, step, Fraction(1, 8000)
            output.mux(packet)
    return buffer.getvalue()


class CancelledAfterChecks(CancelToken):
    """Cancelled once `checks` checks have passed."""

    def __init__(self, checks: int):
        super().__init__()
        self.checks_left = checks

    def check(self) -> None:
        self.checks_left -= 1
        if self.checks_left < 0:
            self.cancel()
        super().check()


def test_packets_of_other_streams_are_bounded_and_cancellable_as_the_videos_are() -> None:
    """PyAV's demux of the video stream skipped the audio, subtitle and data packets in C: neither counted nor
    cancellable, 64 MiB of empty audio packets held the decoder about 40 s. Every packet checks the cancellation now,
    and a file's other streams hold at most OTHER_STREAM_PACKETS_PER_FRAME per frame of max_video_source_frames."""
    frames = distinct_frames(4, 16, 16)
    limits = MediaLimits(max_video_source_frames=10)
    bound = OTHER_STREAM_PACKETS_PER_FRAME * 10
    with pytest.raises(Cancelled):
        process_video(_with_audio_packets(frames, bound), SMALL, limits, cancel=CancelledAfterChecks(bound // 2))
    with pytest.raises(MediaLimitError, match=f"video 0: the file has more than {bound:,} packets in streams other "
                                              r"than its video \(audio, subtitles, data\)"):
        process_video(_with_audio_packets(frames, bound + 1), SMALL, limits)
    alone = process_video(_with_audio_packets(frames, 0), SMALL, limits)
    with_audio = process_video(_with_audio_packets(frames, bound - 1), SMALL, limits)  # and the audio's flush packet
    assert with_audio.grid_thw == alone.grid_thw and torch.equal(with_audio.pixel_values, alone.pixel_values)


def test_too_many_pixels_per_frame_raises_a_limit_error(tmp_path, video_writer) -> None:
    path = video_writer(tmp_path / "clip.mkv", distinct_frames(2))
    with pytest.raises(MediaLimitError, match="video 0: 120×90 = 10,800 pixels per frame exceeds"):
        process_video(path, SMALL, MediaLimits(max_image_pixels=10_000))


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("wrap", [lambda a: a, lambda a: DecodedVideo(a, fps=2.0), lambda a: (a, {"fps": 2.0})],
                         ids=["array", "DecodedVideo", "frames-and-metadata"])
def test_one_image_s_array_given_as_a_video_is_refused_not_read_as_thin_grey_frames(channels, wrap):
    """An (H, W, 3) image array sent as a video, which the reference reads as one frame, was read as 60 grey frames
    90×3 pixels: 30 frame groups of an 8×2 grid, a silently other video."""
    image = np.random.default_rng(0).integers(0, 256, (60, 90, channels), dtype=np.uint8)
    with pytest.raises(MediaDecodeError) as refused:
        process_video(wrap(image), SMALL, LIMITS)
    wide = f"{channels} pixel{'s' * (channels > 1)} wide"
    assert str(refused.value) == (f"video 0: frames of shape (60, 90, {channels}) read as (T, H, W) would be 60 grey "
                                  f"frames {wide}; for one (H, W, {channels}) image as a one-frame video pass "
                                  "frames[None], or send it as an image; for grey frames pass (T, H, W, 1)")
    one_frame = process_video(DecodedVideo(image[None], fps=2.0), SMALL, LIMITS)
    assert one_frame.grid_thw[0] == 1
