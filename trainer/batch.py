"""From sample rows to what the loss sees: the rules of `bridges.rollouts` (staleness
per call, infra errors masked and out of the baseline, group-relative advantages over
rollouts), flattened to one `TrainRow` per segment with its rollout's advantage.

Pure Python (no torch) so it is unit-tested in any environment.
"""

from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from bridges.rollouts import ConversionRules, to_training_rollouts

T = TypeVar("T")


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


def prepare_batch(
    rows: list[dict[str, Any]],
    current_version: int,
    max_staleness: int,
    stale: Literal["drop", "mask"] = "drop",
    eps: float = 1e-6,
) -> PreparedBatch:
    """Sample rows (dicts with the Parquet columns) → rows with advantages and flags."""
    rules = ConversionRules(
        current_version=current_version, max_staleness=max_staleness, stale=stale
    )
    converted = to_training_rollouts(rows, rules)
    out = PreparedBatch(
        infra_error=converted.infra_error,
        stale=converted.stale,
        stale_calls=converted.stale_calls,
        staleness=converted.staleness,
    )
    for group in converted.groups:
        advantages = group.advantages(eps)
        for rollout in group.rollouts:
            out.rows += [
                TrainRow(
                    rollout_id=rollout.rollout_id,
                    segment_id=segment.segment_id,
                    group_id=rollout.group_id,
                    prompt_ids=segment.prompt_ids,
                    response_ids=segment.response_ids,
                    loss_mask=segment.loss_mask,
                    logprobs=segment.logprobs,
                    reward=rollout.reward,
                    advantage=advantages[rollout.rollout_id] if segment.trained else 0.0,
                    staleness=segment.staleness,
                    trained=segment.trained,
                    token_versions=segment.token_versions,
                )
                for segment in rollout.segments
            ]
    return out


def tasks_for_step(tasks: list[T], step: int, per_step: int | None) -> list[T]:
    """Step `step`'s (1-based) training tasks: all of them, or the step's slice of
    `per_step` going round the list — deterministic, so a resumed run redoes the same."""
    if per_step is None or not tasks:
        return list(tasks)
    start = (step - 1) * per_step
    return [tasks[(start + i) % len(tasks)] for i in range(per_step)]
