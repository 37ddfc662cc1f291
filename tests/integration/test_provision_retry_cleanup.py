"""A provision whose first attempt fails after creating its sandbox, and whose retry
lands on another host, leaves no sandbox behind: the real provision/destroy activities
of two sandbox hosts (each with its own real local backend), the real workflow, the
real Temporal dev server. Session, agent run and collect are stand-ins (as in
test_controller_logic.py): this test is about where sandboxes live and die.

The slow-create variant makes the first host's create outlast one heartbeat interval,
so heartbeats are already being throttled when the attempt fails: what a loaded host
does (an attempt that fails in-process still gets its last heartbeat flushed by the
SDK). The last test kills that host's process (SIGKILL) right after such a create: a
throttled heartbeat dies with it, so the record of its sandbox must not be one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
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
from rollout_client.client import RolloutClient, connect
from sandboxes.base import Sandbox, SandboxBackend, SandboxSpec
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
    host crashed or lost the server between creating the sandbox and reporting it.
    `taken` is set once it has taken the first attempt."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.taken = asyncio.Event()

    @activity.defn(name=PROVISION_SANDBOX)
    async def provision_sandbox(self, req: ProvisionRequest) -> SandboxRef:
        self.taken.set()
        ref = await super().provision_sandbox(req)
        if activity.info().attempt == 1:
            raise ApplicationError("host lost after create (forced by the test)")
        return ref


class SlowCreateForTests:
    """A real backend whose `create` starts only after `delay_s`: a create slower than
    one heartbeat interval, as on a loaded host. Everything else is the real backend."""

    def __init__(self, backend: SandboxBackend, delay_s: float) -> None:
        self._backend = backend
        self._delay_s = delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def create(self, spec: SandboxSpec) -> Sandbox:
        await asyncio.sleep(self._delay_s)
        return await self._backend.create(spec)


class SlowCreateBackendsForTests(SandboxBackends):
    """This host's real backends, each behind `SlowCreateForTests`."""

    def __init__(self, config: dict[str, dict[str, Any]], delay_s: float) -> None:
        super().__init__(config)
        self._delay_s = delay_s

    def get(self, name: str) -> SandboxBackend:
        return SlowCreateForTests(super().get(name), self._delay_s)  # type: ignore[return-value]


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


#: heartbeat_s of the task below: provision heartbeats every 10/3 s, and the SDK sends
#: at most one heartbeat per 8 s (80 % of it) after the first.
HEARTBEAT_S = 10.0


@pytest.fixture(params=[0.0, HEARTBEAT_S / 3 + 1], ids=["create", "slow-create"])
async def two_hosts(
    request: pytest.FixtureRequest,
    temporal_server: TemporalDevServer,
    sandbox_state_dir: Path,
    sandbox_base_image: Any,
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
        config = {"local": {"state_dir": str(state), "rootfs": sandbox_base_image.rootfs}}
        delay_s: float = request.param if host == "host-a" else 0.0
        backends[host] = (
            SlowCreateBackendsForTests(config, delay_s) if delay_s else SandboxBackends(config)
        )
        # host-a holds one sandbox at most: once it has made one, the retry goes to host-b
        capacity = HostCapacity(max_live=1 if host == "host-a" else 8, max_provisions=1)
        acts = kind(backends[host], host, q.host(host), capacity)
        hc = await connect(temporal_server.address)  # one client per host (one poller set)
        fixed = FixedSizeSlotSupplier
        provisions = Worker(
            hc,
            task_queue=q.sandbox,
            activities=[acts.provision_sandbox],
            tuner=WorkerTuner.create_composite(
                workflow_supplier=fixed(1),
                activity_supplier=capacity,
                local_activity_supplier=fixed(1),
                nexus_supplier=fixed(1),
            ),
        )
        if isinstance(acts, FailFirstAttemptAfterCreateForTests):
            workers.append(provisions)
            taken = acts.taken
        else:
            later = provisions
        workers.append(
            Worker(
                hc,
                task_queue=q.host(host),
                activities=[stand_ins.run_harness, acts.destroy_sandbox],
            )
        )
    runs = [asyncio.ensure_future(w.run()) for w in workers]

    async def run_later() -> None:
        """host-b serves provisions only once host-a has taken the first attempt: two
        pollers on one queue would otherwise race for it, and only the retry may move."""
        await taken.wait()
        await later.run()

    late = asyncio.ensure_future(run_later())
    try:
        yield client, backends, stand_ins
    finally:
        if taken.is_set():
            workers.append(later)
        else:
            late.cancel()
        await asyncio.gather(*(w.shutdown() for w in workers))
        await asyncio.gather(*runs, late, return_exceptions=True)
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
            "budget": {"heartbeat_s": HEARTBEAT_S, "host_queue_wait_s": 10},
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
    # host-b's on host-b's; neither is left to a reaper or a TTL.
    q = QueueNames(base=client.task_queue)
    assert destroyed_on == [q.host("host-a"), q.host("host-b")]
    assert [h for b in backends.values() for h in await b.get("local").list()] == []


_KILLED_HOST = r"""
import asyncio, os, signal, sys
from temporalio import activity
from temporalio.worker import Worker
from activities.sandbox import SandboxActivities
from rollout_client.client import connect
from schemas.rollout import PROVISION_SANDBOX, ProvisionRequest, SandboxRef
from tests.integration.test_provision_retry_cleanup import SlowCreateBackendsForTests

class KilledAfterCreateForTests(SandboxActivities):
    # The real provision, then this host process dies (SIGKILL) at once.

    @activity.defn(name=PROVISION_SANDBOX)
    async def provision_sandbox(self, req: ProvisionRequest) -> SandboxRef:
        await super().provision_sandbox(req)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

async def main(address, queue, host_queue, state, rootfs, delay_s):
    config = {"local": {"state_dir": state, "rootfs": rootfs}}
    acts = KilledAfterCreateForTests(
        SlowCreateBackendsForTests(config, float(delay_s)), "host-a", host_queue
    )
    client = await connect(address)
    await Worker(client, task_queue=queue, activities=[acts.provision_sandbox]).run()

asyncio.run(main(*sys.argv[1:]))
"""


async def test_provision_host_killed_after_slow_create_leaves_no_sandbox_behind(
    temporal_server: TemporalDevServer, sandbox_state_dir: Path, sandbox_base_image: Any
) -> None:
    """host-a (its own process) takes the provision, creates slowly — its heartbeats
    are throttled by then — and is killed right after. host-a comes back (serving its
    own queue), host-b takes the retry: host-a's sandbox is destroyed on host-a."""
    base = f"kill-{uuid.uuid4().hex[:8]}"
    client = await RolloutClient.connect(temporal_server.address, task_queue=base)
    q = QueueNames(base=base)
    stand_ins = StandInsForTests(q)
    c = client.client
    state = {h: sandbox_state_dir / f"{base}-{h}" for h in ("host-a", "host-b")}
    backends = {
        h: SandboxBackends({"local": {"state_dir": str(d), "rootfs": sandbox_base_image.rootfs}})
        for h, d in state.items()
    }
    repo = Path(__file__).resolve().parents[2]
    host_a = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_HOST, temporal_server.address, q.sandbox,
        q.host("host-a"), str(state["host-a"]), sandbox_base_image.rootfs,
        str(HEARTBEAT_S / 3 + 1),
        env={**os.environ, "PYTHONPATH": str(repo)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    workers = [
        Worker(c, task_queue=q.base, workflows=[RolloutWorkflow]),
        Worker(c, task_queue=q.gateway, activities=[stand_ins.create_session]),
        Worker(
            c,
            task_queue=q.gateway_owner("gw"),
            activities=[stand_ins.collect_trajectory, stand_ins.close_session],
        ),
    ]
    runs = [asyncio.ensure_future(w.run()) for w in workers]
    try:
        task = RolloutTask.model_validate(
            {
                "task_id": "t",
                "prompt": "p",
                "harness": {"name": "command", "config": {"command": "true"}},
                "sandbox": {"backend": "local"},
                "budget": {"heartbeat_s": HEARTBEAT_S, "host_queue_wait_s": 30},
            }
        )
        _, [req] = client.plan([task], "/tmp/unused", 1)
        handle = await client.start(req)
        _, err = await asyncio.wait_for(host_a.communicate(), 120)
        assert host_a.returncode == -signal.SIGKILL, err.decode()[-3000:]
        # host-a is back (its queue only: the retry must move), host-b comes up.
        for host in ("host-a", "host-b"):
            acts = SandboxActivities(backends[host], host, q.host(host))
            hc = await connect(temporal_server.address)
            late = [
                Worker(
                    hc,
                    task_queue=q.host(host),
                    activities=[stand_ins.run_harness, acts.destroy_sandbox],
                )
            ]
            if host == "host-b":
                late.append(Worker(hc, task_queue=q.sandbox, activities=[acts.provision_sandbox]))
            workers += late
            runs += [asyncio.ensure_future(w.run()) for w in late]
        result = await asyncio.wait_for(handle.result(), 120)
        assert (result.status, result.attempts) == (RolloutStatus.ok, 1)
        assert stand_ins.ran_on == ["host-b"]

        destroyed_on: list[str] = []
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name == DESTROY_SANDBOX:
                    destroyed_on.append(attrs.task_queue.name)
        assert destroyed_on == [q.host("host-a"), q.host("host-b")]
        assert [h for b in backends.values() for h in await b.get("local").list()] == []
    finally:
        if host_a.returncode is None:
            host_a.kill()
            await host_a.wait()
        await asyncio.gather(*(w.shutdown() for w in workers))
        await asyncio.gather(*runs, return_exceptions=True)
        for b in backends.values():
            for h in await b.get("local").list():  # only after a failed assertion
                await b.get("local").destroy(h)
            await b.aclose()
