"""Cheap equality keys for messages, and stable hashes of tools and template kwargs.

A held segment remembers these so that matching a request against it compares keys and
hashes instead of whole messages, tool lists or kwargs.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from gateway.canonical import Message, Tool, ToolCall

__all__ = ["MessageKey", "hash_template_kwargs", "hash_tools", "message_key"]


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
