"""Rollout tasks: what a trainer submits (one JSONL line = one `RolloutTask`).

`RolloutTask` is the one task model: the workflow passes it to every activity, and the
runtime, harness and hooks read it directly. `schemas` is pure data that trainers import
without the runtime. The sandbox part stays open (`SandboxRequest` passes its fields
through to the backend's `SandboxSpec`), so a typo there is caught by the provision
activity and fails the rollout fast, visibly and without retries.
"""

import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from schemas.base import StrictModel
from schemas.environment import EnvironmentBuild, NetworkPolicy
from schemas.evaluation import EvaluationSpec
from schemas.sampling import SamplingControl, SamplingParams
from schemas.scenes import SceneConfig
from schemas.workspace import RepoSpec

#: Ids become Temporal workflow ids, file names and search-attribute values.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
#: A rollout id names files (`<output>/<rollout_id>.parquet`, artifact dirs), so it
#: must be one safe path part that fits a 255-byte file name with its suffix.
ROLLOUT_ID_MAX = 200
TASK_ID_MAX = 128
_SAFE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


def _check_id(kind: str, value: str, max_len: int) -> str:
    """`value` if it is a safe id (one path part, a workflow id), else a clear ValueError."""
    rule = (
        f"a {kind} is 1-{max_len} characters of A-Z a-z 0-9 . _ : - starting with a "
        "letter or digit (it becomes part of file names and workflow ids)"
    )
    if not value:
        raise ValueError(f"empty {kind}: {rule}")
    if len(value) > max_len:
        raise ValueError(f"{kind} {value[:40]!r}… is {len(value)} characters long: {rule}")
    if not _SAFE_ID_RE.fullmatch(value):
        raise ValueError(f"{kind} {value!r} is not a safe path part: {rule}")
    return value


def check_rollout_id(value: str) -> str:
    """`value` if it is a safe rollout id, else a ValueError saying what is wrong."""
    return _check_id("rollout id", value, ROLLOUT_ID_MAX)


def check_task_id(value: str) -> str:
    return _check_id("task id", value, TASK_ID_MAX)


#: The type of every `rollout_id` a boundary model accepts.
RolloutId = Annotated[str, AfterValidator(check_rollout_id)]
TaskId = Annotated[str, AfterValidator(check_task_id)]


class HarnessSpec(StrictModel):
    """Which agent runs, how it is configured and how long it may run."""

    name: str = Field(min_length=1, description="harness module: command, claude_code, codex, …")
    version: str | None = Field(default=None, description="pin/override the reported version")
    config: dict[str, Any] = Field(default_factory=dict, description="harness-specific settings")
    budget_s: float = Field(default=600.0, gt=0, description="agent wall-clock budget")


class HookSpec(StrictModel):
    """One hook in the task's ordered list; it runs at before_run / after_run / on_error
    as the hook defines. Params are validated by the hook when the hooks are built; a
    non-required hook's failure is recorded in the outcome instead of failing the run."""

    name: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    required: bool = True


def default_hooks() -> list[HookSpec]:
    """Logs, then the diff (before evaluation can touch the workspace), then the
    evaluation, then metrics summarising all of them."""
    return [
        HookSpec(name="collect_logs"),
        HookSpec(name="capture_diff", required=False),
        HookSpec(name="evaluate"),
        HookSpec(name="metrics"),
    ]


class SandboxRequest(BaseModel):
    """Backend name plus `SandboxSpec` fields (image, resources, files, repo, setup, env…).

    Extra fields are kept and validated by the backend at provision time.
    """

    model_config = ConfigDict(extra="allow")

    backend: str = Field(default="local", min_length=1)
    build: EnvironmentBuild | None = Field(
        default=None, description="a Dockerfile built into `image` on the sandbox host"
    )
    #: Checked when the task is read (a bad host entry refuses the task there).
    network: NetworkPolicy | None = Field(
        default=None, description="what the sandbox may reach besides its Gateway"
    )

    def spec_fields(self) -> dict[str, Any]:
        """Everything except `backend` and `build`, as given (for `SandboxSpec`)."""
        fields = dict(self.model_extra or {})
        if self.network is not None:
            fields["network"] = self.network.model_dump()
        return fields

    def repo(self) -> RepoSpec | None:
        """The task's repository, if it has one."""
        raw = (self.model_extra or {}).get("repo")
        return RepoSpec.model_validate(raw) if raw is not None else None


class RolloutBudget(StrictModel):
    """Time limits. `total_s` is enforced *inside* the workflow (a workflow execution
    timeout would skip cleanup); it covers provisioning and the agent, not cleanup."""

    total_s: float = Field(default=3600.0, gt=0)
    provision_s: float = Field(default=600.0, gt=0, description="one provision attempt")
    collect_s: float = Field(default=300.0, gt=0, description="one collect attempt")
    heartbeat_s: float = Field(default=60.0, gt=0, description="dead agent/host detection")
    host_queue_wait_s: float = Field(
        default=120.0, gt=0, description="schedule-to-start on a host queue: dead host → new host"
    )
    grace_s: float = Field(default=120.0, ge=0, description="hooks/eval time beyond budget_s")
    setup_s: float = Field(default=300.0, gt=0, description="harness setup in the sandbox")
    hooks_s: float = Field(default=900.0, gt=0, description="one hook phase")
    cleanup_s: float = Field(default=120.0, gt=0, description="harness cleanup, on_error hooks")


class TaskSource(StrictModel):
    """Where a task came from, for lineage: every sample of it names this."""

    format: str = Field(min_length=1, description="jsonl, harbor, swebench, …")
    #: The task directory, or the instance id and its file.
    ref: str = Field(min_length=1)
    #: sha256 of everything that defines the task (becomes the samples' `env_version`).
    content_hash: str | None = None

    def label(self) -> str:
        """`<format>:<ref>`, as the samples' `task_source` column holds it."""
        return f"{self.format}:{self.ref}"


class RolloutTask(StrictModel):
    """One task; `samples_per_task` copies of it form a GRPO group."""

    task_id: TaskId
    prompt: str
    harness: HarnessSpec
    sandbox: SandboxRequest = Field(default_factory=SandboxRequest)
    hooks: list[HookSpec] = Field(
        default_factory=list, description="empty: the default hooks (see `hook_specs`)"
    )
    evaluation: EvaluationSpec | None = Field(default=None, description="the success check")
    policy_version: str = Field(default="unversioned", min_length=1, max_length=256)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    sampling_control: SamplingControl = Field(
        default_factory=SamplingControl,
        description="which sampling fields the session pins and which the agent chooses",
    )
    scenes: SceneConfig | None = Field(default=None, description="None: the harness profile")
    reward_fn_version: str | None = Field(
        default=None, description="None: derived from the evaluate hook's config"
    )
    budget: RolloutBudget = Field(default_factory=RolloutBudget)
    max_attempts: int = Field(
        default=3, ge=1, le=5, description="whole attempts: new session + sandbox each"
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    source: TaskSource | None = Field(default=None, description="None: written as JSONL")

    def hook_specs(self) -> list[HookSpec]:
        """The hooks this task runs: its own list, or the defaults when it gives none."""
        return list(self.hooks) or default_hooks()

    def reward_fn_id(self) -> str:
        """Lineage of the reward: explicit version, else the evaluation spec's hash."""
        if self.reward_fn_version:
            return self.reward_fn_version
        return self.evaluation.reward_fn_version() if self.evaluation else "none"

    def source_label(self) -> str:
        """Lineage of the task: its source's `<format>:<ref>`; a task without one was
        written as a JSONL line (or in code), named by its id: `jsonl:<task_id>`."""
        return self.source.label() if self.source else f"jsonl:{self.task_id}"

    def env_version(self, image_digest: str) -> str:
        """Lineage of the environment: the task's content hash when its source has one
        (it covers the environment's build context, so it names the environment before
        any image exists), else the digest of the image the sandbox ran."""
        if self.source is not None and self.source.content_hash:
            return self.source.content_hash
        return image_digest


class RolloutRequest(StrictModel):
    """Input of `RolloutWorkflow`. Workflow id = `rollout_id`."""

    rollout_id: RolloutId
    batch_id: str = Field(pattern=ID_PATTERN)
    group_id: str = Field(min_length=1, max_length=300)
    sample_index: int = Field(default=0, ge=0)
    seed: int | None = None
    task: RolloutTask
    output: str = Field(min_length=1, description="samples dir or s3://bucket/prefix")


def rollout_id_for(batch_id: str, task_id: str, sample_index: int) -> str:
    """Deterministic, so resubmitting a batch is idempotent (same workflow ids).

    Raises ValueError (naming batch and task) when the two ids together are too long
    for a rollout id, so the batch fails at planning, not at its first file write.
    """
    rid = f"{batch_id}-{task_id}-{sample_index}"
    try:
        return check_rollout_id(rid)
    except ValueError as exc:
        raise ValueError(
            f"batch_id {batch_id!r} + task_id {task_id!r}: {exc}; use shorter ids"
        ) from None


def group_id_for(batch_id: str, task_id: str) -> str:
    return f"{batch_id}-{task_id}"


def seed_for(base_seed: int | None, task_index: int, sample_index: int) -> int | None:
    """Distinct, reproducible per-sample seeds (None keeps the engine's randomness)."""
    if base_seed is None:
        return None
    return (base_seed * 1_000_003 + task_index * 1009 + sample_index) % (2**31 - 1)


def load_tasks(path: Path | str) -> list[RolloutTask]:
    """Read a JSONL file of tasks; errors name the line so a bad file is easy to fix."""
    tasks: list[RolloutTask] = []
    seen: set[str] = set()
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            task = RolloutTask.model_validate(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: invalid task: {exc}") from exc
        if task.task_id in seen:
            raise ValueError(f"{path}:{number}: duplicate task_id {task.task_id!r}")
        seen.add(task.task_id)
        tasks.append(task)
    return tasks
