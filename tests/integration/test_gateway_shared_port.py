"""`rollout gateway --processes 2 --shared-port P`: one advertised agent address. Session
base URLs name P whichever process created the session; the kernel spreads connections
over both processes, and a call (or an SDK retry) that lands on the process that does not
own its session is relayed to the owner, which alone records it."""

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from devstack.background_server import BackgroundServer
from devstack.ports import consecutive_free_ports, free_port
from devstack.scripted_engine import Script, ScriptedEngine
from tests.integration.test_gateway_processes import wait_healthy

pytestmark = pytest.mark.integration

SESSIONS = 12
TURNS = 3


def metric(text: str, name: str) -> float:
    """Sum of a counter's samples (over its labels) in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def fresh_client(session: dict[str, Any]) -> openai.OpenAI:
    """A client with its own connection, so the kernel picks a process for it anew."""
    return openai.OpenAI(
        base_url=session["openai_base_url"],
        api_key=session["token"],
        http_client=httpx.Client(),
        max_retries=0,
    )


def test_one_address_serves_every_session_on_its_owner(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok {nonce}"))
    admin = secrets.token_urlsafe(12)
    auth = {"Authorization": f"Bearer {admin}"}
    with BackgroundServer(engine.app()) as engine_server:
        port, shared = consecutive_free_ports(4), free_port()
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", engine_server.url, "--model", "tiny-qwen3",
            "--tokenizer", str(tiny_model_dir), "--port", str(port),
            "--control-port", str(port + 2), "--shared-port", str(shared),
            "--processes", "2", "--data-dir", str(tmp_path / "gw"),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
        try:
            owners = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
            controls = [f"http://127.0.0.1:{port + 2}", f"http://127.0.0.1:{port + 3}"]
            for control in controls:
                wait_healthy(control, proc)
            sessions: list[dict[str, Any]] = []
            for i in range(SESSIONS):  # alternate: each process owns half of them
                reply = httpx.post(
                    f"{controls[i % 2]}/sessions", json={"rollout_id": f"r{i}"}, headers=auth
                )
                assert reply.status_code == 201
                sessions.append(reply.json())
            shared_url = f"http://127.0.0.1:{shared}"
            assert {s["openai_base_url"] for s in sessions} == {f"{shared_url}/v1"}
            assert {s["anthropic_base_url"] for s in sessions} == {shared_url}

            answers: dict[str, list[str]] = {}
            for session in sessions:
                messages: list[Any] = [{"role": "user", "content": "hi"}]
                for _ in range(TURNS):
                    with fresh_client(session) as client:
                        done = client.chat.completions.create(model="m", messages=messages)
                    messages += [
                        {"role": "assistant", "content": done.choices[0].message.content},
                        {"role": "user", "content": "go on"},
                    ]
                    answers.setdefault(session["session_id"], []).append(done.id)
                # A stream relayed as it comes: the SDK's stream helper reads it whole.
                with fresh_client(session) as client:
                    chunks = list(
                        client.chat.completions.create(model="m", messages=messages, stream=True)
                    )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert text.startswith("ok n")

            # An SDK retry of the last call, over fresh connections (so on either process):
            # always the recorded answer, never a new call.
            retried = sessions[0]
            last = [{"role": "user", "content": "hi"}]
            first = httpx.post(
                f"{shared_url}/v1/chat/completions",
                json={"model": "m", "messages": last},
                headers={"Authorization": f"Bearer {retried['token']}"},
            ).json()
            for _ in range(6):
                again = httpx.post(
                    f"{shared_url}/v1/chat/completions",
                    json={"model": "m", "messages": last},
                    headers={
                        "Authorization": f"Bearer {retried['token']}",
                        "x-stainless-retry-count": "1",
                    },
                )
                assert again.status_code == 200 and again.json()["id"] == first["id"]

            listing = httpx.get(f"{controls[0]}/sessions", headers=auth).json()["sessions"]
            owner_of = {s["session_id"]: s["owner_url"] for s in listing}
            expected_calls = {owners[0]: 0, owners[1]: 0}
            for i, session in enumerate(sessions):
                sid = session["session_id"]
                assert owner_of[sid] == owners[i % 2]
                calls = httpx.get(
                    f"{controls[(i + 1) % 2]}/sessions/{sid}/trajectory", headers=auth
                ).json()["calls"]
                made = TURNS + 1 + (1 if i == 0 else 0)
                assert [c["status"] for c in calls] == ["ok"] * made
                assert len({c["call_id"] for c in calls}) == made  # each recorded once
                expected_calls[owners[i % 2]] += made
            pages = [httpx.get(f"{c}/metrics", headers=auth).text for c in controls]
            # Each process recorded exactly the calls of the sessions it owns.
            for owner, page in zip(owners, pages, strict=True):
                assert metric(page, "rollout_gateway_calls_total") == expected_calls[owner]
            # 12 × 4 + 7 fresh connections all landing on their owner has odds 2^-55.
            assert sum(metric(p, "rollout_gateway_forwarded_calls_total") for p in pages) > 0
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
