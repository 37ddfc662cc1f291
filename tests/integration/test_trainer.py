"""`rollout train` on the real parts: Temporal dev server, a worker process with local
bubblewrap sandboxes, the Gateway in front of vLLM CPU serving the tiny model in float32
(dev endpoints on, so new weights load in place), and the trainer process in its own
environment. Kept small for 2 cores: 2 tasks × 2 rollouts (+1 held-out) per step.
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devstack.temporal_dev_server import TemporalDevServer
from devstack.vllm_server import VllmServer
from examples.make_tasks import task as make_task
from gateway.engines.base import WeightLoadError
from gateway.engines.vllm_weights import VllmWeightLoader
from rollout_client.storage import read_samples
from schemas.policy import WeightUpdate
from schemas.training import FinalEval, StepMetrics
from tests.fixtures.rollout_stack import rollout_stack
from tests.fixtures.trainer import TrainerPython
from workers.local_stack import InProcessGateway

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv")]

REPO = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(
    r"^step (?P<step>\d+) policy=\S+-(?P<policy>v\d+) reward=(?P<reward>[-0-9.]+) "
    r"heldout=(?P<heldout>[-0-9.]+) agree_mean=(?P<agree_mean>[0-9.e+-]+) "
    r"agree_max=(?P<agree_max>[0-9.e+-]+) ratio=(?P<ratio>[0-9.]+) "
    r"staleness=(?P<staleness>\d+) rollouts/s=(?P<rps>[0-9.]+)$"
)


@dataclass
class TrainStack:
    temporal: TemporalDevServer
    engine: VllmServer
    gateway: InProcessGateway
    work: Path
    queue: str
    tasks: Path
    heldout: Path
    model: Path


def write_tasks(path: Path, specs: list[tuple[str, str, str]]) -> Path:
    lines = [
        json.dumps(make_task(tid, prompt, expect, sampling={"temperature": 1.0, "max_tokens": 24}))
        for tid, prompt, expect in specs
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def stack(
    temporal_server: TemporalDevServer,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TrainStack]:
    # the tests' trainers write their policies under their own tmp_path
    roots = [tmp_path_factory.getbasetemp()]
    with rollout_stack(temporal_server, tiny_model_dir, "trainer", checkpoint_roots=roots) as s:
        yield TrainStack(
            temporal=s.temporal,
            engine=s.engine,
            gateway=s.gateway,
            work=s.work,
            queue=s.queue,
            tasks=write_tasks(
                s.work / "tasks.jsonl",
                [
                    ("mul", "What is 6 times 7? Reply with the number only.", "42"),
                    ("cjk", "把数字三写成阿拉伯数字。只回答数字。", "3"),
                ],
            ),
            heldout=write_tasks(
                s.work / "heldout.jsonl", [("fr", "The capital of France? One word.", "Paris")]
            ),
            model=tiny_model_dir,
        )


def train_argv(stack: TrainStack, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "workers.cli",
        "train",
        str(stack.tasks),
        f"--init-policy={stack.model}",
        f"--out={out}",
        f"--temporal={stack.temporal.address}",
        f"--task-queue={stack.queue}",
        f"--gateway={stack.gateway.control_url}",
        f"--admin-token={stack.gateway.admin_token}",
        f"--heldout={stack.heldout}",
        f"--steps={steps}",
        "--group-size=2",
        "--lr=1e-3",
        *extra,
    ]


def run_train(stack: TrainStack, out: Path, steps: int, *extra: str) -> str:
    proc = subprocess.run(
        train_argv(stack, out, steps, *extra),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def step_lines(output: str) -> list[re.Match[str]]:
    return [m for ln in output.splitlines() if (m := STEP_LINE.match(ln))]


def run_id(out: Path) -> str:
    return json.loads((out / "state.json").read_text())["run_id"]


SERVE_CHECK = """
import json, httpx, torch
from pathlib import Path
from trainer.policy import load_policy
from trainer.loss import response_logprobs
model = load_policy(Path({policy!r})).eval()
prompt = list(range(200, 240))
reply = httpx.post({url!r} + "/v1/completions", timeout=120, json={{
    "model": {model!r}, "prompt": prompt, "max_tokens": 32, "temperature": 1.0,
    "logprobs": 1, "return_token_ids": True, "seed": 7}}).json()
choice = reply["choices"][0]
with torch.no_grad():
    mine = response_logprobs(model, prompt, choice["token_ids"])
diff = (mine - torch.tensor(choice["logprobs"]["token_logprobs"])).abs()
print(json.dumps({{"mean": float(diff.mean()), "max": float(diff.max())}}))
"""


def test_one_step_writes_a_policy_the_engine_serves(
    stack: TrainStack, trainer_env: TrainerPython, tmp_path: Path
) -> None:
    """One step: rollouts through Temporal, a real optimiser step, the step line with
    every field, agreement below 0.01 on float32, `policies/<run>-v1` with weights,
    tokenizer and chat template that transformers loads, vLLM now serving exactly v1,
    and v1's own held-out reward measured at the end."""
    out = tmp_path / "run"
    output = run_train(stack, out, steps=1)
    lines = step_lines(output)
    assert [(m["step"], m["policy"]) for m in lines] == [("1", "v1")], output
    assert output.rstrip().splitlines()[-1] == f"trained: {out}"
    metrics = [StepMetrics.model_validate_json(ln) for ln in (out / "metrics.jsonl").open()]
    assert [m.step for m in metrics] == [1]
    m = metrics[0]
    assert m.rollouts == 4 and m.rollouts_ok == 4
    assert m.rows_trained > 0 and m.tokens_trained > 0
    assert m.agree_mean < 0.01
    assert abs(m.ratio_mean - 1.0) < 0.01
    assert m.staleness_max == 0 and m.heldout_reward is not None
    assert m.grad_norm > 0
    assert (out / "reward_curve.png").stat().st_size > 0
    # heldout-0002: the final policy's held-out rollouts (the policy "sampling step 2")
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        "heldout-0001",
        "heldout-0002",
        "step-0001",
    ]
    assert len(list((out / "samples" / "step-0001").glob("*.parquet"))) == 4
    run = run_id(out)
    assert m.policy == f"{run}-v1" and m.sampled_by == f"{run}-v0"
    assert sorted(p.name for p in (out / "policies").iterdir()) == [f"{run}-v0", f"{run}-v1"]
    policy = out / "policies" / f"{run}-v1"
    final = FinalEval.model_validate_json((out / "final_heldout.json").read_text())
    assert (final.policy, final.heldout_rollouts) == (f"{run}-v1", 1)
    assert f"final policy={run}-v1 heldout={final.heldout_reward:.3f}" in output.splitlines()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (policy / name).is_file(), name
    assert "chat_template" in json.loads((policy / "tokenizer_config.json").read_text())
    assert httpx.get(f"{stack.engine.url}/weight_info").json() == {"weight_version": f"{run}-v1"}
    served = trainer_env.run_json(
        SERVE_CHECK.format(policy=str(policy), url=stack.engine.url, model=stack.engine.model)
    )
    assert served["mean"] < 1e-3 and served["max"] < 1e-2, served


def test_rerun_after_a_kill_resumes_from_the_last_complete_policy(
    stack: TrainStack, tmp_path: Path
) -> None:
    """SIGKILL the trainer right after step 1 completed (step 2 is starting, its
    rollouts already running under v0: overlap is the default); a rerun says it resumed
    at v1 (already served: the Gateway's policy is v1), runs only step 2, and the
    metrics hold steps 1 and 2 once."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        train_argv(stack, out, steps=2),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    seen: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 900
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("step 1 "):
            break
        assert time.monotonic() < deadline, "".join(seen[-50:])
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its launcher, no cleanup runs
    proc.wait(timeout=30)
    assert any(STEP_LINE.match(ln.rstrip("\n")) for ln in seen), "".join(seen[-50:])

    output = run_train(stack, out, steps=2)
    run = run_id(out)
    assert f"resumed: {out} at policy {run}-v1" in output
    assert [(m["step"], m["policy"]) for m in step_lines(output)] == [("2", "v2")], output
    metrics = [StepMetrics.model_validate_json(ln) for ln in (out / "metrics.jsonl").open()]
    assert [m.step for m in metrics] == [1, 2]
    assert metrics[1].sampled_by == f"{run}-v1" and metrics[1].agree_mean < 0.01
    assert httpx.get(f"{stack.engine.url}/weight_info").json() == {"weight_version": f"{run}-v2"}


def test_one_step_off_policy_overlaps_rollouts_with_training(
    stack: TrainStack, tmp_path: Path
) -> None:
    """Overlap (the default): step 2's rollouts are submitted under v0 before step 1
    trains and run while it trains and the Gateway loads v1 (their calls wait during
    the update): step 2 is trained (by v1 weights) on calls sampled by v0 or v1, each
    recorded with its version, kept by max_staleness 1, and the overlap is reported.
    Step 1 is on-policy and agrees exactly; step 2's tokens each agree with the version
    their call recorded. (Before per-call versions, staleness came from the label: 1
    even when every call had been sampled by v1.)"""
    out = tmp_path / "run"
    output = run_train(stack, out, 2, "--heldout-every=0")
    assert [(m["step"], m["policy"]) for m in step_lines(output)] == [("1", "v1"), ("2", "v2")]
    first, second = (StepMetrics.model_validate_json(ln) for ln in (out / "metrics.jsonl").open())
    # --heldout-every=0: held-out with step 1 and for the final policy (v2), not step 2
    assert first.heldout_reward is not None and second.heldout_reward is None
    held_dirs = sorted(p.name for p in (out / "samples").glob("heldout-*"))
    assert held_dirs == ["heldout-0001", "heldout-0003"]
    # every held-out pass draws the same seeds, so v0 and v2 are compared on the same draws
    start_seeds, final_seeds = (
        sorted(read_samples(out / "samples" / d).column("seed").to_pylist()) for d in held_dirs
    )
    assert start_seeds == final_seeds and start_seeds
    run = run_id(out)
    assert (first.sampled_by, first.staleness_max) == (f"{run}-v0", 0)
    assert first.agree_mean < 0.01
    assert first.overlap_s > 0
    # Labelled v0, but each call records the version that sampled it: whether any call
    # ran before v1 was loaded depends on the machine; the metric must match the samples.
    versions = read_samples(out / "samples" / "step-0002").column("call_policy_versions")
    called = {v for calls in versions.to_pylist() for v in calls}
    assert called <= {f"{run}-v0", f"{run}-v1"}
    lag = 1 if f"{run}-v0" in called else 0
    assert (second.sampled_by, second.staleness_max, second.rows_stale) == (f"{run}-v0", lag, 0)
    assert second.rows_trained > 0
    assert second.agree_mean < 0.01 and second.agree_max < 0.01
    assert second.overlap_s == 0.0  # the last step has no next rollouts
    assert 0 < first.overlap_fraction <= 1
    history = httpx.get(
        f"{stack.gateway.control_url}/policy", headers=stack.gateway.admin_headers
    ).json()["history"]
    assert [h["policy_version"] for h in history if h["status"] == "ok"][-2:] == [
        f"{run}-v1",
        f"{run}-v2",
    ]


PERTURBED = """
import json, torch
from pathlib import Path
from trainer.policy import load_policy, save_policy
torch.manual_seed(0)
model = load_policy(Path({model!r}))
with torch.no_grad():
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.02)
save_policy(model, Path({model!r}), Path({out!r}), {{"policy_version": "p1"}})
print(json.dumps({{"ok": True}}))
"""


def test_a_changed_policy_loads_in_place_and_is_served_exactly(
    stack: TrainStack, trainer_env: TrainerPython, tmp_path: Path
) -> None:
    """Every weight moved (noise 0.02, tied embedding included): after an in-place
    reload the engine's log-probs equal the trainer's for the new policy. Before the
    checkpoint stored the tied head explicitly, vLLM kept sampling through the old
    head (mean |Δ| ≈ 0.2)."""
    policy = tmp_path / "p1"
    trainer_env.run_json(PERTURBED.format(model=str(stack.model), out=str(policy)))
    report = asyncio.run(
        VllmWeightLoader(stack.engine.url).load(
            WeightUpdate(policy_version="p1", checkpoint=str(policy))
        )
    )
    assert report.method == "reload" and report.policy_version == "p1"
    assert httpx.get(f"{stack.engine.url}/weight_info").json() == {"weight_version": "p1"}
    served = trainer_env.run_json(
        SERVE_CHECK.format(policy=str(policy), url=stack.engine.url, model=stack.engine.model)
    )
    assert served["mean"] < 1e-3 and served["max"] < 1e-2, served


def test_an_unusable_checkpoint_is_refused_and_the_old_policy_keeps_serving(
    stack: TrainStack, tmp_path: Path
) -> None:
    """A directory without weights is refused before the engine pauses; the engine still
    reports and serves its previous version."""
    before = httpx.get(f"{stack.engine.url}/weight_info").json()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    loader = VllmWeightLoader(stack.engine.url)
    with pytest.raises(WeightLoadError, match=r"no \*\.safetensors weights"):
        asyncio.run(loader.load(WeightUpdate(policy_version="bad", checkpoint=str(empty))))
    assert httpx.get(f"{stack.engine.url}/weight_info").json() == before
    assert httpx.get(f"{stack.engine.url}/is_paused").json() == {"is_paused": False}
    reply = httpx.post(
        f"{stack.engine.url}/v1/completions",
        json={"model": stack.engine.model, "prompt": [5, 6, 7], "max_tokens": 2},
        timeout=120,
    )
    assert reply.status_code == 200


def test_trl_grpo_trainer_closes_the_loop(stack: TrainStack, tmp_path: Path) -> None:
    """`--trainer trl`: TRL's own GRPOTrainer takes the update. Two steps: step 1's
    rollouts run through the real stack under v0, TRL's optimizer step makes v1, the
    bridge's callback publishes it through the Gateway's POST /policy, and step 2's
    rollouts are labelled v1 and every one of their calls was sampled by v1 (TRL asks
    for a batch only after the step: no overlap). The metrics carry the held-out reward,
    the policy and the agreement of TRL's recomputed log-probs with the engine's."""
    out = tmp_path / "trl"
    output = run_train(stack, out, 2, "--trainer=trl", "--heldout-every=0")
    assert [(m["step"], m["policy"]) for m in step_lines(output)] == [("1", "v1"), ("2", "v2")]
    assert output.rstrip().splitlines()[-1] == f"trained: {out}"
    run = run_id(out)
    first, second = (StepMetrics.model_validate_json(ln) for ln in (out / "metrics.jsonl").open())
    assert (first.sampled_by, first.policy) == (f"{run}-v0", f"{run}-v1")
    assert (second.sampled_by, second.policy) == (f"{run}-v1", f"{run}-v2")
    for m in (first, second):
        assert m.rollouts == 4 and m.rows_trained > 0 and m.tokens_trained > 0
        assert m.grad_norm > 0 and m.staleness_max == 0
        assert m.agree_mean < 0.01, m
    assert first.heldout_reward is not None and second.heldout_reward is None
    for step, version in ((1, "v0"), (2, "v1")):
        table = read_samples(out / "samples" / f"step-{step:04d}")
        assert set(table.column("policy_version").to_pylist()) == {f"{run}-{version}"}
        calls = {v for vs in table.column("call_policy_versions").to_pylist() for v in vs}
        assert calls == {f"{run}-{version}"}, (step, calls)
    history = httpx.get(
        f"{stack.gateway.control_url}/policy", headers=stack.gateway.admin_headers
    ).json()["history"]
    assert [h["policy_version"] for h in history if h["status"] == "ok"][-3:] == [
        f"{run}-v0",
        f"{run}-v1",
        f"{run}-v2",
    ]
    assert httpx.get(f"{stack.engine.url}/weight_info").json() == {"weight_version": f"{run}-v2"}
    assert sorted(p.name for p in (out / "policies").iterdir()) == [
        f"{run}-v0",
        f"{run}-v1",
        f"{run}-v2",
    ]
    final = FinalEval.model_validate_json((out / "final_heldout.json").read_text())
    assert final.policy == f"{run}-v2" and final.heldout_rollouts == 1
    assert (out / "reward_curve.png").stat().st_size > 0
