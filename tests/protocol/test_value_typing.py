"""ATEM values typed by the tool's JSON schema (protocol.md §4.5, P-VAL-1..4)."""

import json

import pytest

from glimmer.protocol.value_typing import allowed_types, object_shape, parameter_value_json


def typed(raw, schema, root=None):
    return json.loads(parameter_value_json(raw, schema, root or {}))


@pytest.mark.parametrize(
    "raw", ['{"span": "a", "name": "b"}', "42", "true", "null", "  padded\n", "[1, 2]", "", "NaN"]
)
def test_string_parameter_is_verbatim_and_untrimmed_even_when_it_looks_like_json(raw):
    """P-VAL-1: a JSONL line written to a file stays a string (the seed's SchemaError)."""
    assert typed(raw, {"type": "string"}) == raw


def test_string_parameter_allowing_null_maps_only_the_exact_text_null():
    schema = {"type": ["string", "null"]}
    assert typed("null", schema) is None
    assert typed(" null", schema) == " null"
    assert typed("Null", schema) == "Null"


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        (" 3 ", {"type": "integer"}, 3),
        ("3.0", {"type": "integer"}, 3),
        ("1e2", {"type": "integer"}, 100),
        ("2.5", {"type": "number"}, 2.5),
        ("7", {"type": "number"}, 7),
        ("\ttrue\n", {"type": "boolean"}, True),
        ("null", {"type": "null"}, None),
        ('{"a": [1, {"b": null}]}', {"type": "object"}, {"a": [1, {"b": None}]}),
        ('[1, "x"]', {"type": "array"}, [1, "x"]),
    ],
)
def test_non_string_parameters_are_strict_json_of_an_allowed_type(raw, schema, expected):
    """P-VAL-2: stripped text parsed as strict JSON; an integral number satisfies integer (as an integer)."""
    value = typed(raw, schema)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("raw", "schema"),
    [
        ("2.5", {"type": "integer"}),
        ("yes", {"type": "boolean"}),
        ('"5"', {"type": "integer"}),
        ("[1]", {"type": "object"}),
        ("{'a': 1}", {"type": "object"}),
        ("  tru e ", {"type": "boolean"}),
        ("1", {"type": "boolean"}),
        ("true", {"type": "integer"}),
    ],
)
def test_values_that_do_not_fit_the_schema_fall_back_to_the_raw_untrimmed_string(raw, schema):
    assert typed(raw, schema) == raw


@pytest.mark.parametrize(("raw", "expected"), [
    ("1e23", "100000000000000000000000"),  # the float 1e23 is 99999999999999991611392
    ("12345678901234567890.0", "12345678901234567890"),  # its float, 12345678901234567168
    (" -4.5e22 ", "-45000000000000000000000"),
    ("1.0000000000000000001", '"1.0000000000000000001"'),  # no integer, though its float is 1.0
])
def test_an_integer_parameter_is_the_integer_the_text_says_not_its_float(raw, expected):
    """P-VAL-2: an integral number satisfies integer, emitted as an integer: the model's number, not the one its
    float rounds it to (the call gave a tool another integer than the model wrote); a number that is no integer
    keeps its text."""
    assert parameter_value_json(raw, {"type": "integer"}, {}) == expected


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "[1e400]", '{"a": NaN}'])
def test_non_finite_numbers_fall_back_to_strings_so_arguments_stay_valid_json(raw):
    """P-VAL-4: serialization refuses non-finite numbers; the arguments are always valid JSON."""
    for schema in ({"type": "number"}, {"type": ["number", "array", "object"]}, None):
        text = parameter_value_json(raw, schema, {})
        assert json.loads(text, parse_constant=refuse_non_finite) == raw


def refuse_non_finite(name):
    raise AssertionError(f"{name} is not JSON")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        (" [1, 2] ", [1, 2]),
        ("42", "42"),
        ("true", "true"),
        ("{not json", "{not json"),
        ("  text ", "  text "),
    ],
)
def test_undeclared_parameters_decode_only_objects_and_arrays(raw, expected):
    """P-VAL-3: without a schema only text starting with { or [ that parses to one becomes JSON."""
    assert typed(raw, None) == expected
    assert typed(raw, {"description": "no type information"}) == expected


def test_types_come_from_type_enum_const_any_of_one_of_and_local_refs():
    """§4.5: allowed types from `type`, `enum`/`const` values, `anyOf`/`oneOf` members, local `$ref`."""
    root = {
        "$defs": {"Count": {"type": "integer"}, "Mode": {"enum": ["fast", 2]}},
        "definitions": {"Flag": {"const": True}},
    }
    assert allowed_types({"$ref": "#/$defs/Count"}, root) == {"integer"}
    assert allowed_types({"$ref": "#/$defs/Mode"}, root) == {"string", "integer"}
    assert allowed_types({"$ref": "#/definitions/Flag"}, root) == {"boolean"}
    assert allowed_types(
        {"anyOf": [{"type": "integer"}, {"oneOf": [{"type": "null"}, {"const": 1.5}]}]}, root
    ) == {"integer", "null", "number"}
    assert allowed_types({"$ref": "https://example.org/remote.json"}, root) == set()


def test_enum_of_integers_types_the_value_as_an_integer():
    assert typed("2", {"enum": [1, 2, 3]}) == 2


def test_enum_with_strings_keeps_the_raw_text():
    assert typed("2", {"enum": ["2", 3]}) == "2"


def test_recursive_ref_does_not_loop_forever():
    root = {"$defs": {"Loop": {"$ref": "#/$defs/Loop"}}}
    assert typed("[1]", {"$ref": "#/$defs/Loop"}, root) == [1]


def test_deeply_nested_json_never_raises():
    deep = "[" * 5000 + "]" * 5000
    assert typed(deep, {"type": "array"}) == deep


@pytest.mark.parametrize("raw", ['{"x": "\\ud800"}', '["\\udfff"]', '"\\ud83d"'])
def test_json_holding_a_lone_surrogate_falls_back_to_the_raw_string(raw):
    """A lone surrogate cannot be encoded as UTF-8: arguments holding one could not be sent (P-VAL-4)."""
    for schema in ({"type": "object"}, {"type": "array"}, None):
        text = parameter_value_json(raw, schema, {})
        assert json.loads(text) == raw and text.encode()


def test_the_properties_of_root_alternatives_are_the_objects_properties():
    """A root `anyOf`/`oneOf` of object shapes declares the properties a call may write: each of the `anyOf` of its
    declarations where the root declares none (the root's own holds), required where every member requires it, a
    `$ref` member read in the root; a member pointing back to the root is read once."""
    root = {"type": "object", "properties": {"a": {"type": "integer"}},
            "oneOf": [{"$ref": "#/$defs/B"}, {"properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                                               "required": ["b", "c"]}, {"$ref": "#"}],
            "$defs": {"B": {"properties": {"b": {"type": "null"}}, "required": ["c"]}}}
    properties, required = object_shape(root)
    assert properties == {"a": {"type": "integer"}, "b": {"anyOf": [{"type": "null"}, {"type": "string"}]}}
    assert required == set()  # the member `#` (the root again) requires nothing more
    assert object_shape({**root, "oneOf": root["oneOf"][:2]})[1] == {"c"}
    assert object_shape({"anyOf": [{"$ref": "#"}, {"$ref": "#"}]}) == ({}, set())
