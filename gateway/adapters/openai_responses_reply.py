"""OpenAI Responses replies: the `response` object, the Responses event stream, the
`response.failed` event and the `/responses/compact` reply.

The reasoning item carries our reasoning three ways (summary, `reasoning_text` content and
an opaque `encrypted_content` token) because Codex echoes it verbatim; whichever survives
the round trip restores `Message.reasoning` when the request is read back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from starlette.responses import JSONResponse, Response

from gateway.adapters.opaque_token import encode_token
from gateway.adapters.openai_responses import (
    COMPACT_INSTRUCTION,
    COMPACTION_SUMMARY_PREFIX,
    NAMESPACE_SEP,
)
from gateway.adapters.sse import SSE_PIECE_CHARS, event_frame, event_stream_response, pieces
from gateway.canonical import CanonicalRequest, CompletionResult, ToolCall
from gateway.errors import GatewayError


def response_id(result: CompletionResult) -> str:
    return f"resp_{result.call_id}"


def _incomplete(result: CompletionResult) -> bool:
    return result.finish_reason == "length" and not result.output.tool_calls


def _usage(result: CompletionResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_prompt_tokens},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _reasoning_item(result: CompletionResult, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{result.call_id}",
        "summary": [{"type": "summary_text", "text": text}],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": encode_token("reasoning", result.call_id, text),
        "status": "completed",
    }


def _message_item(result: CompletionResult, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{result.call_id}",
        "role": "assistant",
        "status": "incomplete" if _incomplete(result) else "completed",
        "content": [_text_part(text)],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_call_item(result: CompletionResult, index: int, tc: ToolCall) -> dict[str, Any]:
    namespace, sep, name = tc.name.partition(NAMESPACE_SEP)
    item: dict[str, Any] = {
        "type": "function_call",
        "id": f"fc_{result.call_id}_{index}",
        "call_id": tc.id,
        "name": name if sep else tc.name,
        "arguments": tc.arguments,
        "status": "completed",
    }
    if sep:
        item["namespace"] = namespace
    return item


def output_items(result: CompletionResult) -> list[dict[str, Any]]:
    """Completed output items in protocol order: reasoning, message, function calls."""
    out = result.output
    items: list[dict[str, Any]] = []
    if out.reasoning:
        items.append(_reasoning_item(result, out.reasoning))
    if out.content or not out.tool_calls:
        items.append(_message_item(result, out.content or ""))
    items.extend(_function_call_item(result, i, tc) for i, tc in enumerate(out.tool_calls))
    return items


def _response(
    result: CompletionResult, status: str, output: list[dict[str, Any]], usage: bool
) -> dict[str, Any]:
    return {
        "id": response_id(result),
        "object": "response",
        "created_at": result.created,
        "status": status,
        "model": result.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "instructions": None,
        "metadata": {},
        "temperature": None,
        "top_p": None,
        "store": False,
        "text": {"format": {"type": "text"}},
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "usage": _usage(result) if usage else None,
    }


def responses_body(result: CompletionResult) -> dict[str, Any]:
    """Non-stream `response` object; a length stop is `incomplete` (max_output_tokens)."""
    status = "incomplete" if _incomplete(result) else "completed"
    return _response(result, status, output_items(result), usage=True)


def responses_sse(
    result: CompletionResult, *, piece_chars: int = SSE_PIECE_CHARS
) -> Iterator[bytes]:
    """Re-emit a complete result as the Responses event stream.

    Codex takes items from `response.output_item.done` and retries any stream that ends
    without the terminal `response.completed` (`response.incomplete` for a length stop);
    `sequence_number` counts up from 0 without gaps.
    """
    seq = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal seq
        frame = event_frame(kind, {"type": kind, "sequence_number": seq, **fields})
        seq += 1
        return frame

    yield event("response.created", response=_response(result, "in_progress", [], usage=False))
    yield event("response.in_progress", response=_response(result, "in_progress", [], usage=False))
    items = output_items(result)
    for index, item in enumerate(items):
        place = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            text = item["content"][0]["text"]
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "summary": [], "content": [], "status": "in_progress"},
            )
            summary = {"type": "summary_text", "text": ""}
            yield event(
                "response.reasoning_summary_part.added", **place, summary_index=0, part=summary
            )
            for piece in pieces(text, piece_chars):
                yield event(
                    "response.reasoning_summary_text.delta", **place, summary_index=0, delta=piece
                )
            yield event("response.reasoning_summary_text.done", **place, summary_index=0, text=text)
            yield event(
                "response.reasoning_summary_part.done",
                **place,
                summary_index=0,
                part={**summary, "text": text},
            )
            for piece in pieces(text, piece_chars):
                yield event("response.reasoning_text.delta", **place, content_index=0, delta=piece)
            yield event("response.reasoning_text.done", **place, content_index=0, text=text)
        elif item["type"] == "message":
            text = item["content"][0]["text"]
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "content": [], "status": "in_progress"},
            )
            at = {**place, "content_index": 0}
            yield event("response.content_part.added", **at, part=_text_part(""))
            for piece in pieces(text, piece_chars):
                yield event("response.output_text.delta", **at, delta=piece, logprobs=[])
            yield event("response.output_text.done", **at, text=text, logprobs=[])
            yield event("response.content_part.done", **at, part=_text_part(text))
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            for piece in pieces(item["arguments"], piece_chars):
                yield event("response.function_call_arguments.delta", **place, delta=piece)
            yield event(
                "response.function_call_arguments.done", **place, arguments=item["arguments"]
            )
        yield event("response.output_item.done", output_index=index, item=item)
    final = responses_body(result)
    terminal = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(terminal, response=final)


def sse_failed_event(
    err: GatewayError, result_call_id: str, model: str, created: int, sequence_number: int
) -> bytes:
    """A terminal `response.failed` event, for failures after a stream has started (before
    that, send a plain JSON error with `openai_chat_reply.openai_error_response`). Codex
    treats any code but `context_length_exceeded` / quota codes as retryable; `code` is our
    error kind."""
    response = {
        "id": f"resp_{result_call_id}",
        "object": "response",
        "created_at": created,
        "status": "failed",
        "model": model,
        "output": [],
        "error": {"code": err.kind, "message": err.message},
        "incomplete_details": None,
        "usage": None,
    }
    return event_frame(
        "response.failed",
        {"type": "response.failed", "sequence_number": sequence_number, "response": response},
    )


def compact_body(result: CompletionResult, request: CanonicalRequest) -> dict[str, Any]:
    """`/responses/compact` reply: the request's user messages, then one `compaction` item
    whose opaque content is our summary (read back when it returns as input).

    Earlier summaries and our own compaction instruction are not repeated: the new summary
    supersedes them.
    """
    kept = [
        m.content
        for m in request.messages
        if m.role == "user"
        and m.content is not None
        and m.content != COMPACT_INSTRUCTION
        and not m.content.startswith(COMPACTION_SUMMARY_PREFIX)
    ]
    output: list[dict[str, Any]] = [
        {
            "type": "message",
            "id": f"msg_{result.call_id}_u{i}",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": text}],
        }
        for i, text in enumerate(kept)
    ]
    summary = result.output.content or ""
    output.append(
        {
            "type": "compaction",
            "id": f"cmp_{result.call_id}",
            "encrypted_content": encode_token("compaction", result.call_id, summary),
        }
    )
    return {
        "id": response_id(result),
        "object": "response.compaction",
        "created_at": result.created,
        "output": output,
        "usage": _usage(result),
    }


def responses_response(result: CompletionResult, *, stream: bool) -> Response:
    """Starlette response for a finished `/v1/responses` call, streamed or not."""
    if stream:
        return event_stream_response(responses_sse(result))
    return JSONResponse(responses_body(result))


def compact_response(result: CompletionResult, request: CanonicalRequest) -> Response:
    return JSONResponse(compact_body(result, request))
