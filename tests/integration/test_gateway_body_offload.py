"""Large agent bodies are parsed in the gateway's body-parse worker (a process, off the
gateway's GIL: `gateway.http.body_parse`), and what comes of it is what the in-process
parse gives: the same requests, in each protocol, through a gateway that parses every body
in the worker and one that parses none there send the engine the same prompts, record the
same prompt ids, count the same tokens, and refuse the same bad bodies with the same
error. The engine is the scripted engine (a FAKE LLM: the parse is the Gateway's)."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

OUTPUT = "line 1: ünïcode value = compute(x, 'text')\n" * 40
SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
ARGS = json.dumps({"cmd": "cat a"})

CHAT = {
    "model": "m",
    "max_tokens": 8,
    "tools": [{"type": "function", "function": {"name": "run", "parameters": SCHEMA}}],
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Read a."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "run", "arguments": ARGS}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": OUTPUT},
    ],
}
RESPONSES = {
    "model": "m",
    "max_output_tokens": 8,
    "instructions": "You are a coding agent.",
    "tools": [{"type": "function", "name": "run", "parameters": SCHEMA}],
    "input": [
        {"role": "user", "content": "Read a."},
        {"type": "function_call", "call_id": "c1", "name": "run", "arguments": ARGS},
        {"type": "function_call_output", "call_id": "c1", "output": OUTPUT},
    ],
}
MESSAGES_HISTORY = [
    {"role": "user", "content": "Read a."},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c1", "name": "run", "input": {"cmd": "cat a"}}],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": OUTPUT}]},
]
MESSAGES = {
    "model": "m",
    "max_tokens": 8,
    "system": "You are a coding agent.",
    "tools": [{"name": "run", "input_schema": SCHEMA}],
    "messages": MESSAGES_HISTORY,
}
COUNT = {key: value for key, value in MESSAGES.items() if key != "max_tokens"}

CALLS = [
    ("/v1/chat/completions", CHAT),
    ("/v1/responses", RESPONSES),
    ("/v1/messages", MESSAGES),
]
"""Each sent twice: the second time the in-process parse resumes from the session's
history cache, the worker's parses it whole."""


def post(gw: InProcessGateway, session: dict[str, Any], path: str, body: Any) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {session['token']}", "Content-Type": "application/json"}
    return httpx.post(f"{gw.url}{path}", content=data, headers=headers, timeout=60)


def run_calls(gw: InProcessGateway) -> tuple[list[list[int]], list[int]]:
    """The recorded prompt ids of `CALLS` (each twice) and the counted tokens of `COUNT`."""
    session = gw.create_session()
    for path, body in CALLS + CALLS:
        reply = post(gw, session, path, body)
        assert reply.status_code == 200, reply.text
    counted = post(gw, session, "/v1/messages/count_tokens", COUNT)
    assert counted.status_code == 200, counted.text
    calls = gw.trajectory(session["session_id"])["calls"]
    assert [c["status"] for c in calls] == ["ok"] * 6
    return [c["prompt_ids"] for c in calls], [counted.json()["input_tokens"]]


def test_bodies_parsed_in_the_worker_give_the_engine_the_same_prompts(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="done"))
    with BackgroundServer(engine.app()) as engine_server:
        results, sent = [], []
        for offload_bytes in (1, 0):  # 1: every body in the worker; 0: none
            engine.reset()
            gw = gateway_factory(
                engine_server.url, tiny_model_dir, "tiny", parse_offload_bytes=offload_bytes
            )
            results.append(run_calls(gw))
            sent.append([list(p) for p in engine.prompts])
            assert gw.app is not None
            assert gw.app.body_parser.offloaded == (7 if offload_bytes else 0)
    (offloaded_ids, offloaded_count), (inline_ids, inline_count) = results
    assert offloaded_ids == inline_ids
    assert sent[0] == sent[1] == inline_ids
    assert offloaded_count == inline_count
    assert inline_count[0] > 0


BAD_BODIES = [
    ("/v1/chat/completions", b'{"model": "m", "messages": [', "not JSON"),
    ("/v1/chat/completions", b'["a list"]', "not an object"),
    (
        "/v1/chat/completions",
        {**CHAT, "messages": [*CHAT["messages"][:1], {"role": "user", "content": 5}]},
        "a wrong type deep in the history",
    ),
    ("/v1/responses", {**RESPONSES, "input": [{"type": "nonsense"}]}, "an unknown item"),
    ("/v1/messages", {**MESSAGES, "max_tokens": "8"}, "a number as text"),
    ("/v1/chat/completions", {**CHAT, "messages": [CHAT["messages"][0]] * 9}, "too many messages"),
    (
        "/v1/messages",
        {**MESSAGES, "messages": [{"role": "user", "content": "x" * 5000}]},
        "a prompt past max_prompt_chars",
    ),
    ("/v1/messages/count_tokens", {**COUNT, "messages": "none"}, "a count with no list"),
]


def test_bad_bodies_parsed_in_the_worker_get_the_same_error(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """The worker's refusals are the gateway's: same status, headers that matter, body."""
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="done"))
    with BackgroundServer(engine.app()) as engine_server:
        replies = []
        for offload_bytes in (1, 0):
            gw = gateway_factory(
                engine_server.url,
                tiny_model_dir,
                "tiny",
                parse_offload_bytes=offload_bytes,
                max_prompt_messages=8,
                max_prompt_chars=4000,
            )
            session = gw.create_session()
            replies.append(
                [
                    (r.status_code, r.json())
                    for path, body, _ in BAD_BODIES
                    for r in [post(gw, session, path, body)]
                ]
            )
            assert gw.app is not None
            assert gw.app.body_parser.offloaded == (len(BAD_BODIES) if offload_bytes else 0)
            assert engine.prompts == []
    offloaded, inline = replies
    for (_, _, what), worker, here in zip(BAD_BODIES, offloaded, inline, strict=True):
        assert worker == here, what
    assert [status for status, _ in inline] == [400, 400, 400, 400, 400, 413, 413, 400]
