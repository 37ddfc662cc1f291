"""Docker backend: one container per rollout, via the docker SDK, with a warm pool.

Containers run with ``network_mode="none"`` (only ``lo``; an allowlisted host is
reached through a relay, `egress_relay`; ``public``, when the operator allows it, is a
bridge network of the sandbox's own, `docker_network`), memory (= memory+swap, so
no swap), CPU and pids limits (verified in the container's cgroups), ``disk_mb`` via
``storage_opt`` or a read-only root over a sized disk (`disk.py`), all capabilities
dropped, ``no-new-privileges``, docker's init as PID 1 and the agent user (uid 1000).
The in-sandbox supervisor (`supervisor.py`, bind-mounted read-only) is the container's
main process: commands, files and the Gateway forwarder go through its Unix socket in
a bind-mounted per-sandbox run dir, which is also where the Gateway channel's socket
appears. So, after creation, no docker API call is on the exec path (the docker API
degrades under ~1000 concurrent operations) and a cancelled command's whole process
tree is killed — something `docker exec` cannot do. Images without python3 fall back
to `docker exec` via the SDK (no stdin, output after exit only; see
`_SdkExecSandbox`).

Warm pool: blank containers (started, supervisor ready) per (image, workdir,
resources). Labels are immutable, so a pooled container's rollout id is recorded in
its state dir (handle.json) at acquire time and the container is renamed to carry it
in the background; cold-created containers carry the rollout-id label directly. The
reaper reads both. Create, the warm pool, attach, destroy and reap are shared with
the local backend (`supervised`); this module says how a container starts, stops and
is listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import re
import tarfile
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sandboxes.base import (
    DEFAULT_GATEWAY_PORT,
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_OUTPUT_BYTES,
    EVAL_LOG_SUBDIRS,
    LOGS_DIR,
    MANAGED_LABEL,
    ROLLOUT_LABEL,
    ArchiveTooLarge,
    BackendUnavailable,
    Command,
    ExecResult,
    NetworkPolicy,
    NetworkPolicyRefused,
    OutputCallback,
    OutputChunk,
    ResourceLimits,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
)
from sandboxes.host.state import owner_token, state_root
from sandboxes.isolation.cgroups import CgroupLimitError, limit_problems, memory_cgroup_of_pid
from sandboxes.isolation.disk import DISK_DIR, DiskLimitUnavailable, make_disk
from sandboxes.network.docker_network import NETWORK_PREFIX, create_network, remove_network
from sandboxes.network.egress_relay import egress_routes, forward_args, inside_names, policy_key
from sandboxes.supervision.supervised import (
    AGENT_HOME,
    DEFAULT_IMAGE,
    RUN_DIR,
    TASK_DIRS,
    SupervisedBackend,
    SupervisedSandbox,
    make_task_dirs,
)
from sandboxes.supervision.supervisor_client import (
    SUPERVISOR_ARGV,
    SUPERVISOR_IN_SANDBOX,
    SUPERVISOR_PATH,
    normalize_cmd,
    secure_control_socket,
    wait_ready,
)
from sandboxes.workspace.provisioning import merged_env

SANDBOX_ID_LABEL = "agentic-rollout.sandbox-id"
#: Whether a container was started as a pool blank ("1") or for its rollout ("0").
POOL_LABEL = "agentic-rollout.pool"
#: The `owner_token` of the process that started the container.
OWNER_LABEL = "agentic-rollout.owner"
#: Which state root (hash) a container belongs to: backends with different state
#: dirs (tests, several workers) never list or reap each other's containers.
STATE_LABEL = "agentic-rollout.state-root"
INSTALL_HINT = (
    "a Docker engine is required for the docker sandbox backend: run "
    "scripts/install_system_deps.sh (apt-get install docker.io; starts dockerd)"
)
T = TypeVar("T")


def _slug(s: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", s)[:40].strip("-.") or "x"


class DockerSandbox(SupervisedSandbox):
    _backend: DockerBackend

    @property
    def backend(self) -> DockerBackend:
        return self._backend

    def _memory_cgroups(self) -> list[str]:
        cg = self.handle.details.get("memory_cgroup")
        return [cg] if cg else []

    async def _oom_without_cgroup(self) -> bool:
        return await self.backend.oom_killed(self.handle)


class _SdkExecSandbox(DockerSandbox):
    """Fallback for images without python3: plain `docker exec` / archive API.

    Limits: output is delivered when the command ends, stdin is not supported, and a
    timeout kills only the command (`timeout -s KILL`), not its detached children;
    `kill_all_processes` restarts the container (every process gets SIGKILL, its
    filesystem stays).
    """

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
        if stdin is not None:
            raise SandboxError("stdin is not supported for images without python3")
        argv = normalize_cmd(cmd)
        if timeout:
            argv = ["timeout", "-s", "KILL", str(timeout), *argv]
        t0 = time.monotonic()
        c = await self.backend.sdk_call(self.backend.container, self.handle)
        r = await self.backend.sdk_call(
            c.exec_run,
            argv,
            environment=merged_env(self.handle, env),
            workdir=cwd or self.handle.workdir,
            demux=True,
        )
        out, err = r.output if r.output else (b"", b"")
        out, err = out or b"", err or b""
        for kind, data in (("stdout", out), ("stderr", err)):
            if data and on_output is not None:
                m = on_output(OutputChunk(stream=kind, data=data))  # type: ignore[arg-type]
                if asyncio.iscoroutine(m):
                    await m
        dur = time.monotonic() - t0
        timed_out = bool(timeout) and r.exit_code == 137 and dur >= timeout
        return ExecResult(
            exit_code=r.exit_code,
            stdout=out[:max_output_bytes].decode(errors="replace"),
            stderr=err[:max_output_bytes].decode(errors="replace"),
            timed_out=timed_out,
            oom_killed=(r.exit_code == 137 and not timed_out)
            and await self.backend.oom_killed(self.handle),
            duration_s=round(dur, 4),
            truncated=len(out) > max_output_bytes or len(err) > max_output_bytes,
        )

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        c = await self.backend.sdk_call(self.backend.container, self.handle)
        await self.backend.sdk_call(c.exec_run, ["mkdir", "-p", dest_dir])
        ok = await self.backend.sdk_call(c.put_archive, dest_dir, tar_bytes)
        if not ok:
            raise SandboxError(f"put_archive({dest_dir}) failed")

    async def get_archive(self, path: str, *, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> bytes:
        import docker.errors

        c = await self.backend.sdk_call(self.backend.container, self.handle)
        try:
            stream, _ = await self.backend.sdk_call(c.get_archive, path, chunk_size=256 * 1024)
        except docker.errors.NotFound as e:
            raise SandboxNotFound(f"{path}: no such file in the sandbox") from e

        def read_capped() -> bytes:
            buf = bytearray()
            try:
                for chunk in stream:
                    buf += chunk
                    if len(buf) > max_bytes:
                        raise ArchiveTooLarge(path, max_bytes, len(buf))
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
            return bytes(buf)

        return await self.backend.sdk_call(read_capped)

    async def kill_all_processes(self) -> None:
        c = await self.backend.sdk_call(self.backend.container, self.handle)
        await self.backend.sdk_call(c.restart, timeout=0)


def _task_dirs_tar(user: str) -> bytes:
    """A tar of the empty `TASK_DIRS` (with the log subdirs), owned by `user` (uid:gid)."""
    uid, gid = (int(x) for x in user.split(":"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for target in TASK_DIRS.values():
            top = target.strip("/")
            subs = [top, *(f"{top}/{s}" for s in EVAL_LOG_SUBDIRS)] if target == LOGS_DIR else [top]
            for name in subs:
                ti = tarfile.TarInfo(name)
                ti.type, ti.mode, ti.uid, ti.gid = tarfile.DIRTYPE, 0o755, uid, gid
                ti.mtime = int(time.time())
                tf.addfile(ti)
    return buf.getvalue()


def open_run_dir(run: Path, user: str) -> None:
    """Let the container user (and us) alone write a new run dir until its supervisor
    has bound its control socket there; nobody else on the host may enter it.

    As root we give it to the container user. Otherwise it stays ours, 2770: the
    container gets our group (`run_dir_groups`) and what it creates there inherits
    that group, so we reach its control socket (0660). Never world-writable, where any
    host user could plant a control socket of their own.
    """
    if os.geteuid() == 0:
        uid, gid = (int(x) for x in user.split(":"))
        os.chown(run, uid, gid)
        os.chmod(run, 0o700)
    else:
        os.chmod(run, 0o2770)


def run_dir_groups() -> dict[str, Any]:
    """The container options `open_run_dir` relies on: a non-root worker's group."""
    return {} if os.geteuid() == 0 else {"group_add": [str(os.getegid())]}


def seal_run_dir(run: Path, user: str) -> None:
    """Once the supervisor is ready: ours, 0750. The container still reaches the
    Gateway socket (traverse + connect) but can no longer create, replace or plant
    anything in the dir the host acts in."""
    if os.geteuid() == 0:
        os.chown(run, 0, int(user.split(":")[1]))
    os.chmod(run, 0o750)


class DockerBackend(SupervisedBackend[DockerSandbox]):
    """Docker containers on the local engine (the worker's host).

    Network: ``none`` for no-network and allowlist (relays, `egress_relay`;
    `egress_hosts` pins names to addresses); for `public`, only with
    `allow_public_network` (or ``ROLLOUT_ALLOW_PUBLIC_NETWORK=1``), a bridge network of
    the sandbox's own that reaches neither other sandboxes nor this host
    (`docker_network`), removed with the container.
    """

    name = "docker"
    host_local = True
    runs_local_images = True
    runs_image_rootfs = False
    egress_relays = True
    id_prefix = "dsb-"

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        pool_size: int = 0,
        state_dir: str | os.PathLike[str] | None = None,
        user: str = "1000:1000",
        ready_timeout: float = 60.0,
        max_workers: int = 32,
        client: Any = None,
        allow_public_network: bool | None = None,
        egress_hosts: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            Path(state_dir) if state_dir else state_root("docker"),
            pool_size,
            allow_public_network=allow_public_network,
            egress_hosts=egress_hosts,
        )
        self.image = image
        self.user = user
        self.ready_timeout = ready_timeout
        self.state_key = hashlib.sha256(str(self.state.resolve()).encode()).hexdigest()[:16]
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="docker-sdk")
        self._client = client
        self._image_ids: dict[str, tuple[str, bool]] = {}
        self._workdir_ok: dict[tuple[str, str], bool] = {}
        self._empty_dirs: dict[tuple[str, str], bool] = {}
        self._storage_opt: bool | None = None

    # ----------------------------------------------------------------- plumbing
    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import docker

                self._client = docker.from_env(max_pool_size=64)
                self._client.ping()
            except Exception as e:
                self._client = None
                raise BackendUnavailable(f"{INSTALL_HINT} ({e})") from e
        return self._client

    def _require_runtime(self) -> None:
        _ = self.client  # fails with the install hint

    async def sdk_call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a blocking docker SDK call on this backend's thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kw))

    def container(self, handle: SandboxHandle) -> Any:
        """The SDK container object of a sandbox (blocking)."""
        import docker.errors

        try:
            return self.client.containers.get(handle.details.get("container_id") or "")
        except docker.errors.NotFound as e:
            raise SandboxNotFound(f"container for {handle.sandbox_id} is gone") from e

    def _image_info(self, image: str) -> tuple[str, bool]:
        """(image id, has python3) — cached per process."""
        if image not in self._image_ids:
            import docker.errors

            try:
                img = self.client.images.get(image)
            except docker.errors.ImageNotFound as e:
                raise SandboxError(
                    f"docker image {image} not found (no registry access here): build it, "
                    "e.g. scripts/build_base_image.sh"
                ) from e
            has_py = True
            if img.labels.get("agentic-rollout.recipe-hash") is None:
                has_py = bool(self._probe(img.id, "command -v python3 || true"))
            self._image_ids[image] = (img.id, has_py)
        return self._image_ids[image]

    def _probe(self, image_id: str, script: str, user: str | None = None) -> bytes:
        """The stripped output of `sh -c script` in a throw-away, network-less container of
        the image: how the backend learns what an image holds before it relies on it."""
        kw = {} if user is None else {"user": user}
        out = self.client.containers.run(
            image_id, ["sh", "-c", script], remove=True, network_mode="none", entrypoint=[], **kw
        )
        return bytes(out).strip()

    def _workdir_writable(self, image_id: str, workdir: str) -> bool:
        """Whether `workdir` exists and is writable by the agent user (cached)."""
        k = (image_id, workdir)
        if k not in self._workdir_ok:
            script = f'test -d "{workdir}" && test -w "{workdir}" && echo yes || true'
            self._workdir_ok[k] = self._probe(image_id, script, user=self.user) == b"yes"
        return self._workdir_ok[k]

    def _key(self, spec: SandboxSpec) -> Hashable:
        res, net = spec.resources.model_dump_json(), policy_key(spec.network)
        return (spec.image or self.image, spec.workdir, res, net)

    def _blank_spec(self, key: Hashable) -> SandboxSpec:
        image, workdir, res_json, net_json = key  # type: ignore[misc]
        res = ResourceLimits.model_validate_json(res_json)
        net = NetworkPolicy.model_validate_json(net_json)
        return SandboxSpec(rollout_id="", image=image, workdir=workdir, resources=res, network=net)

    def _sandbox(self, handle: SandboxHandle) -> DockerSandbox:
        supervised = handle.details.get("exec") == "supervisor"
        return (DockerSandbox if supervised else _SdkExecSandbox)(self, handle)

    # ----------------------------------------------------------------- lifecycle
    def _create_container(
        self,
        sid: str,
        sdir: Path,
        image: str,
        workdir: str,
        r: ResourceLimits,
        rid: str,
        network: NetworkPolicy,
    ) -> tuple[Any, str, bool]:
        import docker.types

        iid, has_py = self._image_info(image)
        labels = {
            MANAGED_LABEL: "1",
            SANDBOX_ID_LABEL: sid,
            ROLLOUT_LABEL: rid,
            POOL_LABEL: "0" if rid else "1",
            OWNER_LABEL: owner_token(),
            STATE_LABEL: self.state_key,
        }
        public = network.effective_mode() == "public"
        kw: dict[str, Any] = {
            "name": f"ar-{sid}",
            "labels": labels,
            "network_mode": create_network(self.client, sid, labels) if public else "none",
            "user": self.user,
            "working_dir": workdir,
            "init": True,
            "detach": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "environment": {"HOME": AGENT_HOME, "LANG": "C.UTF-8"},
            "hostname": "sandbox",
            "mounts": [
                docker.types.Mount(RUN_DIR, str(sdir / "run"), type="bind"),
                docker.types.Mount(
                    SUPERVISOR_IN_SANDBOX, str(SUPERVISOR_PATH), type="bind", read_only=True
                ),
            ],
        }
        kw.update(run_dir_groups())
        routes = egress_routes(network)
        if routes:
            kw["extra_hosts"] = inside_names(routes)
            # The supervisor (no capabilities) binds the relays, 80 and 443 included;
            # docker's default since 20.10, set here for engines that lack it.
            kw["sysctls"] = {"net.ipv4.ip_unprivileged_port_start": "0"}
        if r.memory_mb:
            kw["mem_limit"] = f"{r.memory_mb}m"
            kw["memswap_limit"] = f"{r.memory_mb}m"
        if r.cpus:
            kw["nano_cpus"] = int(r.cpus * 1e9)
        if r.pids:
            kw["pids_limit"] = r.pids
        ul = []
        if r.nofile:
            ul.append(docker.types.Ulimit(name="nofile", soft=r.nofile, hard=r.nofile))
        kw["ulimits"] = ul
        if has_py:
            cmd = [*SUPERVISOR_ARGV, "--run-dir", RUN_DIR, "--own-pid-namespace"]
            cmd += ["--forward", f"{DEFAULT_GATEWAY_PORT}:{RUN_DIR}/gateway.sock"]
            cmd += forward_args(routes, RUN_DIR)
        elif routes:
            raise NetworkPolicyRefused(
                f"network mode 'allowlist' needs python3 in image {image} (its relays run "
                "in the sandbox's supervisor)"
            )
        else:
            cmd = ["sh", "-c", "while :; do sleep 3600; done"]
        writable = self._workdir_writable(iid, workdir)
        if r.disk_mb:
            self._limit_disk(kw, sdir, image, iid, workdir, r.disk_mb, writable)
        elif not writable:
            # The image lacks a workdir writable by the agent user: give it a host dir.
            (sdir / "work").mkdir(exist_ok=True)
            uid, gid = (int(x) for x in self.user.split(":"))
            if os.geteuid() == 0:
                os.chown(sdir / "work", uid, gid)
            kw["mounts"].append(docker.types.Mount(workdir, str(sdir / "work"), type="bind"))
        c = self.client.containers.run(iid, cmd, entrypoint=[], **kw)
        # A writable root (inside storage_opt's quota, if any): the engine makes the task
        # dirs there as the agent user's (the agent cannot create dirs in /).
        if not kw.get("read_only") and not c.put_archive("/", _task_dirs_tar(self.user)):
            raise SandboxError(f"could not create {sorted(TASK_DIRS.values())} in {iid}")
        return c, iid, has_py

    def _limit_disk(
        self,
        kw: dict[str, Any],
        sdir: Path,
        image: str,
        iid: str,
        workdir: str,
        disk_mb: int,
        workdir_writable: bool,
    ) -> None:
        """Make ``disk_mb`` real: the storage driver's quota (``storage_opt``) where it
        has one, else a read-only root whose writable dirs (workdir, home, /tmp, /tests,
        /logs) are one sized filesystem (`disk.py`). Raises `DiskLimitUnavailable` where
        neither works."""
        import docker.types

        if workdir_writable and self._storage_opt_supported(iid):
            kw["storage_opt"] = {"size": f"{disk_mb}M"}
            return
        if not self._dir_empty(iid, workdir):
            raise DiskLimitUnavailable(
                f"resources.disk_mb={disk_mb}: this engine's storage driver has no quota, "
                f"so the container's root is read-only with a sized disk mounted at "
                f"{workdir}, which would hide the files image {image} has there; move "
                "them out of the workdir, or set disk_mb to null (no disk limit)"
            )
        uid = int(self.user.split(":")[0])
        disk = make_disk(sdir, disk_mb, uid)
        kw["read_only"] = True
        for sub, target in (("home", AGENT_HOME), ("tmp", "/tmp"), ("work", workdir)):
            if sub == "work" and workdir.rstrip("/") in (AGENT_HOME, "/tmp"):
                continue
            kw["mounts"].append(docker.types.Mount(target, str(disk / sub), type="bind"))
        for host_dir, target in make_task_dirs(disk, uid).items():
            kw["mounts"].append(docker.types.Mount(target, str(host_dir), type="bind"))

    def _storage_opt_supported(self, image_id: str) -> bool:
        """Whether the storage driver enforces ``storage_opt`` size (probed once)."""
        import docker.errors

        if self._storage_opt is None:
            try:
                c = self.client.containers.create(
                    image_id, ["true"], entrypoint=[], network_mode="none",
                    storage_opt={"size": "64M"},
                )  # fmt: skip
            except docker.errors.APIError:
                # e.g. "--storage-opt is supported only for overlay over xfs with
                # 'pquota' mount option".
                self._storage_opt = False
            else:
                c.remove(force=True)
                self._storage_opt = True
        return self._storage_opt

    def _dir_empty(self, image_id: str, path: str) -> bool:
        """Whether `path` is missing or empty in the image (cached)."""
        k = (image_id, path)
        if k not in self._empty_dirs:
            script = f'ls -A "{path}" 2>/dev/null | head -c 1'
            self._empty_dirs[k] = not self._probe(image_id, script)
        return self._empty_dirs[k]

    async def _start(self, sid: str, sdir: Path, spec: SandboxSpec) -> SandboxHandle:
        """Run the container; a cold one carries its rollout id label directly."""
        image, rid = spec.image or self.image, spec.rollout_id
        (sdir / "run").mkdir()
        open_run_dir(sdir / "run", self.user)
        container, iid, has_py = await self.sdk_call(
            self._create_container,
            sid,
            sdir,
            image,
            spec.workdir,
            spec.resources,
            rid,
            spec.network,
        )
        try:
            if has_py:
                await wait_ready(sdir / "run", self.ready_timeout)
                secure_control_socket(sdir)
            seal_run_dir(sdir / "run", self.user)
        except SandboxError as e:
            logs = b""
            with contextlib.suppress(Exception):
                logs = await self.sdk_call(lambda: container.logs(tail=20))
            raise SandboxError(f"{e}; container log: {logs[-1500:]!r}") from e
        attrs = await self.sdk_call(lambda: self.client.api.inspect_container(container.id))
        pid = attrs["State"]["Pid"]
        r = spec.resources
        problems = limit_problems(pid, container.id, r.memory_mb, r.pids, r.cpus) if pid else None
        if problems:
            raise CgroupLimitError(
                f"docker did not apply the requested limits to {container.id[:12]}: "
                + "; ".join(problems)
            )
        return SandboxHandle(
            backend=self.name,
            sandbox_id=sid,
            rollout_id=rid,
            env_version=iid,
            system="image",
            workdir=spec.workdir,
            details={
                "state_dir": str(sdir),
                "container_id": container.id,
                "container_name": f"ar-{sid}",
                "image": image,
                "init_pid": pid,
                "memory_cgroup": memory_cgroup_of_pid(pid) if pid else None,
                "owner": owner_token(),
                "exec": "supervisor" if has_py else "docker-exec",
                "disk": None
                if not r.disk_mb
                else (f"ext4:{r.disk_mb}MiB" if (sdir / DISK_DIR).is_dir() else "storage-opt"),
            },
        )

    async def _before_bind(self, sb: DockerSandbox, spec: SandboxSpec, pooled: bool) -> None:
        wants_gateway = spec.gateway is not None and spec.gateway.target
        if wants_gateway and sb.handle.details.get("exec") != "supervisor":
            raise SandboxError("the Gateway channel needs python3 in the image")
        if pooled:
            # Labels are immutable: make the rollout id visible in `docker ps` by name.
            name = f"ar-{_slug(spec.rollout_id)}-{sb.handle.sandbox_id[4:]}"
            cid = sb.handle.details["container_id"]
            fut = asyncio.get_running_loop().run_in_executor(
                self._executor, self._rename_quiet, cid, name
            )
            fut.add_done_callback(lambda f: f.exception())

    def _rename_quiet(self, cid: str, name: str) -> None:
        with contextlib.suppress(Exception):
            self.client.api.rename(cid, name)

    async def _stop(self, handle: SandboxHandle) -> None:
        cid = handle.details.get("container_id")
        await self.sdk_call(self._remove_container, handle.sandbox_id, cid)

    def _remove_container(self, sid: str, cid: str | None) -> None:
        """Remove the sandbox's container, then its network (public mode) if any."""
        import docker.errors

        ids = {cid} if cid else set()
        if not cid:
            for c in self.client.api.containers(
                all=True, filters={"label": f"{SANDBOX_ID_LABEL}={sid}"}
            ):
                ids.add(c["Id"])
        for i in ids:
            with contextlib.suppress(docker.errors.NotFound):
                try:
                    self.client.api.remove_container(i, force=True, v=True)
                except docker.errors.APIError as e:
                    if "already in progress" not in str(e):
                        raise
        remove_network(self.client, sid)

    async def oom_killed(self, handle: SandboxHandle) -> bool:
        """Ask the engine whether the container was OOM-killed (no readable cgroup)."""
        try:
            attrs = await self.sdk_call(
                self.client.api.inspect_container, handle.details["container_id"]
            )
        except Exception:
            return False
        return bool(attrs.get("State", {}).get("OOMKilled"))

    async def list(self) -> list[SandboxHandle]:
        # One list call (the high-level list() inspects each container and races
        # with concurrent removals).
        containers = await self.sdk_call(
            self.client.api.containers,
            all=True,
            filters={"label": [MANAGED_LABEL, f"{STATE_LABEL}={self.state_key}"]},
        )
        out: dict[str, SandboxHandle] = {}
        for c in containers:
            labels = c.get("Labels") or {}
            sid = labels.get(SANDBOX_ID_LABEL, "")
            if not self._id_re.match(sid):
                continue
            # A pooled container's rollout id is only in its handle.json (labels are
            # immutable); a cold one's is in its label too.
            h = self._handle_from_state(sid, labels.get(ROLLOUT_LABEL, ""))
            h.details["container_id"] = c["Id"]
            h.details.setdefault("owner", labels.get(OWNER_LABEL, ""))
            out[sid] = h
        for h in self._recorded_sandboxes():
            if h.sandbox_id not in out:
                # State dir without a container (crash between the two): orphan.
                h.details["orphan_state_dir"] = True
                out[h.sandbox_id] = h
        networks = await self.sdk_call(
            self.client.api.networks, filters={"label": [f"{STATE_LABEL}={self.state_key}"]}
        )
        for n in networks:
            sid = n["Name"].removeprefix(NETWORK_PREFIX)
            if self._id_re.match(sid) and sid not in out:
                # A public sandbox's network left behind by a crash after its container
                # and state dir went: reaped once the process that made it is gone.
                owner = (n.get("Labels") or {}).get(OWNER_LABEL, "")
                h = self._handle_from_state(sid)
                h.details.update(owner=owner, orphan_network=n["Name"])
                out[sid] = h
        return list(out.values())

    async def close(self) -> None:
        await super().close()
        self._executor.shutdown(wait=False)
