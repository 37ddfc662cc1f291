"""What vLLM CPU cannot show: a policy update over two engines where the second refuses
the checkpoint after the first loaded it. vLLM 0.32 dies when its reload fails, and two
vLLM servers do not fit this machine's tests, so the engines here are HTTP stand-ins of
vLLM's dev endpoints (`FakeVllmDevEndpointsForTests`); the updater, its loader and the
gate are the real ones, over real HTTP."""

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from devstack.background_server import BackgroundServer
from gateway.engines.policy_update import PolicyGate, PolicyUpdater
from gateway.errors import GatewayError
from schemas.policy import PeerPause, PeerResume, PolicyUpdate


@dataclass
class FakeVllmDevEndpointsForTests:
    """FAKE: vLLM's weight endpoints (pause, collective_rpc reload_weights, reset prefix
    cache, update_weight_version, resume, weight_info), keeping the loaded checkpoint;
    `refuse` makes every reload fail like a worker error (500). No completions."""

    refuse: bool = False
    version: str = "default"
    checkpoint: str | None = None
    paused: bool = False
    calls: list[str] = field(default_factory=list)

    def app(self) -> Starlette:
        async def endpoint(request: Request) -> JSONResponse:
            path = request.url.path
            self.calls.append(path)
            if path == "/v1/models":
                return JSONResponse({"data": [{"id": "m"}]})
            if path == "/weight_info":
                return JSONResponse({"weight_version": self.version})
            if path in ("/pause", "/resume"):
                self.paused = path == "/pause"
                return JSONResponse({})
            body = await request.json() if path != "/reset_prefix_cache" else {}
            if path == "/collective_rpc":
                if self.refuse:
                    return JSONResponse({"error": {"message": "Worker failed"}}, 500)
                self.checkpoint = body["kwargs"]["weights_path"]
            elif path == "/update_weight_version":
                self.version = body["new_version"]
            return JSONResponse({})

        paths = ["/v1/models", "/weight_info", "/pause", "/resume", "/collective_rpc",
                 "/reset_prefix_cache", "/update_weight_version"]  # fmt: skip
        return Starlette(routes=[Route(p, endpoint, methods=["GET", "POST"]) for p in paths])


def make_checkpoint(where: Path) -> str:
    where.mkdir()
    (where / "config.json").write_text("{}")
    (where / "model.safetensors").write_bytes(b"")
    return str(where)


def test_engines_that_loaded_go_back_when_another_refuses(tmp_path: Path) -> None:
    """Two engines on v-old; the update to v-new: engine 1 loads it, engine 2 refuses.
    The update fails naming engine 2, engine 1 is put back on v-old's checkpoint, both
    serve v-old and are resumed, the gate is open and the gateway's version is v-old."""
    first, second = FakeVllmDevEndpointsForTests(), FakeVllmDevEndpointsForTests()
    old, new = make_checkpoint(tmp_path / "old"), make_checkpoint(tmp_path / "new")
    with BackgroundServer(first.app()) as one, BackgroundServer(second.app()) as two:
        gate = PolicyGate()
        updater = PolicyUpdater(gate, [one.url, two.url], tmp_path / "gw")

        async def run() -> GatewayError:
            await updater.update(PolicyUpdate(policy_version="v-old", checkpoint=old))
            second.refuse = True
            with pytest.raises(GatewayError) as failed:
                await updater.update(PolicyUpdate(policy_version="v-new", checkpoint=new))
            return failed.value

        error = asyncio.run(run())
    assert error.status == 502
    assert f"engine {two.url} did not load {new}" in error.message
    assert error.message.endswith("every engine serves v-old again")
    assert (first.version, first.checkpoint, first.paused) == ("v-old", old, False)
    assert (second.version, second.checkpoint, second.paused) == ("v-old", old, False)
    assert (gate.version, gate.closed) == ("v-old", False)
    history = updater.history()
    assert [(r.policy_version, r.status) for r in history] == [("v-old", "ok"), ("v-new", "failed")]
    assert [e.engine for e in history[1].engines] == [one.url]


def test_a_restarted_gateway_serves_the_last_applied_version(tmp_path: Path) -> None:
    """The history is on the data dir: a new process (or a restarted one) starts on the
    last version applied, not on the sessions' labels."""
    engine = FakeVllmDevEndpointsForTests()
    ckpt = make_checkpoint(tmp_path / "ckpt")
    with BackgroundServer(engine.app()) as server:
        updater = PolicyUpdater(PolicyGate(), [server.url], tmp_path / "gw")
        asyncio.run(updater.update(PolicyUpdate(policy_version="v7", checkpoint=ckpt)))
    again = PolicyUpdater(PolicyGate(), [server.url], tmp_path / "gw")
    assert (again.gate.version, again.checkpoint) == ("v7", ckpt)


def test_the_gate_holds_new_calls_until_running_ones_have_drained() -> None:
    """Order: a call admitted before the update runs on; the gate closes; a new call
    waits (held, not failed); the drain ends only when the running call ends; after
    `open` the held call is admitted with the version set meanwhile."""

    async def run() -> list[str]:
        gate, events = PolicyGate("v1"), []
        release = asyncio.Event()

        async def running() -> None:
            async with gate.admitted() as version:
                events.append(f"running on {version}")
                await release.wait()
            events.append("running done")

        async def later() -> None:
            async with gate.admitted() as version:
                events.append(f"held call on {version}")

        first = asyncio.create_task(running())
        await asyncio.sleep(0)
        drain = asyncio.create_task(gate.close_and_drain(5))
        await asyncio.sleep(0)
        held = asyncio.create_task(later())
        await asyncio.sleep(0.01)
        events.append(f"held={gate.held} drained={drain.done()}")
        release.set()
        drained, _ = await drain
        events.append(f"drained {drained}")
        gate.version = "v2"
        gate.open()
        await asyncio.gather(first, held)
        return events

    assert asyncio.run(run()) == [
        "running on v1",
        "held=1 drained=False",
        "running done",
        "drained 1",
        "held call on v2",
    ]


def test_a_peer_whose_coordinator_never_resumes_it_resumes_by_itself(tmp_path: Path) -> None:
    """A process paused for another process's update refuses a second pause (409, no
    deadlock between two coordinators) and, when no resume comes within its lease,
    opens its gate again on the version the shared history names."""

    async def run() -> None:
        updater = PolicyUpdater(PolicyGate("v1"), [], tmp_path)
        paused = await updater.pause_for_peer(PeerPause(update_id="u1", lease_s=0.05))
        assert paused.drained_calls == 0
        assert updater.gate.closed and updater.state().updating
        with pytest.raises(GatewayError, match="already in a policy update") as second:
            await updater.pause_for_peer(PeerPause(update_id="u2"))
        assert second.value.status == 409
        with pytest.raises(GatewayError, match="not paused for update u2"):
            updater.resume_for_peer(PeerResume(update_id="u2", policy_version="v2"))
        for _ in range(500):
            if not updater.gate.closed:
                break
            await asyncio.sleep(0.01)
        assert (updater.gate.closed, updater.gate.version, updater.state().updating) == (
            False,
            "v1",
            False,
        )

    asyncio.run(run())
