"""The TRL bridge against TRL's own `GRPOTrainer` (trl 1.16, CPU, the tiny model; no
services): what TRL makes of the fields `bridges.trl` returns. One generation batch
through TRL's real scoring: every sample keeps its tokens and our loss mask, our reward
reaches TRL through the bridge's reward function, and an `infra_error` rollout gets no
loss token and advantage 0 while its group's baseline is the other rollouts' alone."""

import statistics
from pathlib import Path

import pytest

from tests.fixtures.trainer import TrainerPython

pytestmark = pytest.mark.integration

SCORE = """
import json, tempfile, warnings
warnings.filterwarnings("ignore")
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig
from bridges.rollouts import ConversionRules, to_training_rollouts
from bridges.trl import convert_batch, group_runs, grpo_trainer_class, rollout_reward
from trainer.policy import load_policy

rows = json.loads({rows!r})
tokenizer = AutoTokenizer.from_pretrained({model!r})

def rollout_func(prompts, trainer):
    runs = group_runs(prompts, 3)
    batch = to_training_rollouts(rows, ConversionRules(current_version=0, stale="mask"))
    slots = [(t, i) for t in runs for i in range(3)]
    return convert_batch(batch, slots=slots, placeholder_id=tokenizer.eos_token_id)

args = GRPOConfig(
    output_dir=tempfile.mkdtemp(), per_device_train_batch_size=6, num_generations=3,
    beta=0.0, shuffle_dataset=False, gradient_checkpointing=False, bf16=False,
    use_cpu=True, report_to=[], max_steps=1, disable_tqdm=True,
)
trainer = grpo_trainer_class()(
    model=load_policy({model!r}), reward_funcs=[rollout_reward], args=args,
    train_dataset=Dataset.from_list([{{"prompt": "t"}}, {{"prompt": "u"}}]),
    processing_class=tokenizer, rollout_func=rollout_func,
)
inputs = [{{"prompt": p}} for p in ("t", "t", "t", "u", "u", "u")]
out = trainer._generate_and_score_completions(inputs)
mask = out["completion_mask"] * out["tool_mask"]
print(json.dumps({{
    "advantages": out["advantages"].tolist(),
    "loss_tokens": mask.sum(dim=1).tolist(),
    "completion_ids": [
        ids[: int(n)] for ids, n in zip(out["completion_ids"].tolist(),
                                        out["completion_mask"].sum(dim=1).tolist())
    ],
    "engine_logprobs_kept": out["sampling_per_token_logps"][0, :3].tolist(),
}}))
"""


def row(task: str, index: int, reward: float, status: str = "ok") -> dict[str, object]:
    mask = [1, 1, 0, 1]
    return {
        "rollout_id": f"{task}-{index}",
        "task_id": task,
        "group_id": f"g-{task}",
        "sample_index": index,
        "segment_id": "s0",
        "prompt_ids": [5, 6, 7],
        "response_ids": [20 + index, 21, 22, 23],
        "loss_mask": mask,
        "logprobs": [-0.5, -0.25, 0.0, -0.125],
        "reward": reward,
        "status": status,
        "policy_version": "run-v0",
        "call_policy_versions": ["run-v0"],
        "call_starts": [0],
    }


def test_trl_scores_our_fields_with_our_rules(trl_env: TrainerPython, tiny_model_dir: Path) -> None:
    import json

    rows = [
        row("t", 0, 1.0),
        row("t", 1, 0.0),
        row("t", 2, 0.0, status="infra_error"),  # its reward 0 must not pull t's mean down
        row("u", 0, 1.0),
        row("u", 1, 0.0),
        row("u", 2, 0.0),
    ]
    got = trl_env.run_json(SCORE.format(rows=json.dumps(rows), model=str(tiny_model_dir)))
    # t's baseline is {1, 0} only: mean .5, TRL's (unbiased) std; u's is {1, 0, 0}
    t_adv = 0.5 / (statistics.stdev([1.0, 0.0]) + 1e-4)
    u_mean, u_std = 1 / 3, statistics.stdev([1.0, 0.0, 0.0])
    expected = [t_adv, -t_adv, 0.0, (1 - u_mean) / (u_std + 1e-4), -u_mean / (u_std + 1e-4)]
    expected.append(expected[-1])
    assert got["advantages"] == pytest.approx(expected, abs=1e-4)
    assert got["loss_tokens"] == [3, 3, 0, 3, 3, 3]  # tool token masked; infra_error: none
    assert got["completion_ids"][0] == [20, 21, 22, 23]
    assert got["engine_logprobs_kept"] == [-0.5, -0.25, 0.0]
