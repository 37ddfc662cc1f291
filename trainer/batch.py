"""From sample rows to what the loss sees: staleness, masking and GRPO advantages.

Pure Python (no torch) so the rules are unit-tested in any environment:

- staleness is per call: a row carries the version that sampled each of its calls
  (`call_policy_versions`; a rollout may span a policy update). A call that lags the
  trainer's version by more than `max_staleness` (or has no readable version) is
  stale, and its tokens get no loss. A row whose calls are all stale is *stale*:
  `drop` removes it from the batch and from its group's baseline; `mask` keeps its
  reward in the baseline but gives it no loss;
- an `infra_error` row is never trained and never part of a baseline (its reward says
  nothing about the policy);
- advantage = (rollout reward − group mean) / (group std + eps), with mean and std over
  *rollouts* of the group (a rollout may have several rows, one per segment), every
  row of a rollout getting its rollout's advantage.
"""

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from schemas.samples import token_versions
from schemas.training import policy_version_index

T = TypeVar("T")

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
    token_versions: list[str] = field(default_factory=list)
    """The policy version that sampled each response token (empty: unknown)."""


@dataclass
class PreparedBatch:
    rows: list[TrainRow] = field(default_factory=list)
    infra_error: int = 0
    stale: int = 0
    stale_calls: int = 0
    """Calls too old to train on, in rows that were kept for their fresher calls."""
    staleness: list[int] = field(default_factory=list)
    """The lag of every call with a readable version."""

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
        calls = row.get("call_policy_versions") or [row["policy_version"]]
        starts = row.get("call_starts") or [0]
        lags = [staleness_of(v, current_version) for v in calls]
        out.staleness.extend(lag for lag in lags if lag is not None)
        fresh = [lag is not None and 0 <= lag <= max_staleness for lag in lags]
        is_stale = not any(fresh)
        if row["status"] == INFRA_ERROR:
            out.infra_error += 1
            kept.append((row, lags[0], False))
            continue
        if is_stale:
            out.stale += 1
            if stale == "drop":
                continue
        elif not all(fresh):
            out.stale_calls += fresh.count(False)
            row = _mask_calls(row, calls, starts, fresh)
        fresh_lags = [lag for lag, ok in zip(lags, fresh, strict=True) if ok]
        kept.append((row, max(fresh_lags) if fresh_lags else lags[0], not is_stale))
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
                token_versions=token_versions(
                    row.get("call_policy_versions") or [row["policy_version"]],
                    row.get("call_starts") or [0],
                    len(row["response_ids"]),
                ),
            )
        )
    return out


def _mask_calls(
    row: dict[str, Any], calls: list[str], starts: list[int], fresh: list[bool]
) -> dict[str, Any]:
    """The row with the loss of its stale calls' tokens switched off."""
    versions = token_versions(calls, starts, len(row["response_ids"]))
    stale_versions = {v for v, ok in zip(calls, fresh, strict=True) if not ok}
    mask = [
        0 if version in stale_versions else int(bit)
        for bit, version in zip(row["loss_mask"], versions, strict=True)
    ]
    return {**row, "loss_mask": mask}


def tasks_for_step(tasks: list[T], step: int, per_step: int | None) -> list[T]:
    """Step `step`'s (1-based) training tasks: all of them, or the step's slice of
    `per_step` going round the list — deterministic, so a resumed run redoes the same."""
    if per_step is None or not tasks:
        return list(tasks)
    start = (step - 1) * per_step
    return [tasks[(start + i) % len(tasks)] for i in range(per_step)]
