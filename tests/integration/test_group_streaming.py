"""GRPO groups stream to the trainer as they finish, and a slow group is carried into a
later batch instead of holding one back — through the real stack: the Temporal dev
server, a `RolloutWorker` (role all, in this process), local bubblewrap sandboxes with
the example agent making real calls, and the Gateway in front of the scripted engine.

What makes one group slow is the engine: a gate in front of it holds every completion
whose prompt asks the slow task's question until the test opens it, which it does only
after the first batch (the two other groups) has been yielded. A batcher that waited
for the slow group would never yield that batch (the `wait_for` is a hang guard).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus

from bridges.groups import GroupBatcher
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from examples.make_tasks import task as make_task
from rollout_client.client import RolloutClient
from rollout_client.policy import GatewayPolicyClient
from rollout_client.training import TrainingInputError
from schemas.tasks import RolloutTask
from tests.fixtures.gated_engine import GatedEngine
from tests.fixtures.gateway import served_gateway
from tests.fixtures.rollout_stack import work_dir, worker_in_process
from workers.local_stack import InProcessGateway

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image", "vllm_venv"),
]
QUEUE = "group-stream-tests"
SLOW_MARK = "capital of France"
HANG = 300.0  # seconds: a guard against a batcher that waits, not a speed threshold


@dataclass
class Stack:
    gated: GatedEngine
    gateway: InProcessGateway
    client: RolloutClient
    out: Path


@pytest.fixture(scope="module")
def gated_gateway() -> Iterator[tuple[GatedEngine, InProcessGateway, Path]]:
    model = ensure_tiny_model()
    engine = ScriptedEngine(
        model / "tokenizer.json",
        Script(
            rules=[
                ScriptRule(when_contains="6 times 7", reply="42", repeat=True),
                ScriptRule(when_contains=SLOW_MARK, reply="Paris", repeat=True),
            ]
        ),
    )
    gated = GatedEngine(engine, SLOW_MARK)
    with (
        work_dir("groups") as work,
        served_gateway(gated, model, work / "gateway", "tiny") as gateway,
    ):
        try:
            yield gated, gateway, work
        finally:
            gated.gate.set()


@pytest.fixture(scope="module")
async def stack(
    temporal_server: TemporalDevServer,
    gated_gateway: tuple[GatedEngine, InProcessGateway, Path],
) -> AsyncIterator[Stack]:
    gated, gateway, work = gated_gateway
    async with worker_in_process(temporal_server, QUEUE, "groups-host", gateway, work):
        client = await RolloutClient.connect(temporal_server.address, task_queue=QUEUE)
        try:
            yield Stack(gated, gateway, client, work / "samples")
        finally:
            gated.gate.set()


def tasks() -> list[RolloutTask]:
    specs = [
        make_task("fast1", "What is 6 times 7? Reply with the number only.", "42", turns=1),
        make_task("slow", f"What is the {SLOW_MARK}? One word.", "Paris", turns=1),
        make_task("fast2", "What is 6 times 7? Just the number.", "42", turns=1),
    ]
    return [RolloutTask.model_validate(s) for s in specs]


async def test_groups_stream_as_they_finish_and_a_slow_group_is_carried(stack: Stack) -> None:
    batcher = GroupBatcher(
        stack.client,
        str(stack.out),
        group_size=2,
        groups_per_batch=2,
        max_in_flight=3,
        policy_version="tiny-random-v0",
        poll_s=0.2,
    )
    batches = batcher.batches(tasks())
    try:
        first = await asyncio.wait_for(anext(batches), HANG)
        assert sorted(g.task_id for g in first.groups) == ["fast1", "fast2"]
        [wave] = batcher.stats.waves  # three distinct tasks: one submission
        slow_ids = [f"{wave}-slow-0", f"{wave}-slow-1"]
        statuses = [await stack.client.status_of(rid) for rid in slow_ids]
        assert statuses == [WorkflowExecutionStatus.RUNNING] * 2  # not waited for
        rollouts = first.converted.rollouts
        assert len(rollouts) == 4 and {r.reward for r in rollouts} == {1.0}
        assert all(r.primary.loss_mask and r.trained for r in rollouts)

        stack.gated.gate.set()  # the slow group may finish now
        second = await asyncio.wait_for(anext(batches), HANG)
        [carried] = second.groups
        assert (carried.task_id, carried.carried, carried.rollouts) == ("slow", 1, 2)
        assert sorted(r.rollout_id for r in second.converted.rollouts) == sorted(slow_ids)
        assert stack.gated.held >= 1  # its calls did wait at the gate
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(batches), HANG)
        assert batcher.stats.loaded_groups == 3 and batcher.stats.peak_held_groups <= 2
    finally:
        stack.gated.gate.set()
        await batches.aclose()  # cancels what still runs (nothing, on success)
        for wave in batcher.stats.waves:  # let cancelled rollouts clean up before teardown
            await asyncio.wait_for(no_running(stack.client, wave), HANG)


async def no_running(client: RolloutClient, batch_id: str) -> None:
    query = f"RolloutBatchId = '{batch_id}' AND ExecutionStatus = 'Running'"
    while (await client.client.count_workflows(query)).count:
        await asyncio.sleep(0.5)


async def test_a_label_the_gateway_never_served_is_refused(stack: Stack) -> None:
    """Once the Gateway has served a version (here through a trainer's own sync), a batch
    labelled with one it never served is refused before anything starts."""
    gateway = GatewayPolicyClient(stack.gateway.control_url, stack.gateway.admin_token)
    async with gateway.external_update("run-v1"):
        pass  # the scripted engine has no weights to sync
    with pytest.raises(TrainingInputError) as err:
        await stack.client.submit_groups(
            tasks(), str(stack.out), 2, policy_version="run-v7", gateway=gateway
        )
    assert err.value.field == "policy_version" and "'run-v7'" in str(err.value)
    assert "run-v1" in str(err.value)
