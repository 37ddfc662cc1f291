"""OpenAI Chat Completions adapter: wire request → `CanonicalRequest`, result → wire reply.

Only translation lives here. Validation is lenient about fields we ignore (the official SDK
and LangChain send many: `user`, `metadata`, `parallel_tool_calls`, ...) and strict about
the types of the fields we use, with error messages naming the offending field path.
Streaming re-emits an already complete result, because the Gateway needs the whole token
sequence before it can parse reasoning and tool calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.canonical import CanonicalRequest, CompletionResult, Message, Tool, ToolCall
from gateway.errors import GatewayError, openai_error_body
from schemas.sampling import SamplingParams

PROTOCOL = "openai_chat"
DEFAULT_PATH = "/v1/chat/completions"
SSE_PIECE_CHARS = 16
"""Text deltas are split into pieces of this many characters so clients truly concatenate."""

_NON_TEXT_PARTS = {"image_url", "input_image", "input_audio", "file", "input_file", "video_url"}
_DROPPED_HEADERS = {"authorization", "api-key", "x-api-key", "cookie", "proxy-authorization"}
"""Credentials are never copied into the canonical request (it may be recorded)."""


# --- request models -----------------------------------------------------------------------


class _Wire(BaseModel):
    """Unknown fields allowed (clients send plenty); known fields strictly typed."""

    model_config = ConfigDict(extra="allow", strict=True)


class _FunctionCall(_Wire):
    name: str
    arguments: str


class _ToolCall(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: _FunctionCall


class _ChatMessage(_Wire):
    role: Literal["developer", "system", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        """Content may be a list of parts; only text (and echoed refusals) is supported."""
        if not isinstance(value, list):
            return value
        texts: list[str] = []
        for i, part in enumerate(value):
            if not isinstance(part, dict):
                raise ValueError(f"part {i} must be an object like {{'type': 'text', 'text': ...}}")
            kind = part.get("type")
            key = (
                {"text": "text", "refusal": "refusal"}.get(kind) if isinstance(kind, str) else None
            )
            if key is None:
                if kind in _NON_TEXT_PARTS:
                    raise ValueError(
                        f"part {i} has type {kind!r}; this model is text-only, so images, "
                        "audio and files are not supported — send text parts only"
                    )
                raise ValueError(f"part {i} has unsupported type {kind!r}; expected 'text'")
            text = part.get(key)
            if not isinstance(text, str):
                raise ValueError(f"part {i} ({kind}) needs a string {key!r} field")
            texts.append(text)
        # Newline-joined, as vLLM does for text parts.
        return "\n".join(texts)

    @model_validator(mode="after")
    def _role_rules(self) -> _ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls are only allowed on assistant messages, not {self.role}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role in ("developer", "system", "user") and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self


class _FunctionDef(_Wire):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(_Wire):
    type: Literal["function"]
    function: _FunctionDef


class _StreamOptions(_Wire):
    include_usage: bool | None = None


class ChatCompletionRequest(_Wire):
    model: str
    messages: list[_ChatMessage] = Field(min_length=1)
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = None
    tools: list[_Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _validation_error(exc: ValidationError) -> GatewayError:
    """First failing field as a 400 naming its path (e.g. `messages[2].content`).

    Errors of several union branches at the same path are merged into one message.
    """
    by_path: dict[str, list[str]] = {}
    for e in exc.errors():
        path = _path(tuple(p for p in e["loc"] if not _is_union_tag(p)))
        msg = e["msg"].removeprefix("Value error, ")
        msgs = by_path.setdefault(path, [])
        if msg not in msgs:
            msgs.append(msg)
    path = next(iter(by_path))
    # A union branch that got deeper (e.g. `stop[0]` under `stop`) says more; prefer it.
    for other in by_path:
        if other.startswith((path + "[", path + ".")) and len(other) > len(path):
            path = other
    msgs = by_path[path]
    others = [p for p in by_path if p != path and not path.startswith((p + "[", p + "."))]
    more = f" (and errors at {len(others)} more field(s))" if others else ""
    where = f"{path}: " if path else ""
    return GatewayError(
        "invalid_request", f"Invalid request: {where}{' or '.join(msgs)}{more}", param=path or None
    )


def _is_union_tag(part: int | str) -> bool:
    # pydantic puts the union member's type name into `loc` (e.g. "str", "list[str]").
    return isinstance(part, str) and (part in {"str", "int", "float", "bool"} or "[" in part)


def _load_body(body: bytes | str | Mapping[str, Any]) -> Any:
    if isinstance(body, Mapping):
        return dict(body)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError("invalid_request", f"Request body is not valid JSON: {exc}") from exc


def parse_chat_request(
    body: bytes | str | Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    path: str = DEFAULT_PATH,
) -> CanonicalRequest:
    """Validate a Chat Completions request and convert it; raises GatewayError(400)."""
    data = _load_body(body)
    if not isinstance(data, dict):
        raise GatewayError("invalid_request", "Request body must be a JSON object")
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from exc
    if req.n is not None and req.n != 1:
        raise GatewayError("invalid_request", "Only n=1 is supported", param="n")
    if isinstance(req.tool_choice, str) and req.tool_choice not in ("none", "auto", "required"):
        raise GatewayError(
            "invalid_request",
            f"tool_choice must be 'none', 'auto', 'required' or an object, not {req.tool_choice!r}",
            param="tool_choice",
        )
    return CanonicalRequest(
        protocol=PROTOCOL,
        path=path,
        model=req.model,
        messages=[_to_message(m) for m in req.messages],
        tools=[
            Tool(
                name=t.function.name,
                description=t.function.description,
                parameters=t.function.parameters or {},
            )
            for t in req.tools or []
        ],
        tool_choice=req.tool_choice,
        sampling=_sampling(req),
        stream=bool(req.stream),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        template_kwargs=dict(req.chat_template_kwargs or {}),
        headers={k: v for k, v in (headers or {}).items() if k.lower() not in _DROPPED_HEADERS},
    )


def _sampling(req: ChatCompletionRequest) -> SamplingParams:
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    max_param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    values = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "max_tokens": max_tokens,
        "seed": req.seed,
        "stop": stop,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty,
    }
    try:
        return SamplingParams.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        err = _validation_error(exc)
        if err.param and err.param.startswith("max_tokens"):
            err.param = max_param + err.param.removeprefix("max_tokens")
            err.message = err.message.replace("max_tokens", max_param, 1)
        raise err from exc


def _to_message(m: _ChatMessage) -> Message:
    role = "system" if m.role == "developer" else m.role
    reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
    return Message(
        role=role,
        content=m.content,
        reasoning=reasoning if role == "assistant" else None,
        tool_calls=[
            ToolCall(id=tc.id, name=tc.function.name, arguments=tc.function.arguments)
            for tc in m.tool_calls or []
        ],
        tool_call_id=m.tool_call_id if role == "tool" else None,
        name=m.name,
    )


# --- responses ----------------------------------------------------------------------------


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


def _pieces(text: str, size: int) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]


def sse_event(data: Any) -> bytes:
    """One `data:` frame (Chat Completions SSE has no `event:` lines)."""
    return (
        b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
    )


SSE_DONE = b"data: [DONE]\n\n"


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
        return sse_event(body)

    out = result.output
    yield chunk({"role": "assistant", "content": ""})
    if include_reasoning and out.reasoning:
        for piece in _pieces(out.reasoning, piece_chars):
            yield chunk({"reasoning": piece, "reasoning_content": piece})
    if out.content:
        for piece in _pieces(out.content, piece_chars):
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
        for piece in _pieces(tc.arguments, piece_chars):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, _finish_reason(result))
    if include_usage:
        yield sse_event({**base, "choices": [], "usage": _usage(result)})
    yield SSE_DONE


def sse_error_event(err: GatewayError) -> bytes:
    """An in-stream error frame (`data: {"error": ...}`), which the OpenAI SDK raises on.

    Only for failures after a stream has started; before that, send a plain JSON error.
    """
    return sse_event(openai_error_body(err))


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
        return StreamingResponse(
            chat_completion_sse(result, include_usage, include_reasoning=include_reasoning),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return JSONResponse(chat_completion_body(result, include_reasoning))
