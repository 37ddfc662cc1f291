"""Split sampled text into reasoning, content and tool calls, per model family.

The Gateway keeps the sampled token IDs as the truth; this only derives what the agent sees.
Hence parsers never raise: a malformed tool call is handed back as plain text and flagged in
`ParsedOutput.parse_error`, so the agent (and the recorded trajectory) still sees what the
model wrote. Tool-call IDs are derived from the call ID so a replay yields identical IDs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Protocol

from gateway.canonical import ParsedOutput, ToolCall


class OutputParser(Protocol):
    """Turns the decoded output of one engine call into a `ParsedOutput`."""

    name: str

    def parse(self, text: str, *, call_id: str, starts_in_reasoning: bool = False) -> ParsedOutput:
        """`starts_in_reasoning`: the generation prompt already opened the reasoning block."""
        ...


_REGISTRY: dict[str, Callable[[], OutputParser]] = {}


def register_parser(name: str, factory: Callable[[], OutputParser]) -> None:
    """Register a parser factory under a model-family name (e.g. "qwen3")."""
    _REGISTRY[name] = factory


def get_parser(name: str) -> OutputParser:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown output parser {name!r}; known: {sorted(_REGISTRY)}") from None
    return factory()


def parser_names() -> list[str]:
    return sorted(_REGISTRY)


def tool_call_id(call_id: str, index: int) -> str:
    """Deterministic tool-call ID: same engine call + index → same ID on replay."""
    return f"call_{call_id}_{index}"


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


register_parser("qwen3", lambda: HermesParser("qwen3"))
register_parser("hermes", lambda: HermesParser("hermes"))
