"""One error for every way a checkpoint's tensors fail to match what its config (or GGUF metadata) describes.

A checkpoint of another model fails on thousands of names at once, so the message leads with one line of counts,
lists the first `LISTED_PER_KIND` names of each kind of problem, and ends with the likely fix, chosen from the
kinds found. Each format (safetensors, GGUF) words its fixes in a `MismatchAdvice`; the layout of the message and
the choice of fix are the same for all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# names listed per kind of problem; the count says how many more
LISTED_PER_KIND = 10


@dataclass(frozen=True)
class MismatchAdvice:
    """How one checkpoint format titles its kinds of problem and what fixes each (a sentence after `fix: `)."""

    unmapped_title: str  # a parameter the layout has no source name for
    unsupported_title: str  # names the dtypes or tensor types that are read
    other_model_fix: str  # missing and unexpected tensors together: another model's or another layout's names
    other_size_fix: str  # wrong shapes: the config describes another size of model
    incomplete_fix: str  # missing tensors only
    extra_fix: str  # unexpected tensors only
    unsupported_fix: str
    unmapped_fix: str


@dataclass
class WeightMismatch:
    """What matching a checkpoint's tensors against its config found; each item is one line naming a tensor."""

    unmapped: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return any((self.unmapped, self.missing, self.unexpected, self.mismatched, self.unsupported))

    def message(self, subject: str, advice: MismatchAdvice, fix: str | None = None) -> str:
        """`subject: <counts>`, then up to `LISTED_PER_KIND` names of each kind, then `fix: ...` (`fix`, where the
        caller knows better than the kinds found, else the advice's for the most telling kind)."""
        kinds = [
            (self.unmapped, "with no source", advice.unmapped_title),
            (self.missing, "missing", "missing tensors"),
            (self.unexpected, "unexpected", "unexpected tensors"),
            (self.mismatched, "of the wrong shape", "shape mismatches"),
            (self.unsupported, "of an unsupported type", advice.unsupported_title),
        ]
        counts = ", ".join(f"{len(items)} {label}" for items, label, _ in kinds if items)
        lines = [f"{subject}: {counts}", *(_listed(title, items) for items, _, title in kinds if items),
                 f"fix: {fix or self._fix(advice)}"]
        return "\n  ".join(lines)

    def _fix(self, advice: MismatchAdvice) -> str:
        """The fix for the most telling kind of problem found."""
        if self.missing and self.unexpected:
            return advice.other_model_fix
        if self.mismatched:
            return advice.other_size_fix
        if self.missing:
            return advice.incomplete_fix
        if self.unexpected:
            return advice.extra_fix
        if self.unsupported:
            return advice.unsupported_fix
        return advice.unmapped_fix


def _listed(title: str, items: list[str]) -> str:
    shown = items[:LISTED_PER_KIND]
    more = [f"… and {len(items) - len(shown)} more"] if len(items) > len(shown) else []
    return f"{title} ({len(items)}):\n    " + "\n    ".join([*shown, *more])
