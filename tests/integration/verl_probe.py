"""Runs in the verl trainer environment (`TRAINER_EXTRAS["verl"]`), started by
`test_verl_bridge.py`: our converted rollouts through verl's own code — its
`AgentLoopOutput` model, its agent loop registry and hydra instantiation (as its
`AgentLoopWorker` does), its per-row padding and batching (`_agent_loop_postprocess`,
`_postprocess`) and its GRPO advantage (`compute_grpo_outcome_advantage`). Prints one JSON
line of findings; the test asserts on them.

Not a fake: every verl object here is verl's. The one shortcut is the worker object,
made without `AgentLoopWorker.__init__` (which needs a Ray cluster, LLM servers and a full
trainer config) and given the attributes its padding and batching read.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.utils.dataset.rl_dataset import RLHFDataset

from bridges import verl as bridge
from bridges.rollouts import ConversionError, ConversionRules, to_training_rollouts
from schemas.routing import RoutedExperts
from schemas.tasks import RolloutTask

PROMPT_LENGTH = 8
RESPONSE_LENGTH = 12


def row(rollout: str, group: str, reward: float, status: str = "ok", **over: Any) -> dict[str, Any]:
    """One sample row: two calls with a tool result between them (mask 0)."""
    base: dict[str, Any] = {
        "rollout_id": rollout,
        "task_id": "t1",
        "group_id": group,
        "sample_index": 0,
        "segment_id": f"{rollout}-s0",
        "prompt_ids": [101, 102, 103],
        "response_ids": [11, 12, 13, 90, 91, 14, 15],
        "loss_mask": [1, 1, 1, 0, 0, 1, 1],
        "logprobs": [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5],
        "reward": reward,
        "status": status,
        "policy_version": "v3",
        "call_policy_versions": ["v3", "v3"],
        "call_starts": [0, 5],
    }
    base.update(over)
    return base


def one_call(response: list[int], logprob: float) -> dict[str, Any]:
    """A one-call response, every token sampled."""
    n = len(response)
    return {
        "response_ids": response,
        "loss_mask": [1] * n,
        "logprobs": [logprob] * n,
        "call_policy_versions": ["v3"],
        "call_starts": [0],
    }


def fields(out: AgentLoopOutput) -> dict[str, Any]:
    return {
        "type": f"{type(out).__module__}.{type(out).__qualname__}",
        "prompt_ids": out.prompt_ids,
        "response_ids": out.response_ids,
        "response_mask": out.response_mask,
        "response_logprobs": out.response_logprobs,
        "reward_score": out.reward_score,
        "num_turns": out.num_turns,
        "extra": {k: v for k, v in out.extra_fields.items() if k != "rollout_policy_versions"},
        "versions": out.extra_fields.get("rollout_policy_versions"),
    }


def worker(tokenizer: Any) -> AgentLoopWorker:
    """verl's worker, with what its padding and batching read (see module docstring)."""
    w = object.__new__(AgentLoopWorker)
    w.rollout_config = OmegaConf.create(
        {"prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH}
    )
    w.tokenizer = tokenizer
    w.processor = None
    w.reward_loop_worker_handles = None
    w.distillation_enabled = False
    w.mm_processor_kwargs = {}
    return w


def through_verl(tokenizer: Any, outputs: list[AgentLoopOutput], uids: list[str]) -> dict:
    """verl's padding and batching of our outputs, then its GRPO advantage by uid."""
    w = worker(tokenizer)

    async def post() -> list[Any]:
        kwargs = {"raw_prompt": [{"role": "user", "content": "task"}]}
        return [await w._agent_loop_postprocess(o, False, **kwargs) for o in outputs]

    internal = asyncio.run(post())
    batch = w._postprocess(internal, input_non_tensor_batch=None, validate=False)
    rm = batch.batch["rm_scores"]
    mask = batch.batch["response_mask"]
    adv, _ = compute_grpo_outcome_advantage(
        token_level_rewards=rm, response_mask=mask, index=np.array(uids, dtype=object)
    )
    return {
        "batch_keys": sorted(batch.batch.keys()),
        "non_tensor_keys": sorted(batch.non_tensor_batch.keys()),
        "shapes": {k: list(batch.batch[k].shape) for k in ("prompts", "responses", "input_ids")},
        "response_mask": mask.tolist(),
        "rollout_log_probs": batch.batch["rollout_log_probs"].tolist(),
        "scores": rm.sum(dim=-1).tolist(),
        "advantage": adv.sum(dim=-1).tolist(),
        "row_ids": [str(x) for x in batch.non_tensor_batch["rollout_id"]],
        "dtype_mask": str(mask.dtype),
    }


def with_routing(r: dict[str, Any], layers: int = 3, top_k: int = 2) -> dict[str, Any]:
    """The row with routing for every token but its last (ids 1..60, never 0)."""
    tokens = len(r["prompt_ids"]) + len(r["response_ids"]) - 1
    ids = np.arange(tokens * layers * top_k).reshape(tokens, layers, top_k) % 60 + 1
    return {**r, "routed_experts": RoutedExperts.of(ids).model_dump()}


def routing(tokenizer: Any) -> dict[str, Any]:
    """Routed rollouts (one cut at RESPONSE_LENGTH) through verl's padding and batching:
    where verl's batch holds each row's routing, compared with ours."""
    rows = [
        with_routing(row("r-0", "g", 1.0)),
        with_routing(row("r-1", "g", 0.0, **one_call(list(range(30, 50)), -0.7))),
    ]
    converted = to_training_rollouts(rows, ConversionRules(current_version=3))
    outputs = bridge.convert_batch(
        converted, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH
    )
    w = worker(tokenizer)

    async def post() -> list[Any]:
        kwargs = {"raw_prompt": [{"role": "user", "content": "task"}]}
        return [await w._agent_loop_postprocess(o, False, **kwargs) for o in outputs]

    batch = w._postprocess(asyncio.run(post()), input_non_tensor_batch=None, validate=False)
    got = batch.batch["routed_experts"]
    placed = []
    for i, (out, segment) in enumerate(zip(outputs, converted.rollouts, strict=True)):
        ours = segment.primary.routed_experts
        n = len(out.prompt_ids) + len(out.response_ids) - 1
        start = PROMPT_LENGTH - len(out.prompt_ids)  # verl pads prompts on the left
        want = torch.as_tensor(ours.array()[:n].astype(np.int64))
        placed.append(bool(torch.equal(got[i, start : start + n].to(torch.int64), want)))
    return {
        "shape": list(got.shape),
        "rows": [len(o.routed_experts) for o in outputs],
        "placed": placed,
    }


def errors() -> dict[str, str]:
    found: dict[str, str] = {}
    long_prompt = to_training_rollouts([row("long-prompt", "g", 1.0, prompt_ids=list(range(20)))])
    try:
        bridge.convert_batch(long_prompt, prompt_length=PROMPT_LENGTH)
    except ConversionError as exc:
        found["prompt"] = str(exc)
    bad = to_training_rollouts([row("bad-mask", "g", 1.0)]).rollouts[0]
    bad.primary.loss_mask.append(1)  # after conversion: the bridge checks again
    try:
        bridge.to_agent_loop_output(bad)
    except ConversionError as exc:
        found["mask"] = str(exc)
    return found


def rows_and_requests() -> dict[str, Any]:
    """How a dataset row names its task, and the request made for it."""
    task = RolloutTask.model_validate(
        {
            "task_id": "mul",
            "prompt": "6*7?",
            "harness": {"name": "command", "config": {"command": "true"}},
            "sampling": {"temperature": 1.0, "max_tokens": 24},
        }
    )
    tasks = {task.task_id: task}
    found: dict[str, Any] = {
        "column": bridge.task_of_row({"rollout_task": task.model_dump_json()}, None).task_id,
        "extra_info": bridge.task_of_row(
            {"extra_info": {"rollout_task": task.model_dump()}}, None
        ).task_id,
        "task_id": bridge.task_of_row({"extra_info": {"task_id": "mul"}}, tasks).task_id,
    }
    bad = {
        "none": ({"extra_info": {}}, tasks),
        "unknown": ({"extra_info": {"task_id": "nope"}}, tasks),
        "no_tasks_path": ({"extra_info": {"task_id": "mul"}}, None),
        "not_a_task": ({"rollout_task": "{}"}, None),
    }
    for name, (row_, known) in bad.items():
        try:
            bridge.task_of_row(row_, known)
            found[name] = None
        except ValueError as exc:
            found[name] = str(exc)
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
    a0 = bridge.plan_request(task, "uid-a", "/tmp/out", bridge._next_sample_index(), sampling)
    a1 = bridge.plan_request(task, "uid-a", "/tmp/out", bridge._next_sample_index(), sampling)
    b0 = bridge.plan_request(task, "uid-b", "/tmp/out", bridge._next_sample_index(), None)
    found["requests"] = [
        {
            "rollout_id": r.rollout_id,
            "group_id": r.group_id,
            "batch_id": r.batch_id,
            "sample_index": r.sample_index,
            "sampling": r.task.sampling.model_dump(exclude_defaults=True),
        }
        for r in (a0, a1, b0)
    ]
    return found


def loop(tokenizer_dir: str, tokenizer: Any) -> dict[str, Any]:
    """Our loop made exactly as verl's worker makes a registered one."""
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH}
            },
            "data": {},
        }
    )
    entry = dict(_agent_loop_registry[bridge.AGENT_NAME])
    yaml_entry = bridge.agent_loop_config(bridge.VerlOptions(output="/tmp/samples"))[0]
    made = hydra.utils.instantiate(
        config={**yaml_entry},
        trainer_config=DictConfigWrap(config=config),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
    return {
        "registered": entry,
        "yaml_entry": yaml_entry,
        "class": f"{type(made).__module__}.{type(made).__qualname__}",
        "limits": made.limits.model_dump(),
        "output": made.options.output,
        "is_agent_loop_base": bool(
            [c.__name__ for c in type(made).__mro__ if c.__name__ == "AgentLoopBase"]
        ),
    }


def main() -> None:
    tokenizer_dir = sys.argv[1]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rows = [
        row("g1-0", "g1", 1.0),
        row("g1-1", "g1", 0.0, **one_call([21, 22], -1.0)),
        row("g1-2", "g1", 0.0, status="infra_error"),
        row("g2-0", "g2", 0.5, **one_call(list(range(30, 50)), -0.7)),
        row("g2-1", "g2", 0.0, call_policy_versions=["v1", "v3"]),  # first call stale
    ]
    converted = to_training_rollouts(rows, ConversionRules(current_version=3, max_staleness=1))
    outputs = bridge.convert_batch(
        converted, prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH
    )
    uids = [r.group_id for r in converted.rollouts]
    ours = {g.group_id: g.advantages() for g in converted.groups}
    result = {
        "torch": torch.__version__,
        "outputs": [fields(o) for o in outputs],
        "ours": ours,
        "verl": through_verl(tokenizer, outputs, uids),
        "errors": errors(),
        "loop": loop(tokenizer_dir, tokenizer),
        "rows": rows_and_requests(),
        "routing": routing(tokenizer),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
