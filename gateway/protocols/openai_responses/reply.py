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

from gateway.canonical import CanonicalRequest, Reply, ToolCall
from gateway.errors import GatewayError
from gateway.protocols.json_reply import json_reply
from gateway.protocols.opaque_token import TokenSeal
from gateway.protocols.openai_responses.request import (
    COMPACT_INSTRUCTION,
    COMPACTION_SUMMARY_PREFIX,
    NAMESPACE_SEP,
)
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


def response_id(result: Reply) -> str:
    return f"resp_{result.call_id}"


def _incomplete(result: Reply) -> bool:
    return result.finish_reason == "length" and not result.output.tool_calls


def _usage(result: Reply) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_prompt_tokens},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _reasoning_item(seal: TokenSeal, call_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{call_id}",
        "summary": [{"type": "summary_text", "text": text}],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": seal.encode("reasoning", call_id, text),
        "status": "completed",
    }


def _message_item(result: Reply, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{result.call_id}",
        "role": "assistant",
        "status": "incomplete" if _incomplete(result) else "completed",
        "content": [_text_part(text)],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _function_call_item(result: Reply, index: int, tc: ToolCall) -> dict[str, Any]:
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


def output_items(result: Reply, seal: TokenSeal) -> list[dict[str, Any]]:
    """Completed output items in protocol order: reasoning, message, function calls."""
    out = result.output
    items: list[dict[str, Any]] = []
    if out.reasoning:
        items.append(_reasoning_item(seal, result.call_id, out.reasoning))
    if out.content or not out.tool_calls:
        items.append(_message_item(result, out.content or ""))
    items.extend(_function_call_item(result, i, tc) for i, tc in enumerate(out.tool_calls))
    return items


def _response(
    head: StreamHead, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": f"resp_{head.call_id}",
        "object": "response",
        "created_at": head.created,
        "status": status,
        "model": head.model,
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
        "usage": usage,
    }


def responses_body(result: Reply, seal: TokenSeal) -> dict[str, Any]:
    """Non-stream `response` object; a length stop is `incomplete` (max_output_tokens)."""
    status = "incomplete" if _incomplete(result) else "completed"
    return _response(head_of(result), status, output_items(result, seal), _usage(result))


class ResponsesStreamWriter:
    """The Responses event stream of one call.

    Codex takes items from `response.output_item.done` and retries any stream that ends
    without the terminal `response.completed` (`response.incomplete` for a length stop);
    `sequence_number` counts up from 0 without gaps. Reasoning and message text stream
    live; function calls come at the finish, after the message, as in the `response`
    object (the model may still write content after a call).
    """

    def __init__(self, head: StreamHead, seal: TokenSeal) -> None:
        self.head = head
        self.seal = seal
        self.sent = Sent()
        self.seq = 0
        self.index = 0  # output_index of the next item
        self.reasoning_at: int | None = None  # the open reasoning item's index
        self.message_at: int | None = None  # the open message item's index
        self.reasoning_done = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        frame = event_frame(kind, {"type": kind, "sequence_number": self.seq, **fields})
        self.seq += 1
        return frame

    def start(self) -> list[bytes]:
        pending = _response(self.head, "in_progress", [], None)
        return [
            self._event("response.created", response=pending),
            self._event("response.in_progress", response=pending),
        ]

    def reasoning(self, text: str) -> list[bytes]:
        if self.reasoning_done or self.message_at is not None:
            log.warning("call %s: reasoning after the message; not streamed", self.head.call_id)
            return []
        frames: list[bytes] = []
        if self.reasoning_at is None:
            self.reasoning_at, self.index = self.index, self.index + 1
            item = {
                **_reasoning_item(self.seal, self.head.call_id, ""),
                "summary": [],
                "content": [],
            }
            frames.append(
                self._event(
                    "response.output_item.added",
                    output_index=self.reasoning_at,
                    item={**item, "status": "in_progress"},
                )
            )
            frames.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    **self._place(self.reasoning_at, "rs"),
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        self.sent.reasoning += text
        place = self._place(self.reasoning_at, "rs")
        frames.append(
            self._event(
                "response.reasoning_summary_text.delta", **place, summary_index=0, delta=text
            )
        )
        frames.append(
            self._event("response.reasoning_text.delta", **place, content_index=0, delta=text)
        )
        return frames

    def _place(self, index: int, prefix: str) -> dict[str, Any]:
        return {"item_id": f"{prefix}_{self.head.call_id}", "output_index": index}

    def _close_reasoning(self) -> list[bytes]:
        if self.reasoning_at is None or self.reasoning_done:
            return []
        self.reasoning_done = True
        text = self.sent.reasoning
        place = self._place(self.reasoning_at, "rs")
        summary = {"type": "summary_text", "text": text}
        return [
            self._event(
                "response.reasoning_summary_text.done", **place, summary_index=0, text=text
            ),
            self._event(
                "response.reasoning_summary_part.done", **place, summary_index=0, part=summary
            ),
            self._event("response.reasoning_text.done", **place, content_index=0, text=text),
            self._event(
                "response.output_item.done",
                output_index=self.reasoning_at,
                item=_reasoning_item(self.seal, self.head.call_id, text),
            ),
        ]

    def _open_message(self) -> list[bytes]:
        frames = self._close_reasoning()
        self.message_at, self.index = self.index, self.index + 1
        item = {
            "type": "message",
            "id": f"msg_{self.head.call_id}",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        frames.append(
            self._event("response.output_item.added", output_index=self.message_at, item=item)
        )
        frames.append(
            self._event(
                "response.content_part.added",
                **self._place(self.message_at, "msg"),
                content_index=0,
                part=_text_part(""),
            )
        )
        return frames

    def content(self, text: str) -> list[bytes]:
        frames = self._open_message() if self.message_at is None else []
        self.sent.content += text
        at = {**self._place(self.message_at or 0, "msg"), "content_index": 0}
        frames.append(self._event("response.output_text.delta", **at, delta=text, logprobs=[]))
        return frames

    def tool_call(self, call: ToolCall) -> list[bytes]:
        self.sent.tool_calls.append(call)  # sent at the finish, after the message
        return []

    def finish(self, result: Reply) -> list[bytes]:
        held = len(self.sent.tool_calls)
        self.sent.tool_calls, calls_held = [], self.sent.tool_calls
        reasoning, content, _ = self.sent.rest(
            result.output.model_copy(update={"tool_calls": []}), result.call_id
        )
        if calls_held != result.output.tool_calls[:held]:
            log.warning(
                "call %s: streamed tool calls differ from the parsed output", result.call_id
            )
        frames = self.reasoning(reasoning) if reasoning else []
        frames += self._close_reasoning()
        out = result.output
        if content or (self.message_at is None and not out.tool_calls):
            frames += self.content(content) if content else self._open_message()
        if self.message_at is not None:
            text = self.sent.content
            at = {**self._place(self.message_at, "msg"), "content_index": 0}
            frames.append(self._event("response.output_text.done", **at, text=text, logprobs=[]))
            frames.append(self._event("response.content_part.done", **at, part=_text_part(text)))
            frames.append(
                self._event(
                    "response.output_item.done",
                    output_index=self.message_at,
                    item=_message_item(result, text),
                )
            )
        for i, call in enumerate(out.tool_calls):
            item = _function_call_item(result, i, call)
            index, self.index = self.index, self.index + 1
            place = {"item_id": item["id"], "output_index": index}
            frames.append(
                self._event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
            )
            for piece in pieces(item["arguments"], SSE_PIECE_CHARS):
                frames.append(
                    self._event("response.function_call_arguments.delta", **place, delta=piece)
                )
            frames.append(
                self._event(
                    "response.function_call_arguments.done", **place, arguments=item["arguments"]
                )
            )
            frames.append(self._event("response.output_item.done", output_index=index, item=item))
        final = responses_body(result, self.seal)
        terminal = (
            "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        )
        frames.append(self._event(terminal, response=final))
        return frames

    def fail(self, err: GatewayError) -> list[bytes]:
        frame = sse_failed_event(
            err, self.head.call_id, self.head.model, self.head.created, self.seq
        )
        self.seq += 1
        return [frame]


def responses_sse(
    result: Reply, seal: TokenSeal, *, piece_chars: int = SSE_PIECE_CHARS
) -> Iterator[bytes]:
    """Re-emit a complete result as the Responses event stream."""
    return replay(ResponsesStreamWriter(head_of(result), seal), result, piece_chars)


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


def compact_body(result: Reply, request: CanonicalRequest, seal: TokenSeal) -> dict[str, Any]:
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
            "encrypted_content": seal.encode("compaction", result.call_id, summary),
        }
    )
    return {
        "id": response_id(result),
        "object": "response.compaction",
        "created_at": result.created,
        "output": output,
        "usage": _usage(result),
    }


def responses_response(result: Reply, seal: TokenSeal, *, stream: bool) -> Response:
    """Starlette response for a finished `/v1/responses` call, streamed or not."""
    if stream:
        return event_stream_response(responses_sse(result, seal))
    return json_reply(responses_body(result, seal))


def compact_response(result: Reply, request: CanonicalRequest, seal: TokenSeal) -> Response:
    return JSONResponse(compact_body(result, request, seal))
