"""Runs in the verl trainer environment, started by `test_verl_bridge.py` next to a real
stack (Temporal dev server, a worker with bubblewrap sandboxes, the Gateway in front of
vLLM CPU): our agent loop, made by hydra from the YAML entry as verl's worker makes it,
runs three dataset rows as verl hands them to `run` — two copies of one prompt (one
`uid`, as `rollout.n = 2` repeats it) and one other prompt. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import hydra
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap
from verl.utils.dataset.rl_dataset import RLHFDataset

from bridges import verl as bridge

# verl's own defaults for a training step's sampling (AgentLoopWorker.generate_sequences)
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}


def main() -> None:
    settings = json.loads(sys.argv[1])
    tokenizer = AutoTokenizer.from_pretrained(settings.pop("tokenizer"))
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 4096}},
            "data": {},
        }
    )
    (entry,) = bridge.agent_loop_config(bridge.VerlOptions(**settings))
    loop = hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )

    def row(uid: str, task_id: str) -> dict[str, Any]:
        return {
            "uid": uid,
            "index": 0,
            "agent_name": bridge.AGENT_NAME,
            "raw_prompt": [{"role": "user", "content": task_id}],
            "extra_info": {"task_id": task_id},
            "data_source": "agentic_rollout",
        }

    async def go() -> list[AgentLoopOutput]:
        rows = [row("uid-a", "mul"), row("uid-a", "mul"), row("uid-b", "cjk")]
        return await asyncio.gather(*(loop.run(dict(SAMPLING), **r) for r in rows))

    outputs = asyncio.run(go())
    print(
        json.dumps(
            [
                {
                    "type": type(o).__name__,
                    "len": [len(o.response_ids), len(o.response_mask), len(o.response_logprobs)],
                    "trained_tokens": sum(o.response_mask),
                    "prompt_tokens": len(o.prompt_ids),
                    "reward": o.reward_score,
                    "num_turns": o.num_turns,
                    "extra": o.extra_fields,
                    "seconds": o.metrics.generate_sequences,
                }
                for o in outputs
            ]
        )
    )


if __name__ == "__main__":
    main()
