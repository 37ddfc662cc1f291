"""The slime bridge (`bridges.slime`): our rows as slime samples, slime's prompt groups as
our tasks, the GRPO post-processing over rollouts, the publish hook's version naming, and
the errors on bad input. Hand-computed values; slime's own classes where slime imports,
else the documented stand-in (see test_slime_contract.py for which)."""

import argparse
import asyncio
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from bridges import slime as bridge
from bridges.rollouts import ConversionError, ConversionRules, to_training_rollouts
from schemas.routing import RoutedExperts
from schemas.tasks import RolloutTask

V3 = ConversionRules(current_version=3, max_staleness=1)


def row(
    rollout: str,
    reward: float = 1.0,
    *,
    group: str = "b-t",
    index: int = 0,
    segment: str = "s0",
    status: str = "ok",
    prompt: list[int] | None = None,
    mask: list[int] | None = None,
    versions: list[str] | None = None,
    starts: list[int] | None = None,
) -> dict[str, Any]:
    mask = [1, 1] if mask is None else mask
    versions = versions or ["run-v3"]
    return {
        "rollout_id": rollout,
        "task_id": "t",
        "group_id": group,
        "sample_index": index,
        "segment_id": segment,
        "prompt_ids": prompt or [1, 2, 3],
        "response_ids": list(range(10, 10 + len(mask))),
        "loss_mask": mask,
        "logprobs": [-0.5 if bit else 0.0 for bit in mask],
        "reward": reward,
        "status": status,
        "policy_version": versions[0],
        "call_policy_versions": versions,
        "call_starts": starts or [0],
    }


def prompt(index: int, group_index: int = 7, **metadata: Any) -> Any:
    """A slime prompt sample as its data source hands it over."""
    return bridge.Sample(
        group_index=group_index,
        index=index,
        prompt="fix the bug",
        label="L",
        metadata=dict(metadata),
    )


def flat(groups: list[list[list[Any]]]) -> list[Any]:
    return [s for group in groups for rollout in group for s in rollout]


def test_a_segment_becomes_a_sample_with_prompt_and_response_tokens() -> None:
    batch = to_training_rollouts(
        [row("a", 1.0, mask=[1, 1, 0, 1], versions=["run-v3", "run-v3"], starts=[0, 3])], V3
    )
    ((sample,),) = bridge.to_slime_samples(batch)[0]
    assert sample.tokens == [1, 2, 3, 10, 11, 12, 13]
    assert sample.response_length == 4
    assert sample.loss_mask == [1, 1, 0, 1]
    assert sample.rollout_log_probs == [-0.5, -0.5, 0.0, -0.5]
    assert sample.weight_versions == ["run-v3", "run-v3"]
    assert sample.reward == 1.0
    assert sample.status == sample.Status.COMPLETED
    assert not sample.remove_sample
    assert sample.metadata[bridge.META_KEY]["rollout_id"] == "a"


def test_all_segments_of_a_rollout_are_siblings_sharing_its_slime_rollout_id() -> None:
    """slime's compact shape: groups × rollouts × segments, one rollout_id per rollout."""
    rows = [
        row("a", index=0, segment="s0", prompt=[1]),
        row("a", index=0, segment="s1", prompt=[2, 2]),
        row("b", 0.0, index=1),
    ]
    prompts = {"b-t": [prompt(40), prompt(41)]}
    (group,) = bridge.to_slime_samples(to_training_rollouts(rows, V3), prompts)
    assert [[s.metadata[bridge.META_KEY]["segment_id"] for s in r] for r in group] == [
        ["s0", "s1"],
        ["s0"],
    ]
    assert [[s.rollout_id for s in r] for r in group] == [[40, 40], [41]]
    assert [s.tokens[: len(s.tokens) - s.response_length] for s in group[0]] == [[1], [2, 2]]
    first = group[0][0]
    assert (first.index, first.group_index, first.prompt, first.label) == (
        40,
        7,
        "fix the bug",
        "L",
    )


def test_without_slime_prompts_rollout_ids_count_from_the_first_one() -> None:
    rows = [row("a", index=0), row("b", index=1), row("c", group="b-u")]
    samples = flat(bridge.convert_batch(to_training_rollouts(rows, V3), first_rollout_id=100))
    assert [s.rollout_id for s in samples] == [100, 101, 102]
    assert [s.group_index for s in samples] == [0, 0, 1]


def test_infra_error_is_aborted_removed_and_out_of_the_advantages() -> None:
    """Baseline of the two agent rollouts (1, 0): mean .5, std .5 → ±1; infra → 0."""
    rows = [
        row("a", 1.0, index=0),
        row("b", 0.0, index=1),
        row("c", 0.0, index=2, status="infra_error"),
    ]
    (a, b, c) = flat(bridge.to_slime_samples(to_training_rollouts(rows, V3)))
    assert c.status == c.Status.ABORTED and c.remove_sample and c.loss_mask == [0, 0]
    assert [s.metadata[bridge.META_KEY]["advantage"] for s in (a, b, c)] == pytest.approx(
        [1.0, -1.0, 0.0], abs=1e-5
    )


@pytest.mark.parametrize(
    ("status", "expected", "removed"),
    [
        ("truncated", "TRUNCATED", False),
        ("agent_timeout", "FAILED", False),
        ("agent_broke_sandbox", "FAILED", False),
        ("infra_error", "ABORTED", True),
    ],
)
def test_status_maps_to_slime_status(status: str, expected: str, removed: bool) -> None:
    (sample,) = flat(bridge.to_slime_samples(to_training_rollouts([row("a", status=status)], V3)))
    assert sample.status == sample.Status[expected]
    assert sample.remove_sample is removed


def test_an_all_stale_rollout_kept_under_mask_is_removed_from_the_loss() -> None:
    rules = ConversionRules(current_version=5, max_staleness=1, stale="mask")
    rows = [row("a", versions=["run-v1"]), row("b", index=1, versions=["run-v5"])]
    stale, fresh = flat(bridge.to_slime_samples(to_training_rollouts(rows, rules)))
    assert stale.remove_sample and stale.loss_mask == [0, 0]
    assert not fresh.remove_sample


def test_masks_and_ids_that_disagree_are_refused_with_the_rollout_id() -> None:
    batch = to_training_rollouts([row("rollout-x")], V3)
    batch.groups[0].rollouts[0].segments[0].loss_mask = [1]
    with pytest.raises(ConversionError, match=r"rollout-x.*loss_mask: 1 entries for 2"):
        bridge.to_slime_samples(batch)
    batch = to_training_rollouts([row("rollout-y")], V3)
    batch.groups[0].rollouts[0].segments[0].logprobs = [0.0, 0.0, 0.0]
    with pytest.raises(ConversionError, match=r"rollout-y.*logprobs: 3 entries for 2"):
        bridge.to_slime_samples(batch)


def test_a_rollout_outside_its_slime_group_is_refused() -> None:
    batch = to_training_rollouts([row("a", index=2)], V3)
    with pytest.raises(ConversionError, match=r"'a'.*sample_index: 2 outside the slime group of 2"):
        bridge.to_slime_samples(batch, {"b-t": [prompt(0), prompt(1)]})


def test_post_process_counts_each_rollout_once_whatever_its_segments() -> None:
    """a (reward 1) has 2 segments, b (0) one: per rollout mean .5 → ±1 for all three
    samples; slime's per-sample default would take the mean 2/3 instead."""
    rows = [row("a", 1.0, segment="s0"), row("a", 1.0, segment="s1"), row("b", 0.0, index=1)]
    samples = flat(bridge.to_slime_samples(to_training_rollouts(rows, V3)))
    args = SimpleNamespace(advantage_estimator="grpo", rewards_normalization=True)
    raw, rewards = bridge.post_process_rewards(args, samples)
    assert raw == [1.0, 1.0, 0.0]
    assert rewards == pytest.approx([1.0, 1.0, -1.0], abs=1e-5)
    centred = SimpleNamespace(**vars(args), grpo_std_normalization=False)
    assert bridge.post_process_rewards(centred, samples)[1] == [0.5, 0.5, -0.5]
    off = SimpleNamespace(advantage_estimator="grpo", rewards_normalization=False)
    assert bridge.post_process_rewards(off, samples)[1] == [1.0, 1.0, 0.0]
    ppo = SimpleNamespace(advantage_estimator="ppo", rewards_normalization=True)
    assert bridge.post_process_rewards(ppo, samples)[1] == [1.0, 1.0, 0.0]


def test_post_process_refuses_samples_the_bridge_did_not_make() -> None:
    with pytest.raises(ValueError, match=r"slime sample 0 \(index 5\): no metadata"):
        bridge.post_process_rewards(SimpleNamespace(), [bridge.Sample(index=5, reward=1.0)])


def task_json(task_id: str = "t1", evaluation: bool = True) -> dict[str, Any]:
    task: dict[str, Any] = {
        "task_id": task_id,
        "prompt": "fix the bug",
        "harness": {"name": "command"},
    }
    if evaluation:
        task["evaluation"] = {"checks": [{"kind": "command", "command": "true"}]}
    return task


def test_a_prompt_carries_its_task_as_json_or_names_it_by_id(tmp_path: Any) -> None:
    spec = task_json()
    assert bridge.task_for_group([prompt(0, rollout_task=spec)], None).task_id == "t1"
    assert bridge.task_for_group([prompt(0, rollout_task=json.dumps(spec))], None).task_id == "t1"
    lookup = {"t1": RolloutTask.model_validate(spec)}
    assert bridge.task_for_group([prompt(0, task_id="t1")], lookup).task_id == "t1"


@pytest.mark.parametrize(
    ("metadata", "lookup", "message"),
    [
        ({}, None, r"index=3\): metadata has neither 'rollout_task' nor 'task_id'"),
        ({"task_id": "t1"}, None, r"metadata.task_id needs agentic_rollout_tasks"),
        ({"task_id": "nope"}, {}, r"metadata.task_id 'nope' is not in agentic_rollout_tasks"),
        ({"rollout_task": {"task_id": "t1"}}, None, r"metadata.rollout_task is not a RolloutTask"),
        ({"rollout_task": task_json(evaluation=False)}, None, r"'t1': evaluation is missing"),
    ],
)
def test_a_prompt_without_a_usable_task_is_refused(
    metadata: dict[str, Any], lookup: dict[str, RolloutTask] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        bridge.task_for_group([prompt(3, **metadata)], lookup)


def test_prompt_data_rows_round_trip_to_the_same_task() -> None:
    task = RolloutTask.model_validate(task_json())
    (line,) = bridge.prompt_data_rows([task])
    assert line["input"] == "fix the bug"
    assert bridge.task_for_group([prompt(0, **line["metadata"])], None) == task


def test_a_task_drawn_twice_in_a_step_goes_to_another_wave() -> None:
    assert bridge.waves(["a", "b", "a", "a", "c"]) == [[0, 1, 4], [2], [3]]


def test_group_size_1_is_refused_naming_the_slime_argument() -> None:
    config = bridge.SlimeBridgeConfig(output="/tmp/x")
    groups = [[prompt(0, rollout_task=task_json())]]
    with pytest.raises(ValueError, match=r"n_samples_per_prompt: 1; .*\(--n-samples-per-prompt\)"):
        asyncio.run(bridge._train_step(argparse.Namespace(), 0, groups, config))


def test_config_comes_from_prefixed_slime_args_and_errors_name_them() -> None:
    args = argparse.Namespace(
        agentic_rollout_output="s3://b/p", agentic_rollout_max_staleness=2, rollout_batch_size=4
    )
    config = bridge.SlimeBridgeConfig.from_args(args)
    assert (config.output, config.max_staleness, config.temporal) == (
        "s3://b/p",
        2,
        "127.0.0.1:7233",
    )
    with pytest.raises(
        ValueError, match=r"agentic_rollout_stale: Input should be 'drop' or 'mask'"
    ):
        bridge.SlimeBridgeConfig.from_args(argparse.Namespace(agentic_rollout_stale="keep"))
    with pytest.raises(ValueError, match=r"unknown slime args \['agentic_rollout_outptu'\]"):
        bridge.SlimeBridgeConfig.from_args(argparse.Namespace(agentic_rollout_outptu="x"))


def test_published_versions_are_named_after_slime_weight_directories() -> None:
    config = bridge.SlimeBridgeConfig(run="exp1")
    assert bridge.policy_version_for(config, "/ckpt/sync/weight_v000012") == "exp1-v12"
    with pytest.raises(ValueError, match="not a slime weight directory"):
        bridge.policy_version_for(config, "/ckpt/sync/latest")


def test_publish_without_a_gateway_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="agentic_rollout_gateway"):
        bridge.publish_policy(argparse.Namespace(), "/ckpt/weight_v000001", [])


def test_groups_come_in_slimes_order_and_rollouts_in_sample_order() -> None:
    """Rows arrive in the order rollouts finished; slime gets its own order back."""
    rows = [row("u1", group="b-u", index=1), row("t1", index=1), row("u0", group="b-u")]
    rows.append(row("t0"))
    prompts = {"b-t": [prompt(0, 0), prompt(1, 0)], "b-u": [prompt(2, 1), prompt(3, 1)]}
    groups = bridge.to_slime_samples(to_training_rollouts(rows, V3), prompts)
    assert [[r[0].rollout_id for r in g] for g in groups] == [[0, 1], [2, 3]]


def test_eval_datasets_are_prompt_lines_and_bad_ones_name_the_line(tmp_path: Any) -> None:
    good = tmp_path / "heldout.jsonl"
    task = RolloutTask.model_validate(task_json("h1"))
    good.write_text(json.dumps(bridge.prompt_data_rows([task])[0]) + "\n\n")
    dataset = SimpleNamespace(name="heldout", path=str(good))
    assert bridge.eval_tasks(dataset) == [task]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"input": "x", "metadata": {}}) + "\n")
    with pytest.raises(ValueError, match=r"'bad': .*bad.jsonl:1: .*neither 'rollout_task'"):
        bridge.eval_tasks(SimpleNamespace(name="bad", path=str(bad)))
    with pytest.raises(ValueError, match=r"is not a .jsonl of prompt lines"):
        bridge.eval_tasks(SimpleNamespace(name="pq", path=str(tmp_path / "x.parquet")))


def test_evaluation_without_eval_datasets_names_the_slime_argument() -> None:
    args = argparse.Namespace(agentic_rollout_output="/tmp/x")
    with pytest.raises(ValueError, match=r"--eval-prompt-data NAME PATH"):
        bridge.generate_rollout(args, 0, None, evaluation=True)


def test_the_command_writes_prompt_lines_for_a_task_file(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task_json("a")) + "\n" + json.dumps(task_json("b")) + "\n")
    bridge.main([str(path)])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["metadata"]["rollout_task"]["task_id"] for line in lines] == ["a", "b"]


def routing(r: dict[str, Any], layers: int = 4, top_k: int = 2) -> dict[str, Any]:
    """A samples row's `routed_experts` (as Arrow hands it over) for row `r`."""
    tokens = len(r["prompt_ids"]) + len(r["response_ids"]) - 1
    ids = np.arange(tokens * layers * top_k).reshape(tokens, layers, top_k) % 60
    return RoutedExperts.of(ids).model_dump()


def test_routed_experts_become_slimes_rollout_routed_experts() -> None:
    """slime's shape: (len(tokens) - 1, layers, top_k) int32, as its SGLang path makes
    them; a row without routing has None, never zeros."""
    routed = row("b-t-0", index=0)
    routed["routed_experts"] = routing(routed)
    plain = row("b-t-1", index=1)
    batch = to_training_rollouts([routed], V3)
    [sample] = flat(bridge.convert_batch(batch))
    experts = sample.rollout_routed_experts
    assert experts.dtype == np.int32 and experts.shape == (len(sample.tokens) - 1, 4, 2)
    np.testing.assert_array_equal(experts, RoutedExperts(**routed["routed_experts"]).array())
    [none] = flat(bridge.convert_batch(to_training_rollouts([plain], V3)))
    assert none.rollout_routed_experts is None


def test_a_batch_mixing_rows_with_and_without_routing_names_the_row_without() -> None:
    """slime takes a batch's routing only when its first sample has it, then reads every
    sample's: a row without it would crash slime, so it is named."""
    routed = row("b-t-0", index=0)
    routed["routed_experts"] = routing(routed)
    missing = row("b-t-1", index=1)
    missing["routing_missing"] = "call c2: the engine returned no routed_experts"
    batch = to_training_rollouts([routed, missing], V3)
    with pytest.raises(ConversionError, match=r"b-t-1.*call c2: the engine returned no"):
        bridge.convert_batch(batch)


def test_routing_of_the_wrong_length_is_refused_with_the_rollout_id() -> None:
    bad = row("b-t-0")
    bad["routed_experts"] = routing(row("b-t-0", mask=[1, 1, 1]))  # one token too many
    with pytest.raises(ConversionError, match=r"b-t-0.*routed_experts"):
        to_training_rollouts([bad], V3)
