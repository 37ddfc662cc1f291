"""The trainer-neutral conversion rules (`bridges.rollouts`), one test per rule, with
hand-computed values: segments and the primary one, multi-turn masks, infra errors,
per-call staleness, truncation, advantages, and the errors on rows that disagree."""

from typing import Any

import pytest

from bridges.rollouts import ConversionError, ConversionRules, to_training_rollouts

V3 = ConversionRules(current_version=3, max_staleness=1)


def row(
    rollout: str,
    reward: float = 1.0,
    *,
    group: str = "g",
    segment: str = "s0",
    status: str = "ok",
    mask: list[int] | None = None,
    versions: list[str] | None = None,
    starts: list[int] | None = None,
) -> dict[str, Any]:
    mask = [1, 1] if mask is None else mask
    versions = versions or ["v3"]
    return {
        "rollout_id": rollout,
        "task_id": "t",
        "group_id": group,
        "sample_index": 0,
        "segment_id": segment,
        "prompt_ids": [1, 2],
        "response_ids": list(range(10, 10 + len(mask))),
        "loss_mask": mask,
        "logprobs": [-0.5] * len(mask),
        "reward": reward,
        "status": status,
        "policy_version": versions[0],
        "call_policy_versions": versions,
        "call_starts": starts or [0],
    }


def test_rows_of_a_rollout_are_its_segments_and_primary_has_most_trained_tokens() -> None:
    batch = to_training_rollouts(
        [row("a", segment="s0", mask=[1, 0]), row("a", segment="s1", mask=[1, 1, 1])], V3
    )
    (rollout,) = batch.rollouts
    assert [s.segment_id for s in rollout.segments] == ["s0", "s1"]
    assert rollout.primary.segment_id == "s1"
    assert batch.segments_left_out == 1


def test_primary_of_equal_segments_is_the_first() -> None:
    batch = to_training_rollouts([row("a", segment="s0"), row("a", segment="s1")], V3)
    assert batch.rollouts[0].primary.segment_id == "s0"


def test_tool_tokens_keep_mask_0() -> None:
    """A two-call row: the tool result between the calls is 0, both calls' tokens 1."""
    mask = [1, 1, 0, 0, 1]
    batch = to_training_rollouts([row("a", mask=mask, versions=["v3", "v3"], starts=[0, 4])], V3)
    segment = batch.rollouts[0].primary
    assert segment.loss_mask == mask
    assert segment.num_calls == 2 and batch.rollouts[0].num_turns == 2


def test_infra_error_trains_nothing_and_is_out_of_the_baseline() -> None:
    """Without the infra row (reward 0) the baseline of 1, 0 is mean .5, std .5 → ±1."""
    rows = [row("a", 1.0), row("b", 0.0), row("c", 0.0, status="infra_error")]
    batch = to_training_rollouts(rows, V3)
    (group,) = batch.groups
    assert group.advantages(eps=0.0) == {"a": 1.0, "b": -1.0, "c": 0.0}
    infra = next(r for r in batch.rollouts if r.rollout_id == "c")
    assert infra.segments[0].loss_mask == [0, 0]
    assert not infra.trained and not infra.in_baseline
    assert batch.infra_error == 1


def test_agent_failures_are_trained() -> None:
    rows = [row("a", 1.0), row("b", 0.0, status="agent_broke_sandbox")]
    (group,) = to_training_rollouts(rows, V3).groups
    assert group.advantages(eps=0.0) == {"a": 1.0, "b": -1.0}


def test_a_stale_call_loses_its_tokens_not_the_row() -> None:
    """At v3 with max lag 1, the v1 call (lag 2) is masked, the v3 call kept."""
    rows = [row("a", mask=[1, 1, 0, 1, 1], versions=["v1", "v3"], starts=[0, 3])]
    batch = to_training_rollouts(rows, V3)
    segment = batch.rollouts[0].primary
    assert segment.loss_mask == [0, 0, 0, 1, 1]
    assert segment.token_versions == ["v1", "v1", "v1", "v3", "v3"]
    assert segment.staleness == 0
    assert batch.stale_calls == 1 and sorted(batch.staleness) == [0, 2]


def test_all_stale_rollout_dropped_with_its_reward() -> None:
    rows = [row("a", 1.0), row("b", 0.0), row("c", 1.0, versions=["v1"])]
    batch = to_training_rollouts(rows, V3)
    assert [r.rollout_id for r in batch.rollouts] == ["a", "b"]
    assert batch.groups[0].advantages(eps=0.0) == {"a": 1.0, "b": -1.0}
    assert batch.stale == 1


def test_all_stale_rollout_masked_stays_in_the_baseline() -> None:
    rules = ConversionRules(current_version=3, max_staleness=1, stale="mask")
    rows = [row("a", 1.0), row("b", 0.0), row("c", 1.0, versions=["v1"])]
    batch = to_training_rollouts(rows, rules)
    stale = next(r for r in batch.rollouts if r.rollout_id == "c")
    assert stale.in_baseline and not stale.trained
    assert stale.segments[0].loss_mask == [0, 0]
    mean, std = 2 / 3, (2 / 9) ** 0.5
    advantages = batch.groups[0].advantages(eps=0.0)
    assert advantages["a"] == pytest.approx((1 - mean) / std)
    assert advantages["c"] == 0.0


@pytest.mark.parametrize("version", ["v4", "unversioned"])
def test_future_or_unreadable_version_is_stale(version: str) -> None:
    batch = to_training_rollouts([row("a", versions=[version])], V3)
    assert batch.rollouts == [] and batch.stale == 1


def test_calls_of_unknown_weights_are_never_trained() -> None:
    """`unknown` names no policy (an engine after a failed load): masked even when the
    trainer checks no staleness, and the rollout counts as all stale."""
    rows = [row("a", mask=[1, 1, 0, 1], versions=["v3", "unknown"], starts=[0, 3])]
    segment = to_training_rollouts(rows).rollouts[0].primary
    assert segment.loss_mask == [1, 1, 0, 0]
    batch = to_training_rollouts([row("b", versions=["unknown"])])
    assert batch.rollouts == [] and batch.stale == 1


def test_without_a_current_version_nothing_is_stale() -> None:
    batch = to_training_rollouts([row("a", versions=["unversioned"])])
    assert batch.rollouts[0].trained and batch.stale == 0 and batch.staleness == []


def test_truncated_is_trained_unless_masked() -> None:
    rows = [row("a", 0.0, status="truncated"), row("b", 1.0)]
    trained = to_training_rollouts(rows, V3).rollouts[0]
    assert trained.truncated and trained.trained
    masked_rules = ConversionRules(current_version=3, truncated="mask")
    masked = to_training_rollouts(rows, masked_rules).rollouts[0]
    assert not masked.trained and masked.in_baseline
    assert masked.segments[0].loss_mask == [0, 0]


def test_equal_rewards_give_no_signal() -> None:
    (group,) = to_training_rollouts([row("a", 0.5), row("b", 0.5)], V3).groups
    assert group.advantages() == {"a": 0.0, "b": 0.0}


def test_groups_are_separate_baselines() -> None:
    rows = [row("x1", 3.0, group="x"), row("x2", 1.0, group="x"), row("y1", 7.0, group="y")]
    batch = to_training_rollouts(rows, V3)
    assert [g.group_id for g in batch.groups] == ["x", "y"]
    assert batch.groups[0].advantages(eps=0.0) == {"x1": 1.0, "x2": -1.0}
    assert batch.groups[1].advantages(eps=0.0) == {"y1": 0.0}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"loss_mask": [1]}, "loss_mask"),
        ({"logprobs": [-0.1, -0.2, -0.3]}, "logprobs"),
        ({"loss_mask": [1, 2]}, "loss_mask"),
        ({"reward": None}, "reward"),
        ({"status": "eval_error"}, "status"),
        ({"call_starts": [0, 1]}, "call_starts"),
        ({"call_policy_versions": ["v3", "v3"], "call_starts": [1, 0]}, "call_starts"),
        ({"reward_metrics": '{"passed": "yes"}'}, "reward_metrics"),
        ({"call_sampling": ['{"temperature":1.0}'] * 2}, "call_sampling"),
    ],
)
def test_a_row_that_disagrees_is_refused_naming_rollout_and_field(
    change: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConversionError) as err:
        to_training_rollouts([row("r-17") | change], V3)
    assert err.value.rollout_id == "r-17" and err.value.field == field
    assert "r-17" in str(err.value) and field in str(err.value)


def test_a_missing_column_is_refused() -> None:
    bad = row("r-1")
    del bad["reward"]
    with pytest.raises(ConversionError, match="reward: missing"):
        to_training_rollouts([bad], V3)


def test_segments_of_one_rollout_must_agree_on_its_reward() -> None:
    with pytest.raises(ConversionError, match="reward: segments disagree"):
        to_training_rollouts([row("a", 1.0, segment="s0"), row("a", 0.0, segment="s1")], V3)


def test_a_rollout_names_its_task_source_and_the_verifiers_metrics() -> None:
    """Lineage travels with the rollout; rows written before schema v4 lack it."""
    lineage = {"task_source": "harbor:tasks/hello", "reward_metrics": '{"passed": 3.0}'}
    batch = to_training_rollouts([row("a") | lineage, row("b")], V3)
    new, old = batch.rollouts
    assert (new.task_source, new.reward_metrics) == ("harbor:tasks/hello", {"passed": 3.0})
    assert (old.task_source, old.reward_metrics) == ("", {})


def test_each_call_keeps_the_sampling_it_was_sampled_with() -> None:
    """A two-call segment whose agent changed an agent-chosen field between calls: the
    segment lists each call's parameters, aligned with its calls. A row written before
    `call_sampling` (schema v2) gets its `sampling` for every call; one with neither,
    none."""
    first, second = '{"temperature":0.3,"top_p":1.0}', '{"temperature":0.9,"top_p":1.0}'
    two_calls = {"versions": ["v3", "v3"], "starts": [0, 2], "mask": [1, 1, 0, 1]}
    rows = [
        row("a", **two_calls) | {"call_sampling": [first, second], "sampling": first},
        row("b", **two_calls) | {"sampling": second},
        row("c", **two_calls),
    ]
    a, b, c = (r.primary for r in to_training_rollouts(rows, V3).rollouts)
    assert a.call_sampling == [first, second]
    assert [p["temperature"] for p in a.sampling_of_calls()] == [0.3, 0.9]
    assert b.call_sampling == [second, second]
    assert c.call_sampling == []
