"""The OpenRLHF bridge against OpenRLHF's own code, in the OpenRLHF trainer environment
(OpenRLHF 0.11.2 installed `--no-deps` over the vLLM venv's torch, transformers and vLLM,
with Ray and the one module its math utilities import: `TRAINER_EXTRAS["openrlhf"]`,
built once and cached).

`openrlhf_probe.py` runs there once per module: OpenRLHF's `--train.agent_func_path`
loader loads an agent file made of `make_agent_executor`, its rollout actor's
`generate_responses` makes the n concurrent calls of one prompt, and its samples
generator turns each response into an `Experience`. Each test asserts one part of the
contract on what the probe found.

Not run here: OpenRLHF's advantage and loss code (`experience_maker`, `models.loss`
import peft and DeepSpeed, which do not install on this CPU box); the test on the
group-mean fill checks the per-prompt reshape those functions do by its documented
shape instead.
"""

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devstack.tiny_model import ensure_tiny_model
from environments.trainer import (
    TRAINER_EXTRAS,
    trainer_environment,
    trainer_python,
    trainer_pythonpath,
)
from environments.vllm_cpu import INSTALL_HINT, VllmVenvError

pytestmark = [pytest.mark.integration, pytest.mark.needs("trainer_env:openrlhf")]

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("openrlhf_probe.py")
PROMPT = [101, 102, 103]


@pytest.fixture(scope="module")
def found() -> Any:
    try:
        python = trainer_python(extras=TRAINER_EXTRAS["openrlhf"])
    except VllmVenvError as exc:
        pytest.fail(
            f"OpenRLHF trainer environment missing and not creatable: {exc}\n{INSTALL_HINT}"
        )
    link_dir = trainer_pythonpath(REPO)
    try:
        proc = subprocess.run(
            [str(python), str(PROBE), str(ensure_tiny_model())],
            capture_output=True,
            text=True,
            timeout=900,
            env=trainer_environment(link_dir),
            cwd=link_dir,
        )
    finally:
        shutil.rmtree(link_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_openrlhf_loads_the_agent_file_as_its_own_executor(found: Any) -> None:
    assert found["versions"]["openrlhf"] == "0.11.2"
    assert found["executor_is_openrlhf_base"] is True
    assert found["executor_type"] == "AgentExecutor"


def test_the_n_calls_of_a_prompt_are_one_group_of_n(found: Any) -> None:
    assert found["submitted"] == [3]
    assert len(found["responses"]) == len(found["experiences"]) == 3


def test_multi_turn_tokens_mask_and_logprobs_reach_the_experience(found: Any) -> None:
    """OpenRLHF shifts by one (token t is predicted at t-1): the action mask is our loss
    mask after the prompt, log-probs the engine's, tool tokens neither."""
    exp = found["experiences"][0]
    response = [200, 201, 202, 203, 204, 205]
    mask = [1, 1, 0, 0, 1, 1]
    logprobs = [-0.1 * (k + 1) for k in range(6)]
    assert exp["sequences"] == PROMPT + response
    assert exp["action_mask"] == [0] * (len(PROMPT) - 1) + mask
    assert exp["rollout_log_probs"] == pytest.approx([0.0] * (len(PROMPT) - 1) + logprobs)
    assert exp["rewards"] == [1.0] and exp["scores"] == [1.0]
    assert exp["response_length"] == [6]
    assert found["responses"][0]["extra_logs"]["agent_num_turns"] == 2.0


def test_truncated_rollout_is_flagged_for_openrlhfs_length_penalties(found: Any) -> None:
    assert [e["truncated"] for e in found["experiences"]] == [[False], [True], [False]]


def test_infra_error_is_a_sample_without_action_tokens_and_the_group_mean(found: Any) -> None:
    """OpenRLHF's loss skips a sequence without action tokens; its reward is the mean of
    the two that count, so the per-prompt mean over 3 (reshape(-1, 3)) is theirs."""
    infra = found["experiences"][2]
    assert sum(infra["action_mask"]) == 0
    assert infra["rewards"] == [0.5]
    assert found["batch"]["action_tokens"] == [4, 3, 0]
    assert found["batch"]["info_infra"] == [0.0, 0.0, 1.0]
    rewards = found["batch"]["rewards"]
    assert sum(rewards) / len(rewards) == pytest.approx((1.0 + 0.0) / 2)


def test_the_group_batches_with_openrlhfs_own_concat(found: Any) -> None:
    """Same `info` keys on every sample, or OpenRLHF's concat would fail."""
    assert found["batch"]["sequences_shape"] == [3, len(PROMPT) + 6]
    assert len({tuple(e["info"]) for e in found["experiences"]}) == 1
    assert found["batch"]["finite_logprobs"] is True


def test_a_misaligned_row_fails_the_prompt_naming_rollout_and_field(found: Any) -> None:
    refused = found["refused"]
    assert refused is not None and refused["field"] == "loss_mask"
    assert refused["rollout_id"].endswith("-0") and "5 entries for 6" in refused["message"]
