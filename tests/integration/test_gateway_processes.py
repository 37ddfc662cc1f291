"""`rollout gateway --processes N`: each process owns the sessions created on it (the base
URL it hands out names its agent listener), all share one data dir, each process serves
the agent API and the control API on separate ports, and the admin-token policy holds."""

import asyncio
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.session import GatewayAccess, SessionActivities
from devstack.background_server import BackgroundServer
from devstack.ports import consecutive_free_ports
from devstack.scripted_engine import Script, ScriptedEngine
from schemas.rollout import BAD_TASK_SPEC, SessionRequest
from schemas.sampling import SamplingParams
from schemas.scenes import SceneConfig
from schemas.tasks import HarnessSpec
from tests.fixtures.gateway import wait_healthy

pytestmark = pytest.mark.integration


def test_two_processes_own_their_sessions(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    admin = secrets.token_urlsafe(12)
    with BackgroundServer(engine.app()) as engine_server:
        port = consecutive_free_ports(4)
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", engine_server.url, "--model", "tiny-qwen3",
            "--tokenizer", str(tiny_model_dir), "--port", str(port),
            "--control-port", str(port + 2),
            "--processes", "2", "--data-dir", str(tmp_path / "gw"),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
        try:
            urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
            controls = [f"http://127.0.0.1:{port + 2}", f"http://127.0.0.1:{port + 3}"]
            for control in controls:
                wait_healthy(control, proc)
            auth = {"Authorization": f"Bearer {admin}"}
            sessions: list[dict[str, Any]] = []
            for url, control in zip(urls, controls, strict=True):
                reply = httpx.post(f"{control}/sessions", json={"rollout_id": "r"}, headers=auth)
                assert reply.status_code == 201
                sessions.append(reply.json())
                assert sessions[-1]["openai_base_url"] == f"{url}/v1"
                # Each listener answers only its own paths.
                on_agent = httpx.post(f"{url}/sessions", json={"rollout_id": "r"}, headers=auth)
                assert on_agent.status_code == 404
                assert on_agent.json()["error"]["type"] == "not_found_error"
                assert httpx.get(f"{url}/metrics").status_code == 404
                on_control = httpx.post(
                    f"{control}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {sessions[-1]['token']}"},
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                )
                assert on_control.status_code == 404
                assert on_control.json()["error"]["type"] == "not_found_error"
            for session in sessions:
                client = openai.OpenAI(
                    base_url=session["openai_base_url"], api_key=session["token"]
                )
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
            # Any process serves any trajectory from the shared data dir.
            other = httpx.get(
                f"{controls[0]}/sessions/{sessions[1]['session_id']}/trajectory", headers=auth
            )
            assert other.status_code == 200 and len(other.json()["calls"]) == 1
            # A session used on the wrong process is refused clearly, not silently forked.
            wrong = httpx.post(
                f"{urls[0]}/v1/chat/completions",
                headers={"Authorization": f"Bearer {sessions[1]['token']}"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert wrong.status_code == 409 and "not served" in wrong.json()["error"]["message"]
            # Closing through another process reaches the owner through the data dir.
            closed = httpx.delete(
                f"{controls[0]}/sessions/{sessions[1]['session_id']}", headers=auth
            )
            assert closed.status_code == 200
            after = httpx.post(
                f"{urls[1]}/v1/chat/completions",
                headers={"Authorization": f"Bearer {sessions[1]['token']}"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert after.status_code == 409 and "closed" in after.json()["error"]["message"]
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) is not None
        for url in urls + controls:
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{url}/health", timeout=2)


def refused_start(tiny_model_dir: Path, *args: str) -> str:
    """Run `rollout gateway` with `args` (no admin token in the environment); it must exit
    non-zero before serving. Returns its output."""
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_ADMIN_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "gateway", "--engine", "http://127.0.0.1:9",
         "--model", "m", "--tokenizer", str(tiny_model_dir), *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    return result.stderr + result.stdout


def test_gateway_refuses_to_start_without_admin_token(tiny_model_dir: Path) -> None:
    assert "admin-token" in refused_start(tiny_model_dir)


def test_insecure_dev_refuses_a_control_listener_off_loopback(tiny_model_dir: Path) -> None:
    """--insecure-dev drops the admin token on the control listener only, so that listener
    may not be reachable from off the host. (Was: the policy looked at --host, the one
    listener agents and sandboxes reach too.)"""
    output = refused_start(tiny_model_dir, "--control-host", "0.0.0.0", "--insecure-dev")
    assert "--control-host must be loopback" in output


def test_overlapping_agent_and_control_ports_are_refused(tiny_model_dir: Path) -> None:
    output = refused_start(
        tiny_model_dir, "--insecure-dev", "--port", "9000", "--control-port", "9001",
        "--processes", "2",
    )  # fmt: skip
    assert "agent ports 9000-9001 and control ports 9001-9002" in output


def test_create_retried_on_the_other_process_gets_the_owners_session(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The session-create activity round-robins over the processes, so its retry lands on
    the process that does not own the session: it gets the owner's session back (same id
    and token, the owner's base URLs: the processes share the data dir and its secret),
    not a 409 that would fail the rollout. A key reused with another config is refused
    as non-retryable."""
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    admin = secrets.token_urlsafe(12)
    with BackgroundServer(engine.app()) as engine_server:
        port = consecutive_free_ports(4)
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", engine_server.url, "--model", "tiny-qwen3",
            "--tokenizer", str(tiny_model_dir), "--port", str(port),
            "--control-port", str(port + 2), "--processes", "2", "--data-dir", str(tmp_path / "gw"),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
        try:
            agents = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
            controls = [f"http://127.0.0.1:{port + 2}", f"http://127.0.0.1:{port + 3}"]
            for control in controls:
                wait_healthy(control, proc)
            asyncio.run(retry_on_other_process(agents, controls, admin))
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) is not None


async def retry_on_other_process(agents: list[str], controls: list[str], admin: str) -> None:
    """Run the real create_session activity twice (a retry), then with another config."""
    access = GatewayAccess(controls, admin, owner_queue="q-gateway-h")
    request = SessionRequest(
        rollout_id="r-retry",
        attempt=1,
        policy_version="v1",
        sampling=SamplingParams(),
        scenes=SceneConfig(),
        harness=HarnessSpec(name="command", config={"command": "true"}),
    )
    env = ActivityEnvironment()
    create = SessionActivities(access).create_session
    try:
        first = await env.run(create, request)
        retried = await env.run(create, request)  # round-robin: the other process
        assert (first.gateway_url, retried.gateway_url) == (controls[0], controls[1])
        assert retried.session_id == first.session_id and retried.token == first.token
        assert retried.openai_base_url == f"{agents[0]}/v1"
        assert retried.anthropic_base_url == agents[0]
        client = openai.AsyncOpenAI(base_url=retried.openai_base_url, api_key=retried.token)
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        trajectory = await access.client(controls[1]).trajectory(first.session_id)
        assert len(trajectory.calls) == 1
        # The same key with another config: a caller bug that no retry can fix.
        changed = request.model_copy(update={"policy_version": "v2"})
        with pytest.raises(ApplicationError) as err:
            await env.run(create, changed)
        assert err.value.type == BAD_TASK_SPEC and err.value.non_retryable
        assert "different session config" in err.value.message
        await client.close()
    finally:
        await access.aclose()
