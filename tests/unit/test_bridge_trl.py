"""The TRL bridge's field mapping (`bridges.trl`), pure parts: what `rollout_func`
returns for a converted batch, how our failures reach TRL (all-0 `env_mask`, reward
None), how TRL's repeated prompts become groups, and the errors on bad input. Runs in
the project's environment (no trl import); the trainer itself runs in the TRL
integration test."""

from typing import Any

import pytest

from bridges.rollouts import ConversionError, ConversionRules, to_training_rollouts
from bridges.trl import (
    EXTRA_FIELDS,
    TRL_FIELDS,
    TrlBridgeError,
    convert_batch,
    group_runs,
    rollout_reward,
)

V1 = ConversionRules(current_version=1, max_staleness=1, stale="mask")
EOS = 99


def row(
    rollout: str,
    reward: float = 1.0,
    *,
    task: str = "t",
    index: int = 0,
    status: str = "ok",
    mask: list[int] | None = None,
    segment: str = "s0",
    versions: list[str] | None = None,
) -> dict[str, Any]:
    mask = [1, 0, 1] if mask is None else mask
    versions = versions or ["run-v1"]
    return {
        "rollout_id": rollout,
        "task_id": task,
        "group_id": f"g-{task}",
        "sample_index": index,
        "segment_id": segment,
        "prompt_ids": [1, 2],
        "response_ids": list(range(10, 10 + len(mask))),
        "loss_mask": mask,
        "logprobs": [-0.25] * len(mask),
        "reward": reward,
        "status": status,
        "policy_version": versions[0],
        "call_policy_versions": versions,
        "call_starts": [0] * len(versions),
    }


def test_a_rollout_is_one_sample_with_its_primary_segment_and_loss_mask_as_env_mask() -> None:
    rows = [
        row("a", 1.0, segment="s0", mask=[1]),
        row("a", 1.0, segment="s1", mask=[1, 0, 1]),
        row("b", 0.0, index=1),
    ]
    fields = convert_batch(to_training_rollouts(rows, V1), placeholder_id=EOS)
    assert set(fields) == {*TRL_FIELDS, *EXTRA_FIELDS}
    assert fields["rollout_id"] == ["a", "b"]
    assert fields["prompt_ids"] == [[1, 2], [1, 2]]
    assert fields["completion_ids"] == [[10, 11, 12], [10, 11, 12]]  # a's longer segment
    assert fields["env_mask"] == [[1, 0, 1], [1, 0, 1]]
    assert fields["logprobs"] == [[-0.25] * 3] * 2
    assert fields["rollout_reward"] == [1.0, 0.0]
    assert fields["rollout_status"] == ["ok", "ok"]
    assert fields["policy_versions"] == [["run-v1"], ["run-v1"]]


def test_infra_error_gets_no_loss_and_no_reward_so_trl_leaves_it_out_of_the_baseline() -> None:
    rows = [row("a", 1.0), row("b", 0.0, index=1, status="infra_error")]
    fields = convert_batch(to_training_rollouts(rows, V1), placeholder_id=EOS)
    assert fields["env_mask"][1] == [0]
    assert fields["completion_ids"][1] == [EOS] and fields["logprobs"][1] == [0.0]
    assert fields["rollout_reward"] == [1.0, None]
    assert fields["rollout_status"] == ["ok", "infra_error"]


def test_slots_follow_trl_order_and_a_missing_rollout_is_an_unscored_placeholder() -> None:
    """TRL pairs samples with its prompts by position: the bridge returns them in slot
    order (task, sample index), whatever order the rows came in; a rollout that left no
    row (its workflow failed) still fills its slot, untrained and unscored."""
    rows = [row("t-1", 0.5, index=1), row("u-0", 0.0, task="u"), row("t-0", 1.0)]
    batch = to_training_rollouts(rows, V1)
    slots = [("t", 0), ("t", 1), ("u", 0), ("u", 1)]
    fields = convert_batch(batch, slots=slots, placeholder_id=EOS)
    assert fields["rollout_id"] == ["t-0", "t-1", "u-0", None]
    assert fields["rollout_reward"] == [1.0, 0.5, 0.0, None]
    assert fields["env_mask"][3] == [0] and fields["rollout_status"][3] == "missing"
    assert all(len(fields[k]) == 4 for k in (*TRL_FIELDS, *EXTRA_FIELDS))


def test_a_stale_rollout_kept_by_mask_trains_nothing_but_keeps_its_reward() -> None:
    rows = [row("a", 1.0), row("b", 0.0, index=1, versions=["run-v-old"])]
    fields = convert_batch(to_training_rollouts(rows, V1), placeholder_id=EOS)
    assert fields["env_mask"][1] == [0]
    assert fields["rollout_reward"] == [1.0, 0.0]


def test_masks_and_ids_of_different_length_name_the_rollout() -> None:
    bad = row("a")
    bad["logprobs"] = [-0.1]
    with pytest.raises(ConversionError, match=r"rollout 'a': logprobs"):
        convert_batch(to_training_rollouts([bad], V1))


def test_group_runs_turn_repeated_prompts_into_one_task_per_group() -> None:
    assert group_runs(["t", "t", "u", "u"], 2) == ["t", "u"]
    with pytest.raises(TrlBridgeError, match="num_generations: 1"):
        group_runs(["t"], 1)
    with pytest.raises(TrlBridgeError, match="num_generations: 3 prompts"):
        group_runs(["t", "t", "u"], 2)
    with pytest.raises(TrlBridgeError, match="not one task repeated"):
        group_runs(["t", "u"], 2)
    with pytest.raises(TrlBridgeError, match="appears twice"):
        group_runs(["t", "t", "t", "t"], 2)
    with pytest.raises(TrlBridgeError, match="prompt: expected a task id"):
        group_runs([[{"role": "user"}], [{"role": "user"}]], 2)


def test_reward_function_returns_our_reward_and_says_when_it_is_missing() -> None:
    assert rollout_reward(["p", "p"], ["c", "c"], rollout_reward=[1.0, None]) == [1.0, None]
    with pytest.raises(TrlBridgeError, match="rollout_reward: missing"):
        rollout_reward(["p"], ["c"])
    with pytest.raises(TrlBridgeError, match="rollout_reward: 1 rewards for 2"):
        rollout_reward(["p", "p"], ["c", "c"], rollout_reward=[1.0])
