"""True streaming through the real Gateway over HTTP, with the official SDKs' stream
helpers, in front of the scripted engine (a FAKE LLM: it follows a script, its tokens come
from the real tokenizer, and it streams like vLLM, one token per chunk). The engine can
hold a stream mid-generation, which makes "events arrive before the generation ends" an
ordering fact rather than a timing one. The same against real vLLM is in
`test_gateway_vllm_streaming.py`.
"""

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from devstack.scripted_engine import ScriptedEngine
from tests.fixtures.gateway import calls_without_ids, scripted_gateway
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

REASONING = "I will look at the files first, then decide what to run."
CONTENT = "Let me list the directory to see what is there before I change anything."
REPLY = (
    f"<think>\n{REASONING}\n</think>\n\n{CONTENT}\n<tool_call>\n"
    '{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
)
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
RESPONSES_TOOLS: list[Any] = [{"type": "function", **CHAT_TOOLS[0]["function"]}]
MESSAGES_TOOLS: list[Any] = [
    {
        "name": "bash",
        "description": "Run a command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
GUARD_S = 30.0
"""Only against a hang: a gateway that does not stream never gets to see a delta while
the engine holds, and the guard releases the engine so the test fails instead."""


@pytest.fixture
def engine_and_gateway(
    tiny_model_dir: Path, gateway_factory: Any
) -> Iterator[tuple[ScriptedEngine, InProcessGateway]]:
    with scripted_gateway(gateway_factory, tiny_model_dir, REPLY) as running:
        yield running


def hold_mid_content(engine: ScriptedEngine) -> int:
    """Make streams pause a few tokens into the content (after all the reasoning)."""
    ids = engine.tokenizer.encode(REPLY, add_special_tokens=False).ids
    prefix = f"<think>\n{REASONING}\n</think>\n\nLet me list"
    at = len(engine.tokenizer.encode(prefix, add_special_tokens=False).ids)
    assert 0 < at < len(ids) - 10
    engine.hold_after_tokens = at
    engine.release.clear()
    return at


class Held:
    """Counts stream deltas while the engine holds; `release()` lets the engine go on."""

    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine = engine
        self.while_held = 0
        self.by_test = False
        self._guard = threading.Timer(GUARD_S, engine.release.set)
        self._guard.start()

    def delta(self) -> None:
        if not self.engine.release.is_set():
            self.while_held += 1
            if self.while_held == 3:
                self.by_test = True
                self.engine.release.set()

    def stop(self) -> None:
        self._guard.cancel()
        self.engine.release.set()


def chat_stream(session: dict[str, Any], held: Held | None) -> dict[str, Any]:
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    with client.chat.completions.stream(
        model="tiny-qwen3",
        messages=[{"role": "user", "content": "What is here?"}],
        tools=CHAT_TOOLS,
    ) as stream:
        for event in stream:
            if event.type == "content.delta" and held is not None:
                held.delta()
        message = stream.get_final_completion().choices[0].message
    call = message.tool_calls[0]  # type: ignore[index]
    return {
        "content": message.content,
        "reasoning": (message.model_extra or {}).get("reasoning_content"),
        "tool": (call.function.name, call.function.arguments),
    }


def chat_create(session: dict[str, Any]) -> dict[str, Any]:
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    message = (
        client.chat.completions.create(
            model="tiny-qwen3",
            messages=[{"role": "user", "content": "What is here?"}],
            tools=CHAT_TOOLS,
        )
        .choices[0]
        .message
    )
    call = message.tool_calls[0]  # type: ignore[index]
    return {
        "content": message.content,
        "reasoning": (message.model_extra or {}).get("reasoning_content"),
        "tool": (call.function.name, call.function.arguments),  # type: ignore[union-attr]
    }


def responses_call(session: dict[str, Any], held: Held | None, stream: bool) -> dict[str, Any]:
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    kwargs: dict[str, Any] = {
        "model": "tiny-qwen3",
        "input": [{"role": "user", "content": "What is here?"}],
        "tools": RESPONSES_TOOLS,
        "store": False,
    }
    if stream:
        with client.responses.stream(**kwargs) as events:
            for event in events:
                if event.type == "response.output_text.delta" and held is not None:
                    held.delta()
            response = events.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    # exclude_none: the stream helper's parsed types add `parsed: None`
    items = [
        item.model_dump(exclude={"id", "call_id", "encrypted_content"}, exclude_none=True)
        for item in response.output
    ]
    return {"items": items, "status": response.status}


def messages_call(session: dict[str, Any], held: Held | None, stream: bool) -> dict[str, Any]:
    client = anthropic.Anthropic(base_url=session["anthropic_base_url"], api_key=session["token"])
    kwargs: dict[str, Any] = {
        "model": "tiny-qwen3",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "What is here?"}],
        "tools": MESSAGES_TOOLS,
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            for event in events:
                if event.type == "text" and held is not None:
                    held.delta()
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    blocks = [block.model_dump(exclude={"id", "signature"}) for block in message.content]
    return {"blocks": blocks, "stop_reason": message.stop_reason}


CALLS: dict[str, Callable[[dict[str, Any], Held | None, bool], dict[str, Any]]] = {
    "chat": lambda s, h, stream: chat_stream(s, h) if stream else chat_create(s),
    "responses": responses_call,
    "messages": messages_call,
}


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_deltas_arrive_while_the_engine_is_still_generating(
    engine_and_gateway: tuple[ScriptedEngine, InProcessGateway], protocol: str
) -> None:
    engine, gw = engine_and_gateway
    hold_mid_content(engine)
    held = Held(engine)
    try:
        CALLS[protocol](gw.create_session(), held, True)
    finally:
        held.stop()
    assert held.by_test, f"only {held.while_held} text deltas came before the engine went on"


@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
def test_a_streamed_call_answers_and_records_what_a_plain_call_does(
    engine_and_gateway: tuple[ScriptedEngine, InProcessGateway], protocol: str
) -> None:
    engine, gw = engine_and_gateway
    plain, streamed = gw.create_session(), gw.create_session()
    plain_reply = CALLS[protocol](plain, None, False)
    streamed_reply = CALLS[protocol](streamed, None, True)
    assert streamed_reply == plain_reply
    if protocol == "chat":
        assert plain_reply["reasoning"] == REASONING and plain_reply["content"] == CONTENT
    plain_calls = calls_without_ids(gw, plain["session_id"])
    assert calls_without_ids(gw, streamed["session_id"]) == plain_calls
    assert plain_calls[0]["status"] == "ok" and len(plain_calls) == 1
    assert plain_calls[0]["output_ids"] == engine.replies[0].output_ids
    segments = [gw.trajectory(s["session_id"])["segments"] for s in (plain, streamed)]
    drop = {"segment_id", "call_ids"}
    assert [[{k: v for k, v in g.items() if k not in drop} for g in s] for s in segments] == [
        [{k: v for k, v in g.items() if k not in drop} for g in segments[0]]
    ] * 2


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def test_a_client_that_leaves_cancels_the_engine_request_and_the_call_is_recorded_cancelled(
    engine_and_gateway: tuple[ScriptedEngine, InProcessGateway],
) -> None:
    engine, gw = engine_and_gateway
    at = hold_mid_content(engine)
    session = gw.create_session()
    body = {
        "model": "tiny-qwen3",
        "stream": True,
        "messages": [{"role": "user", "content": "What is here?"}],
        "tools": CHAT_TOOLS,
    }
    headers = {"Authorization": f"Bearer {session['token']}"}
    guard = threading.Timer(GUARD_S, engine.release.set)
    guard.start()
    try:
        with httpx.stream(
            "POST",
            f"{session['openai_base_url']}/chat/completions",
            json=body,
            headers=headers,
            timeout=GUARD_S,
        ) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break  # the first content delta: leave mid-stream
        wait_for(lambda: engine.streams_cancelled == 1, "the engine stream was cancelled")
        wait_for(lambda: len(gw.trajectory(session["session_id"])["calls"]) == 1, "recorded")
    finally:
        guard.cancel()
        engine.release.set()
    trajectory = gw.trajectory(session["session_id"])
    (call,) = trajectory["calls"]
    sampled = engine.replies[0]
    assert call["status"] == "cancelled"
    assert call["output_ids"] == sampled.output_ids[:at]
    assert call["output_logprobs"] == sampled.output_logprobs[:at]
    assert call["error"] == f"client closed the stream after {at} sampled tokens"
    assert trajectory["segments"] == []  # nothing of it is trained on
    summary = httpx.get(
        f"{gw.control_url}/sessions/{session['session_id']}", headers=gw.admin_headers
    ).json()
    assert (summary["calls"], summary["failed_calls"]) == (1, 1)

    # The agent asks again: a fresh sample, and the segment holds only that one.
    engine.hold_after_tokens = None
    again = chat_create(session)
    assert again["content"] == CONTENT
    trajectory = gw.trajectory(session["session_id"])
    assert [c["status"] for c in trajectory["calls"]] == ["cancelled", "ok"]
    (segment,) = trajectory["segments"]
    assert segment["call_ids"] == [trajectory["calls"][1]["call_id"]]
    assert segment["response_ids"] == engine.replies[1].output_ids


def test_a_retry_sent_after_the_client_left_gets_the_whole_answer_sampled_once(
    tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """An SDK whose timeout fired leaves the stream and resends the request: the engine
    keeps sampling through the grace, the retry waits for that call, and gets its whole
    answer replayed; the engine sampled once and nothing was cancelled. (A grace far
    longer than the test needs, so the retry's arrival is not a race.)"""
    with scripted_gateway(gateway_factory, tiny_model_dir, REPLY, stream_abort_grace_s=60) as stack:
        engine, gw = stack
        hold_mid_content(engine)
        session = gw.create_session()
        body = {
            "model": "tiny-qwen3",
            "stream": True,
            "messages": [{"role": "user", "content": "What is here?"}],
        }
        url = f"{session['openai_base_url']}/chat/completions"
        headers = {"Authorization": f"Bearer {session['token']}"}
        guard = threading.Timer(GUARD_S, engine.release.set)
        guard.start()
        try:
            with httpx.stream("POST", url, json=body, headers=headers, timeout=GUARD_S) as first:
                assert first.status_code == 200
                next(first.iter_lines())  # the stream is flowing: the client leaves
            waiting = gw.gateway.metrics.retries_answered._value.get()
            retry: list[httpx.Response] = []
            sender = threading.Thread(
                target=lambda: retry.append(
                    httpx.post(
                        url,
                        json=body,
                        headers={**headers, "x-stainless-retry-count": "1"},
                        timeout=GUARD_S,
                    )
                )
            )
            sender.start()
            wait_for(lambda: _retry_waits(gw, session["session_id"]), "the retry waits")
            engine.release.set()
            sender.join(GUARD_S)
        finally:
            guard.cancel()
            engine.release.set()
    (reply,) = retry
    assert reply.status_code == 200
    deltas = [
        json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
        for line in reply.text.splitlines()
        if line.startswith("data: {") and '"choices":[{' in line
    ]
    assert "".join(d.get("content") or "" for d in deltas).strip().startswith(CONTENT)
    assert (engine.streams_cancelled, len(engine.replies)) == (0, 1)
    (call,) = gw.trajectory(session["session_id"])["calls"]
    assert call["status"] == "ok"
    assert call["output_ids"] == engine.replies[0].output_ids
    assert gw.gateway.metrics.retries_answered._value.get() == waiting + 1


def _retry_waits(gw: InProcessGateway, session_id: str) -> bool:
    """Has a retry attached to the session's call in flight (`retries.InFlight.awaited`)?"""
    live = gw.gateway.sessions[session_id]
    return any(f.awaited.is_set() for f in live.replies._inflight.values())


def test_an_engine_failure_mid_stream_is_an_in_stream_error_and_recorded(
    engine_and_gateway: tuple[ScriptedEngine, InProcessGateway],
) -> None:
    engine, gw = engine_and_gateway
    engine.fail_after_tokens = 20
    session = gw.create_session()
    client = openai.OpenAI(
        base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
    )
    deltas = 0
    with pytest.raises(openai.APIError, match="engine failed mid-generation"):
        stream = client.chat.completions.create(
            model="tiny-qwen3",
            messages=[{"role": "user", "content": "What is here?"}],
            stream=True,
        )
        for chunk in stream:
            deltas += bool(chunk.choices and chunk.choices[0].delta.model_extra)
    assert deltas > 0, "the stream had begun"
    (call,) = gw.trajectory(session["session_id"])["calls"]
    assert call["status"] == "engine_error"
    assert call["output_ids"] == engine.replies[0].output_ids[:20]
    assert call["output_logprobs"] == engine.replies[0].output_logprobs[:20]
    assert "engine failed mid-generation" in call["error"]
