"""Normalisers: named rules that forgive how clients re-format the history they echo.

A held message and the client's echo of it count as the same message when a combination
of normalisers makes them equal; the names of the rules that were needed are reported as
drift (a "realign" call). The held tokens always keep what the model saw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    messages it does not concern.
    """

    name: str
    apply: Callable[[Message, Message], Pair]


def _drop_missing_reasoning(held: Message, echoed: Message) -> Pair:
    """Clients drop reasoning they were shown (or never got) when echoing our replies."""
    if held.reasoning and echoed.reasoning:
        return held, echoed
    return (
        held.model_copy(update={"reasoning": None}),
        echoed.model_copy(update={"reasoning": None}),
    )


def _content_none_as_empty(held: Message, echoed: Message) -> Pair:
    return (
        held.model_copy(update={"content": held.content or ""}),
        echoed.model_copy(update={"content": echoed.content or ""}),
    )


def _strip(message: Message) -> Message:
    update = {
        "content": message.content.strip() if message.content is not None else None,
        "reasoning": message.reasoning.strip() if message.reasoning is not None else None,
    }
    return message.model_copy(update=update)


def _strip_whitespace(held: Message, echoed: Message) -> Pair:
    return _strip(held), _strip(echoed)


def _canonical_arguments(text: str) -> str:
    try:
        value = json_text.loads(text, allow_nan=True)
    except ValueError:
        return text
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _with_arguments(message: Message) -> Message:
    calls = [
        c.model_copy(update={"arguments": _canonical_arguments(c.arguments)})
        for c in message.tool_calls
    ]
    return message.model_copy(update={"tool_calls": calls})


def _reserialised_arguments(held: Message, echoed: Message) -> Pair:
    return _with_arguments(held), _with_arguments(echoed)


def _rewritten_ids(held: Message, echoed: Message) -> Pair:
    """Clients may rename tool-call ids (and the tool results' references to them)."""
    if len(held.tool_calls) == len(echoed.tool_calls) and held.tool_calls:
        calls = [
            e.model_copy(update={"id": h.id})
            for h, e in zip(held.tool_calls, echoed.tool_calls, strict=True)
        ]
        echoed = echoed.model_copy(update={"tool_calls": calls})
    if held.tool_call_id is not None and echoed.tool_call_id is not None:
        echoed = echoed.model_copy(update={"tool_call_id": held.tool_call_id})
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


def _changes(normaliser: Normaliser, held: Message, echoed: Message) -> bool:
    return normaliser.apply(held, echoed) != (held, echoed)


def _equal_after(normalisers: Sequence[Normaliser], held: Message, echoed: Message) -> bool:
    for normaliser in normalisers:
        held, echoed = normaliser.apply(held, echoed)
    return held == echoed


def forgive(held: Message, echoed: Message, normalisers: Sequence[Normaliser]) -> list[str] | None:
    """Names of the normalisers needed to make the two equal, or None if none do."""
    if held.role != echoed.role:
        return None
    used = [n for n in normalisers if _changes(n, held, echoed)]
    if not _equal_after(used, held, echoed):
        return None
    # Report only what was needed: a normaliser that merely canonicalised two
    # already-equal fields is not drift.
    needed = [n for n in used if not _equal_after([m for m in used if m is not n], held, echoed)]
    return [n.name for n in needed or used]
