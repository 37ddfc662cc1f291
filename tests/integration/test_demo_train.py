"""`rollout demo --train` as CI runs it: one command, no TTY, everything real and local
(Temporal dev server, Gateway, vLLM CPU in float32 with in-place weight loading, local
sandboxes with the task agent, the trainer process in its own environment). Kept tiny
for 2 cores: the random tiny model (the warm one takes minutes to build), 2 steps of
2 tasks × 2 rollouts, 2 held-out tasks. It checks that what the run prints and what it
writes agree, not that this model learns.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_client.storage import read_table
from schemas.training import FinalEval, StepMetrics
from tests.fixtures.process_tree import ProcessTree
from tests.integration.test_trainer import STEP_LINE

pytestmark = [pytest.mark.integration, pytest.mark.needs("trainer_env:reference", "base_image")]

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE_ROW = re.compile(r"^│\s*(?P<step>\d+|final)\s*│\s*(?P<policy>v\d+)\s*│")


def test_a_process_left_running_is_seen_whatever_its_command_line() -> None:
    """Control of the leftover check below: a process whose parent dies and whose command
    line names nothing of the run (like vLLM's `--model <cache dir>`) is still found."""
    script = (
        "import subprocess, time\n"
        "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    with ProcessTree(parent.pid) as tree:
        assert parent.stdout is not None and parent.stdout.readline() == "ready\n"
        tree.poll()
        parent.kill()
        parent.wait()
    left = tree.left_running(grace_s=0)
    try:
        assert [s.cmdline for s in left] == ["sleep 600"]
    finally:
        for s in left:
            os.kill(s.pid, signal.SIGKILL)


def test_demo_train_runs_a_short_loop_and_reports_it(tmp_path: Path) -> None:
    data, out = tmp_path / "demo", tmp_path / "demo" / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.demo",
            "--train",
            "--model=random",
            "--steps=2",
            "--tasks-per-step=2",
            "--group-size=2",
            "--heldout-tasks=2",
            "--heldout-samples=1",
            f"--data-dir={data}",
            f"--out={out}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    with ProcessTree(proc.pid) as tree:  # vLLM, trainer, gateway, sandboxes: by pid
        try:
            output, errors = proc.communicate(timeout=1500)
        finally:
            proc.kill()
    left = tree.left_running()
    assert proc.returncode == 0, output[-5000:] + errors[-5000:]
    lines = output.splitlines()

    metrics = [StepMetrics.model_validate_json(ln) for ln in (out / "metrics.jsonl").open()]
    assert [m.step for m in metrics] == [1, 2]
    assert all(m.agree_mean < 0.01 for m in metrics), [m.agree_mean for m in metrics]
    assert [(m.rollouts, m.rollouts_ok) for m in metrics] == [(4, 4), (4, 4)]
    printed = [m for ln in lines if (m := STEP_LINE.match(ln))]
    assert [(p["step"], p["policy"]) for p in printed] == [("1", "v1"), ("2", "v2")], output
    assert f"trained: {out}" in lines

    assert (out / "reward_curve.png").read_bytes()[:8] == PNG_MAGIC
    run = metrics[0].policy.rsplit("-", 1)[0]
    assert sorted(p.name for p in (out / "policies").iterdir()) == [
        f"{run}-v0",
        f"{run}-v1",
        f"{run}-v2",
    ]
    final = FinalEval.model_validate_json((out / "final_heldout.json").read_text())
    assert (final.policy, final.heldout_rollouts) == (f"{run}-v2", 2)
    assert read_table(str(out / "samples" / "step-0001")).num_rows == 4
    # the demo's held-out runs at step 1, every 3 steps and for the final policy (= "step 3")
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        "heldout-0001",
        "heldout-0003",
        "step-0001",
        "step-0002",
    ]
    assert metrics[0].heldout_reward is not None and metrics[1].heldout_reward is None
    assert "held-out 2 tasks × 1 at step 1, every 3 steps and the end" in output

    rows = [(m["step"], m["policy"]) for ln in lines if (m := TABLE_ROW.match(ln))]
    # one step off-policy (overlap, the default): step 2 ran while v1 trained, so v0 sampled it
    assert rows == [("1", "v0"), ("2", "v0"), ("final", "v2")], output
    start, end = metrics[0].heldout_reward, final.heldout_reward
    assert start is not None and end is not None
    answer = "YES" if round(end - start, 6) >= 0.15 else "NO"
    assert (
        f"held-out reward: start {start:.3f} -> final {end:.3f} ({end - start:+.3f}); "
        f"rose by >= 0.15: {answer}"
    ) in lines
    assert f"curve: {out / 'reward_curve.png'}" in lines
    assert "stopped: trainer, worker, gateway, engine, Temporal dev server." in lines
    assert any("vllm" in s.cmdline for s in tree.seen.values()), "vLLM was never seen"
    assert left == [], f"outlived the demo: {left}"
