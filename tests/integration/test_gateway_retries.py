"""Retries are not new turns (issue 9, point 5): a request an agent SDK sends again after a
timeout gets the answer already recorded for it — same call id, rendered in the caller's
protocol, streaming or not — and nothing is sampled or recorded again. Real Gateway over
HTTP, official SDKs, the scripted engine made slow so the SDKs' own timeouts fire."""

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from gateway.capture.store import SessionStore

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"
SAID = "Hello there."


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[tuple[ScriptedEngine, BackgroundServer]]:
    scripted = ScriptedEngine(
        tiny_model_dir / "tokenizer.json",
        Script(rules=[ScriptRule(reply=f"<think>\nok\n</think>\n\n{SAID}", repeat=True)]),
        model=MODEL,
    )
    with BackgroundServer(scripted.app()) as server:
        yield scripted, server


def sdk_turn(protocol: str, session: dict[str, Any], stream: bool, **client: Any) -> str:
    """One call through the official SDK; returns the reply's id."""
    messages = [{"role": "user", "content": "hi"}]
    if protocol == "openai":
        oai = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"], **client)
        if not stream:
            reply = oai.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
            assert reply.choices[0].message.content == SAID
            return reply.id
        chunks = list(oai.chat.completions.create(model=MODEL, messages=messages, stream=True))  # type: ignore[arg-type]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == SAID
        return chunks[0].id
    ant = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key=session["token"], **client
    )
    if not stream:
        message = ant.messages.create(model=MODEL, max_tokens=64, messages=messages)  # type: ignore[arg-type]
    else:
        with ant.messages.stream(model=MODEL, max_tokens=64, messages=messages) as events:  # type: ignore[arg-type]
            message = events.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[1].text == SAID  # type: ignore[union-attr]
    return message.id


@pytest.mark.parametrize(
    ("protocol", "stream"),
    [("openai", False), ("openai", True), ("anthropic", False), ("anthropic", True)],
)
def test_an_sdk_retry_after_a_timeout_gets_the_recorded_answer(
    engine: tuple[ScriptedEngine, BackgroundServer],
    tiny_model_dir: Path,
    gateway_factory: Any,
    protocol: str,
    stream: bool,
) -> None:
    scripted, server = engine
    gw = gateway_factory(server.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    # The engine answers after 6 s; the SDK gives up after 4 s and retries once (within
    # a second): its retry finds the original in flight, or answered, never unanswered.
    # (The retry's own 4 s leave ~3 s for the original to finish and be recorded: a
    # loaded 2-core box needed more than the 1.5 s of a 5 s / 3 s setting.)
    scripted.delay_s = 6.0
    reply_id = sdk_turn(protocol, session, stream, timeout=4.0, max_retries=1)

    assert len(scripted.prompts) == 1, "the engine sampled once"
    trajectory = gw.trajectory(session["session_id"])
    (call,) = trajectory["calls"]
    assert reply_id == ("chatcmpl-" if protocol == "openai" else "msg_") + call["call_id"]
    assert gw.gateway.metrics.retries_answered._value.get() == 1
    assert len(trajectory["segments"]) == 1

    scripted.delay_s = 0.0
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": SAID},
        {"role": "user", "content": "more"},
    ]
    if protocol == "openai":
        follow = openai.OpenAI(
            base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
        ).chat.completions.create(model=MODEL, messages=history)  # type: ignore[arg-type]
        assert follow.choices[0].message.content == SAID
    else:
        answer = anthropic.Anthropic(
            base_url=session["anthropic_base_url"], api_key=session["token"], max_retries=0
        ).messages.create(model=MODEL, max_tokens=64, messages=history)  # type: ignore[arg-type]
        assert answer.content[-1].text == SAID  # type: ignore[union-attr]
    after = gw.trajectory(session["session_id"])
    assert [c["match"] for c in after["calls"]] == ["fork", "realign"], "no fork"
    assert len(after["segments"]) == 1


def post(url: str, token: str, body: dict[str, Any], retry_count: int | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    if retry_count is not None:
        headers["x-stainless-retry-count"] = str(retry_count)
    return httpx.post(
        f"{url}/v1/chat/completions", content=json.dumps(body), headers=headers, timeout=60
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_retry_waits_for_its_original_still_in_flight(
    engine: tuple[ScriptedEngine, BackgroundServer],
    tiny_model_dir: Path,
    gateway_factory: Any,
    stream: bool,
) -> None:
    scripted, server = engine
    gw = gateway_factory(server.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    scripted.delay_s = 2.0
    originals: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: originals.append(post(gw.url, session["token"], body, 0))
    )
    sender.start()
    while not scripted.prompts:  # the original is at the engine now
        assert sender.is_alive()
        time.sleep(0.01)
    retried = post(gw.url, session["token"], body, 1)
    sender.join(timeout=60)
    (original,) = originals
    assert original.status_code == retried.status_code == 200
    assert retried.text == original.text, "the same answer, rendered the same way"
    assert original.headers["content-type"].startswith(
        "text/event-stream" if stream else "application/json"
    )
    assert len(scripted.prompts) == 1
    assert len(gw.trajectory(session["session_id"])["calls"]) == 1


def test_an_identical_request_without_a_retry_header_is_sampled_again(
    engine: tuple[ScriptedEngine, BackgroundServer], tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """Deliberate re-asking (no header, or retry count 0) is a new sample, not a replay."""
    _, server = engine
    gw = gateway_factory(server.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    first = post(gw.url, session["token"], body, None)
    again = post(gw.url, session["token"], body, 0)
    assert first.status_code == again.status_code == 200
    assert first.json()["id"] != again.json()["id"]
    calls = gw.trajectory(session["session_id"])["calls"]
    assert [c["match"] for c in calls] == ["fork", "fork"]
    assert calls[1]["fork_reason"] == (
        "request does not go beyond the held messages (retry or rewind)"
    )


def test_a_retry_of_a_failed_call_is_sampled(
    engine: tuple[ScriptedEngine, BackgroundServer], tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """Only answered calls are replayed: a retry after an engine error gets a real answer."""
    scripted, server = engine
    gw = gateway_factory(server.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    server.stop()
    failed = post(gw.url, session["token"], body, 0)
    assert failed.status_code == 503, failed.text
    with BackgroundServer(scripted.app(), port=server.port):
        retried = post(gw.url, session["token"], body, 1)
    assert retried.status_code == 200, retried.text
    calls = gw.trajectory(session["session_id"])["calls"]
    assert [c["status"] for c in calls] == ["engine_error", "ok"]
    assert retried.json()["id"] == f"chatcmpl-{calls[1]['call_id']}"


def test_a_retry_in_a_long_session_reads_back_only_its_own_record(
    engine: tuple[ScriptedEngine, BackgroundServer],
    tiny_model_dir: Path,
    gateway_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer of a retry comes from its call's record alone, found by the offset the
    session keeps (live, and rebuilt by a restarted gateway), never from the whole file."""
    _, server = engine
    gw = gateway_factory(server.url, tiny_model_dir, MODEL, context_window=2**20)
    session = gw.create_session()
    history: list[dict[str, Any]] = []
    bodies, answers = [], []
    for turn in range(24):
        history.append({"role": "user", "content": f"turn {turn}: " + "log line\n" * 2000})
        body = {"model": MODEL, "messages": list(history)}
        answer = post(gw.url, session["token"], body, None)
        assert answer.status_code == 200, answer.text
        bodies.append(body)
        answers.append(answer.json())
        history.append(
            {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]}
        )
    records = gw.gateway.options.data_dir / "sessions" / session["session_id"] / "records.jsonl"
    size = records.stat().st_size

    read: list[int] = []
    real_read_entry = SessionStore.read_entry

    def counted(store: SessionStore, session_id: str, offset: int) -> Any:
        entry = real_read_entry(store, session_id, offset)
        read.append(len(entry.model_dump_json()) + 1)
        return entry

    def whole_file(*_: Any) -> Any:
        raise AssertionError("a retry read the whole records file")

    def retry_answers(url: str, turn: int) -> None:
        read.clear()
        retried = post(url, session["token"], bodies[turn], 1)
        assert retried.status_code == 200, retried.text
        assert retried.json()["id"] == answers[turn]["id"]
        assert retried.json()["usage"] == answers[turn]["usage"]
        assert retried.json()["choices"] == answers[turn]["choices"]
        assert read and sum(read) < size / 10, (read, size)

    monkeypatch.setattr(SessionStore, "read_entry", counted)
    with monkeypatch.context() as patched:
        patched.setattr(SessionStore, "load_records", whole_file)
        retry_answers(gw.url, 12)
    gw.server.stop()
    restarted = gateway_factory(
        server.url,
        tiny_model_dir,
        MODEL,
        data_dir=gw.gateway.options.data_dir,
        context_window=2**20,
        public_url=gw.url,  # the same owner, restarted
    )
    models = httpx.get(
        f"{restarted.url}/v1/models", headers={"Authorization": f"Bearer {session['token']}"}
    )
    assert models.status_code == 200  # revived: the offsets are rebuilt from the records
    monkeypatch.setattr(SessionStore, "load_records", whole_file)
    retry_answers(restarted.url, 5)
    assert len(restarted.gateway.sessions[session["session_id"]].replies._offsets) == 24
