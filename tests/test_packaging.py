"""pyproject.toml: what `pip install glimmer` asks for and what the built wheel and sdist hold."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _dependency_floor(name: str) -> Version:
    """The lowest version of the base dependency `name` that pyproject.toml admits (its `>=` bound)."""
    for line in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.name == name:
            floors = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
            assert floors, f"{line}: no >= bound"
            return max(floors)
    raise AssertionError(f"{name} is not a dependency")


def test_pydantic_floor_is_the_first_release_that_applies_fail_fast_to_the_request_schemas_dicts():
    """The request schemas stop validating a list or dict at its first bad entry (`Field(fail_fast=True)` on
    `dict[str, float]` and `dict[str, str]`, glimmer/server/schemas.py). The floor was pydantic 2.6, so pip kept an
    installed 2.6 to 2.13: with 2.6 and 2.7 fail_fast was ignored (a long list of bad entries held the event loop
    for seconds again), with 2.8 to 2.13 `glimmer serve` ended at import in pydantic's traceback ("Unable to apply
    constraint 'fail_fast' to schema of type 'dict'"), and with 2.14.0 and 2.14.1 a logit_bias past its cap was named
    `logit_bias.4097` in the 400. 2.14.2 is the first release the schemas' tests pass with."""
    assert _dependency_floor("pydantic") >= Version("2.14.2")
