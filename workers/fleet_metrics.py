"""Fleet metrics of a worker process: what its rollouts, steps, sandboxes and images did.

On a private registry (as the Gateway's), served on `rollout worker --metrics-port`.
The numbers come from the worker side only: a Temporal interceptor sees every activity
(its step, attempt, duration and result) and every workflow's start and end on this
process (`workers.fleet_interceptor`); the provision step reports images it built or
found (`SandboxActivities(on_image=…)`); a sampler reads what is live now (sandboxes
by backend, the task queues' backlog from Temporal). Workflow code emits nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from schemas.tasks import RolloutTask

STEP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def dataset_of(task: RolloutTask) -> str:
    """A bounded label for where a task came from: its format and the file or directory
    its dataset was read from (a Harbor task's parent directory, a SWE-bench file), not
    the task itself; tasks written as JSONL lines are `jsonl`."""
    source = task.source
    if source is None:
        return "jsonl"
    ref = source.ref.split("#", 1)[0]
    name = Path(ref).parent.name if source.format == "harbor" else Path(ref).name
    return f"{source.format}:{name}" if name else source.format


class FleetMetrics:
    """The worker's series (names `rollout_worker_*`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rollouts_started = Counter(
            "rollout_worker_rollouts_started",
            "Rollout workflows this process started running, by harness.",
            ["harness"],
            registry=r,
        )
        self.rollouts_finished = Counter(
            "rollout_worker_rollouts_finished",
            "Rollout workflows that ended on this process, by final status (a RolloutStatus, "
            "or failed / cancelled when the workflow itself did) and harness.",
            ["status", "harness"],
            registry=r,
        )
        self.step_seconds = Histogram(
            "rollout_worker_step_seconds",
            "Wall time of a step: the activities (create_session, provision, run_harness, "
            "collect, destroy, close_session), the phases inside run_harness (setup, "
            "before_run, agent, stop_agent, after_run) and each hook (hook:<name>).",
            ["step"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.step_retries = Counter(
            "rollout_worker_step_retries",
            "Activity attempts after the first, by step.",
            ["step"],
            registry=r,
        )
        self.step_failures = Counter(
            "rollout_worker_step_failures",
            "Activity attempts that raised, by step and error type.",
            ["step", "error"],
            registry=r,
        )
        self.rewards = Histogram(
            "rollout_worker_reward",
            "Rewards of the rollouts that ended here with one, by dataset (format:source).",
            ["dataset"],
            buckets=REWARD_BUCKETS,
            registry=r,
        )
        self.images = Counter(
            "rollout_worker_images",
            "Images made ready for a provision: kind task_image (a task's Dockerfile) or "
            "rootfs (an image exported for the local backend); result built or cached.",
            ["kind", "result"],
            registry=r,
        )
        self.sandboxes_live = Gauge(
            "rollout_worker_sandboxes_live",
            "Sandboxes bound to a rollout on this host, by backend (sampled).",
            ["backend"],
            registry=r,
        )
        self.sandboxes_warm = Gauge(
            "rollout_worker_sandboxes_warm",
            "Blank sandboxes ready in the warm pool, by backend (sampled).",
            ["backend"],
            registry=r,
        )
        self.queue_backlog = Gauge(
            "rollout_worker_task_queue_backlog",
            "Tasks waiting in a rollout task queue, as Temporal estimates it "
            "(approximate_backlog_count), by queue and kind (workflow, activity).",
            ["task_queue", "kind"],
            registry=r,
        )
        self.queue_backlog_age = Gauge(
            "rollout_worker_task_queue_backlog_age_seconds",
            "Age of the oldest task waiting in a rollout task queue (Temporal's estimate).",
            ["task_queue", "kind"],
            registry=r,
        )

    def image_ready(self, kind: str, cached: bool) -> None:
        """What the provision step calls for each image it made ready."""
        self.images.labels(kind, "cached" if cached else "built").inc()
