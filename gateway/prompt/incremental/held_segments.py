"""The token segments the Gateway holds per session, and their training view."""

from __future__ import annotations

import uuid
from collections.abc import Callable, MutableMapping, MutableSequence
from dataclasses import dataclass, fields

from gateway.canonical import Message
from gateway.prompt.incremental.message_keys import MessageKey

__all__ = ["HeldSegment", "SegmentView", "Segments", "add_segment", "new_segment_id"]


@dataclass(frozen=True)
class SegmentView:
    """A segment's training view: first prompt, then everything after it (aligned)."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]


@dataclass(eq=False)
class HeldSegment:
    """One token-contiguous conversation the Gateway holds.

    `messages` ends with our latest reply as sampled (with reasoning); earlier ones are
    as the client last echoed them. `ids` only ever grows, so `ids[:n]` of an older
    version is still valid. `marker_count` counts end-of-turn markers in `ids`;
    `internal_markers` those sampled inside replies (not as the final stop token);
    `reply_markers` those sampled in the latest reply (incl. its stop token), which the
    window render needs to find the reply's end.
    """

    segment_id: str
    parent_id: str | None
    messages: list[Message]
    message_keys: list[MessageKey]
    tools_hash: str
    kwargs_hash: str
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    prompt_length: int
    marker_count: int
    internal_markers: int
    reply_finished: bool
    reply_markers: int = 0
    version: int = 0
    calls: int = 1
    touched: int = 0

    def checkpoint(self) -> Callable[[], None]:
        """An undo for `IncrementalTokenizer.commit` extending this segment in place: the
        returned function restores the state as of now (used when recording the call fails)."""
        saved = {f.name: getattr(self, f.name) for f in fields(self)}
        lengths = len(self.ids), len(self.mask), len(self.logprobs)

        def restore() -> None:
            for name, value in saved.items():
                setattr(self, name, value)
            ids, mask, logprobs = lengths
            del self.ids[ids:], self.mask[mask:], self.logprobs[logprobs:]

        return restore

    def export(self) -> SegmentView:
        p = self.prompt_length
        return SegmentView(
            prompt_ids=self.ids[:p],
            response_ids=self.ids[p:],
            loss_mask=self.mask[p:],
            logprobs=self.logprobs[p:],
        )


Segments = MutableSequence[HeldSegment] | MutableMapping[str, HeldSegment]
"""A session's held segments: a list, or a dict keyed by segment id."""


def add_segment(segments: Segments, segment: HeldSegment) -> None:
    if isinstance(segments, MutableMapping):
        segments[segment.segment_id] = segment
    else:
        segments.append(segment)


def new_segment_id() -> str:
    return f"seg_{uuid.uuid4().hex[:16]}"
