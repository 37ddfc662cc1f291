"""Normalisers: named rules that forgive how clients re-format the history they echo.

A held message and the client's echo of it count as the same message when a combination
of normalisers makes them equal; the names of the rules that were needed are reported as
drift (a "realign" call). The held tokens always keep what the model saw.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import json_text
from gateway.canonical import Message

__all__ = [
    "DEFAULT_NORMALISERS",
    "INJECTED_BLOCK",
    "Normaliser",
    "forgive",
    "injected_blocks",
]


Pair = tuple[Message, Message]


@dataclass(frozen=True)
class Normaliser:
    """A named, composable rule making a held message and its echo comparable.

    `apply(held, echoed)` returns both messages rewritten; applying it must not change
    messages it does not concern, and a message it leaves as it is should come back as the
    same object (every held reply is forgiven on every call: copies are what it costs).
    """

    name: str
    apply: Callable[[Message, Message], Pair]


def _updated(message: Message, **update: Any) -> Message:
    """`message` with `update`, or `message` itself when that changes no field."""
    if all(getattr(message, name) == value for name, value in update.items()):
        return message
    return message.model_copy(update=update)


def _drop_missing_reasoning(held: Message, echoed: Message) -> Pair:
    """Clients drop reasoning they were shown (or never got) when echoing our replies."""
    if held.reasoning and echoed.reasoning:
        return held, echoed
    return _updated(held, reasoning=None), _updated(echoed, reasoning=None)


def _content_none_as_empty(held: Message, echoed: Message) -> Pair:
    held = _updated(held, content=held.content or "")
    return held, _updated(echoed, content=echoed.content or "")


def _strip(message: Message) -> Message:
    return _updated(
        message,
        content=message.content.strip() if message.content is not None else None,
        reasoning=message.reasoning.strip() if message.reasoning is not None else None,
    )


def _strip_whitespace(held: Message, echoed: Message) -> Pair:
    return _strip(held), _strip(echoed)


@functools.lru_cache(maxsize=4096)
def _canonical_arguments(text: str) -> str:
    """Tool-call arguments as sorted compact JSON (cached: the same arguments come back
    in every echo of a reply, and each forgive compares them several times)."""
    try:
        value = json_text.loads(text, allow_nan=True)
    except ValueError:
        return text
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _with_arguments(message: Message) -> Message:
    canonical = [_canonical_arguments(c.arguments) for c in message.tool_calls]
    if all(c.arguments == a for c, a in zip(message.tool_calls, canonical, strict=True)):
        return message
    calls = [
        c.model_copy(update={"arguments": a})
        for c, a in zip(message.tool_calls, canonical, strict=True)
    ]
    return message.model_copy(update={"tool_calls": calls})


def _reserialised_arguments(held: Message, echoed: Message) -> Pair:
    same = [c.arguments for c in held.tool_calls] == [c.arguments for c in echoed.tool_calls]
    if same:  # nothing to forgive in the arguments, whatever their spelling
        return held, echoed
    return _with_arguments(held), _with_arguments(echoed)


def _rewritten_ids(held: Message, echoed: Message) -> Pair:
    """Clients may rename tool-call ids (and the tool results' references to them)."""
    if (
        len(held.tool_calls) == len(echoed.tool_calls)
        and held.tool_calls
        and any(h.id != e.id for h, e in zip(held.tool_calls, echoed.tool_calls, strict=True))
    ):
        calls = [
            e.model_copy(update={"id": h.id})
            for h, e in zip(held.tool_calls, echoed.tool_calls, strict=True)
        ]
        echoed = echoed.model_copy(update={"tool_calls": calls})
    if held.tool_call_id is not None and echoed.tool_call_id is not None:
        echoed = _updated(echoed, tool_call_id=held.tool_call_id)
    return held, echoed


INJECTED_BLOCK = re.compile(r"\s*<system-reminder>.*?</system-reminder>\s*", re.DOTALL)
"""Claude Code's transient `<system-reminder>` blocks, the common case of injected text."""


def injected_blocks(pattern: re.Pattern[str] = INJECTED_BLOCK) -> Normaliser:
    """Agents inject transient blocks (reminders, environment notes) into turns and drop
    or rewrite them when they resend history; compare the turns without them. The held
    tokens keep what the model actually saw."""

    def strip(message: Message) -> Message:
        if message.content is None or not pattern.search(message.content):
            return message
        return message.model_copy(update={"content": pattern.sub(" ", message.content).strip()})

    def apply(held: Message, echoed: Message) -> Pair:
        return strip(held), strip(echoed)

    return Normaliser("injected blocks", apply)


DEFAULT_NORMALISERS: tuple[Normaliser, ...] = (
    Normaliser("reasoning dropped by client", _drop_missing_reasoning),
    Normaliser("content None vs empty", _content_none_as_empty),
    Normaliser("surrounding whitespace", _strip_whitespace),
    Normaliser("tool-call arguments re-serialised", _reserialised_arguments),
    Normaliser("tool-call ids rewritten", _rewritten_ids),
    injected_blocks(),
)


def _changed(normaliser: Normaliser, held: Message, echoed: Message) -> Pair | None:
    """The pair `normaliser` makes of the two, or None if it changes neither."""
    new_held, new_echoed = normaliser.apply(held, echoed)
    if new_held is held and new_echoed is echoed:
        return None
    return None if (new_held, new_echoed) == (held, echoed) else (new_held, new_echoed)


def _equal_after(normalisers: Sequence[Normaliser], held: Message, echoed: Message) -> bool:
    for normaliser in normalisers:
        held, echoed = normaliser.apply(held, echoed)
    return held == echoed


def forgive(held: Message, echoed: Message, normalisers: Sequence[Normaliser]) -> list[str] | None:
    """Names of the normalisers needed to make the two equal, or None if none do."""
    if held.role != echoed.role:
        return None
    changed = [(n, pair) for n in normalisers if (pair := _changed(n, held, echoed))]

    def equal_after(rules: list[tuple[Normaliser, Pair]]) -> bool:
        if len(rules) == 1:  # applied alone already
            new_held, new_echoed = rules[0][1]
            return new_held == new_echoed
        return _equal_after([n for n, _ in rules], held, echoed)

    if not equal_after(changed):
        return None
    if len(changed) == 1:  # needed or not (the two were equal), it is the one named
        return [changed[0][0].name]
    # Report only what was needed: a normaliser that merely canonicalised two
    # already-equal fields is not drift.
    needed = [n for n, _ in changed if not equal_after([c for c in changed if c[0] is not n])]
    return [n.name for n in needed] or [n.name for n, _ in changed]
