"""Request bodies whose resent history is not parsed again.

An agent resends its whole conversation on every call, and its SDK serialises the same
objects to the same bytes: a call's body is the last one's up to the end of its history
array (`messages` or `input`), new items, and the last one's bytes from the array's close
on (tools, sampling fields). `ResentBodies` keeps, per body it loaded, those two byte
strings (`head`, `tail`) and the parsed value, and loads a body that starts with one's
head and ends with its tail by parsing only what lies between: the new items, checked by
`json_text.loads` like any body. Anything else takes the full parse, whose value is the
reference (the same value, key order included, whichever path loaded it).

Why the shortcut is exact: `head` ends just past the last item of the body's history
array (the last occurrence of its key, the one a parse keeps), found by the standard
library's JSON scanner on a body the full parse accepted, or carried over from one loaded
this way. The middle parses, wrapped as `[[0` + middle + `]]`, to one list opening with
the 0 only if it is a run of `,item` with nothing closing the array early, so in the
whole body it is new items of that same array; they sit as deep in the wrapper as in the
body, so the depth limit applies alike.
"""

from __future__ import annotations

import json.scanner
import re
from dataclasses import dataclass
from json import JSONDecoder
from typing import Any

from gateway import json_text
from gateway.protocols.wire import load_object

__all__ = ["ResentBodies"]

HISTORY_FIELDS = ("messages", "input")
"""The top-level arrays that grow from call to call (Chat and Messages; Responses)."""

_MAX_BODIES = 2
"""Bodies kept per session: the main conversation and one interleaved side call."""

_SPACE = re.compile(r"[ \t\n\r]*")
_scan = json.scanner.make_scanner(JSONDecoder())


@dataclass(frozen=True, eq=False)
class _Body:
    head: bytes
    """The body up to the end of its history's last item."""
    tail: bytes
    """The rest, from what closes the history array."""
    value: dict[str, Any]
    field: str


class ResentBodies:
    """A session's last loaded bodies (used from one event loop).

    Finding where a fully parsed body's history ends costs about another parse, so a
    session whose bodies do not extend each other (a client that changes its system
    prompt every call) is not made to pay it every time: of the bodies parsed in full in
    a row, only the 1st, 2nd, 4th, 8th, ... are remembered."""

    def __init__(self) -> None:
        self._bodies: list[_Body] = []
        self._full = 0
        """Bodies parsed in full since one was extended."""

    def load(self, data: bytes) -> dict[str, Any]:
        """The body `data` as a JSON object, as `wire.load_object` gives it (a 400 for
        anything else), parsing only its new history items when it resends a known one."""
        for known in reversed(self._bodies):
            value = self._extended(known, data)
            if value is not None:
                self._full = 0
                return value
        value = load_object(data)
        self._full += 1
        if self._full & (self._full - 1) == 0:  # the 1st, 2nd, 4th, 8th, ... in a row
            self._remember_full(data, value)
        return value

    def _extended(self, known: _Body, data: bytes) -> dict[str, Any] | None:
        head, tail = known.head, known.tail
        if len(data) < len(head) + len(tail):
            return None
        if not (data.startswith(head) and data.endswith(tail)):
            return None
        middle = data[len(head) : len(data) - len(tail)]
        try:
            wrapped = json_text.loads(b"[[0" + middle + b"]]")
        except ValueError:
            return None  # the full parse says what is wrong, and where
        if len(wrapped) != 1 or not isinstance(wrapped[0], list):
            return None
        opener = wrapped[0][0]
        if type(opener) is not int or opener != 0:
            return None
        value = {**known.value, known.field: [*known.value[known.field], *wrapped[0][1:]]}
        self._keep(_Body(data[: len(data) - len(tail)], tail, value, known.field), known)
        return value

    def _remember_full(self, data: bytes, value: dict[str, Any]) -> None:
        field = next((f for f in HISTORY_FIELDS if isinstance(value.get(f), list)), None)
        if field is None or not value[field]:
            return
        try:
            text = data.decode()
            end = _history_end(text, field)
        except (ValueError, StopIteration, IndexError):
            return  # text the scanner reads otherwise than the parser: never a shortcut
        if end is not None:
            cut = len(text[:end].encode())
            self._keep(_Body(data[:cut], data[cut:], value, field), None)

    def _keep(self, body: _Body, superseded: _Body | None) -> None:
        if superseded is not None:
            self._bodies.remove(superseded)
        self._bodies.append(body)
        del self._bodies[:-_MAX_BODIES]


def _space(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # always matches


def _history_end(text: str, field: str) -> int | None:
    """Where the last item of the array at top-level key `field` ends in `text` (a JSON
    object the full parse accepted), for the key's last occurrence; None when that value
    is no array or an empty one."""
    end: int | None = None
    at = _space(text, 0)
    if text[at] != "{":
        return None
    at += 1
    while True:
        at = _space(text, at)
        if text[at] == "}":
            return end
        key, at = _scan(text, at)
        at = _space(text, _space(text, at) + 1)  # past the ":"
        if key == field:
            end, at = _array_end(text, at)
        else:
            at = _scan(text, at)[1]
        at = _space(text, at)
        if text[at] == ",":
            at += 1


def _array_end(text: str, at: int) -> tuple[int | None, int]:
    """(where the last item of the value at `at` ends, None if it is no array or empty;
    where the value ends)."""
    end = _scan(text, at)[1]
    if text[at] != "[":
        return None, end
    last = len(text[: end - 1].rstrip(" \t\n\r"))  # before the closing "]"
    return (last if last > at + 1 else None), end
