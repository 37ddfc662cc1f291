"""What the host records about its sandboxes, and the rules that read it back.

Why on disk: a worker can die without running any cleanup (SIGKILL, Temporal
termination), so every sandbox made on this host leaves enough behind for another
process to find and destroy it: a per-sandbox state dir under `state_root`, the
owning process as ``host:pid:starttime`` (pid reuse cannot fake it) and a
``by-rollout`` link per rollout id. `should_reap` is the reaper's rule over that.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from sandboxes.base import SandboxHandle


def state_root(kind: str) -> Path:
    """Host directory holding per-sandbox state (pid files, run dirs, workdirs) and the
    repos' git mirrors: `$ROLLOUT_SANDBOX_STATE_DIR`, else `/var/lib/agentic-rollout` as
    root, else `$XDG_STATE_HOME/agentic-rollout` (`~/.local/state`)."""
    env = os.environ.get("ROLLOUT_SANDBOX_STATE_DIR")
    if env:
        base = Path(env)
    elif os.geteuid() == 0:
        base = Path("/var/lib/agentic-rollout")
    else:
        base = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local/state"))
        base = base / "agentic-rollout"
    p = base / kind
    p.mkdir(parents=True, exist_ok=True)
    return p


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of a pid (guards against pid reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def pid_alive(pid: int | None, start: int | None = None) -> bool:
    """Whether `pid` runs (not a zombie) and, given `start`, is still the same process."""
    if not pid:
        return False
    st = proc_start_time(pid)
    if st is None:
        return False
    if start is not None and st != start:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def owner_token() -> str:
    """host:pid:starttime of this process — who owns an unassigned pool sandbox."""
    pid = os.getpid()
    return f"{os.uname().nodename}:{pid}:{proc_start_time(pid)}"


def owner_alive(token: str) -> bool:
    """Whether the process behind an `owner_token` still runs (other hosts: assume so)."""
    try:
        host, pid, start = token.rsplit(":", 2)
    except ValueError:
        return False
    if host != os.uname().nodename:
        return True  # not ours to judge
    return pid_alive(int(pid), int(start) if start not in ("", "None") else None)


def rollout_key(rollout_id: str) -> str:
    """File-name-safe name of a rollout's by-rollout link (rollout ids are free text)."""
    return hashlib.sha256(rollout_id.encode()).hexdigest()[:32]


def should_reap(h: SandboxHandle, active: set[str] | frozenset[str]) -> bool:
    """The reaper's rule: an inactive or expired rollout, or a blank whose owner died."""
    if h.rollout_id:
        if h.rollout_id not in active:
            return True
        exp = h.details.get("expires_at")
        return bool(exp and time.time() > float(exp))
    owner = h.details.get("owner") or ""
    return not owner_alive(owner)


def remove_tree(p: Path) -> None:
    """Remove a sandbox's directory, even parts the sandbox made unreadable (chmod 000).

    Permissions are only ever changed *inside* the tree being removed: chmod-ing the
    directory above it (the backend's state dir) to 0700 would lock every later sandbox,
    which runs as the sandbox uid, out of its own directory.
    """
    root = os.path.realpath(p)

    def inside(path: str) -> bool:
        return os.path.commonpath([root, os.path.realpath(path)]) == root

    def onerror(func: Any, path: str, exc: Any) -> None:
        with contextlib.suppress(OSError):
            parent = os.path.dirname(path)
            if inside(parent):
                os.chmod(parent, 0o700)
            if inside(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)

    if p.exists():
        shutil.rmtree(p, onerror=onerror)
