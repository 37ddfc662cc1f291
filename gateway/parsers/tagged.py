"""The shape most families share: an optional reasoning block between two tags, then
content with tool-call blocks between an opening and a closing marker, then an end marker.
A family is this parser configured with its markers plus `decode_block`, which reads one
block's body (JSON, XML-like parameters, `NAME<sep>{json}`…) into calls.

Parse and stream come from the same rules:
- the output may open reasoning itself (`<think>`) or continue one the generation prompt
  opened (`ParseContext.starts_in_reasoning`); an unclosed block is all reasoning;
- reasoning ends at its closing tag, or (families that allow it) where a tool-call block
  opens inside it;
- a block ends at the first closing marker after which its body decodes (a closing marker
  inside a JSON string does not end it); a block that never decodes is content, with a
  parse note; a family without a closing marker runs its block to the end of the output;
- wrapper markers (a tool-call section's begin/end tokens) are dropped from the content;
- each field is stripped of surrounding whitespace.

The splitter holds back whatever the rest of the output could still change: a tail that
may be the start of a marker, whitespace (the parse strips each field) and a block until
it decodes. A block that does not decode holds back everything after it; the finish shows
it as the parse does. One case stays out of reach: an output that did not open reasoning
but later closes it (a bare closing tag) turns the text before it into reasoning only in
hindsight; the writers notice that the finished parse does not extend what they sent.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Literal

from gateway.canonical import ParsedOutput, ToolCall
from gateway.parsers.base import ParseContext, StreamEvent, TextDelta, ToolCallDone


class TaggedParser:
    """A configurable tagged format; subclasses set the markers and `decode_block`."""

    name: str = "tagged"
    reasoning_tags: tuple[str, str] | None = ("<think>", "</think>")
    block_open: str = "<tool_call>"
    block_close: str | None = "</tool_call>"
    wrappers: tuple[str, ...] = ()
    """Markers dropped from content (e.g. a tool-call section's begin and end tokens)."""
    end_markers: tuple[str, ...] = ()
    first_close_ends_block: bool = False
    """The first closing marker ends a block even when its body does not decode: for
    formats whose values are raw text, where a later marker is no evidence that the first
    was inside a value (retrying would fold the next block into an unclosed value)."""
    reasons_first: bool = False
    """The model always begins by reasoning, whether or not its template wrote the
    opening tag (DeepSeek-R1: after a tool result its template opens no `<think>`): read
    the output as if the prompt had opened it."""
    calls_in_reasoning: bool = False
    """A block that opens inside reasoning ends the reasoning (the model called a tool
    before closing its thoughts)."""

    def decode_block(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        """The calls in one block's body, numbered from `first_index`; a string says why
        the body is not a valid block."""
        raise NotImplementedError

    # -- whole output ---------------------------------------------------------------------

    def parse(self, text: str, ctx: ParseContext) -> ParsedOutput:
        body = self.strip_end_markers(text)
        opened = ctx.starts_in_reasoning or self.reasons_first
        reasoning, rest = self._split_reasoning(body, opened)
        content, calls, errors = self._split_blocks(rest, ctx)
        return ParsedOutput(
            reasoning=(reasoning.strip() or None) if reasoning is not None else None,
            content=self._drop_wrappers(content).strip() or None,
            tool_calls=calls,
            parse_error="; ".join(errors) if errors else None,
        )

    def splitter(self, ctx: ParseContext) -> TaggedSplitter:
        return TaggedSplitter(self, ctx)

    def strip_end_markers(self, text: str) -> str:
        """`text` without the end markers (and whitespace) at its end, repeatedly: a model
        may emit e.g. "<|im_end|>" then "<|endoftext|>"."""
        if not self.end_markers:
            return text
        pattern = _end_pattern(self.end_markers)
        while True:
            stripped = pattern.sub("", text, count=1)
            if stripped == text:
                return text
            text = stripped

    @property
    def reasoning_enders(self) -> tuple[str, ...]:
        if self.reasoning_tags is None:
            return ()
        return (self.reasoning_tags[1],) + ((self.block_open,) if self.calls_in_reasoning else ())

    def _split_reasoning(self, text: str, starts_in_reasoning: bool) -> tuple[str | None, str]:
        """(reasoning or None, remaining text). An unclosed block is all reasoning."""
        if self.reasoning_tags is None:
            return None, text
        think_open, think_close = self.reasoning_tags
        lead = text.lstrip()
        if lead.startswith(think_open):
            text, starts_in_reasoning = lead[len(think_open) :], True
        at, ender = _first_of(text, self.reasoning_enders, 0)
        if starts_in_reasoning:
            if at < 0:
                return text, ""
            return text[:at], text[at + (len(ender) if ender == think_close else 0) :]
        # A bare closing tag with no opener: the template opened it without telling us.
        close_at = text.find(think_close)
        if close_at >= 0 and think_open not in text[:close_at]:
            return text[:close_at], text[close_at + len(think_close) :]
        return None, text

    def _split_blocks(self, text: str, ctx: ParseContext) -> tuple[str, list[ToolCall], list[str]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = blocks = 0
        while (start := text.find(self.block_open, pos)) >= 0:
            content.append(text[pos:start])
            blocks += 1
            end, decoded = self.read_block(text, start + len(self.block_open), ctx, len(calls))
            if isinstance(decoded, str):
                errors.append(f"tool call block {blocks}: {decoded}")
                content.append(text[start:end])
            else:
                calls += decoded
            pos = end
        content.append(text[pos:])
        return "".join(content), calls, errors

    def read_block(
        self, text: str, body_start: int, ctx: ParseContext, first_index: int
    ) -> tuple[int, list[ToolCall] | str]:
        """One block whose body starts at `body_start`: (end index, calls or error). The
        first closing marker after which the body decodes ends it."""
        if self.block_close is None:
            return len(text), self._checked(text[body_start:], ctx, first_index)
        close = text.find(self.block_close, body_start)
        if close < 0:
            return len(text), f"unclosed {self.block_open}"
        first_error: str | None = None
        first_end = close + len(self.block_close)
        if self.first_close_ends_block:
            return first_end, self._checked(text[body_start:close], ctx, first_index)
        while close >= 0:
            decoded = self._checked(text[body_start:close], ctx, first_index)
            if not isinstance(decoded, str):
                return close + len(self.block_close), decoded
            first_error = first_error or decoded
            close = text.find(self.block_close, close + len(self.block_close))
        return first_end, first_error or "invalid block"

    def _checked(self, body: str, ctx: ParseContext, first_index: int) -> list[ToolCall] | str:
        """`decode_block`, with the checks every family shares: no exception escapes, a
        call names a tool the request declared (when it declared any), no lone surrogate."""
        try:
            decoded = self.decode_block(body, ctx, first_index)
        except ValueError as exc:  # the family's own word on what is wrong
            return str(exc)
        except (TypeError, RecursionError) as exc:
            return f"{type(exc).__name__}: {exc}"
        if isinstance(decoded, str):
            return decoded
        if not decoded:
            return "no tool call in the block"
        for call in decoded:
            if ctx.tools and call.name not in ctx.tools:
                return f"unknown tool {call.name!r}"
            if _SURROGATE.search(call.name) or _SURROGATE.search(call.arguments):
                # A `\ud800` escape decodes to text no client reply or record can encode.
                return "a lone surrogate escape in the name or arguments"
        return decoded

    def _drop_wrappers(self, text: str) -> str:
        for wrapper in self.wrappers:
            text = text.replace(wrapper, "")
        return text


_SURROGATE = re.compile(r"[\ud800-\udfff]")


@functools.cache
def _end_pattern(markers: tuple[str, ...]) -> re.Pattern[str]:
    """The end markers at the end of a text; built once per parser's markers (building it
    on every parse was a tenth of the parse)."""
    return re.compile("(?:" + "|".join(re.escape(m) for m in markers) + r")\s*$")


def skip_ws(text: str, i: int) -> int:
    """The first index at or after `i` that is not whitespace."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _first_of(text: str, tags: Sequence[str], start: int) -> tuple[int, str]:
    """(index, tag) of the earliest of `tags` in `text[start:]`; (-1, "") if none."""
    best, found = -1, ""
    for tag in tags:
        at = text.find(tag, start)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, tag
    return best, found


class TaggedSplitter:
    """The incremental form of `TaggedParser.parse` (see the module docstring)."""

    def __init__(self, parser: TaggedParser, ctx: ParseContext) -> None:
        self.parser = parser
        self.ctx = ctx
        self.text = ""
        self.pos = 0
        self.phase: Literal["start", "reasoning", "content", "block"] = "start"
        self.calls = 0
        self._pending_ws = {"reasoning": "", "content": ""}
        self._started = {"reasoning": False, "content": False}
        self._closes_seen = 0  # closing markers seen in the current block
        p = parser
        self._reasoning_stops = (*p.reasoning_enders, *p.end_markers)
        self._content_stops = (p.block_open, *p.wrappers, *p.end_markers)

    def feed(self, text: str) -> list[StreamEvent]:
        self.text += text
        events: list[StreamEvent] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[StreamEvent]) -> bool:
        """Advance as far as is certain; True when a phase changed (step again)."""
        p = self.parser
        if self.phase == "start":
            return self._start()
        rest = self.text[self.pos :]
        if self.phase == "reasoning":
            assert p.reasoning_tags is not None
            at, ender = _first_of(rest, p.reasoning_enders, 0)
            if at >= 0:
                self._emit(events, "reasoning", rest[:at])
                self.pos += at + (len(ender) if ender == p.reasoning_tags[1] else 0)
                self.phase = "content"
                return True
            safe = _safe_length(rest, self._reasoning_stops, p.end_markers)
            self._emit(events, "reasoning", rest[:safe])
            self.pos += safe
            return False
        if self.phase == "content":
            at, tag = _first_of(rest, (p.block_open, *p.wrappers), 0)
            if at >= 0:
                self._emit(events, "content", rest[:at])
                if tag == p.block_open:
                    self.pos += at
                    self.phase, self._closes_seen = "block", 0
                else:
                    self.pos += at + len(tag)
                return True
            safe = _safe_length(rest, self._content_stops, p.end_markers)
            self._emit(events, "content", rest[:safe])
            self.pos += safe
            return False
        return self._block(events, rest)

    def _start(self) -> bool:
        p = self.parser
        if p.reasoning_tags is None:
            self.phase = "content"
            return True
        think_open = p.reasoning_tags[0]
        lead = self.text.lstrip()
        if not lead or (len(lead) < len(think_open) and think_open.startswith(lead)):
            return False
        if lead.startswith(think_open):
            self.pos = len(self.text) - len(lead) + len(think_open)
            self.phase = "reasoning"
        else:
            opened = self.ctx.starts_in_reasoning or p.reasons_first
            self.phase = "reasoning" if opened else "content"
        return True

    def _block(self, events: list[StreamEvent], rest: str) -> bool:
        """A block is tried again only when another closing marker arrived; one that
        never decodes holds back the rest. Without a closing marker, the finish decides."""
        p = self.parser
        if p.block_close is None:
            return False
        closes = rest.count(p.block_close)
        if closes == self._closes_seen:
            return False
        self._closes_seen = closes
        end, decoded = p.read_block(self.text, self.pos + len(p.block_open), self.ctx, self.calls)
        if isinstance(decoded, str):
            return False
        events += [ToolCallDone(call) for call in decoded]
        self.calls += len(decoded)
        self.pos = end
        self.phase = "content"
        return True

    def _emit(
        self, events: list[StreamEvent], field: Literal["reasoning", "content"], s: str
    ) -> None:
        """Send `s` with the parse's strip applied: leading whitespace of the field is
        dropped, trailing whitespace waits for text after it."""
        if not self._started[field]:
            s = s.lstrip()
        text = self._pending_ws[field] + s
        kept = text.rstrip()
        self._pending_ws[field] = text[len(kept) :]
        if kept:
            self._started[field] = True
            events.append(TextDelta(field, kept))


def _safe_length(rest: str, tags: Sequence[str], end_markers: Sequence[str]) -> int:
    """How much of `rest` no further text can reinterpret: not a trailing start of a tag,
    nor trailing whitespace and end markers (the parse strips those at the end). A whole
    tag counts as a start of itself: MiniMax's `[e~[` ends with its own first character,
    so looking at proper starts only held back that `[` and let `[e~` out."""
    end = len(rest)
    held = 0
    for tag in tags:
        for k in range(min(len(tag), end), held, -1):
            if rest.endswith(tag[:k]):
                held = k
                break
    end -= held
    while True:
        trimmed = len(rest[:end].rstrip())
        for marker in end_markers:
            if trimmed >= len(marker) and rest.startswith(marker, trimmed - len(marker)):
                trimmed -= len(marker)
                break
        if trimmed == end:
            return end
        end = trimmed
