"""The interface of an output parser: one model family's way of writing reasoning, content
and tool calls, read from the whole output or while the tokens arrive.

The Gateway keeps the sampled token IDs as the truth; a parser only derives what the agent
sees. Hence parsers never raise: a malformed tool call is handed back as plain text and
flagged in `ParsedOutput.parse_error`, so the agent (and the recorded trajectory) still
sees what the model wrote. Tool-call IDs are derived from the call ID (or read from the
output, for families whose model writes them) so a replay yields identical IDs.

A stream must show the agent text before the output is complete without ever showing
something the whole-output parse would not: every event a `Splitter` emits is a prefix of
what `parse` gives for the finished output (the stream writers then emit the rest from
it). A family without an incremental form returns no splitter; its stream shows the
output at the finish.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.canonical import ParsedOutput, Tool, ToolCall


@dataclass(frozen=True)
class ParseContext:
    """What a parse needs besides the text: which call it is (tool-call IDs derive from
    it), whether the prompt already opened the reasoning block, and the tools the request
    declared (name → JSON schema of the parameters), which type the arguments of formats
    that write every value as text."""

    call_id: str
    starts_in_reasoning: bool = False
    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, call_id: str, starts_in_reasoning: bool, tools: Sequence[Tool]) -> ParseContext:
        return cls(call_id, starts_in_reasoning, {tool.name: tool.parameters for tool in tools})


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
    arrives. Decoded text keeps special tokens (structural markers are text here)."""

    name: str
    reasoning_tags: tuple[str, str] | None
    """How a reasoning block opens and closes: the Gateway reads from the prompt's tail
    whether the generation prompt left one open. None: the family does not reason in tags."""
    end_markers: tuple[str, ...]
    """Markers that may end the output (end of turn); the parse drops them."""

    def parse(self, text: str, ctx: ParseContext) -> ParsedOutput: ...

    def splitter(self, ctx: ParseContext) -> Splitter | None:
        """A fresh splitter for one streamed call; None: no incremental form."""
        ...


def tool_call_id(call_id: str, index: int) -> str:
    """Deterministic tool-call ID: same engine call + index → same ID on replay."""
    return f"call_{call_id}_{index}"


_ALNUM = string.ascii_letters + string.digits


def alnum_call_id(call_id: str, index: int, length: int = 9) -> str:
    """Deterministic alphanumeric tool-call ID of a fixed length, for templates that accept
    no other (Mistral's demand 9 characters of [a-zA-Z0-9])."""
    digest = hashlib.sha256(f"{call_id}/{index}".encode()).digest()
    return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:length])
