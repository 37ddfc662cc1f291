"""The slime bridge on the real parts: Temporal dev server, a worker with local bubblewrap
sandboxes, the Gateway in front of vLLM CPU (float32, dev endpoints, so `POST /policy`
loads weights in place) serving the tiny model.

slime itself cannot run here (see tests/unit/test_slime_contract.py), so slime's side is
played by this test, exactly as slime's trainer calls the hooks: `publish_policy(args,
version_dir, engines)` after a disk weight sync, then `generate_rollout(args, rollout_id,
data_source)` with a data source that hands out prompt groups the way slime's
`RolloutDataSource.get_samples` does (`PromptGroupsForTests`, named as the stand-in it
is). The samples come back as slime's `Sample` shape and are compared with the Parquet
rows the rollouts wrote. Kept small for 2 cores: 2 tasks × 2 rollouts, 1 held-out.
"""

import argparse
import copy
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bridges import slime as bridge
from examples.make_tasks import task as make_task
from rollout_client.storage import read_samples
from schemas.tasks import RolloutTask
from tests.fixtures.rollout_stack import RolloutStack, rollout_stack_fixture

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]

SLIME_STATUS = {
    "ok": "completed",
    "truncated": "truncated",
    "agent_timeout": "failed",
    "agent_broke_sandbox": "failed",
    "infra_error": "aborted",
}


stack = rollout_stack_fixture("slime-bridge")


class PromptGroupsForTests:
    """STAND-IN for slime's `RolloutDataSource` (slime cannot be installed here): hands out
    `n_samples_per_prompt` copies of each prompt per group, numbering groups and samples
    as slime's does (`group_index`, `index`), from `--prompt-data` lines."""

    def __init__(self, lines: list[dict[str, Any]], n_samples_per_prompt: int) -> None:
        self.prompts = [
            bridge.Sample(prompt=line["input"], metadata=line["metadata"]) for line in lines
        ]
        self.n = n_samples_per_prompt
        self.group_index = self.index = 0

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        groups = []
        for k in range(num_samples):
            group = []
            for _ in range(self.n):
                sample = copy.deepcopy(self.prompts[k % len(self.prompts)])
                sample.group_index, sample.index = self.group_index, self.index
                self.index += 1
                group.append(sample)
            self.group_index += 1
            groups.append(group)
        return groups


def tasks() -> list[RolloutTask]:
    sampling = {"temperature": 1.0, "max_tokens": 24}
    specs = [
        ("mul", "What is 6 times 7? Reply with the number only.", "42"),
        ("fr", "The capital of France? One word.", "Paris"),
    ]
    return [
        RolloutTask.model_validate(make_task(tid, prompt, expect, sampling=sampling))
        for tid, prompt, expect in specs
    ]


def slime_args(stack: RolloutStack, out: Path, **extra: Any) -> argparse.Namespace:
    """What slime's parser and `--custom-config-path` YAML would hand the hooks."""
    return argparse.Namespace(
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        advantage_estimator="grpo",
        rewards_normalization=True,
        agentic_rollout_output=str(out),
        agentic_rollout_temporal=stack.temporal.address,
        agentic_rollout_task_queue=stack.queue,
        agentic_rollout_gateway=stack.gateway.control_url,
        agentic_rollout_run="slimetest",
        **{f"agentic_rollout_{k}": v for k, v in extra.items()},
    )


def test_a_slime_step_publishes_samples_and_trains_on_exact_rows(
    stack: RolloutStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slime's disk sync writes weight_v000001 → publish_policy makes the Gateway serve it
    as slimetest-v1 → generate_rollout labels the step with it, runs 2 groups of 2, and
    returns slime samples whose tokens, masks and logprobs are the Parquet rows'."""
    monkeypatch.setenv("ROLLOUT_ADMIN_TOKEN", stack.gateway.admin_token or "")
    out = tmp_path / "samples"
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text(json.dumps(bridge.prompt_data_rows(tasks()[1:])[0]) + "\n")
    args = slime_args(stack, out)
    # slime's --eval-prompt-data heldout PATH, as its EvalDatasetConfig
    args.eval_datasets = [
        SimpleNamespace(name="heldout", path=str(heldout), n_samples_per_eval_prompt=1)
    ]

    version_dir = stack.work / "sync" / "weight_v000001"
    shutil.copytree(stack.model, version_dir)
    bridge.publish_policy(args, str(version_dir), [])

    source = PromptGroupsForTests(bridge.prompt_data_rows(tasks()), args.n_samples_per_prompt)
    output = bridge.generate_rollout(args, 0, source)

    assert output.metrics["agentic_rollout/rollouts"] == 4
    groups = output.samples
    assert [[r[0].group_index for r in g] for g in groups] == [[0, 0], [1, 1]]
    assert [[r[0].rollout_id for r in g] for g in groups] == [[0, 1], [2, 3]]
    rows = {(r["rollout_id"], r["segment_id"]): r for r in read_samples(out).to_pylist()}
    samples = [s for g in groups for r in g for s in r]
    assert len(samples) == len(rows)
    for sample in samples:
        ours = sample.metadata[bridge.META_KEY]
        row = rows[(ours["rollout_id"], ours["segment_id"])]
        assert sample.tokens == row["prompt_ids"] + row["response_ids"]
        assert sample.response_length == len(row["response_ids"])
        assert sample.loss_mask == row["loss_mask"]
        assert sample.rollout_log_probs == pytest.approx(row["logprobs"])
        assert sample.weight_versions == ["slimetest-v1"] * len(row["call_starts"])
        assert sample.reward == row["reward"]
        assert sample.status.value == SLIME_STATUS[row["status"]]
        assert sample.remove_sample is (row["status"] == "infra_error")
    raw, rewards = bridge.post_process_rewards(args, samples)
    assert raw == [s.reward for s in samples] and len(rewards) == len(samples)

    evaluation = bridge.generate_rollout(args, 0, source, evaluation=True)
    held = evaluation.data["heldout"]
    assert len(held["rewards"]) == len(held["samples"]) == 1
    assert held["samples"][0].metadata[bridge.META_KEY]["task_id"] == "fr"
