"""Anthropic Messages adapter: Claude Code-shaped requests → canonical form, and replies as
the official `anthropic` SDK reads them (its stream accumulator builds the final message).

The SDK (2.x) runs on `httpx2`, so the mock transport comes from there. Sample bodies have
the shapes Claude Code 2.1.332 sends to a custom base URL.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest

from gateway.canonical import CanonicalRequest, Message, ParsedOutput, Reply, ToolCall
from gateway.errors import KINDS, GatewayError
from gateway.protocols.anthropic_messages.reply import (
    ANTHROPIC_ERRORS,
    anthropic_error_body,
    anthropic_error_response,
    anthropic_error_status,
    count_tokens_body,
    messages_body,
    messages_sse,
    sse_error_event,
    thinking_signature,
)
from gateway.protocols.anthropic_messages.request import (
    BILLING_HEADER,
    parse_count_tokens_request,
    parse_messages_request,
)
from gateway.protocols.opaque_token import TokenSeal
from gateway.protocols.wire import REQUEST_KIND_HEADER, SUBAGENT_HEADER
from tests.fixtures.sdk_transport import anthropic_client

#: The seal of the session these requests belong to (`opaque_token`).
SEAL = TokenSeal(b"k" * 32)

REASONING = "I should list the files first, then read 说明文件 carefully."
CONTENT = "Let me look at the repository."
ARGS_0 = json.dumps({"command": "ls -la | head -n 20", "description": "List files"})
ARGS_1 = json.dumps({"file_path": "/work/README.md", "note": "中文 {x}"}, ensure_ascii=False)
TOOL_CALLS = [
    ToolCall(id="call_abc123_0", name="Bash", arguments=ARGS_0),
    ToolCall(id="call_abc123_1", name="Read", arguments=ARGS_1),
]


def make_result(
    *,
    content: str | None = CONTENT,
    reasoning: str | None = REASONING,
    tool_calls: list[ToolCall] | None = None,
    finish_reason: str = "stop",
    call_id: str = "abc123",
) -> Reply:
    return Reply(
        call_id=call_id,
        model="tiny-model",
        created=1_700_000_000,
        output=ParsedOutput(reasoning=reasoning, content=content, tool_calls=tool_calls or []),
        finish_reason=finish_reason,  # type: ignore[arg-type]
        prompt_tokens=120,
        completion_tokens=30,
        cached_prompt_tokens=96,
        output_ids=[1, 2, 3],
        output_logprobs=[-0.1, -0.2, -0.3],
    )


BASH_TOOL = {
    "name": "Bash",
    "description": "Executes a bash command.",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
    },
}
BILLING = "x-anthropic-billing-header: cc_version=2.1.332.a1b; cc_entrypoint=sdk-cli;"
CC_HEADERS = {
    "x-api-key": "session-token",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    "x-app": "cli",
    "X-Claude-Code-Session-Id": "5b1c",
    "User-Agent": "claude-cli/2.1.332 (external, sdk-cli)",
}


def claude_code_body(
    *turns: dict[str, Any], billing: str = BILLING, **extra: Any
) -> dict[str, Any]:
    """A body shaped like Claude Code's main-loop request in `-p` mode."""
    return {
        "model": "tiny-model",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": billing},
            {
                "type": "text",
                "text": "You are a Claude agent.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "Help with software tasks.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>skills</system-reminder>"},
                    {
                        "type": "text",
                        "text": "list the files",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            *turns,
            {"role": "system", "content": "# Environment\nWorking directory: /work"},
        ],
        "tools": [
            BASH_TOOL,
            {
                "name": "DeferredToolPlaceholder",
                "input_schema": {"type": "object"},
                "defer_loading": True,
            },
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
        ],
        "metadata": {
            "user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "5b1c"})
        },
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        **extra,
    }


def assistant_echo(result: Reply) -> dict[str, Any]:
    return {"role": "assistant", "content": messages_body(result, SEAL)["content"]}


TOOL_RESULTS = {
    "role": "user",
    "content": [
        {
            "type": "tool_result",
            "tool_use_id": "call_abc123_0",
            "content": "a.txt\nb.txt",
            "is_error": False,
            "cache_control": {"type": "ephemeral"},
        },
        {
            "type": "tool_result",
            "tool_use_id": "call_abc123_1",
            "content": [
                {"type": "text", "text": "line 1"},
                {"type": "tool_reference", "tool_name": "Grep"},
            ],
            "is_error": True,
        },
        {"type": "text", "text": "<system-reminder>todo list</system-reminder>"},
    ],
}


# --- request conversion ---------------------------------------------------------------------


def test_claude_code_main_loop_conversion() -> None:
    body = claude_code_body(assistant_echo(make_result(tool_calls=TOOL_CALLS)), TOOL_RESULTS)
    path = "/v1/messages?beta=true"
    req = parse_messages_request(json.dumps(body).encode(), CC_HEADERS, path, seal=SEAL)
    assert isinstance(req, CanonicalRequest)
    assert req.protocol == "anthropic_messages" and req.path == "/v1/messages"
    assert [m.role for m in req.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
        "system",
    ]
    assert req.messages[0].content == "You are a Claude agent.\nHelp with software tasks."
    assert req.messages[1].content == "<system-reminder>skills</system-reminder>\nlist the files"
    assert req.messages[2] == Message(
        role="assistant", content=CONTENT, reasoning=REASONING, tool_calls=TOOL_CALLS
    )
    assert (req.messages[3].tool_call_id, req.messages[3].content) == (
        "call_abc123_0",
        "a.txt\nb.txt",
    )
    assert req.messages[4].content == 'line 1\n{"type":"tool_reference","tool_name":"Grep"}'
    assert req.messages[5].content == "<system-reminder>todo list</system-reminder>"
    assert req.messages[6].content == "# Environment\nWorking directory: /work"
    assert [t.name for t in req.tools] == ["Bash"]  # deferred and server tools dropped
    assert req.tools[0].parameters["required"] == ["command"]
    assert req.sampling.max_tokens == 32000 and req.stream
    assert req.template_kwargs == {}
    assert "x-api-key" not in req.headers and req.headers["x-app"] == "cli"
    assert req.headers[BILLING_HEADER] == "cc_version=2.1.332.a1b; cc_entrypoint=sdk-cli;"
    assert REQUEST_KIND_HEADER not in req.headers and SUBAGENT_HEADER not in req.headers


def test_sampling_choice_and_simple_forms() -> None:
    req = parse_messages_request(
        {
            "model": "m",
            "max_tokens": 1,
            "system": "Be terse.",
            "messages": [
                {"role": "user", "content": "quota"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": []},
            ],
            "stop_sequences": ["</answer>"],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "thinking": {"type": "disabled"},
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "service_tier": "auto",
        }
    )
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "Be terse."),
        ("user", "quota"),
        ("assistant", "ok"),
        ("user", ""),
    ]
    s = req.sampling
    assert (s.max_tokens, s.stop, s.temperature, s.top_p, s.top_k) == (
        1,
        ["</answer>"],
        0.5,
        0.9,
        20,
    )
    assert req.template_kwargs == {"enable_thinking": False} and not req.stream
    assert req.tool_choice == "required"


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    assert parse_messages_request({**body, "tool_choice": choice}).tool_choice == expected


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"type": "thinking", "thinking": REASONING, "signature": "foreign-sig"}, REASONING),
        (
            {
                "type": "thinking",
                "thinking": "",
                "signature": thinking_signature(make_result(), SEAL),
            },
            REASONING,
        ),
        ({"type": "thinking", "thinking": "", "signature": "foreign-sig"}, None),
        ({"type": "redacted_thinking", "data": thinking_signature(make_result(), SEAL)}, REASONING),
        ({"type": "redacted_thinking", "data": "EmwKAhgBEgy-foreign"}, None),
    ],
)
def test_thinking_echo(block: dict[str, Any], expected: str | None) -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "hi"}]},
        ],
    }
    msg = parse_messages_request(body, seal=SEAL).messages[-1]
    assert msg.reasoning == expected and msg.content == "hi"


def test_tool_result_variants_and_text_before_results() -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "before"},
                    {"type": "tool_result", "tool_use_id": "t1"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": []},
                ],
            },
        ],
    }
    msgs = parse_messages_request(body).messages
    assert msgs[0].tool_calls == [ToolCall(id="t1", name="Bash", arguments="{}")]
    assert msgs[0].content is None and msgs[0].reasoning is None
    assert [(m.role, m.content, m.tool_call_id) for m in msgs[1:]] == [
        ("user", "before", None),
        ("tool", "", "t1"),
        ("tool", "", "t2"),
    ]


@pytest.mark.parametrize(
    ("headers", "billing", "kind", "subagent"),
    [
        (
            {"x-claude-code-request-class": "compaction", "x-claude-code-compaction": "manual"},
            BILLING,
            "compaction",
            None,
        ),
        ({"x-claude-code-compaction": "auto"}, BILLING, "compaction", None),
        ({"x-claude-code-request-class": "main"}, BILLING, "main", None),
        (
            {
                "x-claude-code-request-class": "subagent",
                "x-claude-code-agent-id": "a1",
                "x-claude-code-agent-type": "general-purpose",
            },
            BILLING,
            "subagent",
            "general-purpose",
        ),
        ({"x-claude-code-agent-id": "a1"}, BILLING, None, "subagent"),
        ({}, BILLING + " cc_is_subagent=true;", None, "subagent"),
        (
            {REQUEST_KIND_HEADER: "compaction", "X-Rollout-Subagent": "x", BILLING_HEADER: "x"},
            "no billing",
            None,
            None,
        ),
    ],
)
def test_markers(
    headers: dict[str, str], billing: str, kind: str | None, subagent: str | None
) -> None:
    req = parse_messages_request(claude_code_body(billing=billing), headers)
    assert req.headers.get(REQUEST_KIND_HEADER) == kind
    assert req.headers.get(SUBAGENT_HEADER) == subagent
    assert "X-Rollout-Subagent" not in req.headers
    if billing == "no billing":  # not a billing line: stays in the prompt, no header
        assert BILLING_HEADER not in req.headers and req.messages[0].content.startswith(
            "no billing"
        )


def test_count_tokens_request() -> None:
    body = claude_code_body()
    del body["max_tokens"]
    req = parse_count_tokens_request(body, CC_HEADERS, "/v1/messages/count_tokens?beta=true")
    assert req.path == "/v1/messages/count_tokens" and not req.stream
    assert req.sampling.max_tokens is None and [t.name for t in req.tools] == ["Bash"]
    probe = parse_count_tokens_request(
        {"model": "m", "messages": [{"role": "user", "content": "foo"}]}
    )
    assert probe.messages == [Message(role="user", content="foo")]
    assert count_tokens_body(42) == {"input_tokens": 42}
    with pytest.raises(GatewayError) as info:
        parse_count_tokens_request({"model": "m", "messages": []})
    assert info.value.param == "messages"


def _error(body: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        parse_messages_request(body)
    assert info.value.status == 400 and info.value.kind == "invalid_request"
    return info.value


def base(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


def user_blocks(*blocks: Any) -> dict[str, Any]:
    return base(messages=[{"role": "user", "content": list(blocks)}])


def assistant_blocks(*blocks: Any) -> dict[str, Any]:
    return base(
        messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": list(blocks)}]
    )


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
            "Field required",
        ),
        (user_blocks(IMAGE), "messages[0].content[0].type", "text-only"),
        (
            user_blocks({"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}),
            "messages[0].content[0].content[0].type",
            "text-only",
        ),
        (
            user_blocks({"type": "document", "source": {}}),
            "messages[0].content[0].type",
            "text-only",
        ),
        (
            user_blocks({"type": "tool_use", "id": "t", "name": "f", "input": {}}),
            "messages[0].content[0].type",
            "tool_result",
        ),
        (user_blocks({"type": "text"}), "messages[0].content[0].text", "Field required"),
        (
            user_blocks({"type": "tool_result"}),
            "messages[0].content[0].tool_use_id",
            "Field required",
        ),
        (
            user_blocks({"type": "tool_result", "tool_use_id": "t", "is_error": "no"}),
            "messages[0].content[0].is_error",
            "boolean",
        ),
        (user_blocks({"text": "x"}), "messages[0].content[0].type", "required"),
        (user_blocks("x"), "messages[0].content[0]", "dictionary"),
        (
            assistant_blocks({"type": "tool_use", "id": "t", "name": "f", "input": '{"a": 1}'}),
            "messages[1].content[0].input",
            "dictionary",
        ),
        (
            assistant_blocks({"type": "thinking", "signature": "s"}),
            "messages[1].content[0].thinking",
            "Field required",
        ),
        (
            assistant_blocks({"type": "server_tool_use", "id": "s"}),
            "messages[1].content[0].type",
            "unsupported",
        ),
        (
            base(messages=[{"role": "system", "content": [IMAGE]}]),
            "messages[0].content[0].type",
            "'text'",
        ),
        (base(system=[{"type": "text", "text": 1}]), "system[0].text", "string"),
        (base(messages=[]), "messages", "at least 1"),
        (base(messages=[{"role": "tool", "content": "x"}]), "messages[0].role", "'system'"),
        (base(messages=[{"role": "user", "content": 5}]), "messages[0].content", "valid string or"),
        (base(tool_choice={"type": "sometimes"}), "tool_choice.type", "'auto'"),
        (base(tool_choice={"type": "tool"}), "tool_choice.name", "required"),
        (base(thinking={"type": "always"}), "thinking.type", "'adaptive'"),
        (base(tools=[{"description": "no name"}]), "tools[0].name", "Field required"),
        (base(tools=[{"name": "f", "input_schema": "x"}]), "tools[0].input_schema", "dictionary"),
        (base(max_tokens=0), "max_tokens", "greater than"),
        (base(max_tokens="10"), "max_tokens", "valid integer"),
        (base(stop_sequences=[1]), "stop_sequences[0]", "valid string"),
        (base(temperature=99), "temperature", "less than or equal"),
        (base(stream="yes"), "stream", "valid boolean"),
        (
            {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
            "model",
            "Field required",
        ),
    ],
)
def test_validation_errors(body: dict[str, Any], param: str, fragment: str) -> None:
    err = _error(body)
    assert err.param == param, err
    assert fragment in err.message, err
    assert param in err.message


def test_body_not_json_or_not_object() -> None:
    assert "not valid JSON" in _error(b"{nope").message
    assert "JSON object" in _error(b'"x"').message


# --- reply bodies and SSE framing -------------------------------------------------------------


def test_body_shape() -> None:
    body = messages_body(make_result(tool_calls=TOOL_CALLS), SEAL)
    assert body["id"] == "msg_abc123" and body["type"] == "message" and body["role"] == "assistant"
    thinking, text, use0, use1 = body["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": REASONING,
        "signature": thinking_signature(make_result(), SEAL),
    }
    assert text == {"type": "text", "text": CONTENT}
    assert use0 == {
        "type": "tool_use",
        "id": "call_abc123_0",
        "name": "Bash",
        "input": json.loads(ARGS_0),
    }
    assert use1["input"] == json.loads(ARGS_1)
    assert (body["stop_reason"], body["stop_sequence"]) == ("tool_use", None)
    assert body["usage"] == {
        "input_tokens": 24,
        "output_tokens": 30,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 96,
    }
    # Deterministic in the call, different across calls.
    assert thinking_signature(make_result(), SEAL) == thinking_signature(make_result(), SEAL)
    assert thinking_signature(make_result(), SEAL) != thinking_signature(
        make_result(call_id="other"), SEAL
    )


@pytest.mark.parametrize(
    ("kwargs", "stop_sequence", "reason", "seq"),
    [
        ({}, None, "end_turn", None),
        ({}, "</answer>", "stop_sequence", "</answer>"),
        ({"finish_reason": "length"}, None, "max_tokens", None),
        ({"finish_reason": "length"}, "</answer>", "max_tokens", None),
        ({"tool_calls": TOOL_CALLS[:1]}, None, "tool_use", None),
    ],
)
def test_stop_reasons(
    kwargs: dict[str, Any], stop_sequence: str | None, reason: str, seq: str | None
) -> None:
    body = messages_body(make_result(**kwargs), SEAL, stop_sequence=stop_sequence)
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, seq)


def test_body_without_thinking_and_empty_reply() -> None:
    body = messages_body(make_result(), SEAL, include_thinking=False)
    assert [b["type"] for b in body["content"]] == ["text"]
    empty = messages_body(make_result(content=None, reasoning=None), SEAL)
    assert empty["content"] == [{"type": "text", "text": ""}]
    bad_args = make_result(
        content=None, reasoning=None, tool_calls=[ToolCall(id="t", name="f", arguments="[1]")]
    )
    assert messages_body(bad_args, SEAL)["content"][0]["input"] == {"arguments": "[1]"}


def _records(frames: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in frames:
        assert frame.endswith(b"\n\n")
        event_line, data_line = frame.decode().strip("\n").split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"  # every record names its event
        out.append((data["type"], data))
    return out


def test_sse_framing_and_order() -> None:
    records = _records(list(messages_sse(make_result(tool_calls=TOOL_CALLS), SEAL)))
    types = [t for t, _ in records]
    assert types[:2] == ["message_start", "ping"] and types[-2:] == [
        "message_delta",
        "message_stop",
    ]
    start = records[0][1]["message"]
    assert start["id"] == "msg_abc123" and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 24
    starts = [d for t, d in records if t == "content_block_start"]
    assert [d["index"] for d in starts] == [0, 1, 2, 3]
    assert [d["content_block"]["type"] for d in starts] == [
        "thinking",
        "text",
        "tool_use",
        "tool_use",
    ]
    assert starts[2]["content_block"] == {
        "type": "tool_use",
        "id": "call_abc123_0",
        "name": "Bash",
        "input": {},
    }
    assert [d["index"] for t, d in records if t == "content_block_stop"] == [0, 1, 2, 3]
    deltas = [d for t, d in records if t == "content_block_delta"]
    by_kind: dict[tuple[int, str], str] = {}
    for d in deltas:
        delta = d["delta"]
        value = next(v for k, v in delta.items() if k != "type")
        by_kind[(d["index"], delta["type"])] = by_kind.get((d["index"], delta["type"]), "") + value
    assert by_kind == {
        (0, "thinking_delta"): REASONING,
        (0, "signature_delta"): thinking_signature(make_result(), SEAL),
        (1, "text_delta"): CONTENT,
        (2, "input_json_delta"): ARGS_0,
        (3, "input_json_delta"): ARGS_1,
    }
    delta = records[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 30


# --- through the official SDK -------------------------------------------------------------------


def sdk_client(
    result: Reply,
    seen: list[CanonicalRequest] | None = None,
    raw_paths: list[str] | None = None,
    **render: Any,
) -> anthropic.Anthropic:
    """An Anthropic client whose transport runs our adapter on each request."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if raw_paths is not None:
            raw_paths.append(str(request.url.raw_path, "ascii"))
        try:
            if path.endswith("/count_tokens"):
                req = parse_count_tokens_request(
                    request.content,
                    dict(request.headers),
                    str(request.url.raw_path, "ascii"),
                    seal=SEAL,
                )
            else:
                req = parse_messages_request(
                    request.content,
                    dict(request.headers),
                    str(request.url.raw_path, "ascii"),
                    seal=SEAL,
                )
        except GatewayError as err:
            resp = anthropic_error_response(err)
            return httpx2.Response(resp.status_code, content=resp.body, headers=dict(resp.headers))
        if seen is not None:
            seen.append(req)
        if path.endswith("/count_tokens"):
            return httpx2.Response(200, json=count_tokens_body(len(req.messages)))
        if req.stream:
            return httpx2.Response(
                200,
                content=b"".join(messages_sse(result, SEAL, **render)),
                headers={"content-type": "text/event-stream"},
            )
        return httpx2.Response(200, json=messages_body(result, SEAL, **render))

    return anthropic_client(handler, api_key="session-token")


SDK_MESSAGES: list[Any] = [{"role": "user", "content": "list the files"}]


def test_sdk_non_stream() -> None:
    seen: list[CanonicalRequest] = []
    client = sdk_client(make_result(tool_calls=TOOL_CALLS), seen)
    msg = client.messages.create(
        model="tiny-model",
        max_tokens=1024,
        system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        messages=SDK_MESSAGES,
        tools=[BASH_TOOL],  # type: ignore[list-item]
        metadata={"user_id": "u"},
    )
    assert msg.id == "msg_abc123" and msg.stop_reason == "tool_use"
    thinking, text, use0, _use1 = msg.content
    assert thinking.type == "thinking" and thinking.thinking == REASONING
    assert text.type == "text" and text.text == CONTENT
    assert use0.type == "tool_use" and (use0.id, use0.name, use0.input) == (
        "call_abc123_0",
        "Bash",
        json.loads(ARGS_0),
    )
    assert msg.usage.cache_read_input_tokens == 96 and msg.usage.input_tokens == 24
    assert seen[0].messages[0] == Message(role="system", content="sys")

    # The SDK's own content blocks, echoed as the next assistant turn, rebuild the same turn.
    echo = [b.model_dump(exclude_none=True) for b in msg.content]
    client.messages.create(
        model="tiny-model",
        max_tokens=1024,
        messages=[*SDK_MESSAGES, {"role": "assistant", "content": echo}],  # type: ignore[list-item]
    )
    assert seen[1].messages[-1] == Message(
        role="assistant", content=CONTENT, reasoning=REASONING, tool_calls=TOOL_CALLS
    )


def test_sdk_stream_helper_final_message() -> None:
    client = sdk_client(make_result(tool_calls=TOOL_CALLS))
    with client.messages.stream(
        model="tiny-model", max_tokens=1024, messages=SDK_MESSAGES
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == CONTENT
    thinking, block, use0, use1 = final.content
    assert thinking.type == "thinking" and thinking.thinking == REASONING
    assert thinking.signature == thinking_signature(make_result(), SEAL)
    assert block.type == "text" and block.text == CONTENT
    assert use0.type == "tool_use" and use0.input == json.loads(ARGS_0)
    assert use1.type == "tool_use" and use1.input == json.loads(ARGS_1)
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 30


def test_sdk_raw_stream_events() -> None:
    client = sdk_client(make_result(reasoning=None, content="短い答え。" * 9), stop_sequence="</a>")
    events = list(
        client.messages.create(model="tiny-model", max_tokens=5, messages=SDK_MESSAGES, stream=True)
    )
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"  # ping is dropped by the SDK
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text == "短い答え。" * 9
    delta = next(e for e in events if e.type == "message_delta")
    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == ("stop_sequence", "</a>")


def test_sdk_beta_path_and_count_tokens() -> None:
    seen: list[CanonicalRequest] = []
    raw_paths: list[str] = []
    client = sdk_client(make_result(reasoning=None), seen, raw_paths)
    beta = {"beta": "true"}  # Claude Code's TypeScript client appends this; Python's does not
    msg = client.beta.messages.create(
        model="tiny-model", max_tokens=5, messages=SDK_MESSAGES, extra_query=beta
    )
    assert msg.content[0].type == "text" and msg.content[0].text == CONTENT
    count = client.beta.messages.count_tokens(
        model="tiny-model", messages=SDK_MESSAGES, system="sys", extra_query=beta
    )
    assert count.input_tokens == 2
    assert raw_paths == ["/v1/messages?beta=true", "/v1/messages/count_tokens?beta=true"]
    assert [r.path for r in seen] == ["/v1/messages", "/v1/messages/count_tokens"]
    assert client.messages.count_tokens(model="tiny-model", messages=SDK_MESSAGES).input_tokens == 1


def test_sdk_sees_validation_error() -> None:
    client = sdk_client(make_result())
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="tiny-model",
            max_tokens=5,
            messages=[{"role": "user", "content": [IMAGE]}],  # type: ignore[list-item]
        )
    assert info.value.status_code == 400
    assert info.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": info.value.body["error"]["message"]},  # type: ignore[index]
    }
    assert "messages[0].content[0].type" in info.value.message and "text-only" in info.value.message


@pytest.mark.parametrize(
    ("err", "exc_type", "status", "type_"),
    [
        (
            GatewayError("overloaded", "engine busy", retry_after=2),
            anthropic.OverloadedError,
            529,
            "overloaded_error",
        ),
        (
            GatewayError("engine_unavailable", "no engine"),
            anthropic.OverloadedError,
            529,
            "overloaded_error",
        ),
        (
            GatewayError("overloaded", "slow down", status=429),
            anthropic.RateLimitError,
            429,
            "rate_limit_error",
        ),
        (
            GatewayError("authentication", "bad token"),
            anthropic.AuthenticationError,
            401,
            "authentication_error",
        ),
        (GatewayError("not_found", "no session"), anthropic.NotFoundError, 404, "not_found_error"),
        (GatewayError("conflict", "closed"), anthropic.ConflictError, 409, "invalid_request_error"),
        (
            GatewayError("too_large", "huge"),
            anthropic.RequestTooLargeError,
            413,
            "request_too_large",
        ),
        (
            GatewayError("engine_timeout", "slow"),
            anthropic.InternalServerError,
            504,
            "timeout_error",
        ),
        (GatewayError("internal", "bug"), anthropic.InternalServerError, 500, "api_error"),
    ],
)
def test_sdk_error_statuses(
    err: GatewayError, exc_type: type[Exception], status: int, type_: str
) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        resp = anthropic_error_response(err)
        return httpx2.Response(resp.status_code, content=resp.body, headers=dict(resp.headers))

    client = anthropic_client(handler)
    with pytest.raises(exc_type) as info:
        client.messages.create(model="m", max_tokens=5, messages=SDK_MESSAGES, stream=True)
    exc = info.value
    assert isinstance(exc, anthropic.APIStatusError) and exc.status_code == status
    assert exc.body == {"type": "error", "error": {"type": type_, "message": err.message}}
    if err.retry_after is not None:
        assert exc.response.headers["retry-after"] == "2"


def test_error_table_covers_every_kind() -> None:
    assert set(ANTHROPIC_ERRORS) == set(KINDS)
    err = GatewayError("overloaded", "busy", status=503)
    assert anthropic_error_status(err) == 529
    assert anthropic_error_body(err) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "busy"},
    }


def test_sdk_raises_on_in_stream_error_event() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        frames = list(messages_sse(make_result(), SEAL))[:3]
        body = b"".join(frames) + sse_error_event(GatewayError("overloaded", "engine overloaded"))
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = anthropic_client(handler)
    with (
        pytest.raises(anthropic.APIStatusError, match="engine overloaded"),
        client.messages.stream(model="m", max_tokens=5, messages=SDK_MESSAGES) as stream,
    ):
        stream.get_final_message()
