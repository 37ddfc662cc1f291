"""Which held segment a request continues: the longest, most recent held conversation
whose messages (as keys, or equal after normalisers) prefix the request."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, count
from typing import cast

from gateway.canonical import Message
from gateway.prompt.incremental.held_segments import HeldSegment
from gateway.prompt.incremental.message_keys import MessageKey, message_key
from gateway.prompt.incremental.normalisers import Normaliser, forgive

__all__ = ["Match", "find_match", "request_keys"]


@dataclass
class Match:
    """The segment the request extends (with the drift forgiven on the way), or else the
    closest segment it shares history with (`parent`) and why it cannot extend that."""

    segment: HeldSegment | None = None
    drift: list[str] = field(default_factory=list)
    parent: HeldSegment | None = None
    parent_common: int = 0
    reason: str = "no held segment starts like this conversation"


def request_keys(messages: Sequence[Message], segments: Iterable[HeldSegment]) -> list[MessageKey]:
    """The keys of a request's messages, taking those of held messages it passes again.

    A session's protocol parse hands the messages it converted before to the next call as
    the same objects (`protocols.history`; some, like a system prompt converted anew on
    every call, are new objects), and canonical messages are never changed after their
    parse: a message that *is* the held one at its position has the held key. So only
    new messages are keyed. The first segment's keys are taken in one slice and the `is`
    checks run in C (`map`, `compress`): a long conversation costs little per message.
    """
    n = len(messages)
    keys: list[MessageKey | None] = [None] * n
    missing: list[int] | None = None  # positions still without a key (None: all)
    for seg in segments:
        held = seg.messages
        if missing is None:
            m = min(n, len(held))
            keys[:m] = seg.message_keys[:m]
            missing = [*compress(count(), map(operator.is_not, held, messages)), *range(m, n)]
            for i in missing:
                keys[i] = None
        else:
            for i in missing:
                if i < len(held) and held[i] is messages[i]:
                    keys[i] = seg.message_keys[i]
            missing = [i for i in missing if keys[i] is None]
        if not missing:
            break
    for i in range(n) if missing is None else missing:
        keys[i] = message_key(messages[i])
    return cast(list[MessageKey], keys)


def find_match(
    segments: Iterable[HeldSegment],
    messages: list[Message],
    keys: list[MessageKey],
    tools_hash: str,
    kwargs_hash: str,
    normalisers: Sequence[Normaliser],
) -> Match:
    """Longest, then most recent, held segment whose messages prefix the request."""
    result = Match()
    for seg in sorted(segments, key=lambda s: (len(s.messages), s.touched), reverse=True):
        common, drift = _common_prefix(seg, messages, keys, normalisers)
        held = len(seg.messages)
        if common == held and len(messages) > held:
            if seg.tools_hash != tools_hash:
                reason = "tools changed"
            elif seg.kwargs_hash != kwargs_hash:
                reason = "template kwargs changed"
            else:
                return Match(segment=seg, drift=drift)
        elif common == len(messages):
            reason = "request does not go beyond the held messages (retry or rewind)"
        else:
            reason = f"history differs from held segment at message {common}"
        if common > result.parent_common and _meaningful(messages, common):
            result = Match(parent=seg, parent_common=common, reason=reason)
    return result


def _meaningful(messages: list[Message], common: int) -> bool:
    """A shared system prompt alone does not make one conversation another's parent."""
    return any(m.role != "system" for m in messages[:common])


def _common_prefix(
    seg: HeldSegment,
    messages: list[Message],
    keys: list[MessageKey],
    normalisers: Sequence[Normaliser],
) -> tuple[int, list[str]]:
    drift: list[str] = []
    held_keys = seg.message_keys
    # Reused keys are the held ones (`request_keys`): only the others are compared.
    for i in compress(count(), map(operator.is_not, held_keys, keys)):
        if held_keys[i] == keys[i]:
            continue
        held = seg.messages[i]
        forgiven = forgive(held, messages[i], normalisers)
        if forgiven is None:
            return i, drift
        drift.append(f"message {i} ({held.role}): {', '.join(forgiven)}")
    return min(len(held_keys), len(messages)), drift
