"""Chat Completions adapter: request validation/conversion, and replies as real clients read them.

The reply tests go through the official `openai` SDK (and LangChain's ChatOpenAI) with an
httpx MockTransport whose handler runs our adapter, so the SDK's own parsing and stream
accumulation judge the wire format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import langchain_openai
import openai
import pytest

from gateway.canonical import CanonicalRequest, ParsedOutput, Reply, ToolCall
from gateway.errors import GatewayError
from gateway.protocols.openai_chat.reply import (
    chat_completion_body,
    chat_completion_sse,
    openai_error_body,
    openai_error_response,
    sse_error_event,
)
from gateway.protocols.openai_chat.request import parse_chat_request
from tests.fixtures.sdk_transport import openai_client

ARGS_0 = json.dumps({"command": "grep -rn 'def main' src/ | head -n 20", "timeout": 30})
ARGS_1 = json.dumps({"path": "README.md", "note": "中文说明 {nested: {x}}"}, ensure_ascii=False)
REASONING = "The user wants the main function. I should search first, then read the README."
CONTENT = "Let me look at the repository — 先搜索一下。"


def make_result(
    *,
    content: str | None = CONTENT,
    reasoning: str | None = REASONING,
    tool_calls: list[ToolCall] | None = None,
    finish_reason: str = "stop",
) -> Reply:
    return Reply(
        call_id="abc123",
        model="tiny-model",
        created=1_700_000_000,
        output=ParsedOutput(reasoning=reasoning, content=content, tool_calls=tool_calls or []),
        finish_reason=finish_reason,  # type: ignore[arg-type]
        prompt_tokens=100,
        completion_tokens=40,
        cached_prompt_tokens=64,
        output_ids=[1, 2, 3],
        output_logprobs=[-0.1, -0.2, -0.3],
    )


TOOL_CALLS = [
    ToolCall(id="call_abc123_0", name="bash", arguments=ARGS_0),
    ToolCall(id="call_abc123_1", name="read_file", arguments=ARGS_1),
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def base_request(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


# --- request validation and conversion ---------------------------------------------------------


def test_full_conversion() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "Be terse."},
            {
                "role": "system",
                "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            },
            {"role": "user", "content": "list files", "name": "alice"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "think",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.txt"}]},
            {"role": "assistant", "content": "done", "reasoning": "new-name"},
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 50,
        "max_completion_tokens": 40,
        "temperature": 0.5,
        "top_k": 20,
        "stop": "END",
        "chat_template_kwargs": {"enable_thinking": False},
        # Extra fields clients send, ignored:
        "user": "u",
        "metadata": {"a": "b"},
        "parallel_tool_calls": True,
        "logprobs": False,
        "n": 1,
    }
    req = parse_chat_request(
        json.dumps(body).encode(),
        headers={"Authorization": "Bearer secret", "User-Agent": "codex"},
    )
    assert isinstance(req, CanonicalRequest)
    assert req.protocol == "openai_chat" and req.path == "/v1/chat/completions"
    assert [m.role for m in req.messages] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert req.messages[1].content == "A\nB"
    assert req.messages[2].name == "alice"
    assert req.messages[3].reasoning == "think"
    assert req.messages[3].tool_calls[0].model_dump() == {
        "id": "c1",
        "name": "bash",
        "arguments": "{}",
    }
    assert (req.messages[4].tool_call_id, req.messages[4].content) == ("c1", "a.txt")
    assert req.messages[5].reasoning == "new-name"
    assert req.tools[0].name == "bash" and req.tools[0].parameters["type"] == "object"
    assert req.tool_choice == "auto"
    assert req.stream and req.include_usage
    assert req.sampling.max_tokens == 40  # max_completion_tokens wins
    assert req.sampling.stop == ["END"] and req.sampling.top_k == 20
    assert req.template_kwargs == {"enable_thinking": False}
    assert req.headers == {"User-Agent": "codex"}  # credentials never copied


def _error(body: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        parse_chat_request(body)
    assert info.value.status == 400 and info.value.kind == "invalid_request"
    return info.value


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (
            base_request(
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            ),
            "messages[0].content",
            "text-only",
        ),
        (
            base_request(messages=[{"role": "user", "content": 5}]),
            "messages[0].content",
            "valid string",
        ),
        (
            base_request(messages=[{"role": "function", "content": "x"}]),
            "messages[0].role",
            "'tool'",
        ),
        (base_request(messages=[{"role": "tool", "content": "x"}]), "messages[0]", "tool_call_id"),
        (base_request(messages=[{"role": "user"}]), "messages[0]", "needs content"),
        (
            base_request(
                messages=[
                    {
                        "role": "user",
                        "content": "x",
                        "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}],
                    }
                ]
            ),
            "messages[0]",
            "only allowed on assistant",
        ),
        (
            base_request(
                messages=[
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "a",
                                "type": "function",
                                "function": {"name": "f", "arguments": {"a": 1}},
                            }
                        ],
                    }
                ]
            ),
            "messages[0].tool_calls[0].function.arguments",
            "valid string",
        ),
        (base_request(messages=[]), "messages", "at least 1"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model", "Field required"),
        (base_request(n=2), "n", "n=1"),
        (base_request(temperature="hot"), "temperature", "valid number"),
        (base_request(temperature=50), "temperature", "less than or equal"),
        (base_request(max_completion_tokens=0), "max_completion_tokens", "greater than"),
        (base_request(max_tokens=0), "max_tokens", "greater than"),
        (base_request(stop=[1]), "stop[0]", "valid string"),
        (base_request(logit_bias={"x": 1}), "logit_bias.x", "valid integer"),
        (base_request(logit_bias={"5": 200}), "logit_bias.5", "less than or equal"),
        (base_request(stream="yes"), "stream", "valid boolean"),
        (base_request(tool_choice="sometimes"), "tool_choice", "'auto'"),
        (
            base_request(tools=[{"type": "custom", "custom": {"name": "x"}}]),
            "tools[0].type",
            "'function'",
        ),
        (
            base_request(tools=[{"type": "function", "function": {"name": ""}}]),
            "tools[0].function.name",
            "at least 1",
        ),
        (
            base_request(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            "messages[0].content",
            "string 'text'",
        ),
    ],
)
def test_validation_errors(body: dict[str, Any], param: str, fragment: str) -> None:
    err = _error(body)
    assert err.param == param, err
    assert fragment in err.message, err
    assert err.message.startswith(f"Invalid request: {param}: "), err


def test_body_not_json_or_not_object() -> None:
    assert "not valid JSON" in _error(b"{nope").message
    assert "JSON object" in _error(b"[1, 2]").message


def test_developer_is_a_system_message_that_remembers_it_and_assistant_content_optional() -> None:
    """A developer message renders as a system one, but stays marked: its presence changes
    how templates without a developer role get the system messages (vLLM folds them all)."""
    req = parse_chat_request(
        base_request(
            messages=[
                {"role": "developer", "content": "d"},
                {"role": "system", "content": "s"},
                {"role": "assistant", "content": None},
            ]
        )
    )
    assert [(m.role, m.developer) for m in req.messages] == [
        ("system", True),
        ("system", False),
        ("assistant", False),
    ]
    assert req.messages[2].content is None


# --- reply bodies -------------------------------------------------------------------------------


def test_body_shape_with_tool_calls() -> None:
    body = chat_completion_body(make_result(tool_calls=TOOL_CALLS), include_reasoning=True)
    assert body["id"] == "chatcmpl-abc123" and body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["reasoning"] == msg["reasoning_content"] == REASONING
    assert msg["tool_calls"][1] == {
        "id": "call_abc123_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": ARGS_1},
    }
    assert body["usage"] == {
        "prompt_tokens": 100,
        "completion_tokens": 40,
        "total_tokens": 140,
        "prompt_tokens_details": {"cached_tokens": 64},
    }


def test_body_without_reasoning_and_empty_content() -> None:
    body = chat_completion_body(make_result(content=None), include_reasoning=False)
    msg = body["choices"][0]["message"]
    assert "reasoning" not in msg and "reasoning_content" not in msg and "tool_calls" not in msg
    assert msg["content"] == ""  # never null without tool calls
    assert body["choices"][0]["finish_reason"] == "stop"


def test_sse_framing() -> None:
    frames = list(chat_completion_sse(make_result(tool_calls=TOOL_CALLS), include_usage=True))
    assert frames[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(f.removeprefix(b"data: ")) for f in frames[:-1]]
    assert all(f.startswith(b"data: ") and f.endswith(b"\n\n") for f in frames)
    assert {(c["id"], c["created"], c["model"]) for c in chunks} == {
        ("chatcmpl-abc123", 1_700_000_000, "tiny-model")
    }
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 140
    assert all(c["usage"] is None for c in chunks[:-1])
    finish = chunks[-2]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "tool_calls"
    content_pieces = [
        c["choices"][0]["delta"]["content"]
        for c in chunks[1:-2]
        if "content" in c["choices"][0]["delta"]
    ]
    assert len(content_pieces) > 1 and "".join(content_pieces) == CONTENT
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    first_tc = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert first_tc[0] == {
        "index": 0,
        "id": "call_abc123_0",
        "type": "function",
        "function": {"name": "bash", "arguments": ""},
    }


def test_sse_without_usage_has_no_usage_key() -> None:
    frames = list(chat_completion_sse(make_result(), include_usage=False))
    chunks = [json.loads(f.removeprefix(b"data: ")) for f in frames[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# --- through the official SDK --------------------------------------------------------------------


def sdk_client(result: Reply, seen: list[CanonicalRequest]) -> openai.OpenAI:
    """An OpenAI client whose transport runs our adapter on each request."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        try:
            req = parse_chat_request(request.content, headers=dict(request.headers))
        except GatewayError as err:
            resp = openai_error_response(err)
            return httpx.Response(err.status, content=resp.body, headers=dict(resp.headers))
        seen.append(req)
        if req.stream:
            return httpx.Response(
                200,
                content=b"".join(chat_completion_sse(result, req.include_usage)),
                headers={"content-type": "text/event-stream"},
            )
        return httpx.Response(200, json=chat_completion_body(result, include_reasoning=True))

    return openai_client(handler, api_key="session-token")


MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "find main"},
]


def test_sdk_non_stream_tool_calls_and_reasoning() -> None:
    seen: list[CanonicalRequest] = []
    client = sdk_client(make_result(tool_calls=TOOL_CALLS), seen)
    resp = client.chat.completions.create(
        model="tiny-model", messages=MESSAGES, tools=TOOLS, user="u1", parallel_tool_calls=True
    )
    msg = resp.choices[0].message
    assert resp.id == "chatcmpl-abc123" and resp.choices[0].finish_reason == "tool_calls"
    assert msg.content == CONTENT
    assert msg.model_extra is not None and msg.model_extra["reasoning_content"] == REASONING
    assert msg.tool_calls is not None
    assert [(tc.id, tc.function.name, tc.function.arguments) for tc in msg.tool_calls] == [
        (tc.id, tc.name, tc.arguments) for tc in TOOL_CALLS
    ]
    assert resp.usage is not None and resp.usage.prompt_tokens_details is not None
    assert resp.usage.prompt_tokens_details.cached_tokens == 64
    assert seen[0].tools[0].name == "bash" and not seen[0].stream


def test_sdk_stream_chunks_accumulate() -> None:
    seen: list[CanonicalRequest] = []
    client = sdk_client(make_result(tool_calls=TOOL_CALLS), seen)
    stream = client.chat.completions.create(
        model="tiny-model",
        messages=MESSAGES,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, reasoning, finish, usage = "", "", None, None
    calls: dict[int, dict[str, str]] = {}
    ids = set()
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning") or ""
            for tc in delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            finish = choice.finish_reason or finish
    assert ids == {"chatcmpl-abc123"}
    assert content == CONTENT and reasoning == REASONING and finish == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        {"id": tc.id, "name": tc.name, "arguments": tc.arguments} for tc in TOOL_CALLS
    ]
    assert usage is not None and usage.total_tokens == 140
    assert seen[0].stream and seen[0].include_usage


def test_sdk_stream_helper_final_completion() -> None:
    client = sdk_client(make_result(tool_calls=TOOL_CALLS), [])
    with client.chat.completions.stream(
        model="tiny-model", messages=MESSAGES, tools=TOOLS
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == CONTENT
    msg = final.choices[0].message
    assert msg.content == CONTENT and final.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls is not None
    assert [(tc.id, tc.function.name, tc.function.arguments) for tc in msg.tool_calls] == [
        (tc.id, tc.name, tc.arguments) for tc in TOOL_CALLS
    ]


def test_sdk_stream_helper_plain_text_no_reasoning() -> None:
    result = make_result(reasoning=None, content="短い答え。" * 9)
    client = sdk_client(result, [])
    with client.chat.completions.stream(model="tiny-model", messages=MESSAGES) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "短い答え。" * 9
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].finish_reason == "stop"


def test_sdk_length_finish() -> None:
    client = sdk_client(make_result(content=None, finish_reason="length"), [])
    resp = client.chat.completions.create(model="tiny-model", messages=MESSAGES)
    assert resp.choices[0].finish_reason == "length" and resp.choices[0].message.content == ""


def test_sdk_sees_validation_error() -> None:
    client = sdk_client(make_result(), [])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny-model",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}],
                }
            ],
        )
    assert info.value.status_code == 400
    assert info.value.code == "invalid_request" and info.value.param == "messages[0].content"
    assert "text-only" in info.value.message


@pytest.mark.parametrize(
    ("err", "exc_type"),
    [
        (GatewayError("overloaded", "busy", status=429, retry_after=2), openai.RateLimitError),
        (GatewayError("authentication", "bad token"), openai.AuthenticationError),
        (GatewayError("not_found", "no session"), openai.NotFoundError),
        (GatewayError("conflict", "closed"), openai.ConflictError),
        (GatewayError("engine_timeout", "slow"), openai.InternalServerError),
    ],
)
def test_sdk_error_statuses(err: GatewayError, exc_type: type[Exception]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        resp = openai_error_response(err)
        return httpx.Response(err.status, content=resp.body, headers=dict(resp.headers))

    client = openai_client(handler)
    with pytest.raises(exc_type) as info:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert err.message in str(info.value)
    if err.retry_after is not None:
        assert info.value.response.headers["retry-after"] == "2"  # type: ignore[attr-defined]


def test_sdk_raises_on_in_stream_error_event() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        frames = list(chat_completion_sse(make_result(), include_usage=False))
        err = GatewayError("internal", "recorder failed")
        body = frames[0] + sse_error_event(err)
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = openai_client(handler)
    with pytest.raises(openai.APIError, match="recorder failed"):
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))


def test_error_body_shape() -> None:
    err = GatewayError("invalid_request", "bad", param="messages[0]")
    assert openai_error_body(err) == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "messages[0]",
            "code": "invalid_request",
        }
    }
    assert err.headers() == {}
    with pytest.raises(ValueError):
        GatewayError("weird", "x")  # type: ignore[arg-type]


# --- LangChain's ChatOpenAI ---------------------------------------------------------------------


def _langchain_model(result: Reply, seen: list[CanonicalRequest], **kw: Any) -> Any:
    client = sdk_client(result, seen)
    return langchain_openai.ChatOpenAI(
        model="tiny-model",
        api_key="session-token",
        base_url="http://gateway/v1",
        http_client=client._client,
        max_retries=0,
        **kw,
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_langchain_tool_calls(streaming: bool) -> None:
    seen: list[CanonicalRequest] = []
    llm = _langchain_model(make_result(tool_calls=TOOL_CALLS), seen, streaming=streaming)
    bound: Callable[..., Any] = llm.bind_tools(TOOLS).invoke
    msg = bound([("system", "sys"), ("human", "find main")])
    assert [(tc["id"], tc["name"], tc["args"]) for tc in msg.tool_calls] == [
        (tc.id, tc.name, json.loads(tc.arguments)) for tc in TOOL_CALLS
    ]
    assert msg.content == CONTENT
    assert seen[0].stream is streaming
