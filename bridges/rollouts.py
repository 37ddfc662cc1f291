"""Our sample rows → trainer-neutral rollouts: the training rules, written once.

Every bridge (TRL, verl, SkyRL, slime, OpenRLHF) and the reference trainer start from
:func:`to_training_rollouts`, so what is trained, what is masked and what forms a
baseline is decided here and nowhere else:

- **Rows, segments, rollouts, groups.** A Parquet row is one trainable segment of one
  rollout; a rollout has several when the agent's context was compacted (`continues`)
  or it spawned sub-agents (`spawned_by`). All segments of a rollout share its reward,
  status and advantage. Trainers that take one sample per rollout (TRL, verl, SkyRL)
  take :attr:`TrainingRollout.primary`, the segment with the most trained tokens; the
  others are counted in :attr:`ConvertedBatch.segments_left_out` by those bridges.
- **Multi-turn masks.** `loss_mask` is 1 on tokens the policy sampled and 0 on tool and
  environment tokens (and on the chat template's own tokens between calls).
- **Our failures are masked and out of the baseline.** An `infra_error` rollout trains
  nothing (its loss mask is all 0) and its reward is in no group's mean or std: it says
  nothing about the policy. The agent's failures (`agent_timeout`,
  `agent_broke_sandbox`) are trained with the reward they got.
- **Staleness is per call.** Each call carries the policy version that sampled it. A
  call lagging the trainer's version by more than `max_staleness` (or newer than it,
  or with no readable version) is stale: its tokens get loss 0. A call the Gateway
  labelled `unknown` (an engine in an unknown state after a failed weight load) is
  never trained, with or without a current version. A rollout whose calls
  are all stale is dropped with its reward (`stale="drop"`) or kept in the baseline
  without loss (`stale="mask"`).
- **Truncated rollouts** (the agent ran out of context or turns) are trained with
  their reward by default; `truncated="mask"` treats them like stale ones under `mask`.
- **A segment that trains nothing has an all-0 loss mask**, so a bridge that forgets
  to look at `trained` still applies no loss.
- **Each call keeps its sampling parameters** (`TrainingSegment.call_sampling`, aligned
  with its calls): the tokens from one call start to the next were sampled with them,
  so a trainer that corrects for the behaviour policy reads them per call, not per row.

Pure Python and pydantic (no torch): unit-tested in any environment, and cheap enough
to convert a large batch (`bench/trainer_conversion.py`).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.outcome import SAMPLE_STATUSES, RolloutStatus
from schemas.policy import UNKNOWN_WEIGHTS
from schemas.routing import RoutedExperts
from schemas.samples import metrics_of, token_versions
from schemas.training import policy_version_index

_REQUIRED = (
    "rollout_id",
    "segment_id",
    "group_id",
    "prompt_ids",
    "response_ids",
    "loss_mask",
    "logprobs",
    "reward",
    "status",
    "policy_version",
)


class ConversionError(ValueError):
    """A row that cannot become training data; names the rollout and the field."""

    def __init__(self, rollout_id: str, field: str, problem: str) -> None:
        super().__init__(f"rollout {rollout_id!r}: {field}: {problem}")
        self.rollout_id = rollout_id
        self.field = field


class ConversionRules(BaseModel):
    """How rows become training data (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    current_version: int | None = Field(
        default=None,
        description="the trainer's policy index (`policy_version_index`); None: no "
        "staleness check (every call fresh)",
    )
    max_staleness: int = Field(default=1, ge=0)
    stale: Literal["drop", "mask"] = "drop"
    truncated: Literal["train", "mask"] = "train"


class TrainingSegment(BaseModel):
    """One trainable sequence: a prompt and the response the policy continued it with."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    segment_id: str
    group_id: str
    task_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int] = Field(description="1: policy token with loss; 0: tool/env or stale")
    logprobs: list[float] = Field(description="behaviour log-probs, aligned with response_ids")
    call_starts: list[int]
    call_policy_versions: list[str]
    call_sampling: list[str] = Field(
        default_factory=list,
        description="JSON of the sampling parameters each call was sampled with, aligned "
        "with call_starts (a row without `call_sampling`: its `sampling` for every call)",
    )
    trained: bool
    staleness: int | None = Field(description="largest lag of its trained calls")
    routed_experts: RoutedExperts | None = Field(
        default=None,
        description="the routing of prompt_ids + response_ids but the last token (None: "
        "not recorded, `routing_missing` says why when asked)",
    )
    routing_missing: str = ""

    @property
    def num_calls(self) -> int:
        return len(self.call_starts)

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def token_versions(self) -> list[str]:
        """The version that sampled each response token."""
        return token_versions(self.call_policy_versions, self.call_starts, len(self.response_ids))

    def sampling_of_calls(self) -> list[dict[str, Any]]:
        """`call_sampling` parsed: each call's parameters (a field absent was the
        engine's default)."""
        return [json.loads(text) for text in self.call_sampling]


def aligned(rollout_id: str, segment: TrainingSegment) -> TrainingSegment:
    """`segment`, after checking its loss mask and logprobs align with its response ids:
    a segment changed after conversion raises :class:`ConversionError` (rollout, field,
    segment) instead of reaching a trainer misaligned."""
    n = len(segment.response_ids)
    for name, values in (("loss_mask", segment.loss_mask), ("logprobs", segment.logprobs)):
        if len(values) != n:
            raise ConversionError(
                rollout_id,
                name,
                f"{len(values)} entries for {n} response_ids (segment {segment.segment_id})",
            )
    return segment


class TrainingRollout(BaseModel):
    """One rollout: one GRPO sample, one or more segments."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    group_id: str
    task_id: str
    sample_index: int
    status: RolloutStatus
    reward: float
    step_rewards: list[float] | None
    segments: list[TrainingSegment]
    in_baseline: bool = Field(description="its reward counts in its group's mean and std")
    task_source: str = Field(default="", description="`<format>:<ref>` of the task")
    reward_metrics: dict[str, float] = Field(
        default_factory=dict, description="the verifier's metrics besides the reward"
    )

    @property
    def truncated(self) -> bool:
        return self.status == RolloutStatus.truncated

    @property
    def trained(self) -> bool:
        return any(s.trained for s in self.segments)

    @property
    def primary(self) -> TrainingSegment:
        """The one segment a one-sample-per-rollout trainer takes: most trained tokens,
        then longest response, then first."""
        return max(
            self.segments,
            key=lambda s: (s.trained_tokens, len(s.response_ids), -self.segments.index(s)),
        )

    @property
    def num_turns(self) -> int:
        return sum(s.num_calls for s in self.segments)

    @property
    def policy_versions(self) -> list[str]:
        """Every version that sampled one of its calls, in first-use order."""
        return list(dict.fromkeys(v for s in self.segments for v in s.call_policy_versions))


class TrainingGroup(BaseModel):
    """The rollouts of one task sampled together: one GRPO baseline."""

    model_config = ConfigDict(extra="forbid")

    group_id: str
    task_id: str
    rollouts: list[TrainingRollout]

    def baseline(self) -> tuple[float, float] | None:
        """Mean and population std of the rewards in the baseline (None: none is)."""
        rewards = [r.reward for r in self.rollouts if r.in_baseline]
        if not rewards:
            return None
        mean = math.fsum(rewards) / len(rewards)  # floats (statistics.pstdev is exact, slow)
        return mean, math.sqrt(math.fsum((x - mean) ** 2 for x in rewards) / len(rewards))

    def fill_reward(self, default: float = 0.0) -> float:
        """The reward a trainer that cannot leave a sample out of a group gives a rollout
        out of the baseline: the baseline's mean, so the group's mean over every sample
        stays the mean over the rollouts that count (`default` when none counts)."""
        stats = self.baseline()
        return stats[0] if stats else default

    def advantages(self, eps: float = 1e-6) -> dict[str, float]:
        """GRPO advantage per rollout: (reward − mean) / (std + eps) over the baseline;
        0 for a rollout that trains nothing and when every reward is equal."""
        stats = self.baseline()
        out: dict[str, float] = {}
        for rollout in self.rollouts:
            centred = rollout.reward - stats[0] if stats and rollout.trained else 0.0
            out[rollout.rollout_id] = centred / (stats[1] + eps) if centred else 0.0
        return out


class ConvertedBatch(BaseModel):
    """What :func:`to_training_rollouts` made of a batch of rows, with its counters."""

    model_config = ConfigDict(extra="forbid")

    groups: list[TrainingGroup] = Field(default_factory=list)
    infra_error: int = Field(default=0, description="rollouts masked as our failures")
    stale: int = Field(default=0, description="rollouts whose every call was stale")
    stale_calls: int = Field(default=0, description="stale calls in rollouts kept")
    staleness: list[int] = Field(
        default_factory=list, description="the lag of every call with a readable version"
    )

    @property
    def rollouts(self) -> list[TrainingRollout]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def segments_left_out(self) -> int:
        """Segments a one-sample-per-rollout trainer does not see (all but `primary`)."""
        return sum(len(r.segments) - 1 for r in self.rollouts)


def to_training_rollouts(
    rows: Iterable[Mapping[str, Any]], rules: ConversionRules | None = None
) -> ConvertedBatch:
    """Rows (dicts with the Parquet columns, e.g. `table.to_pylist()`) → groups of
    rollouts with masks and flags applied; raises :class:`ConversionError` on a row
    whose fields are missing or disagree (never feeds a trainer a misaligned row)."""
    rules = rules or ConversionRules()
    out = ConvertedBatch()
    by_rollout: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        _check_row(row)
        by_rollout.setdefault(str(row["rollout_id"]), []).append(row)
    groups: dict[str, TrainingGroup] = {}
    for rollout_id, rollout_rows in by_rollout.items():
        rollout = _rollout(rollout_id, rollout_rows, rules, out)
        if rollout is None:
            continue
        group = groups.get(rollout.group_id)
        if group is None:
            group = groups[rollout.group_id] = TrainingGroup.model_construct(
                group_id=rollout.group_id, task_id=rollout.task_id, rollouts=[]
            )
        group.rollouts.append(rollout)
    out.groups = list(groups.values())
    return out


def _check_row(row: Mapping[str, Any]) -> None:
    rollout_id = str(row.get("rollout_id", "?"))
    for name in _REQUIRED:
        if row.get(name) is None:
            raise ConversionError(rollout_id, name, "missing")
    n = len(row["response_ids"])
    for name in ("loss_mask", "logprobs"):
        if len(row[name]) != n:
            raise ConversionError(
                rollout_id, name, f"{len(row[name])} entries for {n} response_ids"
            )
    if not set(row["loss_mask"]) <= {0, 1}:
        raise ConversionError(rollout_id, "loss_mask", "holds values other than 0 and 1")
    if row["status"] not in SAMPLE_STATUSES:
        raise ConversionError(rollout_id, "status", f"{row['status']!r} is not a sample status")
    versions, starts = row.get("call_policy_versions") or [], row.get("call_starts") or []
    if len(versions) != len(starts):
        raise ConversionError(
            rollout_id,
            "call_starts",
            f"{len(starts)} starts for {len(versions)} call_policy_versions",
        )
    if any(b < a for a, b in itertools.pairwise(starts)) or any(not 0 <= s <= n for s in starts):
        raise ConversionError(rollout_id, "call_starts", f"not ascending within 0..{n}")
    sampling = row.get("call_sampling") or []
    if sampling and len(sampling) != len(versions):
        raise ConversionError(
            rollout_id,
            "call_sampling",
            f"{len(sampling)} entries for {len(versions)} call_policy_versions",
        )


def _rollout(
    rollout_id: str,
    rows: list[Mapping[str, Any]],
    rules: ConversionRules,
    out: ConvertedBatch,
) -> TrainingRollout | None:
    first = rows[0]
    for row in rows[1:]:
        for name in ("group_id", "reward", "status"):
            if row[name] != first[name]:
                raise ConversionError(
                    rollout_id,
                    name,
                    f"segments disagree ({first[name]!r} in {first['segment_id']}, "
                    f"{row[name]!r} in {row['segment_id']})",
                )
    status = RolloutStatus(first["status"])
    excused = status == RolloutStatus.infra_error
    masked = excused or (status == RolloutStatus.truncated and rules.truncated == "mask")
    segments: list[TrainingSegment] = []
    calls = fresh_calls = 0
    for row in rows:
        segment, n_calls, n_fresh = _segment(row, rules, out, trainable=not masked)
        segments.append(segment)
        calls += n_calls
        fresh_calls += n_fresh
    all_stale = fresh_calls == 0 and calls > 0
    if excused:
        out.infra_error += 1
    elif all_stale:
        out.stale += 1
        if rules.stale == "drop":
            return None
    else:
        out.stale_calls += calls - fresh_calls
    return TrainingRollout.model_construct(
        rollout_id=rollout_id,
        group_id=str(first["group_id"]),
        task_id=str(first.get("task_id") or ""),
        sample_index=int(first.get("sample_index") or 0),
        status=status,
        reward=float(first["reward"]),
        step_rewards=first.get("step_rewards"),
        segments=segments,
        in_baseline=not excused,
        task_source=str(first.get("task_source") or ""),
        reward_metrics=_metrics(rollout_id, first.get("reward_metrics")),
    )


def _metrics(rollout_id: str, raw: object) -> dict[str, float]:
    """The row's `reward_metrics` JSON (absent in rows written before schema v4)."""
    if raw is None or raw in ("", "{}"):
        return {}
    try:
        return metrics_of(str(raw))
    except ValueError as exc:
        raise ConversionError(rollout_id, "reward_metrics", str(exc)) from exc


def _segment(
    row: Mapping[str, Any], rules: ConversionRules, out: ConvertedBatch, trainable: bool
) -> tuple[TrainingSegment, int, int]:
    """The row as a segment; (segment, its calls, its fresh calls)."""
    versions = list(row.get("call_policy_versions") or [row["policy_version"]])
    starts = list(row.get("call_starts") or [0])
    sampling = list(row.get("call_sampling") or [])
    if not sampling and row.get("sampling"):
        sampling = [str(row["sampling"])] * len(versions)
    response = list(row["response_ids"])
    mask = list(map(int, row["loss_mask"]))
    lags: list[int | None] = [None] * len(versions)
    fresh = [v != UNKNOWN_WEIGHTS for v in versions]
    if rules.current_version is not None:
        lags = [_lag(v, rules.current_version) for v in versions]
        out.staleness.extend(lag for lag in lags if lag is not None)
        fresh = [lag is not None and 0 <= lag <= rules.max_staleness for lag in lags]
    if not all(fresh):  # the stale calls' tokens get no loss
        stale_versions = {v for v, ok in zip(versions, fresh, strict=True) if not ok}
        per_token = token_versions(versions, starts, len(response))
        mask = [0 if v in stale_versions else b for b, v in zip(mask, per_token, strict=True)]
    if not trainable or not any(fresh):
        mask = [0] * len(response)
    fresh_lags = [lag for lag, ok in zip(lags, fresh, strict=True) if ok and lag is not None]
    segment = TrainingSegment.model_construct(
        rollout_id=str(row["rollout_id"]),
        segment_id=str(row["segment_id"]),
        group_id=str(row["group_id"]),
        task_id=str(row.get("task_id") or ""),
        prompt_ids=list(row["prompt_ids"]),
        response_ids=response,
        loss_mask=mask,
        logprobs=list(map(float, row["logprobs"])),
        call_starts=starts,
        call_policy_versions=versions,
        call_sampling=sampling,
        trained=any(mask),
        staleness=max(fresh_lags) if fresh_lags else (lags[0] if lags else None),
        routed_experts=_routing(row),
        routing_missing=str(row.get("routing_missing") or ""),
    )
    return segment, len(versions), fresh.count(True)


def _routing(row: Mapping[str, Any]) -> RoutedExperts | None:
    """The row's `routed_experts` (schema v8; absent before), checked to cover every
    token but the last."""
    raw = row.get("routed_experts")
    if raw is None:
        return None
    rollout_id = str(row["rollout_id"])
    try:
        routing = RoutedExperts.model_validate(raw)
    except ValidationError as exc:
        raise ConversionError(rollout_id, "routed_experts", str(exc)) from exc
    tokens = len(row["prompt_ids"]) + len(row["response_ids"]) - 1
    if routing.start != 0 or routing.tokens != tokens:
        raise ConversionError(
            rollout_id,
            "routed_experts",
            f"{routing.tokens} rows from {routing.start}; the segment has {tokens} routed tokens",
        )
    return routing


def _lag(version: str, current: int) -> int | None:
    index = _version_index(version)
    return None if index is None else current - index


@functools.lru_cache(maxsize=4096)
def _version_index(version: str) -> int | None:
    return policy_version_index(version)
