"""Contracts between `RolloutWorkflow` and its activities, and the rollout's result.

Why here and not in `activities/`: the workflow must not import the runtime (sandboxes,
gateway, harnesses); both sides import these pure models. Everything here is small —
large data (trajectories, logs, samples) only ever travels as a reference (a URI).
"""

from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from schemas.base import StrictModel
from schemas.outcome import RolloutStatus, RunOutcome
from schemas.sampling import SamplingControl, SamplingParams
from schemas.scenes import SceneConfig
from schemas.session import SessionCreated
from schemas.tasks import HarnessSpec, RolloutBudget, RolloutId, RolloutTask

# ----------------------------------------------------------------------------- names

#: Activity names (the workflow refers to activities by name, never by import).
CREATE_SESSION = "create_session"
PROVISION_SANDBOX = "provision_sandbox"
RUN_HARNESS = "run_harness"
COLLECT_TRAJECTORY = "collect_trajectory"
CLOSE_SESSION = "close_session"
DESTROY_SANDBOX = "destroy_sandbox"

#: Key under which provision heartbeats (and its retries' errors) record the sandboxes
#: attempts create (`SandboxClaim`s), so a retry elsewhere or the workflow can destroy them.
PROVISIONED_SANDBOXES = "sandboxes"

#: Non-retryable error types: a bad task never gets better by retrying.
BAD_TASK_SPEC = "BadTaskSpec"
AGENT_CONFIG_ERROR = "AgentConfigError"
PAYLOADS_TOO_LARGE = "PayloadsTooLarge"
FATAL_ERROR_TYPES = (BAD_TASK_SPEC, AGENT_CONFIG_ERROR, PAYLOADS_TOO_LARGE)
#: The workflow's own failure types.
ROLLOUT_INFRA_ERROR = "RolloutInfraError"

#: Custom search attributes (name → Temporal type), registered at server/worker start.
SEARCH_ATTRIBUTES: dict[str, str] = {
    "RolloutBatchId": "Keyword",
    "RolloutGroupId": "Keyword",
    "RolloutTaskId": "Keyword",
    "RolloutPhase": "Keyword",
    "RolloutStatus": "Keyword",
    "RolloutHarness": "Keyword",
    "RolloutBackend": "Keyword",
    "RolloutPolicyVersion": "Keyword",
    "RolloutSandboxHost": "Keyword",
    "RolloutReward": "Double",
}


class QueueNames(StrictModel):
    """Task queues derived from one base name (`--task-queue`).

    base: workflows. `sandbox`: provisioning (any sandbox host may take it).
    `host(h)`: everything touching a sandbox on host h (affinity). `gateway`: session
    creation (any gateway host). `gateway_owner(g)`: collect/close on the gateway host
    that owns the session, so trajectories are read locally.
    """

    base: str

    @property
    def sandbox(self) -> str:
        return f"{self.base}-sandbox"

    @property
    def gateway(self) -> str:
        return f"{self.base}-gateway"

    def host(self, host_id: str) -> str:
        return f"{self.base}-host-{host_id}"

    def gateway_owner(self, gateway_id: str) -> str:
        return f"{self.base}-gateway-{gateway_id}"


class Phase(StrEnum):
    queued = "queued"
    provisioning = "provisioning"
    running = "running"
    collecting = "collecting"
    cleanup = "cleanup"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"


# ----------------------------------------------------------------------------- session


class SessionRequest(StrictModel):
    rollout_id: RolloutId
    attempt: int = Field(ge=1)
    policy_version: str
    sampling: SamplingParams
    sampling_control: SamplingControl = Field(default_factory=SamplingControl)
    scenes: SceneConfig | None = None
    harness: HarnessSpec
    metadata: dict[str, Any] = Field(default_factory=dict)
    budget: RolloutBudget = Field(
        default_factory=RolloutBudget, description="the task's budget: the session's TTLs"
    )


class SessionRef(SessionCreated):
    """A live Gateway session and where it lives. `token` is the agent's API key for
    this session only."""

    gateway_url: str = Field(description="control API base URL of the owning process")
    owner_queue: str = Field(description="task queue of the gateway host owning the session")


class CloseSessionRequest(StrictModel):
    session: SessionRef
    reason: str = "rollout finished"


# ----------------------------------------------------------------------------- sandbox


class ProvisionRequest(StrictModel):
    rollout_id: RolloutId
    attempt: int = Field(ge=1)
    task: RolloutTask
    session: SessionRef
    timeout_s: float = Field(gt=0, description="sandbox lifetime (TTL backstop)")


class SandboxClaim(StrictModel):
    """A sandbox a provision attempt is about to create: the host making it, and the
    identity (rollout id + rollout attempt, as labels) it will carry.

    Recorded in the attempt's first heartbeat, before create: the first heartbeat is
    sent at once, later ones are throttled, and a host that dies with one pending loses
    it. So even an attempt that dies before it can report the sandbox's id leaves
    enough to find and destroy it on its host.
    """

    backend: str
    host: str
    host_queue: str
    rollout_id: RolloutId
    attempt: int = Field(ge=1, description="the rollout attempt (ProvisionRequest.attempt)")


class SandboxRef(StrictModel):
    """A provisioned sandbox and the queue of the host that owns it."""

    backend: str
    sandbox_id: str
    host: str
    host_queue: str
    env_version: str
    handle: dict[str, Any] = Field(description="the backend's SandboxHandle, as JSON")
    facts: dict[str, str] = Field(
        default_factory=dict,
        description="what provisioning did to the environment that a sample should say "
        "(e.g. the repository's history trimmed): carried to the samples' `sandbox_facts`",
    )
    earlier: list[SandboxClaim] = Field(
        default_factory=list,
        description="sandboxes that failed attempts of this provision may have left on"
        " other hosts: the workflow destroys them at once",
    )


class DestroyRequest(StrictModel):
    """Destroy one sandbox: a provisioned one by its handle, or what a failed provision
    attempt claimed, found by its identity (finding nothing is done, too)."""

    sandbox: SandboxRef | None = None
    claim: SandboxClaim | None = None

    @model_validator(mode="after")
    def _one_target(self) -> "DestroyRequest":
        if (self.sandbox is None) == (self.claim is None):
            raise ValueError("a destroy names exactly one of `sandbox` and `claim`")
        return self


# ----------------------------------------------------------------------------- harness


class HarnessRequest(StrictModel):
    """Run the task's agent and hooks in a provisioned sandbox. The task's
    `harness.budget_s` is already cut to what is left of the rollout budget."""

    rollout_id: RolloutId
    attempt: int = Field(ge=1)
    task: RolloutTask
    sandbox: SandboxRef
    session: SessionRef


# ----------------------------------------------------------------------------- samples


class CollectRequest(StrictModel):
    rollout_id: RolloutId
    batch_id: str
    task_id: str
    group_id: str
    sample_index: int
    seed: int | None
    session: SessionRef
    env_version: str = Field(description="the rule of `RolloutTask.env_version`")
    task_source: str = Field(default="", description="`RolloutTask.source_label()`")
    image_digest: str | None = Field(
        default=None, description="the sandbox's image (None: `env_version` is it)"
    )
    sandbox_facts: dict[str, str] = Field(
        default_factory=dict, description="`SandboxRef.facts` of the sandbox that ran"
    )
    outcome: RunOutcome
    sampling: SamplingParams
    output: str
    trainable_scenes: list[str] | None = None


class SamplesSummary(StrictModel):
    """Reference to the written samples plus a summary small enough for history."""

    uri: str | None
    num_samples: int = 0
    num_calls: int = 0
    failed_calls: int = 0
    trainable_tokens: int = 0
    statuses: dict[str, int] = Field(default_factory=dict)
    session_closed: bool = False
    limit_refusals: dict[str, int] = Field(
        default_factory=dict, description="the session's calls a Gateway limit refused, by limit"
    )


# ----------------------------------------------------------------------------- result


class RolloutResult(StrictModel):
    rollout_id: str
    batch_id: str
    task_id: str
    group_id: str
    sample_index: int
    status: RolloutStatus
    reward: float | None
    rewards: dict[str, float] = Field(default_factory=dict)
    verdict: str | None = None
    samples_uri: str | None = None
    num_samples: int = 0
    num_calls: int = 0
    trainable_tokens: int = 0
    session_id: str | None = Field(default=None, description="the Gateway session sampled")
    sandbox_id: str | None = None
    attempts: int = 1
    duration_s: float = 0.0
    agent_exit_code: int | None = None
    harness: str
    harness_version: str
    policy_version: str
    env_version: str | None = Field(
        default=None, description="as the samples': the task's content hash or the image"
    )
    task_source: str | None = Field(default=None, description="`<format>:<ref>` of the task")
    image_digest: str | None = None
    reward_metrics: dict[str, float] = Field(
        default_factory=dict, description="the verifier's metrics besides the reward"
    )
    limit_refusals: dict[str, int] = Field(
        default_factory=dict,
        description="the agent's calls a per-session Gateway limit refused, by limit name "
        "(`max_stored_bytes`, `max_concurrent_calls`, …): what the agent was told no to",
    )
    error: str | None = None


class RolloutProgress(StrictModel):
    """Answer of the `progress` query: where a (possibly stuck) rollout is."""

    phase: Phase
    attempt: int
    session_id: str | None = None
    sandbox_id: str | None = None
    sandbox_host: str | None = None
    last_error: str | None = None
