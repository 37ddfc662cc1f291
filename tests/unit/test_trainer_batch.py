"""The trainer's batch rules with hand-computed values: group-relative advantages over
rollouts, infra errors masked and out of the baseline, staleness drop/mask, versions."""

from typing import Any

import pytest

from schemas.training import policy_version_index, policy_version_name, run_id_for
from trainer.batch import prepare_batch, tasks_for_step


def row(
    rollout: str,
    reward: float,
    group: str = "g",
    status: str = "ok",
    version: str = "v3",
    segment: str = "s0",
    mask: list[int] | None = None,
) -> dict[str, Any]:
    mask = [1, 1] if mask is None else mask
    return {
        "rollout_id": rollout,
        "segment_id": segment,
        "group_id": group,
        "prompt_ids": [1, 2],
        "response_ids": [3] * len(mask),
        "loss_mask": mask,
        "logprobs": [-0.5] * len(mask),
        "reward": reward,
        "status": status,
        "policy_version": version,
    }


def advantages(batch: Any) -> dict[tuple[str, str], float]:
    return {(r.rollout_id, r.segment_id): r.advantage for r in batch.rows}


def test_versions_round_trip() -> None:
    assert policy_version_name("run-1a2b3c", 7) == "run-1a2b3c-v7"
    assert policy_version_index("run-1a2b3c-v7") == 7
    assert run_id_for("my run_2", "1a2b3c") == "my-run-2-1a2b3c"
    assert run_id_for("__", "1a2b3c") == "run-1a2b3c"
    assert policy_version_index("v7") == 7
    assert policy_version_index("tiny-random-v0") == 0
    assert policy_version_index("run.v12") == 12
    assert policy_version_index("unversioned") is None
    assert policy_version_index("rev3") is None


def test_group_advantages_over_rollouts_not_rows() -> None:
    """Rewards 1, 0, 0, 1 → mean 0.5, population std 0.5 → advantages ±1 (eps 0). The
    two-segment rollout `a` counts once in the statistics and both rows get +1."""
    rows = [
        row("a", 1.0, segment="s0"),
        row("a", 1.0, segment="s1"),
        row("b", 0.0),
        row("c", 0.0),
        row("d", 1.0),
    ]
    batch = prepare_batch(rows, current_version=3, max_staleness=1, eps=0.0)
    assert advantages(batch) == {
        ("a", "s0"): 1.0,
        ("a", "s1"): 1.0,
        ("b", "s0"): -1.0,
        ("c", "s0"): -1.0,
        ("d", "s0"): 1.0,
    }
    assert all(r.trained for r in batch.rows)
    assert batch.tokens == 10


def test_groups_are_independent_and_equal_rewards_give_zero() -> None:
    """Group x: 3 and 1 → mean 2, std 1 → +1, −1. Group y: all 0.5 → advantage 0."""
    rows = [
        row("x1", 3.0, group="x"),
        row("x2", 1.0, group="x"),
        row("y1", 0.5, group="y"),
        row("y2", 0.5, group="y"),
    ]
    batch = prepare_batch(rows, current_version=3, max_staleness=0, eps=0.0)
    assert advantages(batch) == {
        ("x1", "s0"): 1.0,
        ("x2", "s0"): -1.0,
        ("y1", "s0"): 0.0,
        ("y2", "s0"): 0.0,
    }


def test_infra_error_is_masked_and_out_of_the_baseline() -> None:
    """With the infra-error rollout (reward 0) counted the mean would be 1/3; without it
    rewards 1, 0 → mean 0.5, std 0.5 → ±1. The infra row stays, untrained, advantage 0."""
    rows = [row("a", 1.0), row("b", 0.0), row("c", 0.0, status="infra_error")]
    batch = prepare_batch(rows, current_version=3, max_staleness=1, eps=0.0)
    assert advantages(batch) == {("a", "s0"): 1.0, ("b", "s0"): -1.0, ("c", "s0"): 0.0}
    trained = {r.rollout_id: r.trained for r in batch.rows}
    assert trained == {"a": True, "b": True, "c": False}
    assert batch.infra_error == 1
    assert batch.tokens == 4


def test_stale_rows_are_dropped_with_their_reward() -> None:
    """Current v3, max staleness 1: v2 (lag 1) stays, v1 (lag 2) and an unversioned row
    go. Remaining rewards 1, 0 → ±1; the dropped rollout's reward 1 is not in the mean."""
    rows = [
        row("a", 1.0, version="v3"),
        row("b", 0.0, version="v2"),
        row("c", 1.0, version="v1"),
        row("d", 1.0, version="unversioned"),
    ]
    batch = prepare_batch(rows, current_version=3, max_staleness=1, stale="drop", eps=0.0)
    assert advantages(batch) == {("a", "s0"): 1.0, ("b", "s0"): -1.0}
    assert batch.stale == 2
    assert sorted(batch.staleness) == [0, 1, 2]


def test_stale_rows_masked_stay_in_the_baseline() -> None:
    """mask: the v1 row (lag 2) keeps its reward in the baseline — rewards 1, 0, 1 →
    mean 2/3, std √(2/9) — but gets no loss and advantage 0."""
    rows = [row("a", 1.0), row("b", 0.0), row("c", 1.0, version="v1")]
    batch = prepare_batch(rows, current_version=3, max_staleness=1, stale="mask", eps=0.0)
    std = (2 / 9) ** 0.5
    got = advantages(batch)
    assert got[("a", "s0")] == pytest.approx((1 - 2 / 3) / std)
    assert got[("b", "s0")] == pytest.approx((0 - 2 / 3) / std)
    assert got[("c", "s0")] == 0.0
    assert {r.rollout_id: r.trained for r in batch.rows} == {"a": True, "b": True, "c": False}


def test_a_row_from_a_future_version_is_stale() -> None:
    """A sample claiming a version newer than the trainer's cannot be on-policy data."""
    batch = prepare_batch([row("a", 1.0, version="v4")], current_version=3, max_staleness=1)
    assert batch.rows == [] and batch.stale == 1


def test_rows_without_trainable_tokens_are_not_trained() -> None:
    rows = [row("a", 1.0, mask=[0, 0]), row("b", 0.0)]
    batch = prepare_batch(rows, current_version=3, max_staleness=1, eps=0.0)
    assert {r.rollout_id: r.trained for r in batch.rows} == {"a": False, "b": True}
    assert advantages(batch)[("b", "s0")] == -1.0


def test_staleness_is_per_call_in_a_row_that_spans_an_update() -> None:
    """Trainer at v3, max_staleness 1: a row whose first call was sampled by v1 (lag 2)
    and second by v3 keeps the v3 call's tokens in the loss and masks the v1 call's; a
    row sampled only by v1 is stale and dropped. Every call's lag is reported."""
    spanning = row("a", 1.0, mask=[1, 1, 0, 1, 1]) | {
        "policy_version": "v1",
        "call_policy_versions": ["v1", "v3"],
        "call_starts": [0, 3],
    }
    old = row("b", 0.0, version="v1")
    batch = prepare_batch([spanning, old], current_version=3, max_staleness=1, eps=0.0)
    [kept] = batch.rows
    assert kept.rollout_id == "a" and kept.trained
    assert kept.loss_mask == [0, 0, 0, 1, 1]
    assert kept.token_versions == ["v1", "v1", "v1", "v3", "v3"]
    assert kept.staleness == 0
    assert (batch.stale, batch.stale_calls, sorted(batch.staleness)) == (1, 1, [0, 2, 2])


def test_each_step_takes_the_next_slice_of_tasks_going_round_the_file() -> None:
    tasks = list("abcde")
    assert [tasks_for_step(tasks, step, 2) for step in (1, 2, 3, 4)] == [
        ["a", "b"], ["c", "d"], ["e", "a"], ["b", "c"],
    ]  # fmt: skip
    assert tasks_for_step(tasks, 7, None) == tasks  # unset: every task, every step


def test_tasks_per_step_must_be_positive() -> None:
    from pydantic import ValidationError

    from schemas.training import TrainConfig

    with pytest.raises(ValidationError, match="tasks_per_step"):
        TrainConfig(tasks="t", out="o", init_policy="p", engines=["http://e"], tasks_per_step=0)


def test_held_out_runs_at_step_one_every_nth_step_after_it() -> None:
    from schemas.training import TrainConfig

    def due(every: int) -> list[int]:
        cfg = TrainConfig(
            tasks="t", out="o", init_policy="p", engines=["http://e"], heldout_every=every
        )
        return [step for step in range(1, 11) if cfg.heldout_due(step)]

    assert due(1) == list(range(1, 11))
    assert due(3) == [1, 4, 7, 10]
    assert due(0) == [1]
