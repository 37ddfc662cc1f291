"""The Gateway's policy update (`POST /policy`) on the real parts: the Gateway over HTTP
in front of vLLM CPU (dev endpoints on, float32) serving the tiny model, agents through
the OpenAI SDK. An update pauses new engine calls (they wait), drains the running ones,
has the engine reload the checkpoint in place, and resumes; every recorded call names
the version that sampled it, also in a conversation that spans the update.

The in-flight call that keeps the drain open is held between engine and Gateway by a
forwarding proxy until the test releases it; the tests read the Gateway's own gate (in
this process) to know when the update holds the gate and when a call waits at it, so no
step depends on how fast the engine is.
"""

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from safetensors.numpy import save_file

from devstack.background_server import BackgroundServer
from devstack.ports import consecutive_free_ports
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.vllm_server import VllmServer, VllmServerConfig
from gateway.engines.vllm_weights import tensor_shapes
from schemas.policy import PolicyState, PolicyUpdateRecord
from tests.fixtures.gateway import RecordingProxy, RunningGateway, start_gateway

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[VllmServer]:
    server = VllmServer(VllmServerConfig.trainable(tiny_model_dir)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxied(engine: VllmServer) -> Iterator[tuple[RecordingProxy, str]]:
    """The proxy between Gateway and engine (to hold a call in flight) and its URL."""
    forwarding = RecordingProxy(engine.url)
    with BackgroundServer(forwarding.app()) as server:
        yield forwarding, server.url
        forwarding.release()


@pytest.fixture
def proxy(proxied: tuple[RecordingProxy, str]) -> RecordingProxy:
    return proxied[0]


@pytest.fixture
def gw(
    engine: VllmServer, proxied: tuple[RecordingProxy, str], tiny_model_dir: Path, tmp_path: Path
) -> Iterator[RunningGateway]:
    running = start_gateway(proxied[1], tiny_model_dir, tmp_path / "gw", engine.model)
    try:
        yield running
    finally:
        running.server.stop()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def checkpoint(model_dir: Path, where: Path) -> Path:
    """A copy of the served model: a checkpoint the engine can reload."""
    shutil.copytree(model_dir, where)
    return where


def wrong_shapes(model_dir: Path, where: Path) -> Path:
    """A checkpoint whose embedding has the wrong shape (everything else is intact)."""
    shutil.copytree(model_dir, where)
    (where / "model.safetensors").unlink()
    shapes = tensor_shapes(model_dir)
    tensors = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
    tensors["model.embed_tokens.weight"] = np.zeros((7, 3), np.float32)
    save_file(tensors, str(where / "model.safetensors"))
    return where


def post_policy(gw: RunningGateway, version: str, ckpt: Path | str) -> httpx.Response:
    return httpx.post(
        f"{gw.control_url}/policy",
        json={"policy_version": version, "checkpoint": str(ckpt)},
        headers=gw.admin_headers,
        timeout=600,
    )


def policy_state(gw: RunningGateway) -> PolicyState:
    reply = httpx.get(f"{gw.control_url}/policy", headers=gw.admin_headers)
    assert reply.status_code == 200, reply.text
    return PolicyState.model_validate_json(reply.content)


def agent(session: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["openai_base_url"], api_key=session["token"])


def ask(session: dict[str, Any], messages: list[dict[str, str]], max_tokens: int = 8) -> str:
    reply = agent(session).chat.completions.create(
        model="tiny-qwen3", messages=messages, max_tokens=max_tokens, temperature=1.0, timeout=600
    )
    return reply.choices[0].message.content or ""


def wait_for(what: str, condition: Callable[[], bool], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for: {what}"
        time.sleep(0.02)


def update_mid_conversation(
    gw: RunningGateway,
    proxy: RecordingProxy,
    pool: ThreadPoolExecutor,
    version: str,
    ckpt: Path,
) -> tuple[dict[str, Any], Future[str], Future[str], httpx.Response]:
    """A rollout has its first call sampled; then another rollout's call is held in flight
    (by the proxy) while the update closes the gate and drains it, and the first rollout's
    next call arrives and waits at the gate; then the held call is let go. Returns the
    rollout's session, both calls and the update's reply."""
    session = gw.create_session(policy_version="p-label")
    first = [{"role": "user", "content": "hello"}]
    reply = ask(session, first)
    gate = gw.gateway.policy
    proxy.hold()
    long_session = gw.create_session(policy_version="long-label")
    long_call = pool.submit(ask, long_session, [{"role": "user", "content": "write a lot"}])
    wait_for("the long call in flight", lambda: gate.inflight == 1)
    update = pool.submit(post_policy, gw, version, ckpt)
    wait_for("the update to close the gate", lambda: gate.closed)
    assert not long_call.done()  # the drain waits for it
    second = pool.submit(
        ask, session, [*first, {"role": "assistant", "content": reply},
                       {"role": "user", "content": "and again"}]
    )  # fmt: skip
    wait_for("the next call to wait at the gate", lambda: gate.held == 1)
    assert not second.done() and not update.done()
    proxy.release()
    return session, long_call, second, update.result(timeout=600)


def test_a_conversation_spanning_an_update_records_each_calls_version(
    gw: RunningGateway,
    proxy: RecordingProxy,
    tiny_model_dir: Path,
    tmp_path: Path,
    pool: ThreadPoolExecutor,
) -> None:
    """A rollout's first call is sampled before the update; the update waits for a
    running call (drain) while the rollout's next call arrives and waits at the gate;
    then the engine reloads, that call is sampled and recorded with the new version,
    in the same segment, which says where each call's tokens start."""
    session, long_call, second, done = update_mid_conversation(
        gw, proxy, pool, "p-new", checkpoint(tiny_model_dir, tmp_path / "ckpt-new")
    )
    assert done.status_code == 200, done.text
    record = PolicyUpdateRecord.model_validate_json(done.content)
    assert (record.status, record.policy_version, record.previous_version) == ("ok", "p-new", None)
    assert (record.drained_calls, record.held_calls, record.processes) == (1, 1, 1)
    assert [e.method for e in record.engines] == ["reload"]
    second.result(timeout=600)
    long_call.result(timeout=600)
    trajectory = gw.trajectory(session["session_id"])
    assert [c["policy_version"] for c in trajectory["calls"]] == ["p-label", "p-new"]
    assert [c["status"] for c in trajectory["calls"]] == ["ok", "ok"]
    [segment] = trajectory["segments"]
    first_call, second_call = trajectory["calls"]
    assert segment["call_ids"] == [first_call["call_id"], second_call["call_id"]]
    start = segment["call_starts"][1]
    assert segment["response_ids"][start:] == second_call["output_ids"]
    assert segment["response_ids"][: len(first_call["output_ids"])] == first_call["output_ids"]
    state = policy_state(gw)
    assert (state.policy_version, state.updating) == ("p-new", False)
    assert httpx.get(f"{gw.gateway.engine.urls[0]}/weight_info").json() == {
        "weight_version": "p-new"
    }


def test_an_engine_that_cannot_load_leaves_the_old_policy_serving(
    gw: RunningGateway,
    proxy: RecordingProxy,
    tiny_model_dir: Path,
    tmp_path: Path,
    pool: ThreadPoolExecutor,
) -> None:
    """A checkpoint with a wrong-shaped embedding: the update pauses and drains as
    always, then the engine's load is refused (it would kill vLLM's engine core), the
    update fails with a 502 that says why and that the old version still serves, and
    the calls that waited are then sampled by the old version. Nothing recorded is lost."""
    good = checkpoint(tiny_model_dir, tmp_path / "ckpt-good")
    assert post_policy(gw, "p-good", good).status_code == 200
    session, long_call, second, failed = update_mid_conversation(
        gw, proxy, pool, "p-bad", wrong_shapes(tiny_model_dir, tmp_path / "ckpt-bad")
    )
    assert failed.status_code == 502, failed.text
    message = failed.json()["error"]["message"]
    assert "engine" in message and "does not fit the served model" in message
    assert "model.embed_tokens.weight [7, 3]" in message
    assert message.endswith("every engine still serves p-good")
    second.result(timeout=600)
    long_call.result(timeout=600)
    trajectory = gw.trajectory(session["session_id"])
    assert [(c["policy_version"], c["status"]) for c in trajectory["calls"]] == [
        ("p-good", "ok"),
        ("p-good", "ok"),
    ]
    state = policy_state(gw)
    assert (state.policy_version, state.checkpoint) == ("p-good", str(good))
    assert [(r.policy_version, r.status) for r in state.history] == [
        ("p-good", "ok"),
        ("p-bad", "failed"),
    ]
    assert (state.history[1].drained_calls, state.history[1].held_calls) == (1, 1)
    engine = gw.gateway.engine.urls[0]
    assert httpx.get(f"{engine}/weight_info").json() == {"weight_version": "p-good"}
    assert httpx.get(f"{engine}/is_paused").json() == {"is_paused": False}
    assert ask(session, [{"role": "user", "content": "still there?"}])  # the engine lives


def test_updates_are_serialized_and_a_version_names_one_checkpoint(
    gw: RunningGateway, tiny_model_dir: Path, tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    """Two updates sent together both succeed, one after the other (the second starts
    once the first has finished); repeating the serving version is a no-op; naming it
    with another checkpoint is a 409."""
    a = checkpoint(tiny_model_dir, tmp_path / "a")
    b = checkpoint(tiny_model_dir, tmp_path / "b")
    sent = [pool.submit(post_policy, gw, "p-a", a), pool.submit(post_policy, gw, "p-b", b)]
    replies = [f.result(timeout=600) for f in sent]
    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    history = policy_state(gw).history
    first, second = history
    assert second.started_at.timestamp() >= first.started_at.timestamp() + first.total_s - 0.01
    assert second.previous_version == first.policy_version
    serving = second.policy_version
    again = post_policy(gw, serving, second.checkpoint)
    assert again.status_code == 200 and again.json()["status"] == "unchanged"
    clash = post_policy(gw, serving, str(a if serving == "p-b" else b))
    assert clash.status_code == 409, clash.text
    assert "a version names one checkpoint" in clash.json()["error"]["message"]


def test_every_gateway_process_ends_on_the_new_version(
    engine: VllmServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`--processes 2` share the engine: an update sent to process 1 pauses process 0
    too (through its control listener), and both then report and record the new
    version."""
    admin = secrets.token_urlsafe(12)
    port = consecutive_free_ports(4)
    cmd = [
        sys.executable, "-m", "workers.cli", "gateway", "--engine", engine.url,
        "--model", engine.model, "--tokenizer", str(tiny_model_dir), "--port", str(port),
        "--control-port", str(port + 2), "--processes", "2",
        "--data-dir", str(tmp_path / "gw"),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
    auth = {"Authorization": f"Bearer {admin}"}
    controls = [f"http://127.0.0.1:{port + 2}", f"http://127.0.0.1:{port + 3}"]
    try:
        for control in controls:
            wait_for(f"{control} healthy", lambda c=control: _healthy(c, proc))
        ckpt = checkpoint(tiny_model_dir, tmp_path / "ckpt")
        reply = httpx.post(
            f"{controls[1]}/policy",
            json={"policy_version": "p-multi", "checkpoint": str(ckpt)},
            headers=auth,
            timeout=600,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["processes"] == 2
        for control in controls:
            state = httpx.get(f"{control}/policy", headers=auth).json()
            assert (state["policy_version"], state["updating"]) == ("p-multi", False)
            created = httpx.post(f"{control}/sessions", json={"rollout_id": "r"}, headers=auth)
            ask(created.json(), [{"role": "user", "content": "hi"}])
            calls = httpx.get(
                f"{control}/sessions/{created.json()['session_id']}/trajectory", headers=auth
            ).json()["calls"]
            assert [c["policy_version"] for c in calls] == ["p-multi"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) is not None


def _healthy(control: str, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, f"gateway exited with {proc.returncode}"
    try:
        return httpx.get(f"{control}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# ------------------------------------------------------------- bad input (no vLLM needed)


@pytest.fixture
def scripted_gw(tiny_model_dir: Path, tmp_path: Path) -> Iterator[RunningGateway]:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    with BackgroundServer(engine.app()) as engine_server:
        running = start_gateway(engine_server.url, tiny_model_dir, tmp_path / "gw", "tiny-qwen3")
        try:
            yield running
        finally:
            running.server.stop()


def test_bad_policy_updates_are_refused_before_anything_pauses(
    scripted_gw: RunningGateway, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Each refusal is a JSON error in the control API's shape, names what is wrong,
    and leaves no trace: no version set, nothing in the history, the gate open."""
    gw = scripted_gw
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    cases: list[tuple[Any, dict[str, str], int, str, str | None]] = [
        ({"policy_version": "p", "checkpoint": str(tmp_path / "nope")}, gw.admin_headers,
         404, "does not exist", None),
        ({"policy_version": "p", "checkpoint": "relative/dir"}, gw.admin_headers,
         400, "absolute path", "checkpoint"),
        ({"policy_version": "p", "checkpoint": str(no_weights)}, gw.admin_headers,
         400, "no *.safetensors weights", "checkpoint"),
        ({"checkpoint": str(tiny_model_dir)}, gw.admin_headers, 400, "", "policy_version"),
        ({"policy_version": "", "checkpoint": str(tiny_model_dir)}, gw.admin_headers,
         400, "", "policy_version"),
        ({"policy_version": "p", "checkpoint": str(tiny_model_dir), "force": True},
         gw.admin_headers, 400, "", "force"),
        ({"policy_version": "p", "checkpoint": str(tiny_model_dir)}, {}, 401, "admin token",
         None),
    ]  # fmt: skip
    for body, headers, status, text, param in cases:
        reply = httpx.post(f"{gw.control_url}/policy", json=body, headers=headers)
        assert reply.status_code == status, (body, reply.text)
        error = reply.json()["error"]
        assert text in error["message"], (body, error)
        assert error["param"] == param, (body, error)
    not_json = httpx.post(
        f"{gw.control_url}/policy", content=b"{", headers=gw.admin_headers | {
            "content-type": "application/json"}
    )  # fmt: skip
    assert not_json.status_code == 400 and "error" in not_json.json()
    resume = httpx.post(
        f"{gw.control_url}/policy/resume", json={"update_id": "u1"}, headers=gw.admin_headers
    )
    assert resume.status_code == 409 and "not paused" in resume.json()["error"]["message"]
    state = policy_state(gw)
    assert (state.policy_version, state.updating, state.history) == (None, False, [])
    assert not gw.gateway.policy.closed
    assert json.loads(httpx.get(f"{gw.control_url}/policy").text)["error"]["code"] == (
        "authentication"
    )
