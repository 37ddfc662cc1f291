"""Server-sent events as the adapters write them.

A streamed reply re-emits an already complete result: the Gateway needs the whole sampled
token sequence before it can split reasoning, content and tool calls. Text is cut into
small pieces so clients really concatenate deltas, as they would from a live stream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from starlette.responses import StreamingResponse

SSE_PIECE_CHARS = 16
"""Text deltas are split into pieces of this many characters."""


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
