"""Rebuild a session's segments (the training view) from its recorded calls alone.

Recorded calls are the single source of truth: a call that extends a segment has a prompt
that starts with everything the segment held, so the segment is prompt of the first call
followed by, per call, the newly tokenized part (loss 0) and the sampled part (loss 1).
Because this needs nothing but the records, a restarted gateway serves the same export.
"""

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from gateway.canonical import Message
from gateway.capture.recording import conv_message
from gateway.capture.routing_splice import RoutingSplice
from gateway.capture.store import CallEntry, Entry, SegmentOpened
from schemas.scenes import Scene
from schemas.trajectory import CallStatus, RecordedCall, Segment


class TrajectoryCorruptError(RuntimeError):
    """Records contradict the held-prefix invariant; exporting them would misalign training."""


class _Acc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    opened: SegmentOpened
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    call_ids: list[str] = Field(default_factory=list)
    call_starts: list[int] = Field(default_factory=list)
    started: bool = False
    _routing: RoutingSplice = PrivateAttr(default_factory=RoutingSplice)

    def held_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def held_equals_prefix(self, ids: list[int]) -> bool:
        n = len(self.prompt_ids)
        return ids[:n] == self.prompt_ids and ids[n : self.held_length()] == self.response_ids

    def add(self, call: RecordedCall) -> None:
        if not self.started:
            self.prompt_ids = list(call.prompt_ids)
            self.started = True
        else:
            held = self.held_length()
            if len(call.prompt_ids) < held or not self.held_equals_prefix(call.prompt_ids):
                raise TrajectoryCorruptError(
                    f"call {call.call_id} does not extend segment {self.opened.segment_id}"
                )
            new_part = call.prompt_ids[held:]
            self.response_ids.extend(new_part)
            self.loss_mask.extend([0] * len(new_part))
            self.logprobs.extend([0.0] * len(new_part))
        self.call_starts.append(len(self.response_ids))
        self.response_ids.extend(call.output_ids)
        self.loss_mask.extend([1] * len(call.output_ids))
        self.logprobs.extend(call.output_logprobs)
        self.call_ids.append(call.call_id)
        self._routing.add(call)


def build_segments(records: list[Entry], trainable: set[Scene]) -> list[Segment]:
    """Segments in opening order; failed calls are skipped (they sampled nothing)."""
    accs: dict[str, _Acc] = {}
    for record in records:
        if isinstance(record, SegmentOpened):
            accs.setdefault(record.segment_id, _Acc(opened=record))
        elif isinstance(record, CallEntry) and record.call.status == CallStatus.ok:
            acc = accs.get(record.call.segment_id)
            if acc is None:
                raise TrajectoryCorruptError(
                    f"call {record.call.call_id} names unopened segment {record.call.segment_id}"
                )
            acc.add(record.call)
    segments = []
    for acc in accs.values():
        if not acc.started:
            continue
        scene = Scene(acc.opened.scene)
        routed, routing_missing = acc._routing.result(acc.held_length())
        segments.append(
            Segment(
                segment_id=acc.opened.segment_id,
                parent_id=acc.opened.parent_id,
                link=acc.opened.link,
                scene=scene,
                trainable=scene in trainable,
                prompt_ids=acc.prompt_ids,
                response_ids=acc.response_ids,
                loss_mask=acc.loss_mask,
                logprobs=acc.logprobs,
                call_ids=acc.call_ids,
                call_starts=acc.call_starts,
                routed_experts=routed,
                routing_missing=routing_missing,
                routing_rereads=acc._routing.rereads,
                routing_reread_differs=acc._routing.reread_differs,
            )
        )
    return segments


def routing_notes(calls: list[RecordedCall]) -> list[str]:
    """A note naming each call recorded without the routing its session asked for."""
    return [
        f"call {c.call_id}: no routed experts recorded: {c.routing_missing}"
        for c in calls
        if c.routing_missing is not None
    ]


def recorded_calls(records: list[Entry]) -> list[RecordedCall]:
    """The calls as the trajectory gives them, each conversation with its messages."""
    return [_with_messages(r) for r in records if isinstance(r, CallEntry)]


def _with_messages(entry: CallEntry) -> RecordedCall:
    """The call with the messages its request added, read from the normalized request its
    record keeps (the messages past the held ones, or all of a segment's first call):
    stored once, there, and clipped here as the conversation keeps them."""
    said = entry.call.conversation
    if said is None:
        return entry.call
    normalized = entry.normalized
    sent = normalized.get("new_messages", normalized.get("messages", []))
    messages = [conv_message(Message.model_validate(m)) for m in sent]
    return entry.call.model_copy(
        update={"conversation": said.model_copy(update={"messages": messages})}
    )
