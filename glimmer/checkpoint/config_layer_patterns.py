"""Layer patterns of config.json (`config_layouts.py`): which text layers are NoPE (`rope_layers`), from
`layer_rope_theta`, `no_rope_layers`, `every_n_layers_nope` or the reference pattern, all of which must
agree; explicit `layer_types` and the flat schemas' `sliding_window_pattern`; and the periodic rules the
vendor and flat schemas write (NoPE every k-th layer, vision full attention every k-th layer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from glimmer.checkpoint.config import is_finite_number, reference_rope_layers
from glimmer.checkpoint.config_fields import MISSING, Notes, Section, is_int, positive_int

NOPE_PERIOD = 4  # the released period of both: NoPE every 4th text layer, full attention every 4th vision layer


def read_nope_sources(section: Section) -> dict[str, tuple[str, Any]]:
    """The raw NoPE descriptions present: key → (name in the file, value)."""
    sources = {}
    for key in ("layer_rope_theta", "no_rope_layers", "every_n_layers_nope"):
        _, value = section.get(key)
        if value is not MISSING and value is not None:
            sources[key] = (section.path(key), value)
    return sources


def resolve_nope(
    sources: Mapping[str, tuple[str, Any]], n: int, theta: Any, *, canonical: bool, notes: Notes
) -> tuple[bool, ...]:
    """The NoPE pattern (rope_layers) from whichever sources are present; all of them must agree."""
    patterns: list[tuple[str, tuple[bool, ...]]] = []
    if "layer_rope_theta" in sources:
        name, value = sources["layer_rope_theta"]
        patterns.append((name, _rope_from_layer_theta(value, name, n, theta, notes)))
    if "no_rope_layers" in sources:
        name, value = sources["no_rope_layers"]
        patterns.append((name, _rope_from_flags(value, name, n, notes)))
    if "every_n_layers_nope" in sources:
        name, value = sources["every_n_layers_nope"]
        period = positive_int(value, name, notes)
        patterns.append((f"{name}={period}", rope_with_period(n, period)))
    reference = ("the reference NoPE pattern (every 4th layer counted back from the last)", reference_rope_layers(n))
    if canonical and "layer_rope_theta" not in sources:
        # the reference derives layer_rope_theta when absent and never reads the vendor keys
        patterns.insert(0, reference)
    patterns = patterns or [reference]
    chosen_name, chosen = patterns[0]
    for name, pattern in patterns[1:]:
        if pattern != chosen:
            raise notes.error(
                f"{name} disagrees with {chosen_name} at layers {differences(pattern, chosen)}; both say which "
                f"layers are NoPE (full attention, no RoPE): make them agree or remove {name.split('=')[0]}"
            )
    return chosen


def _rope_from_layer_theta(value: Any, name: str, n: int, theta: Any, notes: Notes) -> tuple[bool, ...]:
    _check_per_layer_list(value, name, n, notes)
    bad = [v for v in value if not is_finite_number(v) or v < 0]
    if bad:
        raise notes.error(f"{name} contains {bad}; each entry must be 0 (NoPE) or a positive rope theta")
    if any(v != 0 and v != theta for v in value):
        notes.warnings.append(
            f"{name} has non-zero entries other than the global rope theta {theta!r}; the reference only "
            "distinguishes 0 (NoPE) from non-zero, so every RoPE layer uses the global theta"
        )
    return tuple(v != 0 for v in value)


def _rope_from_flags(value: Any, name: str, n: int, notes: Notes) -> tuple[bool, ...]:
    _check_per_layer_list(value, name, n, notes)
    bad = sorted({repr(v) for v in value if not is_int(v) or v not in (0, 1)})
    if bad:
        raise notes.error(
            f"{name} contains non-binary entries {', '.join(bad)}; each entry must be 1 (RoPE + sliding window) or "
            "0 (NoPE + full attention)"
        )
    return tuple(v == 1 for v in value)


def _check_per_layer_list(value: Any, name: str, n: int, notes: Notes) -> None:
    if not isinstance(value, list):
        raise notes.error(f"{name} must be a list with one entry per layer, got {type(value).__name__}")
    if len(value) != n:
        raise notes.error(
            f"{name} has {len(value)} entries but num_hidden_layers={n}; give one entry per layer or remove it "
            "to derive the reference pattern"
        )


def explicit_layer_types(value: Any, name: str, notes: Notes) -> tuple[str, ...] | None:
    if value is MISSING or value is None:
        return None
    if not isinstance(value, list):
        raise notes.error(f"{name} must be a list with one entry per layer, got {type(value).__name__}")
    return tuple(value)


def types_from_window_pattern(pattern: Any, n: int, window: Any, notes: Notes) -> tuple[str, ...]:
    """sliding_window_pattern [w, w, w, 0] repeated so that its last entry falls on the last layer."""
    if not isinstance(pattern, list) or not pattern or not all(is_int(v) and v >= 0 for v in pattern):
        raise notes.error(
            f"sliding_window_pattern={pattern!r} is invalid; expected a non-empty list of window sizes (0 = full)"
        )
    if any(v not in (0, window) for v in pattern):
        raise notes.error(
            f"sliding_window_pattern={pattern!r} has windows other than sliding_window={window!r}; Muse Glimmer "
            "uses one window size on every sliding layer"
        )
    k = len(pattern)
    return tuple("sliding_attention" if pattern[(i - n) % k] else "full_attention" for i in range(n))


def rope_with_period(n: int, period: int) -> tuple[bool, ...]:
    """The vendor's every_n_layers_nope rule: NoPE every `period`-th layer counted back from the last."""
    return tuple((n - 1 - i) % period != 0 for i in range(n))


def vision_types_with_period(n: int, period: int) -> tuple[str, ...]:
    """vision_sparse_attention_factor: full attention on every `period`-th layer and on the last one."""
    return tuple("full_attention" if (i + 1) % period == 0 or i == n - 1 else "window_attention" for i in range(n))


def find_period(pattern: Sequence[Any], rule: Callable[[int, int], tuple[Any, ...]]) -> int | None:
    """The period (4 preferred, else the smallest) for which `rule` reproduces `pattern`, if any."""
    n = len(pattern)
    for period in (NOPE_PERIOD, *range(1, n + 1)):
        if rule(n, period) == tuple(pattern):
            return period
    return None


def differences(a: Sequence[Any], b: Sequence[Any]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
