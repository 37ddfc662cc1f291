"""`rollout show` from Temporal alone (no samples directory at hand): a rollout from its
workflow's result and history, a batch from the workflows its id tags.

A rollout's history holds the run's whole outcome (`RunOutcome`: evaluation, timings,
artifacts), returned by `run_harness`, and when each step started and ended; the views
are the samples reader's, so both sources print the same way. Token-level data (calls,
segments) is only in the samples.
"""

import asyncio
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.samples import artifact_rows, step_durations
from rollout_client.client import RolloutClient, RolloutOutcome
from rollout_client.samples_reader import (
    BatchView,
    CheckView,
    NotFoundError,
    RolloutDetail,
    RolloutSummary,
    artifact_view,
    in_step_order,
)
from schemas.outcome import RunOutcome, whose_failure
from schemas.rollout import (
    COLLECT_TRAJECTORY,
    PROVISION_SANDBOX,
    RUN_HARNESS,
    RolloutResult,
)
from schemas.tasks import ID_PATTERN

#: Steps named as the samples name them.
_STEP = {PROVISION_SANDBOX: "provision", COLLECT_TRAJECTORY: "collect"}
_CLOSED = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}
#: Closed rollouts of a batch fetched at once.
_FETCH = 32


async def rollout_from_temporal(
    client: RolloutClient, rollout_id: str, data_dir: Path | None = None
) -> RolloutDetail:
    """One rollout from its workflow (NotFoundError: no workflow of that id)."""
    handle = client.client.get_workflow_handle(rollout_id)
    try:
        desc = await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise NotFoundError(f"no rollout or batch {rollout_id!r} in Temporal") from None
        raise
    outcome, steps = await _from_history(client, rollout_id)
    result: RolloutResult | None = None
    error = ""
    status = (desc.status.name if desc.status else "UNKNOWN").lower()
    if desc.status != WorkflowExecutionStatus.RUNNING:
        done = await client.outcome(rollout_id)
        result, error = done.result, done.error or ""
    if result is not None:
        status = str(result.status)
    evaluation = outcome.evaluation if outcome else None
    if outcome is not None:
        steps = in_step_order({**steps, **step_durations(outcome)})
    checks = [
        CheckView(**c.model_dump(exclude={"tests"}))
        for c in (evaluation.checks if evaluation else [])
    ]
    rows = artifact_rows(outcome) if outcome else []
    artifacts = [artifact_view(rollout_id, a, data_dir) for a in rows]
    summary = _summary(rollout_id, result, status, error, steps)
    reason = summary.reason or (outcome.problem if outcome else "") or ""
    return RolloutDetail(
        **summary.model_dump(exclude={"reason"}),
        reason=reason,
        checks=checks,
        artifacts=artifacts,
        artifacts_dir=(outcome.artifacts_dir or "") if outcome else "",
        env_version=(result.env_version or "") if result else "",
        task_source=(result.task_source or "") if result else "",
        image_digest=(result.image_digest or "") if result else "",
        reward_fn_version=outcome.reward_fn_version if outcome else "",
    )


async def batch_from_temporal(client: RolloutClient, batch_id: str) -> BatchView:
    """A batch from the workflows tagged with its id (NotFoundError: none)."""
    if not re.match(ID_PATTERN, batch_id):  # it goes into a visibility query
        raise NotFoundError(f"{batch_id!r} is not a batch id (expected {ID_PATTERN})")
    query = f"RolloutBatchId = '{batch_id}'"
    found = [wf async for wf in client.client.list_workflows(query)]
    if not found:
        raise NotFoundError(f"no rollout or batch {batch_id!r} in Temporal")
    gate = asyncio.Semaphore(_FETCH)

    async def one(rid: str, running: bool) -> RolloutSummary:
        if running:
            return _summary(rid, None, "running", "", {})
        async with gate:
            done: RolloutOutcome = await client.outcome(rid)
        status = str(done.result.status) if done.result else done.workflow_status.lower()
        return _summary(rid, done.result, status, done.error or "", {})

    rollouts = await asyncio.gather(
        *(one(wf.id, wf.status == WorkflowExecutionStatus.RUNNING) for wf in found)
    )
    return BatchView(
        batch_id=batch_id,
        location="temporal",
        rollouts=sorted(rollouts, key=lambda r: r.rollout_id),
    )


def _summary(
    rid: str, result: RolloutResult | None, status: str, error: str, steps: dict[str, float]
) -> RolloutSummary:
    r = result
    return RolloutSummary(
        rollout_id=rid,
        batch_id=r.batch_id if r else "",
        task_id=r.task_id if r else "",
        group_id=r.group_id if r else "",
        sample_index=r.sample_index if r else 0,
        status=status,
        whose=whose_failure(status) if r or status == "running" else "infrastructure",
        reason=(r.error if r else error) or "",
        verdict=(r.verdict or "") if r else "",
        reward=r.reward if r else None,
        reward_metrics=r.reward_metrics if r else {},
        step_durations=steps,
        duration_s=r.duration_s if r else None,
        harness=r.harness if r else "",
        harness_version=r.harness_version if r else "",
        policy_versions=[r.policy_version] if r else [],
        calls=r.num_calls if r else 0,
        segments=r.num_samples if r else 0,
        trained_tokens=r.trainable_tokens if r else 0,
        samples_uri=r.samples_uri if r else None,
    )


async def _from_history(
    client: RolloutClient, rollout_id: str
) -> tuple[RunOutcome | None, dict[str, float]]:
    """The last `run_harness` outcome in the history, and seconds per activity step
    (scheduled to closed, summed over attempts)."""
    handle = client.client.get_workflow_handle(rollout_id)
    scheduled: dict[int, tuple[str, Any]] = {}
    steps: dict[str, float] = defaultdict(float)
    outcome: RunOutcome | None = None
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = (attrs.activity_type.name, event.event_time.ToDatetime())
            continue
        field = _CLOSED.get(event.event_type)
        if field is None:
            continue
        attrs = getattr(event, field)
        name, at = scheduled.get(attrs.scheduled_event_id, ("?", None))
        if at is not None:
            step = _STEP.get(name, name)
            steps[step] += (event.event_time.ToDatetime() - at).total_seconds()
        if name == RUN_HARNESS and field == _CLOSED[EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED]:
            [outcome] = await client.client.data_converter.decode(
                attrs.result.payloads, [RunOutcome]
            )
    return outcome, dict(steps)
