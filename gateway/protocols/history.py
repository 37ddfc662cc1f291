"""The history a session already sent, converted once: agents resend the whole conversation
on every call, so parsing and validating it again would make each call cost in proportion
to the conversation rather than to what is new.

Per session, `HistoryCache` keeps the last few converted histories: the raw items (the
`messages` or `input` list) as compact JSON text, what converting them produced (the
adapter's state after the last item), and a context (what else the conversion read, e.g.
the system prompt). A request whose items start with exactly those items (same JSON text,
so `1`, `1.0` and `true` differ, unlike `==` on the parsed values) and whose context is
the same resumes from that state: only the new items are validated and converted. Anything
else — an item edited or dropped anywhere, another system prompt — takes the full path,
which is the reference the resumed one must equal (tests compare the records of both).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import OrderedDict
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
    state after them; `text` is the items' JSON, kept to remember this request."""

    count: int
    state: Any
    text: bytes
    context: bytes


_NONE = Prefix(0, None, b"", b"")


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


class HistoryCache:
    """A session's converted histories, keyed by protocol; used from one event loop."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, bytes, bytes], tuple[int, Any]] = OrderedDict()
        self.bodies = ResentBodies()
        """The session's bodies, loaded parsing only new history items (`resent_body`)."""

    def lookup(self, protocol: str, items: Any, context: Any = None) -> Prefix:
        """The longest remembered prefix of `items` (a list of JSON values) converted under
        the same `context`; `Prefix.count` 0 when there is none."""
        if not isinstance(items, list):
            return _NONE
        text, ctx = _dumps(items), _dumps(context)
        if text is None or ctx is None:
            return _NONE
        best = Prefix(0, None, text, ctx)
        for (proto, known_ctx, known), (count, state) in reversed(self._entries.items()):
            if proto != protocol or known_ctx != ctx or count <= best.count:
                continue
            if _extends(text, known):
                best = Prefix(count, state, text, ctx)
        return best

    def remember(self, protocol: str, prefix: Prefix, count: int, state: Any) -> None:
        """After a request converted in full: its `count` items (whose JSON `prefix.text`
        holds) led to `state`, which must not be mutated afterwards."""
        if not prefix.text or count == 0:
            return
        for known in list(self._entries):  # the histories this one extends are superseded
            proto, ctx, text = known
            if proto == protocol and ctx == prefix.context and _extends(prefix.text, text):
                del self._entries[known]
        key = (protocol, prefix.context, prefix.text)
        self._entries[key] = (count, state)
        self._entries.move_to_end(key)
        while len(self._entries) > _MAX_ENTRIES:
            self._entries.popitem(last=False)


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
