"""Runs in the OpenRLHF trainer environment (`TRAINER_EXTRAS["openrlhf"]`), started by
`test_openrlhf_contract.py`: our executor through OpenRLHF's own code — its agent file
loader (`_load_agent_executor`, what `--train.agent_func_path` runs), its rollout actor's
`generate_responses` (the n concurrent `execute` calls of one prompt), its
`SamplesGenerator._process_response_into_experience` (response dict → `Experience`:
sequences, action mask, rollout log-probs, rewards) and `Experience.concat_experiences`
(its micro-batching). Prints one JSON line of findings; the test asserts on them.

Every OpenRLHF object here is OpenRLHF's. Two stand-ins, named as such: the rollout
actor object is made without its `__init__` (which starts a vLLM engine under Ray) and
given the one attribute `generate_responses` reads (`executor`), as OpenRLHF's own
`tests/test_agent.py` does for the samples generator; and `PreparedRollouts` stands in
for `RolloutClient` (Temporal and the workers are exercised in the stack test), serving
rows made here: one group of 3 with a two-call rollout (tool tokens between the calls),
a truncated one and an infra error.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import vllm
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.trainer.ray.vllm_engine import RolloutRayActor, _load_agent_executor
from openrlhf.utils.agent import AgentExecutorBase
from transformers import AutoTokenizer
from vllm import SamplingParams

from bridges.rollouts import ConversionError

N = 3
MAX_LEN = 64
AGENT_FILE = """
from bridges.openrlhf import OpenRLHFBridgeSettings, make_agent_executor

AgentExecutor = make_agent_executor(
    OpenRLHFBridgeSettings(output="/tmp/unused", samples_per_prompt={n})
)
"""


def rows_for(task: Any, size: int, group: str) -> list[dict[str, Any]]:
    def row(i: int, reward: float, status: str, mask: list[int], starts: list[int]) -> Any:
        return {
            "rollout_id": f"{group}-{i}",
            "task_id": task.task_id,
            "group_id": group,
            "sample_index": i,
            "segment_id": f"{group}-{i}-s0",
            "prompt_ids": [101, 102, 103],
            "response_ids": [200 + k for k in range(len(mask))],
            "loss_mask": mask,
            "logprobs": [-0.1 * (k + 1) for k in range(len(mask))],
            "reward": reward,
            "status": status,
            "policy_version": "unversioned",
            "call_policy_versions": ["unversioned"] * len(starts),
            "call_starts": starts,
        }

    return [
        row(0, 1.0, "ok", [1, 1, 0, 0, 1, 1], [0, 4]),  # call, tool result, call
        row(1, 0.0, "truncated", [1, 1, 1], [0]),
        row(2, 0.0, "infra_error", [1, 1], [0]),
    ][:size]


class PreparedRollouts:
    """STAND-IN for `RolloutClient`: each submitted group finishes at once with `rows_for`."""

    def __init__(self, bad_lengths: bool = False) -> None:
        self.submitted: list[int] = []
        self.bad_lengths = bad_lengths

    async def submit(
        self, tasks: list[Any], output: str, samples_per_task: int, batch_id: str, **_: Any
    ) -> Any:
        self.submitted.append(samples_per_task)
        group = f"{batch_id}-{tasks[0].task_id}"
        rows = rows_for(tasks[0], samples_per_task, group)
        if self.bad_lengths:
            rows[0]["loss_mask"] = rows[0]["loss_mask"][:-1]
        # one stand-in rollout carries the group's rows
        return SimpleNamespace(batch_id=batch_id, rows=rows, groups={group: ["all"]})

    async def results(self, batch: Any, poll_s: float) -> Any:
        yield SimpleNamespace(rollout_id="all", ok=True, rows=batch.rows)

    @staticmethod
    def load_samples(outcomes: list[Any]) -> Any:
        rows = [r for o in outcomes for r in o.rows]
        return SimpleNamespace(num_rows=len(rows), to_pylist=lambda: rows)


def label() -> str:
    return json.dumps(
        {
            "task_id": "mul",
            "harness": {"name": "command", "config": {"command": "true"}},
            "evaluation": {"checks": [{"kind": "file", "path": "answer.txt", "contains": ["42"]}]},
        }
    )


def run_prompt(executor: Any, tokenizer: Any) -> list[dict[str, Any]]:
    actor = RolloutRayActor.__ray_actor_class__.__new__(RolloutRayActor.__ray_actor_class__)
    actor.executor = executor
    params = SamplingParams(temperature=1.0, max_tokens=None, logprobs=1)
    return asyncio.run(
        actor.generate_responses(
            prompt="What is 6 times 7?",
            label=label(),
            sampling_params=params,
            max_length=MAX_LEN,
            hf_tokenizer=tokenizer,
            num_samples=N,
        )
    )


def main(model_dir: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        agent_file = Path(tmp) / "openrlhf_agent.py"
        agent_file.write_text(AGENT_FILE.format(n=N))
        executor = _load_agent_executor(str(agent_file))
    client = executor._client = PreparedRollouts()
    responses = run_prompt(executor, tokenizer)

    generator = SamplesGenerator.__new__(SamplesGenerator)  # as OpenRLHF's tests/test_agent.py
    experiences = [
        generator._process_response_into_experience(r, max_len=MAX_LEN) for r in responses
    ]
    batch = Experience.concat_experiences(experiences, tokenizer.pad_token_id or 0)

    bad = _load_agent_executor_again(executor)
    bad._client = PreparedRollouts(bad_lengths=True)
    try:
        run_prompt(bad, tokenizer)
        refused = None
    except ConversionError as exc:
        refused = {"rollout_id": exc.rollout_id, "field": exc.field, "message": str(exc)}

    print(
        json.dumps(
            {
                "versions": {
                    **{p: importlib.metadata.version(p) for p in ("openrlhf", "ray")},
                    "vllm": vllm.__version__,  # from the vLLM venv via the overlay's .pth
                },
                "executor_is_openrlhf_base": isinstance(executor, AgentExecutorBase),
                "executor_type": type(executor).__name__,
                "submitted": client.submitted,
                "responses": [
                    {k: v for k, v in r.items() if k not in ("images", "mm_train_inputs")}
                    for r in responses
                ],
                "experiences": [
                    {
                        "sequences": e.sequences[0].tolist(),
                        "action_mask": e.action_mask[0].tolist(),
                        "rollout_log_probs": e.rollout_log_probs[0].tolist(),
                        "rewards": e.rewards.tolist(),
                        "scores": e.scores.tolist(),
                        "truncated": e.truncated.tolist(),
                        "response_length": e.response_length.tolist(),
                        "info": sorted(e.info),
                    }
                    for e in experiences
                ],
                "batch": {
                    "sequences_shape": list(batch.sequences.shape),
                    "action_tokens": batch.action_mask.sum(dim=-1).tolist(),
                    "rewards": batch.rewards.tolist(),
                    "info_infra": batch.info["agent_infra_error"].tolist(),
                    "mask_dtype": str(batch.action_mask.dtype),
                    "finite_logprobs": bool(torch.isfinite(batch.rollout_log_probs).all()),
                },
                "refused": refused,
            }
        )
    )


def _load_agent_executor_again(executor: Any) -> Any:
    """A second instance of the same class, as a second rollout actor would build it."""
    return type(executor)()


if __name__ == "__main__":
    main(sys.argv[1])
