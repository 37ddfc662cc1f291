"""Which held segment a request continues: the longest, most recent held conversation
whose messages (as keys, or equal after normalisers) prefix the request."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
    new messages are keyed, and a long conversation costs an identity check per message.
    """
    keys: list[MessageKey | None] = [None] * len(messages)
    missing = len(messages)
    for seg in segments:
        held_pairs = zip(seg.messages, seg.message_keys, strict=True)
        for i, (held, key) in zip(range(len(messages)), held_pairs, strict=False):
            if keys[i] is None and held is messages[i]:
                keys[i] = key
                missing -= 1
        if not missing:
            break
    return [message_key(m) if k is None else k for k, m in zip(keys, messages, strict=True)]


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
    for i, (held, key) in enumerate(zip(seg.messages, seg.message_keys, strict=True)):
        if i >= len(messages):
            return i, drift
        if key is keys[i] or key == keys[i]:  # reused keys are the held ones (`request_keys`)
            continue
        forgiven = forgive(held, messages[i], normalisers)
        if forgiven is None:
            return i, drift
        drift.append(f"message {i} ({held.role}): {', '.join(forgiven)}")
    return len(seg.messages), drift
