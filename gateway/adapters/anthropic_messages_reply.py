"""Anthropic Messages replies: the `message` object, the Messages event stream,
`count_tokens` replies and Anthropic-shaped errors.

The thinking signature is a deterministic opaque token of the call id and the reasoning, so
a verbatim echo restores our reasoning even if the client hid its text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from starlette.responses import JSONResponse, Response

from gateway import json_text
from gateway.adapters.opaque_token import encode_token
from gateway.adapters.sse import SSE_PIECE_CHARS, event_frame, event_stream_response, pieces
from gateway.canonical import CompletionResult, ToolCall
from gateway.errors import GatewayError

# --- errors -----------------------------------------------------------------------------------

ANTHROPIC_ERRORS: dict[str, tuple[str, int | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "authentication": ("authentication_error", None),
    "not_found": ("not_found_error", None),
    "method_not_allowed": ("invalid_request_error", None),
    "conflict": ("invalid_request_error", None),
    "idempotency_mismatch": ("invalid_request_error", None),
    "too_large": ("request_too_large", None),
    "unsupported_media_type": ("invalid_request_error", None),
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


def message_id(result: CompletionResult) -> str:
    return f"msg_{result.call_id}"


def thinking_signature(result: CompletionResult) -> str:
    """Deterministic in the call; carries the reasoning so a verbatim echo restores it."""
    return encode_token("thinking", result.call_id, result.output.reasoning or "")


def stop_reason(result: CompletionResult, stop_sequence: str | None = None) -> str:
    if result.output.tool_calls:
        return "tool_use"
    if result.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def _usage(result: CompletionResult) -> dict[str, int]:
    """Cached prompt tokens are reported as cache reads, as Anthropic does (input excludes
    them), so Claude Code's context sum input + cache_read + output stays right."""
    return {
        "input_tokens": result.prompt_tokens - result.cached_prompt_tokens,
        "output_tokens": result.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": result.cached_prompt_tokens,
    }


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


def content_blocks(result: CompletionResult, include_thinking: bool = True) -> list[dict[str, Any]]:
    """thinking, text, tool_use — in that order; an otherwise empty reply gets one empty
    text block."""
    out = result.output
    blocks: list[dict[str, Any]] = []
    if include_thinking and out.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": out.reasoning, "signature": thinking_signature(result)}
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
    result: CompletionResult, *, include_thinking: bool = True, stop_sequence: str | None = None
) -> dict[str, Any]:
    """Non-stream `message` object. `stop_sequence`: the stop string that ended generation,
    if known (makes `stop_reason` `stop_sequence`)."""
    reason = stop_reason(result, stop_sequence)
    return {
        "id": message_id(result),
        "type": "message",
        "role": "assistant",
        "model": result.model,
        "content": content_blocks(result, include_thinking),
        "stop_reason": reason,
        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
        "usage": _usage(result),
    }


def messages_sse(
    result: CompletionResult,
    *,
    include_thinking: bool = True,
    stop_sequence: str | None = None,
    piece_chars: int = SSE_PIECE_CHARS,
) -> Iterator[bytes]:
    """Re-emit a complete result as the Messages event stream; every record has its
    `event:` line (the SDK drops records without one)."""

    def event(kind: str, **fields: Any) -> bytes:
        return event_frame(kind, {"type": kind, **fields})

    body = messages_body(result, include_thinking=include_thinking, stop_sequence=stop_sequence)
    usage = body["usage"]
    tool_json = iter([_tool_input(tc)[1] for tc in result.output.tool_calls])
    start = {**body, "content": [], "stop_reason": None, "stop_sequence": None}
    yield event("message_start", message={**start, "usage": {**usage, "output_tokens": 0}})
    yield event("ping")
    for index, block in enumerate(body["content"]):
        if block["type"] == "thinking":
            yield event(
                "content_block_start",
                index=index,
                content_block={"type": "thinking", "thinking": "", "signature": ""},
            )
            for piece in pieces(block["thinking"], piece_chars):
                yield event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "thinking_delta", "thinking": piece},
                )
            yield event(
                "content_block_delta",
                index=index,
                delta={"type": "signature_delta", "signature": block["signature"]},
            )
        elif block["type"] == "text":
            yield event(
                "content_block_start", index=index, content_block={"type": "text", "text": ""}
            )
            for piece in pieces(block["text"], piece_chars):
                yield event(
                    "content_block_delta", index=index, delta={"type": "text_delta", "text": piece}
                )
        else:
            yield event(
                "content_block_start",
                index=index,
                content_block={**block, "input": {}},
            )
            for piece in pieces(next(tool_json), piece_chars):
                yield event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": piece},
                )
        yield event("content_block_stop", index=index)
    yield event(
        "message_delta",
        delta={"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]},
        usage=usage,
    )
    yield event("message_stop")


def messages_response(
    result: CompletionResult,
    *,
    stream: bool,
    include_thinking: bool = True,
    stop_sequence: str | None = None,
) -> Response:
    """Starlette response for a finished `/v1/messages` call, streamed or not."""
    if stream:
        return event_stream_response(
            messages_sse(result, include_thinking=include_thinking, stop_sequence=stop_sequence)
        )
    return JSONResponse(
        messages_body(result, include_thinking=include_thinking, stop_sequence=stop_sequence)
    )


def count_tokens_response(input_tokens: int) -> Response:
    return JSONResponse(count_tokens_body(input_tokens))
