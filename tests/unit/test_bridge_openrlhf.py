"""The OpenRLHF bridge without OpenRLHF: our rollouts in the shape OpenRLHF's samples
generator reads (`observation_tokens`, `action_ranges`, `rollout_log_probs`, `reward`,
...), exactly n samples per prompt, the prompt/label → task contract, the grouping of
OpenRLHF's n concurrent `execute` calls into one group, and the errors on bad input.
OpenRLHF's own classes are exercised in tests/integration/test_openrlhf_contract.py."""

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from bridges import openrlhf as bridge
from bridges.rollouts import (
    ConversionError,
    ConversionRules,
    TrainingRollout,
    TrainingSegment,
    to_training_rollouts,
)
from examples.make_tasks import task as make_task
from schemas.outcome import RolloutStatus
from schemas.tasks import RolloutTask

V3 = ConversionRules(current_version=3, max_staleness=1)


def row(
    rollout: str,
    index: int,
    reward: float,
    *,
    group: str = "g",
    status: str = "ok",
    mask: Sequence[int] = (1, 1),
    versions: Sequence[str] = ("v3",),
    starts: Sequence[int] = (0,),
) -> dict[str, Any]:
    return {
        "rollout_id": rollout,
        "task_id": "t",
        "group_id": group,
        "sample_index": index,
        "segment_id": f"{rollout}-s0",
        "prompt_ids": [1, 2],
        "response_ids": list(range(10, 10 + len(mask))),
        "loss_mask": list(mask),
        "logprobs": [-0.25 * (i + 1) for i in range(len(mask))],
        "reward": reward,
        "status": status,
        "policy_version": versions[0],
        "call_policy_versions": list(versions),
        "call_starts": list(starts),
    }


def responses(rows: list[dict[str, Any]], size: int, rules: ConversionRules = V3) -> list[Any]:
    (group,) = to_training_rollouts(rows, rules).groups
    return bridge.group_responses(group, size, prompt="p", label="l", placeholder_ids=[7, 8])


def test_multi_turn_rollout_maps_to_observation_action_ranges_and_aligned_logprobs() -> None:
    """Two calls with a tool result between them: only the policy spans are actions."""
    mask = [1, 1, 0, 0, 1]
    (out,) = responses([row("a", 0, 1.0, mask=mask, versions=["v3", "v3"], starts=[0, 4])], 1)
    assert out["observation_tokens"] == [1, 2, 10, 11, 12, 13, 14]
    assert out["action_ranges"] == [(2, 4), (6, 7)]
    assert out["rollout_log_probs"] == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.25]
    assert len(out["rollout_log_probs"]) == len(out["observation_tokens"])
    assert out["reward"] == out["scores"] == 1.0
    assert out["extra_logs"]["agent_num_turns"] == 2.0
    assert out["prompt"] == "p" and out["label"] == "l" and out["truncated"] is False


def test_infra_error_sample_has_no_action_and_keeps_the_group_mean() -> None:
    """Rewards 1, 0 and an infra error: it stands in with their mean .5 and no action, so
    OpenRLHF's per-prompt mean over 3 samples is the mean over the 2 that count."""
    out = responses([row("a", 0, 1.0), row("b", 1, 0.0), row("c", 2, 0.0, status="infra_error")], 3)
    assert [o["reward"] for o in out] == [1.0, 0.0, 0.5]
    assert out[2]["action_ranges"] == []
    assert out[2]["extra_logs"]["agent_infra_error"] == 1.0
    assert sum(o["reward"] for o in out) / 3 == 0.5
    assert [o["extra_logs"]["agent_infra_error"] for o in out[:2]] == [0.0, 0.0]


def test_missing_rollout_becomes_a_fill_sample_in_its_slot() -> None:
    """Sample 1 of 3 never produced rows (its workflow failed): OpenRLHF still gets 3."""
    out = responses([row("a", 0, 1.0), row("c", 2, 0.0)], 3)
    assert len(out) == 3
    assert out[1]["observation_tokens"] == [7, 8] and out[1]["action_ranges"] == []
    assert out[1]["rollout_log_probs"] == [0.0, 0.0]
    assert out[1]["reward"] == 0.5
    assert out[2]["reward"] == 0.0 and out[2]["action_ranges"] == [(2, 4)]


def test_all_stale_rollout_masked_keeps_its_reward_without_actions() -> None:
    rules = ConversionRules(current_version=3, max_staleness=1, stale="mask")
    out = responses([row("a", 0, 1.0, versions=["v1"]), row("b", 1, 0.0)], 2, rules)
    assert out[0]["action_ranges"] == [] and out[0]["reward"] == 1.0
    assert out[0]["extra_logs"]["agent_infra_error"] == 0.0


def test_all_stale_rollout_dropped_is_a_fill_sample() -> None:
    out = responses([row("a", 0, 1.0, versions=["v1"]), row("b", 1, 0.0)], 2)
    assert out[0]["action_ranges"] == [] and out[0]["reward"] == 0.0  # mean of b alone
    assert out[1]["action_ranges"] == [(2, 4)]


def test_stale_call_in_a_fresh_rollout_is_no_action() -> None:
    """Call 1 by v1 (stale), call 2 by v3: only the second call's tokens are actions."""
    mask = [1, 1, 0, 1]
    (out,) = responses([row("a", 0, 1.0, mask=mask, versions=["v1", "v3"], starts=[0, 3])], 1)
    assert out["action_ranges"] == [(5, 6)]


def test_misaligned_segment_is_refused_naming_rollout_and_field() -> None:
    segment = TrainingSegment(
        rollout_id="r-7",
        segment_id="s0",
        group_id="g",
        task_id="t",
        prompt_ids=[1],
        response_ids=[5, 6],
        loss_mask=[1, 1],
        logprobs=[-0.1],
        call_starts=[0],
        call_policy_versions=["v3"],
        trained=True,
        staleness=0,
    )
    rollout = TrainingRollout(
        rollout_id="r-7",
        group_id="g",
        task_id="t",
        sample_index=0,
        status=RolloutStatus.ok,
        reward=1.0,
        step_rewards=None,
        segments=[segment],
        in_baseline=True,
    )
    with pytest.raises(ConversionError, match=r"r-7.*logprobs.*1 entries for 2 response_ids"):
        bridge.rollout_to_response(rollout, prompt="p", label="l", fill_reward=0.0)


def test_group_larger_than_samples_per_prompt_is_refused() -> None:
    (group,) = to_training_rollouts([row("a", 0, 1.0), row("b", 1, 0.0)], V3).groups
    with pytest.raises(ConversionError, match="samples_per_prompt"):
        bridge.group_responses(group, 1, prompt="p", label="l")


def test_convert_batch_pads_every_group_to_n_with_the_same_log_keys() -> None:
    rows = [row("a", 0, 1.0), row("b", 1, 0.0), row("c", 0, 1.0, group="h")]
    out = bridge.convert_batch(to_training_rollouts(rows, V3), samples_per_prompt=2)
    assert len(out) == 4
    assert [o["prompt"] for o in out] == ["t"] * 4
    assert out[3]["action_ranges"] == [] and out[3]["reward"] == 1.0
    assert len({tuple(sorted(o["extra_logs"])) for o in out}) == 1
    assert len(bridge.convert_batch(to_training_rollouts(rows, V3))) == 3


def test_action_ranges_of_a_mask() -> None:
    assert bridge.action_ranges([0, 1, 1, 0, 1], 10) == [(11, 13), (14, 15)]
    assert bridge.action_ranges([0, 0], 3) == []


# ------------------------------------------------------------------ prompt → task
def task_json(**overrides: Any) -> dict[str, Any]:
    return make_task("mul", "What is 6 times 7?", "42", **overrides)


def test_label_json_is_the_task_and_prompt_fills_a_missing_prompt() -> None:
    fields = task_json()
    del fields["prompt"]
    task = bridge.task_from_openrlhf("Say 42.", json.dumps(fields))
    assert task.task_id == "mul" and task.prompt == "Say 42."
    assert bridge.task_from_openrlhf("Say 42.", task_json()).prompt == "What is 6 times 7?"


def test_defaults_fill_what_the_label_does_not_give_and_task_id_is_derived() -> None:
    defaults = task_json()
    del defaults["task_id"], defaults["prompt"]
    a = bridge.task_from_openrlhf("Say 42.", "", defaults)
    b = bridge.task_from_openrlhf("Say 42.", None, defaults)
    assert a.task_id == b.task_id and a.task_id.startswith("t")
    assert a.task_id != bridge.task_from_openrlhf("Say 43.", "", defaults).task_id


def test_task_without_evaluation_is_refused_naming_the_field() -> None:
    with pytest.raises(bridge.BridgeInputError, match=r"'mul'.*evaluation"):
        bridge.task_from_openrlhf("p", task_json(evaluation=None))


def test_label_that_is_no_json_object_is_refused_naming_the_field() -> None:
    with pytest.raises(bridge.BridgeInputError, match=r"^label: not a JSON object"):
        bridge.task_from_openrlhf("p", "the answer is 42")
    with pytest.raises(bridge.BridgeInputError, match=r"^label: .*got list"):
        bridge.task_from_openrlhf("p", "[1]")
    with pytest.raises(bridge.BridgeInputError, match=r"^label: task 'mul': harness"):
        bridge.task_from_openrlhf("p", task_json(harness={"name": 3}))


def test_group_size_of_one_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="samples_per_prompt"):
        bridge.OpenRLHFBridgeSettings(output="/tmp/x", samples_per_prompt=1)


def test_settings_come_from_the_environment_or_a_precise_error() -> None:
    raw = json.dumps({"output": "/tmp/x", "samples_per_prompt": 4})
    assert bridge.settings_from_env({bridge.SETTINGS_ENV: raw}).samples_per_prompt == 4
    with pytest.raises(bridge.BridgeInputError, match=bridge.SETTINGS_ENV):
        bridge.settings_from_env({})


def test_newest_complete_checkpoint_is_found(tmp_path: Path) -> None:
    assert bridge.newest_checkpoint(tmp_path / "none") is None
    for step in (1, 2, 10):
        (tmp_path / f"global_step{step}_hf").mkdir()
        (tmp_path / f"global_step{step}_hf" / "config.json").write_text("{}")
    (tmp_path / "global_step11_hf").mkdir()  # being written: no config.json yet
    (tmp_path / "global_step12").mkdir()  # a DeepSpeed checkpoint, not HF weights
    assert bridge.newest_checkpoint(tmp_path) == (10, tmp_path / "global_step10_hf")


# ------------------------------------------------------- n concurrent execute calls
class PreparedRollouts:
    """STAND-IN for `RolloutClient` (Temporal, workers and the Gateway are exercised in
    tests/integration/test_openrlhf_stack.py): each submitted group "finishes" at once
    with rows made by `make_rows(task, size)`, and it records what was submitted."""

    def __init__(self, make_rows: Any) -> None:
        self.make_rows = make_rows
        self.submitted: list[tuple[RolloutTask, int]] = []

    async def submit(
        self,
        tasks: list[RolloutTask],
        output: str,
        samples_per_task: int,
        batch_id: str,
        **_: Any,
    ) -> Any:
        (task,) = tasks
        self.submitted.append((task, samples_per_task))
        rows = self.make_rows(task, samples_per_task, f"{batch_id}-{task.task_id}")
        group = f"{batch_id}-{task.task_id}"  # one stand-in rollout carries the group's rows
        return SimpleNamespace(batch_id=batch_id, rows=rows, groups={group: ["all"]})

    async def results(self, batch: Any, poll_s: float) -> Any:
        yield SimpleNamespace(rollout_id="all", ok=True, rows=batch.rows)

    @staticmethod
    def load_samples(outcomes: list[Any]) -> Any:
        rows = [r for o in outcomes for r in o.rows]
        return SimpleNamespace(num_rows=len(rows), to_pylist=lambda: rows)


def tokenizer_stand_in(text: str, add_special_tokens: bool) -> dict[str, list[int]]:
    """STAND-IN for a Hugging Face tokenizer (only a fill sample's observation needs it)."""
    return {"input_ids": [ord(c) for c in text[:3]]}


def executor(client: PreparedRollouts, size: int = 3, linger_s: float = 5.0) -> Any:
    settings = bridge.OpenRLHFBridgeSettings(
        output="/tmp/unused", samples_per_prompt=size, group_linger_s=linger_s
    )
    ex = bridge.RolloutAgentExecutor(settings)
    ex._client = client
    return ex


def openrlhf_calls(ex: Any, prompts: list[tuple[str, Any]], n: int) -> Any:
    """As OpenRLHF's rollout actor calls an executor: n concurrent calls per prompt."""

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(
                ex.execute(
                    prompt=p,
                    label=lab,
                    sampling_params=None,
                    max_length=64,
                    hf_tokenizer=tokenizer_stand_in,
                    llm_engine=None,
                )
                for p, lab in prompts
                for _ in range(n)
            )
        )

    return asyncio.run(run())


def rows_for(task: RolloutTask, size: int, group: str) -> list[dict[str, Any]]:
    out = [row(f"{group}-{i}", i, float(i == 0), group=group) for i in range(size)]
    out[-1]["status"] = "infra_error"
    return out


def test_n_concurrent_calls_of_a_prompt_are_one_group_in_sample_order() -> None:
    client = PreparedRollouts(rows_for)
    out = openrlhf_calls(executor(client), [("Say 42.", task_json())], 3)
    assert [(t.task_id, n) for t, n in client.submitted] == [("mul", 3)]
    assert [o["reward"] for o in out] == [1.0, 0.0, 0.5]
    assert [o["action_ranges"] for o in out] == [[(2, 4)], [(2, 4)], []]


def test_two_prompts_are_two_groups_and_a_repeated_prompt_a_second_group() -> None:
    client = PreparedRollouts(rows_for)
    second = task_json()
    second["task_id"] = "other"
    prompts = [("a", task_json()), ("b", second), ("a", task_json())]
    out = openrlhf_calls(executor(client, size=2), prompts, 2)
    assert sorted(t.task_id for t, _ in client.submitted) == ["mul", "mul", "other"]
    assert all(n == 2 for _, n in client.submitted) and len(out) == 6


def test_a_short_group_starts_after_the_linger_with_what_joined(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = PreparedRollouts(rows_for)
    out = openrlhf_calls(executor(client, size=3, linger_s=0.05), [("a", task_json())], 2)
    assert [n for _, n in client.submitted] == [2] and len(out) == 2
    assert "a group of 2 started" in caplog.text


def test_a_failed_group_fails_every_call_of_it() -> None:
    def broken(task: RolloutTask, size: int, group: str) -> list[dict[str, Any]]:
        bad = row("x", 0, 1.0, group=group)
        bad["logprobs"] = [-0.1]
        return [bad]

    with pytest.raises(ConversionError, match=r"'x'.*logprobs"):
        openrlhf_calls(executor(PreparedRollouts(broken), size=2), [("a", task_json())], 2)


def test_multimodal_prompt_is_refused() -> None:
    ex = executor(PreparedRollouts(rows_for))
    with pytest.raises(bridge.BridgeInputError, match=r"^images"):
        asyncio.run(ex.execute("p", task_json(), None, 64, tokenizer_stand_in, None, images=[1]))
