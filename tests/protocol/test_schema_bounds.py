"""Bounds no value meets, in the schemas every instance needs (engine/schema_bounds.py), and how a strict schema with
them is refused (engine/grammar.py's checks of a strict schema and of a strict tool's parameters)."""

from __future__ import annotations

import pytest

from glimmer.engine.grammar import check_json_schema, check_tool_parameters
from glimmer.errors import RequestError
from glimmer.protocol.schema_bounds import empty_bounds, endless_reference, without_references_to_empty


def _required(schema: dict) -> dict:
    return {"type": "object", "properties": {"x": schema}, "required": ["x"]}


@pytest.mark.parametrize(("schema", "reason"), [
    ({"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3},
     "no integer lies between exclusiveMinimum 2 and exclusiveMaximum 3"),
    ({"type": "integer", "minimum": 2.5, "maximum": 2.9}, "no integer lies between minimum 2.5 and maximum 2.9"),
    ({"type": "integer", "minimum": -2.9, "maximum": -2.5}, "no integer lies between minimum -2.9 and maximum -2.5"),
    ({"type": "integer", "exclusiveMinimum": 2, "maximum": 2.5},
     "no integer lies between exclusiveMinimum 2 and maximum 2.5"),
    ({"type": "integer", "minimum": 3, "maximum": 5, "multipleOf": 7},
     "no integer multiple of multipleOf 7 lies between minimum 3 and maximum 5"),
    ({"type": "integer", "minimum": 1, "maximum": 5, "multipleOf": 2.5, "exclusiveMaximum": 5},
     "no integer multiple of multipleOf 2.5 lies between minimum 1 and exclusiveMaximum 5"),
    ({"type": "number", "minimum": 0.15, "maximum": 0.19, "multipleOf": 0.1},
     "no multiple of multipleOf 0.1 lies between minimum 0.15 and maximum 0.19"),
    ({"type": "number", "exclusiveMinimum": 0.3, "exclusiveMaximum": 0.6, "multipleOf": 0.3},
     "no multiple of multipleOf 0.3 lies between exclusiveMinimum 0.3 and exclusiveMaximum 0.6"),
    ({"type": "number", "minimum": 1, "exclusiveMaximum": 1}, "minimum 1 is not below exclusiveMaximum 1"),
    ({"type": "integer", "minimum": 2, "exclusiveMinimum": 2, "maximum": 2}, "exclusiveMinimum 2 is not below"),
    ({"type": "string", "minLength": 4, "maxLength": 2}, "minLength 4 is above maxLength 2"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "minItems 3 is above maxItems 1"),
])
def test_bounds_no_value_meets_are_named_with_their_path(schema, reason):
    assert empty_bounds(_required(schema)) == (".properties.x", empty_bounds(schema)[1])
    assert empty_bounds(schema)[1].startswith(reason), empty_bounds(schema)


@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": 2, "maximum": 2},
    {"type": "integer", "exclusiveMinimum": 2, "maximum": 3},
    {"type": "integer", "minimum": 2.5, "maximum": 3},
    {"type": "integer", "minimum": 3, "maximum": 5, "multipleOf": 2.5},  # 5
    {"type": "integer", "minimum": 0, "maximum": 0.5, "multipleOf": 0.3},  # 0
    {"type": "number", "minimum": 0.1, "maximum": 0.3, "multipleOf": 0.2},  # 0.2, read as the decimal written
    {"type": "number", "exclusiveMinimum": 2, "exclusiveMaximum": 3},
    {"type": ["integer", "string"], "exclusiveMinimum": 2, "exclusiveMaximum": 3},  # a string is still free
    {"type": ["integer", "null"], "minimum": 2.5, "maximum": 2.9},
    {"type": "string", "minimum": 4, "maximum": 2},  # numeric bounds of no number
    {"minLength": 4, "maxLength": 2},  # no type: a number meets it
    {"type": "integer", "minimum": 3, "multipleOf": 7},
])
def test_bounds_some_value_meets_are_taken(schema):
    assert empty_bounds(_required(schema)) is None
    check_json_schema(_required(schema), "response_format", strict=True)


PAST_FLOAT_RANGE = 10**400  # an integer JSON holds exactly that float() cannot convert


@pytest.mark.parametrize(("schema", "reason"), [
    ({"type": "integer", "minimum": PAST_FLOAT_RANGE + 1, "maximum": PAST_FLOAT_RANGE}, "is above maximum"),
    ({"type": "integer", "exclusiveMinimum": PAST_FLOAT_RANGE, "maximum": PAST_FLOAT_RANGE}, "is not below maximum"),
    ({"type": "number", "minimum": 1.5, "maximum": -PAST_FLOAT_RANGE}, "minimum 1.5 is above maximum"),
    ({"type": "integer", "minimum": 1, "maximum": 5, "multipleOf": PAST_FLOAT_RANGE}, "no integer multiple"),
    ({"type": "array", "minItems": PAST_FLOAT_RANGE + 1, "maxItems": PAST_FLOAT_RANGE}, "minItems 1000"),
])
def test_integers_past_the_float_range_are_compared_exactly(schema, reason):
    """Bounds were made floats (math.isfinite), an OverflowError past the float range, a 500 for the request."""
    assert reason in empty_bounds(_required(schema))[1]


@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": PAST_FLOAT_RANGE, "maximum": PAST_FLOAT_RANGE + 1},
    {"type": "array", "items": {"type": "string"}, "minItems": PAST_FLOAT_RANGE},
    {"type": "array", "prefixItems": [{"type": "string"}], "minItems": PAST_FLOAT_RANGE},
    {"type": "number", "minimum": 0.5, "maximum": 1, "multipleOf": 0.5, "exclusiveMaximum": PAST_FLOAT_RANGE},
])
def test_bounds_past_the_float_range_some_value_meets_are_taken(schema):
    assert empty_bounds(_required(schema)) is None
    referring = {"$defs": {"a": schema}, "anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}
    assert without_references_to_empty(referring) is referring


EMPTY = {"type": "integer", "exclusiveMinimum": 2, "exclusiveMaximum": 3}


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "$defs": {"unused": EMPTY}},
    {"type": "object", "properties": {"x": {"anyOf": [{"$ref": "#/$defs/gap"}, {"type": "null"}]}}, "required": ["x"],
     "$defs": {"gap": EMPTY}},
    {"type": "object", "properties": {"x": {"oneOf": [EMPTY, {"type": "string"}]}}, "required": ["x"]},
    {"type": "object", "properties": {"x": EMPTY}},  # optional: `{}` meets the schema
    {"type": "object", "properties": {"x": {"type": "array", "items": EMPTY}}, "required": ["x"]},  # `[]`
    {"type": "object", "properties": {"x": {"type": "array", "prefixItems": [{"type": "string"}, EMPTY],
                                            "minItems": 1}}, "required": ["x"]},
])
def test_a_strict_schema_met_by_some_value_is_taken_whatever_its_unneeded_schemas_bound(schema):
    """Unused `$defs`, a `$ref` inside one `anyOf` branch, optional properties and items an array may leave out were
    refused for their bounds (a 400 for a schema many values meet)."""
    assert empty_bounds(schema) is None
    check_json_schema(schema, "response_format", strict=True)


@pytest.mark.parametrize(("schema", "path"), [
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/gap"}}, "required": ["x"], "$defs": {"gap": EMPTY}},
     ".$defs.gap"),
    ({"type": "object", "properties": {"x": {"allOf": [{"type": "integer"}, EMPTY]}}, "required": ["x"]},
     ".properties.x.allOf[1]"),
    ({"type": "object", "properties": {"x": {"type": "array", "items": EMPTY, "minItems": 1}}, "required": ["x"]},
     ".properties.x.items"),
    ({"type": "object", "properties": {"x": {"type": "array", "prefixItems": [{"type": "string"}, EMPTY],
                                            "minItems": 2}}, "required": ["x"]}, ".properties.x.prefixItems[1]"),
    ({"$ref": "#/definitions/Root", "definitions": {"Root": {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": EMPTY}, "required": ["b"]}}, "required": ["a"]}}},
     ".definitions.Root.properties.a.properties.b"),
])
def test_a_strict_schema_every_instance_of_which_needs_empty_bounds_is_refused_naming_their_path(schema, path):
    """The grammar engine refused these as "required property 'x' is unsatisfiable", naming the schema's root."""
    with pytest.raises(RequestError) as raised:
        check_json_schema(schema, "response_format", strict=True)
    assert raised.value.param == f"response_format{path}"
    assert str(raised.value).startswith(f"response_format{path}: no integer lies between exclusiveMinimum 2 and "
                                        "exclusiveMaximum 3")


def test_a_recursive_schema_is_walked_once():
    tree = {"type": "object", "properties": {"child": {"$ref": "#"}, "n": {"type": "integer", "minimum": 1,
                                                                            "maximum": 0}}, "required": ["child"]}
    assert empty_bounds(tree) is None


def test_a_strict_tools_optional_parameter_with_empty_bounds_is_refused_naming_them():
    """A call may write any parameter, each as a value of its own, so an optional one whose bounds no value meets is
    refused as a required one is: naming the bounds, where the check with it required said only "no value"."""
    parameters = {"type": "object", "properties": {"a": {"type": "string"}, "x": {"$ref": "#/$defs/gap"}},
                  "required": ["a"], "$defs": {"gap": EMPTY}}
    with pytest.raises(RequestError) as raised:
        check_tool_parameters(parameters, "tools[1].function.parameters", strict=True)
    assert raised.value.param == "tools[1].function.parameters.$defs.gap"
    assert "no integer lies between exclusiveMinimum 2 and exclusiveMaximum 3" in str(raised.value)
    with pytest.raises(RequestError) as raised:
        check_tool_parameters(parameters, "tools[1].function.parameters")
    assert raised.value.param == "tools[1].function.parameters.properties.x"
    check_tool_parameters({**parameters, "$defs": {"gap": EMPTY, "free": {"type": "integer"}},
                           "properties": {"a": {"type": "string"}, "x": {"$ref": "#/$defs/free"}}},
                          "tools[1].function.parameters", strict=True)


SELF = {"$ref": "#/$defs/a"}
NO_END = {"type": "object", "properties": {"b": {"$ref": "#/$defs/a"}}, "required": ["b"]}


@pytest.mark.parametrize(("schema", "path", "reference"), [
    ({"type": "object", "properties": {"a": SELF}, "required": ["a"], "$defs": {"a": SELF}}, ".properties.a",
     "#/$defs/a"),
    ({"type": "object", "properties": {"a": SELF}, "required": ["a"], "$defs": {"a": NO_END}}, ".properties.a",
     "#/$defs/a"),
    ({"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}, ".properties.x", "#"),
    ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, ".items", "#"),
    ({"type": "object", "properties": {"a": {"anyOf": [SELF, {"$ref": "#/$defs/b"}]}}, "required": ["a"],
      "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"type": "array", "items": SELF, "minItems": 2}}},
     "", ""),
])
def test_a_reference_cycle_with_no_end_is_refused_naming_the_reference(schema, path, reference):
    """The grammar engine took these, which only an endless value meets: a forced call of such a parameter was cut
    short by max_tokens (a 500), an answer stopped mid-way with "NoExtensionBias" or at its first token."""
    assert endless_reference(schema) == (path, reference)
    with pytest.raises(RequestError) as raised:
        check_json_schema(schema, "response_format")
    assert "leads back to itself with no way out" in str(raised.value)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": SELF}, "$defs": {"a": SELF}},  # optional: `{}` meets it
    {"type": "object", "properties": {"a": SELF}, "required": ["a"], "$defs": {"a": {**NO_END, "required": []}}},
    {"type": "object", "properties": {"a": SELF}, "required": ["a"],
     "$defs": {"a": {"anyOf": [{"type": "null"}, {"type": "array", "items": SELF, "minItems": 1}]}}},
    {"type": "object", "properties": {"a": SELF}, "required": ["a"], "$defs": {"a": {**NO_END, "type": ["object",
                                                                                                 "null"]}}},
    {"type": "object", "properties": {"x": {"$ref": "#"}}},
    {"type": "array", "items": {"$ref": "#"}},
    {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}, "required": ["a"]},
])
def test_a_reference_cycle_a_finite_value_leaves_is_taken(schema):
    assert endless_reference(schema) is None


def test_a_tools_required_or_optional_parameter_of_an_endless_reference_is_refused_naming_it():
    parameters = {"type": "object", "properties": {"a": SELF, "b": {"type": "string"}}, "required": ["a"],
                  "$defs": {"a": SELF}}
    with pytest.raises(RequestError) as raised:
        check_tool_parameters(parameters, "tools[0].function.parameters")
    assert raised.value.param == "tools[0].function.parameters.properties.a"
    with pytest.raises(RequestError) as raised:
        check_tool_parameters({**parameters, "required": ["b"]}, "tools[0].function.parameters")
    assert raised.value.param == "tools[0].function.parameters.properties.a"
