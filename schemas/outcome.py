"""What running a task produced, and the one set of rules that turns it into a status.

One result model travels from the sandbox host to the trainer: the harness fills
`AgentResult`, hooks add evaluation, diff, artifacts and metrics to the same `RunOutcome`,
the `run_harness` activity returns it, the collect step reads its reward, and the
workflow derives the `RolloutResult` from it. The status rules (rollout, then each
sample row) live only here, so the workflow, the Parquet rows and the result can never
disagree about what "agent_timeout" or "eval_error" means.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from pydantic import Field

from schemas.base import StrictModel
from schemas.evaluation import EvaluationResult


class RolloutStatus(StrEnum):
    """How a rollout, or one of its sample rows, ended, and so whose doing it was.

    The agent's (trained on, reward 0 unless it earned one): `ok`, `truncated`,
    `agent_timeout` (it spent its budget) and `agent_broke_sandbox` (something failed
    and the sandbox shows damage the agent could have done: its disk full, its
    supervisor gone, its workdir gone or closed; see `Sandbox.agent_damage`). Ours
    (masked, left out of the loss and the baseline): `eval_error` (the evaluator broke
    on a sandbox the agent left intact) and `infra_error`. A failure is ours only when
    the agent could not have caused it: a masked row is a row the policy is never
    pushed away from, so an excuse the agent can trigger is one RL learns to use.

    `eval_error` is a rollout status only: the rows of such a rollout are `infra_error`
    (masked), because their reward is unknown.
    """

    ok = "ok"
    truncated = "truncated"
    agent_timeout = "agent_timeout"
    agent_broke_sandbox = "agent_broke_sandbox"
    eval_error = "eval_error"
    infra_error = "infra_error"


#: Statuses a training-sample row may carry (the Parquet contract).
SAMPLE_STATUSES = frozenset(
    {
        RolloutStatus.ok,
        RolloutStatus.truncated,
        RolloutStatus.agent_timeout,
        RolloutStatus.agent_broke_sandbox,
        RolloutStatus.infra_error,
    }
)
#: How much of a status reason a sample row keeps.
_REASON_CHARS = 1000
#: Statuses whose reward is the agent's doing: 0 whatever the evaluation said.
ZERO_REWARD = frozenset({RolloutStatus.agent_timeout, RolloutStatus.agent_broke_sandbox})


def whose_failure(status: str) -> str:
    """Whose doing a status is, for the operator: "" (it ended well), "agent" (its
    reward stands, 0), "evaluator" or "infrastructure" (ours: masked)."""
    if status in (RolloutStatus.ok, RolloutStatus.truncated):
        return ""
    if status == RolloutStatus.eval_error:
        return "evaluator"
    if status == RolloutStatus.infra_error:
        return "infrastructure"
    return "agent"


class LogSpec(StrictModel):
    """Where an agent keeps a kind of log: a sandbox path plus file-name patterns."""

    path: str
    patterns: list[str] = Field(default_factory=lambda: ["*"])
    kind: str = "log"


class LogFile(StrictModel):
    """One agent log file: where it was in the sandbox and where it is now."""

    kind: str
    sandbox_path: str | None = None
    local_path: str | None = None
    uri: str | None = None
    size: int = 0


class AgentResult(StrictModel):
    """What running the agent process produced (rewards come from hooks)."""

    harness: str
    harness_version: str
    #: Process exit status (128+N when killed by signal N); None if it never finished.
    exit_code: int | None = None
    duration_s: float = 0.0
    timed_out: bool = False
    oom_killed: bool = False
    stdout_tail: str = ""
    stderr_tail: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    #: The agent's own transcripts/logs (filled by the `collect_logs` hook) and the full
    #: stdout/stderr files when the run had an output dir.
    logs: list[LogFile] = Field(default_factory=list)
    #: The agent's final answer when the CLI reports one.
    final_message: str | None = None
    #: Harness-specific parsed summary (turn counts, usage, exit status...).
    details: dict[str, Any] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class ArtifactRef(StrictModel):
    """A file produced by the run: where it is on the host and (after upload) its URI."""

    name: str
    kind: str = "artifact"
    local_path: str | None = None
    uri: str | None = None
    size: int = 0


class DiffSummary(StrictModel):
    """The agent's change to the workspace (the patch itself is an artifact)."""

    base: str
    files_changed: int = 0
    insertions: int = 0
    deletions: int = 0
    bytes: int = 0
    truncated: bool = False
    local_path: str | None = None


class RunOutcome(StrictModel):
    """The result of running one task in one sandbox: agent, hooks and evaluation.

    Small by construction (tails, summaries and references only), because it is an
    activity result stored in workflow history. `status` is `infra_error` until the
    run finished; a failed run's partial outcome keeps it.
    """

    status: RolloutStatus = RolloutStatus.infra_error
    harness: str
    harness_version: str = "unknown"
    reward_fn_version: str = "none"
    #: Image digest / rootfs id / template of the sandbox (lineage).
    env_version: str | None = None
    sandbox_id: str | None = None
    host: str | None = None
    agent: AgentResult | None = None
    evaluation: EvaluationResult | None = None
    diff: DiffSummary | None = None
    artifacts: list[ArtifactRef] = Field(default_factory=list)
    artifacts_dir: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    llm_calls: int | None = None
    error: str | None = None
    hook_errors: list[str] = Field(default_factory=list)

    @property
    def reward(self) -> float | None:
        """The rollout's reward: 0 for an agent that timed out or broke its sandbox, None
        when the evaluator broke."""
        if self.status in ZERO_REWARD:
            return 0.0
        if self.status in (RolloutStatus.eval_error, RolloutStatus.infra_error):
            return None
        if self.evaluation is None or self.evaluation.reward is None:
            return 0.0
        return self.evaluation.reward

    @property
    def rewards(self) -> dict[str, float]:
        """Score per named check."""
        return {c.name: c.score for c in self.evaluation.checks} if self.evaluation else {}

    @property
    def reward_metrics(self) -> dict[str, float]:
        """What the verifier measured besides the reward (its `metrics`)."""
        return dict(self.evaluation.metrics) if self.evaluation else {}

    @property
    def step_rewards(self) -> list[float] | None:
        return self.evaluation.step_rewards if self.evaluation else None

    @property
    def verdict(self) -> str | None:
        return self.evaluation.verdict if self.evaluation else None

    @property
    def problem(self) -> str | None:
        """What went wrong, for the operator: run error, evaluator error, hook errors."""
        if self.error:
            return self.error
        ev = self.evaluation
        if ev is not None and ev.status != "ok" and ev.status == self.status:
            return ev.problem
        return "; ".join(self.hook_errors) or None

    @property
    def status_reason(self) -> str:
        """Why the status is what it is, capped for a sample row: what the agent broke,
        why the evaluator or the run failed; empty for a run that ended ok."""
        if self.status is RolloutStatus.ok:
            return ""
        if self.status is RolloutStatus.agent_timeout:
            return "the agent spent its time budget"
        return (self.problem or "")[:_REASON_CHARS]

    @property
    def verdict_sources(self) -> dict[str, str]:
        """Per check that reads a verdict, what it read it from (`CheckResult.source`)."""
        checks = self.evaluation.checks if self.evaluation else []
        return {c.name: c.source for c in checks if c.source}


def run_status(agent: AgentResult | None, evaluation: EvaluationResult | None) -> RolloutStatus:
    """Status of a finished run: the budget wins, then a sandbox the agent broke, then a
    broken evaluator, else ok (a non-zero exit is a policy outcome: its reward stands)."""
    if agent is not None and agent.timed_out:
        return RolloutStatus.agent_timeout
    if evaluation is not None and evaluation.status == "agent_broke_sandbox":
        return RolloutStatus.agent_broke_sandbox
    if evaluation is not None and evaluation.status == "eval_error":
        return RolloutStatus.eval_error
    return RolloutStatus.ok


def final_status(run: RolloutStatus, sample_statuses: Iterable[str]) -> RolloutStatus:
    """The rollout's status once its samples are known: an ok run with a sample cut at
    the token limit is `truncated`."""
    if run is RolloutStatus.ok and RolloutStatus.truncated in set(sample_statuses):
        return RolloutStatus.truncated
    return run


def sample_status(
    run: RolloutStatus, *, calls_complete: bool, calls_ok: bool, hit_token_limit: bool
) -> RolloutStatus:
    """Status of one sample row (one segment) of a rollout whose run ended with `run`.

    A segment with a failed or missing call, or from a rollout whose reward is unknown,
    is `infra_error` (kept for visibility, masked for training); the segments of an
    agent that timed out or broke its sandbox stay trainable with reward 0.
    """
    if not (calls_complete and calls_ok):
        return RolloutStatus.infra_error
    if run in (RolloutStatus.eval_error, RolloutStatus.infra_error):
        return RolloutStatus.infra_error
    if run in ZERO_REWARD:
        return run
    if hit_token_limit:
        return RolloutStatus.truncated
    return RolloutStatus.ok
