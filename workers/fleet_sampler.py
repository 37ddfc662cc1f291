"""What the fleet metrics read on an interval rather than count: the shared task queues'
backlog (Temporal's `DescribeTaskQueue` with stats, which the dev server answers too)
and this host's sandboxes by backend (live ones from the backend's own list, warm ones
from its pool).

Why sampled: a backlog is Temporal's state, not an event on this worker, and the
backend's list is the truth about live sandboxes (a reaped or re-attached sandbox is
counted as it is, with no bookkeeping that could drift).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from schemas.rollout import QueueNames
from workers.fleet_metrics import FleetMetrics

if TYPE_CHECKING:
    from activities.sandbox import SandboxBackends

log = logging.getLogger("rollout.worker.metrics")

WORKFLOW = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
ACTIVITY = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY


def shared_queues(base: str) -> list[tuple[str, int, str]]:
    """(queue, type, kind label) of the queues any worker may take from: rollouts wait
    there for an orchestrator, a sandbox host with room, a gateway host."""
    q = QueueNames(base=base)
    return [
        (q.base, WORKFLOW, "workflow"),
        (q.sandbox, ACTIVITY, "activity"),
        (q.gateway, ACTIVITY, "activity"),
    ]


async def sample_backlog(client: Client, namespace: str, base: str, metrics: FleetMetrics) -> None:
    for name, kind, label in shared_queues(base):
        reply = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=namespace,
                task_queue=TaskQueue(name=name),
                task_queue_type=kind,  # type: ignore[arg-type]
                report_stats=True,
            )
        )
        stats = reply.stats
        metrics.queue_backlog.labels(name, label).set(stats.approximate_backlog_count)
        age = stats.approximate_backlog_age
        metrics.queue_backlog_age.labels(name, label).set(age.seconds + age.nanos / 1e9)


async def sample_sandboxes(backends: SandboxBackends, metrics: FleetMetrics) -> None:
    for backend in backends.active():
        handles = await backend.list()
        live = sum(1 for h in handles if h.rollout_id)
        metrics.sandboxes_live.labels(backend.name).set(live)
        pool = getattr(backend, "pool", None)
        warm = len(pool.idle_items()) if pool is not None else 0
        metrics.sandboxes_warm.labels(backend.name).set(warm)


async def run_sampler(
    queues: tuple[Client, str, str] | None,
    backends: SandboxBackends | None,
    metrics: FleetMetrics,
    interval_s: float,
) -> None:
    """Sample until cancelled: the backlog when `queues` (client, namespace, base queue)
    is given, this host's sandboxes when `backends` is; a failed sample is logged and the
    next pass tries again."""
    while True:
        if queues is not None:
            try:
                await sample_backlog(*queues, metrics)
            except Exception as exc:
                log.warning("metrics: task queue backlog not read: %r", exc)
        if backends is not None:
            try:
                await sample_sandboxes(backends, metrics)
            except Exception as exc:
                log.warning("metrics: sandboxes not counted: %r", exc)
        await asyncio.sleep(interval_s)
