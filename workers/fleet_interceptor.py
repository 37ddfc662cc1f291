"""The Temporal worker interceptor that feeds `FleetMetrics`.

Why an interceptor: it sees every activity on this worker (its type, attempt, duration,
result) without the activities knowing of metrics, and every workflow's start and end
without the workflow emitting anything. Workflow-side counting skips replays
(`workflow.unsafe.is_replaying`, which the SDK also sets while it evicts a workflow
from its cache), so a rollout replayed after an eviction or a worker restart is counted
once, and an evicted one is not counted as ended.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    Interceptor,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from schemas.outcome import RunOutcome
from schemas.rollout import (
    CLOSE_SESSION,
    COLLECT_TRAJECTORY,
    CREATE_SESSION,
    DESTROY_SANDBOX,
    PROVISION_SANDBOX,
    RUN_HARNESS,
    RolloutResult,
)
from schemas.tasks import RolloutRequest
from workers.fleet_metrics import FleetMetrics, dataset_of

#: Activity name → its step label.
STEPS = {
    CREATE_SESSION: "create_session",
    PROVISION_SANDBOX: "provision",
    RUN_HARNESS: "run_harness",
    COLLECT_TRAJECTORY: "collect",
    DESTROY_SANDBOX: "destroy",
    CLOSE_SESSION: "close_session",
}


def error_type(exc: BaseException) -> str:
    """An application error's own type (SandboxUnavailable, GatewayUnavailable…), else
    the exception's class name: a small set either way."""
    if isinstance(exc, ApplicationError) and exc.type:
        return exc.type
    return type(exc).__name__


class FleetInterceptor(Interceptor):
    def __init__(self, metrics: FleetMetrics) -> None:
        self.metrics = metrics

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Activities(next, self.metrics)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        metrics = self.metrics

        class _Bound(_Workflows):
            fleet = metrics

        return _Bound


class _Activities(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, metrics: FleetMetrics) -> None:
        super().__init__(next)
        self.metrics = metrics

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        step = STEPS.get(info.activity_type, info.activity_type)
        m = self.metrics
        if info.attempt > 1:
            m.step_retries.labels(step).inc()
        started = time.monotonic()
        try:
            result = await self.next.execute_activity(input)
        except BaseException as exc:
            m.step_failures.labels(step, error_type(exc)).inc()
            raise
        finally:
            m.step_seconds.labels(step).observe(time.monotonic() - started)
        if isinstance(result, RunOutcome):  # run_harness: its phases and hooks
            for phase, seconds in result.timings.items():
                m.step_seconds.labels(phase).observe(seconds)
        return result


class _Workflows(WorkflowInboundInterceptor):
    fleet: FleetMetrics

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        req = next((a for a in input.args if isinstance(a, RolloutRequest)), None)
        if req is None:
            return await self.next.execute_workflow(input)
        harness = req.task.harness.name
        self._count(lambda m: m.rollouts_started.labels(harness).inc())
        status = "failed"
        try:
            result = await self.next.execute_workflow(input)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError | CancelledError):
                status = "cancelled"
            raise
        else:
            if isinstance(result, RolloutResult):
                status = result.status.value
                if result.reward is not None:
                    reward, dataset = result.reward, dataset_of(req.task)
                    self._count(lambda m: m.rewards.labels(dataset).observe(reward))
            return result
        finally:
            self._count(lambda m: m.rollouts_finished.labels(status, harness).inc())

    def _count(self, update: Any) -> None:
        """Apply `update(metrics)` unless this is a replay (counted when it first ran)."""
        if workflow.unsafe.is_replaying():
            return
        with workflow.unsafe.sandbox_unrestricted():
            update(self.fleet)
