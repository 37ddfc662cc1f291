"""`rollout demo` end to end, as a user runs it: one command, no TTY, everything local.

It must start a Temporal dev server with UI, a Gateway, an engine (the scripted one
here, so the test is fast and deterministic), local sandboxes and a worker; run the
example tasks; print the UI link, `samples: PATH` and a few rows; exit 0; and leave no
server, worker, engine or sandbox behind.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from schemas.storage import read_table

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [ln for ln in out.splitlines() if text in ln and "ps -eo" not in ln]


def test_demo_runs_and_cleans_up(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "workers.demo", f"--data-dir={data}", "--engine=scripted"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "SCRIPTED engine" in out  # the engine in use is stated clearly
    ui = next(ln for ln in out.splitlines() if ln.startswith("UI: "))
    assert ui.startswith("UI: http://127.0.0.1:") and "RolloutBatchId" in ui
    samples = Path(next(ln for ln in out.splitlines() if ln.startswith("samples: "))[9:])
    assert samples.is_dir() and samples.is_relative_to(data)
    table = read_table(str(samples))
    assert table.num_rows == 8  # 4 example tasks × 2 samples, one segment each
    assert "a few sample rows" in out and "stopped:" in out
    assert not _processes_mentioning(str(data)), "a demo process outlived the demo"
    assert not list(Path("/tmp").glob("rollout-demo-sandboxes-*"))
