"""OpenAI Chat Completions replies: `chat.completion` objects, `chat.completion.chunk`
streams and OpenAI-shaped errors (which the control API uses too)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from starlette.responses import JSONResponse, Response

from gateway.canonical import Reply, ToolCall
from gateway.errors import GatewayError
from gateway.protocols.json_reply import json_reply
from gateway.protocols.sse import (
    SSE_PIECE_CHARS,
    Sent,
    StreamHead,
    data_frame,
    event_stream_response,
    head_of,
    pieces,
    replay,
)

SSE_DONE = b"data: [DONE]\n\n"

# --- errors -----------------------------------------------------------------------------------

OPENAI_ERROR_TYPES: dict[str, str] = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "forbidden": "permission_error",
    "not_found": "not_found_error",
    "method_not_allowed": "invalid_request_error",
    "conflict": "conflict_error",
    "idempotency_mismatch": "conflict_error",
    "too_large": "invalid_request_error",
    "unsupported_media_type": "invalid_request_error",
    "request_timeout": "invalid_request_error",
    "rate_limited": "rate_limit_error",
    "overloaded": "server_error",
    "engine_unavailable": "server_error",
    "engine_timeout": "server_error",
    "engine_bad_reply": "server_error",
    "storage_unavailable": "server_error",
    "corrupt_record": "server_error",
    "internal": "server_error",
}
"""Our kind → OpenAI's error `type`."""


def openai_error_body(err: GatewayError) -> dict[str, Any]:
    """OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`.

    `code` carries our machine kind so callers can branch without parsing messages.
    """
    return {
        "error": {
            "message": err.message,
            "type": OPENAI_ERROR_TYPES[err.kind],
            "param": err.param,
            "code": err.kind,
        }
    }


def completion_id(result: Reply) -> str:
    return f"chatcmpl-{result.call_id}"


def _finish_reason(result: Reply) -> Literal["stop", "length", "tool_calls"]:
    return "tool_calls" if result.output.tool_calls else result.finish_reason


def _usage(result: Reply) -> dict[str, Any]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_prompt_tokens},
    }


def _wire_tool_call(tc: ToolCall) -> dict[str, Any]:
    return {
        "id": tc.id,
        "type": "function",
        "function": {"name": tc.name, "arguments": tc.arguments},
    }


def chat_completion_body(result: Reply, include_reasoning: bool = True) -> dict[str, Any]:
    """Non-stream `chat.completion` object.

    Reasoning goes out under both `reasoning` (current vLLM) and `reasoning_content` (older
    vLLM, what many agents read). Content is null only when tool calls carry the turn.
    """
    out = result.output
    content = out.content
    if content is None and not out.tool_calls:
        content = ""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if include_reasoning and out.reasoning is not None:
        message["reasoning"] = out.reasoning
        message["reasoning_content"] = out.reasoning
    if out.tool_calls:
        message["tool_calls"] = [_wire_tool_call(tc) for tc in out.tool_calls]
    return {
        "id": completion_id(result),
        "object": "chat.completion",
        "created": result.created,
        "model": result.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish_reason(result),
            }
        ],
        "usage": _usage(result),
    }


class ChatStreamWriter:
    """The `chat.completion.chunk` stream of one call, ending in `[DONE]`. Tool calls go out
    as soon as they are complete; content may follow them (clients keep both apart)."""

    def __init__(
        self, head: StreamHead, include_usage: bool, *, include_reasoning: bool = True
    ) -> None:
        self.head = head
        self.include_usage = include_usage
        self.include_reasoning = include_reasoning
        self.sent = Sent()
        self.base = {
            "id": f"chatcmpl-{head.call_id}",
            "object": "chat.completion.chunk",
            "created": head.created,
            "model": head.model,
        }

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        body: dict[str, Any] = {
            **self.base,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if self.include_usage:
            body["usage"] = None
        return data_frame(body)

    def start(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def reasoning(self, text: str) -> list[bytes]:
        self.sent.reasoning += text
        if not self.include_reasoning:
            return []
        return [self._chunk({"reasoning": text, "reasoning_content": text})]

    def content(self, text: str) -> list[bytes]:
        self.sent.content += text
        return [self._chunk({"content": text})]

    def tool_call(self, call: ToolCall) -> list[bytes]:
        index = len(self.sent.tool_calls)
        self.sent.tool_calls.append(call)
        head = {"index": index, "id": call.id, "type": "function"}
        frames = [
            self._chunk(
                {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}
            )
        ]
        for piece in pieces(call.arguments, SSE_PIECE_CHARS):
            frames.append(
                self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
        return frames

    def finish(self, result: Reply) -> list[bytes]:
        reasoning, content, calls = self.sent.rest(result.output, result.call_id)
        frames = self.reasoning(reasoning) if reasoning else []
        if content:
            frames += self.content(content)
        for call in calls:
            frames += self.tool_call(call)
        frames.append(self._chunk({}, _finish_reason(result)))
        if self.include_usage:
            frames.append(data_frame({**self.base, "choices": [], "usage": _usage(result)}))
        frames.append(SSE_DONE)
        return frames

    def fail(self, err: GatewayError) -> list[bytes]:
        return [sse_error_event(err)]


def chat_completion_sse(
    result: Reply,
    include_usage: bool,
    *,
    include_reasoning: bool = True,
    piece_chars: int = SSE_PIECE_CHARS,
) -> Iterator[bytes]:
    """Re-emit a complete result as a `chat.completion.chunk` stream ending in `[DONE]`."""
    writer = ChatStreamWriter(head_of(result), include_usage, include_reasoning=include_reasoning)
    return replay(writer, result, piece_chars)


def sse_error_event(err: GatewayError) -> bytes:
    """An in-stream error frame (`data: {"error": ...}`), which the OpenAI SDK raises on.

    Only for failures after a stream has started; before that, send a plain JSON error.
    """
    return data_frame(openai_error_body(err))


def openai_error_response(err: GatewayError) -> JSONResponse:
    return JSONResponse(openai_error_body(err), status_code=err.status, headers=err.headers())


def chat_completion_response(
    result: Reply,
    *,
    stream: bool,
    include_usage: bool = False,
    include_reasoning: bool = True,
) -> Response:
    """Starlette response for a finished call, streamed or not."""
    if stream:
        return event_stream_response(
            chat_completion_sse(result, include_usage, include_reasoning=include_reasoning)
        )
    return json_reply(chat_completion_body(result, include_reasoning))
