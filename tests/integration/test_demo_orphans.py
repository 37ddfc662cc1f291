"""A demo started on a data dir whose Temporal DB still holds rollouts a previous (killed)
demo had in flight ends them before its worker starts: their gateway sessions and
sandboxes died with that process, so running them would only burn the new demo's slots."""

import asyncio
from pathlib import Path

import pytest
from rich.console import Console
from temporalio.client import Client, WorkflowExecutionStatus

from workers.local_stack import ORPHAN_REASON, LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]


async def _left_running(stack: LocalStack) -> list[str]:
    """Start two workflows no worker will ever run, as a killed demo leaves them."""
    temporal = await stack.start_temporal()
    client = await Client.connect(temporal.address)
    ids = ["orphan-a", "orphan-b"]
    for wid in ids:
        await client.start_workflow("RolloutWorkflow", id=wid, task_queue="rollouts")
    await stack.stop()
    return ids


async def _restarted(stack: LocalStack, ids: list[str]) -> list[tuple[object, str]]:
    temporal = await stack.start_temporal()
    try:
        client = await Client.connect(temporal.address)
        found = []
        for wid in ids:
            handle = client.get_workflow_handle(wid)
            described = await handle.describe()
            history = await handle.fetch_history()
            reason = history.events[-1].workflow_execution_terminated_event_attributes.reason
            found.append((described.status, reason))
        return found
    finally:
        await stack.stop()


def test_a_restarted_demo_terminates_what_the_previous_one_left_running(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    first = Console(record=True, width=200)
    ids = asyncio.run(_left_running(LocalStack(data, first)))
    assert "terminated" not in first.export_text()

    second = Console(record=True, width=200)
    found = asyncio.run(_restarted(LocalStack(data, second), ids))
    assert found == [(WorkflowExecutionStatus.TERMINATED, ORPHAN_REASON)] * 2
    assert "terminated 2 rollout(s) a previous demo left running" in second.export_text()
