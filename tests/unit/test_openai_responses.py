"""Responses adapter: Codex-shaped requests → canonical form, and replies as the official
`openai` SDK reads them (its stream accumulator checks item identities and ordering).

Sample bodies have the shapes Codex 0.171 sends to a custom provider.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.canonical import CanonicalRequest, Message, ParsedOutput, Reply, ToolCall
from gateway.errors import GatewayError
from gateway.protocols.opaque_token import TokenSeal
from gateway.protocols.openai_chat.reply import openai_error_response
from gateway.protocols.openai_responses.reply import (
    compact_body,
    output_items,
    responses_body,
    responses_sse,
    sse_failed_event,
)
from gateway.protocols.openai_responses.request import (
    COMPACT_INSTRUCTION,
    COMPACTION_SUMMARY_PREFIX,
    is_compaction,
    parse_responses_request,
)
from gateway.protocols.wire import REQUEST_KIND_HEADER, SUBAGENT_HEADER
from tests.fixtures.sdk_transport import openai_client

#: The seal of the session these requests belong to (`opaque_token`).
SEAL = TokenSeal(b"k" * 32)

REASONING = "The user wants the file list. Run ls first — 然后再看 README。"
CONTENT = "I'll list the files in the repository first."
ARGS_0 = json.dumps({"cmd": "ls -la && grep -rn 'def main' src/", "yield_time_ms": 1000})
ARGS_1 = json.dumps({"message": "检查测试", "agent_type": "worker"}, ensure_ascii=False)
TOOL_CALLS = [
    ToolCall(id="call_abc123_0", name="exec_command", arguments=ARGS_0),
    ToolCall(id="call_abc123_1", name="multi_agent_v1.spawn_agent", arguments=ARGS_1),
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


EXEC_TOOL = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command in a PTY.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}, "yield_time_ms": {"type": "number"}},
        "required": ["cmd"],
        "additionalProperties": False,
    },
}


def turn_metadata(**extra: Any) -> str:
    meta = {
        "session_id": "s-1",
        "thread_id": "t-1",
        "turn_id": "turn-1",
        "request_kind": "turn",
        "thread_source": "user",
        "turn_trigger": "exec",
        **extra,
    }
    return json.dumps(meta)


def codex_body(*history: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A body shaped like Codex's `codex exec` turn to a custom provider."""
    return {
        "model": "tiny-model",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are a coding agent."}],
            },
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "<permissions instructions>x"}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "<environment_context>cwd</environment_context>"}
                ],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "list the files"}],
            },
            *history,
        ],
        "tools": [
            EXEC_TOOL,
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "description": "Sub-agents",
                "tools": [
                    {
                        "type": "function",
                        "name": "spawn_agent",
                        "parameters": {"type": "object", "properties": {}},
                    },
                    {"type": "function", "name": "wait_agent", "defer_loading": True},
                ],
            },
            {"type": "web_search", "external_web_access": True},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "s-1",
        "client_metadata": {"session_id": "s-1", "x-codex-turn-metadata": turn_metadata()},
        **extra,
    }


CODEX_HEADERS = {
    "authorization": "Bearer session-token",
    "originator": "codex_exec",
    "session-id": "s-1",
    "x-codex-turn-metadata": turn_metadata(),
}


# --- request conversion ---------------------------------------------------------------------


def test_codex_turn_conversion() -> None:
    history = [item for item in output_items(make_result(tool_calls=TOOL_CALLS), SEAL)]
    history += [
        {
            "type": "function_call_output",
            "id": "fco_1",
            "call_id": "call_abc123_0",
            "output": "a.txt\n",
        },
        {
            "type": "function_call_output",
            "call_id": "call_abc123_1",
            "output": [
                {"type": "input_text", "text": "spawned"},
                {"type": "output_text", "text": "ok"},
            ],
        },
    ]
    req = parse_responses_request(
        json.dumps(codex_body(*history)).encode(), CODEX_HEADERS, seal=SEAL
    )
    assert isinstance(req, CanonicalRequest)
    assert req.protocol == "openai_responses" and req.path == "/v1/responses"
    assert [m.role for m in req.messages] == [
        "system", "system", "user", "user", "assistant", "tool", "tool",
    ]  # fmt: skip
    assert [m.developer for m in req.messages[:3]] == [True, True, False]
    turn = req.messages[4]
    assert turn == Message(
        role="assistant", content=CONTENT, reasoning=REASONING, tool_calls=TOOL_CALLS
    )  # one model turn (reasoning + message + calls) folds back into one message
    assert (req.messages[5].tool_call_id, req.messages[5].content) == ("call_abc123_0", "a.txt\n")
    assert req.messages[6].content == "spawned\nok"
    # namespace flattened; deferred and hosted tools dropped
    assert [t.name for t in req.tools] == ["exec_command", "multi_agent_v1.spawn_agent"]
    assert req.tools[0].parameters["required"] == ["cmd"]
    assert req.tool_choice == "auto" and req.stream
    assert req.sampling.max_tokens is None  # Codex sends no output budget
    assert "authorization" not in req.headers and req.headers["originator"] == "codex_exec"
    assert req.headers[REQUEST_KIND_HEADER] == "turn" and SUBAGENT_HEADER not in req.headers
    assert not is_compaction(req)


def test_string_input_instructions_and_sampling() -> None:
    req = parse_responses_request(
        {
            "model": "m",
            "instructions": "Be terse.",
            "input": "hello",
            "max_output_tokens": 64,
            "temperature": 0.7,
            "top_p": 0.9,
            "reasoning": {"effort": "none"},
            "tool_choice": {"type": "function", "name": "exec_command"},
            "truncation": "auto",
            "text": {"verbosity": "low"},
        },
        seal=SEAL,
    )
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "Be terse."),
        ("user", "hello"),
    ]
    assert (req.sampling.max_tokens, req.sampling.temperature, req.sampling.top_p) == (64, 0.7, 0.9)
    assert req.template_kwargs == {"enable_thinking": False}
    assert req.tool_choice == {"type": "function", "function": {"name": "exec_command"}}
    assert not req.stream and REQUEST_KIND_HEADER not in req.headers


def test_assistant_text_items_and_easy_messages() -> None:
    req = parse_responses_request(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "a2", "annotations": []}],
                },
                {"role": "system", "content": "s"},
            ],
        },
        seal=SEAL,
    )
    assert [(m.role, m.content) for m in req.messages] == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("assistant", "a2"),  # a second text item starts a new assistant message
        ("system", "s"),
    ]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda item: item, REASONING),
        (lambda item: {**item, "content": None}, REASONING),  # from our opaque token
        (lambda item: {**item, "content": None, "encrypted_content": None}, REASONING),
        (lambda item: {**item, "content": [], "encrypted_content": "gAAAA-foreign"}, REASONING),
        (lambda item: {**item, "summary": [], "content": None, "encrypted_content": None}, None),
    ],
)
def test_reasoning_item_echo_recovers_reasoning(mutate: Any, expected: str | None) -> None:
    item = mutate(output_items(make_result(content=None, tool_calls=TOOL_CALLS[:1]), SEAL)[0])
    req = parse_responses_request(
        {"model": "m", "input": [{"role": "user", "content": "x"}, item]}, seal=SEAL
    )
    assert req.messages[-1].role == "assistant" and req.messages[-1].reasoning == expected


def test_second_reasoning_item_starts_new_turn() -> None:
    first = output_items(make_result(tool_calls=TOOL_CALLS[:1]), SEAL)
    second = output_items(make_result(reasoning="again", content="done", call_id="def"), SEAL)
    req = parse_responses_request({"model": "m", "input": [*first, *second]}, seal=SEAL)
    assert [(m.role, m.reasoning, m.content) for m in req.messages] == [
        ("assistant", REASONING, CONTENT),
        ("assistant", "again", "done"),
    ]


@pytest.mark.parametrize(
    ("headers", "body_extra", "kind", "subagent"),
    [
        (
            {"x-codex-turn-metadata": turn_metadata(request_kind="compaction")},
            {},
            "compaction",
            None,
        ),
        (
            {},
            {
                "client_metadata": {
                    "x-codex-turn-metadata": turn_metadata(request_kind="compaction")
                }
            },
            "compaction",
            None,
        ),
        (
            {
                "x-openai-subagent": "collab_spawn",
                "x-codex-turn-metadata": turn_metadata(thread_source="subagent"),
            },
            {},
            "turn",
            "collab_spawn",
        ),
        ({"x-openai-subagent": "review"}, {}, None, "review"),
        (
            {
                "x-codex-turn-metadata": turn_metadata(
                    thread_source="subagent", subagent_kind="review"
                )
            },
            {},
            "turn",
            "review",
        ),
        (
            {"x-codex-turn-metadata": turn_metadata(thread_source="subagent")},
            {},
            "turn",
            "subagent",
        ),
        ({"x-openai-subagent": "compact"}, {}, "compaction", None),
        ({"x-codex-turn-metadata": "{not json"}, {"client_metadata": None}, None, None),
        (  # markers are ours: a client cannot set them
            {REQUEST_KIND_HEADER: "compaction", "X-Rollout-Subagent": "x"},
            {"client_metadata": {}},
            None,
            None,
        ),
    ],
)
def test_markers(
    headers: dict[str, str], body_extra: dict[str, Any], kind: str | None, subagent: str | None
) -> None:
    body = codex_body(**body_extra)
    if "client_metadata" not in body_extra:
        body["client_metadata"] = {}
    req = parse_responses_request(body, headers, seal=SEAL)
    assert req.headers.get(REQUEST_KIND_HEADER) == kind
    assert req.headers.get(SUBAGENT_HEADER) == subagent
    assert "X-Rollout-Subagent" not in req.headers


def test_codex_inline_compaction_turn() -> None:
    """Current Codex compacts through a plain /responses call with tools:[] and a prompt."""
    prompt = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary."
    body = codex_body(
        {"role": "user", "content": [{"type": "input_text", "text": prompt}]},
        tools=[],
        parallel_tool_calls=False,
    )
    headers = {"x-codex-turn-metadata": turn_metadata(request_kind="compaction")}
    req = parse_responses_request(body, headers, seal=SEAL)
    assert is_compaction(req) and req.tools == [] and req.stream
    assert req.messages[-1].content == prompt  # Codex brings its own prompt


def test_compact_endpoint_and_its_reply_round_trip() -> None:
    body = {
        "model": "tiny-model",
        "instructions": "You are a coding agent.",
        "input": codex_body(*output_items(make_result(tool_calls=TOOL_CALLS[:1]), SEAL))["input"],
        "tools": [EXEC_TOOL],
        "stream": True,
    }
    req = parse_responses_request(body, {}, "/v1/responses/compact", seal=SEAL)
    assert req.path == "/v1/responses/compact" and is_compaction(req)
    assert not req.stream and req.tools == []
    assert req.messages[-1] == Message(role="user", content=COMPACT_INSTRUCTION)

    summary = "Goal: list files. Done: ran ls. Next: read README."
    reply = compact_body(make_result(content=summary, reasoning=None, call_id="cmp1"), req, SEAL)
    assert reply["object"] == "response.compaction" and reply["id"] == "resp_cmp1"
    kinds = [(o["type"], o.get("role")) for o in reply["output"]]
    assert kinds == [("message", "user"), ("message", "user"), ("compaction", None)]
    assert reply["usage"]["total_tokens"] == 150

    # The compacted history comes back as input on the next turn; the summary is readable.
    nxt = parse_responses_request(
        {"model": "m", "input": [*reply["output"], {"role": "user", "content": "go on"}]}, seal=SEAL
    )
    assert [m.content for m in nxt.messages] == [
        "<environment_context>cwd</environment_context>",
        "list the files",
        COMPACTION_SUMMARY_PREFIX + summary,
        "go on",
    ]
    # A second compaction does not repeat the superseded summary.
    again = parse_responses_request(
        {"model": "m", "input": [*reply["output"]]}, {}, "/v1/responses/compact?x=1", seal=SEAL
    )
    kept = compact_body(make_result(content="s2", call_id="cmp2"), again, SEAL)["output"]
    assert [o["type"] for o in kept] == ["message", "message", "compaction"]


def test_compaction_trigger_item() -> None:
    req = parse_responses_request(
        {"model": "m", "input": [{"role": "user", "content": "x"}, {"type": "compaction_trigger"}]},
        seal=SEAL,
    )
    assert is_compaction(req) and req.messages[-1].content == COMPACT_INSTRUCTION


def _error(body: Any, headers: dict[str, str] | None = None) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        parse_responses_request(body, headers, seal=SEAL)
    assert info.value.status == 400 and info.value.kind == "invalid_request"
    return info.value


def base(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "input": [{"role": "user", "content": "hi"}], **extra}


def items(*extra: Any) -> dict[str, Any]:
    return base(input=[{"role": "user", "content": "hi"}, *extra])


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (
            items({"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}),
            "input[1].arguments",
            "valid string",
        ),
        (
            items({"type": "function_call", "name": "f", "arguments": "{}"}),
            "input[1].call_id",
            "required",
        ),
        (
            items(
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "http://x/a.png"}],
                }
            ),
            "input[1].content[0]",
            "text-only",
        ),
        (
            items({"role": "user", "content": [{"type": "input_text"}]}),
            "input[1].content[0].text",
            "string",
        ),
        (items({"role": "tool", "content": "x"}), "input[1].role", "'developer'"),
        (items({"role": "user", "content": 5}), "input[1].content", "valid string or"),
        (
            items({"type": "custom_tool_call", "call_id": "c"}),
            "input[1].type",
            "unsupported input item",
        ),
        (items({"type": "item_reference", "id": "msg_1"}), "input[1].type", "server-side storage"),
        (
            items(
                {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}
            ),
            "input[1].output[0]",
            "text-only",
        ),
        (
            items({"type": "reasoning", "summary": [{"type": "x", "text": "t"}]}),
            "input[1].summary[0].type",
            "summary_text",
        ),
        (
            items({"type": "compaction", "encrypted_content": "gAAA"}),
            "input[1].encrypted_content",
            "not issued",
        ),
        (
            items({"type": "compaction_trigger"}, {"role": "user", "content": "x"}),
            "input[1]",
            "last",
        ),
        (items("text"), "input[1]", "valid dictionary"),
        (base(previous_response_id="resp_1"), "previous_response_id", "full input"),
        (base(tool_choice="sometimes"), "tool_choice", "'required'"),
        (base(tool_choice={"type": "web_search"}), "tool_choice", "function"),
        (base(tools=[{"type": "function", "name": ""}]), "tools[0].name", "at least 1"),
        (
            base(tools=[{"type": "function", "name": "f", "parameters": "x"}]),
            "tools[0].parameters",
            "dictionary",
        ),
        (
            base(tools=[{"type": "namespace", "name": "n", "tools": [{"name": 3}]}]),
            "tools[0].tools[0].name",
            "string",
        ),
        (base(tools=[{"name": "f"}]), "tools[0].type", "required"),
        (base(max_output_tokens=0), "max_output_tokens", "greater than"),
        (base(temperature="hot"), "temperature", "valid number"),
        (base(top_p=3), "top_p", "less than or equal"),
        (base(stream="yes"), "stream", "valid boolean"),
        (base(reasoning={"summary": 1}), "reasoning.summary", "string"),
        ({"input": "x"}, "model", "Field required"),
        ({"model": "m"}, "input", "at least one"),
        ({"model": "m", "input": []}, "input", "at least one"),
    ],
)
def test_validation_errors(body: dict[str, Any], param: str, fragment: str) -> None:
    err = _error(body)
    assert err.param == param, err
    assert fragment in err.message, err
    assert param in err.message


def test_body_not_json_or_not_object() -> None:
    assert "not valid JSON" in _error(b"{nope").message
    assert "JSON object" in _error(b"[1]").message


# --- reply bodies and SSE framing -------------------------------------------------------------


def test_body_shape() -> None:
    body = responses_body(make_result(tool_calls=TOOL_CALLS), SEAL)
    assert body["id"] == "resp_abc123" and body["object"] == "response"
    assert body["status"] == "completed" and body["incomplete_details"] is None
    reasoning, message, call0, call1 = body["output"]
    assert reasoning["id"] == "rs_abc123" and reasoning["summary"][0]["text"] == REASONING
    assert reasoning["content"] == [{"type": "reasoning_text", "text": REASONING}]
    assert reasoning["encrypted_content"].startswith("rollout2.")
    assert message["content"][0]["text"] == CONTENT and message["id"] == "msg_abc123"
    assert {k: call0[k] for k in ("id", "call_id", "name", "arguments", "status")} == {
        "id": "fc_abc123_0",
        "call_id": "call_abc123_0",
        "name": "exec_command",
        "arguments": ARGS_0,
        "status": "completed",
    }
    assert "namespace" not in call0
    assert (call1["namespace"], call1["name"]) == ("multi_agent_v1", "spawn_agent")
    assert body["usage"] == {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 96},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 150,
    }


def test_body_length_is_incomplete_and_tool_turn_has_no_empty_message() -> None:
    body = responses_body(make_result(finish_reason="length", reasoning=None), SEAL)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    tools_only = responses_body(
        make_result(content=None, reasoning=None, tool_calls=TOOL_CALLS), SEAL
    )
    assert [o["type"] for o in tools_only["output"]] == ["function_call", "function_call"]
    empty = responses_body(make_result(content=None, reasoning=None), SEAL)
    assert [o["type"] for o in empty["output"]] == ["message"]
    assert empty["output"][0]["content"][0]["text"] == ""


def _events(frames: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for frame in frames:
        assert frame.endswith(b"\n\n")
        event_line, data_line = frame.decode().strip("\n").split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"
        out.append(data)
    return out


def test_sse_framing_and_order() -> None:
    events = _events(list(responses_sse(make_result(tool_calls=TOOL_CALLS), SEAL)))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-1] == "response.completed"
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    )
    final = events[-1]["response"]
    assert final["id"] == events[0]["response"]["id"] == "resp_abc123"
    assert final["usage"]["total_tokens"] == 150
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert (
        done
        == final["output"]
        == responses_body(make_result(tool_calls=TOOL_CALLS), SEAL)["output"]
    )
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    summary = "".join(
        e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta"
    )
    args = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert text == CONTENT and summary == REASONING and "".join(args) == ARGS_0 + ARGS_1
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [a["status"] for a in added] == ["in_progress"] * 4
    assert added[2]["arguments"] == "" and added[1]["content"] == []


def test_sse_incomplete_terminal_event() -> None:
    events = _events(list(responses_sse(make_result(finish_reason="length"), SEAL)))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# --- through the official SDK -------------------------------------------------------------------


def sdk_client(result: Reply, seen: list[CanonicalRequest] | None = None) -> openai.OpenAI:
    """An OpenAI client whose transport runs our adapter on each request."""

    def handler(request: httpx.Request) -> httpx.Response:
        try:
            req = parse_responses_request(
                request.content, dict(request.headers), request.url.path, seal=SEAL
            )
        except GatewayError as err:
            resp = openai_error_response(err)
            return httpx.Response(err.status, content=resp.body, headers=dict(resp.headers))
        if seen is not None:
            seen.append(req)
        if request.url.path.endswith("/responses/compact"):
            return httpx.Response(200, json=compact_body(result, req, SEAL))
        if req.stream:
            return httpx.Response(
                200,
                content=b"".join(responses_sse(result, SEAL)),
                headers={"content-type": "text/event-stream"},
            )
        return httpx.Response(200, json=responses_body(result, SEAL))

    return openai_client(handler, api_key="session-token")


SDK_INPUT: list[Any] = [
    {"role": "developer", "content": "You are a coding agent."},
    {"role": "user", "content": "list the files"},
]


def test_sdk_non_stream() -> None:
    seen: list[CanonicalRequest] = []
    client = sdk_client(make_result(tool_calls=TOOL_CALLS), seen)
    resp = client.responses.create(
        model="tiny-model",
        input=SDK_INPUT,
        tools=[EXEC_TOOL],  # type: ignore[list-item]
        store=False,
        include=["reasoning.encrypted_content"],
        reasoning={"summary": "auto"},
        prompt_cache_key="s-1",
        max_output_tokens=256,
    )
    assert resp.id == "resp_abc123" and resp.status == "completed"
    assert resp.output_text == CONTENT
    reasoning = resp.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == REASONING
    calls = [o for o in resp.output if o.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments, c.namespace) for c in calls] == [
        ("call_abc123_0", "exec_command", ARGS_0, None),
        ("call_abc123_1", "spawn_agent", ARGS_1, "multi_agent_v1"),
    ]
    assert resp.usage is not None and resp.usage.input_tokens_details.cached_tokens == 96
    assert seen[0].sampling.max_tokens == 256 and seen[0].tools[0].name == "exec_command"

    # The SDK's own output items, echoed as the next input, rebuild the same turn.
    echo = [o.model_dump(exclude_none=True) for o in resp.output]
    nxt = client.responses.create(model="tiny-model", input=[*SDK_INPUT, *echo])  # type: ignore[list-item]
    assert nxt.id == "resp_abc123"
    assert seen[1].messages[-1] == Message(
        role="assistant", content=CONTENT, reasoning=REASONING, tool_calls=TOOL_CALLS
    )


def test_sdk_create_stream_events() -> None:
    client = sdk_client(make_result(tool_calls=TOOL_CALLS))
    stream = client.responses.create(model="tiny-model", input=SDK_INPUT, stream=True)
    text, reasoning, done_items, completed = "", "", [], None
    for event in stream:
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.reasoning_text.delta":
            reasoning += event.delta
        elif event.type == "response.output_item.done":
            done_items.append(event.item)
        elif event.type == "response.completed":
            completed = event.response
    assert text == CONTENT and reasoning == REASONING
    assert [i.type for i in done_items] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    assert done_items[2].arguments == ARGS_0  # type: ignore[union-attr]
    assert completed is not None and completed.id == "resp_abc123"
    assert completed.usage is not None and completed.usage.total_tokens == 150


def test_sdk_stream_helper_final_response() -> None:
    client = sdk_client(make_result(tool_calls=TOOL_CALLS))
    with client.responses.stream(model="tiny-model", input=SDK_INPUT) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == CONTENT and len(deltas) > 1
    assert final.output_text == CONTENT
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.call_id, c.arguments) for c in calls] == [(tc.id, tc.arguments) for tc in TOOL_CALLS]


def test_sdk_stream_helper_plain_text() -> None:
    client = sdk_client(make_result(reasoning=None, content="短い答え。" * 9))
    with client.responses.stream(model="tiny-model", input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "短い答え。" * 9 and [o.type for o in final.output] == ["message"]


def test_sdk_stream_incomplete() -> None:
    client = sdk_client(make_result(finish_reason="length"))
    events = list(client.responses.create(model="tiny-model", input="hi", stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]


def test_sdk_compact() -> None:
    seen: list[CanonicalRequest] = []
    summary = "Summary: listed files."
    client = sdk_client(make_result(content=summary, reasoning=None), seen)
    compacted = client.responses.compact(model="tiny-model", input=SDK_INPUT, instructions="sys")
    assert compacted.object == "response.compaction" and compacted.id == "resp_abc123"
    assert [o.type for o in compacted.output] == ["message", "compaction"]
    assert is_compaction(seen[0]) and seen[0].messages[0].content == "sys"
    echo = [o.model_dump(exclude_none=True, warnings=False) for o in compacted.output]
    client.responses.create(model="tiny-model", input=[*echo, {"role": "user", "content": "go"}])  # type: ignore[list-item]
    assert seen[1].messages[1].content == COMPACTION_SUMMARY_PREFIX + summary


def test_sdk_sees_validation_error() -> None:
    client = sdk_client(make_result())
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="tiny-model",
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "http://x/a.png", "detail": "auto"}
                    ],
                }
            ],
        )
    assert info.value.code == "invalid_request" and info.value.param == "input[0].content[0]"
    assert "text-only" in info.value.message


@pytest.mark.parametrize(
    ("err", "exc_type"),
    [
        (GatewayError("overloaded", "busy", status=429, retry_after=2), openai.RateLimitError),
        (GatewayError("authentication", "bad token"), openai.AuthenticationError),
        (GatewayError("not_found", "no session"), openai.NotFoundError),
        (GatewayError("engine_timeout", "slow"), openai.InternalServerError),
    ],
)
def test_sdk_error_statuses(err: GatewayError, exc_type: type[Exception]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        resp = openai_error_response(err)
        return httpx.Response(err.status, content=resp.body, headers=dict(resp.headers))

    client = openai_client(handler)
    with pytest.raises(exc_type) as info:
        client.responses.create(model="m", input="hi", stream=True)
    assert err.message in str(info.value)


def test_sdk_sees_in_stream_failure() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        frames = list(responses_sse(make_result(), SEAL))[:2]
        err = GatewayError("engine_bad_reply", "engine sent garbage")
        body = b"".join(frames) + sse_failed_event(err, "abc123", "tiny-model", 1_700_000_000, 2)
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = openai_client(handler)
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert [e.sequence_number for e in events] == [0, 1, 2]
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None
    assert failed.response.error.message == "engine sent garbage"
