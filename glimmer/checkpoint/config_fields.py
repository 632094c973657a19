"""The field reader under every config.json layout (`config_layouts.py`): a `Section` is one JSON object of the
file and the keys read from it, `Fields` the values read for one dataclass with each one's name in the file,
`Notes` what reading found besides values (missing fields, defaults taken, unknown keys, warnings), and the
checks of single values (`positive_int`, `checked_bool`, …) whose errors name the field as the file spells it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from glimmer.checkpoint.config import DAMAGED_CONFIG_FIX, is_finite, too_many_layers
from glimmer.errors import ConfigError

# Written by PreTrainedConfig.to_dict / save_pretrained or by training code; none changes what the model
# computes at inference, so they are accepted at every level without a warning.
_IGNORED_KEYS = frozenset(
    """
    transformers_version architectures dtype torch_dtype _name_or_path name_or_path _commit_hash
    _attn_implementation _attn_implementation_autoset attn_implementation output_attentions output_hidden_states
    return_dict chunk_size_feed_forward is_encoder_decoder is_decoder add_cross_attention cross_attention_hidden_size
    tie_encoder_decoder id2label label2id num_labels problem_type finetuning_task task_specific_params prefix
    tokenizer_class pruned_heads torchscript decoder_start_token_id sep_token_id
    use_cache initializer_range attention_dropout
    """.split()
) | {"quantization_config"}  # only ever null here: `config_layouts._detect_layout` refuses
# What `dtype` / `torch_dtype` may say: torch's floating-point dtype names, as transformers writes them (and
# "auto"). The field only records how the weights were saved: their own headers say what they hold, and Glimmer
# picks its compute dtype itself (LLM(dtype=...)), so another value is a warning naming it, not a refusal.
FLOAT_DTYPE_NAMES = frozenset(
    """auto bfloat16 float16 half float32 float float64 double float8_e4m3fn float8_e4m3fnuz float8_e5m2
    float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn_x2""".split()
)
# Keys that point at code shipped with the checkpoint (transformers' remote code, mlx-lm's custom model
# file). Glimmer never imports or executes such code; the keys are accepted with a warning saying so.
CODE_KEYS = ("auto_map", "model_file")

REQUIRED = object()
MISSING = object()


class Notes:
    """Everything found besides values: missing fields, defaults taken, unknown keys, other warnings."""

    def __init__(self, source: str, layout: str):
        self.source = source
        self.layout = layout
        self.missing: list[str] = []
        self.defaulted: list[str] = []
        self.unknown: list[str] = []
        self.warnings: list[str] = []

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {message}")

    def raise_if_missing(self) -> None:
        if not self.missing:
            return
        theta_hint = ""
        if any(name.endswith("rope_theta") for name in self.missing):
            theta_hint = (
                "; the rope theta is never defaulted: the reference class default (10000) is not the "
                "released value (500000), so take it from the checkpoint"
            )
        raise self.error(
            f"missing required field(s) {', '.join(self.missing)} for the {self.layout} layout; add them to "
            f"config.json{theta_hint}"
        )

    def all_warnings(self) -> tuple[str, ...]:
        out = []
        if self.defaulted:
            out.append(
                f"{self.source}: fields absent from the {self.layout} config took the reference defaults: "
                + ", ".join(self.defaulted)
            )
        if self.unknown:
            out.append(
                f"{self.source}: ignoring unknown keys (not part of the {self.layout} layout): "
                + ", ".join(self.unknown)
            )
        out.extend(f"{self.source}: {w}" for w in self.warnings)
        return tuple(out)


class Section:
    """One JSON object of config.json (the top level, text_config, vision_config) and the keys read from it."""

    def __init__(self, data: Mapping[str, Any], path: str, notes: Notes, names: Mapping[str, str] | None = None):
        """`names`: the file's name of each key of `data` that the file holds elsewhere (a key transformers moves
        into this object from the enclosing one)."""
        self.data = data
        self.prefix = f"{path}." if path else ""
        self.notes = notes
        self.names = names or {}
        self.read: set[str] = set()

    def path(self, key: str) -> str:
        return self.names.get(key, self.prefix + key)

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, *keys: str) -> tuple[str, Any]:
        """(key, value) of the first of `keys` present, or (keys[0], MISSING); aliases present must agree."""
        self.read.update(keys)
        found = [(key, self.data[key]) for key in keys if key in self.data]
        if not found:
            return keys[0], MISSING
        key, value = found[0]
        for other, other_value in found[1:]:
            if other_value != value:
                raise self.notes.error(
                    f"{self.path(key)}={value!r} and {self.path(other)}={other_value!r} disagree; they name the "
                    f"same field, keep one"
                )
        return key, value

    def ignore(self, *keys: str) -> None:
        self.read.update(keys)

    def finish(self) -> None:
        """Record the keys nobody read as unknown, and a dtype field that names no floating-point dtype."""
        self.notes.unknown.extend(
            self.path(key)
            for key in sorted(self.data)
            if key not in self.read and key not in _IGNORED_KEYS and key not in CODE_KEYS
        )
        self.notes.warnings.extend(dtype_field_warnings(self.data, self.prefix))


def dtype_field_warnings(section: Mapping[str, Any], prefix: str = "") -> list[str]:
    """A warning for each `dtype` / `torch_dtype` of `section` that is not a torch floating-point dtype name
    (FLOAT_DTYPE_NAMES); `prefix`: the section's path in the file, dot-terminated ("text_config.")."""
    return [
        f"ignoring {prefix}{key}={section[key]!r}: not a torch floating-point dtype name (such as 'bfloat16', "
        "'float16' or 'float32'); the weights' own dtypes are used, so fix the field if the file was edited"
        for key in ("dtype", "torch_dtype")
        if section.get(key) is not None and (not isinstance(section[key], str) or section[key] not in FLOAT_DTYPE_NAMES)
    ]


class Fields:
    """Values destined for one dataclass, and the name each has in the user's file (for error messages)."""

    def __init__(self, section: Section):
        self.section = section
        self.values: dict[str, Any] = {}
        self.names: dict[str, str] = {}

    def read(self, field: str, *keys: str, default: Any = REQUIRED) -> Any:
        key, value = self.section.get(*(keys or (field,)))
        self.names[field] = self.section.path(key)
        if value is MISSING:
            if default is REQUIRED:
                self.section.notes.missing.append(self.names[field])
            else:
                self.section.notes.defaulted.append(f"{self.names[field]}={default!r}")
                value = default
        self.values[field] = as_float(value) if isinstance(default, float) else value
        return value

    def read_nullable(self, field: str) -> Any:
        """A field for which absent and null both mean "none" (pad_token_id): absence is not a default."""
        _, value = self.section.get(field)
        self.names[field] = self.section.path(field)
        self.values[field] = None if value is MISSING else value
        return self.values[field]


def positive_int(value: Any, name: str, notes: Notes) -> int:
    if not is_int(value) or value <= 0:
        raise notes.error(f"{name}={value!r} is invalid; expected a positive integer")
    return value


def layer_count(value: Any, name: str, notes: Notes) -> int:
    """A positive number of layers of at most config.MAX_LAYERS, checked before anything is built per layer."""
    n = positive_int(value, name, notes)
    if problem := too_many_layers(name, n, "the 30B has 52"):
        raise notes.error(f"{problem}: the config is damaged; {DAMAGED_CONFIG_FIX}")
    return n


def checked_bool(value: Any, name: str, notes: Notes) -> bool:
    if not isinstance(value, bool):
        raise notes.error(f"{name}={value!r} is invalid; expected true or false")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def as_float(value: Any) -> Any:
    """JSON integers in float fields (rope_theta: 500000) become floats; anything else is left to validation (an
    integer past a float's range too, which the positive-number check refuses naming its field)."""
    return float(value) if is_int(value) and is_finite(value) else value


def token_ids(value: Any, name: str, notes: Notes) -> tuple[int, ...]:
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(is_int(v) and v >= 0 for v in ids):
        raise notes.error(f"{name}={value!r} is invalid; expected a token id or a list of token ids")
    return tuple(ids)


def square_grid(height: Any, height_name: str, width: Any, width_name: str, notes: Notes) -> Any:
    if height != width:
        raise notes.error(
            f"{height_name}={height!r} and {width_name}={width!r} differ; the reference assumes a square position "
            "grid (architecture.md §1.2), so Glimmer refuses a non-square one"
        )
    return height
