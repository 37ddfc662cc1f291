"""Anthropic Messages requests (what Claude Code speaks): wire models and their conversion
to `CanonicalRequest`, for `/v1/messages` and `/v1/messages/count_tokens`. Replies and
errors are in `anthropic_messages_reply`.

Content blocks are folded into chat messages: `tool_result` blocks become `tool` messages
(keeping the tool structure rather than flattening it into user text), `thinking` becomes
`Message.reasoning` (read back from our signature token when the client hid its text),
`tool_use.input` becomes JSON `arguments`. Images and documents are refused with a 400:
the model is text-only.

Markers for the scene engine in `CanonicalRequest.headers` (computed here; the same names
sent by a client are discarded):
- `x-rollout-request-kind`: `compaction` when Claude Code says so through its hint headers
  (`x-claude-code-request-class: compaction` or `x-claude-code-compaction`); otherwise the
  request class it sent (`main`, `subagent`, `auxiliary`, ...). Without hint headers a
  compaction is only recognisable by its prompt text — a scene rule's job.
- `x-rollout-subagent`: present for sub-agent calls (`x-claude-code-agent-id` header,
  request class `subagent`, or `cc_is_subagent=true` in the billing line); the value is
  `x-claude-code-agent-type` or `subagent`.
- `x-anthropic-billing-header`: Claude Code's `system[0]` billing line moved out of the
  prompt (it is metadata for Anthropic's servers, not text for the model).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError

from gateway.canonical import CanonicalRequest, Message, Tool, ToolCall
from gateway.protocols.history import HistoryCache, Prefix, resume_or_full
from gateway.protocols.opaque_token import TokenSeal, open_token
from gateway.protocols.wire import (
    REQUEST_KIND_HEADER,
    SUBAGENT_HEADER,
    Wire,
    bad_request,
    clean_headers,
    field_error,
    header_value,
    load_object,
    sampling_params,
    validate_at,
)
from schemas.sampling import SamplingParams

PROTOCOL = "anthropic_messages"
DEFAULT_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
BILLING_HEADER = "x-anthropic-billing-header"
MARKER_HEADERS = frozenset({REQUEST_KIND_HEADER, SUBAGENT_HEADER, BILLING_HEADER})

_NON_TEXT_BLOCKS = {"image", "document"}
_BLOCK_TYPES = "text, tool_use, tool_result, thinking, redacted_thinking"


# --- request models ---------------------------------------------------------------------------


class _Message(Wire):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class _TextBlock(Wire):
    type: Literal["text"]
    text: str


class _ToolUseBlock(Wire):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class _ToolResultBlock(Wire):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class _ThinkingBlock(Wire):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class _RedactedThinkingBlock(Wire):
    type: Literal["redacted_thinking"]
    data: str


class _ToolDef(Wire):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    defer_loading: bool | None = None


class _ToolChoice(Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class _ThinkingConfig(Wire):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = None
    display: str | None = None


class CountTokensRequest(Wire):
    """`count_tokens` body: a Messages request without the required `max_tokens`."""

    model: str
    messages: list[_Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: _ThinkingConfig | None = None
    metadata: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    max_tokens: int | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int  # type: ignore[assignment]  # required on /v1/messages


# --- request conversion -----------------------------------------------------------------------


def _text_blocks(content: str | list[dict[str, Any]], where: str) -> list[str]:
    """Texts of a string or a list that may hold only text blocks (system content)."""
    if isinstance(content, str):
        return [content]
    return [validate_at(_TextBlock, b, f"{where}[{i}]").text for i, b in enumerate(content)]


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict):
        raise bad_request(where, "each content block must be an object")
    kind = block.get("type")
    if isinstance(kind, str) and kind in _NON_TEXT_BLOCKS:
        raise bad_request(
            f"{where}.type",
            f"{kind} blocks are not supported: this model is text-only — send text blocks",
        )
    if not isinstance(kind, str):
        raise bad_request(f"{where}.type", "Field required (a string)")
    return kind


def _tool_result_text(block: _ToolResultBlock, where: str) -> str:
    """String content as is; block lists joined by newlines. Text-like blocks we do not model
    (e.g. tool references) are kept as their compact JSON rather than dropped."""
    if block.content is None:
        return ""
    if isinstance(block.content, str):
        return block.content
    texts: list[str] = []
    for i, part in enumerate(block.content):
        at = f"{where}.content[{i}]"
        if _block_type(part, at) == "text":
            texts.append(validate_at(_TextBlock, part, at).text)
        else:
            texts.append(json.dumps(part, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(texts)


def _user_messages(msg: _Message, where: str) -> list[Message]:
    """Tool results become `tool` messages; text around them becomes user messages, in order."""
    if isinstance(msg.content, str):
        return [Message(role="user", content=msg.content)]
    out: list[Message] = []
    texts: list[str] = []
    for i, block in enumerate(msg.content):
        at = f"{where}.content[{i}]"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(validate_at(_TextBlock, block, at).text)
        elif kind == "tool_result":
            if texts:
                out.append(Message(role="user", content="\n".join(texts)))
                texts = []
            result = validate_at(_ToolResultBlock, block, at)
            out.append(
                Message(
                    role="tool",
                    content=_tool_result_text(result, at),
                    tool_call_id=result.tool_use_id,
                )
            )
        else:
            raise bad_request(
                f"{at}.type",
                f"unsupported block type {kind!r} in a user message; supported: text, tool_result",
            )
    if texts or not out:
        out.append(Message(role="user", content="\n".join(texts)))
    return out


def _thinking_text(block: _ThinkingBlock, seal: TokenSeal | None, at: str) -> str | None:
    """The readable thinking, else the one our signature carries; a signature in our
    format is checked either way (another session's is refused)."""
    decoded = open_token(seal, block.signature, "thinking", f"{at}.signature")
    if block.thinking:
        return block.thinking
    return decoded[1] if decoded is not None else None


def _assistant_message(msg: _Message, where: str, seal: TokenSeal | None) -> Message:
    if isinstance(msg.content, str):
        return Message(role="assistant", content=msg.content)
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(msg.content):
        at = f"{where}.content[{i}]"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(validate_at(_TextBlock, block, at).text)
        elif kind == "thinking":
            text = _thinking_text(validate_at(_ThinkingBlock, block, at), seal, at)
            if text is not None:
                reasoning.append(text)
        elif kind == "redacted_thinking":
            data = validate_at(_RedactedThinkingBlock, block, at).data
            decoded = open_token(seal, data, "thinking", f"{at}.data")
            if decoded is not None:  # someone else's encrypted thinking is unreadable: skip
                reasoning.append(decoded[1])
        elif kind == "tool_use":
            use = validate_at(_ToolUseBlock, block, at)
            args = json.dumps(use.input, ensure_ascii=False)
            calls.append(ToolCall(id=use.id, name=use.name, arguments=args))
        else:
            raise bad_request(
                f"{at}.type", f"unsupported block type {kind!r}; supported: {_BLOCK_TYPES}"
            )
    return Message(
        role="assistant",
        content="\n".join(texts) if texts else None,
        reasoning="\n".join(reasoning) if reasoning else None,
        tool_calls=calls,
    )


def _convert_messages(
    req: CountTokensRequest,
    prefix: Prefix | None = None,
    cache: HistoryCache | None = None,
    seal: TokenSeal | None = None,
) -> tuple[list[Message], list[str]]:
    """Chat messages, and the billing lines taken out of the top-level system prompt.

    With a `prefix`, `req.messages` holds only the messages after it, whose converted
    ones its state holds; with a `cache`, what `messages` converted to is remembered
    there (the system prompt is converted every time: Claude Code varies its billing line).
    """
    messages: list[Message] = []
    billing: list[str] = []
    if req.system is not None:
        system: list[str] = []
        for text in _text_blocks(req.system, "system"):
            if text.startswith(BILLING_HEADER + ":"):
                billing.append(text[len(BILLING_HEADER) + 1 :].strip())
            else:
                system.append(text)
        if system:
            messages.append(Message(role="system", content="\n".join(system)))
    start = prefix.count if prefix is not None else 0
    converted: list[Message] = list(prefix.state) if start else []  # type: ignore[union-attr]
    for i, msg in enumerate(req.messages):
        where = f"messages[{start + i}]"
        if msg.role == "system":  # Claude Code puts one at the end of `messages`
            texts = _text_blocks(msg.content, f"{where}.content")
            converted.append(Message(role="system", content="\n".join(texts)))
        elif msg.role == "user":
            converted.extend(_user_messages(msg, where))
        else:
            converted.append(_assistant_message(msg, where, seal))
    if cache is not None and prefix is not None:
        cache.remember(PROTOCOL, prefix, start + len(req.messages), tuple(converted))
    return messages + converted, billing


def _convert_tools(raw_tools: list[dict[str, Any]] | None) -> list[Tool]:
    """Client tools only. Server tools (typed, e.g. `web_search_20250305`) are dropped — our
    model cannot run them — as are `defer_loading` tools, which are not in the prompt until
    the client loads them."""
    tools: list[Tool] = []
    for i, raw in enumerate(raw_tools or []):
        where = f"tools[{i}]"
        if not isinstance(raw, dict):
            raise bad_request(where, "each tool must be an object")
        if raw.get("type") not in (None, "custom"):
            continue
        tool = validate_at(_ToolDef, raw, where)
        if not tool.defer_loading:
            tools.append(
                Tool(
                    name=tool.name,
                    description=tool.description,
                    parameters=tool.input_schema or {},
                )
            )
    return tools


def _tool_choice(choice: _ToolChoice | None) -> Any:
    """To the Chat form the rest of the Gateway uses."""
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise bad_request("tool_choice.name", "required when tool_choice.type is 'tool'")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _sampling(req: CountTokensRequest) -> SamplingParams:
    values = {
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "max_tokens": req.max_tokens,
        "stop": req.stop_sequences,
    }
    return sampling_params(values, {"stop": "stop_sequences"})


def _markers(headers: Mapping[str, str] | None, billing: list[str]) -> dict[str, str]:
    request_class = header_value(headers, "x-claude-code-request-class")
    kind = request_class
    if request_class == "compaction" or header_value(headers, "x-claude-code-compaction"):
        kind = "compaction"
    out: dict[str, str] = {}
    if kind:
        out[REQUEST_KIND_HEADER] = kind
    if (
        header_value(headers, "x-claude-code-agent-id")
        or request_class == "subagent"
        or any("cc_is_subagent=true" in line for line in billing)
    ):
        out[SUBAGENT_HEADER] = header_value(headers, "x-claude-code-agent-type") or "subagent"
    if billing:
        out[BILLING_HEADER] = "; ".join(billing)
    return out


def _parse(
    model: type[CountTokensRequest],
    body: bytes | str | Mapping[str, Any],
    headers: Mapping[str, str] | None,
    path: str,
    history: HistoryCache | None = None,
    seal: TokenSeal | None = None,
) -> CanonicalRequest:
    data = load_object(body)
    prefix = history.lookup(PROTOCOL, data.get("messages")) if history is not None else None
    return resume_or_full(prefix, lambda p: _convert(model, data, headers, path, p, history, seal))


def _convert(
    model: type[CountTokensRequest],
    data: dict[str, Any],
    headers: Mapping[str, str] | None,
    path: str,
    prefix: Prefix | None,
    history: HistoryCache | None,
    seal: TokenSeal | None,
) -> CanonicalRequest:
    """`_parse` of a loaded body; with a `prefix`, only the messages after it are validated."""
    if prefix is not None and prefix.count:
        data = {**data, "messages": data["messages"][prefix.count :]}
    try:
        req = model.model_validate(data)
    except ValidationError as exc:
        raise field_error(exc) from exc
    messages, billing = _convert_messages(req, prefix, history, seal)
    template_kwargs: dict[str, Any] = {}
    if req.thinking is not None and req.thinking.type == "disabled":
        template_kwargs["enable_thinking"] = False
    return CanonicalRequest(
        protocol=PROTOCOL,
        path=path.split("?", 1)[0],
        model=req.model,
        messages=messages,
        tools=_convert_tools(req.tools),
        tool_choice=_tool_choice(req.tool_choice),
        sampling=_sampling(req),
        stream=bool(req.stream),
        template_kwargs=template_kwargs,
        headers={**clean_headers(headers, MARKER_HEADERS), **_markers(headers, billing)},
    )


def parse_messages_request(
    body: bytes | str | Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    path: str = DEFAULT_PATH,
    history: HistoryCache | None = None,
    seal: TokenSeal | None = None,
) -> CanonicalRequest:
    """Validate a `/v1/messages` request (`?beta=true` in `path` is fine) and convert it;
    raises GatewayError(400) naming the field path. With the session's `history`, messages
    it already converted are taken from there (see `protocols.history`); a request that
    fails that way goes through the full path, whose error names the whole body's field.
    Signatures are checked with the session's `seal` (none: ours are all refused)."""
    return _parse(MessagesRequest, body, headers, path, history, seal)


def parse_count_tokens_request(
    body: bytes | str | Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    path: str = COUNT_TOKENS_PATH,
    seal: TokenSeal | None = None,
) -> CanonicalRequest:
    """Validate a `count_tokens` request into the canonical form whose prompt the caller
    tokenizes; `stream` is always False."""
    req = _parse(CountTokensRequest, body, headers, path, None, seal)
    return req.model_copy(update={"stream": False})
