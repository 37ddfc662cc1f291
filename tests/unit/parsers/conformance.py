"""What every family's stream must honour, checked the same way for all of them: fed in
any chunking, a splitter only ever shows a start of the whole-output parse, and what it
showed plus what the finished parse adds is that parse.

`assert_streams_like_whole` is the one call a family's test makes per text.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from gateway.canonical import ParsedOutput, ToolCall
from gateway.parsers.base import OutputParser, ParseContext, StreamEvent, TextDelta


def shown(events: list[StreamEvent]) -> ParsedOutput:
    """What a client has been shown, as a `ParsedOutput`."""
    text = {"reasoning": "", "content": ""}
    calls: list[ToolCall] = []
    for event in events:
        if isinstance(event, TextDelta):
            text[event.field] += event.text
        else:
            calls.append(event.call)
    return ParsedOutput(
        reasoning=text["reasoning"] or None, content=text["content"] or None, tool_calls=calls
    )


def chunkings(text: str, seed: int = 0) -> Iterator[list[str]]:
    """Fixed chunk sizes 1..8, then a few random splits (sizes 1..8)."""
    for size in range(1, 9):
        yield [text[i : i + size] for i in range(0, len(text), size)] or [""]
    rng = random.Random(seed)
    for _ in range(4):
        pieces, at = [], 0
        while at < len(text):
            step = rng.randint(1, 8)
            pieces.append(text[at : at + step])
            at += step
        yield pieces


def is_start_of(part: ParsedOutput, whole: ParsedOutput) -> bool:
    return (
        (whole.reasoning or "").startswith(part.reasoning or "")
        and (whole.content or "").startswith(part.content or "")
        and whole.tool_calls[: len(part.tool_calls)] == part.tool_calls
    )


def assert_streams_like_whole(parser: OutputParser, text: str, ctx: ParseContext) -> ParsedOutput:
    """Stream `text` in every chunking; every intermediate view must be a start of the
    whole parse. Returns what the last chunking showed (tests may assert it streamed
    early, e.g. that the tool calls went out before the finish)."""
    whole = parser.parse(text, ctx)
    last = ParsedOutput()
    for pieces in chunkings(text):
        splitter = parser.splitter(ctx)
        if splitter is None:
            return last
        events: list[StreamEvent] = []
        for piece in pieces:
            events += splitter.feed(piece)
            view = shown(events)
            assert is_start_of(view, whole), (pieces, view, whole)
        last = shown(events)
    return last
