"""From sample rows to what the loss sees: staleness, masking and GRPO advantages.

Pure Python (no torch) so the rules are unit-tested in any environment:

- a row whose `policy_version` lags the trainer's by more than `max_staleness`
  versions (or has no readable version) is *stale*: `drop` removes it from the batch
  and from its group's baseline; `mask` keeps its reward in the baseline but gives it
  no loss;
- an `infra_error` row is never trained and never part of a baseline (its reward says
  nothing about the policy);
- advantage = (rollout reward − group mean) / (group std + eps), with mean and std over
  *rollouts* of the group (a rollout may have several rows, one per segment), every
  row of a rollout getting its rollout's advantage.
"""

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from schemas.training import policy_version_index

INFRA_ERROR = "infra_error"


@dataclass
class TrainRow:
    """One sample row the loss may use; `trained` False means it contributes no loss."""

    rollout_id: str
    segment_id: str
    group_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    advantage: float
    staleness: int | None
    trained: bool


@dataclass
class PreparedBatch:
    rows: list[TrainRow] = field(default_factory=list)
    infra_error: int = 0
    stale: int = 0
    staleness: list[int] = field(default_factory=list)

    @property
    def trained(self) -> list[TrainRow]:
        return [r for r in self.rows if r.trained]

    @property
    def tokens(self) -> int:
        return sum(sum(r.loss_mask) for r in self.trained)


def staleness_of(policy_version: str, current: int) -> int | None:
    index = policy_version_index(policy_version)
    return None if index is None else current - index


def prepare_batch(
    rows: list[dict[str, Any]],
    current_version: int,
    max_staleness: int,
    stale: Literal["drop", "mask"] = "drop",
    eps: float = 1e-6,
) -> PreparedBatch:
    """Sample rows (dicts with the Parquet columns) → rows with advantages and flags."""
    out = PreparedBatch()
    kept: list[tuple[dict[str, Any], int | None, bool]] = []
    for row in rows:
        lag = staleness_of(row["policy_version"], current_version)
        if lag is not None:
            out.staleness.append(lag)
        is_stale = lag is None or lag > max_staleness or lag < 0
        if row["status"] == INFRA_ERROR:
            out.infra_error += 1
            kept.append((row, lag, False))
            continue
        if is_stale:
            out.stale += 1
            if stale == "drop":
                continue
        kept.append((row, lag, not is_stale))
    baseline: dict[str, dict[str, float]] = defaultdict(dict)
    for row, _lag, _trained in kept:
        if row["status"] != INFRA_ERROR:
            baseline[row["group_id"]][row["rollout_id"]] = float(row["reward"])
    stats: dict[str, tuple[float, float]] = {}
    for group, by_rollout in baseline.items():
        values = list(by_rollout.values())
        std = statistics.pstdev(values) if len(values) > 1 else 0.0
        stats[group] = (statistics.fmean(values), std)
    for row, lag, trained in kept:
        advantage = 0.0
        if trained and row["group_id"] in stats:
            mean, std = stats[row["group_id"]]
            centred = float(row["reward"]) - mean
            advantage = centred / (std + eps) if centred else 0.0  # equal rewards: no signal
        out.rows.append(
            TrainRow(
                rollout_id=row["rollout_id"],
                segment_id=row["segment_id"],
                group_id=row["group_id"],
                prompt_ids=list(row["prompt_ids"]),
                response_ids=list(row["response_ids"]),
                loss_mask=[int(b) for b in row["loss_mask"]],
                logprobs=[float(x) for x in row["logprobs"]],
                reward=float(row["reward"]),
                advantage=advantage,
                staleness=lag,
                trained=trained and sum(row["loss_mask"]) > 0,
            )
        )
    return out
