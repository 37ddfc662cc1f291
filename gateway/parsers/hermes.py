"""The Hermes / Qwen3 family: `<think>` reasoning and `<tool_call>` JSON blocks, parsed
whole (`HermesParser.parse`) or while the tokens arrive (`HermesSplitter`).

The splitter holds back whatever the rest of the output could still change: a tail that
may be the start of a tag (`</think>`, `<tool_call>`, an end marker), whitespace (the parse
strips each field) and a tool-call block until it has parsed as a complete call. A block
that does not parse holds back everything after it; the finish shows it as the parse does.

One case stays out of reach: an output that did not open reasoning but later closes it
(a bare `</think>`) turns the text before it into reasoning only in hindsight; the
writers notice that the finished parse does not extend what they sent and log it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from gateway.canonical import ParsedOutput, ToolCall
from gateway.parsers.base import StreamEvent, TextDelta, ToolCallDone, tool_call_id


class HermesParser:
    """Qwen3 / Hermes style output.

    Layout: `[<think>]reasoning</think>\\n\\ncontent<tool_call>\\n{json}\\n</tool_call>...`,
    optionally followed by an end-of-turn marker. The JSON is `{"name", "arguments"}` where
    arguments is an object or a JSON string.
    """

    def __init__(
        self,
        name: str = "qwen3",
        *,
        think_open: str = "<think>",
        think_close: str = "</think>",
        call_open: str = "<tool_call>",
        call_close: str = "</tool_call>",
        end_markers: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>"),
    ) -> None:
        self.name = name
        self.think_open = think_open
        self.think_close = think_close
        self.call_open = call_open
        self.call_close = call_close
        self.end_markers = end_markers
        self._end_re = re.compile("(?:" + "|".join(re.escape(m) for m in end_markers) + r")\s*$")

    def parse(self, text: str, *, call_id: str, starts_in_reasoning: bool = False) -> ParsedOutput:
        body = self._strip_end_markers(text)
        reasoning, rest = self._split_reasoning(body, starts_in_reasoning)
        content, calls, errors = self._split_tool_calls(rest, call_id)
        return ParsedOutput(
            reasoning=_none_if_empty(reasoning.strip()) if reasoning is not None else None,
            content=_none_if_empty(content.strip()),
            tool_calls=calls,
            parse_error="; ".join(errors) if errors else None,
        )

    def splitter(self, call_id: str, starts_in_reasoning: bool) -> HermesSplitter:
        return HermesSplitter(self, call_id, starts_in_reasoning)

    def _strip_end_markers(self, text: str) -> str:
        if not self.end_markers:
            return text
        # Repeat: a model may emit e.g. "<|im_end|>" then "<|endoftext|>".
        while True:
            stripped = self._end_re.sub("", text, count=1)
            if stripped == text:
                return text
            text = stripped

    def _split_reasoning(self, text: str, starts_in_reasoning: bool) -> tuple[str | None, str]:
        """(reasoning or None, remaining text). An unclosed block is all reasoning."""
        lead = text.lstrip()
        if lead.startswith(self.think_open):
            text, starts_in_reasoning = lead[len(self.think_open) :], True
        close_at = text.find(self.think_close)
        if starts_in_reasoning and close_at < 0:
            return text, ""
        # A bare "</think>" with no opener means the template opened it without telling us.
        if close_at >= 0 and (starts_in_reasoning or self.think_open not in text[:close_at]):
            return text[:close_at], text[close_at + len(self.think_close) :]
        return None, text

    def _split_tool_calls(self, text: str, call_id: str) -> tuple[str, list[ToolCall], list[str]]:
        content_parts: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        decoder = json.JSONDecoder()
        blocks = 0  # 1-based ordinal of the <tool_call> block, for error messages
        while True:
            start = text.find(self.call_open, pos)
            if start < 0:
                content_parts.append(text[pos:])
                break
            content_parts.append(text[pos:start])
            blocks += 1
            json_start = _skip_ws(text, start + len(self.call_open))
            end, parsed, error = self._read_call(text, json_start, decoder)
            if error is None and parsed is not None:
                name, arguments = parsed
                calls.append(
                    ToolCall(id=tool_call_id(call_id, len(calls)), name=name, arguments=arguments)
                )
            else:
                errors.append(f"tool call block {blocks}: {error}")
                content_parts.append(text[start:end])
            pos = end
        return "".join(content_parts), calls, errors

    def _read_call(
        self, text: str, json_start: int, decoder: json.JSONDecoder
    ) -> tuple[int, tuple[str, str] | None, str | None]:
        """Parse one block starting after `<tool_call>`: (end index, (name, args), error)."""
        try:
            obj, json_end = decoder.raw_decode(text, json_start)
        except RecursionError:
            close = text.find(self.call_close, json_start)
            end = len(text) if close < 0 else close + len(self.call_close)
            return end, None, "JSON nested too deeply"
        except json.JSONDecodeError as exc:
            close = text.find(self.call_close, json_start)
            if close < 0:
                return len(text), None, f"unclosed {self.call_open} with invalid JSON"
            return close + len(self.call_close), None, f"invalid JSON ({exc.msg})"
        close_at = _skip_ws(text, json_end)
        if not text.startswith(self.call_close, close_at):
            close = text.find(self.call_close, json_end)
            if close < 0:
                return len(text), None, f"unclosed {self.call_open}"
            return close + len(self.call_close), None, "unexpected text after the JSON"
        end = close_at + len(self.call_close)
        parsed, error = _name_and_arguments(obj)
        if parsed is not None and any(_SURROGATE.search(part) for part in parsed):
            # A `\ud800` escape decodes to text no client reply or record can encode.
            return end, None, "a lone surrogate escape in the name or arguments"
        return end, parsed, error


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _name_and_arguments(obj: Any) -> tuple[tuple[str, str] | None, str | None]:
    if not isinstance(obj, dict):
        return None, "tool call JSON is not an object"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, "tool call has no name"
    args = obj.get("arguments")
    if args is None:
        args = obj.get("parameters")
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            return None, f"arguments of {name!r} are a string but not JSON"
        if not isinstance(decoded, dict):
            return None, f"arguments of {name!r} are not a JSON object"
        return (name, args), None
    if isinstance(args, dict):
        # Same spelling as the chat template's tojson, so an echo re-renders identically.
        return (name, json.dumps(args, ensure_ascii=False)), None
    return None, f"arguments of {name!r} are not an object"


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _none_if_empty(s: str) -> str | None:
    return s or None


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
