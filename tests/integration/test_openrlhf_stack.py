"""The OpenRLHF bridge's executor on the real parts: Temporal dev server, a worker with
local bubblewrap sandboxes, the Gateway in front of vLLM CPU (float32, dev endpoints, so
`POST /policy` loads weights in place) serving the tiny model.

OpenRLHF itself does not train on CPU (its own classes are exercised in
test_openrlhf_contract.py), so its side is played here exactly as its rollout actor
calls an agent executor: n concurrent `execute(prompt, label, sampling_params,
max_length, hf_tokenizer, llm_engine)` calls for one prompt, after OpenRLHF's actor has
written `<ckpt.path>/global_step1_hf` (`--ckpt.save_hf`). The responses are compared with
the Parquet rows the rollouts wrote. Kept small for 2 cores: 1 prompt × 2 rollouts.
"""

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bridges import openrlhf as bridge
from examples.make_tasks import task as make_task
from rollout_client import GatewayPolicyClient
from rollout_client.storage import read_samples
from tests.fixtures.rollout_stack import RolloutStack, rollout_stack_fixture

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]

N = 2


stack = rollout_stack_fixture("openrlhf-bridge")


def tokenizer_stand_in(text: str, add_special_tokens: bool) -> dict[str, list[int]]:
    """STAND-IN for OpenRLHF's Hugging Face tokenizer: the executor tokenizes only a fill
    sample's observation, and this test has none."""
    return {"input_ids": [1]}


def test_openrlhf_calls_publish_the_checkpoint_and_return_the_rows(
    stack: RolloutStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenRLHF saved global_step1_hf → the first group publishes it as orltest-v1, runs
    2 rollouts labelled with it, and each call gets its rollout's row in OpenRLHF's shape."""
    monkeypatch.setenv("ROLLOUT_ADMIN_TOKEN", stack.gateway.admin_token or "")
    ckpt = stack.work / "ckpt"
    shutil.copytree(stack.model, ckpt / "global_step1_hf")
    out = tmp_path / "samples"
    settings = bridge.OpenRLHFBridgeSettings(
        output=str(out),
        samples_per_prompt=N,
        temporal=stack.temporal.address,
        task_queue=stack.queue,
        gateway=stack.gateway.control_url,
        checkpoint_root=str(ckpt),
        run_id="orltest",
        poll_s=0.5,
    )
    label = make_task(
        "mul",
        "What is 6 times 7? Reply with the number only.",
        "42",
        sampling={"temperature": 1.0, "max_tokens": 24},
    )
    del label["prompt"]
    executor = bridge.RolloutAgentExecutor(settings)

    async def openrlhf_prompt() -> list[Any]:
        return await asyncio.gather(
            *(
                executor.execute(
                    "What is 6 times 7? Reply with the number only.",
                    json.dumps(label),
                    None,
                    4096,
                    tokenizer_stand_in,
                    None,
                )
                for _ in range(N)
            )
        )

    responses = asyncio.run(openrlhf_prompt())

    rows = sorted(read_samples(out).to_pylist(), key=lambda r: r["sample_index"])
    assert [r["sample_index"] for r in rows] == list(range(N))  # one group, one row each
    assert len({r["group_id"] for r in rows}) == 1
    for response, row in zip(responses, rows, strict=True):
        assert set(row["call_policy_versions"]) == {"orltest-v1"}
        assert response["observation_tokens"] == row["prompt_ids"] + row["response_ids"]
        offset = len(row["prompt_ids"])
        mask = [0] * len(row["response_ids"])
        for start, end in response["action_ranges"]:
            mask[start - offset : end - offset] = [1] * (end - start)
        if row["status"] == "infra_error":
            assert mask == [0] * len(mask)
        else:
            assert mask == row["loss_mask"] and response["reward"] == row["reward"]
        logprobs = response["rollout_log_probs"]
        assert logprobs[offset:] == pytest.approx(row["logprobs"])
        assert logprobs[:offset] == [0.0] * offset
    policy = GatewayPolicyClient(stack.gateway.control_url, stack.gateway.admin_token)
    state = asyncio.run(policy.state())
    assert state.policy_version == "orltest-v1"
    assert state.history[-1].checkpoint == str((ckpt / "global_step1_hf").resolve())
