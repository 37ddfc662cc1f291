"""OpenAI Responses requests (what Codex CLI speaks): wire models and their conversion to
`CanonicalRequest`, for `/v1/responses` and `/v1/responses/compact`. Replies are in
`openai_responses_reply`.

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

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError

from gateway.canonical import CanonicalRequest, Message, Tool, ToolCall
from gateway.errors import GatewayError
from gateway.protocols.history import HistoryCache, Prefix, resume_or_full
from gateway.protocols.opaque_token import TokenSeal, open_token
from gateway.protocols.wire import (
    REQUEST_KIND_HEADER,
    SUBAGENT_HEADER,
    Wire,
    bad_request,
    clean_headers,
    client_template_kwargs,
    field_error,
    header_value,
    load_object,
    parse_json,
    sampling_params,
    tool_choice_mode,
    validate_at,
)
from schemas.sampling import SamplingParams

PROTOCOL = "openai_responses"
DEFAULT_PATH = "/v1/responses"
COMPACT_PATH_SUFFIX = "/responses/compact"
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

_NON_TEXT_PARTS = {"input_image", "input_file", "input_audio", "image_url", "file"}
_UNSTORED_ITEMS = {"item_reference"}
_ITEM_TYPES = (
    "message, function_call, function_call_output, reasoning, compaction, compaction_trigger"
)

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
            if isinstance(kind, str) and kind in _NON_TEXT_PARTS:
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

    def snapshot(self) -> tuple[tuple[Message, ...], dict[str, Any] | None]:
        """The fold's state, to resume it later (`resume`) with more items."""
        return tuple(self.messages), _copy_turn(self._turn)

    @classmethod
    def resume(cls, state: tuple[tuple[Message, ...], dict[str, Any] | None]) -> _History:
        history = cls()
        history.messages, history._turn = list(state[0]), _copy_turn(state[1])
        return history


def _copy_turn(turn: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if turn is None else {**turn, "tool_calls": list(turn["tool_calls"])}


def _reasoning_text(item: _ReasoningItem, seal: TokenSeal | None, where: str) -> str | None:
    """Our echoed reasoning: readable content first, then our token, then the summary. A
    token in our format is checked even when the readable copy came along: one sealed
    for another session is refused either way."""
    decoded = open_token(seal, item.encrypted_content, "reasoning", f"{where}.encrypted_content")
    if item.content:
        return "\n".join(part.text for part in item.content)
    if decoded is not None:
        return decoded[1]
    if item.summary:
        return "\n".join(part.text for part in item.summary)
    return None


def _convert_input(
    req: ResponsesRequest,
    prefix: Prefix | None = None,
    cache: HistoryCache | None = None,
    seal: TokenSeal | None = None,
) -> tuple[list[Message], bool]:
    """Messages for the model, and whether a `compaction_trigger` item asked to compact.

    With a `prefix`, `req.input` holds only the items after it and the fold resumes from
    its state; with a `cache`, the fold's state after all items is remembered there.
    """
    start = prefix.count if prefix is not None else 0
    if start:
        history = _History.resume(prefix.state)  # type: ignore[union-attr]  # start > 0
    else:
        history = _History()
        if req.instructions:
            history.add(Message(role="system", content=req.instructions))
    if isinstance(req.input, str):
        history.add(Message(role="user", content=req.input))
        return history.done(), False
    triggered = False
    items = req.input or []
    for i, raw in enumerate(items):
        where = f"input[{start + i}]"
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
                developer = msg.role == "developer"
                history.add(Message(role=role, content=text, developer=developer))
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
            item = validate_at(_ReasoningItem, raw, where)
            history.reasoning(_reasoning_text(item, seal, where))
        elif kind == "compaction":
            compacted = validate_at(_CompactionItem, raw, where)
            at = f"{where}.encrypted_content"
            decoded = open_token(seal, compacted.encrypted_content, "compaction", at)
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
    if cache is not None and prefix is not None and not triggered:
        cache.remember(PROTOCOL, prefix, start + len(items), history.snapshot())
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
        return choice if choice is None else tool_choice_mode(choice)
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
    return sampling_params(values, {"max_tokens": "max_output_tokens"})


def _turn_metadata(req: ResponsesRequest, headers: Mapping[str, str] | None) -> dict[str, Any]:
    """Codex's `x-codex-turn-metadata` (a JSON string), from the header or `client_metadata`."""
    raw: Any = header_value(headers, "x-codex-turn-metadata")
    if raw is None and req.client_metadata:
        raw = req.client_metadata.get("x-codex-turn-metadata")
    if isinstance(raw, str):
        try:
            raw = parse_json(raw, "x-codex-turn-metadata")
        except GatewayError:  # hints only: unreadable ones are ignored
            return {}
    return raw if isinstance(raw, dict) else {}


def _markers(
    req: ResponsesRequest, headers: Mapping[str, str] | None, compaction: bool
) -> dict[str, str]:
    meta = _turn_metadata(req, headers)
    subagent = header_value(headers, "x-openai-subagent")
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
    history: HistoryCache | None = None,
    seal: TokenSeal | None = None,
) -> CanonicalRequest:
    """Validate a `/v1/responses` or `/v1/responses/compact` request and convert it.

    Raises GatewayError(400) naming the field path. A compact-endpoint request is never
    streamed and gets `COMPACT_INSTRUCTION` appended. With the session's `history`, input
    items it already converted are taken from there (see `protocols.history`); a request
    that fails that way goes through the full path, whose error names the whole body's
    field. Opaque tokens are checked with the session's `seal` (none: every token in our
    format is refused).
    """
    data = load_object(body)
    prefix = None
    if history is not None:
        prefix = history.lookup(PROTOCOL, data.get("input"), data.get("instructions"))
    return resume_or_full(prefix, lambda p: _parse(data, headers, path, p, history, seal))


def _parse(
    data: dict[str, Any],
    headers: Mapping[str, str] | None,
    path: str,
    prefix: Prefix | None,
    history: HistoryCache | None,
    seal: TokenSeal | None,
) -> CanonicalRequest:
    path = path.split("?", 1)[0]
    compact_endpoint = path.rstrip("/").endswith(COMPACT_PATH_SUFFIX)
    if prefix is not None and prefix.count:
        data = {**data, "input": data["input"][prefix.count :]}
    try:
        req = ResponsesRequest.model_validate(data)
    except ValidationError as exc:
        raise field_error(exc) from exc
    if req.previous_response_id is not None:
        raise bad_request(
            "previous_response_id",
            "server-side history is not kept by this gateway; send the full input (store=false)",
        )
    messages, triggered = _convert_input(req, prefix, history, seal)
    compaction = compact_endpoint or triggered
    if compaction:
        messages.append(Message(role="user", content=COMPACT_INSTRUCTION))
    if not messages:
        raise bad_request("input", "at least one input item (or instructions) is required")
    template_kwargs = client_template_kwargs(req.chat_template_kwargs)
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
