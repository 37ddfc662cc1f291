"""The Gateway's two listeners: the agent API (what a sandbox's bridge reaches) and the
control API with /metrics and /health (what workers and trainers reach).

Each listener answers the other's paths with a JSON 404 in the path's protocol. The
sandbox test runs a real bubblewrap sandbox whose Gateway channel is built from the
session's base URL exactly as a rollout builds it; the Gateway runs with --insecure-dev,
where the control listener has no admin token at all.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.sandbox import gateway_channel
from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from sandboxes.base import SandboxBackend, SandboxSpec
from stress.malformed_requests import Shape, error_shape_problem
from workers.local_stack import InProcessGateway

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {**CHAT, "max_tokens": 16}

#: (method, path, body, error shape) of every control-listener endpoint.
CONTROL_ENDPOINTS: list[tuple[str, str, Any, Shape]] = [
    ("POST", "/sessions", {"rollout_id": "from-the-sandbox"}, "openai"),
    ("GET", "/sessions/{sid}", None, "openai"),
    ("GET", "/sessions/{sid}/trajectory", None, "openai"),
    ("DELETE", "/sessions/{sid}", None, "openai"),
    ("GET", "/metrics", None, "openai"),
    ("GET", "/health", None, "openai"),
]
#: The same for the agent listener.
AGENT_ENDPOINTS: list[tuple[str, str, Any, Shape]] = [
    ("POST", "/v1/chat/completions", CHAT, "openai"),
    ("POST", "/v1/responses", {"model": MODEL, "input": "hi"}, "openai"),
    ("POST", "/v1/responses/compact", {"model": MODEL, "input": "hi"}, "openai"),
    ("GET", "/v1/models", None, "openai"),
    ("POST", "/v1/messages", MESSAGES, "anthropic"),
    ("POST", "/v1/messages/count_tokens", CHAT, "anthropic"),
]


@pytest.fixture
def insecure_gateway(tiny_model_dir: Path, gateway_factory: Any) -> Iterator[InProcessGateway]:
    """A real Gateway started with --insecure-dev (no admin token) on the scripted engine."""
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    with BackgroundServer(engine.app()) as server:
        yield gateway_factory(server.url, tiny_model_dir, MODEL, insecure_dev=True)


def assert_json_404(reply: httpx.Response, shape: Shape) -> None:
    assert reply.status_code == 404, reply.text
    assert error_shape_problem(shape, reply) is None, reply.text


@pytest.mark.parametrize(("method", "path", "body", "shape"), CONTROL_ENDPOINTS)
def test_agent_listener_has_no_control_paths(
    insecure_gateway: InProcessGateway, method: str, path: str, body: Any, shape: Shape
) -> None:
    sid = insecure_gateway.create_session()["session_id"]
    reply = httpx.request(method, insecure_gateway.url + path.format(sid=sid), json=body)
    assert_json_404(reply, shape)
    assert not insecure_gateway.trajectory(sid)["closed"]


@pytest.mark.parametrize(("method", "path", "body", "shape"), AGENT_ENDPOINTS)
def test_control_listener_rejects_agent_paths(
    insecure_gateway: InProcessGateway, method: str, path: str, body: Any, shape: Shape
) -> None:
    token = insecure_gateway.create_session()["token"]
    headers = {"Authorization": f"Bearer {token}", "x-api-key": token}
    reply = httpx.request(method, insecure_gateway.control_url + path, json=body, headers=headers)
    assert_json_404(reply, shape)
    assert f"{method} {path}" in reply.text


#: Runs inside the sandbox: every request through the Gateway channel, its status.
PROBE = """
import json, os, sys, urllib.error, urllib.request
base = os.environ["AGENTIC_ROLLOUT_GATEWAY_URL"]
token, sid = sys.argv[1], sys.argv[2]
calls = {
    "chat": ("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user",
                                                                         "content": "hi"}]}),
    "create_session": ("POST", "/sessions", {"rollout_id": "from-the-sandbox"}),
    "summary": ("GET", f"/sessions/{sid}", None),
    "trajectory": ("GET", f"/sessions/{sid}/trajectory", None),
    "close_session": ("DELETE", f"/sessions/{sid}", None),
    "metrics": ("GET", "/metrics", None),
    "health": ("GET", "/health", None),
}
statuses = {}
for name, (method, path, body) in calls.items():
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        statuses[name] = urllib.request.urlopen(req, timeout=30).status
    except urllib.error.HTTPError as err:
        statuses[name] = err.code
print(json.dumps(statuses))
"""


@pytest.mark.asyncio(loop_scope="session")
async def test_a_sandbox_reaches_only_the_agent_api(
    insecure_gateway: InProcessGateway, local_backend: SandboxBackend
) -> None:
    """Was: one port for everything, so under --insecure-dev the sandbox could create,
    read and close sessions (201/200) and read /metrics (200) through its channel."""
    session = insecure_gateway.create_session()
    channel = gateway_channel(local_backend.name, session["openai_base_url"])
    sandbox = await local_backend.create(
        SandboxSpec(rollout_id=f"listeners-{uuid.uuid4().hex[:8]}", gateway=channel)
    )
    try:
        await sandbox.put_file("/tmp/probe.py", PROBE.encode())
        result = await sandbox.exec(
            ["python3", "/tmp/probe.py", session["token"], session["session_id"]], timeout=120
        )
    finally:
        await sandbox.destroy()
    assert result.ok, result
    assert json.loads(result.stdout) == {
        "chat": 200,
        "create_session": 404,
        "summary": 404,
        "trajectory": 404,
        "close_session": 404,
        "metrics": 404,
        "health": 404,
    }
    trajectory = insecure_gateway.trajectory(session["session_id"])
    assert len(trajectory["calls"]) == 1 and not trajectory["closed"]
