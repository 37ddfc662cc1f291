"""The interface of an output parser: one model family's way of writing reasoning, content
and tool calls, read from the whole output or while the tokens arrive.

The Gateway keeps the sampled token IDs as the truth; a parser only derives what the agent
sees. Hence parsers never raise: a malformed tool call is handed back as plain text and
flagged in `ParsedOutput.parse_error`, so the agent (and the recorded trajectory) still
sees what the model wrote. Tool-call IDs are derived from the call ID so a replay yields
identical IDs.

A stream must show the agent text before the output is complete without ever showing
something the whole-output parse would not: every event a `Splitter` emits is a prefix of
what `parse` gives for the finished output (the stream writers then emit the rest from
it). A family without an incremental form returns no splitter; its stream shows the
output at the finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.canonical import ParsedOutput, ToolCall


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


class Splitter(Protocol):
    """The incremental form of one call's parse: decoded text in, stream events out."""

    def feed(self, text: str) -> list[StreamEvent]: ...


class OutputParser(Protocol):
    """Turns the decoded output of one engine call into a `ParsedOutput`, whole or as it
    arrives."""

    name: str

    def parse(self, text: str, *, call_id: str, starts_in_reasoning: bool = False) -> ParsedOutput:
        """`starts_in_reasoning`: the generation prompt already opened the reasoning block."""
        ...

    def splitter(self, call_id: str, starts_in_reasoning: bool) -> Splitter | None:
        """A fresh splitter for one streamed call; None: no incremental form."""
        ...


def tool_call_id(call_id: str, index: int) -> str:
    """Deterministic tool-call ID: same engine call + index → same ID on replay."""
    return f"call_{call_id}_{index}"
