"""Minimal cgroup (v1 and v2) management for local sandboxes.

Why cgroups and not only rlimits: a memory cgroup makes the kernel OOM-kill the
offending process (reported as `oom_killed` via the oom_kill counter), a pids cgroup
caps fork bombs across the whole sandbox, and "kill every process in the cgroup" is
the reliable way to leave nothing behind. Needs root (or a delegated subtree). A
limit that cannot be applied is an error (`CgroupLimitError`), never skipped; the
local backend runs without cgroups only when told to (``allow_no_cgroups``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from sandboxes.base import SandboxError

ROOT = Path("/sys/fs/cgroup")
PARENT = "agentic-rollout"


class CgroupLimitError(SandboxError):
    """A requested cgroup limit could not be applied: the provision fails rather
    than run the sandbox with a weaker limit than asked for."""


def cgroup_mode(root: Path = ROOT) -> str | None:
    """``"v2"``, ``"v1"`` or None when this process cannot manage cgroups."""
    if os.geteuid() != 0:
        return None
    if (root / "cgroup.controllers").exists():
        return "v2"
    if (root / "memory" / "tasks").exists() and os.access(root / "memory", os.W_OK):
        return "v1"
    return None


def _write(p: Path, value: str) -> bool:
    try:
        p.write_text(value)
        return True
    except OSError:
        return False


def _set(d: Path, fname: str, value: str) -> None:
    try:
        (d / fname).write_text(value)
    except OSError as e:
        raise CgroupLimitError(
            f"cannot apply cgroup limit {d / fname} = {value}: {e.strerror or e}"
        ) from e


def _swap_active() -> bool:
    try:
        return len(Path("/proc/swaps").read_text().splitlines()) > 1
    except OSError:
        return True


def create_cgroups(
    name: str,
    memory_mb: int | None,
    pids: int | None,
    cpus: float | None,
    root: Path = ROOT,
) -> list[str]:
    """Create the sandbox's cgroup(s) with every requested limit applied.

    Returns the directories. Raises `CgroupLimitError` (after removing what it
    made) when a controller is missing or a value is refused.
    """
    dirs: list[Path] = []
    try:
        _create(name, memory_mb, pids, cpus, root, dirs)
    except BaseException:
        remove_cgroups([str(d) for d in dirs])
        raise
    return [str(d) for d in dirs]


def _create(
    name: str,
    memory_mb: int | None,
    pids: int | None,
    cpus: float | None,
    root: Path,
    dirs: list[Path],
) -> None:
    m = cgroup_mode(root)
    wanted = {"memory": bool(memory_mb), "pids": bool(pids), "cpu": bool(cpus)}
    if m == "v1":
        for ctrl in ("memory", "pids", "cpu"):
            base = root / ctrl
            if not (base / "tasks").exists():
                if wanted[ctrl]:
                    raise CgroupLimitError(f"cgroup v1 controller {ctrl} is not mounted at {base}")
                continue
            d = base / PARENT / name
            d.mkdir(parents=True, exist_ok=True)
            dirs.append(d)
            if ctrl == "memory" and memory_mb:
                limit = str(memory_mb * 1024 * 1024)
                _set(d, "memory.limit_in_bytes", limit)
                if (d / "memory.memsw.limit_in_bytes").exists():
                    _set(d, "memory.memsw.limit_in_bytes", limit)  # no swap
                elif _swap_active():
                    raise CgroupLimitError(
                        "swap is on but the kernel does not account it "
                        "(memory.memsw.*): the memory limit would not cover swap"
                    )
                _set(d, "memory.swappiness", "0")
            if ctrl == "pids" and pids:
                _set(d, "pids.max", str(pids))
            if ctrl == "cpu" and cpus:
                _set(d, "cpu.cfs_period_us", "100000")
                _set(d, "cpu.cfs_quota_us", str(int(cpus * 100000)))
    elif m == "v2":
        parent = root / PARENT
        parent.mkdir(exist_ok=True)
        for ctrl in ("memory", "pids", "cpu"):
            for where in (root, parent):
                # Enabling may fail if it is on already; what counts is the check below.
                with contextlib.suppress(OSError):
                    (where / "cgroup.subtree_control").write_text(f"+{ctrl}")
        d = parent / name
        d.mkdir(exist_ok=True)
        dirs.append(d)
        have = set((d / "cgroup.controllers").read_text().split())
        missing = [c for c, w in wanted.items() if w and c not in have]
        if missing:
            raise CgroupLimitError(f"cgroup v2 controllers {missing} are not available in {d}")
        if memory_mb:
            _set(d, "memory.max", str(memory_mb * 1024 * 1024))
            _set(d, "memory.swap.max", "0")
        if pids:
            _set(d, "pids.max", str(pids))
        if cpus:
            _set(d, "cpu.max", f"{int(cpus * 100000)} 100000")
    else:
        raise CgroupLimitError(f"no cgroup hierarchy this process can manage at {root}")


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


def _counter(files: list[Path], key: str) -> int | None:
    """The first `key N` line among cgroup event files (`memory.events`, `pids.events`,
    v1's `memory.oom_control`); None if none has it."""
    for f in files:
        with contextlib.suppress(OSError, ValueError):
            for line in f.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
    return None


def oom_kill_count(dirs: list[str]) -> int | None:
    """Cumulative OOM kills in the sandbox's memory cgroup (None if unknown)."""
    files = [Path(d) / f for d in dirs for f in ("memory.oom_control", "memory.events")]
    return _counter(files, "oom_kill")


def pids_limit_hits(dirs: list[str]) -> int | None:
    """How often a fork in the sandbox was refused at its pids limit (None: unknown).

    `dirs` are the sandbox's cgroups as its backend knows them; on cgroup v1 a memory
    cgroup's pids twin (same path under the pids hierarchy, as docker makes them) is
    read too."""
    memory = ROOT / "memory"
    twins = [
        ROOT / "pids" / Path(d).relative_to(memory) for d in dirs if Path(d).is_relative_to(memory)
    ]
    return _counter([p / "pids.events" for p in [*map(Path, dirs), *twins]], "max")


def memory_held_in_files(dirs: list[str]) -> tuple[int, int] | None:
    """(bytes of the sandbox's memory held by tmpfs files such as /dev/shm's, its memory
    limit) from its memory cgroup (v1 or v2); None when unknown or unlimited.

    Why: such files outlive every process, so after the kill they are memory the agent
    left taken, and a check may find none to start in."""
    for d in map(Path, dirs):
        stat = _read(d / "memory.stat")
        limit = _read(d / "memory.max") or _read(d / "memory.limit_in_bytes")
        if stat is None or limit is None or not limit.strip().isdigit():
            continue
        fields = dict(line.partition(" ")[::2] for line in stat.splitlines())
        held = fields.get("total_shmem") or fields.get("shmem")
        if held is not None and held.strip().isdigit() and int(limit) < 1 << 60:
            return int(held), int(limit)
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


def _cgroup_dirs_of_pid(pid: int, must_contain: str) -> dict[str, Path] | None:
    """Controller → host cgroup dir of a process (v1 by controller, v2 as "unified");
    None when unreadable or not the expected process (path lacks `must_contain`)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    out: dict[str, Path] = {}
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if must_contain not in path:
            continue
        if ctrls == "" and (ROOT / "cgroup.controllers").exists():
            out["unified"] = ROOT / path.lstrip("/")
        for c in ctrls.split(","):
            if c in ("memory", "pids", "cpu"):
                out[c] = ROOT / ctrls / path.lstrip("/")
    return out or None


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def limit_problems(
    pid: int, must_contain: str, memory_mb: int | None, pids: int | None, cpus: float | None
) -> list[str] | None:
    """Requested limits that are not in force in the cgroups of `pid` (e.g. a docker
    container whose engine dropped one with only a warning); None if they cannot be
    read from here (remote engine, other pid namespace)."""
    dirs = _cgroup_dirs_of_pid(pid, must_contain)
    if dirs is None:
        return None
    want: list[tuple[str, str, str]] = []  # (controller, file, value)
    if "unified" in dirs:
        if memory_mb:
            want += [("unified", "memory.max", str(memory_mb << 20))]
            want += [("unified", "memory.swap.max", "0")]
        if pids:
            want.append(("unified", "pids.max", str(pids)))
        if cpus:
            want.append(("unified", "cpu.max", f"{int(cpus * 100000)} 100000"))
    else:
        if memory_mb:
            want.append(("memory", "memory.limit_in_bytes", str(memory_mb << 20)))
            if "memory" in dirs and (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                want.append(("memory", "memory.memsw.limit_in_bytes", str(memory_mb << 20)))
        if pids:
            want.append(("pids", "pids.max", str(pids)))
        if cpus:
            want.append(("cpu", "cpu.cfs_quota_us", str(int(cpus * 100000))))
    problems = []
    for ctrl, fname, value in want:
        d = dirs.get(ctrl)
        got = _read(d / fname) if d else None
        if got != value:
            problems.append(f"{fname} is {got or 'missing'}, want {value}")
    return problems
