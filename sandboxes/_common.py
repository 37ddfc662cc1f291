"""Helpers shared by the backends: spec files/repo/setup, state dirs, process identity."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import posixpath
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sandboxes import _cgroups
from sandboxes._control import ControlClient, normalize_cmd
from sandboxes.base import (
    DEFAULT_GATEWAY_PORT,
    DEFAULT_MAX_OUTPUT_BYTES,
    ROLLOUT_LABEL,
    Command,
    ExecResult,
    OutputCallback,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxFile,
    SandboxHandle,
    SandboxSpec,
)
from sandboxes.gateway_channel import ensure_bridge


class SupervisedSandbox(Sandbox):
    """A sandbox driven through its in-sandbox supervisor's control socket (local, docker).

    Subclasses say where their memory cgroups are and how to tell an OOM kill without one.
    """

    def __init__(self, backend: SandboxBackend, handle: SandboxHandle) -> None:
        self._backend = backend
        self.handle = handle
        self._client = ControlClient(Path(handle.details["state_dir"]) / "run" / "control.sock")

    def _memory_cgroups(self) -> list[str]:
        return []

    async def _oom_without_cgroup(self) -> bool:
        return False

    async def exec(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        cg = self._memory_cgroups()
        before = _cgroups.oom_kills_of_dirs(cg) if cg else None
        res = await self._client.exec(
            normalize_cmd(cmd),
            env=merged_env(self.handle, env),
            cwd=cwd or self.handle.workdir,
            timeout=timeout,
            stdin=stdin,
            on_output=on_output,
            max_output_bytes=max_output_bytes,
        )
        if res.exit_code == 128 + signal.SIGKILL and not res.timed_out:
            if before is not None:
                after = _cgroups.oom_kills_of_dirs(cg)
                res.oom_killed = after is not None and after > before
            else:
                res.oom_killed = await self._oom_without_cgroup()
        return res

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        await self._client.put_archive(dest_dir, tar_bytes)

    async def get_archive(self, path: str) -> bytes:
        return await self._client.get_archive(path)


MANAGED_LABEL = "agentic-rollout.managed"
POOL_LABEL = "agentic-rollout.pool"
OWNER_LABEL = "agentic-rollout.owner"
#: Where a supervisor-backed sandbox sees its host run dir (control and gateway sockets).
RUN_DIR = "/run/rollout"

__all__ = ["MANAGED_LABEL", "OWNER_LABEL", "POOL_LABEL", "ROLLOUT_LABEL"]


def state_root(kind: str) -> Path:
    """Host directory holding per-sandbox state (pid files, run dirs, workdirs)."""
    env = os.environ.get("AGENTIC_ROLLOUT_STATE")
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
    try:
        host, pid, start = token.rsplit(":", 2)
    except ValueError:
        return False
    if host != os.uname().nodename:
        return True  # not ours to judge
    return pid_alive(int(pid), int(start) if start not in ("", "None") else None)


def resolve_path(path: str, workdir: str) -> str:
    return path if path.startswith("/") else posixpath.join(workdir, path)


def files_tar(files: list[SandboxFile], workdir: str) -> bytes:
    """One tar (rooted at /) with every spec file, so they go in with one call."""
    buf = io.BytesIO()
    now = int(time.time())
    dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for f in files:
            full = posixpath.normpath(resolve_path(f.path, workdir)).lstrip("/")
            parent = posixpath.dirname(full)
            parts = parent.split("/") if parent else []
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    ti = tarfile.TarInfo(d)
                    ti.type = tarfile.DIRTYPE
                    ti.mode = 0o755
                    ti.mtime = now
                    tf.addfile(ti)
            data = f.data()
            ti = tarfile.TarInfo(full)
            ti.size = len(data)
            ti.mode = f.mode
            ti.mtime = now
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _git(*args: str, cwd: str | None = None) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise SandboxError(f"git {' '.join(args)} failed: {r.stderr.strip()[-2000:]}")
    return r.stdout


def repo_tar(url: str, commit: str, cache: Path | None = None) -> bytes:
    """Host-side checkout of `url` at `commit`, as a tar whose root is the repo.

    A bare mirror per URL is cached so repeated rollouts on one repo fetch once.
    """
    if shutil.which("git") is None:
        raise SandboxError("git is required on the host to materialise spec.repo")
    cache = cache or state_root("git-cache")
    mirror = cache / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    if not mirror.exists():
        tmp = mirror.with_suffix(f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        _git("clone", "--quiet", "--mirror", url, str(tmp))
        with contextlib.suppress(OSError):
            tmp.rename(mirror)
        shutil.rmtree(tmp, ignore_errors=True)
    if subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=mirror, capture_output=True
    ).returncode:
        _git("fetch", "--quiet", "origin", "+refs/*:refs/*", cwd=str(mirror))
        with contextlib.suppress(SandboxError):
            _git("fetch", "--quiet", "origin", commit, cwd=str(mirror))
    with tempfile.TemporaryDirectory(prefix="repo-") as tmp:
        work = Path(tmp) / "repo"
        _git("clone", "--quiet", "--no-checkout", "--no-hardlinks", str(mirror), str(work))
        _git("checkout", "--quiet", "--detach", commit, cwd=str(work))
        _git("remote", "set-url", "origin", url, cwd=str(work))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for child in sorted(work.iterdir()):
                tf.add(str(child), arcname=child.name)
        return buf.getvalue()


async def populate(sb: Sandbox, spec: SandboxSpec) -> None:
    """Files, repo and setup commands from the spec, in that order."""
    workdir = sb.workdir  # the backend may map spec.workdir (e2b: under $HOME)
    if spec.files:
        await sb.put_archive("/", files_tar(spec.files, workdir))
    if spec.repo is not None:
        data = await asyncio.to_thread(repo_tar, spec.repo.url, spec.repo.commit)
        await sb.put_archive(resolve_path(spec.repo.path, workdir), data)
    for cmd in spec.setup:
        res = await sb.exec(cmd, cwd=workdir, timeout=spec.setup_timeout_s)
        if not res.ok:
            raise SandboxError(
                f"setup command failed (exit {res.exit_code}, timed_out={res.timed_out}): "
                f"{cmd!r}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
            )


def base_env(spec: SandboxSpec, home: str, gateway_url: str | None) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": home,
        "USER": "agent",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "AGENTIC_ROLLOUT_ID": spec.rollout_id,
    }
    if gateway_url:
        env["AGENTIC_ROLLOUT_GATEWAY_URL"] = gateway_url
    env.update(spec.env)
    return env


def merged_env(handle: SandboxHandle, extra: Any) -> dict[str, str]:
    env = dict(handle.env)
    if extra:
        env.update({str(k): str(v) for k, v in dict(extra).items()})
    return env


def rollout_key(rollout_id: str) -> str:
    """File-name-safe name of a rollout's by-rollout link (rollout ids are free text)."""
    return hashlib.sha256(rollout_id.encode()).hexdigest()[:32]


async def bind_rollout(
    sb: Sandbox,
    client: ControlClient,
    spec: SandboxSpec,
    state: Path,
    home: str,
    **extra_details: Any,
) -> None:
    """Bind a blank (cold or pooled) supervisor-backed sandbox to `spec`'s rollout.

    Shared by the docker and local backends, whose sandboxes are laid out alike: opens
    the Gateway bridge on the run dir's socket, records the rollout in the handle and
    its handle.json (attach and the janitor read it) and points ``by-rollout/<key>`` at
    the state dir so a retried create finds and replaces this sandbox. Files, repo and
    setup are left to the caller (`populate`).
    """
    sdir = Path(sb.handle.details["state_dir"])
    gw_url = None
    if spec.gateway is not None and spec.gateway.target:
        sock = str(sdir / "run" / "gateway.sock")
        ensure_bridge(sock, spec.gateway.target)  # sub-ms; keeps acquire off thread pools
        if spec.gateway.inside_port != DEFAULT_GATEWAY_PORT:
            await client.forward(spec.gateway.inside_port, f"{RUN_DIR}/gateway.sock")
        gw_url = f"http://127.0.0.1:{spec.gateway.inside_port}"
    now = time.time()
    details = dict(sb.handle.details)
    details.update(
        labels=spec.labels,
        expires_at=now + spec.timeout_s,
        gateway_target=spec.gateway.target if spec.gateway else None,
        **extra_details,
    )
    sb.handle = sb.handle.model_copy(
        update={
            "rollout_id": spec.rollout_id,
            "gateway_base_url": gw_url,
            "env": base_env(spec, home, gw_url),
            "created_at": now,
            "details": details,
        }
    )
    (sdir / "handle.json").write_text(sb.handle.model_dump_json())
    link = state / "by-rollout" / rollout_key(spec.rollout_id)
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(sdir.name)
