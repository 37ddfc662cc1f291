"""`rollout show` after a real batch: `rollout run` (the CLI) on the Temporal dev server,
a worker process with local bubblewrap sandboxes, the Gateway in front of the scripted
engine, and examples/agent.py in each sandbox. One task passes; the other's check runs a
program the sandbox lacks, an `eval_error`. The run's summary gives that rollout's
reason and prints the show command; `rollout show` then explains both rollouts from the
samples and the worker's disk, and the failing one from Temporal alone.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from examples.make_tasks import task as make_task
from tests.fixtures.gateway import start_gateway
from tests.fixtures.worker_process import WorkerProcess, one_host_args

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]

REPO = Path(__file__).resolve().parents[2]
QUEUE = "show-tests"
#: A program no sandbox has: the check's shell says it is not found (exit 127).
MISSING = "definitely-not-installed-xyz"


@dataclass
class Run:
    temporal: str
    work: Path
    output: str
    """What `rollout run` printed."""
    batch_id: str
    show_line: str


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.fixture(scope="module")
def run(temporal_server: TemporalDevServer) -> Iterator[Run]:
    work = Path(tempfile.mkdtemp(prefix="rollout-show-", dir="/tmp"))
    work.chmod(0o755)  # the sandbox uid must traverse the local backend's state dir
    model = ensure_tiny_model()
    engine = ScriptedEngine(
        model / "tokenizer.json",
        Script(
            rules=[ScriptRule(when_contains="6 times 7", reply="42", repeat=True)],
            default_reply="I am not sure.",
        ),
    )
    engine_server = BackgroundServer(engine.app()).start()
    gateway = start_gateway(engine_server.url, model, work / "gateway", "tiny")
    worker = WorkerProcess(
        one_host_args(
            temporal_server.address, QUEUE, "show-host", gateway.control_url,
            gateway.admin_token, work,
        ),
        work / "worker.log",
        dict(os.environ),
    )  # fmt: skip
    worker.start()
    try:
        ok = make_task("arith-mul", "What is 6 times 7? Reply with the number only.", "42")
        broken = make_task("py-missing", "What is 6 times 7? Reply with the number only.", "42")
        broken["evaluation"] = {"checks": [{"kind": "command", "command": f"{MISSING} -V"}]}
        tasks = work / "tasks.jsonl"
        tasks.write_text("".join(json.dumps(t) + "\n" for t in (ok, broken)))
        done = _cli(
            "run",
            str(tasks),
            f"--temporal={temporal_server.address}",
            f"--task-queue={QUEUE}",
            f"--out={work / 'samples'}",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        show = [ln for ln in done.stdout.splitlines() if ln.startswith("show: ")]
        assert len(show) == 1, done.stdout
        [batch_id] = [p.name for p in (work / "samples").iterdir()]
        yield Run(temporal_server.address, work, done.stdout, batch_id, show[0])
    finally:
        worker.stop()
        gateway.server.stop()
        engine_server.stop()
        shutil.rmtree(work, ignore_errors=True)


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
