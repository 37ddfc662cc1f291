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

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
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
from starlette.applications import Starlette
from starlette.routing import Mount

from devstack.background_server import BackgroundServer
from devstack.ports import consecutive_free_ports
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.vllm_server import VllmServer, VllmServerConfig
from gateway.engines.vllm_weights import VllmWeightLoader, tensor_shapes
from rollout_client.policy import GatewayPolicyClient, PolicyUpdateError
from schemas.policy import (
    UNKNOWN_WEIGHTS,
    PolicyHeld,
    PolicyState,
    PolicyUpdate,
    PolicyUpdateRecord,
    WeightUpdate,
)
from tests.fixtures.clock import ManualClock
from tests.fixtures.gateway import RecordingProxy
from tests.fixtures.weight_endpoints import (
    FakeVllmDevEndpointsForTests,
    bad_header,
    make_checkpoint,
    truncated,
)
from workers.local_stack import InProcessGateway, start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]


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
) -> Iterator[InProcessGateway]:
    running = start_gateway(
        proxied[1], tiny_model_dir, tmp_path / "gw", engine.model, checkpoint_roots=[tmp_path]
    )
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


def post_policy(gw: InProcessGateway, version: str, ckpt: Path | str) -> httpx.Response:
    return httpx.post(
        f"{gw.control_url}/policy",
        json={"policy_version": version, "checkpoint": str(ckpt)},
        headers=gw.admin_headers,
        timeout=600,
    )


def policy_state(gw: InProcessGateway) -> PolicyState:
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
    gw: InProcessGateway,
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
    gw: InProcessGateway,
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
    gw: InProcessGateway,
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
    assert message.endswith("every engine serves p-good")
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
    assert state.history[1].error == message
    assert [(e.policy_version, e.checkpoint) for e in state.history[1].serving] == [
        ("p-good", str(good))
    ]
    engine = gw.gateway.engine.urls[0]
    assert httpx.get(f"{engine}/weight_info").json() == {"weight_version": "p-good"}
    assert httpx.get(f"{engine}/is_paused").json() == {"is_paused": False}
    assert ask(session, [{"role": "user", "content": "still there?"}])  # the engine lives


def test_updates_are_serialized_and_a_version_names_one_checkpoint(
    gw: InProcessGateway, tiny_model_dir: Path, tmp_path: Path, pool: ThreadPoolExecutor
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


def _healthy(control: str, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, f"gateway exited with {proc.returncode}"
    try:
        return httpx.get(f"{control}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# -------------------------------------- bad input and failures on cue (no vLLM needed)
#
# vLLM cannot be made to fail in the middle of a load on cue (a failed reload kills its
# engine core), so these run the real Gateway in front of the scripted engine with a FAKE
# of vLLM's weight endpoints on the same URL (`FakeVllmDevEndpointsForTests`).


@pytest.fixture
def weights() -> FakeVllmDevEndpointsForTests:
    return FakeVllmDevEndpointsForTests()


@pytest.fixture
def scripted_url(tiny_model_dir: Path, weights: FakeVllmDevEndpointsForTests) -> Iterator[str]:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    app = Starlette(routes=[*weights.routes(), Mount("/", app=engine.app())])
    with BackgroundServer(app) as engine_server:
        yield engine_server.url
        weights.hold.set()


@pytest.fixture
def scripted_gw(
    scripted_url: str, tiny_model_dir: Path, tmp_path: Path
) -> Iterator[InProcessGateway]:
    running = start_gateway(
        scripted_url, tiny_model_dir, tmp_path / "gw", "tiny-qwen3", checkpoint_roots=[tmp_path]
    )
    try:
        yield running
    finally:
        running.server.stop()


def lease_clock(gw: InProcessGateway) -> ManualClock:
    """From now on the leases of `gw` (its pauses for a peer, its holds) run out when the
    test advances this clock."""
    assert gw.app is not None
    clock = ManualClock()
    gw.app.policy.sleep = clock.sleep
    return clock


def call_version(gw: InProcessGateway) -> str | None:
    """A new session's call succeeds; the version it was recorded with."""
    session = gw.create_session(policy_version="label-v0")
    assert ask(session, [{"role": "user", "content": "hi"}]) == "ok"
    [call] = gw.trajectory(session["session_id"])["calls"]
    assert call["status"] == "ok"
    return call["policy_version"]


def test_bad_policy_updates_are_refused_before_anything_pauses(
    scripted_gw: InProcessGateway,
    tiny_model_dir: Path,
    tmp_path: Path,
    weights: FakeVllmDevEndpointsForTests,
) -> None:
    """Each refusal is a JSON error in the control API's shape, names what is wrong (the
    roots, for a path outside them), and leaves no trace: no version set, nothing in the
    history, the gate open, the engine never paused."""
    gw = scripted_gw
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    good = make_checkpoint(tmp_path / "good")
    outside = Path(tempfile.mkdtemp(prefix="rollout-outside-"))
    try:
        cases: list[tuple[Any, dict[str, str], int, str, str | None]] = [
            ({"policy_version": "p", "checkpoint": str(tmp_path / "nope")}, gw.admin_headers,
             404, "does not exist", None),
            ({"policy_version": "p", "checkpoint": "relative/dir"}, gw.admin_headers,
             400, "absolute path", "checkpoint"),
            ({"policy_version": "p", "checkpoint": str(no_weights)}, gw.admin_headers,
             400, "no *.safetensors weights", "checkpoint"),
            ({"policy_version": "p", "checkpoint": truncated(good, tmp_path / "cut")},
             gw.admin_headers, 400, "truncated or padded", "checkpoint"),
            ({"policy_version": "p", "checkpoint": bad_header(tmp_path / "junk")},
             gw.admin_headers, 400, "unreadable safetensors header", "checkpoint"),
            ({"policy_version": "p", "checkpoint": make_checkpoint(outside / "c")},
             gw.admin_headers, 403, f"not under a checkpoint root ({tmp_path})", "checkpoint"),
            ({"policy_version": "p", "checkpoint": str(tiny_model_dir)}, gw.admin_headers,
             403, "not under a checkpoint root", "checkpoint"),
            ({"policy_version": "unknown", "checkpoint": good}, gw.admin_headers,
             400, "reserved", "policy_version"),
            ({"checkpoint": good}, gw.admin_headers, 400, "", "policy_version"),
            ({"policy_version": "", "checkpoint": good}, gw.admin_headers,
             400, "", "policy_version"),
            ({"policy_version": "p", "checkpoint": good, "force": True},
             gw.admin_headers, 400, "", "force"),
            ({"policy_version": "p", "checkpoint": good}, {}, 401, "admin token", None),
        ]  # fmt: skip
        for body, headers, status, text, param in cases:
            reply = httpx.post(f"{gw.control_url}/policy", json=body, headers=headers)
            assert reply.status_code == status, (body, reply.text)
            error = reply.json()["error"]
            assert text in error["message"], (body, error)
            assert error["param"] == param, (body, error)
    finally:
        shutil.rmtree(outside)
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
    assert not gw.gateway.policy.closed and weights.calls == []
    assert json.loads(httpx.get(f"{gw.control_url}/policy").text)["error"]["code"] == (
        "authentication"
    )
    assert post_policy(gw, "p", good).status_code == 200  # the control: a good one loads


def test_a_gateway_without_checkpoint_roots_refuses_every_update(
    scripted_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gw = start_gateway(scripted_url, tiny_model_dir, tmp_path / "gw", "tiny-qwen3")
    try:
        reply = post_policy(gw, "p", make_checkpoint(tmp_path / "c"))
        assert reply.status_code == 403, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["type"], error["param"]) == (
            "forbidden", "permission_error", "checkpoint",
        )  # fmt: skip
        assert "--checkpoint-root" in error["message"]
        client = GatewayPolicyClient(gw.control_url, gw.admin_token)
        update = PolicyUpdate(policy_version="p", checkpoint=str(tmp_path / "c"))
        with pytest.raises(PolicyUpdateError) as refused:
            asyncio.run(client.update(update))
        assert (refused.value.status, refused.value.code) == (403, "forbidden")
    finally:
        gw.server.stop()


def test_an_engine_that_fails_mid_load_leaves_every_call_labelled_truly(
    scripted_gw: InProcessGateway, tmp_path: Path, weights: FakeVllmDevEndpointsForTests
) -> None:
    """The engine fails in the middle of its reload: it is put back on the previous
    checkpoint, the update answers 502 in the control API's shape saying so, the gate is
    open (the next call succeeds, recorded with the version served), and the history
    records the failure. When putting it back fails too, its weights are not known:
    calls on it are labelled `unknown`, never with a version it may not serve."""
    gw = scripted_gw
    v1, v2 = make_checkpoint(tmp_path / "v1"), make_checkpoint(tmp_path / "v2", 2.0)
    assert post_policy(gw, "p-v1", v1).status_code == 200
    assert call_version(gw) == "p-v1"
    weights.fail_reloads = 1
    reply = post_policy(gw, "p-v2", v2)
    assert reply.status_code == 502, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["type"]) == ("engine_bad_reply", "server_error")
    assert "did not load" in error["message"] and "Worker failed" in error["message"]
    assert error["message"].endswith("every engine serves p-v1")
    assert call_version(gw) == "p-v1"
    assert (weights.version, weights.checkpoint, weights.paused) == ("p-v1", v1, False)

    weights.fail_reloads = 2  # the reload and the reload of p-v1 after it
    reply = post_policy(gw, "p-v2", v2)
    assert reply.status_code == 502, reply.text
    assert reply.json()["error"]["message"].endswith(f"every engine serves {UNKNOWN_WEIGHTS}")
    assert call_version(gw) == UNKNOWN_WEIGHTS
    state = policy_state(gw)
    assert [e.policy_version for e in state.engines] == [UNKNOWN_WEIGHTS]
    assert [(r.policy_version, r.status) for r in state.history] == [
        ("p-v1", "ok"), ("p-v2", "failed"), ("p-v2", "failed"),
    ]  # fmt: skip
    assert [r.serving[0].policy_version for r in state.history] == [
        "p-v1", "p-v1", UNKNOWN_WEIGHTS,
    ]  # fmt: skip
    assert post_policy(gw, "p-v2", v2).status_code == 200  # a good load mends it
    assert call_version(gw) == "p-v2"


def test_a_peer_that_errors_fails_the_update_with_every_gate_open(
    scripted_url: str, tiny_model_dir: Path, tmp_path: Path, weights: FakeVllmDevEndpointsForTests
) -> None:
    """Two gateway processes over one engine; the peer refuses the pause (it does not
    take the coordinator's admin token): the update answers 409 naming the peer, no
    engine is touched, both processes serve calls afterwards, the history has it."""
    peer = start_gateway(scripted_url, tiny_model_dir, tmp_path / "gw", "tiny-qwen3")
    coordinator = start_gateway(
        scripted_url, tiny_model_dir, tmp_path / "gw", "tiny-qwen3",
        checkpoint_roots=[tmp_path], peer_control_urls=[peer.control_url],
    )  # fmt: skip
    try:
        reply = post_policy(coordinator, "p-v1", make_checkpoint(tmp_path / "v1"))
        assert reply.status_code == 409, reply.text
        message = reply.json()["error"]["message"]
        assert f"gateway process {peer.control_url} refused pause (401)" in message
        assert message.endswith("every engine serves its starting weights")
        assert weights.calls == []
        assert call_version(coordinator) == call_version(peer) == "label-v0"
        [entry] = policy_state(coordinator).history
        assert (entry.status, entry.error) == ("failed", message)
    finally:
        coordinator.server.stop()
        peer.server.stop()


def test_a_peer_whose_lease_runs_out_takes_the_version_its_engine_serves(
    scripted_gw: InProcessGateway, tmp_path: Path, weights: FakeVllmDevEndpointsForTests
) -> None:
    """A coordinator paused this process for an update to p-v1 and went quiet after the
    engine loaded it: when the lease runs out the process asks the engine, and its next
    call is recorded with p-v1, not the version it served before the pause."""
    gw = scripted_gw
    clock = lease_clock(gw)
    pause = {"update_id": "u1", "lease_s": 0.2, "policy_version": "p-v1", "checkpoint": "/x"}
    reply = httpx.post(f"{gw.control_url}/policy/pause", json=pause, headers=gw.admin_headers)
    assert reply.status_code == 200, reply.text
    weights.version = "p-v1"  # what the quiet coordinator had the engine load
    clock.wait_pending(0.2)
    clock.advance(0.199)
    clock.wait_pending(0.001)
    assert gw.gateway.policy.closed  # control: not before its lease is out
    clock.advance(0.001)
    assert call_version(gw) == "p-v1"  # the call waits at the gate until the lease opens it
    late = httpx.post(
        f"{gw.control_url}/policy/pause", json=pause | {"renew": True}, headers=gw.admin_headers
    )
    assert late.status_code == 409 and "not paused for update u1" in late.text


# ----------------------------------------------- external updates: the trainer syncs itself
#
# verl, slime, SkyRL and OpenRLHF move weights into their engines themselves. The test
# plays that trainer: it holds the Gateway, reloads the engine through vLLM's own dev
# endpoints (what such a trainer's sync does to its vLLM server: pause, load, version,
# resume), and releases the Gateway with the version the engine now serves.


def post_hold(control: str, headers: dict[str, str], update_id: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{control}/policy/hold", json={"update_id": update_id, **body}, headers=headers,
        timeout=600,
    )  # fmt: skip


def post_release(
    control: str, headers: dict[str, str], update_id: str, **body: Any
) -> httpx.Response:
    return httpx.post(
        f"{control}/policy/release", json={"update_id": update_id, **body}, headers=headers,
        timeout=600,
    )  # fmt: skip


def trainer_sync(engine_url: str, version: str, ckpt: Path) -> None:
    """The trainer's own weight sync into its vLLM server (here from a directory through
    vLLM's dev endpoints; verl and SkyRL use NCCL or IPC, which need a GPU)."""
    asyncio.run(
        VllmWeightLoader(engine_url).load(
            WeightUpdate(policy_version=version, checkpoint=str(ckpt))
        )
    )


def test_every_gateway_process_holds_for_a_trainers_own_sync_then_loads_a_checkpoint(
    engine: VllmServer,
    proxied: tuple[RecordingProxy, str],
    tiny_model_dir: Path,
    tmp_path: Path,
    pool: ThreadPoolExecutor,
) -> None:
    """`rollout gateway --processes 2` share the engine. A hold sent to process 1 pauses
    process 0 too and answers only once the call running on process 0 has finished; a
    call arriving meanwhile waits at process 0's gate. The trainer syncs its engine and
    releases with its version: the waiting call is sampled by the new weights and
    recorded with that version, the one that ran before keeps its label, and both
    processes report the external entry. Then a checkpoint update sent to process 1
    pauses process 0 through its control listener, and both record its version."""
    proxy, proxy_url = proxied
    admin = secrets.token_urlsafe(12)
    port = consecutive_free_ports(4)
    cmd = [
        sys.executable, "-m", "workers.cli", "gateway", "--engine", proxy_url,
        "--model", engine.model, "--tokenizer", str(tiny_model_dir), "--port", str(port),
        "--control-port", str(port + 2), "--processes", "2", "--data-dir", str(tmp_path / "gw"),
        "--checkpoint-root", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
    auth = {"Authorization": f"Bearer {admin}"}
    zero, one = f"http://127.0.0.1:{port + 2}", f"http://127.0.0.1:{port + 3}"

    def state(control: str) -> PolicyState:
        reply = httpx.get(f"{control}/policy", headers=auth)
        assert reply.status_code == 200, reply.text
        return PolicyState.model_validate_json(reply.content)

    def session(control: str, label: str) -> dict[str, Any]:
        body = {"rollout_id": f"r-{secrets.token_hex(4)}", "policy_version": label}
        created = httpx.post(f"{control}/sessions", json=body, headers=auth)
        assert created.status_code == 201, created.text
        return created.json()

    def versions(control: str, opened: dict[str, Any]) -> list[str]:
        path = f"{control}/sessions/{opened['session_id']}/trajectory"
        return [c["policy_version"] for c in httpx.get(path, headers=auth).json()["calls"]]

    try:
        for control in (zero, one):
            wait_for(f"{control} healthy", lambda c=control: _healthy(c, proc))
        rollout = session(zero, "p-label")
        first = [{"role": "user", "content": "hello"}]
        reply = ask(rollout, first)
        proxy.hold()
        long_rollout = session(zero, "long-label")
        long_call = pool.submit(ask, long_rollout, [{"role": "user", "content": "write a lot"}])
        wait_for("the long call at the engine", lambda: len(proxy.exchanges) == 2)
        held = pool.submit(post_hold, one, auth, "ext-1", policy_version="p-ext", lease_s=600)
        wait_for("process 0 paused", lambda: state(zero).updating)
        second = pool.submit(
            ask, rollout, [*first, {"role": "assistant", "content": reply},
                           {"role": "user", "content": "and again"}]
        )  # fmt: skip
        wait_for("the next call waiting at process 0", lambda: state(zero).waiting_calls == 1)
        assert not held.done()  # the drain waits for the long call
        proxy.release()
        answer = held.result(timeout=600)
        assert answer.status_code == 200, answer.text
        hold = PolicyHeld.model_validate_json(answer.content)
        assert (hold.processes, hold.drained_calls, hold.previous_version) == (2, 1, None)
        long_call.result(timeout=600)
        assert not second.done() and state(one).held_for == "ext-1"

        trainer_sync(engine.url, "p-ext", checkpoint(tiny_model_dir, tmp_path / "synced"))
        released = post_release(one, auth, "ext-1", policy_version="p-ext")
        assert released.status_code == 200, released.text
        record = PolicyUpdateRecord.model_validate_json(released.content)
        assert (record.kind, record.status, record.policy_version) == ("external", "ok", "p-ext")
        assert (record.checkpoint, record.drained_calls, record.processes) == (None, 1, 2)
        second.result(timeout=600)
        assert versions(zero, rollout) == ["p-label", "p-ext"]
        assert versions(zero, long_rollout) == ["long-label"]
        for control in (zero, one):
            now = state(control)
            assert (now.policy_version, now.updating, now.held_for) == ("p-ext", False, None)
            assert [(r.kind, r.update_id, r.status) for r in now.history] == [
                ("external", "ext-1", "ok")
            ]
            fresh = session(control, "label-v0")
            ask(fresh, [{"role": "user", "content": "hi"}])
            assert versions(control, fresh) == ["p-ext"]
        late = post_release(one, auth, "ext-1", policy_version="p-ext")
        assert late.status_code == 409 and "already ended" in late.json()["error"]["message"]

        ckpt = checkpoint(tiny_model_dir, tmp_path / "ckpt")
        reply = httpx.post(
            f"{one}/policy",
            json={"policy_version": "p-multi", "checkpoint": str(ckpt)},
            headers=auth,
            timeout=600,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["processes"] == 2
        for control in (zero, one):
            now = state(control)
            assert (now.policy_version, now.updating) == ("p-multi", False)
            assert [(r.kind, r.policy_version) for r in now.history] == [
                ("external", "p-ext"), ("checkpoint", "p-multi"),
            ]  # fmt: skip
            fresh = session(control, "label-v0")
            ask(fresh, [{"role": "user", "content": "hi"}])
            assert versions(control, fresh) == ["p-multi"]
    finally:
        proxy.release()
        proc.terminate()
        assert proc.wait(timeout=30) is not None


def test_holds_and_updates_refuse_each_other_and_a_release_names_its_hold(
    scripted_gw: InProcessGateway,
    tmp_path: Path,
    weights: FakeVllmDevEndpointsForTests,
    pool: ThreadPoolExecutor,
) -> None:
    """While a checkpoint update runs, a hold is a 409; while a hold is in force, an
    update and a second hold are 409s, and a release naming another hold, or a version
    loaded from a checkpoint, is a 409 that leaves the hold in force. Every refusal is
    in the control API's error shape."""
    gw = scripted_gw
    v1 = make_checkpoint(tmp_path / "v1")
    weights.hold.clear()  # the engine's reload waits: the update stays running
    update = pool.submit(post_policy, gw, "p-v1", v1)
    wait_for("the reload to start", weights.reloading.is_set)
    during = post_hold(gw.control_url, gw.admin_headers, "h-1")
    assert during.status_code == 409, during.text
    assert "a policy update is running" in during.json()["error"]["message"]
    weights.hold.set()
    assert update.result(timeout=60).status_code == 200

    assert post_hold(gw.control_url, gw.admin_headers, "h-1").status_code == 200
    assert gw.gateway.policy.closed
    refusals = [
        (post_hold(gw.control_url, gw.admin_headers, "h-2"),
         "external update h-1 already holds the policy"),
        (post_policy(gw, "p-v2", make_checkpoint(tmp_path / "v2")),
         "external update h-1 holds the policy"),
        (post_release(gw.control_url, gw.admin_headers, "h-2", policy_version="p-x"),
         "external update h-1 holds the policy, not h-2"),
        (post_release(gw.control_url, gw.admin_headers, "h-1", policy_version="p-v1"),
         f"policy_version p-v1 was loaded from {v1}"),
    ]  # fmt: skip
    for reply, text in refusals:
        assert reply.status_code == 409, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["type"]) == ("conflict", "conflict_error"), error
        assert text in error["message"], error
    bad = [
        ({"update_id": "h-1"}, "give policy_version"),
        ({"update_id": "h-1", "policy_version": "unknown"}, "reserved"),
        ({"update_id": "h 1", "policy_version": "p"}, "pattern"),
    ]
    for body, text in bad:
        reply = httpx.post(f"{gw.control_url}/policy/release", json=body, headers=gw.admin_headers)
        assert reply.status_code == 400 and text in reply.json()["error"]["message"], reply.text
    unauthorised = httpx.post(f"{gw.control_url}/policy/hold", json={"update_id": "h-3"})
    assert unauthorised.json()["error"]["code"] == "authentication"
    assert gw.gateway.policy.closed  # still held after every refusal
    done = post_release(gw.control_url, gw.admin_headers, "h-1", policy_version="p-ext")
    assert done.status_code == 200, done.text
    assert call_version(gw) == "p-ext"
    clash = post_policy(gw, "p-ext", make_checkpoint(tmp_path / "v3"))
    assert clash.status_code == 409 and "synced by the trainer" in clash.text
    history = policy_state(gw).history
    assert [(r.kind, r.policy_version, r.status) for r in history] == [
        ("checkpoint", "p-v1", "ok"), ("external", "p-ext", "ok"),
    ]  # fmt: skip
    assert (history[1].previous_version, history[1].checkpoint) == ("p-v1", None)


def test_a_hold_without_release_ends_on_unknown_and_failures_say_what_serves(
    scripted_gw: InProcessGateway, tmp_path: Path
) -> None:
    """A hold whose lease runs out resumes every call labelled `unknown` (the Gateway
    cannot know whether the sync finished) and the history says so; a late release is
    refused. The client's `external_update` releases with the block's error: a sync that
    failed before touching weights keeps the version served, one that may have changed
    them leaves `unknown`; a clean block labels the next calls with its version."""
    gw = scripted_gw
    clock = lease_clock(gw)
    assert post_hold(gw.control_url, gw.admin_headers, "h-lapse", lease_s=0.3).status_code == 200
    clock.wait_pending(0.3)
    assert gw.gateway.policy.closed
    clock.advance(0.3)
    assert call_version(gw) == UNKNOWN_WEIGHTS  # waits at the gate until the lease opens it
    [expired] = policy_state(gw).history
    assert (expired.kind, expired.status, expired.policy_version) == (
        "external", "expired", UNKNOWN_WEIGHTS,
    )  # fmt: skip
    assert expired.error is not None and "no release within its 0.3s lease" in expired.error
    late = post_release(gw.control_url, gw.admin_headers, "h-lapse", policy_version="p-1")
    assert late.status_code == 409, late.text
    assert "has already ended: expired" in late.json()["error"]["message"]

    client = GatewayPolicyClient(gw.control_url, gw.admin_token)

    async def trainer() -> list[str | None]:
        seen: list[str | None] = []
        async with client.external_update("p-1") as update:
            assert update.held.previous_version == UNKNOWN_WEIGHTS
        assert update.record is not None and update.record.status == "ok"
        seen.append(await asyncio.to_thread(call_version, gw))
        with pytest.raises(RuntimeError, match="NCCL group not ready"):
            async with client.external_update("p-2") as update:
                update.touched = False
                raise RuntimeError("NCCL group not ready")
        seen.append(await asyncio.to_thread(call_version, gw))
        with pytest.raises(RuntimeError, match="rank 3 died"):
            async with client.external_update("p-3"):
                raise RuntimeError("rank 3 died")
        seen.append(await asyncio.to_thread(call_version, gw))
        return seen

    assert asyncio.run(trainer()) == ["p-1", "p-1", UNKNOWN_WEIGHTS]
    history = policy_state(gw).history
    assert [(r.policy_version, r.status) for r in history[1:]] == [
        ("p-1", "ok"), ("p-2", "failed"), ("p-3", "failed"),
    ]  # fmt: skip
    assert history[2].error is not None and "NCCL group not ready" in history[2].error
    assert history[2].error.endswith("every engine serves p-1")
    assert history[3].error is not None and history[3].error.endswith(
        f"every engine serves {UNKNOWN_WEIGHTS}"
    )


def test_a_gateway_sigkilled_while_holding_restarts_labelling_its_engine_unknown(
    scripted_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`rollout gateway` loads p-v1, then holds the policy for a trainer's sync and is
    SIGKILLed. Restarted on the same data dir and port, it cannot know whether the sync
    ran: its engine is `unknown` (not p-v1), calls are recorded so, and the history has
    the hold as failed, saying why. The control: restarted after an update that ended,
    the process labels calls with the version it loaded."""
    admin = secrets.token_urlsafe(12)
    auth = {"Authorization": f"Bearer {admin}"}
    port = consecutive_free_ports(2)
    control = f"http://127.0.0.1:{port + 1}"
    cmd = [
        sys.executable, "-m", "workers.cli", "gateway", "--engine", scripted_url,
        "--model", "tiny-qwen3", "--tokenizer", str(tiny_model_dir), "--port", str(port),
        "--control-port", str(port + 1), "--data-dir", str(tmp_path / "gw"),
        "--checkpoint-root", str(tmp_path), "--tokenize-offload-chars", "0",
    ]  # fmt: skip

    def started() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
        wait_for("gateway healthy", lambda: _healthy(control, proc))
        return proc

    def recorded_version() -> str:
        body = {"rollout_id": f"r-{secrets.token_hex(4)}", "policy_version": "label"}
        opened = httpx.post(f"{control}/sessions", json=body, headers=auth).json()
        assert ask(opened, [{"role": "user", "content": "hi"}]) == "ok"
        path = f"{control}/sessions/{opened['session_id']}/trajectory"
        [call] = httpx.get(path, headers=auth).json()["calls"]
        return str(call["policy_version"])

    proc = started()
    try:
        ckpt = make_checkpoint(tmp_path / "v1")
        loaded = httpx.post(
            f"{control}/policy", json={"policy_version": "p-v1", "checkpoint": ckpt},
            headers=auth, timeout=60,
        )  # fmt: skip
        assert loaded.status_code == 200, loaded.text
        proc.kill()  # SIGKILL after an update that ended
        proc.wait(30)
        proc = started()
        assert recorded_version() == "p-v1"  # control
        held = post_hold(control, auth, "ext-1", policy_version="p-v2")
        assert held.status_code == 200, held.text
        proc.kill()  # SIGKILL while the trainer may be syncing
        proc.wait(30)
        proc = started()
        assert recorded_version() == UNKNOWN_WEIGHTS
        reply = httpx.get(f"{control}/policy", headers=auth)
        state = PolicyState.model_validate_json(reply.content)
        assert [e.policy_version for e in state.engines] == [UNKNOWN_WEIGHTS]
        last = state.history[-1]
        assert (last.update_id, last.kind, last.status) == ("ext-1", "external", "failed")
        assert last.error is not None and "stopped in its middle" in last.error
        released = post_release(control, auth, "ext-1", policy_version="p-v2")
        assert released.status_code == 409  # the hold ended with the process
    finally:
        proc.kill()
        proc.wait(30)
