"""The history a session already sent, converted once: agents resend the whole conversation
on every call, so parsing and validating it again would make each call cost in proportion
to the conversation rather than to what is new.

Per session, `HistoryCache` keeps the last few converted histories: the raw items (the
`messages` or `input` list), what converting them produced (the adapter's state after the
last item), and a context (what else the conversion read, e.g. the system prompt). A
request whose items start with exactly those items and whose context is the same resumes
from that state: only the new items are validated and converted. "Exactly" is the very
same objects (a resent history `resent_body` loaded: nothing is encoded), else the same
compact JSON text (so `1`, `1.0` and `true` differ, unlike `==` on the parsed values).
Anything else — an item edited or dropped anywhere, another system prompt — takes the
full path, which is the reference the resumed one must equal (tests compare the records
of both).
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from gateway.errors import GatewayError
from gateway.protocols.resent_body import ResentBodies

__all__ = ["HistoryCache", "Prefix"]

_MAX_ENTRIES = 4
"""Histories kept per session: the main conversation plus interleaved side calls (titles,
probes, a sub-agent) without evicting each other."""


@dataclass(frozen=True)
class Prefix:
    """How much of a request's items was already converted (`count`, 0: none) and the
    state after them; `items` and `context` are kept to remember this request."""

    count: int
    state: Any
    items: tuple[Any, ...]
    context: bytes
    text: bytes | None = None
    """The items' JSON, when the lookup needed it."""


_NONE = Prefix(0, None, (), b"")


def _dumps(value: Any) -> bytes | None:
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return None  # not plain JSON data (only from callers passing objects): no caching


def _extends(text: bytes, known: bytes) -> bool:
    """Do the items of JSON array `text` start with all the items of JSON array `known`?
    `[a,b]`'s items start `[a,b,c]` exactly when its text minus the `]` is a prefix and
    the next byte ends an item (`,` or `]`: `[1]` does not start `[12]`)."""
    head = known[:-1]
    return text.startswith(head) and text[len(head) : len(head) + 1] in (b",", b"]")


def _starts_with(items: tuple[Any, ...], known: tuple[Any, ...]) -> bool:
    """Do `items` start with the very objects `known` holds (`resent_body` hands a
    resent history's items over as the same objects)?"""
    return len(items) >= len(known) and all(map(operator.is_, items, known))


@dataclass(eq=False)
class _Entry:
    protocol: str
    context: bytes
    items: tuple[Any, ...]
    count: int
    state: Any
    text: bytes | None = None
    """The items' JSON, made when a lookup first compares by text."""

    def json(self) -> bytes | None:
        if self.text is None:
            self.text = _dumps(list(self.items))
        return self.text


class HistoryCache:
    """A session's converted histories, keyed by protocol; used from one event loop."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        """Oldest first."""
        self.bodies = ResentBodies()
        """The session's bodies, loaded parsing only new history items (`resent_body`)."""

    def lookup(self, protocol: str, items: Any, context: Any = None) -> Prefix:
        """The longest remembered prefix of `items` (a list of JSON values) converted under
        the same `context`; `Prefix.count` 0 when there is none. Items that are the very
        objects of a remembered request match without being encoded; others match when
        their JSON text does."""
        if not isinstance(items, list):
            return _NONE
        ctx = _dumps(context)
        if ctx is None:
            return _NONE
        mine = tuple(items)
        candidates = [e for e in self._entries if e.protocol == protocol and e.context == ctx]
        best: _Entry | None = None
        for entry in candidates:
            if _starts_with(mine, entry.items) and (best is None or entry.count > best.count):
                best = entry
        if best is not None:
            return Prefix(best.count, best.state, mine, ctx)
        text = _dumps(items)
        if text is None:
            return _NONE
        for entry in candidates:
            known = entry.json()
            bigger = best is None or entry.count > best.count
            if bigger and known is not None and _extends(text, known):
                best = entry
        if best is None:
            return Prefix(0, None, mine, ctx, text)
        return Prefix(best.count, best.state, mine, ctx, text)

    def remember(self, protocol: str, prefix: Prefix, count: int, state: Any) -> None:
        """After a request converted in full: its `count` items (`prefix.items`) led to
        `state`, which must not be mutated afterwards."""
        if not prefix.items or count == 0:
            return
        for known in list(self._entries):  # the histories this one extends are superseded
            if known.protocol != protocol or known.context != prefix.context:
                continue
            if _starts_with(prefix.items, known.items) or (
                prefix.text is not None
                and known.text is not None
                and _extends(prefix.text, known.text)
            ):
                self._entries.remove(known)
        items = prefix.items[:count]
        text = prefix.text if len(items) == len(prefix.items) else None
        entry = _Entry(protocol, prefix.context, items, count, state, text)
        self._entries.append(entry)
        del self._entries[:-_MAX_ENTRIES]


Converted = TypeVar("Converted")


def resume_or_full(
    prefix: Prefix | None, convert: Callable[[Prefix | None], Converted]
) -> Converted:
    """`convert` from the cached `prefix`; when that fails, the full path again, so the
    error the caller sees names the field in the whole body, not in the new items."""
    if prefix is not None and prefix.count:
        with contextlib.suppress(GatewayError):
            return convert(prefix)
        prefix = dataclasses.replace(prefix, count=0, state=None)
    return convert(prefix)
