"""OpenAI Chat Completions replies: `chat.completion` objects, `chat.completion.chunk`
streams and OpenAI-shaped errors (which the control API uses too)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from starlette.responses import JSONResponse, Response

from gateway.adapters.sse import (
    SSE_PIECE_CHARS,
    data_frame,
    event_stream_response,
    pieces,
)
from gateway.canonical import CompletionResult, ToolCall
from gateway.errors import GatewayError, openai_error_body

SSE_DONE = b"data: [DONE]\n\n"


def completion_id(result: CompletionResult) -> str:
    return f"chatcmpl-{result.call_id}"


def _finish_reason(result: CompletionResult) -> Literal["stop", "length", "tool_calls"]:
    return "tool_calls" if result.output.tool_calls else result.finish_reason


def _usage(result: CompletionResult) -> dict[str, Any]:
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


def chat_completion_body(
    result: CompletionResult, include_reasoning: bool = True
) -> dict[str, Any]:
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


def chat_completion_sse(
    result: CompletionResult,
    include_usage: bool,
    *,
    include_reasoning: bool = True,
    piece_chars: int = SSE_PIECE_CHARS,
) -> Iterator[bytes]:
    """Re-emit a complete result as a `chat.completion.chunk` stream ending in `[DONE]`."""
    base = {
        "id": completion_id(result),
        "object": "chat.completion.chunk",
        "created": result.created,
        "model": result.model,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        body: dict[str, Any] = {
            **base,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if include_usage:
            body["usage"] = None
        return data_frame(body)

    out = result.output
    yield chunk({"role": "assistant", "content": ""})
    if include_reasoning and out.reasoning:
        for piece in pieces(out.reasoning, piece_chars):
            yield chunk({"reasoning": piece, "reasoning_content": piece})
    if out.content:
        for piece in pieces(out.content, piece_chars):
            yield chunk({"content": piece})
    for i, tc in enumerate(out.tool_calls):
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.name, "arguments": ""},
                    }
                ]
            }
        )
        for piece in pieces(tc.arguments, piece_chars):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, _finish_reason(result))
    if include_usage:
        yield data_frame({**base, "choices": [], "usage": _usage(result)})
    yield SSE_DONE


def sse_error_event(err: GatewayError) -> bytes:
    """An in-stream error frame (`data: {"error": ...}`), which the OpenAI SDK raises on.

    Only for failures after a stream has started; before that, send a plain JSON error.
    """
    return data_frame(openai_error_body(err))


def openai_error_response(err: GatewayError) -> JSONResponse:
    return JSONResponse(openai_error_body(err), status_code=err.status, headers=err.headers())


def chat_completion_response(
    result: CompletionResult,
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
    return JSONResponse(chat_completion_body(result, include_reasoning))
