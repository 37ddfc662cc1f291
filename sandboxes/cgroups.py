"""Minimal cgroup (v1 and v2) management for local sandboxes.

Why cgroups and not only rlimits: a memory cgroup makes the kernel OOM-kill the
offending process (reported as `oom_killed` via the oom_kill counter), a pids cgroup
caps fork bombs across the whole sandbox, and "kill every process in the cgroup" is
the reliable way to leave nothing behind. Needs root (or a delegated subtree); the
local backend falls back to rlimits otherwise and says so in the handle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "agentic-rollout"


def cgroup_mode() -> str | None:
    """``"v2"``, ``"v1"`` or None when this process cannot manage cgroups."""
    if os.geteuid() != 0:
        return None
    if (ROOT / "cgroup.controllers").exists():
        return "v2"
    if (ROOT / "memory" / "tasks").exists() and os.access(ROOT / "memory", os.W_OK):
        return "v1"
    return None


def _write(p: Path, value: str) -> bool:
    try:
        p.write_text(value)
        return True
    except OSError:
        return False


def create_cgroups(
    name: str, memory_mb: int | None, pids: int | None, cpus: float | None
) -> list[str]:
    """Create the sandbox's cgroup(s); returns the directories (empty if unavailable)."""
    m = cgroup_mode()
    dirs: list[Path] = []
    if m == "v1":
        for ctrl in ("memory", "pids", "cpu"):
            base = ROOT / ctrl
            if not (base / "tasks").exists():
                continue
            d = base / PARENT / name
            d.mkdir(parents=True, exist_ok=True)
            dirs.append(d)
            if ctrl == "memory" and memory_mb:
                limit = str(memory_mb * 1024 * 1024)
                _write(d / "memory.limit_in_bytes", limit)
                _write(d / "memory.memsw.limit_in_bytes", limit)  # no swap (if accounted)
                _write(d / "memory.swappiness", "0")
            if ctrl == "pids" and pids:
                _write(d / "pids.max", str(pids))
            if ctrl == "cpu" and cpus:
                _write(d / "cpu.cfs_period_us", "100000")
                _write(d / "cpu.cfs_quota_us", str(int(cpus * 100000)))
    elif m == "v2":
        parent = ROOT / PARENT
        parent.mkdir(exist_ok=True)
        _write(ROOT / "cgroup.subtree_control", "+memory +pids +cpu")
        _write(parent / "cgroup.subtree_control", "+memory +pids +cpu")
        d = parent / name
        d.mkdir(exist_ok=True)
        dirs.append(d)
        if memory_mb:
            _write(d / "memory.max", str(memory_mb * 1024 * 1024))
            _write(d / "memory.swap.max", "0")
        if pids:
            _write(d / "pids.max", str(pids))
        if cpus:
            _write(d / "cpu.max", f"{int(cpus * 100000)} 100000")
    return [str(d) for d in dirs]


def cgroup_procs(dirs: list[str]) -> set[int]:
    out: set[int] = set()
    for d in dirs:
        with contextlib.suppress(OSError):
            out.update(int(x) for x in Path(d, "cgroup.procs").read_text().split())
    return out


def kill_cgroup_procs(dirs: list[str], timeout: float = 5.0) -> bool:
    """SIGKILL every process in the cgroups until they are empty."""
    deadline = time.monotonic() + timeout
    for d in dirs:
        if Path(d, "cgroup.kill").exists():
            _write(Path(d, "cgroup.kill"), "1")
    while True:
        left = cgroup_procs(dirs)
        if not left:
            return True
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def remove_cgroups(dirs: list[str]) -> None:
    for d in dirs:
        for _ in range(50):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)


def oom_kill_count(dirs: list[str]) -> int | None:
    """Cumulative OOM kills in the sandbox's memory cgroup (None if unknown)."""
    for d in dirs:
        p = Path(d)
        for fname in ("memory.oom_control", "memory.events"):
            f = p / fname
            if f.exists():
                with contextlib.suppress(OSError, ValueError):
                    for line in f.read_text().splitlines():
                        k, _, v = line.partition(" ")
                        if k == "oom_kill":
                            return int(v)
    return None


def memory_cgroup_of_pid(pid: int) -> str | None:
    """Host path of the memory cgroup a process is in (docker containers, too)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            return str(ROOT / "memory" / path.lstrip("/"))
        if ctrls == "" and (ROOT / "cgroup.controllers").exists():
            return str(ROOT / path.lstrip("/"))
    return None
