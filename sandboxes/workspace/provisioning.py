"""Giving a new sandbox what its spec asks for: files, repo checkout, setup, environment.

Shared by every backend so a spec means the same thing everywhere: files go in as one
tar, the repo is checked out host-side (sandboxes have no network) from a cached bare
mirror, setup commands run in order in the workdir, and every exec starts from the
same base environment plus the spec's.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import io
import posixpath
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from sandboxes.base import Sandbox, SandboxError, SandboxFile, SandboxHandle, SandboxSpec
from sandboxes.host.state import state_root
from sandboxes.workspace.repo_trim import TRIMMED, checkout_commit, git, trim_in_sandbox

#: PATH every sandbox command starts with.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def resolve_path(path: str, workdir: str) -> str:
    """A spec path: absolute as is, relative to the workdir otherwise."""
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


def _is_git_dir(path: Path) -> bool:
    return (
        subprocess.run(
            ["git", f"--git-dir={path}", "rev-parse", "--git-dir"], capture_output=True
        ).returncode
        == 0
    )


def _mirror(url: str, commit: str, cache: Path) -> Path:
    """The cached bare mirror of `url`, holding `commit`.

    Made and updated under a lock per URL: the rollouts of one repo start together (a
    worker's threads, a host's workers), and each must find the mirror whole, never
    another's half-made clone. A mirror found broken is made again.
    """
    mirror = cache / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    with open(mirror.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if mirror.exists() and not _is_git_dir(mirror):
            shutil.rmtree(mirror)
        if not mirror.exists():
            tmp = Path(tempfile.mkdtemp(prefix=f"{mirror.name}.", dir=cache))
            try:
                git("clone", "--quiet", "--mirror", url, str(tmp))
                # One pack with a bitmap (a bare repo's default): each checkout then
                # counts its commit's objects from the bitmap instead of walking them.
                git("repack", "-a", "-d", "-q", cwd=tmp)
                tmp.rename(mirror)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        if subprocess.run(
            ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=mirror, capture_output=True
        ).returncode:
            git("fetch", "--quiet", "origin", "+refs/*:refs/*", cwd=str(mirror))
            with contextlib.suppress(SandboxError):
                git("fetch", "--quiet", "origin", commit, cwd=str(mirror))
    return mirror


def repo_tar(url: str, commit: str, cache: Path | None = None) -> bytes:
    """Host-side checkout of `url` at `commit`, as a tar whose root is the repo.

    A bare mirror per URL is cached so repeated rollouts on one repo fetch once. The
    checkout holds `commit`'s history only (`repo_trim.checkout_commit`), copied once.
    """
    if shutil.which("git") is None:
        raise SandboxError("git is required on the host to materialise spec.repo")
    mirror = _mirror(url, commit, cache or state_root("git-cache"))
    with tempfile.TemporaryDirectory(prefix="repo-") as tmp:
        work = Path(tmp) / "repo"
        checkout_commit(mirror, commit, work)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for child in sorted(work.iterdir()):
                tf.add(str(child), arcname=child.name)
        return buf.getvalue()


async def populate(sb: Sandbox, spec: SandboxSpec) -> None:
    """Files, repo, the image's repos cut to their commit, and setup commands from the
    spec, in that order. Records on the handle's `facts` that a repo's history was cut."""
    workdir = sb.workdir  # the backend may map spec.workdir (e2b: under $HOME)
    if spec.files:
        await sb.put_archive("/", files_tar(spec.files, workdir))
    if spec.repo is not None:
        data = await asyncio.to_thread(repo_tar, spec.repo.url, spec.repo.commit)
        await sb.put_archive(resolve_path(spec.repo.path, workdir), data)
    for repo in spec.image_repos:
        await trim_in_sandbox(sb, repo, spec.setup_timeout_s)
    if spec.repo is not None or spec.image_repos:
        sb.handle = sb.handle.model_copy(update={"facts": {**sb.handle.facts, **TRIMMED}})
    for cmd in spec.setup:
        res = await sb.exec(cmd, cwd=workdir, timeout=spec.setup_timeout_s)
        if not res.ok:
            raise SandboxError(
                f"setup command failed (exit {res.exit_code}, timed_out={res.timed_out}): "
                f"{cmd!r}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
            )


def base_env(spec: SandboxSpec, home: str, gateway_url: str | None) -> dict[str, str]:
    """Environment every exec in a sandbox for `spec` starts from."""
    env = {
        "PATH": SANDBOX_PATH,
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


def merged_env(handle: SandboxHandle, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The handle's environment with one exec's extra variables on top."""
    env = dict(handle.env)
    if extra:
        env.update({str(k): str(v) for k, v in dict(extra).items()})
    return env
