"""Helpers more than one bench needs: percentiles, a process tree's CPU, servers' health,
the fixed-latency engine, and a `rollout gateway` process (a Gateway in-process:
`workers.local_stack`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def process_table() -> dict[int, tuple[int, bytes]]:
    """pid → (parent pid, command line) of every live process."""
    table: dict[int, tuple[int, bytes]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                table[int(name)] = (ppid, f.read())
    return table


def sandbox_trees(table: dict[int, tuple[int, bytes]], state_dir: Path) -> set[int]:
    """Every process of the local sandboxes under `state_dir`: the bwrap processes (their
    command line names the state dir) and all their descendants."""
    needle = str(state_dir).encode()
    roots = {
        p
        for p, (_, cmd) in table.items()
        if os.path.basename(cmd.split(b"\0", 1)[0]) == b"bwrap" and needle in cmd
    }
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(p)
    found, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo += children.get(p, [])
    return found


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


@contextlib.contextmanager
def fixed_latency_engine(tokenizer_dir: Path, latency_ms: float) -> Iterator[str]:
    """`devstack.fixed_latency_engine` (a FAKE engine: load benches measure the Gateway,
    not a model) on a free loopback port while the block runs; yields its URL."""
    from devstack.ports import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "devstack.fixed_latency_engine",
         "--tokenizer", str(tokenizer_dir / "tokenizer.json"), "--port", str(port),
         "--latency-ms", str(latency_ms)]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class GatewayProcess:
    """A `rollout gateway` process (of this tree, or of `tree`) in front of `engine` (what
    has its `url` and served `model`), with a fresh admin token; `stop()` ends it."""

    def __init__(
        self,
        engine: Any,
        model_dir: Path,
        fsync: str = "group",
        tree: Path | None = None,
        engine_api: str | None = None,
    ) -> None:
        from devstack.ports import free_port

        self.admin = secrets.token_urlsafe(16)
        port, control_port = free_port(), free_port()
        env = dict(os.environ, ROLLOUT_ADMIN_TOKEN=self.admin)
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        data_dir = tempfile.mkdtemp(prefix="gw-bench-")
        argv = [sys.executable, "-m", "workers.cli", "gateway", "--engine", engine.url]
        argv += ["--model", engine.model, "--tokenizer", str(model_dir), "--fsync", fsync]
        argv += ["--port", str(port), "--control-port", str(control_port), "--data-dir", data_dir]
        if engine_api is not None:
            argv += ["--engine-api", engine_api]
        self.process = subprocess.Popen(argv, env=env, cwd=tree)
        self.url = f"http://127.0.0.1:{port}"
        self.control = f"http://127.0.0.1:{control_port}"
        try:
            wait_healthy(self.control, self.process, timeout_s=60)
        except SystemExit:
            self.stop()
            raise

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@contextlib.contextmanager
def py_spy(pid: int, out: Path | None, fmt: str = "flamegraph") -> Iterator[None]:
    """While the block runs, py-spy (the `profile` extra) samples the process `pid` and its
    threads into `out` (`flamegraph`: an svg; `raw`: collapsed stacks, one per line). Only
    the thread holding the GIL is sampled (`--gil`), so the profile is where the process's
    Python work went, not where a thread waited (a syscall that released the GIL, or the
    GIL itself). `out` None: nothing runs. Sampling does not pause the process."""
    if out is None:
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[profile]'")
    argv = [spy, "record", "--pid", str(pid), "--rate", "250", "--nonblocking", "--gil"]
    if fmt == "flamegraph":
        argv.append("--nolineno")  # one box per function: a graph to read, and a small file
    proc = subprocess.Popen([*argv, "--format", fmt, "--output", str(out)],
                            stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        proc.wait(timeout=60)
