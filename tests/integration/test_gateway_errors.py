"""Bad input and engine failures: each gets the right status and an OpenAI-shaped error
body from the real Gateway over HTTP, and the calls recorded before are intact after."""

import asyncio
import itertools
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule

pytestmark = pytest.mark.integration


def hanging_engine() -> Starlette:
    """An engine that accepts the request and never answers (for the timeout path)."""

    async def hang(request: Request) -> JSONResponse:
        await asyncio.sleep(3600)
        return JSONResponse({})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"data": [{"id": "tiny-qwen3", "max_model_len": 4096}]})

    return Starlette(
        routes=[
            Route("/v1/completions", hang, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


@pytest.fixture
def scripted(tiny_model_dir: Path):
    engine = ScriptedEngine(
        tiny_model_dir / "tokenizer.json",
        Script(rules=[ScriptRule(reply="<think>\nok\n</think>\n\nHello there.", repeat=True)]),
        model="tiny-qwen3",
    )
    with BackgroundServer(engine.app()) as server:
        yield server


def chat(url: str, token: str | None, body: Any, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if isinstance(body, bytes | str):
        headers["Content-Type"] = "application/json"
        return httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers, **kw)
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, **kw)


GOOD = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}]}


def assert_openai_error(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]
    return error


def test_bad_requests_get_precise_errors_and_lose_nothing(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    gw = gateway_factory(scripted.url, tiny_model_dir, "tiny-qwen3", max_body_bytes=64 * 1024)
    session = gw.create_session()
    url, token = gw.url, session["token"]
    assert chat(url, token, GOOD).status_code == 200
    before = gw.trajectory(session["session_id"])
    assert len(before["calls"]) == 1

    assert_openai_error(chat(url, token, b"{not json"), 400, "invalid_request")
    wrong = assert_openai_error(
        chat(url, token, {"model": "m", "messages": [{"role": "user", "content": 5}]}),
        400,
        "invalid_request",
    )
    assert "messages" in wrong["message"]
    assert_openai_error(chat(url, token, {"model": "m", "messages": "x"}), 400, "invalid_request")
    assert_openai_error(chat(url, token + "x", GOOD), 401, "authentication")
    assert_openai_error(chat(url, None, GOOD), 401, "authentication")
    assert_openai_error(chat(url, "snope.secret", GOOD), 404, "not_found")
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * 100_000}]}
    assert_openai_error(chat(url, token, big), 413, "too_large")
    # The official SDK maps our statuses to its own exception classes.
    client = openai.OpenAI(
        base_url=session["openai_base_url"], api_key=token + "bad", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])

    control = httpx.get(f"{gw.control_url}/sessions/snope/trajectory", headers=gw.admin_headers)
    assert control.status_code == 404
    assert httpx.post(f"{gw.control_url}/sessions", json={"rollout_id": "x"}).status_code == 401
    bad_config = httpx.post(
        f"{gw.control_url}/sessions",
        json={"rollout_id": "x", "sampling": {"top_p": 7}},
        headers=gw.admin_headers,
    )
    assert bad_config.status_code == 400 and "top_p" in bad_config.json()["error"]["message"]

    after = gw.trajectory(session["session_id"])
    assert after["calls"] == before["calls"] and after["segments"] == before["segments"]

    closed = httpx.delete(
        f"{gw.control_url}/sessions/{session['session_id']}", headers=gw.admin_headers
    )
    assert closed.status_code == 200
    again = httpx.delete(
        f"{gw.control_url}/sessions/{session['session_id']}", headers=gw.admin_headers
    )
    assert again.status_code == 200, "closing is idempotent"
    assert_openai_error(chat(url, token, GOOD), 409, "conflict")
    final = gw.trajectory(session["session_id"])
    assert final["closed"] and final["calls"] == before["calls"]


def test_engine_down_and_engine_timeout(tiny_model_dir: Path, gateway_factory: Any) -> None:
    with BackgroundServer(hanging_engine()) as hanging:
        gw = gateway_factory(hanging.url, tiny_model_dir, "tiny-qwen3", request_timeout_s=1.0)
        session = gw.create_session()
        reply = chat(gw.url, session["token"], GOOD, timeout=30)
        assert_openai_error(reply, 504, "engine_timeout")
    # Nothing listens on the port once the server is stopped: the engine is down.
    reply = chat(gw.url, session["token"], GOOD, timeout=30)
    assert_openai_error(reply, 503, "engine_unavailable")
    assert "retry-after" in reply.headers
    trajectory = gw.trajectory(session["session_id"])
    statuses = [c["status"] for c in trajectory["calls"]]
    assert statuses == ["engine_error", "engine_error"]
    assert trajectory["segments"] == []


def test_gateway_restart_serves_recorded_trajectories(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    first = gateway_factory(scripted.url, tiny_model_dir, "tiny-qwen3")
    session = first.create_session()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    for _ in range(3):
        reply = client.chat.completions.create(model="tiny-qwen3", messages=messages)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "more"},
        ]
    recorded = first.trajectory(session["session_id"])
    first.server.stop()  # the process is gone; only the data dir remains
    data_dir = first.gateway.options.data_dir
    second = gateway_factory(scripted.url, tiny_model_dir, "tiny-qwen3", data_dir=data_dir)
    replayed = second.trajectory(session["session_id"])
    assert replayed == recorded
    assert len(replayed["segments"]) == 1 and len(replayed["calls"]) == 3


def test_capture_grows_with_new_messages_not_with_history(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    gw = gateway_factory(scripted.url, tiny_model_dir, "tiny-qwen3")
    session = gw.create_session()
    client = openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start " + "x" * 2000}]
    for turn in range(6):
        reply = client.chat.completions.create(model="tiny-qwen3", messages=messages)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"turn {turn}"},
        ]
    records_file = gw.gateway.store.root / session["session_id"] / "records.jsonl"
    lines = [line for line in records_file.read_text().splitlines() if '"kind":"call"' in line]
    assert len(lines) == 6
    first, *rest = lines
    assert "x" * 2000 in first, "the opening call keeps the full request"
    for line in rest:
        assert "x" * 2000 not in line, "later calls do not repeat the history"
        assert '"new_messages"' in line and "turn" in line
        assert '"prompt_ref"' in line, "held prompt tokens are referenced, not repeated"
    sizes = [len(line) for line in rest]
    assert max(sizes) - min(sizes) < 200, sizes
    # Readers still get complete prompts: each extends the previous call's prompt+output.
    calls = gw.trajectory(session["session_id"])["calls"]
    for before, after in itertools.pairwise(calls):
        held = before["prompt_ids"] + before["output_ids"]
        assert after["prompt_ids"][: len(held)] == held


def test_idempotent_session_creation_and_summary(
    scripted: BackgroundServer, tiny_model_dir: Path, gateway_factory: Any
) -> None:
    gw = gateway_factory(scripted.url, tiny_model_dir, "tiny-qwen3")
    body = {"rollout_id": "r-idem", "idempotency_key": "r-idem/attempt-1"}
    first = httpx.post(f"{gw.control_url}/sessions", json=body, headers=gw.admin_headers)
    again = httpx.post(f"{gw.control_url}/sessions", json=body, headers=gw.admin_headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json(), "a retried create returns the same session and token"
    other = httpx.post(
        f"{gw.control_url}/sessions",
        json={**body, "idempotency_key": "r-idem/attempt-2"},
        headers=gw.admin_headers,
    )
    assert other.status_code == 201 and other.json()["session_id"] != first.json()["session_id"]
    changed = httpx.post(
        f"{gw.control_url}/sessions",
        json={**body, "policy_version": "v9"},
        headers=gw.admin_headers,
    )
    assert changed.status_code == 409 and "different session config" in changed.text

    session = first.json()
    assert chat(gw.url, session["token"], GOOD).status_code == 200
    summary = httpx.get(
        f"{gw.control_url}/sessions/{session['session_id']}", headers=gw.admin_headers
    )
    assert summary.status_code == 200
    assert summary.json() == {
        "session_id": session["session_id"],
        "rollout_id": "r-idem",
        "policy_version": "unversioned",
        "closed": False,
        "calls": 1,
        "failed_calls": 0,
        "segments": 1,
    }
    # After a restart on the same address the key revives the session; calls are kept.
    gw.server.stop()
    restarted = gateway_factory(
        scripted.url, tiny_model_dir, "tiny-qwen3", data_dir=gw.gateway.options.data_dir,
        public_url=gw.url,
    )  # fmt: skip
    revived = httpx.post(
        f"{restarted.control_url}/sessions", json=body, headers=restarted.admin_headers
    )
    assert revived.status_code == 200 and revived.json()["token"] == session["token"]
    assert chat(restarted.url, session["token"], GOOD).status_code == 200
    assert len(restarted.trajectory(session["session_id"])["calls"]) == 2
    httpx.delete(
        f"{restarted.control_url}/sessions/{session['session_id']}", headers=restarted.admin_headers
    )
    closed = httpx.post(
        f"{restarted.control_url}/sessions", json=body, headers=restarted.admin_headers
    )
    assert closed.status_code == 409 and "closed" in closed.text
