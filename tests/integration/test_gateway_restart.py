"""A gateway process killed and restarted on the same data dir and port serves its running
agents on: their next call continues the held segment (issue 9, point 0). Real gateway
processes (`rollout gateway`), SIGKILLed; official SDKs; the scripted engine."""

import dataclasses
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
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
from devstack.ports import free_port
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"
REPLY = "<think>\nok\n</think>\n\nHello there."


class GatewayProcess:
    """`rollout gateway` as a real process on a fixed port and data dir."""

    def __init__(self, engine_url: str, tokenizer: Path, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"  # the agent listener
        self.control_port = free_port()
        self.control_url = f"http://127.0.0.1:{self.control_port}"
        self.admin = secrets.token_urlsafe(12)
        self.cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", engine_url, "--model", MODEL, "--tokenizer", str(tokenizer),
            "--port", str(self.port), "--control-port", str(self.control_port),
            "--data-dir", str(data_dir),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    def start(self) -> "GatewayProcess":
        self.proc = subprocess.Popen(self.cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=self.admin))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"gateway exited with {self.proc.returncode}"
            try:
                if httpx.get(f"{self.control_url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"{self.url} did not become healthy")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when the machine or the OOM killer stops it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    def create_session(self) -> dict[str, Any]:
        body = {"rollout_id": f"r-{secrets.token_hex(4)}"}
        reply = httpx.post(f"{self.control_url}/sessions", json=body, headers=self.admin_headers)
        assert reply.status_code == 201, reply.text
        return reply.json()

    def trajectory(self, session_id: str) -> dict[str, Any]:
        reply = httpx.get(
            f"{self.control_url}/sessions/{session_id}/trajectory", headers=self.admin_headers
        )
        assert reply.status_code == 200, reply.text
        return reply.json()


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[tuple[ScriptedEngine, BackgroundServer]]:
    scripted = ScriptedEngine(
        tiny_model_dir / "tokenizer.json",
        Script(rules=[ScriptRule(reply=REPLY, repeat=True)]),
        model=MODEL,
    )
    with BackgroundServer(scripted.app()) as server:
        yield scripted, server


@pytest.fixture
def gateway(
    engine: tuple[ScriptedEngine, BackgroundServer], tiny_model_dir: Path, tmp_path: Path
) -> Iterator[GatewayProcess]:
    process = GatewayProcess(engine[1].url, tiny_model_dir, tmp_path / "gw").start()
    try:
        yield process
    finally:
        process.stop()


def assert_one_contiguous_segment(trajectory: dict[str, Any]) -> None:
    """Every call extends the one before it token for token, all in one segment."""
    calls = trajectory["calls"]
    (segment,) = trajectory["segments"]
    assert segment["call_ids"] == [c["call_id"] for c in calls]
    for before, after in itertools.pairwise(calls):
        held = before["prompt_ids"] + before["output_ids"]
        assert after["prompt_ids"][: len(held)] == held
    last = calls[-1]
    assert segment["prompt_ids"] + segment["response_ids"] == (
        last["prompt_ids"] + last["output_ids"]
    )


def test_an_openai_agent_goes_on_after_a_gateway_restart(gateway: GatewayProcess) -> None:
    session = gateway.create_session()
    client = openai.OpenAI(
        base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
    )
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    bodies: list[tuple[dict[str, Any], Any]] = []
    for turn in range(3):
        if turn == 2:
            gateway.kill()
            gateway.start()
        reply = client.chat.completions.create(model=MODEL, messages=messages)
        bodies.append(({"model": MODEL, "messages": list(messages)}, reply))
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"more {turn}"},
        ]
    trajectory = gateway.trajectory(session["session_id"])
    calls = trajectory["calls"]
    # The agent echoes replies without their reasoning: a forgiven drift of the latest
    # reply only, before the restart and after it (older echoes are held as echoed).
    assert [(c["status"], c["match"]) for c in calls] == [
        ("ok", "fork"),
        ("ok", "realign"),
        ("ok", "realign"),
    ]
    assert calls[1]["drift"] == [calls[1]["drift"][0]] and calls[1]["drift"][0].startswith(
        "message 1 (assistant)"
    )
    assert calls[2]["drift"] == [calls[1]["drift"][0].replace("message 1", "message 3")]
    assert_one_contiguous_segment(trajectory)

    # A retry of a call answered before the restart is answered from its record.
    body, original = bodies[1]
    retried = httpx.post(
        f"{session['openai_base_url']}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {session['token']}", "x-stainless-retry-count": "1"},
    )
    assert retried.status_code == 200, retried.text
    assert retried.json() == original.model_dump(exclude_unset=True)
    assert gateway.trajectory(session["session_id"]) == trajectory


def test_an_anthropic_agent_goes_on_after_a_gateway_restart(gateway: GatewayProcess) -> None:
    session = gateway.create_session()
    client = anthropic.Anthropic(
        base_url=session["anthropic_base_url"], api_key=session["token"], max_retries=0
    )
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    for turn in range(3):
        if turn == 2:
            gateway.kill()
            gateway.start()
        reply = client.messages.create(model=MODEL, max_tokens=64, messages=messages)
        messages += [
            {"role": "assistant", "content": [block.to_dict() for block in reply.content]},
            {"role": "user", "content": f"more {turn}"},
        ]
    trajectory = gateway.trajectory(session["session_id"])
    assert [(c["status"], c["match"]) for c in trajectory["calls"]] == [
        ("ok", "fork"),
        ("ok", "clean"),
        ("ok", "clean"),
    ]
    assert_one_contiguous_segment(trajectory)


def test_after_a_restart_closed_sessions_and_wrong_tokens_stay_refused(
    gateway: GatewayProcess,
) -> None:
    closed, open_ = gateway.create_session(), gateway.create_session()
    for session in (closed, open_):
        client = openai.OpenAI(
            base_url=session["openai_base_url"], api_key=session["token"], max_retries=0
        )
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    deleted = httpx.delete(
        f"{gateway.control_url}/sessions/{closed['session_id']}", headers=gateway.admin_headers
    )
    assert deleted.status_code == 200
    gateway.kill()
    gateway.start()

    def call(token: str) -> httpx.Response:
        return httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {token}"},
        )

    refused = call(closed["token"])
    assert refused.status_code == 409
    assert refused.json()["error"]["message"] == f"session {closed['session_id']} is closed"
    forged = call(f"{open_['session_id']}.{secrets.token_urlsafe(24)}")
    assert forged.status_code == 401
    assert forged.json()["error"]["message"] == "invalid session token"
    assert len(gateway.trajectory(open_["session_id"])["calls"]) == 1
    assert call(open_["token"]).status_code == 200, "the right token is served"


# -- in-process: what a revived session holds ---------------------------------------------


def chat(url: str, token: str, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": MODEL, "messages": messages},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def held_state(live: Any) -> dict[str, Any]:
    """Everything a live session holds that decides how its next call is planned."""
    segments = [
        {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "touched"}
        for s in live.held
    ]
    recency = [s.segment_id for s in sorted(live.held, key=lambda s: s.touched)]
    return {
        "segments": segments,
        "recency": recency,
        "scenes": live.segment_scenes,
        "last_call": live.last_call,
        "counts": (live.calls, live.failed_calls),
        "answered": live.replies._answered,
    }


def test_a_revived_session_holds_exactly_what_the_live_one_held(
    engine: tuple[ScriptedEngine, BackgroundServer], tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """Realigned echoes, an edited history (fork), two concurrent calls on one segment (the
    late one forks off it) and a failed call: the revived session holds the same."""
    scripted, server = engine
    gw = gateway_factory(server.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    sid, token = session["session_id"], session["token"]
    said = "Hello there."
    talk = [{"role": "user", "content": "hi"}]
    for turn in range(2):
        assert chat(gw.url, token, talk).status_code == 200
        talk += [{"role": "assistant", "content": said}, {"role": "user", "content": f"m{turn}"}]
    assert chat(gw.url, token, [{"role": "user", "content": "edited"}]).status_code == 200
    scripted.delay_s = 1.0
    replies: list[httpx.Response] = []
    racers = [
        threading.Thread(target=lambda: replies.append(chat(gw.url, token, talk))) for _ in range(2)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=60)
    assert [r.status_code for r in replies] == [200, 200]
    scripted.delay_s = 0.0
    server.stop()
    assert chat(gw.url, token, talk).status_code == 503
    with BackgroundServer(scripted.app(), port=server.port):
        trajectory = gw.trajectory(sid)
        assert [c["match"] for c in trajectory["calls"]] == [
            "fork", "realign", "fork", "realign", "fork", "fork",
        ]  # fmt: skip
        assert [c["status"] for c in trajectory["calls"]][-1] == "engine_error"
        assert len(trajectory["segments"]) == 3
        live = held_state(gw.gateway.sessions[sid])

        gw.server.stop()
        restarted = gateway_factory(
            server.url, tiny_model_dir, MODEL, data_dir=gw.gateway.options.data_dir,
            public_url=gw.url,
        )  # fmt: skip
        assert held_state(restarted.gateway.authenticate(token)) == live
        talk += [{"role": "assistant", "content": said}, {"role": "user", "content": "m2"}]
        assert chat(restarted.url, token, talk).status_code == 200
    calls = restarted.trajectory(sid)["calls"]
    # It extends the most recent of the two segments holding this conversation.
    assert calls[-1]["match"] == "realign" and calls[-1]["segment_id"] == calls[4]["segment_id"]


def test_records_of_an_older_gateway_still_revive(
    engine: tuple[ScriptedEngine, BackgroundServer], tiny_model_dir: Path, gateway_factory: Any
) -> None:
    """Records without request digests and echoed history (written before they were kept)
    load and revive: the conversation continues on its segment."""
    _, server = engine
    gw = gateway_factory(server.url, tiny_model_dir, MODEL)
    session = gw.create_session()
    sid, token = session["session_id"], session["token"]
    talk = [{"role": "user", "content": "hi"}]
    for turn in range(3):
        assert chat(gw.url, token, talk).status_code == 200
        talk += [
            {"role": "assistant", "content": "Hello there."},
            {"role": "user", "content": f"more {turn}"},
        ]
    trajectory = gw.trajectory(sid)
    gw.server.stop()
    records = gw.gateway.store.root / sid / "records.jsonl"
    older = []
    for line in records.read_text().splitlines():
        record = json.loads(line)
        record.pop("request_digest", None)
        record.get("normalized", {}).pop("echoed_history", None)
        older.append(json.dumps(record))
    assert "echoed_history" in records.read_text() and "request_digest" in records.read_text()
    records.write_text("".join(f"{line}\n" for line in older))

    restarted = gateway_factory(
        server.url, tiny_model_dir, MODEL, data_dir=gw.gateway.options.data_dir,
        public_url=gw.url,
    )  # fmt: skip
    assert restarted.trajectory(sid) == trajectory
    assert chat(restarted.url, token, talk).status_code == 200
    calls = restarted.trajectory(sid)["calls"]
    assert [c["match"] for c in calls] == ["fork", "realign", "realign", "realign"]
    assert len({c["segment_id"] for c in calls}) == 1
