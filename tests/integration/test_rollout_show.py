"""`rollout show` after a real batch: `rollout run` (the CLI) on the Temporal dev server,
a worker process with local bubblewrap sandboxes, the Gateway in front of the scripted
engine, and examples/agent.py in each sandbox. One task passes; the other's check runs a
program the sandbox lacks, an `eval_error`. The run's summary gives that rollout's
reason and prints the show command; `rollout show` then explains both rollouts from the
samples and the worker's disk, and the failing one from Temporal alone.
"""

import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures.real_batch import MISSING, RealBatch
from tests.fixtures.real_batch import rollout_cli as _cli

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    temporal: str
    work: Path
    output: str
    """What `rollout run` printed."""
    batch_id: str
    show_line: str


@pytest.fixture(scope="module")
def run(failing_batch: RealBatch) -> Run:
    """The shared batch (tests/fixtures/real_batch.py): arith-mul passes, py-missing's
    check cannot run."""
    b = failing_batch
    show = [ln for ln in b.output.splitlines() if ln.startswith("show: ")]
    assert len(show) == 1, b.output
    return Run(b.temporal, b.work, b.output, b.batch_id, show[0])


def test_run_prints_the_failing_rollouts_reason_and_the_show_command(run: Run) -> None:
    samples = run.work / "samples" / run.batch_id
    assert run.show_line == f"show: rollout show {run.batch_id} --samples {samples}"
    not_ok = run.output.split("not ok", 1)[1]
    assert f"{run.batch_id}-py-missing-0" in not_ok and "eval_error" in not_ok
    assert f"{run.batch_id}-arith-mul-0" not in not_ok
    assert "eval_err…" not in run.output


def test_show_explains_the_batch_from_its_printed_command(run: Run) -> None:
    argv = shlex.split(run.show_line.removeprefix("show: "))[1:]
    done = _cli(*argv)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"batch {run.batch_id} · 2 rollout(s)" in out
    assert "eval_error" in out and "the evaluator's failure" in out
    assert "arith-mul" in out and "1.000" in out  # reward by task
    errors = out.split("errors, by first line", 1)[1]
    assert f"{run.batch_id}-py-missing-0" in errors


def test_show_explains_the_eval_error_rollout(run: Run) -> None:
    rid = f"{run.batch_id}-py-missing-0"
    samples = run.work / "samples"
    done = _cli("show", rid, f"--samples={samples}", f"--artifacts={run.work / 'worker'}")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "eval_error" in out and "the evaluator's failure" in out
    reason = out.split("reason", 1)[1].split("reward", 1)[0]
    assert "not found" in reason  # the reason shown
    evaluation = out.split("evaluation", 1)[1].split("calls", 1)[0]
    assert "127" in evaluation and f"{MISSING}: not found" in evaluation  # the check's detail
    assert "evaluation.json (evaluation) present" in out  # found on the worker's disk


def test_show_explains_the_passing_rollout(run: Run) -> None:
    rid = f"{run.batch_id}-arith-mul-0"
    done = _cli("show", rid, f"--samples={run.work / 'samples'}")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "status   ok" in out and "reward   1.000" in out and "verdict  pass" in out
    assert "tiny-random-v0" in out  # the calls' policy version
    table = out.split("calls", 1)[1].split("segment(s)", 1)[0]
    calls = [ln for ln in table.splitlines() if "tiny-random-v0" in ln]
    assert len(calls) == 2 and all(ln.rstrip(" │").endswith("42") for ln in calls)  # replies
    assert "agent " in out.split("steps", 1)[1].split("\n", 1)[0]  # the agent's step timed
    assert "not looked" in out  # no worker dir given: artifacts listed, not looked for


def test_show_from_temporal_alone(run: Run) -> None:
    rid = f"{run.batch_id}-py-missing-0"
    done = _cli("show", rid, f"--temporal={run.temporal}")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "eval_error" in out and f"{MISSING}: not found" in out
    assert "provision" in out.split("steps", 1)[1].split("\n", 1)[0]
    batch = _cli("show", run.batch_id, f"--temporal={run.temporal}")
    assert batch.returncode == 0, batch.stdout + batch.stderr
    assert "eval_error" in batch.stdout and rid in batch.stdout
