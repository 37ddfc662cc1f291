"""Serve a session again after its gateway process restarted: its held segments and
counters rebuilt from the records on disk, so the agent's next call extends its held
segment exactly as it would have without the restart.

Each recorded ok call is replayed through `IncrementalTokenizer.restore` (hence `commit`,
the live path) with the request messages it was planned with and the reply parsed from
its sampled ids. A call that extended a held conversation keeps only the messages past
the held ones (and the held ones the client echoed differently); the held ones are those
after the call its prompt reference names. A segment whose records miss something (written
before the record kept it) is not held again: the next call in its scene opens a new one.
A held segment's `parent_id` is the one its opening record names (the held one matters
only when a segment opens, never after).
"""

import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gateway.canonical import Message, Tool
from gateway.capture.replies import parse_output, reply_message, turn_finished
from gateway.capture.store import CallEntry, Entry, SegmentOpened
from gateway.parsers.base import OutputParser
from gateway.prompt.incremental import HeldSegment, IncrementalTokenizer
from gateway.prompt.incremental.message_keys import (
    MessageKey,
    hash_template_kwargs,
    hash_tools,
    message_key,
)
from schemas.scenes import Scene
from schemas.trajectory import CallStatus

log = logging.getLogger("rollout.gateway")


@dataclass
class RevivedState:
    """What a live session holds, as rebuilt from its records."""

    held: list[HeldSegment] = field(default_factory=list)
    segment_scenes: dict[str, Scene] = field(default_factory=dict)
    last_call: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    failed_calls: int = 0
    answered: dict[str, str] = field(default_factory=dict)
    """Request digest → id of the (latest) ok call that answered it."""
    offsets: dict[str, int] = field(default_factory=dict)
    """Ok call id → where its record starts in the records file."""
    not_held: list[str] = field(default_factory=list)
    """Segments that could not be rebuilt exactly, hence are not held."""


@dataclass(frozen=True)
class _After:
    """A held conversation: after one call (what a later call's record refers to), or
    as one call's request."""

    messages: list[Message]
    keys: list[MessageKey]
    tools_hash: str
    internal_markers: int
    tools: list[Tool]
    """The declared tools (they type the parsed arguments of some families)."""


class _Unrebuildable(ValueError):
    pass


def revive(
    records: list[Entry], incremental: IncrementalTokenizer, parser: OutputParser
) -> RevivedState:
    """Rebuild a session's live state from its records (in file order)."""
    state = RevivedState()
    opened: dict[str, SegmentOpened] = {}
    held: dict[str, HeldSegment] = {}
    after: dict[str, _After] = {}
    for record in records:
        if isinstance(record, SegmentOpened):
            opened[record.segment_id] = record
            state.segment_scenes[record.segment_id] = Scene(record.scene)
            continue
        call = record.call
        state.calls += 1
        if call.status != CallStatus.ok:
            state.failed_calls += 1
            continue
        state.last_call[call.segment_id] = call.call_id
        if record.offset is not None:
            state.offsets[call.call_id] = record.offset
        if record.request_digest is not None:
            state.answered[record.request_digest] = call.call_id
        if call.segment_id in state.not_held:
            continue
        try:
            request = _request_of(record, after)
            parsed = parse_output(
                incremental, parser, call.call_id, call.prompt_ids, call.output_ids, request.tools
            )
            reply = reply_message(parsed)
            opening = opened.get(call.segment_id)
            segment = incremental.restore(
                held,
                segment_id=call.segment_id,
                parent_id=opening.parent_id if opening is not None else None,
                prompt_ids=call.prompt_ids,
                output_ids=call.output_ids,
                output_logprobs=call.output_logprobs,
                reply=reply,
                finished_with_eot=turn_finished(call.finish_reason),
                messages=request.messages,
                message_keys=request.keys,
                tools_hash=request.tools_hash,
                kwargs_hash=hash_template_kwargs(record.normalized.get("template_kwargs") or {}),
                prompt_internal_markers=request.internal_markers,
            )
        except (ValueError, ValidationError, TypeError) as exc:
            log.warning("segment %s is not held again: %s", call.segment_id, exc)
            state.not_held.append(call.segment_id)
            held.pop(call.segment_id, None)
            continue
        after[call.call_id] = _After(
            [*request.messages, reply],
            [*request.keys, message_key(reply)],
            request.tools_hash,
            segment.internal_markers,
            request.tools,
        )
    state.held = list(held.values())
    return state


def _request_of(record: CallEntry, after: dict[str, _After]) -> _After:
    """A recorded call's request: its messages (and their keys), tools hash, and the
    internal markers of the held prompt it reused (0 when it reused none)."""
    stored: dict[str, Any] = record.normalized
    if "messages" in stored:  # the whole request: the call did not extend a held segment
        messages = [Message.model_validate(m) for m in stored["messages"]]
        tools = [Tool.model_validate(t) for t in stored.get("tools") or []]
        return _After(messages, [message_key(m) for m in messages], hash_tools(tools), 0, tools)
    source = record.prompt_source
    base = after.get(source) if source is not None else None
    if base is None or stored.get("history_messages") != len(base.messages):
        raise _Unrebuildable(f"call {record.call.call_id}: its held history is not on record")
    messages, keys = list(base.messages), list(base.keys)
    for echo in stored.get("echoed_history") or []:
        messages[echo["index"]] = Message.model_validate(echo["message"])
        keys[echo["index"]] = message_key(messages[echo["index"]])
    new = [Message.model_validate(m) for m in stored["new_messages"]]
    keys += [message_key(m) for m in new]
    return _After(messages + new, keys, base.tools_hash, base.internal_markers, base.tools)
