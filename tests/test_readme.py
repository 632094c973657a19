"""The README's quick-start test command is exactly what CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    lines = (ROOT / "README.md").read_text().splitlines()
    marker = lines.index("# the test suite")
    return lines[marker + 1].strip()


def test_ci_runs_the_readme_test_command():
    command = _readme_test_command()
    assert "pytest" in command
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci_lines
