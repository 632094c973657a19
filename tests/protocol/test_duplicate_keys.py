"""first_duplicate_key: the path of a key an object of JSON text gives twice (RFC 8259 §4 leaves its meaning open)."""

import pytest

from glimmer.protocol.duplicate_keys import first_duplicate_key


@pytest.mark.parametrize(("text", "path"), [
    ('{"city": "Paris", "city": "Oslo"}', "city"),
    ('{"a": {"b": 1, "b": 2}, "a": 3}', "a"),  # outer objects first
    ('{"list": [{"x": 1}, {"y": 1, "y": 2}]}', "list[1].y"),
    (b'[{"k": 1, "k": 1}]', "[0].k"),
])
def test_the_first_repeated_key_is_named_by_its_path(text, path):
    assert first_duplicate_key(text) == path


@pytest.mark.parametrize("text", ['{"a": 1, "b": {"a": 2}}', "[1, 2]", '"text"', '{"a": [{"a": 1}, {"a": 2}]}'])
def test_keys_repeated_only_across_objects_are_no_duplicates(text):
    assert first_duplicate_key(text) is None
