"""The verl bridge against verl's own code, in the verl trainer environment (verl 0.9.1
installed `--no-deps` over the vLLM venv's torch and transformers, with the packages its
agent loop imports: `TRAINER_EXTRAS["verl"]`, built once and cached).

`verl_probe.py` runs there once per module: our converted rollouts become verl's
`AgentLoopOutput`s, go through verl's own per-row padding and batching and its GRPO
advantage, and our loop is made by hydra from verl's registry as verl's worker makes it.
Each test asserts one part of the contract on what the probe found.
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
from tests.integration.test_trainer import TrainStack, stack  # noqa: F401 (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.needs("trainer_env:verl")]

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("verl_probe.py")
RUN_PROBE = Path(__file__).with_name("verl_run_probe.py")


@pytest.fixture(scope="module")
def found() -> Any:
    try:
        python = trainer_python(extras=TRAINER_EXTRAS["verl"])
    except VllmVenvError as exc:
        pytest.fail(f"verl trainer environment missing and not creatable: {exc}\n{INSTALL_HINT}")
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


def _out(found: Any, rollout_id: str) -> dict[str, Any]:
    (out,) = [o for o in found["outputs"] if o["extra"]["rollout_id"] == rollout_id]
    return out


def _row(found: Any, rollout_id: str) -> int:
    return found["verl"]["row_ids"].index(rollout_id)


def _advantage(found: Any, rollout_id: str) -> float:
    """verl's per-token advantage of a row is one value on its masked tokens."""
    i = _row(found, rollout_id)
    tokens = sum(found["verl"]["response_mask"][i])
    return found["verl"]["advantage"][i] / tokens if tokens else 0.0


def test_outputs_are_verls_own_agent_loop_outputs(found: Any) -> None:
    types = {o["type"] for o in found["outputs"]}
    assert types == {"verl.experimental.agent_loop.agent_loop.AgentLoopOutput"}


def test_multi_turn_mask_logprobs_reward_and_turns_map_one_to_one(found: Any) -> None:
    """Two calls with a tool result between them: the tool tokens keep mask 0."""
    out = _out(found, "g1-0")
    assert out["prompt_ids"] == [101, 102, 103]
    assert out["response_ids"] == [11, 12, 13, 90, 91, 14, 15]
    assert out["response_mask"] == [1, 1, 1, 0, 0, 1, 1]
    assert out["response_logprobs"] == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert out["reward_score"] == 1.0 and out["num_turns"] == 2
    assert out["extra"]["rollout_group_id"] == "g1" and out["extra"]["rollout_status"] == "ok"
    assert out["versions"] == ["v3"]


def test_a_stale_calls_tokens_get_no_loss(found: Any) -> None:
    """First call sampled by v1 (lag 2 > max_staleness 1): its 3 tokens are masked."""
    out = _out(found, "g2-1")
    assert out["response_mask"] == [0, 0, 0, 0, 0, 1, 1]
    assert out["versions"] == ["v1", "v3"]


def test_infra_error_has_no_loss_and_keeps_its_groups_mean(found: Any) -> None:
    """verl takes a uid's mean over every row: the infra row gets the baseline mean (.5 of
    rewards 1 and 0), so verl's mean of the uid is the mean of the rollouts in it."""
    out = _out(found, "g1-2")
    assert out["response_mask"] == [0]
    assert out["reward_score"] == 0.5
    assert out["extra"]["rollout_in_baseline"] is False
    scores = [found["verl"]["scores"][_row(found, r)] for r in ("g1-0", "g1-1", "g1-2")]
    assert sum(scores) / 3 == 0.5
    assert _advantage(found, "g1-2") == 0.0


def test_verl_grpo_advantages_agree_in_sign_with_ours(found: Any) -> None:
    for group in found["ours"].values():
        for rollout_id, ours in group.items():
            ratio = _advantage(found, rollout_id) * ours
            assert ratio > 0 or ours == 0.0, rollout_id


def test_verl_pads_to_its_widths_and_a_long_response_is_cut_and_flagged(found: Any) -> None:
    assert found["verl"]["shapes"] == {
        "prompts": [5, 8],
        "responses": [5, 12],
        "input_ids": [5, 20],
    }
    out = _out(found, "g2-0")  # 20 response tokens, response_length 12
    assert out["response_ids"] == list(range(30, 42)) and out["extra"]["rollout_cut"] is True
    assert len(out["response_mask"]) == len(out["response_logprobs"]) == 12
    assert _out(found, "g1-0")["extra"]["rollout_cut"] is False
    assert {"rm_scores", "rollout_log_probs", "response_mask"} <= set(found["verl"]["batch_keys"])


def test_our_fields_reach_verls_batch_in_row_order(found: Any) -> None:
    assert found["verl"]["row_ids"] == ["g1-0", "g1-1", "g1-2", "g2-0", "g2-1"]
    ours = {k for k in found["verl"]["non_tensor_keys"] if k.startswith("rollout_")}
    assert {"rollout_id", "rollout_group_id", "rollout_status", "rollout_policy_versions"} <= ours


def test_routed_experts_reach_verls_batch_where_verl_puts_its_own(found: Any) -> None:
    """verl 0.9.1's `AgentLoopOutput.routed_experts`: (prompt + response - 1, layers,
    top_k); verl places it from the left-padded prompt's first token. A cut response
    keeps the routing of what is kept (3 prompt + 12 response tokens - 1)."""
    routing = found["routing"]
    assert routing["rows"] == [3 + 7 - 1, 3 + 12 - 1]
    assert routing["shape"] == [2, 8 + 12, 3, 2]
    assert routing["placed"] == [True, True]


def test_errors_name_the_rollout_and_the_field(found: Any) -> None:
    prompt, mask = found["errors"]["prompt"], found["errors"]["mask"]
    assert "'long-prompt'" in prompt and "prompt_ids" in prompt and "prompt_length=8" in prompt
    assert "'bad-mask'" in mask and "loss_mask" in mask


def test_the_loop_is_registered_by_name_and_made_by_hydra_as_verls_worker_does(
    found: Any,
) -> None:
    loop = found["loop"]
    assert loop["registered"] == {"_target_": "bridges.verl.AgenticRolloutLoop"}
    assert loop["yaml_entry"]["name"] == "agentic_rollout"
    assert loop["class"] == "bridges.verl.AgenticRolloutLoop" and loop["is_agent_loop_base"]
    assert loop["limits"] == {"prompt_length": 8, "response_length": 12}
    assert loop["output"] == "/tmp/samples"


def test_a_row_names_its_task_by_json_or_by_id_and_a_bad_row_is_named(found: Any) -> None:
    rows = found["rows"]
    assert rows["column"] == rows["extra_info"] == rows["task_id"] == "mul"
    assert "neither 'rollout_task' nor 'task_id'" in rows["none"]
    assert "'nope'" in rows["unknown"] and "tasks_path" in rows["unknown"]
    assert "needs the loop's tasks_path" in rows["no_tasks_path"]
    assert "not a RolloutTask" in rows["not_a_task"]


def test_copies_of_a_uid_get_one_group_and_verls_sampling(found: Any) -> None:
    a0, a1, b0 = found["rows"]["requests"]
    assert a0["group_id"] == a1["group_id"] != b0["group_id"]
    assert a0["batch_id"] == a1["batch_id"] and a0["rollout_id"] != a1["rollout_id"]
    assert all(0 <= r["sample_index"] < 2**31 for r in (a0, a1, b0))  # int32 column
    # verl's greedy validation params win; its top_k=-1 is our "no top-k"; the rest stays
    assert a0["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 24}
    assert b0["sampling"] == {"temperature": 1.0, "max_tokens": 24}


# ------------------------------------------------------------------ the loop on the stack


@pytest.fixture(scope="module")
def ran(stack: TrainStack, tmp_path_factory: pytest.TempPathFactory) -> Any:  # noqa: F811
    """Three rows through `AgenticRolloutLoop.run` on the real stack (`verl_run_probe.py`)."""
    python = trainer_python(extras=TRAINER_EXTRAS["verl"])
    output = tmp_path_factory.mktemp("verl-samples")
    settings = {
        "tokenizer": str(stack.model),
        "temporal_address": stack.temporal.address,
        "task_queue": stack.queue,
        "output": str(output),
        "tasks_path": str(stack.tasks),
        "gateway_url": stack.gateway.control_url,
        "gateway_admin_token": stack.gateway.admin_token,
    }
    link_dir = trainer_pythonpath(REPO)
    try:
        proc = subprocess.run(
            [str(python), str(RUN_PROBE), json.dumps(settings)],
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


def test_run_returns_one_trained_output_per_row_from_a_real_rollout(ran: Any) -> None:
    assert [o["type"] for o in ran] == ["AgentLoopOutput"] * 3
    for out in ran:
        n_ids, n_mask, n_logprobs = out["len"]
        assert n_ids == n_mask == n_logprobs
        # the tiny model often runs out of its 24 tokens: truncated is the agent's, trained
        assert out["extra"]["rollout_status"] in ("ok", "truncated"), out["extra"]
        assert out["extra"]["rollout_in_baseline"] and out["extra"]["rollout_errors"] == []
        assert out["trained_tokens"] > 0 and out["prompt_tokens"] > 0
        assert out["num_turns"] >= 1 and out["reward"] in (0.0, 1.0)


def test_copies_of_a_row_share_a_group_and_other_rows_do_not(ran: Any) -> None:
    groups = [o["extra"]["rollout_group_id"] for o in ran]
    ids = [o["extra"]["rollout_id"] for o in ran]
    assert groups[0] == groups[1] != groups[2]
    assert len(set(ids)) == 3
    assert [o["extra"]["rollout_task_id"] for o in ran] == ["mul", "mul", "cjk"]
