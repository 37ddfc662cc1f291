"""Harbor task directories and SWE-bench-style instances through the whole stack.

Real parts: the Temporal dev server, one worker *process* (`python -m workers.worker`,
docker and local backends), the Gateway in front of the scripted engine (an LLM that
follows a script: the one stand-in, since no model here can be relied on to solve a
task), real sandboxes (docker containers; bubblewrap on the task image's exported
rootfs), real agents: a small tool-calling agent run by the `command` harness
(`tests/fixtures/bash_tool_agent.py`), mini-swe-agent, and the `oracle` harness.

The test tasks (`tests/data/harbor/`) share one Dockerfile `FROM ubuntu:24.04`, mapped
to our base image, so one image serves them all. The allowlist task fetches from an
HTTP server this module runs on loopback, reached through the sandbox's egress relay
(the worker pins `allowed.test` to 127.0.0.1 with `--egress-host`).

Expensive things are shared by the module: one worker, one gateway + engine, one image
build, one rootfs export. Each test sets the engine's script for its agent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from rollout_client.client import RolloutClient, RolloutOutcome
from sandboxes.image.task_images import builds_dir, ensure_task_image, prebuild_tasks
from schemas.samples import SampleRow, table_to_rows
from schemas.tasks import HarnessSpec, RolloutTask
from task_formats import LoadOptions, load_task_source
from tests.fixtures.rollout_stack import rollout_stack
from tests.fixtures.sandboxes import require_bwrap
from tests.fixtures.swebench_repo import FIX, FORMAT_OPTIONS, write_calc_instances
from tests.fixtures.worker_process import WorkerProcess
from workers.local_stack import InProcessGateway

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("system", "vllm_venv"),
]

REPO = Path(__file__).resolve().parents[2]
HARBOR = REPO / "tests" / "data" / "harbor"
HARBOR_BROKEN = REPO / "tests" / "data" / "harbor_broken"
BASE = "agentic-rollout/sandbox-base:latest"
IMAGE_MAP = {"ubuntu:24.04": BASE}
MODEL = "tiny"
QUEUE = "harbor-stack"
AGENT_SOURCE = (REPO / "tests" / "fixtures" / "bash_tool_agent.py").read_text()
#: The `command` harness running the tool-calling agent (its source as a here-document).
COMMAND_AGENT = HarnessSpec(
    name="command",
    config={"command": f"python3 - <<'AGENT_SOURCE'\n{AGENT_SOURCE}\nAGENT_SOURCE\n"},
    budget_s=120,
)
MINI = HarnessSpec(
    name="mini_swe_agent",
    config={"model": MODEL, "context_window": 32768, "max_output_tokens": 512},
    budget_s=180,
)
ORACLE = HarnessSpec(name="oracle")
FETCH = (
    "python3 -c 'import os, urllib.request; print(urllib.request.urlopen("
    'os.environ["ALLOWLIST_URL"], timeout=20).read().decode())\' > /app/fetched.txt'
)
#: What doing each task takes, keyed by a phrase of its instruction.
SOLVES = {
    "/app/hello.txt": "printf 'Hello, world!\\n' > /app/hello.txt",
    "/app/numbers.txt": "seq 1 5 > /app/numbers.txt",
    "seen.txt": "{ ls -A /solution; ls -A /tests; } > /app/seen.txt 2>&1",
    "ALLOWLIST_URL": FETCH,
}
#: Rewards when each task is done as its instruction says (`failing` always scores 0).
EXPECTED = {"hello": 1.0, "multi-metric": 1.0, "failing": 0.0, "no-peek": 1.0, "allowlist": 1.0}
MULTI_METRICS = {"line_count": 5.0, "sum": 15.0}
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def call(name: str, **arguments: Any) -> str:
    """A tool call in the served model's output format (parsed by the Gateway)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def command_agent_script() -> Script:
    """Once a tool result is in the prompt: done; before, the task's command."""
    rules = [ScriptRule(when_contains="exit status:", reply="Done.", repeat=True)]
    rules += [
        ScriptRule(when_contains=phrase, reply=call("bash", command=cmd), repeat=True)
        for phrase, cmd in SOLVES.items()
    ]
    return Script(rules=rules, default_reply="Done.")


def mini_swe_agent_script() -> Script:
    """mini-swe-agent ends by running its submit command; its results say `returncode`."""
    rules = [
        ScriptRule(when_contains="returncode", reply=call("bash", command=SUBMIT), repeat=True)
    ]
    rules += [
        ScriptRule(when_contains=phrase, reply=call("bash", command=cmd), repeat=True)
        for phrase, cmd in SOLVES.items()
    ]
    return Script(rules=rules, default_reply=call("bash", command=SUBMIT))


class _Allowed(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"allowlist-ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Stack:
    temporal: TemporalDevServer
    engine: ScriptedEngine
    gateway: InProcessGateway
    worker: WorkerProcess
    work: Path
    harbor: Path
    client: RolloutClient | None = None

    async def connect(self) -> RolloutClient:
        if self.client is None:
            self.client = await RolloutClient.connect(self.temporal.address, task_queue=QUEUE)
        return self.client


@pytest.fixture(scope="module")
def stack(temporal_server: TemporalDevServer, sandbox_base_image: Any) -> Iterator[Stack]:
    require_bwrap()
    model = ensure_tiny_model()
    engine = ScriptedEngine(model / "tokenizer.json", Script(), model=MODEL)
    allowed = ThreadingHTTPServer(("127.0.0.1", 0), _Allowed)
    threading.Thread(target=allowed.serve_forever, daemon=True).start()
    port = allowed.server_address[1]
    try:
        with rollout_stack(
            temporal_server,
            model,
            "harbor",
            engine_app=engine.app(),
            served_model=MODEL,
            queue=QUEUE,
            worker_args=["--backends=docker,local", "--egress-host=allowed.test=127.0.0.1"],
        ) as running:
            # The test tasks, with the allowlist task naming the port this server listens on.
            harbor = running.work / "harbor"
            shutil.copytree(HARBOR, harbor)
            toml = harbor / "allowlist" / "task.toml"
            text = toml.read_text().replace('["allowed.test"]', f'["allowed.test:{port}"]')
            text = text.replace("http://allowed.test:8080/", f"http://allowed.test:{port}/")
            assert f"allowed.test:{port}/" in text and f'"allowed.test:{port}"' in text
            toml.write_text(text)
            yield Stack(
                temporal_server, engine, running.gateway, running.worker, running.work, harbor
            )
    finally:
        allowed.shutdown()


def load(path: Path, harness: HarnessSpec, backend: str, names: set[str] | None = None) -> list:
    loaded = load_task_source(
        path, LoadOptions(harness=harness, backend=backend, image_map=IMAGE_MAP), "harbor"
    )
    assert loaded.refused == []
    return [t for t in loaded.tasks if names is None or t.task_id in names]


async def run_batch(stack: Stack, tasks: list[RolloutTask], name: str) -> dict[str, RolloutOutcome]:
    client = await stack.connect()
    batch = await client.submit(tasks, str(stack.work / "samples" / name), 1, seed=3)
    outcomes = [o async for o in client.results(batch)]
    failed = [o for o in outcomes if not o.ok]
    assert not failed, f"{failed}\n{stack.worker.log_tail()}"
    by_task = {}
    for o in outcomes:
        assert o.result is not None
        by_task[o.result.task_id] = o
    assert sorted(by_task) == sorted(t.task_id for t in tasks)
    return by_task


def check_lineage_and_samples(
    stack: Stack, tasks: list[RolloutTask], outcomes: dict[str, RolloutOutcome]
) -> dict[str, list[SampleRow]]:
    """Every rollout: token-exact samples equal to the Gateway's record, and the task's
    lineage (source dir, content hash, built image, verifier version) on each row."""
    client = stack.client
    assert client is not None
    rows = table_to_rows(client.load_samples(list(outcomes.values())))
    by_task: dict[str, list[SampleRow]] = {}
    for row in rows:
        by_task.setdefault(row.task_id, []).append(row)
    for task in tasks:
        result = outcomes[task.task_id].result
        assert result is not None and task.source is not None and task.sandbox.build
        image = ensure_task_image(task.sandbox.build)
        assert image.cached  # built by the worker for this run (or an earlier one)
        assert result.task_source == f"harbor:{task.source.ref}"
        assert task.source.ref == str(stack.harbor / task.task_id)
        assert result.env_version == task.source.content_hash
        assert result.env_version and result.env_version.startswith("sha256:")
        assert result.image_digest == image.image_id
        task_rows = by_task.get(task.task_id, [])
        assert task_rows and len(task_rows) == result.num_samples, task.task_id
        traj = stack.gateway.trajectory(result.session_id or "")
        for row in task_rows:
            assert row.task_source == result.task_source
            assert row.env_version == result.env_version
            assert row.image_digest == image.image_id
            assert row.reward_fn_version.startswith("harbor-")
            assert row.reward_fn_version == task.evaluation.version
            assert row.reward == result.reward
            n = len(row.response_ids)
            assert n > 0 and len(row.logprobs) == n and len(row.loss_mask) == n
            assert any(row.loss_mask)
            seg = next(s for s in traj["segments"] if s["segment_id"] == row.segment_id)
            assert row.prompt_ids == seg["prompt_ids"]
            assert row.response_ids == seg["response_ids"]
            assert row.loss_mask == seg["loss_mask"]
            assert row.logprobs == pytest.approx(seg["logprobs"], rel=1e-6)
    return by_task


def check_rewards(
    outcomes: dict[str, RolloutOutcome], rows: dict[str, list[SampleRow]] | None
) -> None:
    for task_id, outcome in outcomes.items():
        result = outcome.result
        assert result is not None
        assert result.reward == EXPECTED[task_id], (task_id, result)
        if task_id == "multi-metric":
            assert result.reward_metrics == MULTI_METRICS
            for row in (rows or {}).get(task_id, []):
                assert json.loads(row.reward_metrics) == MULTI_METRICS


# --------------------------------------------------------------------------- tests


async def test_command_agent_solves_the_harbor_tasks_on_docker(stack: Stack) -> None:
    """All five test tasks on docker with a tool-calling agent driven through the
    Gateway: each scores what its verifier says (no-peek 1.0: the agent saw neither
    /tests nor /solution; allowlist 1.0: fetched through the relay), with token-exact
    samples and the task's lineage; the multi-metric task's other numbers ride along."""
    stack.engine.reset(command_agent_script())
    tasks = load(stack.harbor, COMMAND_AGENT, "docker")
    assert sorted(t.task_id for t in tasks) == sorted(EXPECTED)
    outcomes = await run_batch(stack, tasks, "command-docker")
    rows = check_lineage_and_samples(stack, tasks, outcomes)
    check_rewards(outcomes, rows)


async def test_command_agent_solves_the_harbor_tasks_on_local(stack: Stack) -> None:
    """The same five tasks on the local backend, which runs the built image's exported
    rootfs under bubblewrap: same rewards, samples and lineage (the image id)."""
    stack.engine.reset(command_agent_script())
    tasks = load(stack.harbor, COMMAND_AGENT, "local")
    outcomes = await run_batch(stack, tasks, "command-local")
    rows = check_lineage_and_samples(stack, tasks, outcomes)
    check_rewards(outcomes, rows)


@pytest.mark.parametrize("backend", ["docker", "local"])
async def test_mini_swe_agent_on_harbor_tasks(stack: Stack, backend: str) -> None:
    """mini-swe-agent (the real CLI) does hello and gives up on failing: 1.0 and 0.0."""
    stack.engine.reset(mini_swe_agent_script())
    tasks = load(stack.harbor, MINI, backend, {"hello", "failing"})
    outcomes = await run_batch(stack, tasks, f"mini-{backend}")
    rows = check_lineage_and_samples(stack, tasks, outcomes)
    check_rewards(outcomes, rows)
    for outcome in outcomes.values():
        assert outcome.result is not None and outcome.result.harness == "mini_swe_agent"


async def test_oracle_validates_the_dataset(stack: Stack) -> None:
    """`--harness oracle` runs each task's solution/solve.sh: every sound task scores
    1.0 (no-peek too: the oracle runs without /tests), and `failing` is flagged 0.0."""
    tasks = load(stack.harbor, ORACLE, "docker")
    outcomes = await run_batch(stack, tasks, "oracle")
    check_rewards(outcomes, None)
    for outcome in outcomes.values():
        assert outcome.result is not None and outcome.result.num_calls == 0


async def test_a_second_run_builds_nothing(stack: Stack) -> None:
    """The image is cached by content hash: prebuilding the tasks again finds it, and a
    whole second run writes no build log."""
    tasks = load(stack.harbor, COMMAND_AGENT, "docker", {"hello", "multi-metric"})
    logs_before = sorted(p.name for p in builds_dir().iterdir())
    prebuilt = prebuild_tasks(tasks)
    assert prebuilt.refused == []
    assert len(prebuilt.images) == 1 and prebuilt.images[0].cached
    stack.engine.reset(command_agent_script())
    outcomes = await run_batch(stack, tasks, "second-run")
    check_rewards(outcomes, None)
    assert sorted(p.name for p in builds_dir().iterdir()) == logs_before


async def test_rollout_run_cli_refuses_bad_tasks_and_runs_the_rest(
    stack: Stack, tmp_path: Path
) -> None:
    """`rollout run DIR` (the real CLI against this stack): each broken task is printed
    as refused, naming the task and the field; a task whose Dockerfile fails to build is
    refused before submission with its build log's tail; the good task runs and scores."""
    dataset = tmp_path / "dataset"
    shutil.copytree(HARBOR_BROKEN, dataset)
    shutil.copytree(HARBOR_BROKEN / "good", dataset / "bad-build")
    (dataset / "bad-build" / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nRUN echo the-build-broke-here && false\n"
    )
    config = tmp_path / "harness.json"
    config.write_text(json.dumps(COMMAND_AGENT.config))
    out = tmp_path / "samples"
    stack.engine.reset(command_agent_script())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "run",
            str(dataset),
            "--harness=command",
            f"--harness-config={config}",
            "--backend=docker",
            "--image-map=ubuntu:24.04=" + BASE,
            f"--temporal={stack.temporal.address}",
            f"--task-queue={QUEUE}",
            f"--out={out}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "400"},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output + stack.worker.log_tail()
    refused = [line for line in output.splitlines() if line.startswith("refused: ")]
    expected_fields = {
        "gpus": "environment.gpus",
        "multi-step": "steps/",
        "no-instruction": "instruction.md",
        "no-test-sh": "tests/test.sh",
        "not-a-task": "task.toml",
        "unknown-field": "environment.cpu_count",
        "wrong-type": "environment.cpus",
    }
    for name, field in expected_fields.items():
        assert any(f"{dataset / name} ({field})" in line for line in refused), (name, output)
    build_refusal = [line for line in refused if line.startswith("refused: bad-build: ")]
    assert build_refusal, output
    assert "the-build-broke-here" in output.split("refused: bad-build: ", 1)[1]
    assert len(refused) == len(expected_fields) + 1, output
    # The good task ran: its samples are on disk, scored 1.0, with the CLI's lineage.
    files = sorted(out.rglob("*.parquet"))
    assert files, output
    rows = [r for f in files for r in table_to_rows(pq.read_table(f))]
    assert {r.task_id for r in rows} == {"good"}
    assert all(r.reward == 1.0 for r in rows)
    assert all(r.task_source == f"harbor:{dataset / 'good'}" for r in rows)


async def test_swebench_instance_through_the_stack(stack: Stack, tmp_path: Path) -> None:
    """A SWE-bench-style instance on a small local git repo: the agent that applies the
    fix scores 1 (every FAIL_TO_PASS and PASS_TO_PASS test passes, counted per list in
    the samples' metrics); the one that does not scores 0 (its FAIL_TO_PASS fails)."""
    instances = write_calc_instances(
        tmp_path,
        {
            "local__calc-fixed": "sub(5, 3) returns 8; it should return 2.",
            "local__calc-left": "sub(7, 1) is wrong; look at calc.py.",
        },
    )
    options = LoadOptions(
        harness=COMMAND_AGENT,
        backend="docker",
        format_options={"repo_url_template": str(tmp_path / "calc"), **FORMAT_OPTIONS},
    )
    loaded = load_task_source(instances, options, "swebench")
    assert loaded.refused == []
    stack.engine.reset(
        Script(
            rules=[
                ScriptRule(when_contains="exit status:", reply="Done.", repeat=True),
                ScriptRule(when_contains="sub(5, 3)", reply=call("bash", command=FIX), repeat=True),
                ScriptRule(
                    when_contains="sub(7, 1)", reply=call("bash", command="ls"), repeat=True
                ),
            ],
            default_reply="Done.",
        )
    )
    outcomes = await run_batch(stack, loaded.tasks, "swebench")
    fixed = outcomes["local__calc-fixed"].result
    left = outcomes["local__calc-left"].result
    assert fixed is not None and left is not None
    assert fixed.reward == 1.0, fixed
    assert fixed.reward_metrics == {
        "fail_to_pass_passed": 1.0,
        "fail_to_pass_total": 1.0,
        "pass_to_pass_passed": 1.0,
        "pass_to_pass_total": 1.0,
    }
    assert left.reward == 0.0, left
    assert left.reward_metrics["fail_to_pass_passed"] == 0.0
    assert left.reward_metrics["pass_to_pass_passed"] == 1.0
    client = stack.client
    assert client is not None
    rows = table_to_rows(client.load_samples([fixed, left]))
    assert {r.task_id for r in rows} == {"local__calc-fixed", "local__calc-left"}
    for row in rows:
        assert row.task_source.startswith("swebench:")
        assert row.response_ids and len(row.logprobs) == len(row.response_ids)
        assert json.loads(row.sandbox_facts) == {"repo_history": "trimmed"}
