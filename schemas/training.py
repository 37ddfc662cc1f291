"""The reference trainer's boundary models: its configuration and its per-step metrics.

`rollout train` (workers) builds a `TrainConfig` and hands it to the trainer process as
JSON; the trainer appends one `StepMetrics` per step to `OUT/metrics.jsonl`, which the
curve, the demo and tests read. Both sides import only this module, so the CLI never
loads torch and the trainer never loads the CLI.
"""

import re
from typing import Literal

from pydantic import Field, model_validator

from schemas.base import StrictModel

#: Policy versions the trainer writes: `<run_id>-v0` (the initial policy), `-v1`, ...
#: The run id makes them unique across runs, so samples, checkpoints and the version an
#: engine reports never confuse two runs' `v1`.
_VERSION_RE = re.compile(r"(?:^|[^0-9A-Za-z])v(\d+)$|^v(\d+)$")
_RUN_ID_CHARS = re.compile(r"[^A-Za-z0-9]+")


def policy_version_name(run_id: str, index: int) -> str:
    return f"{run_id}-v{index}"


def run_id_for(out_name: str, suffix: str) -> str:
    """A readable run id from the output directory's name plus a random suffix."""
    stem = _RUN_ID_CHARS.sub("-", out_name).strip("-")[:40] or "run"
    if not stem[0].isalnum():
        stem = f"r{stem}"
    return f"{stem}-{suffix}"


def policy_version_index(version: str) -> int | None:
    """`v3` → 3 (also `run-v3`, `tiny-random-v0`); None when there is no trailing `vN`."""
    match = _VERSION_RE.search(version)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


class TrainConfig(StrictModel):
    """Everything one training run needs; a rerun with the same `out` resumes."""

    tasks: str = Field(description="training tasks (JSONL of RolloutTask)")
    out: str = Field(description="output directory: policies/, samples/, metrics.jsonl, curve")
    init_policy: str = Field(description="model directory of the starting policy (v0)")
    temporal: str = "127.0.0.1:7233"
    namespace: str = "default"
    task_queue: str = "rollouts"
    gateway: str | None = Field(
        default=None,
        description="the Gateway's control URL: each new policy goes through its "
        "`POST /policy` (pause, drain, every engine loads it, resume), so every call "
        "records the version that sampled it; admin token from ROLLOUT_ADMIN_TOKEN",
    )
    engines: list[str] = Field(
        default_factory=list,
        description="without `gateway`: vLLM base URLs the trainer loads each policy into "
        "itself (calls in flight then record the old version's name)",
    )
    steps: int = Field(default=2, ge=1)
    tasks_per_step: int | None = Field(
        default=None,
        ge=1,
        description="None: every task, every step; N: step k takes the k-th slice of N "
        "tasks, going round the file (fresh tasks each step instead of the same few)",
    )
    group_size: int = Field(default=4, ge=2, description="rollouts per task (one GRPO group)")
    heldout: str | None = Field(default=None, description="held-out tasks (JSONL), not trained")
    heldout_samples: int = Field(default=1, ge=1)
    heldout_every: int = Field(
        default=1,
        ge=0,
        description="held-out rollouts with step 1 and then every N-th step (1, 1+N, …); "
        "0: step 1 only. The final policy is always evaluated. Held-out rollouts cost as "
        "much as training ones, so evaluating every step doubles a small run",
    )
    lr: float = Field(default=5e-5, gt=0)
    adam_eps: float = Field(
        default=1e-8,
        gt=0,
        description="AdamW's eps. Its first steps move every parameter by about ±lr, also "
        "those whose gradient is only noise (format tokens whose +A and -A cancel); on a "
        "small model with small batches that can lower the reward of the very rollouts it "
        "rewarded. A larger eps (1e-5..1e-3) makes those parameters move in proportion to "
        "their gradient instead",
    )
    updates_per_step: int = Field(default=1, ge=1, description="optimiser steps per step")
    clip_low: float = Field(default=0.2, ge=0, lt=1)
    clip_high: float = Field(default=0.2, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    max_staleness: int = Field(default=1, ge=0, description="policy versions a sample may lag")
    stale: Literal["drop", "mask"] = Field(
        default="drop",
        description="drop: stale rows leave the batch; mask: they stay in the group baseline "
        "but get no loss",
    )
    overlap: bool = Field(
        default=True,
        description="one-step off-policy: step k+1's rollouts run while step k trains",
    )
    agreement_limit: float = Field(default=0.01, gt=0, description="mean |Δ logprob| alarm")
    seed: int = 0
    trainer: Literal["reference", "trl"] = Field(
        default="reference",
        description="who computes the update: `reference` (trainer.loop) or `trl` (TRL's "
        "GRPOTrainer through bridges.trl, in its own environment; no resume, no overlap)",
    )
    run_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]{0,60}$",
        description="prefix of every policy version; None: from `out`'s name, once",
    )

    def heldout_due(self, step: int) -> bool:
        """Whether step `step` (1-based) runs the held-out tasks with its rollouts."""
        if self.heldout_every == 0:
            return step == 1
        return (step - 1) % self.heldout_every == 0

    @model_validator(mode="after")
    def _publishes_somewhere(self) -> "TrainConfig":
        if self.gateway is None and not self.engines:
            raise ValueError(
                "give `gateway` (its control URL) or `engines`: new policies "
                "must reach the engines, else rollouts sample the old weights"
            )
        return self


class TokenMismatch(StrictModel):
    """Where trainer and engine disagree most: enough to find the segment and token."""

    rollout_id: str
    segment_id: str
    position: int = Field(description="index into response_ids")
    token_id: int
    trainer_logprob: float
    engine_logprob: float


class StepMetrics(StrictModel):
    """One line of `OUT/metrics.jsonl`."""

    step: int
    policy: str = Field(description="the policy this step produced")
    sampled_by: str = Field(description="the policy served when the step's rollouts started")
    rollouts: int
    rollouts_ok: int
    rows: int
    rows_trained: int
    rows_infra_error: int
    rows_stale: int
    tokens_trained: int
    reward_mean: float | None = Field(
        description="mean reward of the step's scored rollouts; None when none was scored "
        "(JSON has no NaN, so 'no value' must be null and read back as such)"
    )
    reward_std: float
    heldout_reward: float | None = None
    agree_mean: float
    agree_max: float
    ratio_mean: float
    tokens_sampled_by_label: int = Field(
        default=0,
        description="off-policy: loss tokens that the older labelled policy explains better "
        "than the current one (the rest were sampled after the weight update)",
    )
    worst_token: TokenMismatch | None = None
    staleness_max: int
    staleness_mean: float
    loss: float
    clip_fraction: float
    grad_norm: float
    rollout_s: float
    train_s: float
    publish_s: float
    overlap_s: float = Field(
        default=0.0, description="seconds of this step's training with the next rollouts running"
    )
    overlap_fraction: float = Field(
        default=0.0, description="overlap_s / (train + publish time): how much of it was hidden"
    )
    publish_drained_calls: int = Field(
        default=0, description="engine calls the policy update let finish before loading"
    )
    publish_held_calls: int = Field(
        default=0, description="engine calls that waited during the policy update"
    )
    stale_calls: int = Field(
        default=0, description="calls too old to train on, masked in rows kept for fresher calls"
    )
    step_s: float
    rollouts_per_s: float


class FinalEval(StrictModel):
    """`OUT/final_heldout.json`: the held-out reward of the last policy."""

    policy: str
    heldout_reward: float | None = Field(description="None when no held-out rollout was scored")
    heldout_rollouts: int
