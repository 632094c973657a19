"""Preprocessor settings from checkpoint files, and request limits."""

from __future__ import annotations

import json
import logging

import pytest

from glimmer.checkpoint.config import VisionConfig, reference_vision_layer_types
from glimmer.errors import ConfigError
from glimmer.multimodal import MediaLimits, MediaSettings, checkpoint_media_settings, load_media_settings
from glimmer.multimodal.settings import MediaFetchPolicy

# what transformers' save_pretrained writes for the released processors (architecture.md §6, §7)
IMAGE_CONFIG = {
    "image_processor_type": "MuseGlimmerImageProcessor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_image_tokens": 4096,
    "merge_size": 2,
    "patch_size": 14,
    "processor_class": "MuseGlimmerProcessor",
    "resample": 1,
    "rescale_factor": 0.00392156862745098,
    "size": None,
    "temporal_patch_size": 2,
}
VIDEO_CONFIG = {
    "video_processor_type": "MuseGlimmerVideoProcessor",
    "do_sample_frames": True,
    "fps": 2.0,
    "frame_timestamp_format": "Time: {timestamp:.1f}s",
    "max_video_frame_tokens": 144,
    "merge_size": 2,
    "num_frames": 96,
    "patch_size": 14,
    "resample": 1,
    "temporal_patch_size": 2,
}


def vision_config(patch_size: int = 14) -> VisionConfig:
    return VisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        patch_size=patch_size,
        patch_temporal=2,
        merge_size=2,
        pos_emb_size=4,
        rope_theta=10000.0,
        layer_norm_eps=1e-5,
        hidden_act="gelu",
        layer_types=reference_vision_layer_types(4),
    )


def test_released_configs_give_the_defaults() -> None:
    assert load_media_settings(IMAGE_CONFIG, VIDEO_CONFIG) == MediaSettings()
    assert load_media_settings() == MediaSettings()


def test_defaults_are_the_released_values() -> None:
    settings = MediaSettings()
    assert (settings.patch_size, settings.temporal_patch_size, settings.merge_size) == (14, 2, 2)
    assert (settings.max_image_tokens, settings.max_video_frame_tokens) == (4096, 144)
    assert (settings.video_max_frames, settings.video_sample_fps) == (96, 2.0)
    assert settings.resize_factor == 28


def test_checkpoint_values_are_honoured() -> None:
    settings = load_media_settings(
        {**IMAGE_CONFIG, "max_image_tokens": 1024}, {**VIDEO_CONFIG, "num_frames": 32, "fps": 1.0}
    )
    assert settings.max_image_tokens == 1024
    assert settings.video_max_frames == 32 and settings.video_sample_fps == 1.0


def test_one_number_for_mean_and_std_is_every_channels() -> None:
    """HF processors take `image_mean: 0.5` as (0.5, 0.5, 0.5), in both files."""
    one_number = {"image_mean": 0.5, "image_std": 0.5}
    assert load_media_settings({**IMAGE_CONFIG, **one_number}, {**VIDEO_CONFIG, **one_number}) == MediaSettings()


def test_nested_processor_config_is_read() -> None:
    nested = {"image_processor": {**IMAGE_CONFIG, "max_image_tokens": 256}, "video_processor": VIDEO_CONFIG}
    assert load_media_settings(nested).max_image_tokens == 256


NESTED = {"image_processor": {**IMAGE_CONFIG, "max_image_tokens": 256},
          "video_processor": {**VIDEO_CONFIG, "max_video_frame_tokens": 100}}
OLDER_IMAGE = {**IMAGE_CONFIG, "max_image_tokens": 1024}
OLDER_VIDEO = {**VIDEO_CONFIG, "max_video_frame_tokens": 64}


@pytest.mark.parametrize(
    "files",
    [
        # a repository saved again by transformers 5: the nested sections, and older files that differ
        {"processor_config.json": NESTED, "preprocessor_config.json": OLDER_IMAGE,
         "video_preprocessor_config.json": OLDER_VIDEO},
        {"processor_config.json": {"image_processor": NESTED["image_processor"]},
         "preprocessor_config.json": OLDER_IMAGE, "video_preprocessor_config.json": OLDER_VIDEO},
        {"processor_config.json": {"processor_class": "MuseGlimmerProcessor"},
         "preprocessor_config.json": OLDER_IMAGE, "video_preprocessor_config.json": OLDER_VIDEO},
        {"processor_config.json": NESTED},
        {"preprocessor_config.json": OLDER_IMAGE},
    ],
)
def test_a_checkpoints_files_are_found_as_transformers_finds_them(tmp_path, files) -> None:
    """QA: a checkpoint holding both processor_config.json's sections and the older preprocessor_config.json /
    video_preprocessor_config.json was read from the older files, which transformers reads only where a section is
    missing: another token budget than the reference's, silently."""
    image_processing = pytest.importorskip("transformers.image_processing_base")
    video_processing = pytest.importorskip("transformers.video_processing_utils")
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    image, _ = image_processing.ImageProcessingMixin.get_image_processor_dict(str(tmp_path))
    video, _ = video_processing.VideoProcessorMixin.get_video_processor_dict(str(tmp_path))
    assert checkpoint_media_settings(tmp_path, vision_config()) == load_media_settings(image, video)


@pytest.mark.parametrize("files", [{}, {"video_preprocessor_config.json": VIDEO_CONFIG},
                                   {"processor_config.json": {"video_processor": VIDEO_CONFIG}}])
def test_a_checkpoint_without_an_image_processor_config_warns_that_it_takes_the_released_settings(tmp_path, caplog,
                                                                                                  files) -> None:
    """transformers refuses to build the processor without one; Glimmer took the released settings silently."""
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    with caplog.at_level(logging.WARNING, logger="glimmer.multimodal.settings"):
        assert checkpoint_media_settings(tmp_path, vision_config()).max_image_tokens == 4096
    assert f"{tmp_path} has no image processor config (preprocessor_config.json" in caplog.text


@pytest.mark.parametrize("files", [{"preprocessor_config.json": IMAGE_CONFIG},
                                   {"processor_config.json": {"image_processor": IMAGE_CONFIG}}])
def test_a_checkpoint_with_its_image_processor_config_loads_it_without_a_warning(tmp_path, caplog, files) -> None:
    for name, content in files.items():
        (tmp_path / name).write_text(json.dumps(content))
    with caplog.at_level(logging.WARNING, logger="glimmer.multimodal.settings"):
        checkpoint_media_settings(tmp_path, vision_config())
    assert caplog.text == ""


@pytest.mark.parametrize(
    ("image", "video", "message"),
    [
        ({**IMAGE_CONFIG, "resample": 3}, {}, "resample=3 is not supported"),
        ({**IMAGE_CONFIG, "do_normalize": False}, {}, "do_normalize=False is not supported"),
        ({}, {**VIDEO_CONFIG, "do_sample_frames": False}, "do_sample_frames=False is not supported"),
        ({**IMAGE_CONFIG, "patch_size": 16}, VIDEO_CONFIG, "disagree on patch_size"),
        ({**IMAGE_CONFIG, "max_image_tokens": 0}, {}, "max_image_tokens=0 is invalid"),
        ({}, {**VIDEO_CONFIG, "frame_timestamp_format": "Time: {ts}"}, "frame_timestamp_format"),
        ({**IMAGE_CONFIG, "image_std": [0.5, 0.5]}, {}, "image_std"),
        ({**IMAGE_CONFIG, "image_mean": True}, {}, "image_mean=True is invalid"),
        ({}, {**VIDEO_CONFIG, "frame_timestamp_format": 5}, "frame_timestamp_format=5 is invalid"),
        # a JSON integer past the largest float: math.isfinite raised OverflowError
        ({}, {**VIDEO_CONFIG, "fps": 10**400}, "video_sample_fps=1" + "0" * 400 + " is invalid"),
        ({**IMAGE_CONFIG, "image_std": [10**400, 0.5, 0.5]}, {}, "image_std=(1" + "0" * 400 + ", 0.5, 0.5"),
        # processor_config.json's sections that are not objects were an AttributeError
        ({"image_processor": "x"}, {}, "processor_config.json: image_processor must be a JSON object, not str"),
        ({"image_processor": IMAGE_CONFIG, "video_processor": [VIDEO_CONFIG]}, {},
         "processor_config.json: video_processor must be a JSON object, not list"),
    ],
)
def test_unsupported_or_inconsistent_values_raise_config_error(image, video, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_media_settings(image, video)


def test_patch_geometry_must_match_the_vision_tower() -> None:
    MediaSettings().check_matches(vision_config())
    with pytest.raises(ConfigError, match="patch_size=14 disagrees with vision_config.patch_size=16"):
        MediaSettings().check_matches(vision_config(patch_size=16))


def test_limits_validate_themselves() -> None:
    assert MediaLimits().max_media_tokens is None
    with pytest.raises(ConfigError, match="max_video_source_frames=0"):
        MediaLimits(max_video_source_frames=0)


@pytest.mark.parametrize(("width", "height", "fix"), [
    (1, 300, "crop or pad the image to at most 200:1 before sending it (the server's --max-image-aspect-ratio sets "
             "the limit)"),
    (20_000, 20, "downscale the image before sending it"),
    (12_000, 12_000, "downscale the image before sending it")], ids=["aspect-ratio", "side", "pixels"])
def test_a_media_limit_error_names_the_fix_that_meets_that_limit(width, height, fix) -> None:
    """QA: a 1×300 image was told to "downscale or crop", but downscaling keeps the aspect ratio that was refused."""
    from glimmer.multimodal import MediaLimitError

    with pytest.raises(MediaLimitError) as err:
        MediaLimits().check_frame_size("image", 0, width, height)
    assert str(err.value).endswith(f"; {fix}")


@pytest.mark.parametrize("blank", ["", "  ", "\t"])
def test_a_blank_media_directory_is_refused_where_every_policy_is_made(blank, tmp_path) -> None:
    """MediaFetchPolicy.create took "" as the working directory (every image under it readable); the CLI and LLM(...)
    each refused it first, in words of their own, and said "'  ' is empty, which would name the current directory"
    of a path naming a folder of two spaces."""
    with pytest.raises(ConfigError) as refused:
        MediaFetchPolicy.create([tmp_path, blank])
    assert str(refused.value) == (f"allowed_local_media_path: {blank!r} is blank (empty or white space alone, as an "
                                  "unset variable's \"$DIR\" gives), which names no directory meant; give the "
                                  "directories whose images and videos may be named")
    assert MediaFetchPolicy.create([tmp_path]).allowed_local_paths == (tmp_path.resolve(),)
