"""OpenAI Chat Completions requests: wire models and their conversion to `CanonicalRequest`.

Validation is lenient about fields we ignore (the official SDK and LangChain send many:
`user`, `metadata`, `parallel_tool_calls`, ...) and strict about the types of the fields we
use, with error messages naming the offending field path. Replies are in
`openai_chat_reply`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from gateway.canonical import CanonicalRequest, Message, Tool, ToolCall
from gateway.protocols.history import HistoryCache, Prefix, resume_or_full
from gateway.protocols.wire import (
    Wire,
    bad_request,
    clean_headers,
    client_template_kwargs,
    field_error,
    load_object,
    sampling_params,
    tool_choice_mode,
)
from schemas.sampling import SamplingParams

PROTOCOL = "openai_chat"
DEFAULT_PATH = "/v1/chat/completions"

_NON_TEXT_PARTS = {"image_url", "input_image", "input_audio", "file", "input_file", "video_url"}


# --- request models -----------------------------------------------------------------------


class _FunctionCall(Wire):
    name: str
    arguments: str


class _ToolCall(Wire):
    id: str
    type: Literal["function"] = "function"
    function: _FunctionCall


class _ChatMessage(Wire):
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
                if isinstance(kind, str) and kind in _NON_TEXT_PARTS:
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


class _FunctionDef(Wire):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(Wire):
    type: Literal["function"]
    function: _FunctionDef


class _StreamOptions(Wire):
    include_usage: bool | None = None


class ChatCompletionRequest(Wire):
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
    logit_bias: dict[str, Any] | None = None
    n: int | None = None
    tools: list[_Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def parse_chat_request(
    body: bytes | str | Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    path: str = DEFAULT_PATH,
    history: HistoryCache | None = None,
) -> CanonicalRequest:
    """Validate a Chat Completions request and convert it; raises GatewayError(400).

    With the session's `history`, messages it already converted are taken from there and
    only the new ones are validated (see `protocols.history`); a request that fails that
    way goes through the full path, whose error names the field in the whole body.
    """
    data = load_object(body)
    prefix = history.lookup(PROTOCOL, data.get("messages")) if history is not None else None
    return resume_or_full(prefix, lambda p: _parse(data, headers, path, p, history))


def _parse(
    data: dict[str, Any],
    headers: Mapping[str, str] | None,
    path: str,
    prefix: Prefix | None,
    history: HistoryCache | None,
) -> CanonicalRequest:
    held: tuple[Message, ...] = ()
    if prefix is not None and prefix.count:
        held = prefix.state
        data = {**data, "messages": data["messages"][prefix.count :]}
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise field_error(exc) from exc
    if req.n is not None and req.n != 1:
        raise bad_request("n", "only n=1 is supported")
    if isinstance(req.tool_choice, str):
        tool_choice_mode(req.tool_choice)
    messages = [*held, *map(_to_message, req.messages)]
    canonical = CanonicalRequest(
        protocol=PROTOCOL,
        path=path,
        model=req.model,
        messages=messages,
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
        template_kwargs=client_template_kwargs(req.chat_template_kwargs),
        headers=clean_headers(headers),
    )
    if history is not None and prefix is not None:
        history.remember(PROTOCOL, prefix, len(messages), tuple(messages))
    return canonical


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
        "logit_bias": req.logit_bias,
    }
    return sampling_params(values, {"max_tokens": max_param})


def _to_message(m: _ChatMessage) -> Message:
    developer = m.role == "developer"
    role = "system" if developer else m.role
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
        developer=developer,
    )
