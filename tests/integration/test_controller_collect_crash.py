"""A worker SIGKILLed while it collects a trajectory: the next attempt of the step starts
once the heartbeat timeout says the worker is gone, not after the step's whole
start-to-close timeout (found by `bench/chaos.py`: rollouts whose worker died mid-collect
finished five minutes late, `collect_s` later).

Real services as in `test_controller.py`; between the worker and the Gateway's control
API sits a forwarding proxy that holds trajectory reads while the test asks it to, so the
worker can be killed exactly mid-collect.
"""

import asyncio
import os
import shutil
import tempfile
import threading
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from temporalio.api.enums.v1 import EventType

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from examples.make_tasks import task as make_task
from rollout_client.client import RolloutClient
from sandboxes.backends.local import LocalBackend
from schemas.tasks import RolloutTask
from tests.fixtures.worker_process import WorkerProcess, one_host_args
from workers.local_stack import start_gateway

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]


class HoldingProxy:
    """Forwards every request to the real Gateway's control API; while `hold` is set, a
    trajectory read waits (and `held` is set) until `hold` is cleared."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.hold = threading.Event()
        self.held = threading.Event()

    def app(self) -> Starlette:
        async def forward(request: Request) -> Response:
            if request.url.path.endswith("/trajectory") and self.hold.is_set():
                self.held.set()
                while self.hold.is_set():
                    await asyncio.sleep(0.05)
            async with httpx.AsyncClient(timeout=60) as client:
                reply = await client.request(
                    request.method,
                    self.target + request.url.path,
                    content=await request.body(),
                    headers={k: v for k, v in request.headers.items() if k != "host"},
                )
            return Response(reply.content, reply.status_code, headers=dict(reply.headers))

        methods = ["GET", "POST", "DELETE"]
        return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


async def test_worker_killed_mid_collect_is_replaced_after_the_heartbeat_timeout(
    temporal_server: TemporalDevServer,
) -> None:
    work = Path(tempfile.mkdtemp(prefix="rollout-collect-crash-", dir="/tmp"))
    work.chmod(0o755)
    model = ensure_tiny_model()
    engine = ScriptedEngine(model / "tokenizer.json", Script(default_reply="42"))
    with BackgroundServer(engine.app()) as engine_server:
        gateway = start_gateway(engine_server.url, model, work / "gateway", "tiny")
        proxy = HoldingProxy(gateway.control_url)
        with BackgroundServer(proxy.app()) as proxy_server:
            worker = WorkerProcess(
                one_host_args(
                    temporal_server.address,
                    "collect-crash",
                    "collect-crash",
                    proxy_server.url,
                    gateway.admin_token,
                    work,
                ),
                work / "worker.log",
                dict(os.environ),
            )
            worker.start()
            try:
                spec = make_task("collect-crash", "What is 6 times 7?", "42", turns=1)
                # collect_s far above the heartbeat timeout: which of the two ends the
                # dead attempt is what this test tells apart
                spec["budget"] = {"heartbeat_s": 3, "collect_s": 90, "host_queue_wait_s": 60}
                client = await RolloutClient.connect(
                    temporal_server.address, task_queue="collect-crash"
                )
                proxy.hold.set()
                batch = await client.submit([RolloutTask.model_validate(spec)], str(work), 1)
                rid = batch.rollout_ids[0]
                assert await asyncio.to_thread(proxy.held.wait, 120), worker.log_tail()
                worker.kill()
                proxy.hold.clear()
                worker.start()
                outcome = await asyncio.wait_for(client.outcome(rid), 180)
                assert outcome.ok, f"{outcome}\n{worker.log_tail()}"
                history = await client.client.get_workflow_handle(rid).fetch_history()
            finally:
                worker.stop()
                gateway.server.stop()
                # nothing may outlive the test, whatever happened above
                await LocalBackend(state_dir=work / "sandboxes").reap(frozenset())
                shutil.rmtree(work)
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "collect_trajectory"
    }
    started = [
        e.activity_task_started_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]
    assert [(s.attempt, s.last_failure.message) for s in started] == [
        (2, "activity Heartbeat timeout")
    ]
