"""Tool name resolution against the request's tools (P-NAME-1)."""

import pytest

from glimmer.protocol.tool_registry import ToolRegistry


def registry(*names):
    return ToolRegistry(
        [{"type": "function", "function": {"name": name, "parameters": {}}} for name in names]
    )


def test_exact_match_resolves():
    assert registry("calendar.lookup").resolve("calendar.lookup") == "calendar.lookup"


@pytest.mark.parametrize(
    ("declared", "written", "resolved"),
    [
        ("lookup", "lookup.lookup", "lookup"),
        ("cal.find", "cal.cal.find", "cal.find"),
    ],
)
def test_template_doubled_first_segment_collapses_onto_a_registered_name(declared, written, resolved):
    """P-NAME-1: the template lists a bare tool as "lookup.*", so the model writes `lookup.lookup`."""
    assert registry(declared).resolve(written) == resolved


def test_registered_names_are_never_collapsed():
    assert registry("lookup", "lookup.lookup").resolve("lookup.lookup") == "lookup.lookup"


@pytest.mark.parametrize(
    "written",
    [
        "find",
        "calendar.find.x",
        "x.calendar.find",
        "cal.find.find",
        "lookup.lookup.lookup",
        "other.lookup",
        "lookup.",
        ".lookup",
        "",
    ],
)
def test_no_suffix_head_or_fuzzy_matching(written):
    """P-NAME-1: otherwise unresolved (suffix and head matching would bind the wrong tool)."""
    assert registry("calendar.find", "cal.find", "lookup").resolve(written) is None


def test_bare_and_wrapped_tools_are_read_and_malformed_entries_skipped():
    tools = [
        {"name": "bare", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
        {"type": "function", "function": {"name": "wrapped"}},
        {"type": "function", "function": "broken"},
        "junk",
        None,
        {"description": "nameless"},
    ]
    tools_view = ToolRegistry(tools)
    assert tools_view.names == ["bare", "wrapped"]
    assert tools_view.declares_parameter("bare", "q")
    assert not tools_view.declares_parameter("wrapped", "q")
    assert tools_view.parameter_schema("bare", "q") == ({"type": "string"}, tools[0]["parameters"])
    assert tools_view.parameter_schema("wrapped", "q") == (None, {})


def test_no_tools_is_falsy():
    assert not ToolRegistry(None)
    assert not ToolRegistry([])
