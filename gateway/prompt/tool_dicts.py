"""Tools as a template sees them, converted once per distinct tool list, their JSON once.

An agent sends the same tools on every call, and most templates write each one with
`tojson`: with 15 agent-sized tools that was most of a window render. `ToolDicts` keeps
the dicts of the last few tool lists (deep copies, so a caller changing its `Tool` later
cannot change them) and, for those dicts and everything inside them, the text of each
`tojson` call. The sandbox forbids templates to change a dict or list, so the same object
with the same arguments serialises to the same text every time.

A tool list is recognised by its orjson text, taken in field order: templates write keys
in order. orjson writes NaN and infinities as `null`, so where that text holds a `null`
the parameters must also compare equal (NaN equals nothing, not even a NaN, save itself).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import orjson

from gateway.canonical import Tool

__all__ = [
    "RecentTexts",
    "ToolDicts",
    "ToolList",
    "tool_dict",
    "tools_text",
]

T = TypeVar("T")

_NULL_VALUES = (b":null", b",null", b"[null")
"""How a `null` value shows in orjson's compact text (or a string holding one)."""


def tool_dict(tool: Tool) -> dict[str, Any]:
    """A tool as transformers hands it to a template (OpenAI's function form)."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.parameters
    return {"type": "function", "function": function}


def _containers(value: Any) -> list[Any]:
    """`value` and every dict and list inside it."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict | list):
            found.append(item)
            stack.extend(item.values() if isinstance(item, dict) else item)
    return found


def tools_text(tools: Sequence[Tool]) -> bytes | None:
    """The tools' fields as orjson text, in their order (None: orjson cannot write them).
    Equal texts are equal tool lists, save NaN and infinities, which orjson writes as a
    `null` value (`_has_null_value`)."""
    try:
        return orjson.dumps(
            [(t.name, t.description is None, t.description or "", t.parameters) for t in tools]
        )
    except (TypeError, orjson.JSONEncodeError):
        return None


class ToolList(tuple[Tool, ...]):
    """Tools with their `tools_text`, taken once for everything that plans one request."""

    text: bytes | None

    def __new__(cls, tools: Sequence[Tool]) -> ToolList:
        self = super().__new__(cls, tools)
        self.text = tools_text(self)
        return self


def _has_null_value(text: bytes) -> bool:
    """Whether orjson's compact `text` may hold a `null` value (or a string showing one)."""
    return any(null in text for null in _NULL_VALUES)


class RecentTexts(Generic[T]):
    """Values kept for the last `size` texts, found again by an equal text: comparing a
    30 KB text to a few held ones costs less than hashing it for a dict."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: list[tuple[bytes, T]] = []

    def get(self, text: bytes) -> T | None:
        for known, value in reversed(self._items):
            if known == text:
                return value
        return None

    def put(self, text: bytes, value: T) -> T | None:
        """Keep `value` for `text`; returns the value dropped to make room, if any."""
        self._items.append((text, value))
        if len(self._items) > self._size:
            return self._items.pop(0)[1]
        return None


class ToolDicts:
    """The dicts of the last `max_lists` tool lists, and a `tojson` remembering their text.

    `tojson` (the template's filter) answers from memory for these dicts and their parts,
    and with `dumps` for anything else. Safe to use from several threads.
    """

    def __init__(self, dumps: Callable[..., str], max_lists: int = 8) -> None:
        self._dumps = dumps
        self._lists: RecentTexts[tuple[list[dict[str, Any]], bool]] = RecentTexts(max_lists)
        self._texts: dict[int, tuple[Any, dict[tuple[Any, ...], str]]] = {}
        self._lock = threading.Lock()

    def dicts(self, tools: Sequence[Tool]) -> list[dict[str, Any]]:
        """The tools as template dicts: the remembered ones for a list seen before."""
        if not tools:
            return []
        key = tools.text if isinstance(tools, ToolList) else tools_text(tools)
        if key is None:
            return [tool_dict(t) for t in tools]
        known = self._lists.get(key) or self._remember(key, tools)
        dicts, nulls = known
        if nulls and any(
            t.parameters != d["function"]["parameters"] for t, d in zip(tools, dicts, strict=True)
        ):
            return [tool_dict(t) for t in tools]
        return dicts

    def _remember(self, key: bytes, tools: Sequence[Tool]) -> tuple[list[dict[str, Any]], bool]:
        with self._lock:
            known = self._lists.get(key)
            if known is None:
                known = copy.deepcopy([tool_dict(t) for t in tools]), _has_null_value(key)
                for part in _containers(known[0]):
                    self._texts[id(part)] = part, {}
                dropped = self._lists.put(key, known)
                for old in _containers(dropped[0] if dropped else None):
                    del self._texts[id(old)]
        return known

    def tojson(
        self,
        value: Any,
        ensure_ascii: bool = False,
        indent: int | str | None = None,
        separators: Sequence[str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        """The `tojson` filter: `dumps`, remembered for the dicts of `dicts`."""
        known = self._texts.get(id(value))
        if known is None or known[0] is not value:
            return self._dumps(value, ensure_ascii, indent, separators, sort_keys)
        args = (ensure_ascii, indent, separators, sort_keys)
        try:
            key = (
                ensure_ascii,
                indent,
                None if separators is None else tuple(separators),
                sort_keys,
            )
            text = known[1].get(key)
        except TypeError:  # arguments `dumps` may take but a dict key cannot be: no memory
            return self._dumps(value, *args)
        if text is None:
            text = known[1][key] = self._dumps(value, *args)
        return text
