"""JSON text from a client, parsed so that nothing in it can crash the Gateway later.

Python's `json` accepts what the rest of the Gateway cannot handle: nesting deep enough to
exhaust recursion (in the parser itself, in pydantic's serializer when a call is recorded,
in a template's `tojson`), and `\\ud800` escapes that become lone surrogates (the tokenizer
and the record writer cannot encode them), integers past 64 bits (orjson, which writes
records, retry keys and engine payloads, cannot encode them); it also takes `NaN` and
`Infinity`, which are not JSON. `loads` refuses all of them with a `ValueError` naming the
field path, so callers that already treat bad JSON as a client error (a 400, or "not JSON,
keep the text") need nothing else. Request bodies, tool-call arguments and opaque tokens
echoed by clients go through it.

The fast path is pydantic-core's parser, which itself refuses lone surrogates and nesting
past its recursion limit; only text it refuses is parsed again, slowly, to say exactly
what is wrong and where.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic_core

__all__ = ["MAX_JSON_DEPTH", "UnsafeJsonError", "loads"]

MAX_JSON_DEPTH = 200
"""Deepest nesting of arrays and objects accepted: pydantic-core's parser limit (it takes
one more level of arrays). Real requests, tool schemas included, stay far below; pydantic's
serializer, which writes the recorded calls, gives up near 255."""

_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
"""Where a lone surrogate can come from: a `\\uD800`-style escape, or a surrogate already in
the text (bytes decoded with `surrogatepass`)."""

_SURROGATE = re.compile(r"[\ud800-\udfff]")

_MAYBE_BIG_INT = re.compile(r"\d{19}")
"""Where an integer past 64 bits can come from: a run of 19 digits (2**63 has 19)."""

_DIGITS_AS_ONES = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_DIGIT_RUN = b"1" * 19


def _has_digit_run(text: str | bytes) -> bool:
    """Whether the text holds 19 ASCII digits in a row (JSON numbers are ASCII). Mapping
    every byte to digit-or-not and searching the run is ~10x faster than the regex, which
    took most of a large body's parse."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return data.translate(_DIGITS_AS_ONES).find(_DIGIT_RUN) >= 0


INT_RANGE = (-(2**63), 2**64 - 1)
"""Integers the Gateway holds: what orjson encodes (int64 and uint64)."""


class UnsafeJsonError(ValueError):
    """Well-formed JSON the Gateway cannot safely hold; `path` is the offending field
    (`messages[0].content`), "" for the whole text."""

    def __init__(self, problem: str, path: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.problem = problem
        self.path = path


def loads(text: str | bytes, *, allow_nan: bool = False) -> Any:
    """Parse JSON, refusing deep nesting, lone surrogates and (unless `allow_nan`, as for
    tool-call arguments, where Python's `json` always took them) `NaN`/`Infinity`.

    Raises `UnsafeJsonError` for those and `ValueError` (`JSONDecodeError`,
    `UnicodeDecodeError`) for text that is not JSON at all. Bytes must be UTF-8.
    """
    try:
        data = pydantic_core.from_json(text, allow_inf_nan=allow_nan)
    except ValueError:
        return _explain(text, allow_nan)
    if _has_digit_run(text):
        _check_tree(data, surrogates=False, big_ints=True)
    return data


def _explain(text: str | bytes, allow_nan: bool) -> Any:
    """The slow path for text the fast parser refused: raise the precise error, or return
    the value if Python's parser and our checks accept it after all."""
    if isinstance(text, bytes):  # surrogates encoded in the bytes pass, to be named below
        text = text.decode("utf-8", "surrogatepass")
    constant = None if allow_nan else _reject_constant
    try:
        data = json.loads(text, parse_constant=constant)
    except RecursionError as exc:
        raise UnsafeJsonError(_too_deep(), "") from exc
    _check_tree(
        data,
        surrogates=_MAYBE_SURROGATE.search(text) is not None,
        big_ints=_MAYBE_BIG_INT.search(text) is not None,
    )
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _too_deep() -> str:
    return f"arrays and objects nest deeper than {MAX_JSON_DEPTH} levels"


def _lone_surrogate(what: str) -> str:
    return (
        f"{what} contains a lone UTF-16 surrogate (e.g. an unpaired \\ud800 escape), "
        "which is not valid Unicode; send well-formed UTF-8 text"
    )


def _big_int(value: Any) -> bool:
    return type(value) is int and not INT_RANGE[0] <= value <= INT_RANGE[1]


def _too_big(value: int) -> str:
    digits = str(value)
    shown = digits if len(digits) <= 24 else f"{digits[:24]}…"
    return f"the integer {shown} does not fit in 64 bits"


def _check_tree(data: Any, *, surrogates: bool, big_ints: bool = False) -> None:
    """Depth limit, and (when the text may hold one) no lone surrogate in any key or string
    and no integer past 64 bits. Iterative, so no input can exhaust the stack here."""
    if not isinstance(data, dict | list):
        if surrogates and isinstance(data, str) and _SURROGATE.search(data):
            raise UnsafeJsonError(_lone_surrogate("text"), "")
        if big_ints and _big_int(data):
            raise UnsafeJsonError(_too_big(data), "")
        return
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise UnsafeJsonError(_too_deep(), path)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            if surrogates and isinstance(key, str) and _SURROGATE.search(key):
                raise UnsafeJsonError(_lone_surrogate(f"key {key!r}"), path)
            if isinstance(child, dict | list):
                stack.append((child, _child_path(path, key), depth + 1))
            elif surrogates and isinstance(child, str) and _SURROGATE.search(child):
                raise UnsafeJsonError(_lone_surrogate("text"), _child_path(path, key))
            elif big_ints and _big_int(child):
                raise UnsafeJsonError(_too_big(child), _child_path(path, key))


def _child_path(path: str, key: int | str) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key
