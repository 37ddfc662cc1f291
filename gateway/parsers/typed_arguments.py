"""Typing the parameters of formats that write every value as text (the XML-like tool
calls of Qwen3-Coder/Qwen3.5, GLM and MiniMax): each value is read by the JSON schema the
request declared for it, so `<parameter=count>3</parameter>` reaches the agent as `3`, not
`"3"`. Strings stay exactly as written.

A value that does not fit its declared type raises `ValueError`: the parser then hands the
whole call back as text with a parse note, rather than inventing a value the model did
not write. A parameter the schema does not declare stays a string (the model wrote text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_INTEGER = re.compile(r"-?\d+")


def parameter_schema(
    tools: Mapping[str, Mapping[str, Any]], tool: str, parameter: str
) -> Mapping[str, Any] | None:
    """The declared schema of one parameter, or None when the request says nothing."""
    properties = tools.get(tool, {}).get("properties")
    if not isinstance(properties, Mapping):
        return None
    schema = properties.get(parameter)
    return schema if isinstance(schema, Mapping) else None


def _types(schema: Mapping[str, Any]) -> list[str]:
    """The JSON types a schema admits, in declared order (`anyOf`/`oneOf` flattened)."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    found: list[str] = []
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            if isinstance(option, Mapping):
                found += [t for t in _types(option) if t not in found]
    if not found and "enum" in schema:
        found = sorted({_json_type(v) for v in schema["enum"]})
    if not found and ("properties" in schema):
        found = ["object"]
    return found


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _as(kind: str, raw: str) -> Any:
    text = raw.strip()
    if kind == "string":
        return raw
    if kind == "null":
        if text in ("null", "None"):  # "None": how templates that print Python values spell it
            return None
    elif kind == "integer":
        if _INTEGER.fullmatch(text):
            return int(text)
    elif kind == "number":
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            return int(text) if _INTEGER.fullmatch(text) else number
    elif kind == "boolean":
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
    elif kind in ("object", "array"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            pass
        else:
            if isinstance(value, dict if kind == "object" else list):
                return value
    raise ValueError(f"{raw!r} is not a {kind}")


def typed_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """`raw` read as its schema's type; a nullable type accepts `null` too. Raises
    `ValueError` naming the types when no declared type fits."""
    kinds = _types(schema) if schema is not None else []
    if not kinds:
        return raw
    if "string" in kinds and not ("null" in kinds and raw.strip() == "null"):
        return raw  # text that may be a string is one, even "None"
    # `null` first: a nullable integer given "null" means None, not a failed integer.
    for kind in sorted(kinds, key=lambda k: k != "null"):
        try:
            return _as(kind, raw)
        except ValueError:
            continue
    raise ValueError(f"{raw.strip()!r} is not {' or '.join(kinds)}")


def typed_arguments(
    tools: Mapping[str, Mapping[str, Any]], tool: str, parameters: Mapping[str, str]
) -> str:
    """The JSON arguments of one call whose parameters were written as text; `ValueError`
    names the argument that does not fit."""
    typed: dict[str, Any] = {}
    for key, raw in parameters.items():
        try:
            typed[key] = typed_value(raw, parameter_schema(tools, tool, key))
        except ValueError as exc:
            raise ValueError(f"argument {key!r} of {tool!r}: {exc}") from None
    return json.dumps(typed, ensure_ascii=False)
