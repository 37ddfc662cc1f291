"""Reasoning, content and tool calls split while the tokens are still arriving.

The non-stream path parses the whole decoded output once (`output_parser`). A stream must
show the agent text before the output is complete, without ever showing something the
whole-output parse would not: every piece emitted here is a prefix of what that parse
gives for the finished output (the stream writers then emit the rest from it). So the
splitter holds back whatever the rest of the output could still change: a tail that may
be the start of a tag (`</think>`, `<tool_call>`, an end marker), whitespace (the parse
strips each field) and a tool-call block until it has parsed as a complete call. A block
that does not parse holds back everything after it; the finish shows it as the parse does.

One case stays out of reach: an output that did not open reasoning but later closes it
(a bare `</think>`) turns the text before it into reasoning only in hindsight; the
writers notice that the finished parse does not extend what they sent and log it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.canonical import ToolCall
from gateway.parsers.hermes import HermesParser, OutputParser, tool_call_id
from gateway.prompt.incremental import Tokenizer


@dataclass(frozen=True)
class TextDelta:
    """More reasoning or content text (to append to what was sent)."""

    field: Literal["reasoning", "content"]
    text: str


@dataclass(frozen=True)
class ToolCallDone:
    """A tool call whose block is complete: the same `ToolCall` the whole parse yields."""

    call: ToolCall


StreamEvent = TextDelta | ToolCallDone


class IncrementalDecoder:
    """Token ids → text deltas. A token that ends inside a multi-byte character decodes to
    U+FFFD on its own, so text is released only once the character is complete, and
    decoded with a few tokens before it so a byte-level tokenizer joins them right."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # ids up to here are already in the released text

    def feed(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        if len(self.ids) == self._read:
            return ""
        before = self.tokenizer.decode(self.ids[self._prefix : self._read])
        after = self.tokenizer.decode(self.ids[self._prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]


class HermesSplitter:
    """The incremental form of `HermesParser.parse` (see the module docstring)."""

    def __init__(self, parser: HermesParser, call_id: str, starts_in_reasoning: bool) -> None:
        self.parser = parser
        self.call_id = call_id
        self.starts_in_reasoning = starts_in_reasoning
        self.text = ""
        self.pos = 0
        self.phase: Literal["start", "reasoning", "content", "tool"] = "start"
        self.calls = 0
        self._pending_ws = {"reasoning": "", "content": ""}
        self._started = {"reasoning": False, "content": False}
        self._closes_seen = 0  # `</tool_call>` tags seen in the current block
        self._decoder = json.JSONDecoder()
        p = parser
        self._reasoning_tags = (p.think_close, *p.end_markers)
        self._content_tags = (p.call_open, *p.end_markers)

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
            lead = self.text.lstrip()
            if not lead or (len(lead) < len(p.think_open) and p.think_open.startswith(lead)):
                return False
            if lead.startswith(p.think_open):
                self.pos = len(self.text) - len(lead) + len(p.think_open)
                self.phase = "reasoning"
            else:
                self.phase = "reasoning" if self.starts_in_reasoning else "content"
            return True
        rest = self.text[self.pos :]
        if self.phase == "reasoning":
            close = rest.find(p.think_close)
            if close >= 0:
                self._emit(events, "reasoning", rest[:close])
                self.pos += close + len(p.think_close)
                self.phase = "content"
                return True
            safe = _safe_length(rest, self._reasoning_tags, p.end_markers)
            self._emit(events, "reasoning", rest[:safe])
            self.pos += safe
            return False
        if self.phase == "content":
            opening = rest.find(p.call_open)
            if opening >= 0:
                self._emit(events, "content", rest[:opening])
                self.pos += opening
                self.phase, self._closes_seen = "tool", 0
                return True
            safe = _safe_length(rest, self._content_tags, p.end_markers)
            self._emit(events, "content", rest[:safe])
            self.pos += safe
            return False
        return self._tool_block(events, rest)

    def _tool_block(self, events: list[StreamEvent], rest: str) -> bool:
        """A block parses only once a `</tool_call>` follows its JSON, so it is tried again
        only when another one arrived; one that never parses holds back the rest."""
        p = self.parser
        closes = rest.count(p.call_close)
        if closes == self._closes_seen:
            return False
        self._closes_seen = closes
        start = self.pos + len(p.call_open)
        while start < len(self.text) and self.text[start] in " \t\r\n":
            start += 1
        end, parsed, error = p._read_call(self.text, start, self._decoder)
        if error is not None or parsed is None:
            return False
        name, arguments = parsed
        call_id = tool_call_id(self.call_id, self.calls)
        events.append(ToolCallDone(ToolCall(id=call_id, name=name, arguments=arguments)))
        self.calls += 1
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
    nor trailing whitespace and end markers (the parse strips those at the end)."""
    end = len(rest)
    held = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, end), held, -1):
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


class OutputStream:
    """Sampled ids of one call in, stream events out."""

    def __init__(
        self, tokenizer: Tokenizer, parser: OutputParser, call_id: str, starts_in_reasoning: bool
    ) -> None:
        self.decoder = IncrementalDecoder(tokenizer)
        # Another parser family has no incremental form: its output comes at the finish.
        self.splitter = (
            HermesSplitter(parser, call_id, starts_in_reasoning)
            if isinstance(parser, HermesParser)
            else None
        )

    def feed(self, ids: Sequence[int]) -> list[StreamEvent]:
        text = self.decoder.feed(ids)
        if not text or self.splitter is None:
            return []
        return self.splitter.feed(text)
