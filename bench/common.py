"""Helpers more than one bench needs: percentiles, a process tree's CPU, servers' health.

Kept small and dependency-free (httpx aside) so every bench can import it cheaply.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q`-quantile (0 ≤ q ≤ 1) of `values`; 0.0 when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def process_ticks(root: int) -> int:
    """utime + stime (clock ticks) of `root` and all its descendants."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(stat[11]) + int(stat[12])
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    """Until `url`/health answers 200; exits the bench if `proc` dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy")


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
