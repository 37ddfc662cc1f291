"""The SkyRL bridge against SkyRL's own code, in the trainer overlay with SkyRL 0.3.0
(`TRAINER_EXTRAS["skyrl"]`): SkyRL's `prepare_generator_input` builds the batch exactly
as its trainer does, the bridge maps it to our groups and answers with our rows, and
SkyRL's own `validate_generator_output`, `convert_prompts_responses_to_batch_tensors`
and GRPO advantage take the answer. Also: the generator is a SkyRL
`GeneratorInterface`, and `rollout_ppo_exp` gives a `BasePPOExp` whose `get_generator`
returns it.

SkyRL 0.3.0 declares Python >= 3.11 but does not import on it: `skyrl/tinker/types.py`
puts a `typing.TypedDict` in a pydantic model, which pydantic refuses before Python
3.12. The snippet makes `typing.TypedDict` the `typing_extensions` one (what 3.12's
typing provides) before importing SkyRL; nothing else of SkyRL is changed.

The first test builds our rows by hand (every case: an infra error, a rollout without
rows); the second runs the live path: Temporal dev server, a worker with local sandboxes,
the Gateway in front of vLLM CPU serving the tiny model, `generate` called on SkyRL's batch.
"""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.temporal_dev_server import TemporalDevServer
from devstack.vllm_server import VllmServer
from environments.trainer import TRAINER_EXTRAS, trainer_python, trainer_pythonpath
from environments.vllm_cpu import INSTALL_HINT, VllmVenvError
from examples.make_tasks import task as make_task
from tests.fixtures.rollout_stack import rollout_stack
from tests.fixtures.trainer import TrainerPython
from tests.unit.test_bridge_skyrl import sample_row

pytestmark = [pytest.mark.integration, pytest.mark.needs("trainer_env:skyrl")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def skyrl_env() -> Iterator[TrainerPython]:
    try:
        python = trainer_python(extras=TRAINER_EXTRAS["skyrl"])
    except VllmVenvError as exc:
        pytest.fail(f"SkyRL trainer overlay missing and not creatable: {exc}\n{INSTALL_HINT}")
    link_dir = trainer_pythonpath(REPO)
    try:
        yield TrainerPython(python, link_dir)
    finally:
        shutil.rmtree(link_dir)


SNIPPET = r"""
import typing, typing_extensions
typing.TypedDict = typing_extensions.TypedDict  # SkyRL 0.3.0 on Python 3.11 (module doc)
import json, math
import numpy as np
import torch
from transformers import AutoTokenizer
from skyrl.train.generators.base import GeneratorInterface, TrajectoryID
from skyrl.train.generators.utils import prepare_generator_input
from skyrl.train.utils.trainer_utils import validate_generator_output
from skyrl.train.dataset.preprocess import convert_prompts_responses_to_batch_tensors
from skyrl.backends.skyrl_train.utils.ppo_utils import compute_grpo_outcome_advantage
from skyrl.train.entrypoints.main_base import BasePPOExp
import bridges.skyrl as bridge
from bridges.rollouts import to_training_rollouts
from schemas.tasks import RolloutTask

data = json.loads(DATA)
tasks = [RolloutTask.model_validate(t) for t in data["tasks"]]
gen = bridge.RolloutGenerator(None, "/out", tasks=tasks, run_id="r")
cls = bridge.rollout_ppo_exp(lambda cfg, tokenizer: gen)
exp = cls.__new__(cls)  # get_generator only: a real BasePPOExp needs Ray and a model

# SkyRL's dataset rows: the prompt, the env class, env_extras (every other column), uid
prompts = [
    {"prompt": [{"role": "user", "content": t.prompt}], "env_class": None,
     "env_extras": {"task_id": t.task_id}, "uid": f"uid-{t.task_id}"}
    for t in tasks
]
ginput, uids = prepare_generator_input(prompts, 4, {"temperature": 1.0}, "rollout", "train", 3)
groups = bridge.plan_groups(ginput, gen.tasks)
converted = to_training_rollouts(data["rows"])
out = gen.output_for(ginput, groups, data["batch_id"], converted)
validate_generator_output(len(ginput["prompts"]), out)

tok = AutoTokenizer.from_pretrained(data["model"])
token_rewards = []
for reward, response in zip(out["rewards"], out["response_ids"]):
    per_token = [0.0] * len(response)  # as SkyRL's trainer spreads a per-sample reward
    per_token[-1] = float(reward)
    token_rewards.append(per_token)
seqs, attn, resp_mask, rewards_t, loss_t, logp_t, _ = convert_prompts_responses_to_batch_tensors(
    tok, out["prompt_token_ids"], out["response_ids"], token_rewards, out["loss_masks"],
    out["rollout_logprobs"],
)
adv, _ = compute_grpo_outcome_advantage(rewards_t, resp_mask, np.array(uids), epsilon=0.0)
ours = {}
for group in converted.groups:
    ours.update(group.advantages(eps=0.0))
rows = []
for i, (t, metrics) in enumerate(zip(out["trajectory_ids"], out["env_metrics"])):
    rows.append({
        "uid": uids[i], "instance": t.instance_id, "rep": t.repetition_id,
        "rollout_id": metrics["rollout_id"],
        "skyrl_adv": float(adv[i].sum() / max(resp_mask[i].sum(), 1)),
        "our_adv": ours.get(metrics["rollout_id"]), "loss_tokens": int(loss_t[i].sum()),
        "logprob_sum": float(logp_t[i].sum()),
    })
print(json.dumps({
    "interface": isinstance(gen, GeneratorInterface),
    "skyrl_types": bridge.SKYRL_IMPORTED and bridge.TrajectoryID is TrajectoryID,
    "ppo_exp": issubclass(cls, BasePPOExp) and exp.get_generator(None, tok, None) is gen,
    "shapes": [list(seqs.shape), list(resp_mask.shape), list(loss_t.shape), list(logp_t.shape)],
    "rows": rows,
}))
"""


def test_skyrl_takes_the_bridges_output_with_its_own_checks(
    skyrl_env: TrainerPython, tiny_model_dir: Path
) -> None:
    """Two SkyRL instances × 4 repetitions. Group `mul`: rewards 1, 0, an infra_error and
    a rollout with no row (its workflow failed): k = 2 in the baseline of n = 4. Group
    `cap`: 1, 0, 0, 0, all trained."""
    tasks = [make_task("mul", "6 times 7?", "42"), make_task("cap", "Capital?", "Paris")]
    bid = "r-t3-1"
    rows = [
        sample_row(bid, "mul", 0, 1.0),
        sample_row(bid, "mul", 1, 0.0),
        sample_row(bid, "mul", 2, 0.0, status="infra_error"),
        *(sample_row(bid, "cap", i, float(i == 0)) for i in range(4)),
    ]
    data = {"tasks": tasks, "rows": rows, "batch_id": bid, "model": str(tiny_model_dir)}
    got = skyrl_env.run_json(f"DATA = {json.dumps(json.dumps(data))}\n{SNIPPET}")
    assert got["interface"] and got["skyrl_types"] and got["ppo_exp"]
    # 8 samples; the longest prompt+response is 3+4 tokens, responses 4
    assert got["shapes"] == [[8, 7], [8, 4], [8, 4], [8, 4]]
    by_id = {(r["instance"], r["rep"]): r for r in got["rows"]}
    assert [r["uid"] for r in got["rows"]] == ["uid-mul"] * 4 + ["uid-cap"] * 4
    mul = [by_id[("uid-mul", i)] for i in range(4)]
    assert [r["rollout_id"] for r in mul] == [f"{bid}-mul-0", f"{bid}-mul-1", f"{bid}-mul-2", None]
    assert [r["loss_tokens"] for r in mul] == [3, 3, 0, 0]
    # the masked samples sit at the group mean: SkyRL gives them advantage 0, and the
    # trained ones ours scaled by sqrt((n-1)/k) (SkyRL's unbiased std over n samples)
    scale = (3 / 2) ** 0.5
    assert mul[2]["skyrl_adv"] == pytest.approx(0.0, abs=1e-6)
    assert mul[3]["skyrl_adv"] == pytest.approx(0.0, abs=1e-6)
    for r in mul[:2]:
        assert r["skyrl_adv"] == pytest.approx(r["our_adv"] * scale, rel=1e-5)
    # a fully trained group: SkyRL's unbiased std vs our population std, sqrt((n-1)/n)
    for i in range(4):
        r = by_id[("uid-cap", i)]
        assert r["skyrl_adv"] == pytest.approx(r["our_adv"] * (3 / 4) ** 0.5, rel=1e-5)
        assert r["logprob_sum"] == pytest.approx(-0.75)


LIVE = r"""
import typing, typing_extensions
typing.TypedDict = typing_extensions.TypedDict  # SkyRL 0.3.0 on Python 3.11 (module doc)
import asyncio, json
from skyrl.train.generators.utils import prepare_generator_input
from skyrl.train.utils.trainer_utils import validate_generator_output
import bridges.skyrl as bridge
from rollout_client import RolloutClient
from schemas.tasks import RolloutTask

data = json.loads(DATA)
tasks = [RolloutTask.model_validate(t) for t in data["tasks"]]
gen = bridge.RolloutGenerator(
    lambda: RolloutClient.connect(data["temporal"], task_queue=data["queue"]),
    data["out"], tasks=tasks, run_id="live",
)
prompts = [
    {"prompt": [{"role": "user", "content": t.prompt}], "env_class": None,
     "env_extras": {"task_id": t.task_id}, "uid": f"uid-{t.task_id}"}
    for t in tasks
]
ginput, uids = prepare_generator_input(prompts, 2, {"temperature": 1.0}, "rollout", "train", 1)
out = asyncio.run(gen.generate(ginput))
validate_generator_output(len(ginput["prompts"]), out)
print(json.dumps({
    "rollouts": [m["rollout_id"] for m in out["env_metrics"]],
    "status": [m["status"] for m in out["env_metrics"]],
    "turns": [m["num_turns"] for m in out["env_metrics"]],
    "trained": [sum(m) for m in out["loss_masks"]],
    "tool_tokens": [len(m) - sum(m) for m in out["loss_masks"]],
    "logprobs_on_mask": [
        all((lp < 0) == bool(m) for lp, m in zip(lps, mask) if m)
        for lps, mask in zip(out["rollout_logprobs"], out["loss_masks"])
    ],
    "rewards": out["rewards"], "stop": out["stop_reasons"],
    "metrics": out["rollout_metrics"],
}))
"""


def test_generate_runs_skyrls_batch_as_our_rollouts(
    skyrl_env: TrainerPython,
    temporal_server: TemporalDevServer,
    vllm_server: VllmServer,
    tiny_model_dir: Path,
) -> None:
    """The live path: SkyRL's own batch for one task × 2 repetitions, `generate` submits
    it through Temporal to a worker whose agent (two turns, local sandbox) calls the tiny
    model through the Gateway; SkyRL's `validate_generator_output` takes the result."""
    task = make_task("mul", "What is 6 times 7? Reply with the number only.", "42")
    task["sampling"] = {"temperature": 1.0, "max_tokens": 16}
    with rollout_stack(temporal_server, tiny_model_dir, "skyrl", engine=vllm_server) as stack:
        data = {
            "tasks": [task],
            "temporal": temporal_server.address,
            "queue": stack.queue,
            "out": str(stack.work / "samples"),
        }
        got = skyrl_env.run_json(f"DATA = {json.dumps(json.dumps(data))}\n{LIVE}", timeout=600)
    assert got["rollouts"] == ["live-t1-1-mul-0", "live-t1-1-mul-1"]
    assert set(got["status"]) <= {"ok", "truncated"}, got
    assert got["turns"] == [2, 2]  # the example agent calls the model twice
    assert all(n > 0 for n in got["trained"]) and all(n > 0 for n in got["tool_tokens"])
    assert all(got["logprobs_on_mask"])
    assert all(r in (0.0, 1.0) for r in got["rewards"])
    assert got["metrics"]["rollout/infra_error"] == 0
