"""Server-sent events as the adapters write them, live or replayed.

A live stream is written while the engine samples (`gateway.http.streaming`): each protocol's
writer gets text and tool calls as the incremental splitter releases them, then the
finished result, from which it sends whatever the splitter still held back and the
closing events. A finished result (a retry answered from the record) is replayed through
the same writer, its text cut into small pieces so clients really concatenate deltas.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.responses import StreamingResponse

from gateway.canonical import ParsedOutput, Reply, ToolCall
from gateway.errors import GatewayError

log = logging.getLogger("rollout.gateway")

SSE_PIECE_CHARS = 16
"""Text deltas of a replayed result are split into pieces of this many characters."""


def pieces(text: str, size: int = SSE_PIECE_CHARS) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]


def _json(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def data_frame(data: Any) -> bytes:
    """One `data:` record without an `event:` line (Chat Completions SSE)."""
    return f"data: {_json(data)}\n\n".encode()


def event_frame(event: str, data: Mapping[str, Any]) -> bytes:
    """One record with an `event:` line (Anthropic's SDK requires it; Codex ignores it)."""
    return f"event: {event}\ndata: {_json(data)}\n\n".encode()


def event_stream_response(frames: Iterator[bytes]) -> StreamingResponse:
    """A `text/event-stream` response that proxies must not cache."""
    return StreamingResponse(
        frames, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


@dataclass(frozen=True)
class StreamHead:
    """What a stream's first events say, known before the engine samples anything."""

    call_id: str
    model: str
    created: int
    prompt_tokens: int
    cached_prompt_tokens: int


def head_of(result: Reply) -> StreamHead:
    return StreamHead(
        result.call_id,
        result.model,
        result.created,
        result.prompt_tokens,
        result.cached_prompt_tokens,
    )


@dataclass
class Sent:
    """What a writer has sent of the output, so its finish sends exactly the rest."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def rest(self, output: ParsedOutput, call_id: str) -> tuple[str, str, list[ToolCall]]:
        """(reasoning, content, tool calls) still to send for the finished `output`. What
        was sent is always a start of it (see `parsers.stream`); if not, the stream already
        showed something else, which is logged, and nothing more is sent for that field."""
        rests: list[str] = []
        for name, sent, final in (
            ("reasoning", self.reasoning, output.reasoning or ""),
            ("content", self.content, output.content or ""),
        ):
            if final.startswith(sent):
                rests.append(final[len(sent) :])
            else:
                log.warning("call %s: streamed %s differs from the parsed output", call_id, name)
                rests.append("")
        if output.tool_calls[: len(self.tool_calls)] != self.tool_calls:
            log.warning("call %s: streamed tool calls differ from the parsed output", call_id)
        return rests[0], rests[1], output.tool_calls[len(self.tool_calls) :]


class StreamWriter(Protocol):
    """One protocol's event stream for one call: each method returns the frames to send."""

    def start(self) -> list[bytes]: ...

    def reasoning(self, text: str) -> list[bytes]: ...

    def content(self, text: str) -> list[bytes]: ...

    def tool_call(self, call: ToolCall) -> list[bytes]: ...

    def finish(self, result: Reply) -> list[bytes]:
        """The rest of the output and the closing events (usage, stop reason)."""
        ...

    def fail(self, err: GatewayError) -> list[bytes]:
        """The protocol's in-stream error, for a call that fails after the stream began."""
        ...


def replay(
    writer: StreamWriter, result: Reply, piece_chars: int = SSE_PIECE_CHARS
) -> Iterator[bytes]:
    """A finished result as a stream, written like a live one."""
    yield from writer.start()
    out = result.output
    for piece in pieces(out.reasoning or "", piece_chars):
        yield from writer.reasoning(piece)
    for piece in pieces(out.content or "", piece_chars):
        yield from writer.content(piece)
    for call in out.tool_calls:
        yield from writer.tool_call(call)
    yield from writer.finish(result)
