"""The control listener keeps answering while the agent listener's loop is busy: it is
served from its own thread and event loop (`workers.gateway_server.Listeners`), and hands
what touches the core's asyncio state (sessions, the policy gate) to the agent loop.

The agent loop is blocked on purpose (a callback that waits on an event), so nothing on
it can answer until the test lets it go; no test here depends on how fast anything is.
The control case serves the control listener on the agent loop (`control_own_loop`
off, as before) and shows the same block does hold `/health` there.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from workers import gateway_server
from workers.gateway_server import GatewaySettings, Listeners

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen3"


class Served:
    """A gateway process's listeners served from a thread of this test, as `serve`
    serves them (the agent loop is the thread's own)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.listeners = Listeners(settings)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(self.listeners.serve(),), daemon=True
        )
        self.thread.start()
        self.agent = f"http://127.0.0.1:{self.listeners.port('agent')}"
        self.control = f"http://127.0.0.1:{self.listeners.port('control')}"
        for _ in range(600):
            try:
                if httpx.get(f"{self.control}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            threading.Event().wait(0.05)
        else:
            raise AssertionError("the control listener never answered /health")
        self.release = threading.Event()

    def block_agent_loop(self) -> None:
        """Until `release` is set, the agent loop runs nothing else."""
        blocked = threading.Event()

        def hold() -> None:
            blocked.set()
            self.release.wait()

        self.loop.call_soon_threadsafe(hold)
        assert blocked.wait(30)

    def stop(self) -> None:
        self.release.set()
        self.listeners.stop()
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def engine_url(tiny_model_dir: Path) -> Iterator[str]:
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    with BackgroundServer(engine.app()) as server:
        yield server.url


def served(engine_url: str, model_dir: Path, data_dir: Path, own_loop: bool) -> Served:
    return Served(
        GatewaySettings(
            engine_urls=[engine_url],
            model=MODEL,
            tokenizer=model_dir,
            data_dir=data_dir,
            insecure_dev=True,
            port=0,
            control_port=0,
            control_own_loop=own_loop,
        )
    )


def test_the_control_api_answers_while_the_agent_loop_is_blocked(
    engine_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    gw = served(engine_url, tiny_model_dir, tmp_path, own_loop=True)
    pool = ThreadPoolExecutor(4)
    try:
        created = httpx.post(f"{gw.control}/sessions", json={"rollout_id": "r"}, timeout=30)
        assert created.status_code == 201, created.text
        token, sid = created.json()["token"], created.json()["session_id"]
        gw.block_agent_loop()
        for path in ("/health", "/policy", "/metrics", f"/sessions/{sid}"):
            reply = httpx.get(f"{gw.control}{path}", timeout=30)
            assert reply.status_code == 200, (path, reply.text)
        assert "rollout_gateway" in httpx.get(f"{gw.control}/metrics", timeout=30).text
        # What needs the core waits for the agent loop, and so does the agent API itself.
        create: Future[httpx.Response] = pool.submit(
            httpx.post, f"{gw.control}/sessions", json={"rollout_id": "r2"}, timeout=60
        )
        models: Future[httpx.Response] = pool.submit(
            httpx.get, f"{gw.agent}/v1/models", headers={"authorization": f"Bearer {token}"}
        )
        assert httpx.get(f"{gw.control}/health", timeout=30).status_code == 200
        assert not create.done() and not models.done(), "the agent loop is held"
        gw.release.set()
        assert create.result(60).status_code == 201
        assert models.result(60).status_code == 200
        assert httpx.get(f"{gw.control}/health", timeout=30).json()["sessions"] == 2
    finally:
        gw.stop()
        pool.shutdown()


def test_control_on_the_agent_loop_is_held_by_the_same_block(
    engine_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The control case: what the test above shows is the control listener's own loop."""
    gw = served(engine_url, tiny_model_dir, tmp_path, own_loop=False)
    try:
        assert httpx.get(f"{gw.control}/health", timeout=30).status_code == 200
        gw.block_agent_loop()
        with pytest.raises(httpx.TimeoutException):
            httpx.get(f"{gw.control}/health", timeout=1)
        gw.release.set()
        assert httpx.get(f"{gw.control}/health", timeout=30).status_code == 200
    finally:
        gw.stop()


def test_a_stop_ends_both_listeners_without_waiting_for_their_tick(
    engine_url: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle listeners wake once per `TICK_S`; a stop (here from another thread, as a
    signal's handler or a test does it) wakes both at once. With a tick of an hour, a stop
    that waited for the tick would leave the serving thread running past the join."""
    monkeypatch.setattr(gateway_server, "TICK_S", 3600.0)
    gw = served(engine_url, tiny_model_dir, tmp_path, own_loop=True)
    # the first tick set the Date header before serving
    assert httpx.get(f"{gw.agent}/v1/models").headers["date"].endswith(" GMT")
    gw.listeners.stop()
    gw.thread.join(30)
    assert not gw.thread.is_alive()
    gw.loop.close()
