"""OpenAI Responses adapter (what Codex CLI speaks): wire request → `CanonicalRequest`,
result → `response` object, Responses SSE, and the `/responses/compact` reply.

Codex is stateless towards custom providers (`store:false`, full history every turn, no
`previous_response_id`), so a request's `input` items are folded back into chat messages:
one model turn arrives as `reasoning` + `message` + `function_call` items and becomes one
assistant message. The reasoning item we return carries our reasoning three ways (summary,
`reasoning_text` content and an opaque `encrypted_content` token) because Codex echoes it
verbatim; whichever survives the round trip restores `Message.reasoning`.

Markers for the scene engine are added to `CanonicalRequest.headers` (values are computed
here; the same names sent by a client are discarded):
- `x-rollout-request-kind`: `compaction` for `/responses/compact`, a `compaction_trigger`
  item, `x-openai-subagent: compact`, or Codex turn metadata `request_kind:"compaction"`;
  otherwise Codex's own `request_kind` (`turn`, `prewarm`, ...) when it sent one.
- `x-rollout-subagent`: present for sub-agent calls (`x-openai-subagent` header, or turn
  metadata `thread_source:"subagent"`); the value is the sub-agent kind (`collab_spawn`,
  `review`, ... or `subagent`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.canonical import CanonicalRequest, CompletionResult, Message, Tool, ToolCall
from gateway.errors import GatewayError
from gateway.openai_chat import (
    _DROPPED_HEADERS,
    SSE_PIECE_CHARS,
    _is_union_tag,
    _load_body,
    openai_error_response,
)
from schemas.sampling import SamplingParams

__all__ = [
    "COMPACT_INSTRUCTION",
    "COMPACT_PATH_SUFFIX",
    "DEFAULT_PATH",
    "PROTOCOL",
    "REQUEST_KIND_HEADER",
    "SUBAGENT_HEADER",
    "compact_body",
    "compact_response",
    "is_compaction",
    "openai_error_response",
    "parse_responses_request",
    "response_id",
    "responses_body",
    "responses_response",
    "responses_sse",
    "sse_failed_event",
]

PROTOCOL = "openai_responses"
DEFAULT_PATH = "/v1/responses"
COMPACT_PATH_SUFFIX = "/responses/compact"
REQUEST_KIND_HEADER = "x-rollout-request-kind"
SUBAGENT_HEADER = "x-rollout-subagent"
MARKER_HEADERS = frozenset({REQUEST_KIND_HEADER, SUBAGENT_HEADER})

NAMESPACE_SEP = "."
"""Codex namespace tools (`multi_agent_v1` → `spawn_agent`) become one function named
`multi_agent_v1.spawn_agent`. OpenAI function names cannot contain a dot, so any dotted name
in our output can only come from a namespace and is split back on the way out."""

COMPACT_INSTRUCTION = (
    "The conversation above is being compacted to free context. Write a handoff summary that "
    "lets the work continue without the earlier messages: the user's goal and constraints, "
    "what has been done so far (files read or changed, commands run and their results), the "
    "current state, open problems, and the concrete next steps. Reply with the summary only."
)
"""Appended as the last user message of a `/responses/compact` (or `compaction_trigger`)
request, whose input is only history: without it the model would simply continue."""

COMPACTION_SUMMARY_PREFIX = "Summary of the earlier part of this conversation:\n\n"
"""How a `compaction` item we issued reads to the model when it comes back as input."""

_TOKEN_PREFIX = "rollout1."
_NON_TEXT_PARTS = {"input_image", "input_file", "input_audio", "image_url", "file"}
_UNSTORED_ITEMS = {"item_reference"}
_ITEM_TYPES = (
    "message, function_call, function_call_output, reasoning, compaction, compaction_trigger"
)

M = TypeVar("M", bound=BaseModel)


# --- shared wire helpers (also used by the Anthropic adapter) ---------------------------------


class Wire(BaseModel):
    """Unknown fields allowed (clients send plenty); known fields strictly typed."""

    model_config = ConfigDict(extra="allow", strict=True)


def join_path(where: str, loc: tuple[int | str, ...]) -> str:
    """`messages[2]` + `("content", 0)` → `messages[2].content[0]`."""
    out = where
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_union_tag(part):
            out += f".{part}" if out else str(part)
    return out


def field_error(exc: ValidationError, where: str = "") -> GatewayError:
    """First failing field as a 400 naming its full path; union branches at one path merge."""
    by_path: dict[str, list[str]] = {}
    for e in exc.errors():
        msgs = by_path.setdefault(join_path(where, tuple(e["loc"])), [])
        msg = e["msg"].removeprefix("Value error, ")
        if msg not in msgs:
            msgs.append(msg)
    path = next(iter(by_path))
    for other in by_path:  # a union branch that got deeper says more
        if other.startswith((path + "[", path + ".")):
            path = other
    others = [p for p in by_path if p != path and not path.startswith((p + "[", p + "."))]
    more = f" (and errors at {len(others)} more field(s))" if others else ""
    where_txt = f"{path}: " if path else ""
    return GatewayError(
        "invalid_request",
        f"Invalid request: {where_txt}{' or '.join(by_path[path])}{more}",
        param=path or None,
    )


def validate_at(model: type[M], data: Any, where: str) -> M:
    """Validate one nested object, reporting errors under its path in the whole body."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise field_error(exc, where) from exc


def bad_request(param: str, message: str) -> GatewayError:
    return GatewayError("invalid_request", f"Invalid request: {param}: {message}", param=param)


def load_object(body: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    data = _load_body(body)
    if not isinstance(data, dict):
        raise GatewayError("invalid_request", "Request body must be a JSON object")
    return data


def clean_headers(headers: Mapping[str, str] | None, owned: frozenset[str]) -> dict[str, str]:
    """Drop credentials (the canonical request may be recorded) and our own marker names."""
    return {
        k: v
        for k, v in (headers or {}).items()
        if k.lower() not in _DROPPED_HEADERS and k.lower() not in owned
    }


def header(headers: Mapping[str, str] | None, name: str) -> str | None:
    for k, v in (headers or {}).items():
        if k.lower() == name:
            return v
    return None


def encode_token(kind: str, call_id: str, text: str) -> str:
    """Opaque, deterministic token carrying our text, so a verbatim echo can be read back
    even if the client drops the readable copy (e.g. thinking shown as `omitted`)."""
    raw = json.dumps({"k": kind, "c": call_id, "t": text}, ensure_ascii=False)
    return _TOKEN_PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: str | None, kind: str) -> tuple[str, str] | None:
    """`(call_id, text)` of a token we issued with this kind; None for anything else."""
    if not token or not token.startswith(_TOKEN_PREFIX):
        return None
    body = token[len(_TOKEN_PREFIX) :]
    try:
        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("k") != kind:
        return None
    call_id, text = data.get("c"), data.get("t")
    if not isinstance(call_id, str) or not isinstance(text, str):
        return None
    return call_id, text


def sse_frame(event: str, data: Mapping[str, Any]) -> bytes:
    """One SSE record with an `event:` line (Anthropic's SDK requires it; Codex ignores it)."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {payload}\n\n".encode()


def pieces(text: str, size: int) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]


# --- request models -----------------------------------------------------------------------


class _MessageItem(Wire):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]


class _FunctionCallItem(Wire):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    namespace: str | None = None


class _FunctionCallOutputItem(Wire):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[dict[str, Any]]


class _SummaryText(Wire):
    type: Literal["summary_text"]
    text: str


class _ReasoningText(Wire):
    type: Literal["reasoning_text"]
    text: str


class _ReasoningItem(Wire):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[_SummaryText] = Field(default_factory=list)
    content: list[_ReasoningText] | None = None
    encrypted_content: str | None = None


class _CompactionItem(Wire):
    type: Literal["compaction"]
    encrypted_content: str


class _CompactionTrigger(Wire):
    type: Literal["compaction_trigger"]


class _FunctionTool(Wire):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class _NamespaceTool(Wire):
    type: Literal["namespace"]
    name: str = Field(min_length=1)
    tools: list[dict[str, Any]]


class _ReasoningConfig(Wire):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(Wire):
    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    store: bool | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    previous_response_id: str | None = None
    reasoning: _ReasoningConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    client_metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# --- request conversion ---------------------------------------------------------------------


def _part_texts(parts: list[dict[str, Any]], where: str, allowed: dict[str, str]) -> str:
    """Join text parts with newlines (as the Chat adapter does); anything else is a 400."""
    texts: list[str] = []
    for i, part in enumerate(parts):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        key = allowed.get(kind) if isinstance(kind, str) else None
        if key is None:
            if kind in _NON_TEXT_PARTS:
                raise bad_request(
                    at,
                    f"part type {kind!r} is not supported: this model is text-only, so images, "
                    "audio and files cannot be sent — use text parts",
                )
            raise bad_request(
                at, f"unsupported part type {kind!r}; expected one of {sorted(allowed)}"
            )
        text = part.get(key)
        if not isinstance(text, str):
            raise bad_request(f"{at}.{key}", "Input should be a valid string")
        texts.append(text)
    return "\n".join(texts)


_USER_PARTS = {"input_text": "text", "output_text": "text", "text": "text"}
_ASSISTANT_PARTS = {"output_text": "text", "input_text": "text", "refusal": "refusal"}


class _History:
    """Folds Responses items into chat messages; one model turn → one assistant message."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._turn: dict[str, Any] | None = None

    def _flush(self) -> None:
        if self._turn is not None:
            self.messages.append(Message(role="assistant", **self._turn))
            self._turn = None

    def _open_turn(self) -> dict[str, Any]:
        if self._turn is None:
            self._turn = {"content": None, "reasoning": None, "tool_calls": []}
        return self._turn

    def add(self, message: Message) -> None:
        self._flush()
        self.messages.append(message)

    def reasoning(self, text: str | None) -> None:
        if self._turn is not None and (
            self._turn["reasoning"] is not None
            or self._turn["content"] is not None
            or self._turn["tool_calls"]
        ):
            self._flush()  # a second reasoning item starts a new turn
        self._open_turn()["reasoning"] = text

    def assistant_text(self, text: str) -> None:
        if self._turn is not None and (
            self._turn["content"] is not None or self._turn["tool_calls"]
        ):
            self._flush()
        self._open_turn()["content"] = text

    def tool_call(self, call: ToolCall) -> None:
        self._open_turn()["tool_calls"].append(call)

    def done(self) -> list[Message]:
        self._flush()
        return self.messages


def _reasoning_text(item: _ReasoningItem) -> str | None:
    """Our echoed reasoning: readable content first, then our token, then the summary."""
    if item.content:
        return "\n".join(part.text for part in item.content)
    decoded = decode_token(item.encrypted_content, "reasoning")
    if decoded is not None:
        return decoded[1]
    if item.summary:
        return "\n".join(part.text for part in item.summary)
    return None


def _convert_input(req: ResponsesRequest) -> tuple[list[Message], bool]:
    """Messages for the model, and whether a `compaction_trigger` item asked to compact."""
    history = _History()
    if req.instructions:
        history.add(Message(role="system", content=req.instructions))
    if isinstance(req.input, str):
        history.add(Message(role="user", content=req.input))
        return history.done(), False
    triggered = False
    items = req.input or []
    for i, raw in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(raw, dict):
            raise bad_request(where, "each input item must be an object")
        kind = raw.get("type", "message" if "role" in raw else None)
        if kind == "message":
            msg = validate_at(_MessageItem, raw, where)
            if isinstance(msg.content, str):
                text = msg.content
            else:
                allowed = _ASSISTANT_PARTS if msg.role == "assistant" else _USER_PARTS
                text = _part_texts(msg.content, f"{where}.content", allowed)
            if msg.role == "assistant":
                history.assistant_text(text)
            else:
                role = "user" if msg.role == "user" else "system"
                history.add(Message(role=role, content=text))
        elif kind == "function_call":
            fc = validate_at(_FunctionCallItem, raw, where)
            name = f"{fc.namespace}{NAMESPACE_SEP}{fc.name}" if fc.namespace else fc.name
            history.tool_call(ToolCall(id=fc.call_id, name=name, arguments=fc.arguments))
        elif kind == "function_call_output":
            out = validate_at(_FunctionCallOutputItem, raw, where)
            text = (
                out.output
                if isinstance(out.output, str)
                else _part_texts(out.output, f"{where}.output", _USER_PARTS)
            )
            history.add(Message(role="tool", content=text, tool_call_id=out.call_id))
        elif kind == "reasoning":
            history.reasoning(_reasoning_text(validate_at(_ReasoningItem, raw, where)))
        elif kind == "compaction":
            item = validate_at(_CompactionItem, raw, where)
            decoded = decode_token(item.encrypted_content, "compaction")
            if decoded is None:
                raise bad_request(
                    f"{where}.encrypted_content",
                    "this compaction item was not issued by this gateway and cannot be read",
                )
            history.add(Message(role="user", content=COMPACTION_SUMMARY_PREFIX + decoded[1]))
        elif kind == "compaction_trigger":
            validate_at(_CompactionTrigger, raw, where)
            if i != len(items) - 1:
                raise bad_request(where, "compaction_trigger must be the last input item")
            triggered = True
        elif kind in _UNSTORED_ITEMS:
            raise bad_request(
                f"{where}.type",
                f"{kind!r} needs server-side storage, which this gateway does not keep; "
                "send the full items (store=false)",
            )
        else:
            raise bad_request(
                f"{where}.type", f"unsupported input item type {kind!r}; supported: {_ITEM_TYPES}"
            )
    return history.done(), triggered


def _convert_tools(raw_tools: list[dict[str, Any]] | None) -> list[Tool]:
    """Function tools (namespaces flattened). Hosted tools (web_search, ...) and
    `defer_loading` tools are dropped: our model cannot run the former and the latter are
    not meant to be in the prompt until the client loads them."""
    tools: list[Tool] = []
    for i, raw in enumerate(raw_tools or []):
        where = f"tools[{i}]"
        if not isinstance(raw, dict):
            raise bad_request(where, "each tool must be an object")
        kind = raw.get("type")
        if kind == "function":
            fn = validate_at(_FunctionTool, raw, where)
            if not fn.defer_loading:
                tools.append(_tool(fn, None))
        elif kind == "namespace":
            ns = validate_at(_NamespaceTool, raw, where)
            for j, sub in enumerate(ns.tools):
                if not isinstance(sub, dict):
                    raise bad_request(f"{where}.tools[{j}]", "each tool must be an object")
                if sub.get("type", "function") != "function":
                    continue
                fn = validate_at(_FunctionTool, {"type": "function", **sub}, f"{where}.tools[{j}]")
                if not fn.defer_loading:
                    tools.append(_tool(fn, ns.name))
        elif not isinstance(kind, str):
            raise bad_request(f"{where}.type", "Field required (a string)")
    return tools


def _tool(fn: _FunctionTool, namespace: str | None) -> Tool:
    name = f"{namespace}{NAMESPACE_SEP}{fn.name}" if namespace else fn.name
    return Tool(name=name, description=fn.description, parameters=fn.parameters or {})


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    """To the Chat form the rest of the Gateway uses."""
    if choice is None or isinstance(choice, str):
        if choice not in (None, "none", "auto", "required"):
            raise bad_request(
                "tool_choice", f"must be 'none', 'auto', 'required' or an object, not {choice!r}"
            )
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise bad_request(
            "tool_choice", "only {'type': 'function', 'name': ...} objects are supported"
        )
    name = choice["name"]
    if isinstance(choice.get("namespace"), str):
        name = f"{choice['namespace']}{NAMESPACE_SEP}{name}"
    return {"type": "function", "function": {"name": name}}


def _sampling(req: ResponsesRequest) -> SamplingParams:
    values = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_tokens": req.max_output_tokens,
    }
    try:
        return SamplingParams.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        err = field_error(exc)
        if err.param == "max_tokens":
            err.param = "max_output_tokens"
            err.message = err.message.replace("max_tokens", "max_output_tokens", 1)
        raise err from exc


def _turn_metadata(req: ResponsesRequest, headers: Mapping[str, str] | None) -> dict[str, Any]:
    """Codex's `x-codex-turn-metadata` (a JSON string), from the header or `client_metadata`."""
    raw: Any = header(headers, "x-codex-turn-metadata")
    if raw is None and req.client_metadata:
        raw = req.client_metadata.get("x-codex-turn-metadata")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return raw if isinstance(raw, dict) else {}


def _markers(
    req: ResponsesRequest, headers: Mapping[str, str] | None, compaction: bool
) -> dict[str, str]:
    meta = _turn_metadata(req, headers)
    subagent = header(headers, "x-openai-subagent")
    kind = meta.get("request_kind")
    if compaction or subagent == "compact" or kind == "compaction":
        kind = "compaction"
    out: dict[str, str] = {}
    if isinstance(kind, str) and kind:
        out[REQUEST_KIND_HEADER] = kind
    if subagent and subagent != "compact":
        out[SUBAGENT_HEADER] = subagent
    elif meta.get("thread_source") == "subagent":
        sub_kind = meta.get("subagent_kind")
        out[SUBAGENT_HEADER] = sub_kind if isinstance(sub_kind, str) and sub_kind else "subagent"
    return out


def parse_responses_request(
    body: bytes | str | Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    path: str = DEFAULT_PATH,
) -> CanonicalRequest:
    """Validate a `/v1/responses` or `/v1/responses/compact` request and convert it.

    Raises GatewayError(400) naming the field path. A compact-endpoint request is never
    streamed and gets `COMPACT_INSTRUCTION` appended.
    """
    path = path.split("?", 1)[0]
    compact_endpoint = path.rstrip("/").endswith(COMPACT_PATH_SUFFIX)
    data = load_object(body)
    try:
        req = ResponsesRequest.model_validate(data)
    except ValidationError as exc:
        raise field_error(exc) from exc
    if req.previous_response_id is not None:
        raise bad_request(
            "previous_response_id",
            "server-side history is not kept by this gateway; send the full input (store=false)",
        )
    messages, triggered = _convert_input(req)
    compaction = compact_endpoint or triggered
    if compaction:
        messages.append(Message(role="user", content=COMPACT_INSTRUCTION))
    if not messages:
        raise bad_request("input", "at least one input item (or instructions) is required")
    template_kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning is not None and req.reasoning.effort == "none":
        template_kwargs.setdefault("enable_thinking", False)
    return CanonicalRequest(
        protocol=PROTOCOL,
        path=path,
        model=req.model,
        messages=messages,
        tools=[] if compact_endpoint else _convert_tools(req.tools),
        tool_choice=_tool_choice(req.tool_choice),
        sampling=_sampling(req),
        stream=bool(req.stream) and not compact_endpoint,
        template_kwargs=template_kwargs,
        headers={**clean_headers(headers, MARKER_HEADERS), **_markers(req, headers, compaction)},
    )


def is_compaction(req: CanonicalRequest) -> bool:
    """True when the adapter marked this request as a compaction (see module docstring)."""
    return req.headers.get(REQUEST_KIND_HEADER) == "compaction"


# --- replies ----------------------------------------------------------------------------------


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
        frame = sse_frame(kind, {"type": kind, "sequence_number": seq, **fields})
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
    that, send a plain JSON error with `openai_error_response`). Codex treats any code but
    `context_length_exceeded` / quota codes as retryable; `code` is our error kind."""
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
    return sse_frame(
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
        return StreamingResponse(
            responses_sse(result),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return JSONResponse(responses_body(result))


def compact_response(result: CompletionResult, request: CanonicalRequest) -> Response:
    return JSONResponse(compact_body(result, request))
