"""Hostile agents on the datasets people bring: Harbor task directories and SWE-bench-style
instances whose honest answer scores 0, through the real path.

Each batch is `rollout run PATH --harness command` (the CLI, `workers/run_cmd.py`) against
a standing stack (`tests/fixtures/rollout_stack.py`: the Temporal dev server, the
Gateway in front of the scripted engine, one worker process with the docker and local
backends). The agent is a shell script, so the engine is never asked for anything. One
batch per backend per format holds all its traps (`tests/fixtures/hostile_datasets.py`
writes them), and the batches run side by side. Before the Harbor batches, `rollout run
--harness oracle` runs each task's solution and records, per backend, that its verifier
works (`--verifier-evidence`): the evidence that blames a verifier's missing reward on
the agent.

Controls: an honest agent solves each task shape (reward 1), and each trap proves it
would work: its agent fires it in its own environment first and exits `ARMED` only if it
forged the answer there (the rollout's `agent_exit_code`), or the row names another
control. A trap that cannot be planted on a backend says why, and its row asserts the
agent could not arm it there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devstack.scripted_engine import Script, ScriptedEngine
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from rollout_client.client import RolloutOutcome
from sandboxes.image.task_images import prebuild_tasks
from schemas.outcome import RolloutStatus
from schemas.tasks import HarnessSpec
from task_formats import LoadOptions, load_task_source
from tests.fixtures.hostile_datasets import (
    AGENT_CONFIG,
    ARMED,
    BASE,
    HARBOR_ROWS,
    IMAGE_ROWS,
    SWEBENCH_OPTIONS,
    SWEBENCH_ROWS,
    Row,
    SweBenchSource,
    write_harbor_dataset,
    write_swebench_source,
)
from tests.fixtures.rollout_stack import RolloutStack, rollout_stack
from tests.fixtures.sandboxes import require_bwrap
from tests.fixtures.swebench_repo import git

pytestmark = [pytest.mark.integration, pytest.mark.needs("vllm_venv", "base_image")]

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("docker", "local")
IMAGE_MAP = {"ubuntu:24.04": BASE}
#: The image-held repo runs on docker only: the local backend gives the agent a fresh
#: workdir, so what an image holds at its workdir is not there.
IMAGE_BACKENDS = ("docker",)


@dataclass
class Batches:
    outcomes: dict[tuple[str, str, str], RolloutOutcome]
    """(format, backend, row name) → outcome."""
    swebench: SweBenchSource


def _rollout_run(stack: RolloutStack, run: Path, path: Path, *options: str) -> subprocess.Popen:
    """`rollout run PATH` with the command agent (unless `options` name a harness), its
    samples under `run/samples`, its output in `run/cli.log`."""
    run.mkdir(parents=True)
    if not any(o.startswith("--harness=") for o in options):
        config = run / "agent.json"
        config.write_text(json.dumps(AGENT_CONFIG))
        options = ("--harness=command", f"--harness-config={config}", *options)
    argv = [
        sys.executable,
        "-m",
        "workers.cli",
        "run",
        str(path),
        f"--temporal={stack.temporal.address}",
        f"--task-queue={stack.queue}",
        f"--out={run / 'samples'}",
        *options,
    ]
    log = open(run / "cli.log", "w")  # noqa: SIM115 - owned by the child
    with log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "300"},
        )


def _manifest(out: Path) -> dict[str, RolloutOutcome]:
    """Task id → outcome, from the `_manifest.json` `rollout run` wrote (failed rollouts
    included)."""
    (path,) = out.glob("*/_manifest.json")
    manifest = json.loads(path.read_text())
    task_of = {
        rid: group.removeprefix(f"{manifest['batch_id']}-")
        for group, rids in manifest["groups"].items()
        for rid in rids
    }
    outcomes = [RolloutOutcome.model_validate(r) for r in manifest["rollouts"]]
    return {task_of[o.rollout_id]: o for o in outcomes}


@pytest.fixture(scope="module")
def stack(temporal_server: TemporalDevServer, sandbox_base_image: Any) -> Iterator[RolloutStack]:
    require_bwrap()
    model = ensure_tiny_model()
    engine = ScriptedEngine(model / "tokenizer.json", Script(), model="tiny")
    with rollout_stack(
        temporal_server,
        model,
        "hostile-datasets",
        engine_app=engine.app(),
        worker_args=["--backends=docker,local"],
    ) as running:
        yield running


@pytest.fixture(scope="module")
def batches(stack: RolloutStack) -> Batches:
    """Every format × backend as one `rollout run`, all side by side."""
    root = stack.work / "datasets"
    harbor = write_harbor_dataset(root)
    source = write_swebench_source(root)
    # The Harbor tasks' image once, before the runs that share it start side by side.
    for backend in BACKENDS:
        loaded = load_task_source(
            harbor,
            LoadOptions(harness=HarnessSpec(name="oracle"), backend=backend, image_map=IMAGE_MAP),
            "harbor",
        )
        assert loaded.refused == [] and prebuild_tasks(loaded.tasks).refused == []
    runs = root / "runs"
    procs: dict[tuple[str, str], subprocess.Popen] = {}
    swebench = [
        "--format=swebench",
        *(f"--format-option={k}={v}" for k, v in SWEBENCH_OPTIONS.items()),
    ]
    for backend in BACKENDS:
        url = f"--format-option=repo_url_template={source.repo}"
        procs["swebench", backend] = _rollout_run(
            stack, runs / f"swebench-{backend}", source.instances, f"--backend={backend}",
            *swebench, url,
        )  # fmt: skip
    # No sized disk for the image-held repo: it would be mounted over the image's /testbed.
    nodisk = '--format-option=sandbox={"resources": {"disk_mb": null}}'
    for backend in IMAGE_BACKENDS:
        procs["image", backend] = _rollout_run(
            stack, runs / f"image-{backend}", source.image_instances, f"--backend={backend}",
            *swebench, nodisk,
        )  # fmt: skip
    # Harbor: the oracle runs first and records that each task's verifier works; the
    # agents' run reads that evidence.
    harbor_options = {
        backend: [
            f"--backend={backend}",
            f"--image-map=ubuntu:24.04={BASE}",
            f"--verifier-evidence={runs / f'evidence-{backend}.json'}",
        ]
        for backend in BACKENDS
    }
    oracles = {
        backend: _rollout_run(
            stack, runs / f"oracle-{backend}", harbor, "--harness=oracle", *options
        )
        for backend, options in harbor_options.items()
    }
    for backend, oracle in oracles.items():
        log = (runs / f"oracle-{backend}" / "cli.log").read_text
        assert oracle.wait(timeout=600) == 0, log()
        assert f"{len(HARBOR_ROWS)} task(s) recorded" in log(), log()
        procs["harbor", backend] = _rollout_run(
            stack, runs / f"harbor-{backend}", harbor, *harbor_options[backend]
        )
    codes = {key: proc.wait(timeout=900) for key, proc in procs.items()}
    outcomes: dict[tuple[str, str, str], RolloutOutcome] = {}
    for fmt, backend in procs:
        # A rollout that failed (exit 1) is in the manifest too; its row says why.
        run = runs / f"{fmt}-{backend}"
        log = (run / "cli.log").read_text()
        assert list(run.glob("samples/*/_manifest.json")), f"{fmt}, {backend} ({codes}):\n{log}"
        for task_id, outcome in _manifest(run / "samples").items():
            outcomes[fmt, backend, task_id.removeprefix("hostile__")] = outcome
    return Batches(outcomes, source)


def _cases(fmt: str, rows: list[Row], backends: tuple[str, ...]) -> list[Any]:
    return [
        pytest.param(fmt, backend, row, id=f"{fmt}-{backend}-{row.name}")
        for row in rows
        for backend in backends
    ]


CASES = (
    _cases("harbor", HARBOR_ROWS, BACKENDS)
    + _cases("swebench", SWEBENCH_ROWS, BACKENDS)
    + _cases("image", IMAGE_ROWS, IMAGE_BACKENDS)
)


@pytest.mark.parametrize(("fmt", "backend", "row"), CASES)
def test_a_hostile_dataset_agent_earns_only_its_honest_outcome(
    fmt: str, backend: str, row: Row, batches: Batches
) -> None:
    outcome = batches.outcomes[fmt, backend, row.name]
    result = outcome.result
    assert result is not None, f"{row.why}: {outcome.workflow_status}: {outcome.error}"
    status, reward, armed = row.expected(backend)
    if armed:
        assert result.agent_exit_code == ARMED, f"{row.why}: the trap was not set: {result}"
    elif row.control != "-":
        # Not armed here: a trap that cannot be planted did not fire in the agent's own
        # environment either; a history trap found no later commit to apply.
        assert result.agent_exit_code == 0, f"{row.why}: {result}"
    assert (result.status, result.reward) == (status, reward), f"{row.why}: {result}"
    if status is not RolloutStatus.ok:
        assert result.attempts == 1, result  # breaking its sandbox earns no fresh attempt
    if row.says:
        assert row.says in (result.error or ""), f"{row.why}: {result}"
    if row.name == "history_fix":
        # The control: the source's history holds the fix (the honest row's change) after
        # the base commit (`git merge-base --is-ancestor` fails otherwise).
        source = batches.swebench
        git(source.repo, "merge-base", "--is-ancestor", source.base_commit, source.fix_commit)
        assert "return a - b" in git(source.repo, "show", f"{source.fix_commit}:calc.py")
