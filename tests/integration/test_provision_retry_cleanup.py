"""A provision whose first attempt fails after creating its sandbox, and whose retry
lands on another host, leaves no sandbox behind: the real provision/destroy activities
of two sandbox hosts (each with its own real local backend), the real workflow, the
real Temporal dev server. Session, agent run and collect are stand-ins (as in
test_controller_logic.py): this test is about where sandboxes live and die.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError
from temporalio.worker import FixedSizeSlotSupplier, Worker, WorkerTuner

from activities.sandbox import HostCapacity, SandboxActivities, SandboxBackends
from devstack.temporal_dev_server import TemporalDevServer
from schemas.client import RolloutClient, connect
from schemas.outcome import AgentResult, RolloutStatus, RunOutcome
from schemas.rollout import (
    CLOSE_SESSION,
    COLLECT_TRAJECTORY,
    CREATE_SESSION,
    DESTROY_SANDBOX,
    PROVISION_SANDBOX,
    RUN_HARNESS,
    CloseSessionRequest,
    CollectRequest,
    HarnessRequest,
    ProvisionRequest,
    QueueNames,
    SamplesSummary,
    SandboxRef,
    SessionRef,
    SessionRequest,
)
from schemas.tasks import RolloutTask
from workflows.rollout import RolloutWorkflow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


class FailFirstAttemptAfterCreateForTests(SandboxActivities):
    """The real provision, then a failure on the activity's first attempt — as if the
    host crashed or lost the server between creating the sandbox and reporting it."""

    @activity.defn(name=PROVISION_SANDBOX)
    async def provision_sandbox(self, req: ProvisionRequest) -> SandboxRef:
        ref = await super().provision_sandbox(req)
        if activity.info().attempt == 1:
            raise ApplicationError("host lost after create (forced by the test)")
        return ref


class StandInsForTests:
    """Session, agent run and collect stand-ins: not what this test is about."""

    def __init__(self, queues: QueueNames) -> None:
        self.queues = queues
        self.ran_on: list[str] = []

    @activity.defn(name=CREATE_SESSION)
    async def create_session(self, req: SessionRequest) -> SessionRef:
        return SessionRef(
            session_id=f"s-{req.attempt}",
            token="t",
            openai_base_url="http://127.0.0.1:9/v1",
            anthropic_base_url="http://127.0.0.1:9",
            gateway_url="http://127.0.0.1:9",
            owner_queue=self.queues.gateway_owner("gw"),
        )

    @activity.defn(name=RUN_HARNESS)
    async def run_harness(self, req: HarnessRequest) -> RunOutcome:
        self.ran_on.append(req.sandbox.host)
        return RunOutcome(
            status=RolloutStatus.ok,
            agent=AgentResult(harness="command", harness_version="1", exit_code=0),
            harness="command",
            harness_version="1",
            reward_fn_version="none",
        )

    @activity.defn(name=COLLECT_TRAJECTORY)
    async def collect_trajectory(self, req: CollectRequest) -> SamplesSummary:
        return SamplesSummary(uri=None, session_closed=True)

    @activity.defn(name=CLOSE_SESSION)
    async def close_session(self, req: CloseSessionRequest) -> None:
        return None


@pytest.fixture
async def two_hosts(
    temporal_server: TemporalDevServer, sandbox_state_dir: Path, sandbox_base_image: Any
) -> AsyncIterator[tuple[RolloutClient, dict[str, SandboxBackends], StandInsForTests]]:
    base = f"leak-{uuid.uuid4().hex[:8]}"
    client = await RolloutClient.connect(temporal_server.address, task_queue=base)
    q = QueueNames(base=base)
    stand_ins = StandInsForTests(q)
    c = client.client
    backends: dict[str, SandboxBackends] = {}
    workers = [
        Worker(c, task_queue=q.base, workflows=[RolloutWorkflow]),
        Worker(c, task_queue=q.gateway, activities=[stand_ins.create_session]),
        Worker(
            c,
            task_queue=q.gateway_owner("gw"),
            activities=[stand_ins.collect_trajectory, stand_ins.close_session],
        ),
    ]
    for host, kind in (
        ("host-a", FailFirstAttemptAfterCreateForTests),
        ("host-b", SandboxActivities),
    ):
        state = sandbox_state_dir / f"{base}-{host}"
        backends[host] = SandboxBackends(
            {"local": {"state_dir": str(state), "rootfs": sandbox_base_image.rootfs}}
        )
        # host-a holds one sandbox at most: once it has made one, the retry goes to host-b
        capacity = HostCapacity(max_live=1 if host == "host-a" else 8, max_provisions=1)
        acts = kind(backends[host], host, q.host(host), capacity)
        hc = await connect(temporal_server.address)  # one client per host (one poller set)
        fixed = FixedSizeSlotSupplier
        workers += [
            Worker(
                hc,
                task_queue=q.sandbox,
                activities=[acts.provision_sandbox],
                tuner=WorkerTuner.create_composite(
                    workflow_supplier=fixed(1),
                    activity_supplier=capacity,
                    local_activity_supplier=fixed(1),
                    nexus_supplier=fixed(1),
                ),
            ),
            Worker(
                hc,
                task_queue=q.host(host),
                activities=[stand_ins.run_harness, acts.destroy_sandbox],
            ),
        ]
    runs = [asyncio.ensure_future(w.run()) for w in workers]
    try:
        yield client, backends, stand_ins
    finally:
        await asyncio.gather(*(w.shutdown() for w in workers))
        await asyncio.gather(*runs, return_exceptions=True)
        for b in backends.values():
            for h in await b.get("local").list():  # only after a failed assertion
                await b.get("local").destroy(h)
            await b.aclose()


async def test_provision_retried_on_another_host_leaves_no_sandbox_behind(
    two_hosts: tuple[RolloutClient, dict[str, SandboxBackends], StandInsForTests],
) -> None:
    client, backends, stand_ins = two_hosts
    task = RolloutTask.model_validate(
        {
            "task_id": "t",
            "prompt": "p",
            "harness": {"name": "command", "config": {"command": "true"}},
            "sandbox": {"backend": "local"},
            "budget": {"heartbeat_s": 10, "host_queue_wait_s": 10},
        }
    )
    _, [req] = client.plan([task], "/tmp/unused", 1)
    handle = await client.start(req)
    result = await asyncio.wait_for(handle.result(), 120)
    assert (result.status, result.attempts) == (RolloutStatus.ok, 1)
    assert stand_ins.ran_on == ["host-b"]

    destroyed_on: list[str] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == DESTROY_SANDBOX:
                destroyed_on.append(attrs.task_queue.name)
    # host-a's sandbox was destroyed on host-a's queue (right after the provision), then
    # host-b's on host-b's; neither is left to a janitor or a TTL.
    q = QueueNames(base=client.task_queue)
    assert destroyed_on == [q.host("host-a"), q.host("host-b")]
    assert [h for b in backends.values() for h in await b.get("local").list()] == []
