"""Sandboxes run by the in-sandbox supervisor, and the backend base they share.

The local (bubblewrap) and docker backends lay their sandboxes out alike: a
per-sandbox state dir on the host (`host_state`) whose ``run`` dir is bind-mounted at
`RUN_DIR` and holds the Gateway channel's socket and the allowlist's relay sockets
(`egress_relay`); the supervisor binds its control
socket there and the host moves it to the never-mounted ``ctl`` dir once it is ready.
They also manage them alike, so that logic lives here once: a warm pool of blank
sandboxes keyed by what cannot change after start, `create` idempotent per rollout
(the ``by-rollout`` link), binding a blank to its rollout on acquire, `attach` from
``handle.json``, `destroy` and `reap`. A backend supplies only how to start, stop and
list its own sandboxes (`SupervisedBackend`'s abstract methods).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from sandboxes.base import (
    DEFAULT_GATEWAY_PORT,
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_OUTPUT_BYTES,
    EVAL_LOG_SUBDIRS,
    LOGS_DIR,
    SOLUTION_DIR,
    TESTS_DIR,
    Command,
    EvalHeadroom,
    ExecResult,
    NetworkPolicy,
    OutputCallback,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
    short_of_room,
    unchecked,
)
from sandboxes.host.state import owner_token, remove_tree, rollout_key, should_reap
from sandboxes.image.base_image import IMAGE_REPO
from sandboxes.isolation.cgroups import memory_held_in_files, oom_kill_count, pids_limit_hits
from sandboxes.isolation.disk import DISK_DIR, release_disk
from sandboxes.network.egress_relay import (
    check_policy,
    close_relays,
    egress_routes,
    open_relays,
    public_network_allowed,
    reopen_relays,
    validate_pins,
)
from sandboxes.network.gateway_channel import bridge_is_open, close_bridge, ensure_bridge
from sandboxes.supervision.pool import WarmPool
from sandboxes.supervision.supervisor_client import (
    SupervisorClient,
    control_socket_path,
    normalize_cmd,
)
from sandboxes.workspace.provisioning import base_env, merged_env, populate

#: Where a supervised sandbox sees its host run dir (control and gateway sockets).
RUN_DIR = "/run/rollout"
#: The agent user's home inside a supervised sandbox.
AGENT_HOME = "/home/agent"
#: How long the supervisor has to answer a ping when a failed step is looked into.
PING_TIMEOUT_S = 10.0

#: The task directories every supervised sandbox gets outside its workdir (Harbor's
#: layout): name of the host dir (beside the writable tmp/home/work dirs) → mount point.
TASK_DIRS = {"tests": TESTS_DIR, "logs": LOGS_DIR, "solution": SOLUTION_DIR}

#: The recipe-built base image (`sandboxes.image.base_image`), the default system of both backends.
DEFAULT_IMAGE = f"{IMAGE_REPO}:latest"


class SupervisedSandbox(Sandbox):
    """A sandbox driven through its supervisor's control socket.

    Subclasses say where their memory cgroups are and how to tell an OOM kill without
    one.
    """

    def __init__(self, backend: SupervisedBackend[Any], handle: SandboxHandle) -> None:
        self._backend = backend
        self.handle = handle
        self.supervisor = SupervisorClient(control_socket_path(self.state_dir))

    @property
    def backend(self) -> SupervisedBackend[Any]:
        return self._backend

    @property
    def state_dir(self) -> Path:
        """This sandbox's directory on the host."""
        return Path(self.handle.details["state_dir"])

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
        before = oom_kill_count(cg) if cg else None
        res = await self.supervisor.exec(
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
                after = oom_kill_count(cg)
                res.oom_killed = after is not None and after > before
            else:
                res.oom_killed = await self._oom_without_cgroup()
        return res

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        await self.supervisor.put_archive(dest_dir, tar_bytes)

    async def get_archive(self, path: str, *, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> bytes:
        return await self.supervisor.get_archive(path, max_bytes)

    async def kill_all_processes(self) -> None:
        await self.supervisor.kill_all()

    async def _find_damage(
        self, workdir: str, check_dirs: Sequence[str], headroom: EvalHeadroom
    ) -> str | None:
        """Measured from the host first: the supervisor runs as the agent's uid inside
        the sandbox, so a sandbox we did not destroy whose supervisor is gone or mute
        was ended from inside (killed, stopped, or starved of memory or pids). Then the
        sized disk's free space against `headroom` (`disk.py`), the pids cgroup's
        refused forks, memory the agent's tmpfs files hold (over half the limit: no
        process of it is alive, so nothing else holds it), then the in-sandbox probe."""
        if not self.supervisor.socket_path or not os.path.lexists(self.supervisor.socket_path):
            return None  # destroyed by us (its state dir is gone): not the agent's doing
        try:
            await self.supervisor.ping(PING_TIMEOUT_S)
        except (SandboxError, OSError, TimeoutError, ValueError) as e:
            return f"its supervisor is gone or does not answer ({e!r})"
        full = _disk_full(self.state_dir / DISK_DIR, headroom)
        if full:
            return full
        # Only what runs in the sandbox forks there: the agent's processes, and threads
        # of the supervisor that grow with them (an exec can fail until they are gone).
        hits = pids_limit_hits(self._memory_cgroups())
        if hits:
            return f"it ran into its pids limit ({hits} forks refused)"
        held = memory_held_in_files(self._memory_cgroups())
        if held and held[0] * 2 > held[1]:
            mib = 1024 * 1024
            return (
                f"files in memory (tmpfs: /dev/shm, /run) hold {held[0] // mib} MiB of its "
                f"{held[1] // mib} MiB memory limit"
            )
        return await super()._find_damage(workdir, check_dirs, headroom)


def make_task_dirs(rw: Path, owner_uid: int | None) -> dict[Path, str]:
    """Create the `TASK_DIRS` (and the log subdirs) under `rw`, the sandbox's writable
    area (its sized disk when it has one, so they count against ``disk_mb``), owned by
    `owner_uid` (None: by us). Returns host dir → mount point in the sandbox."""
    made: dict[Path, str] = {}
    for name, target in TASK_DIRS.items():
        d = rw / name
        subs = [d, *(d / s for s in EVAL_LOG_SUBDIRS)] if target == LOGS_DIR else [d]
        for sub in subs:
            sub.mkdir(exist_ok=True)
            if owner_uid is not None:
                os.chown(sub, owner_uid, owner_uid)
        made[d] = target
    return made


def _disk_full(mount: Path, headroom: EvalHeadroom) -> str | None:
    """Whether a sandbox's sized disk (if it has one) has less room than an evaluation
    needs (`headroom`), or no inode left."""
    if not os.path.ismount(mount):
        return None
    st = os.statvfs(mount)
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    if st.f_favail < 1:
        return f"its disk is full (no inode free, {free} bytes free)"
    return short_of_room("its disk", free, total, headroom.disk_bytes(total))


SB = TypeVar("SB", bound=SupervisedSandbox)


class SupervisedBackend(SandboxBackend, Generic[SB]):
    """Create/warm-pool/attach/destroy/reap for sandboxes kept in a host state dir.

    A backend implements `_require_runtime`, `_key`/`_blank_spec` (its pool key and
    the blank a key stands for), `_start` (start one sandbox into its state dir),
    `_stop` (end its processes or container), `_sandbox` (the `Sandbox` for a stored
    handle) and `list`; optionally `_blank_usable` and `_before_bind`.
    """

    #: Sandbox ids are this prefix + 12 hex digits; checked before any path is built.
    id_prefix: str
    #: Why this backend never gives a sandbox public network (None: it can, when allowed).
    public_refusal: str | None = None

    def __init__(
        self,
        state: Path,
        pool_size: int,
        *,
        allow_public_network: bool | None = None,
        egress_hosts: Mapping[str, str] | None = None,
    ) -> None:
        self.state = state
        #: The operator's permission for network mode `public` (`egress_relay`).
        self.allow_public_network = public_network_allowed(allow_public_network)
        #: Allowlisted names the operator pinned to an address (`egress_relay`).
        self.egress_hosts = validate_pins(egress_hosts)
        (self.state / "by-rollout").mkdir(parents=True, exist_ok=True)
        self._id_re = re.compile(rf"^{re.escape(self.id_prefix)}[0-9a-f]{{12}}$")
        self._locks: dict[str, asyncio.Lock] = {}
        self.pool: WarmPool[SB] = WarmPool(self._make_blank, self._discard, pool_size)

    # ------------------------------------------------------- what a backend supplies
    @abc.abstractmethod
    def _require_runtime(self) -> None:
        """Raise BackendUnavailable (saying how to install it) if the runtime is missing."""

    @abc.abstractmethod
    def _key(self, spec: SandboxSpec) -> Hashable:
        """Warm-pool key: everything about `spec` fixed when the sandbox starts."""

    @abc.abstractmethod
    def _blank_spec(self, key: Hashable) -> SandboxSpec:
        """The rollout-less spec a pool key stands for."""

    @abc.abstractmethod
    async def _start(self, sandbox_id: str, state_dir: Path, spec: SandboxSpec) -> SandboxHandle:
        """Start a sandbox (supervisor ready) in the existing `state_dir`; its handle.

        `spec.rollout_id` is empty for a pool blank. On failure the caller destroys
        whatever was started (`_stop` must cope with a half-started sandbox).
        """

    @abc.abstractmethod
    async def _stop(self, handle: SandboxHandle) -> None:
        """End every process (or the container) of a sandbox; it may already be gone."""

    @abc.abstractmethod
    def _sandbox(self, handle: SandboxHandle) -> SB:
        """The `Sandbox` object for a started sandbox's handle."""

    def _blank_usable(self, sb: SB) -> bool:
        """Whether a blank taken from the pool is still running."""
        return True

    async def _before_bind(self, sb: SB, spec: SandboxSpec, pooled: bool) -> None:
        """Backend checks/updates before a sandbox is bound to `spec`'s rollout."""

    # ----------------------------------------------------------------- state dir
    def _sdir(self, sandbox_id: str) -> Path:
        if not self._id_re.match(sandbox_id):
            raise SandboxError(f"bad {self.name} sandbox id {sandbox_id!r}")
        return self.state / sandbox_id

    def _rollout_link(self, rollout_id: str) -> Path:
        return self.state / "by-rollout" / rollout_key(rollout_id)

    def _handle_from_state(self, sandbox_id: str, rollout_id: str = "") -> SandboxHandle:
        """A handle for destroy/reap: what handle.json records, else `rollout_id`."""
        details: dict[str, Any] = {"state_dir": str(self.state / sandbox_id)}
        with contextlib.suppress(OSError, ValueError):
            stored = SandboxHandle.model_validate_json(
                (self.state / sandbox_id / "handle.json").read_text()
            )
            details.update(stored.details)
            rollout_id = stored.rollout_id or rollout_id
        return SandboxHandle(
            backend=self.name,
            sandbox_id=sandbox_id,
            rollout_id=rollout_id,
            env_version="",
            details=details,
        )

    def _recorded_sandboxes(self) -> list[SandboxHandle]:
        """Every sandbox with a state dir here: its handle.json, else a stub with its owner."""
        out: list[SandboxHandle] = []
        for d in sorted(self.state.iterdir()):
            if not self._id_re.match(d.name):
                continue
            try:
                out.append(SandboxHandle.model_validate_json((d / "handle.json").read_text()))
            except (OSError, ValueError):
                owner = ""
                with contextlib.suppress(OSError):
                    owner = (d / "owner").read_text().strip()
                out.append(
                    SandboxHandle(
                        backend=self.name,
                        sandbox_id=d.name,
                        rollout_id="",
                        env_version="",
                        details={"state_dir": str(d), "owner": owner, "incomplete": True},
                    )
                )
        return out

    # ----------------------------------------------------------------- lifecycle
    async def _launch(self, spec: SandboxSpec) -> SB:
        """Start a sandbox for `spec` (a blank if it has no rollout id) and record it."""
        self._require_runtime()
        sid = self.id_prefix + uuid.uuid4().hex[:12]
        sdir = self._sdir(sid)
        sdir.mkdir()
        (sdir / "owner").write_text(owner_token())
        try:
            handle = await self._start(sid, sdir, spec)
        except BaseException:
            stub = SandboxHandle(
                backend=self.name,
                sandbox_id=sid,
                rollout_id="",
                env_version="",
                details={"state_dir": str(sdir)},
            )
            await asyncio.shield(self.destroy(stub))
            raise
        (sdir / "handle.json").write_text(handle.model_dump_json())
        return self._sandbox(handle)

    async def _make_blank(self, key: Hashable) -> SB:
        return await self._launch(self._blank_spec(key))

    async def _discard(self, sb: SB) -> None:
        await self.destroy(sb.handle)

    def _check_network(self, policy: NetworkPolicy) -> None:
        """Refuse a network policy this backend will not give, before anything starts."""
        check_policy(
            policy,
            self.name,
            public_allowed=self.allow_public_network,
            public_refusal=self.public_refusal,
        )

    async def create(self, spec: SandboxSpec) -> SB:
        if not spec.rollout_id:
            raise ValueError("spec.rollout_id is required")
        self._check_network(spec.network)
        self._require_runtime()
        lock = self._locks.setdefault(spec.rollout_id, asyncio.Lock())
        async with lock:
            try:
                await self._destroy_rollout(spec.rollout_id)
                sb = self.pool.take(self._key(spec))
                if sb is not None and not self._blank_usable(sb):
                    await self._discard(sb)
                    sb = None
                pooled = sb is not None
                if sb is None:
                    sb = await self._launch(spec)
                return await self._assign(sb, spec, pooled)
            finally:
                self._locks.pop(spec.rollout_id, None)

    async def warm(self, spec: SandboxSpec, wait: bool = True) -> None:
        """Start (and optionally wait for) the warm pool for specs shaped like `spec`."""
        self._check_network(spec.network)
        self._require_runtime()
        key = self._key(spec)
        if wait:
            await self.pool.wait_full(key)
        else:
            self.pool.refill(key)

    async def _assign(self, sb: SB, spec: SandboxSpec, pooled: bool) -> SB:
        """Bind a started sandbox to a rollout: labels, env, gateway, files, repo, setup."""
        try:
            await self._before_bind(sb, spec, pooled)
            await self._bind_rollout(sb, spec)
            await populate(sb, spec)
            (sb.state_dir / "handle.json").write_text(sb.handle.model_dump_json())  # its facts
        except BaseException:
            await asyncio.shield(self.destroy(sb.handle))
            raise
        return sb

    async def _bind_rollout(self, sb: SB, spec: SandboxSpec) -> None:
        """Open the Gateway channel and the egress relays, record the rollout in the
        handle and link it.

        The handle and its handle.json (read by attach and the reaper) get the
        rollout id, env and expiry; ``by-rollout/<key>`` points at the state dir so a
        retried create finds and replaces this sandbox.
        """
        sdir = sb.state_dir
        gw_url = None
        if spec.gateway is not None and spec.gateway.target:
            sock = str(sdir / "run" / "gateway.sock")
            ensure_bridge(sock, spec.gateway.target)  # sub-ms; keeps acquire off thread pools
            if spec.gateway.inside_port != DEFAULT_GATEWAY_PORT:
                await sb.supervisor.forward(spec.gateway.inside_port, f"{RUN_DIR}/gateway.sock")
            gw_url = f"http://127.0.0.1:{spec.gateway.inside_port}"
        open_relays(sdir / "run", egress_routes(spec.network), self.egress_hosts)
        now = time.time()
        details = dict(sb.handle.details)
        details.update(
            labels=spec.labels,
            expires_at=now + spec.timeout_s,
            gateway_target=spec.gateway.target if spec.gateway else None,
            gateway_inside_port=spec.gateway.inside_port if spec.gateway else None,
            network=spec.network.model_dump(mode="json"),
        )
        sb.handle = sb.handle.model_copy(
            update={
                "rollout_id": spec.rollout_id,
                "gateway_base_url": gw_url,
                "env": base_env(spec, AGENT_HOME, gw_url),
                "created_at": now,
                "details": details,
            }
        )
        (sdir / "handle.json").write_text(sb.handle.model_dump_json())
        link = self._rollout_link(spec.rollout_id)
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(sdir.name)

    async def _destroy_rollout(self, rollout_id: str) -> None:
        """Destroy the sandbox an earlier create made for `rollout_id`, if any."""
        link = self._rollout_link(rollout_id)
        if link.is_symlink():
            sid = os.readlink(link)
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
            if self._id_re.match(sid):
                await self.destroy(self._handle_from_state(sid, rollout_id))

    async def attach(self, handle: SandboxHandle) -> SB:
        sdir = self._sdir(handle.sandbox_id)
        try:
            stored = SandboxHandle.model_validate_json((sdir / "handle.json").read_text())
        except OSError as e:
            raise SandboxNotFound(f"{self.name} sandbox {handle.sandbox_id} does not exist") from e
        target = stored.details.get("gateway_target")
        sock = str(sdir / "run" / "gateway.sock")
        if target and not bridge_is_open(sock):
            # The process that opened the bridge may be gone: serve it from here.
            await asyncio.to_thread(ensure_bridge, sock, target)
        routes = egress_routes(NetworkPolicy.model_validate(stored.details.get("network") or {}))
        if routes:
            await asyncio.to_thread(reopen_relays, sdir / "run", routes, self.egress_hosts)
        return self._sandbox(stored)

    async def destroy(self, handle: SandboxHandle) -> None:
        sid = handle.sandbox_id
        sdir = self._sdir(sid)
        await asyncio.to_thread(close_bridge, str(sdir / "run" / "gateway.sock"))
        await asyncio.to_thread(close_relays, sdir / "run")
        await self._stop(handle)
        await asyncio.to_thread(release_disk, sdir)  # its processes are gone now
        await asyncio.to_thread(self._forget, sid, sdir, handle.rollout_id)

    def _forget(self, sandbox_id: str, sdir: Path, rollout_id: str) -> None:
        """Remove a stopped sandbox's rollout link and state dir."""
        if rollout_id:
            link = self._rollout_link(rollout_id)
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link) == sandbox_id:
                    link.unlink()
        remove_tree(sdir)

    async def reap(
        self,
        active_rollout_ids: set[str] | frozenset[str],
        checked: frozenset[str] | None = None,
    ) -> list[str]:
        """Destroy sandboxes of inactive/expired rollouts and orphaned pool blanks, except
        those of rollouts not in `checked` (see `SandboxBackend.reap`)."""
        held = {sb.handle.sandbox_id for sb in self.pool.idle_items()}
        reaped = []
        for h in await self.list():
            if unchecked(h, checked):
                continue
            if h.sandbox_id not in held and should_reap(h, active_rollout_ids):
                await self.destroy(h)
                reaped.append(h.sandbox_id)
        return reaped

    async def close(self) -> None:
        await self.pool.close()
