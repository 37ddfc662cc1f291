"""XML-style parameters typed by the request's tool schema; strings stay as written; a
value that does not fit is refused, never invented."""

import json

import pytest

from gateway.parsers.base import alnum_call_id
from gateway.parsers.typed_arguments import typed_arguments, typed_value


@pytest.mark.parametrize(
    ("raw", "schema", "value"),
    [
        ("3", {"type": "integer"}, 3),
        ("-12", {"type": "integer"}, -12),
        ("2.5", {"type": "number"}, 2.5),
        ("7", {"type": "number"}, 7),
        ("True", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ('{"a": [1, 2]}', {"type": "object"}, {"a": [1, 2]}),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("null", {"type": "null"}, None),
        ("null", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, None),
        ("4", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, 4),
        ("4", {"type": ["null", "integer"]}, 4),
        ("null", {"type": ["string", "null"]}, None),
        (" 3 ", {"type": "string"}, " 3 "),
        ("line 1\nline 2", {"type": "string"}, "line 1\nline 2"),
        ("3", None, "3"),
        ("3", {"description": "no type"}, "3"),
        ("b", {"enum": ["a", "b"]}, "b"),
        ('{"x": 1}', {"properties": {"x": {"type": "integer"}}}, {"x": 1}),
    ],
)
def test_values_take_their_declared_type(raw: str, schema: dict | None, value: object) -> None:
    assert typed_value(raw, schema) == value
    assert type(typed_value(raw, schema)) is type(value)


@pytest.mark.parametrize(
    ("raw", "schema"),
    [
        ("three", {"type": "integer"}),
        ("2.5", {"type": "integer"}),
        ("yes", {"type": "boolean"}),
        ("[1]", {"type": "object"}),
        ("{bad", {"type": "array"}),
        ("x", {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
    ],
)
def test_a_value_that_does_not_fit_is_refused(raw: str, schema: dict) -> None:
    with pytest.raises(ValueError, match="is not"):
        typed_value(raw, schema)


def test_arguments_of_one_call() -> None:
    tools = {"grep": {"type": "object", "properties": {"n": {"type": "integer"}}}}
    text = typed_arguments(tools, "grep", {"n": "5", "pattern": "é 5"})
    assert json.loads(text) == {"n": 5, "pattern": "é 5"}
    assert "é" in text  # literal, as the templates' tojson prints it


def test_alnum_ids_are_deterministic_and_fit_mistral() -> None:
    ids = {alnum_call_id("c1", i) for i in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 9 and i.isalnum() and i.isascii() for i in ids)
    assert alnum_call_id("c1", 3) == alnum_call_id("c1", 3) != alnum_call_id("c2", 3)
