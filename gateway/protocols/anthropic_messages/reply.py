"""Anthropic Messages replies: the `message` object, the Messages event stream,
`count_tokens` replies and Anthropic-shaped errors.

The thinking signature is a deterministic opaque token of the call id and the reasoning, so
a verbatim echo restores our reasoning even if the client hid its text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from starlette.responses import JSONResponse, Response

from gateway import json_text
from gateway.canonical import Reply, ToolCall
from gateway.errors import GatewayError
from gateway.protocols.json_reply import json_reply
from gateway.protocols.opaque_token import TokenSeal
from gateway.protocols.sse import (
    SSE_PIECE_CHARS,
    Sent,
    StreamHead,
    event_frame,
    event_stream_response,
    head_of,
    log,
    pieces,
    replay,
)

# --- errors -----------------------------------------------------------------------------------

ANTHROPIC_ERRORS: dict[str, tuple[str, int | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "authentication": ("authentication_error", None),
    "forbidden": ("permission_error", None),
    "not_found": ("not_found_error", None),
    "method_not_allowed": ("invalid_request_error", None),
    "conflict": ("invalid_request_error", None),
    "idempotency_mismatch": ("invalid_request_error", None),
    "too_large": ("request_too_large", None),
    "unsupported_media_type": ("invalid_request_error", None),
    "request_timeout": ("invalid_request_error", None),
    "rate_limited": ("rate_limit_error", None),
    "overloaded": ("overloaded_error", 529),
    "engine_unavailable": ("overloaded_error", 529),
    "engine_timeout": ("timeout_error", None),
    "engine_bad_reply": ("api_error", None),
    "storage_unavailable": ("api_error", None),
    "corrupt_record": ("api_error", None),
    "internal": ("api_error", None),
}
"""Our kind → (Anthropic error `type`, status override). Overload is 529, which Claude Code
and the SDK retry with back-off; an overload raised as 429 stays a `rate_limit_error`."""


def _error_type_and_status(err: GatewayError) -> tuple[str, int]:
    if err.kind == "overloaded" and err.status == 429:
        return "rate_limit_error", 429
    kind, status = ANTHROPIC_ERRORS[err.kind]
    return kind, status if status is not None else err.status


def anthropic_error_status(err: GatewayError) -> int:
    return _error_type_and_status(err)[1]


def anthropic_error_body(err: GatewayError) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`, Anthropic's error shape."""
    return {
        "type": "error",
        "error": {"type": _error_type_and_status(err)[0], "message": err.message},
    }


def anthropic_error_response(err: GatewayError) -> JSONResponse:
    return JSONResponse(
        anthropic_error_body(err), status_code=anthropic_error_status(err), headers=err.headers()
    )


def sse_error_event(err: GatewayError) -> bytes:
    """An in-stream `event: error` record (the SDK raises on it). Only for failures after a
    stream has started; before that, send `anthropic_error_response`."""
    return event_frame("error", anthropic_error_body(err))


def count_tokens_body(input_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens}


# --- replies ----------------------------------------------------------------------------------


def message_id(result: Reply) -> str:
    return f"msg_{result.call_id}"


def thinking_signature(result: Reply, seal: TokenSeal) -> str:
    """Deterministic in the session and the call; carries the reasoning so a verbatim
    echo restores it."""
    return seal.encode("thinking", result.call_id, result.output.reasoning or "")


def stop_reason(result: Reply, stop_sequence: str | None = None) -> str:
    if result.output.tool_calls:
        return "tool_use"
    if result.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def _usage(result: Reply) -> dict[str, int]:
    """Cached prompt tokens are reported as cache reads, as Anthropic does (input excludes
    them), so Claude Code's context sum input + cache_read + output stays right."""
    return {
        "input_tokens": result.prompt_tokens - result.cached_prompt_tokens,
        "output_tokens": result.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": result.cached_prompt_tokens,
    }


_MAY_HOLD_FLOAT = re.compile(r"[0-9][.eE]|NaN|Infinity")
"""Tool-call arguments a float could be parsed from (a tool input is the only place a
reply body holds one): their reply is written by the stdlib encoder (`json_reply`)."""


def _tool_input(tc: ToolCall) -> tuple[dict[str, Any], str]:
    """`input` object and its JSON text. The output parser only yields JSON objects; anything
    else is wrapped under `arguments` rather than lost."""
    try:  # a `\ud800` escape would decode to text the reply cannot encode: keep it wrapped
        value = json_text.loads(tc.arguments, allow_nan=True)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value, tc.arguments
    wrapped = {"arguments": tc.arguments}
    return wrapped, json.dumps(wrapped, ensure_ascii=False)


def content_blocks(
    result: Reply, seal: TokenSeal, include_thinking: bool = True
) -> list[dict[str, Any]]:
    """thinking, text, tool_use — in that order; an otherwise empty reply gets one empty
    text block."""
    out = result.output
    blocks: list[dict[str, Any]] = []
    if include_thinking and out.reasoning:
        blocks.append(
            {
                "type": "thinking",
                "thinking": out.reasoning,
                "signature": thinking_signature(result, seal),
            }
        )
    if out.content:
        blocks.append({"type": "text", "text": out.content})
    for tc in out.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": tc.id, "name": tc.name, "input": _tool_input(tc)[0]}
        )
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def messages_body(
    result: Reply,
    seal: TokenSeal,
    *,
    include_thinking: bool = True,
    stop_sequence: str | None = None,
) -> dict[str, Any]:
    """Non-stream `message` object. `stop_sequence`: the stop string that ended generation,
    if known (makes `stop_reason` `stop_sequence`)."""
    reason = stop_reason(result, stop_sequence)
    return {
        "id": message_id(result),
        "type": "message",
        "role": "assistant",
        "model": result.model,
        "content": content_blocks(result, seal, include_thinking),
        "stop_reason": reason,
        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
        "usage": _usage(result),
    }


class MessagesStreamWriter:
    """The Messages event stream of one call; every record has its `event:` line (the SDK
    drops records without one). Thinking and text blocks stream live; tool_use blocks come
    at the finish, after the text block, as in the `message` object (the model may still
    write text after a call)."""

    def __init__(
        self,
        head: StreamHead,
        seal: TokenSeal,
        *,
        include_thinking: bool = True,
        stop_sequence: str | None = None,
    ) -> None:
        self.head = head
        self.seal = seal
        self.include_thinking = include_thinking
        self.stop_sequence = stop_sequence
        self.sent = Sent()
        self.blocks = 0
        self.open: str | None = None  # type of the open block: "thinking" or "text"
        self.text_seen = False

    @staticmethod
    def _event(kind: str, **fields: Any) -> bytes:
        return event_frame(kind, {"type": kind, **fields})

    def start(self) -> list[bytes]:
        h = self.head
        message = {
            "id": f"msg_{h.call_id}",
            "type": "message",
            "role": "assistant",
            "model": h.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": h.prompt_tokens - h.cached_prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": h.cached_prompt_tokens,
            },
        }
        return [self._event("message_start", message=message), self._event("ping")]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        frames = []
        if self.open == "thinking":
            signature = self.seal.encode("thinking", self.head.call_id, self.sent.reasoning)
            frames.append(
                self._event(
                    "content_block_delta",
                    index=self.blocks - 1,
                    delta={"type": "signature_delta", "signature": signature},
                )
            )
        frames.append(self._event("content_block_stop", index=self.blocks - 1))
        self.open = None
        return frames

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        frames = self._close()
        frames.append(self._event("content_block_start", index=self.blocks, content_block=block))
        self.blocks += 1
        self.open = block["type"] if block["type"] in ("thinking", "text") else None
        return frames

    def reasoning(self, text: str) -> list[bytes]:
        if not self.include_thinking:
            self.sent.reasoning += text
            return []
        if self.text_seen or (self.blocks and self.open != "thinking"):
            log.warning("call %s: thinking after text; not streamed", self.head.call_id)
            return []
        self.sent.reasoning += text
        frames = []
        if self.open != "thinking":
            frames += self._open({"type": "thinking", "thinking": "", "signature": ""})
        delta = {"type": "thinking_delta", "thinking": text}
        frames.append(self._event("content_block_delta", index=self.blocks - 1, delta=delta))
        return frames

    def content(self, text: str) -> list[bytes]:
        self.sent.content += text
        frames = []
        if self.open != "text":
            self.text_seen = True
            frames += self._open({"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        frames.append(self._event("content_block_delta", index=self.blocks - 1, delta=delta))
        return frames

    def tool_call(self, call: ToolCall) -> list[bytes]:
        self.sent.tool_calls.append(call)  # sent at the finish, after the text
        return []

    def finish(self, result: Reply) -> list[bytes]:
        held, self.sent.tool_calls = self.sent.tool_calls, []
        if held != result.output.tool_calls[: len(held)]:
            log.warning(
                "call %s: streamed tool calls differ from the parsed output", result.call_id
            )
        out = result.output
        reasoning, content, _ = self.sent.rest(
            out.model_copy(update={"tool_calls": []}), result.call_id
        )
        frames = self.reasoning(reasoning) if reasoning else []
        if content:
            frames += self.content(content)
        if not self.blocks and not out.tool_calls:
            frames += self._open({"type": "text", "text": ""})
        for tc in out.tool_calls:
            block = {"type": "tool_use", "id": tc.id, "name": tc.name, "input": {}}
            frames += self._open(block)
            for piece in pieces(_tool_input(tc)[1], SSE_PIECE_CHARS):
                delta = {"type": "input_json_delta", "partial_json": piece}
                frames.append(
                    self._event("content_block_delta", index=self.blocks - 1, delta=delta)
                )
            frames.append(self._event("content_block_stop", index=self.blocks - 1))
        frames += self._close()
        body = messages_body(
            result,
            self.seal,
            include_thinking=self.include_thinking,
            stop_sequence=self.stop_sequence,
        )
        frames.append(
            self._event(
                "message_delta",
                delta={"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]},
                usage=body["usage"],
            )
        )
        frames.append(self._event("message_stop"))
        return frames

    def fail(self, err: GatewayError) -> list[bytes]:
        return [sse_error_event(err)]


def messages_sse(
    result: Reply,
    seal: TokenSeal,
    *,
    include_thinking: bool = True,
    stop_sequence: str | None = None,
    piece_chars: int = SSE_PIECE_CHARS,
) -> Iterator[bytes]:
    """Re-emit a complete result as the Messages event stream."""
    writer = MessagesStreamWriter(
        head_of(result), seal, include_thinking=include_thinking, stop_sequence=stop_sequence
    )
    return replay(writer, result, piece_chars)


def messages_response(
    result: Reply,
    seal: TokenSeal,
    *,
    stream: bool,
    include_thinking: bool = True,
    stop_sequence: str | None = None,
) -> Response:
    """Starlette response for a finished `/v1/messages` call, streamed or not."""
    if stream:
        return event_stream_response(
            messages_sse(
                result, seal, include_thinking=include_thinking, stop_sequence=stop_sequence
            )
        )
    body = messages_body(
        result, seal, include_thinking=include_thinking, stop_sequence=stop_sequence
    )
    if any(_MAY_HOLD_FLOAT.search(tc.arguments) for tc in result.output.tool_calls):
        return JSONResponse(body)  # a tool input's floats as the stdlib encoder spells them
    return json_reply(body)


def count_tokens_response(input_tokens: int) -> Response:
    return JSONResponse(count_tokens_body(input_tokens))
