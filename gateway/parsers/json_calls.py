"""What the JSON tool-call formats share: one JSON value filling a block, a
`{"name", "arguments"}` object, and arguments kept as written once known to be an object.
Each raises `ValueError` saying what is wrong; `TaggedParser` turns that into the block's
parse note."""

from __future__ import annotations

import json
from typing import Any

from gateway import json_text

_DECODER = json.JSONDecoder()


def whole_json(body: str) -> Any:
    """The one JSON value `body` holds (surrounding whitespace allowed)."""
    body = body.strip()
    try:
        value, end = _DECODER.raw_decode(body)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg})") from None
    if end != len(body):
        raise ValueError("unexpected text after the JSON")
    return value


def json_call(obj: Any) -> tuple[str, str]:
    """(name, arguments JSON) of a `{"name", "arguments"|"parameters"}` object; raises
    `ValueError` saying what is missing. An object is re-serialised the way the chat
    templates' `tojson` prints it, so an echo re-renders identically; a JSON string is
    kept as written."""
    if not isinstance(obj, dict):
        raise ValueError("tool call JSON is not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("tool call has no name")
    args = obj.get("arguments")
    if args is None:
        args = obj.get("parameters")
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            raise ValueError(f"arguments of {name!r} are a string but not JSON") from None
        if not isinstance(decoded, dict):
            raise ValueError(f"arguments of {name!r} are not a JSON object")
        return name, args
    if isinstance(args, dict):
        return name, json.dumps(args, ensure_ascii=False)
    raise ValueError(f"arguments of {name!r} are not an object")


def json_object_text(arguments: str) -> str:
    """The arguments as the model wrote them, once they are known to be a JSON object
    (empty text means no arguments: `{}`); raises `ValueError` saying why not."""
    if not arguments.strip():
        return "{}"
    try:
        value = json_text.loads(arguments, allow_nan=True)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not JSON ({exc.msg})") from None
    except ValueError as exc:  # JSON the Gateway cannot hold (deep nesting, lone surrogates)
        raise ValueError(f"arguments refused: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError("arguments are not a JSON object")
    return arguments
