"""Cheap equality keys for messages, and stable hashes of tools and template kwargs.

A held segment remembers these so that matching a request against it compares keys and
hashes instead of whole messages, tool lists or kwargs.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from gateway.canonical import Message, Tool, ToolCall

if TYPE_CHECKING:
    from gateway.prompt.incremental.held_segments import HeldSegment

__all__ = ["MessageKey", "hash_template_kwargs", "hash_tools", "message_key", "message_keys"]


MessageKey = tuple[tuple[Any, ...], tuple[tuple[Any, ...], ...]]
"""A message's field values (tool calls as tuples of theirs): compared with `==` only."""

_message_fields = operator.attrgetter(*(f for f in Message.model_fields if f != "tool_calls"))
_call_fields = operator.attrgetter(*ToolCall.model_fields)


def message_key(message: Message) -> MessageKey:
    """Cheap strict-equality key for a message: every field, read in C (`attrgetter`).

    Every held message is compared on every call, so this is per-message work that grows
    with the conversation; it shares the message's strings instead of serialising and
    hashing them (about 3x cheaper than a digest of `model_dump_json`).
    """
    return _message_fields(message), tuple(map(_call_fields, message.tool_calls))


def message_keys(messages: Sequence[Message], segments: Iterable[HeldSegment]) -> list[MessageKey]:
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


_tool_fields = operator.attrgetter(*Tool.model_fields)


def _stable_hash(value: Any) -> str:
    """sha256 of `value`'s JSON with keys sorted: orjson's, or the stdlib's (values as
    their repr) for what orjson refuses. Hashes live in memory only (a restart hashes the
    recorded tools again), so the encoding is free to change."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr).encode()
    return hashlib.sha256(text).hexdigest()


def hash_tools(tools: Sequence[Tool]) -> str:
    """Every field of every tool, read as they are: a `model_dump` of an agent's tools
    cost more than hashing them."""
    return _stable_hash([_tool_fields(t) for t in tools])


def hash_template_kwargs(kwargs: Mapping[str, Any]) -> str:
    return _stable_hash(dict(kwargs))
