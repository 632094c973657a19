"""The RoPE scaling of a text config (`config_common_fields.read_rope_parameters`): the fields of `rope_parameters` (or
the legacy `rope_scaling`) that transformers' ROPE_INIT_FUNCTIONS read for each `rope_type`, checked as the reference
needs them, into a `RopeScaling`.

Each type's keys follow transformers 5.23's validation: a required key that is missing is refused (transformers
raises KeyError); `original_max_position_embeddings`, which transformers' standardization fills in, may be absent
(the model then takes max_position_embeddings). `partial_rotary_factor` is only honoured by the proportional type:
the default type ignores it (the whole head rotates) and the other types' tables would not fit the head, which fails
the reference's forward, so it is refused there.
"""

from __future__ import annotations

from typing import Any

from glimmer.checkpoint.config import RopeScaling, is_finite_number
from glimmer.checkpoint.config_fields import MISSING, Notes, Section, is_int

# rope_type → (required keys, optional keys), beside rope_type and rope_theta
_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ()),
    "yarn": (("factor",), ("original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
                           "mscale_all_dim", "truncate")),
    "longrope": (("short_factor", "long_factor"), ("original_max_position_embeddings", "attention_factor", "factor")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor"), ("original_max_position_embeddings",)),
    "proportional": ((), ("factor", "partial_rotary_factor")),
}
# transformers' ROPE_INIT_FUNCTIONS (5.23), which the reference's rotary table takes from rope_parameters.rope_type;
# a tuple, as a rope_type read from JSON may be unhashable (a list)
ROPE_SCALING_TYPES = tuple(_KEYS)
# keys whose null the reference reads as absent (`dict.get`); yarn and longrope derive a null factor from
# max_position_embeddings / the original length. Any other null fails the reference's table, so it is refused.
_NULL_AS_ABSENT = {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"}
_NULL_FACTOR_TYPES = ("yarn", "longrope")


def warn_partial_rotary_ignored(notes: Notes, name: str, partial: Any) -> None:
    """Warns that `partial` (a partial_rotary_factor named `name`, MISSING where absent) is ignored, unless it is
    absent, null or 1: the reference's default RoPE rotates the whole head."""
    if partial not in (MISSING, None, 1):
        notes.warnings.append(f"{name}={partial!r} is ignored, as the reference's default RoPE ignores it: the whole "
                              "head is rotated")


def read_rope_scaling(sub: Section, kind: str, kind_name: str) -> RopeScaling | None:
    """The scaling `sub` (a rope_parameters object of rope_type `kind`, named `kind_name`) describes; None for the
    default type. Raises ConfigError naming the key for a missing or invalid one."""
    notes = sub.notes
    _, partial = sub.get("partial_rotary_factor")
    if kind == "default":
        warn_partial_rotary_ignored(notes, sub.path("partial_rotary_factor"), partial)
        return None
    if kind not in ROPE_SCALING_TYPES:
        raise notes.error(
            f"{kind_name}={kind!r} is not supported; transformers knows 'default' and {list(ROPE_SCALING_TYPES)}"
        )
    if kind != "proportional" and partial not in (MISSING, None, 1):
        raise notes.error(
            f"{sub.path('partial_rotary_factor')}={partial!r} is not supported with rope_type {kind!r}: the "
            "reference's table then covers part of the head while its attention rotates all of it, and its forward "
            "fails; "
            "remove it (only 'proportional' rotates part of the head)"
        )
    required, optional = _KEYS[kind]
    values: dict[str, Any] = {}
    for key in (*required, *optional):
        _, value = sub.get(key)
        if value is MISSING:
            if key in required:
                raise notes.error(f"{sub.path(key)} is missing; rope_type {kind!r} needs {list(required)}")
            continue
        if value is None:
            if key in _NULL_AS_ABSENT or (key == "factor" and kind in _NULL_FACTOR_TYPES):
                continue
            raise notes.error(f"{sub.path(key)} is null; give a value or remove it")
        values[key] = _checked(key, value, sub.path(key), notes)
    return RopeScaling(rope_type=kind, **values)


def _checked(key: str, value: Any, name: str, notes: Notes) -> Any:
    if key == "truncate":
        if not isinstance(value, bool):
            raise notes.error(f"{name}={value!r} is invalid; expected true or false")
        return value
    if key == "original_max_position_embeddings":
        if not is_int(value) or value <= 0:
            raise notes.error(f"{name}={value!r} is invalid; expected a positive integer")
        return value
    if key in ("short_factor", "long_factor"):
        if not isinstance(value, list) or not value or not all(is_finite_number(v) and v > 0 for v in value):
            raise notes.error(f"{name} must be a non-empty list of positive numbers, got {value!r}")
        return tuple(float(v) for v in value)
    if not is_finite_number(value):
        raise notes.error(f"{name}={value!r} is invalid; expected a finite number")
    if key in ("factor", "partial_rotary_factor") and value <= 0:
        raise notes.error(f"{name}={value!r} is invalid; expected a positive number")
    if key in ("beta_fast", "beta_slow") and value < 0:
        raise notes.error(f"{name}={value!r} is invalid; expected a number >= 0 (0 takes yarn's default)")
    return float(value)


