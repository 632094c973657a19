"""docs/: the specifications the code cites ship with it, and every citation names something they hold."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CITING = [ROOT / "README.md", *sorted((ROOT / "glimmer").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py")),
          *sorted((ROOT / "tests").rglob("*.py"))]


def _cited_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in CITING if path != Path(__file__).resolve())


def _sections(doc: str) -> dict[str, str]:
    """Each numbered heading's number (`2.5` of `### 2.5 Attention`) and the text up to the next heading."""
    text = (DOCS / doc).read_text(encoding="utf-8")
    parts = re.split(r"^#{2,4} ", text, flags=re.M)
    return {m[1]: part for part in parts[1:] if (m := re.match(r"(\d+(?:\.\d+)*)\.? ", part))}


def _resolves(number: str, sections: dict[str, str]) -> bool:
    """A heading numbered `number`, or an item numbered with its last part in the section of the rest
    (`2.5.2`: item `2.` of §2.5; `14.22`: item `22.` of §14)."""
    if number in sections:
        return True
    parent, _, item = number.rpartition(".")
    item_line = rf"^\s*(\*\*)?{item}\."
    return bool(parent) and parent in sections and re.search(item_line, sections[parent], re.M) is not None


def _citations(doc: str) -> set[str]:
    return set(re.findall(rf"{re.escape(doc)},? ?§ ?(\d+(?:\.\d+)*)", _cited_text()))


def test_every_architecture_section_the_code_cites_is_in_docs():
    """The code's `architecture.md §N` citations name sections (or numbered items of one) of docs/architecture.md;
    before, the document lived outside the repository and a clone could resolve none of them."""
    sections, cited = _sections("architecture.md"), _citations("architecture.md")
    assert len(cited) > 20
    assert sorted(number for number in cited if not _resolves(number, sections)) == []


def test_every_protocol_section_the_code_cites_is_in_docs():
    sections, cited = _sections("protocol.md"), _citations("protocol.md")
    assert len(cited) > 5
    assert sorted(number for number in cited if not _resolves(number, sections)) == []


def test_every_requirement_id_the_code_cites_is_defined_in_protocol_md():
    """`P-REQ-4`-style ids in code, tests and README are requirements protocol.md defines (a bold `**P-X-N**`)."""
    defined = set(re.findall(r"\*\*(P-[A-Z]+-\d+)\*\*", (DOCS / "protocol.md").read_text(encoding="utf-8")))
    cited = set(re.findall(r"\bP-[A-Z]+-\d+\b", _cited_text()))
    assert len(defined) > 40 and len(cited) > 40
    assert sorted(cited - defined) == []


def test_the_readme_points_to_the_documents_and_the_errata_name_real_sections():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("docs/architecture.md", "docs/protocol.md", "docs/ERRATA.md"):
        assert name in readme and (ROOT / name).is_file()
    errata = (DOCS / "ERRATA.md").read_text(encoding="utf-8")
    for doc in ("architecture.md", "protocol.md"):
        sections = _sections(doc)
        for number in re.findall(rf"{re.escape(doc)} §(\d+(?:\.\d+)*)", errata):
            assert _resolves(number, sections), (doc, number)
