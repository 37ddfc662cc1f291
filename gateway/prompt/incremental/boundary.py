"""Where our previous reply ends in a new rendering: the boundary after which the text is new.

Two locators. By count: the held segment knows how many end-of-turn markers its ids
contain, so the marker closing our reply is found by index; this survives templates that
re-render earlier turns differently as long as they render the same number of markers. By
anchor: the new messages' own text, searched from the end, for templates whose count
drifts because sampled replies held extra markers that a re-render drops (gpt-oss
analysis `<|end|>`). Either result is trusted only when our reply is visible just before
the boundary and the new messages appear in order after it; otherwise the caller forks.

A reply cut at `max_tokens` holds no closing marker: the boundary is then the start of the
marker the template closes it with, so that marker (and what follows it) is new text.
Whatever the template renders between the cut text and that marker is not: it comes from
the client's echo of a reply whose sampled tokens we hold (the template may close a cut
`<think>`, strip whitespace, drop reasoning or reorder content and tool calls), and the
held tokens are what the model saw.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from json.encoder import encode_basestring, encode_basestring_ascii

from gateway.canonical import Message
from gateway.prompt.incremental.held_segments import HeldSegment
from gateway.prompt.incremental.markers import EndOfTurnMarkers

__all__ = ["NOT_FOUND", "Located", "find_boundary", "last_anchor_end", "locate_boundary"]

NOT_FOUND = "end of our previous reply not found"

Located = tuple[int, str]
"""(boundary offset in the rendered text, locator used: "count" or "anchor")."""


def locate_boundary(
    markers: EndOfTurnMarkers, seg: HeldSegment, text: str, messages: list[Message]
) -> Located | str:
    """The boundary in the full rendering `text` of `messages`, or why it is untrusted."""
    held = len(seg.messages)
    counted = seg.marker_count - 1 if seg.reply_finished else seg.marker_count
    located = find_boundary(
        markers,
        text,
        messages[held - 1],
        messages[held:],
        counted=counted,
        tolerance=seg.internal_markers,
        finished=seg.reply_finished,
        reply_markers=seg.reply_markers - int(seg.reply_finished),
    )
    if located is None:
        rendered = markers.count_text(text)
        return (
            f"{NOT_FOUND}: {rendered} end-of-turn markers rendered, held segment has "
            f"{seg.marker_count}"
        )
    return located


def find_boundary(
    markers: EndOfTurnMarkers,
    text: str,
    reply: Message,
    new: list[Message],
    *,
    counted: int,
    tolerance: int,
    finished: bool,
    floor: int = 0,
    reply_markers: int = 0,
    prefix_spans: Sequence[tuple[int, int]] = (),
) -> Located | str | None:
    """(boundary offset, method), a reason, or None when marker `counted` is missing.

    `counted` is the index of the marker closing our reply if the rendering holds as
    many markers before it as were held; up to `tolerance` of those (sampled inside
    replies) may be missing from a re-render. The count locator is used when it
    verifies and the anchor locator (if it found anything) agrees. The anchor locator
    alone is used only when the count failed, within that tolerance, and it verifies.
    The closing marker must start at or after `floor`. `reply_markers` are the markers
    sampled inside our reply (not its stop token): the reply is looked for from the
    marker before them, since its text may hold them (a re-render shows them as text).
    `prefix_spans` are the markers of a prefix of `text` found before (a window's head):
    the search goes on from the last one's end, which finds the same markers as a search
    of the whole text.
    """
    start = prefix_spans[-1][1] if prefix_spans else 0
    spans = [*prefix_spans, *markers.spans(text, start)]
    new_anchors = [_anchors(m) for m in new]
    anchored = _anchor_index(text, spans, new_anchors)

    def verified(index: int) -> int | None:
        if not 0 <= index < len(spans) or spans[index][0] < floor:
            return None
        seen = _reply_visible(text, spans, index, reply, reply_markers)
        if seen is False or (seen is None and anchored != counted):
            return None
        boundary = spans[index][1] if finished else spans[index][0]
        return boundary if _new_visible(text, spans, index, boundary, new_anchors) else None

    by_count = verified(counted)
    if by_count is not None:
        if anchored is None or anchored == counted:
            return by_count, "count"
        return "end-of-turn count and new-message anchors disagree on where our reply ends"
    if anchored is not None and counted - tolerance <= anchored < counted:
        by_anchor = verified(anchored)
        if by_anchor is not None:
            return by_anchor, "anchor"
    if counted >= len(spans):
        return None
    return "end of our previous reply could not be verified in the rendered request"


def last_anchor_end(text: str, message: Message) -> int:
    """Where the last of a message's anchors ends in `text` (-1 if one is missing)."""
    end = -1
    for forms in _anchors(message):
        hits = [(at, len(f)) for f in forms if (at := text.find(f)) >= 0]
        if not hits:
            return -1
        at, length = min(hits)
        end = max(end, at + length)
    return end


def _text_forms(text: str | None) -> list[str]:
    """How a text may appear in a rendering: as is, trimmed, or JSON-escaped."""
    raw = text or ""
    stripped = raw.strip()
    forms: list[str] = []
    # `json.dumps` of a str, without and with `ensure_ascii`, as its own C functions
    for form in (
        raw,
        stripped,
        encode_basestring(stripped)[1:-1],
        encode_basestring_ascii(stripped)[1:-1],
    ):
        if form.strip() and form not in forms:
            forms.append(form)
    return forms


def _anchors(message: Message) -> list[list[str]]:
    """Texts of a message that any sensible template renders, each with its variants."""
    anchors = [[c.name, c.id] for c in message.tool_calls]
    if message.content and message.content.strip():
        anchors.insert(0, _text_forms(message.content))
    return anchors


def _find_any(text: str, forms: Sequence[str], start: int, end: int) -> int:
    hits = [p for p in (text.find(f, start, end) for f in forms) if p >= 0]
    return min(hits) if hits else -1


def _anchor_index(
    text: str, spans: list[tuple[int, int]], new_anchors: list[list[list[str]]]
) -> int | None:
    """Index of the last marker before the first new message (`new_anchors`: each new
    message's `_anchors`), found from the end."""
    end = len(text)
    for position, anchors in reversed(list(enumerate(new_anchors))):
        if not anchors:
            if position == 0:
                return None
            continue
        hits = [max(text.rfind(f, 0, end) for f in forms) for forms in anchors]
        if min(hits) < 0:
            return None
        end = min(hits)
    index = bisect.bisect_right([e for _, e in spans], end) - 1
    return index if index >= 0 else None


def _reply_visible(
    text: str, spans: list[tuple[int, int]], index: int, reply: Message, inside: int = 0
) -> bool | None:
    """Is our reply rendered just before marker `index` (after the `inside` markers its
    own text may hold)? None if it has nothing to see."""
    first = index - 1 - inside
    span = text[spans[first][1] if first >= 0 else 0 : spans[index][0]]
    if reply.tool_calls:
        return all(c.name in span or c.id in span for c in reply.tool_calls)
    forms = _text_forms(reply.content)
    return any(f in span for f in forms) if forms else None


def _new_visible(
    text: str,
    spans: list[tuple[int, int]],
    index: int,
    boundary: int,
    new_anchors: list[list[list[str]]],
) -> bool:
    """New messages appear in order after the boundary, the first before any marker."""
    next_marker = spans[index + 1][0] if index + 1 < len(spans) else len(text)
    cursor = boundary
    for position, anchors in enumerate(new_anchors):
        for forms in anchors:
            hit = _find_any(text, forms, cursor, len(text))
            if hit < 0 or (position == 0 and hit >= next_marker):
                return False
            cursor = hit
    return True
