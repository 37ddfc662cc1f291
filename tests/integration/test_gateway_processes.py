"""`rollout gateway --processes N`: each process owns the sessions created on it (the base
URL it hands out names itself), all share one data dir, and the admin-token policy holds."""

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.session import GatewayAccess, SessionActivities
from devstack.background_server import BackgroundServer
from devstack.ports import free_port
from devstack.scripted_engine import Script, ScriptedEngine
from schemas.rollout import BAD_TASK_SPEC, SessionRequest
from schemas.sampling import SamplingParams
from schemas.scenes import SceneConfig
from schemas.tasks import HarnessSpec

pytestmark = pytest.mark.integration


def consecutive_free_ports(count: int) -> int:
    """A base port such that base..base+count-1 are all free on loopback right now."""
    for _ in range(100):
        base = free_port()
        sockets = []
        try:
            for offset in range(count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no run of free ports found")


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not become healthy")


def test_two_processes_own_their_sessions(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    admin = secrets.token_urlsafe(12)
    with BackgroundServer(engine.app()) as engine_server:
        port = consecutive_free_ports(2)
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", engine_server.url, "--model", "tiny-qwen3",
            "--tokenizer", str(tiny_model_dir), "--port", str(port),
            "--processes", "2", "--data-dir", str(tmp_path / "gw"),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
        try:
            urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
            for url in urls:
                wait_healthy(url, proc)
            auth = {"Authorization": f"Bearer {admin}"}
            sessions: list[dict[str, Any]] = []
            for url in urls:
                reply = httpx.post(f"{url}/sessions", json={"rollout_id": "r"}, headers=auth)
                assert reply.status_code == 201
                sessions.append(reply.json())
                assert sessions[-1]["openai_base_url"] == f"{url}/v1"
            for session in sessions:
                client = openai.OpenAI(
                    base_url=session["openai_base_url"], api_key=session["token"]
                )
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
            # Any process serves any trajectory from the shared data dir.
            other = httpx.get(
                f"{urls[0]}/sessions/{sessions[1]['session_id']}/trajectory", headers=auth
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
            closed = httpx.delete(f"{urls[0]}/sessions/{sessions[1]['session_id']}", headers=auth)
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
        for url in urls:
            with pytest.raises(httpx.ConnectError):
                httpx.get(f"{url}/health", timeout=2)


def test_gateway_refuses_to_start_without_admin_token_off_loopback(tiny_model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ROLLOUT_ADMIN_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "workers.cli", "gateway", "--engine", "http://127.0.0.1:9",
         "--model", "m", "--tokenizer", str(tiny_model_dir), "--host", "0.0.0.0",
         "--insecure-dev"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "admin-token" in result.stderr + result.stdout


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
        port = consecutive_free_ports(2)
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", engine_server.url, "--model", "tiny-qwen3",
            "--tokenizer", str(tiny_model_dir), "--port", str(port),
            "--processes", "2", "--data-dir", str(tmp_path / "gw"),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
        try:
            urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
            for url in urls:
                wait_healthy(url, proc)
            asyncio.run(retry_on_other_process(urls, admin))
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) is not None


async def retry_on_other_process(urls: list[str], admin: str) -> None:
    """Run the real create_session activity twice (a retry), then with another config."""
    access = GatewayAccess(urls, admin, owner_queue="q-gateway-h")
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
        assert (first.gateway_url, retried.gateway_url) == (urls[0], urls[1])
        assert retried.session_id == first.session_id and retried.token == first.token
        assert retried.openai_base_url == f"{urls[0]}/v1"
        assert retried.anthropic_base_url == urls[0]
        client = openai.AsyncOpenAI(base_url=retried.openai_base_url, api_key=retried.token)
        await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        trajectory = await access.client(urls[1]).trajectory(first.session_id)
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
