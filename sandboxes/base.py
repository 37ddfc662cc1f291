"""The sandbox protocol: `Sandbox`, `SandboxBackend` and the models they exchange.

This is the only sandbox module harnesses and hooks import. They only ever need to run
commands, move files and read the environment; everything backend-specific (bubblewrap
namespaces, docker containers, E2B templates, warm pools, the in-sandbox supervisor)
lives in the backend modules, so adding a backend touches no harness and importing
this module pulls in no backend machinery. The models are pydantic because they cross
process boundaries (Temporal activity payloads, the backends' state files).
Backends are constructed by name through `sandboxes.registry`.
"""

from __future__ import annotations

import abc
import asyncio
import io
import os
import re
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Workspace models and the network policy are part of the task contract; the protocol
# re-exports them.
from schemas.environment import NetworkPolicy
from schemas.workspace import RepoSpec, SandboxFile, absolute_dir, full_commit

__all__ = [
    "DEFAULT_GATEWAY_PORT",
    "DEFAULT_MAX_ARCHIVE_BYTES",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "EVALUATOR_GIT_CONFIG",
    "EVALUATOR_PATH",
    "EVAL_LOG_SUBDIRS",
    "LOGS_DIR",
    "MANAGED_LABEL",
    "NO_PROFILE_ENV",
    "ROLLOUT_LABEL",
    "SOLUTION_DIR",
    "SYSTEM_TOOLS_ENV",
    "TESTS_DIR",
    "UNREADABLE_PAX",
    "ArchiveTooLarge",
    "BackendUnavailable",
    "Command",
    "EvalHeadroom",
    "ExecResult",
    "GatewayChannel",
    "ImageRepo",
    "NetworkPolicy",
    "NetworkPolicyRefused",
    "OutputCallback",
    "OutputChunk",
    "RepoSpec",
    "ResourceLimits",
    "Sandbox",
    "SandboxBackend",
    "SandboxError",
    "SandboxFile",
    "SandboxHandle",
    "SandboxNotFound",
    "SandboxSpec",
    "evaluator_env",
]

#: Label/tag carrying the rollout id on every sandbox (docker label, E2B metadata,
#: local state file). The reaper reaps by it.
ROLLOUT_LABEL = "agentic-rollout.rollout-id"
#: Label/tag marking a sandbox as made by these backends: listing and reaping never
#: touch anything else on the same engine or account.
MANAGED_LABEL = "agentic-rollout.managed"
#: Loopback port inside the sandbox where the Gateway forwarder listens.
DEFAULT_GATEWAY_PORT = 18080
#: Where a task's hidden tests go after the agent stopped (Harbor's layout). The
#: evaluation empties it before placing them, so nothing the agent put there survives.
TESTS_DIR = "/tests"
#: Where the oracle harness places a task's reference solution (Harbor's layout). Made
#: empty in every sandbox, since a read-only root cannot get a new top-level dir later.
SOLUTION_DIR = "/solution"
#: Harbor's log root: the agent may write `LOGS_DIR/agent` and `LOGS_DIR/artifacts`
#: during its run (collected as artifacts); the verifier writes its reward to
#: `LOGS_DIR/verifier`. The local and docker backends give every sandbox both
#: directories, writable by the agent user and on its sized disk.
LOGS_DIR = "/logs"
EVAL_LOG_SUBDIRS = ("agent", "verifier", "artifacts")


class SandboxError(RuntimeError):
    """A sandbox operation failed (backend error, not a non-zero exit code)."""


class SandboxNotFound(SandboxError):
    """The sandbox does not exist (anymore): destroyed, reaped or never created."""


class ArchiveTooLarge(SandboxError):
    """An archive read out of a sandbox passed its byte cap; the read was stopped there.

    The sandbox decides how much it writes, so the host never reads more than it allowed.
    """

    def __init__(self, path: str, max_bytes: int, read_bytes: int) -> None:
        super().__init__(
            f"archive of {path} in the sandbox exceeds {max_bytes} bytes "
            f"(read stopped after {read_bytes})"
        )
        self.path = path
        self.max_bytes = max_bytes
        self.read_bytes = read_bytes


class NetworkPolicyRefused(SandboxError, ValueError):
    """The task's network policy cannot be given here (public without the operator's
    permission, a mode the backend cannot enforce). A ValueError: the task is refused,
    not retried."""


class BackendUnavailable(SandboxError):
    """The backend's runtime (docker engine, bwrap, E2B credentials) is missing.

    The message always says how to install/configure it.
    """


# --------------------------------------------------------------------------- spec


MIB = 1024 * 1024


class EvalHeadroom(BaseModel):
    """Free space an evaluation needs in the sandbox after the agent ran.

    A step after the agent that failed in a sandbox with less free than this (on the
    disk holding its workdir, /tmp or home; in /dev/shm) failed by the agent's doing
    (`Sandbox.agent_damage`): the agent used up what the verifier needs (pip installs,
    test caches, multiprocessing's semaphores). None: derived from the filesystem's
    size — 1/16 of the disk between 4 and 256 MiB, 1/4 of /dev/shm up to 16 MiB.
    """

    model_config = ConfigDict(extra="forbid")

    disk_mb: float | None = Field(default=None, ge=0)
    shm_mb: float | None = Field(default=None, ge=0)

    def disk_bytes(self, total: int) -> int:
        """Bytes needed free on a disk of `total` bytes."""
        if self.disk_mb is not None:
            return int(self.disk_mb * MIB)
        return min(max(total // 16, 4 * MIB), 256 * MIB, total // 2)

    def shm_bytes(self, total: int) -> int:
        """Bytes needed free in a /dev/shm of `total` bytes."""
        if self.shm_mb is not None:
            return int(self.shm_mb * MIB)
        return min(total // 4, 16 * MIB)

    @classmethod
    def of_task(cls, resources: Any) -> EvalHeadroom:
        """The `eval_headroom` a task's `sandbox.resources` (a raw mapping, or None)
        sets; the default where it sets none."""
        raw = resources.get("eval_headroom") if isinstance(resources, dict) else None
        return cls.model_validate(raw) if raw is not None else cls()


def short_of_room(where: str, free: int, total: int, need: int) -> str | None:
    """The damage line for a filesystem with `free` of `total` bytes when `need` are
    needed (None: enough room)."""
    if free >= need:
        return None
    return (
        f"{where} is full ({free / MIB:.1f} MiB free of {total / MIB:.0f} MiB; "
        f"an evaluation needs {need / MIB:.0f} MiB, resources.eval_headroom)"
    )


class ResourceLimits(BaseModel):
    """Per-sandbox resource caps. `None` means "backend default / unlimited"."""

    model_config = ConfigDict(extra="forbid")

    cpus: float | None = 1.0
    memory_mb: int | None = 2048
    pids: int | None = 1024
    #: Cap on everything the agent can write (workdir, home, /tmp, /tests, /logs): a sized
    #: filesystem per sandbox (local/docker: loop-mounted ext4, or docker's
    #: storage-opt). A backend that cannot enforce it fails the provision.
    disk_mb: int | None = 4096
    #: Max open files per process.
    nofile: int | None = 4096
    #: Free space an evaluation needs after the agent (not a cap: see `EvalHeadroom`).
    eval_headroom: EvalHeadroom = Field(default_factory=EvalHeadroom)


class GatewayChannel(BaseModel):
    """How the sandbox reaches its Gateway session — and nothing else.

    For local/docker: `target` is the host-side Gateway address, either
    ``unix:/path/to.sock`` or ``http://127.0.0.1:PORT`` (a host-side Unix→TCP bridge is
    started then). It is exposed inside the sandbox at ``http://127.0.0.1:inside_port``.
    For remote backends (e2b) `public_url` is used as-is (the sandbox is elsewhere).
    """

    model_config = ConfigDict(extra="forbid")

    target: str | None = None
    inside_port: int = DEFAULT_GATEWAY_PORT
    public_url: str | None = None


class ImageRepo(BaseModel):
    """A git repository the image already holds (SWE-bench's `/testbed`), at `commit`.

    Provisioning cuts its history to `commit` and its ancestors before the agent starts
    (`sandboxes.workspace.repo_trim`), as a repo cloned from `SandboxSpec.repo` is cut.
    """

    model_config = ConfigDict(extra="forbid")

    path: str
    commit: str

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return absolute_dir(v, "image_repos[].path")

    @field_validator("commit")
    @classmethod
    def _immutable(cls, v: str) -> str:
        return full_commit(v, "image_repos[].commit")


class SandboxSpec(BaseModel):
    """Everything needed to create a sandbox for one rollout."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    #: Docker image ref / E2B template id. For the local backend: image whose exported
    #: rootfs to use (if available), else the host's read-only system dirs.
    image: str | None = None
    #: Local backend only: explicit rootfs directory (overrides `image`).
    rootfs: str | None = None
    resources: ResourceLimits = Field(default_factory=ResourceLimits)
    #: Lifetime of the sandbox (seconds). Enforced by the backend's TTL / the reaper.
    timeout_s: float = 3600.0
    env: dict[str, str] = Field(default_factory=dict)
    files: list[SandboxFile] = Field(default_factory=list)
    repo: RepoSpec | None = None
    #: Repositories the image holds, each cut to its commit's history like `repo`.
    image_repos: list[ImageRepo] = Field(default_factory=list)
    #: Shell commands run in order after files/repo are in place (cwd = workdir).
    setup: list[str] = Field(default_factory=list)
    setup_timeout_s: float = 600.0
    workdir: str = "/workspace"
    gateway: GatewayChannel | None = None
    #: What the sandbox may reach besides the Gateway (see docs/sandboxes.md).
    network: NetworkPolicy = Field(default_factory=NetworkPolicy)
    labels: dict[str, str] = Field(default_factory=dict)
    #: E2B: run even when the agent's user can become root in the template (`sudo -n
    #: true` succeeds), which lets it reach everything the evaluation relies on.
    allow_root_escalation: bool = False
    #: Backend-specific knobs (e.g. {"user": "agent"}); ignored by other backends.
    extra: dict[str, Any] = Field(default_factory=dict)


# --------------------------------------------------------------------------- results


class SandboxHandle(BaseModel):
    """Serializable reference to a live sandbox (passed between activities)."""

    model_config = ConfigDict(extra="allow")

    backend: str
    sandbox_id: str
    rollout_id: str
    #: Image digest (docker image Id / rootfs digest / E2B template id) — the exact
    #: environment the agent ran in, recorded for lineage.
    env_version: str
    #: What the system dirs come from: "image-rootfs" | "host-readonly" | "image" | "template".
    system: str = "image"
    workdir: str = "/workspace"
    #: Agent-facing Gateway base URL *inside* the sandbox (e.g. http://127.0.0.1:18080).
    gateway_base_url: str | None = None
    #: Environment every exec starts from (spec env + HOME/PATH + gateway vars).
    env: dict[str, str] = Field(default_factory=dict)
    #: Host that owns the sandbox (for Temporal task-queue affinity).
    host: str = Field(default_factory=lambda: os.uname().nodename)
    created_at: float = Field(default_factory=time.time)
    #: Backend-specific details (container name, pid, state dir...). Informational.
    details: dict[str, Any] = Field(default_factory=dict)
    #: What provisioning did that the samples record (``repo_history: trimmed``).
    facts: dict[str, str] = Field(default_factory=dict)


class OutputChunk(BaseModel):
    """A piece of streamed output from `exec`."""

    stream: Literal["stdout", "stderr"]
    data: bytes

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


class ExecResult(BaseModel):
    """Outcome of one command.

    `exit_code` is the process's exit status, or 128+N when killed by signal N
    (shell convention). `timed_out` / `oom_killed` tell *why* it was killed.
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    oom_killed: bool = False
    duration_s: float = 0.0
    #: True when captured stdout/stderr were cut at `max_output_bytes`
    #: (streamed chunks are never cut).
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed


OutputCallback = Callable[[OutputChunk], Awaitable[None] | None]
Command = Sequence[str] | str

#: Default cap on captured output per stream in ExecResult (streaming is uncapped).
DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024 * 1024
#: How long the damage probe (`Sandbox.agent_damage`) may take in the sandbox.
DAMAGE_PROBE_TIMEOUT_S = 30.0
#: Bytes the damage probe writes into each directory an evaluation writes to.
DAMAGE_PROBE_BYTES = 65536
#: Where the damage probe measures shared memory (`EvalHeadroom.shm_mb`).
SHM_DIR = "/dev/shm"
#: The damage probe: for each directory before ``--``, whether it is still there, and
#: whether a new file of DAMAGE_PROBE_BYTES can be written into it (one line per
#: problem), and its filesystem's size and free space (``free<TAB>dir<TAB>blocks<TAB>
#: available<TAB>block size``, from ``stat -f``; nothing where stat cannot say); for
#: each one after, only whether it is still there. /dev/shm is measured too.
_DAMAGE_PROBE = r"""
n=$1; shift
room() { s=$(stat -f -c '%b %a %S' "$1" 2>/dev/null) && printf 'free\t%s\t%s\n' "$1" "$s"; }
for d in "$@"; do
  shift
  [ "$d" = -- ] && break
  [ -n "$d" ] || continue
  if [ ! -d "$d" ]; then echo "$d is gone"; continue; fi
  if ! [ -r "$d" ] || ! [ -x "$d" ]; then echo "$d cannot be read (mode changed)"; continue; fi
  f=$(mktemp "$d/.rollout-probe.XXXXXX" 2>/dev/null) || { echo "$d takes no new file"; continue; }
  head -c "$n" /dev/zero > "$f" 2>/dev/null || echo "$d has no room for $n bytes (disk full)"
  rm -f "$f"
  room "$d"
done
[ -d /dev/shm ] && room /dev/shm
for d in "$@"; do [ -d "$d" ] || echo "$d is gone (a check runs there)"; done
"""
#: Exit status and message of an exec whose process could not be started (supervisor).
_SPAWN_FAILED = (126, "exec failed:")

#: Default cap on one archive read out of a sandbox (`get_archive`, `get_file`, `get_dir`):
#: a sandbox that writes gigabytes must not take its host's memory with it.
DEFAULT_MAX_ARCHIVE_BYTES = 256 * 1024 * 1024
#: PAX header of an archive member the sandbox could not read (the member is empty;
#: the value says why). The in-sandbox supervisor writes it (a stdlib-only copy there).
UNREADABLE_PAX = "ROLLOUT.unreadable"


# --------------------------------------------------------------------------- clean room

#: PATH of every evaluation step: system directories only (no ~/.local/bin, no workdir).
EVALUATOR_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Git settings every git of an evaluation step gets at command-line precedence (via
#: ``GIT_CONFIG_COUNT``), so a repo config the agent wrote cannot start a program there.
#: `safe.directory`: a repo the image holds is often another uid's (SWE-bench's /testbed
#: is root's, mode 777), and git's ownership check would stop every git there; in a
#: sandbox it guards nothing, since the agent can replace a repo it can write by its own.
EVALUATOR_GIT_CONFIG = {
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",
    "core.untrackedCache": "false",
    "safe.directory": "*",
}
#: For a command a backend may start through a login shell (E2B runs every command as
#: ``bash -l -c``): a HOME where no profile file can exist (/proc: nobody creates files
#: there), no startup file.
NO_PROFILE_ENV = {"HOME": "/proc", "BASH_ENV": "", "ENV": ""}
#: For the evaluator's own small commands after the agent that must not depend on making
#: a directory, so cannot use the clean room (a cleanup, the damage probe on a full disk):
#: programs from the system dirs only, whatever PATH the task's env gives the sandbox (it
#: may name a venv the agent can write), and no profile file of the agent's.
SYSTEM_TOOLS_ENV = {"PATH": EVALUATOR_PATH, **NO_PROFILE_ENV}
#: Variables of the sandbox's env an evaluation step never inherits: the clean room sets
#: them itself, or they make a program load code from a path (`evaluator_env`).
_NOT_INHERITED = re.compile(
    r"^(PATH|HOME|TMPDIR|XDG_.*|LD_.*|PYTHON.*|BASH_ENV|ENV|SHELLOPTS|BASHOPTS|IFS|CDPATH"
    r"|GIT_.*|PERL5?LIB|PERL5OPT|NODE_OPTIONS|NODE_PATH|RUBYOPT|RUBYLIB|GCONV_PATH"
    r"|LOCPATH|MALLOC_.*|GLIBC_TUNABLES)$"
)
#: Runs an evaluation step's command (its argv follows) with a HOME and TMPDIR made
#: right now (random name, created exclusively, 0700: nothing the agent could have
#: prepared) and removed afterwards; a check's own env may set either. No dir → 126.
_CLEAN_ROOM_SH = (
    "d=$(mktemp -d) || exit 126; trap 'rm -rf \"$d\"' EXIT; "
    'mkdir "$d/home" "$d/tmp" || exit 126; '
    'HOME="${HOME:-$d/home}"; TMPDIR="${TMPDIR:-$d/tmp}"; export HOME TMPDIR; "$@"'
)


def evaluator_env(
    sandbox_env: Mapping[str, str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The whole environment of an evaluation step (see `Sandbox.evaluator_exec`).

    From `sandbox_env` (the task's sandbox env and the backend's base) only what does not
    steer how programs start; then system PATH, no user site, git without global/system
    config and with `EVALUATOR_GIT_CONFIG`; then `extra` (a check's own env: the task
    author's, so it may set anything).
    """
    env = {k: v for k, v in sandbox_env.items() if not _NOT_INHERITED.match(k)}
    env.update(
        PATH=EVALUATOR_PATH,
        PYTHONNOUSERSITE="1",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_ATTR_NOSYSTEM="1",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_CONFIG_COUNT=str(len(EVALUATOR_GIT_CONFIG)),
    )
    for i, (key, value) in enumerate(EVALUATOR_GIT_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


# --------------------------------------------------------------------------- protocol


class Sandbox(abc.ABC):
    """A live sandbox. All a harness may use: exec, files, env, handle.

    `exec(cmd)`: a list is an argv (no shell); a string runs under ``/bin/sh -c``.
    Cancelling the awaiting task kills the command inside the sandbox.
    """

    handle: SandboxHandle

    @property
    def env(self) -> dict[str, str]:
        """Environment every exec starts from (spec env + gateway vars)."""
        return dict(self.handle.env)

    @property
    def workdir(self) -> str:
        return self.handle.workdir

    @property
    def gateway_base_url(self) -> str | None:
        return self.handle.gateway_base_url

    @abc.abstractmethod
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
        """Run a command to completion; stream output to `on_output` as it comes."""

    async def exec_stream(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> AsyncIterator[OutputChunk | ExecResult]:
        """Async-iterator form of `exec`: yields OutputChunks, then the ExecResult last."""
        queue: asyncio.Queue[OutputChunk | ExecResult | BaseException] = asyncio.Queue()

        async def run() -> None:
            try:
                res = await self.exec(
                    cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin, on_output=queue.put
                )
                await queue.put(res)
            except BaseException as e:
                await queue.put(e)
                raise

        task = asyncio.create_task(run())
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, ExecResult):
                    return
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def evaluator_exec(
        self,
        cmd: Command,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_output: OutputCallback | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        stop_processes: bool = True,
    ) -> ExecResult:
        """Run one evaluation step (a check, a hook's git) in a clean room.

        Why: the step runs in the agent's sandbox, so nothing the agent left may run code
        in it. First every process in the sandbox is killed (`kill_all_processes`; pass
        ``stop_processes=False`` only before the agent ran). Then the command runs under
        ``env -i`` with `evaluator_env` (`env`, a check's own, on top), a fresh HOME and
        TMPDIR that exist only for this command, PATH of system dirs only, and git
        neutralised (no global/system config, no fsmonitor, no hooks). A string runs under
        ``/bin/sh -c``, a list is an argv; the result is the command's, as for `exec`.
        It runs as the sandbox user on every backend: see docs/sandboxes.md for what the
        clean room holds per backend.
        """
        if stop_processes:
            await self.kill_all_processes()
        inner = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        pairs = [f"{k}={v}" for k, v in evaluator_env(self.handle.env, env).items()]
        argv = ["/usr/bin/env", "-i", "--", *pairs, "/bin/sh", "-c", _CLEAN_ROOM_SH, "sh", *inner]
        return await self.exec(
            argv,
            env=NO_PROFILE_ENV,
            cwd=cwd,
            timeout=timeout,
            stdin=stdin,
            on_output=on_output,
            max_output_bytes=max_output_bytes,
        )

    # --- files (tar is the primitive; single files are built on it) -------------

    @abc.abstractmethod
    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        """Extract a tar archive into `dest_dir` (created if missing) in the sandbox."""

    @abc.abstractmethod
    async def get_archive(self, path: str, *, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> bytes:
        """Tar archive of `path` (file or directory); members are rooted at its basename.

        Read in chunks; more than `max_bytes` raises `ArchiveTooLarge` with the read
        stopped at about the cap. An entry the backend could not read may come as an
        empty member with an `UNREADABLE_PAX` header saying why.
        """

    @abc.abstractmethod
    async def kill_all_processes(self) -> None:
        """Kill every process started by `exec` so far, with all their descendants.

        Why: evaluation runs in the agent's sandbox after the agent, so a process the
        agent left behind could rewrite its answer (or the checks) while they run. The
        sandbox stays usable for further `exec` calls. Raises SandboxError if processes
        survive.
        """

    async def agent_damage(
        self,
        workdir: str,
        check_dirs: Sequence[str] = (),
        headroom: EvalHeadroom | None = None,
    ) -> str | None:
        """What the agent broke in this sandbox that an evaluation needs, or None.

        The one rule for whose fault a failed step after the agent's run is: the
        sandbox is the agent's, so a step that failed in a sandbox showing damage the
        agent could have done (no process can start, its supervisor is gone, the
        workdir, /tmp or home is gone, closed, or has less free space than `headroom`
        (default: `EvalHeadroom()`), /dev/shm is short of it, one of `check_dirs` —
        directories checks run in that existed before the agent ran — is gone) failed
        by the agent's doing and scores 0; in a sandbox without such damage it is ours
        (masked). Measured after the failure, from the host where the backend can
        (`_find_damage`); a probe that cannot decide finds nothing, so a doubt stays
        ours. Never raises.
        """
        try:
            return await asyncio.wait_for(
                self._find_damage(workdir, check_dirs, headroom or EvalHeadroom()),
                DAMAGE_PROBE_TIMEOUT_S + 15,
            )
        except Exception:
            return None

    async def _find_damage(
        self, workdir: str, check_dirs: Sequence[str], headroom: EvalHeadroom
    ) -> str | None:
        """The probe run inside the sandbox (`_DAMAGE_PROBE`); backends add host-side
        measurements first. An exec the backend could not deliver decides nothing."""
        dirs = [workdir, "/tmp", self.env.get("HOME", ""), "--", *check_dirs]
        try:
            res = await self.exec(
                ["/bin/sh", "-c", _DAMAGE_PROBE, "probe", str(DAMAGE_PROBE_BYTES), *dirs],
                env=SYSTEM_TOOLS_ENV,
                cwd="/",
                timeout=DAMAGE_PROBE_TIMEOUT_S,
            )
        except SandboxError:
            return None
        if res.timed_out:
            return f"a probe of a few file writes did not finish in {DAMAGE_PROBE_TIMEOUT_S} s"
        code, marker = _SPAWN_FAILED
        if res.exit_code == code and marker in res.stderr:
            return f"no process can start in it ({res.stderr.strip()[:200]})"
        found: list[str] = []
        reported: set[tuple[bool, int, int]] = set()
        for line in res.stdout.splitlines():
            if not line.startswith("free\t"):
                if line.strip():
                    found.append(line.strip())
                continue
            short = _room_line(line, headroom, reported)
            if short:
                found.append(short)
        return "; ".join(found) or None

    async def put_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        p = Path(path)
        await self.put_archive(str(p.parent), _tar_single(p.name, data, mode))

    async def get_file(self, path: str, *, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> bytes:
        """A regular file's content; `max_bytes` caps the archive read (content + headers)."""
        raw = await self.get_archive(path, max_bytes=max_bytes)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            for m in tf.getmembers():
                if m.isfile():
                    f = tf.extractfile(m)
                    assert f is not None
                    return f.read()
        raise SandboxNotFound(f"{path} is not a regular file in the sandbox")

    async def put_dir(self, local_dir: str | os.PathLike[str], dest_dir: str) -> None:
        """Copy a host directory's *contents* into `dest_dir` in the sandbox."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for child in sorted(Path(local_dir).iterdir()):
                tf.add(str(child), arcname=child.name)
        await self.put_archive(dest_dir, buf.getvalue())

    async def get_dir(
        self,
        path: str,
        local_dir: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES,
    ) -> None:
        """Copy sandbox `path` (dir) into host `local_dir` (its contents, not the dir)."""
        raw = await self.get_archive(path, max_bytes=max_bytes)
        out = Path(local_dir)
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            base = Path(path.rstrip("/")).name
            for m in tf.getmembers():
                rel = Path(m.name)
                if rel.parts and rel.parts[0] == base:
                    rel = Path(*rel.parts[1:]) if len(rel.parts) > 1 else Path(".")
                if rel == Path("."):
                    continue
                m.name = str(rel)
                tf.extract(m, out, filter="data")

    async def destroy(self) -> None:
        """Destroy this sandbox (idempotent)."""
        await self.backend.destroy(self.handle)

    @property
    @abc.abstractmethod
    def backend(self) -> SandboxBackend: ...

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()


class SandboxBackend(abc.ABC):
    """Creates, re-attaches, lists and destroys sandboxes of one kind.

    `create` is idempotent per rollout id: a retried create first destroys any sandbox
    already labelled with that rollout id, so retries never leak a second one.
    `attach` rebuilds a `Sandbox` from a handle (next activity, same host).
    `destroy` never raises for an already-gone sandbox.
    """

    name: str = "abstract"
    # Capabilities: callers ask the class (`sandboxes.registry.backend_class`), so no
    # caller keeps a list of backend names. The defaults suit a remote backend.
    #: Its sandboxes run on this host and reach the Gateway through a host-side bridge
    #: (`GatewayChannel.target`); a remote one gets the Gateway's public URL. The reaper
    #: reaps these by default.
    host_local: ClassVar[bool] = False
    #: It runs a Docker image present on this host, so a task's image is built and
    #: checked here before create (a remote one names a template of its own).
    runs_local_images: ClassVar[bool] = False
    #: It runs an image's filesystem exported to a directory (`SandboxSpec.rootfs`), not
    #: the image itself, so it needs no Docker engine once that is exported.
    runs_image_rootfs: ClassVar[bool] = False
    #: Allowlisted hosts are reached through host-side relays, which take the operator's
    #: name pins (the `egress_hosts` option).
    egress_relays: ClassVar[bool] = False

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox: ...

    @abc.abstractmethod
    async def attach(self, handle: SandboxHandle) -> Sandbox: ...

    @abc.abstractmethod
    async def destroy(self, handle: SandboxHandle) -> None: ...

    @abc.abstractmethod
    async def list(self) -> list[SandboxHandle]:
        """Sandboxes of this backend owned by this host (for the reaper)."""

    async def reap(
        self,
        active_rollout_ids: set[str] | frozenset[str],
        checked: frozenset[str] | None = None,
    ) -> list[str]:
        """Destroy sandboxes whose rollout is not active; returns reaped sandbox ids.

        `checked`: the rollout ids the caller looked up; a sandbox of any other rollout was
        created since (a provision racing the reaper) and is kept. None: all were."""
        reaped: list[str] = []
        for h in await self.list():
            if unchecked(h, checked):
                continue
            if h.rollout_id not in active_rollout_ids:
                await self.destroy(h)
                reaped.append(h.sandbox_id)
        return reaped

    async def close(self) -> None:
        """Release client resources (pools, HTTP clients). Does not destroy sandboxes."""
        return None


def _room_line(line: str, headroom: EvalHeadroom, seen: set[tuple[bool, int, int]]) -> str | None:
    """The damage line for one ``free`` line of the probe (None: room enough, unreadable,
    or a filesystem of the same size already reported: the workdir, /tmp and home
    usually share one disk)."""
    try:
        _, where, sizes = line.split("\t", 2)
        blocks, avail, bsize = (int(x) for x in sizes.split())
    except ValueError:
        return None
    total, free = blocks * bsize, avail * bsize
    key = (where == SHM_DIR, blocks, bsize)
    if key in seen or blocks <= 0:
        return None
    if where == SHM_DIR:
        short = short_of_room(SHM_DIR, free, total, headroom.shm_bytes(total))
    else:
        short = short_of_room(f"the disk of {where}", free, total, headroom.disk_bytes(total))
    if short:
        seen.add(key)
    return short


def unchecked(handle: SandboxHandle, checked: frozenset[str] | None) -> bool:
    """A rollout's sandbox the reaper did not look up (it appeared after its listing)."""
    return checked is not None and bool(handle.rollout_id) and handle.rollout_id not in checked


def _tar_single(name: str, data: bytes, mode: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        ti.mode = mode
        ti.mtime = int(time.time())
        tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()
