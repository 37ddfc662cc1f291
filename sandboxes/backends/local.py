"""Local backend: one bubblewrap sandbox per rollout, the embedded default.

Isolation: new user/pid/net/ipc/uts/cgroup namespaces (the net namespace has only
``lo``: no route out; an allowlisted host is reached through a relay, `egress_relay`),
read-only system dirs, private writable workdir/home/tmp/run dirs and task dirs
(``/tests``, ``/logs``: `supervised.TASK_DIRS`) from a per-sandbox host state dir, all
capabilities dropped, no nested user namespaces, a seccomp filter (`seccomp.py`).
Limits: cgroups (memory → kernel OOM kill reported as ``oom_killed``, pids, cpu); a
limit that cannot be applied fails the provision, and without cgroups (not root) the
backend refuses to start unless ``allow_no_cgroups`` (then rlimits: RLIMIT_AS for
memory, allocations fail instead of an OOM kill). ``disk_mb``: workdir, home, /tmp and
the task dirs live on one sized filesystem (`disk.py`). Open files via rlimits. As root
the sandbox runs as an unprivileged host uid (`sandbox_uid`), so even the host-fallback
system dirs expose nothing root-only.

System dirs: the exported rootfs of the Docker base image when it has been exported
(``scripts/build_base_image.sh`` does it), so the agent sees the same system as
under Docker (``handle.system == "image-rootfs"``, ``env_version`` = image id);
otherwise the host's /usr, /etc… read-only (``"host-readonly"``).

Processes: a long-lived in-sandbox supervisor (`supervisor.py`) runs commands and
moves files over a Unix socket in the state dir. State (handle.json, pids.json,
owner) lives in ``<state>/local/<sandbox_id>/`` so the reaper can find and destroy
sandboxes left by a crashed worker. Create, the warm pool, attach, destroy and reap
are shared with the docker backend (`supervised`); this module says how a bubblewrap
sandbox starts, stops and is listed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from sandboxes.base import (
    DEFAULT_GATEWAY_PORT,
    BackendUnavailable,
    NetworkPolicy,
    NetworkPolicyRefused,
    ResourceLimits,
    SandboxError,
    SandboxHandle,
    SandboxSpec,
)
from sandboxes.host.state import owner_token, pid_alive, proc_start_time, state_root
from sandboxes.image.base_image import rootfs_dir_for, rootfs_image_id, rootfs_ref_file
from sandboxes.isolation.cgroups import (
    ROOT as CGROUP_ROOT,
)
from sandboxes.isolation.cgroups import (
    cgroup_mode,
    create_cgroups,
    kill_cgroup_procs,
    remove_cgroups,
)
from sandboxes.isolation.disk import make_disk
from sandboxes.isolation.seccomp import SeccompUnavailable, sandbox_filter_bpf
from sandboxes.network.egress_relay import EgressRoute, egress_routes, hosts_file, policy_key
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
    SupervisorClient,
    control_socket_path,
    secure_control_socket,
    wait_ready,
)
from sandboxes.workspace.provisioning import SANDBOX_PATH

INSTALL_HINT = (
    "bubblewrap is required for the local sandbox backend: run "
    "scripts/install_local_deps.sh (apt-get install bubblewrap)"
)
INNER_UID = 1000
log = logging.getLogger(__name__)
_HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
_SKIP_TOP = {"proc", "dev", "sys", "tmp", "run", "home", "mnt", "media", "lost+found"}


def lookup_rootfs(image: str) -> tuple[Path, str] | None:
    """Exported rootfs dir + image id for `image`, if it was exported on this host."""
    ref_file = rootfs_ref_file(image)
    iid = ref_file.read_text().strip() if ref_file.exists() else None
    if not iid and shutil.which("docker"):
        r = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}}", image],
            capture_output=True,
            text=True,
        )
        iid = r.stdout.strip() if r.returncode == 0 else None
    if not iid:
        return None
    d = rootfs_dir_for(iid)
    if (d / ".complete").exists():
        return d, iid
    return None


def host_env_version() -> str:
    """Identity of the host system used as read-only rootfs (for lineage)."""
    h = hashlib.sha256()
    for f in ("/etc/os-release", "/etc/debian_version"):
        with contextlib.suppress(OSError):
            h.update(Path(f).read_bytes())
    h.update(os.uname().release.encode())
    return "host:" + h.hexdigest()[:16]


class LocalSandbox(SupervisedSandbox):
    _backend: LocalBackend

    @property
    def backend(self) -> LocalBackend:
        return self._backend

    def _memory_cgroups(self) -> list[str]:
        return list(self.handle.details.get("cgroups") or [])


class LocalBackend(SupervisedBackend[LocalSandbox]):
    """Bubblewrap sandboxes on this host.

    `rootfs`: "auto" (exported image rootfs if present, else host dirs), a directory,
    or None (always the host's read-only system dirs). `pool_size` > 0 keeps that many
    blank sandboxes per (system, resources, workdir) ready for `create`.
    `allow_no_cgroups`: run without cgroups (rlimits only) where this process cannot
    manage them, instead of refusing to start; `cgroup_root` is where they are mounted.
    `egress_hosts`: allowlisted names pinned to an address (`egress_relay`);
    `allow_public_network` is accepted like on every backend, but public network is
    never given here (`public_refusal`).
    """

    name = "local"
    host_local = True
    runs_local_images = True
    runs_image_rootfs = True
    egress_relays = True
    id_prefix = "lsb-"
    public_refusal = (
        "a bubblewrap sandbox could only share the host's network namespace, host "
        "loopback services included (no user-mode network stack here); run tasks that "
        "need public network on the docker backend"
    )

    def __init__(
        self,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        rootfs: str | None = "auto",
        image: str = DEFAULT_IMAGE,
        sandbox_uid: int = 61000,
        pool_size: int = 0,
        bwrap: str = "bwrap",
        ready_timeout: float = 30.0,
        use_cgroups: bool = True,
        allow_no_cgroups: bool = False,
        cgroup_root: str | os.PathLike[str] = CGROUP_ROOT,
        allow_public_network: bool | None = None,
        egress_hosts: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            Path(state_dir) if state_dir else state_root("local"),
            pool_size,
            allow_public_network=allow_public_network,
            egress_hosts=egress_hosts,
        )
        self.rootfs = rootfs
        self.image = image
        self.is_root = os.geteuid() == 0
        self.sandbox_uid = sandbox_uid if self.is_root else os.getuid()
        self.bwrap = shutil.which(bwrap)
        self.ready_timeout = ready_timeout
        self.cgroup_root = Path(cgroup_root)
        self.cgroup_mode = cgroup_mode(self.cgroup_root) if use_cgroups else None
        if self.cgroup_mode is None:
            why = (
                "disabled (use_cgroups=False)"
                if not use_cgroups
                else f"not manageable by this process (uid {os.geteuid()}, {self.cgroup_root})"
            )
            if not allow_no_cgroups:
                raise BackendUnavailable(
                    f"local sandbox backend: cgroups are {why}, so memory/pids/cpu limits "
                    "cannot be enforced; run the worker as root on a host with cgroups, "
                    "or set allow_no_cgroups: true to run with rlimits only"
                )
            log.warning(
                "LOCAL SANDBOXES RUN WITHOUT CGROUPS (%s; allow_no_cgroups=true): memory is "
                "only an address-space rlimit (no OOM kill), cpu is not limited, pids only "
                "per user",
                why,
            )
        if self.is_root:
            _check_traversable(self.state)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._system_cache: dict[str, tuple[str | None, str, str]] = {}

    # ----------------------------------------------------------------- helpers
    def _require_runtime(self) -> None:
        if not self.bwrap:
            raise BackendUnavailable(INSTALL_HINT)
        try:
            sandbox_filter_bpf()
        except SeccompUnavailable as e:
            raise BackendUnavailable(str(e)) from e

    def _system(self, spec: SandboxSpec) -> tuple[str | None, str, str]:
        """(rootfs dir or None for host dirs, env_version, system kind)."""
        if spec.rootfs:
            p = Path(spec.rootfs)
            if not (p / "usr").is_dir():
                raise SandboxError(f"rootfs {p} has no /usr")
            iid = rootfs_image_id(p) or "rootfs:" + hashlib.sha256(str(p).encode()).hexdigest()
            return str(p), iid, "image-rootfs"
        image = spec.image or self.image
        if self.rootfs is None:
            return None, host_env_version(), "host-readonly"
        if self.rootfs != "auto":
            return self._system(spec.model_copy(update={"rootfs": self.rootfs}))
        if image not in self._system_cache:
            found = lookup_rootfs(image)
            if found:
                self._system_cache[image] = (str(found[0]), found[1], "image-rootfs")
            else:
                self._system_cache[image] = (None, host_env_version(), "host-readonly")
        return self._system_cache[image]

    def _key(self, spec: SandboxSpec) -> Hashable:
        rootfs, _, _ = self._system(spec)
        net = policy_key(spec.network)
        return (rootfs, spec.workdir, spec.resources.model_dump_json(), net)

    def _blank_spec(self, key: Hashable) -> SandboxSpec:
        rootfs, workdir, res_json, net_json = key  # type: ignore[misc]
        res = ResourceLimits.model_validate_json(res_json)
        net = NetworkPolicy.model_validate_json(net_json)
        return SandboxSpec(
            rollout_id="", workdir=workdir, resources=res, rootfs=rootfs, network=net
        )

    def _sandbox(self, handle: SandboxHandle) -> LocalSandbox:
        return LocalSandbox(self, handle)

    def _blank_usable(self, sb: LocalSandbox) -> bool:
        return pid_alive(sb.handle.details.get("bwrap_pid"))

    def _bwrap_args(
        self,
        rootfs: str | None,
        sdir: Path,
        workdir: str,
        info_fd: int,
        seccomp_fd: int,
        rw: Path,
        routes: Sequence[EgressRoute] = (),
    ) -> list[str]:
        """bwrap's argv; `rw` holds the writable tmp/home/work and task dirs (the sized
        disk when ``disk_mb`` is set, else the state dir); `routes`: the allowlist's relays
        (their names in a generated /etc/hosts; `_serve_routes` starts their listeners)."""
        src = Path(rootfs) if rootfs else Path("/")
        top = workdir.strip("/").split("/")[0]
        args = [
            str(self.bwrap),
            "--unshare-user",
            "--uid",
            str(INNER_UID),
            "--gid",
            str(INNER_UID),
            "--disable-userns",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--info-fd",
            str(info_fd),
            "--seccomp",
            str(seccomp_fd),
        ]
        names = sorted(os.listdir(src)) if rootfs else list(_HOST_SYSTEM_DIRS)
        nested = workdir.strip("/") != top
        for name in names:
            if name in _SKIP_TOP or name.startswith(".") or (name == top and not nested):
                continue
            if name in TASK_DIRS:
                continue  # ours, writable (below): whatever the image has there is hidden
            p = src / name
            if p.is_symlink():
                args += ["--symlink", os.readlink(p), f"/{name}"]
            elif p.is_dir() or p.is_file():
                args += ["--ro-bind", str(p), f"/{name}"]
        if (
            nested
            and top not in _SKIP_TOP
            and top in names
            and not (src / workdir.lstrip("/")).is_dir()
        ):
            raise SandboxError(
                f"workdir {workdir} is inside read-only /{top}; use a top-level dir, "
                f"a dir under {AGENT_HOME} or under /tmp"
            )
        if routes:
            args += ["--ro-bind", str(self._hosts_file(src, sdir, routes)), "/etc/hosts"]
        # /dev read-only, as under docker (root's there): its /dev/fd, /dev/stdin... are
        # symlinks a process substitution or a `cat /dev/stdin` of a check resolves, so
        # the agent must not replace them. /dev/shm stays a writable tmpfs of its own.
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
        args += ["--remount-ro", "/dev", "--tmpfs", "/run"]
        args += ["--bind", str(rw / "tmp"), "/tmp"]
        args += ["--bind", str(rw / "home"), AGENT_HOME]
        args += ["--bind", str(sdir / "run"), RUN_DIR]
        for name, target in TASK_DIRS.items():
            args += ["--bind", str(rw / name), target]
        args += ["--ro-bind", str(SUPERVISOR_PATH), SUPERVISOR_IN_SANDBOX]
        if workdir.rstrip("/") not in ("/tmp", AGENT_HOME) and not workdir.startswith(
            ("/tmp/", AGENT_HOME)
        ):
            args += ["--bind", str(rw / "work"), workdir]
        else:
            args += ["--dir", workdir]
        args += ["--chdir", workdir, "--", *SUPERVISOR_ARGV, "--run-dir", RUN_DIR]
        args += ["--forward", f"{DEFAULT_GATEWAY_PORT}:{RUN_DIR}/gateway.sock"]
        return [*args, "--own-pid-namespace"]

    @staticmethod
    def _hosts_file(src: Path, sdir: Path, routes: Sequence[EgressRoute]) -> Path:
        """The system's /etc/hosts plus the allowlisted names, bound over the original."""
        image_hosts = src / "etc" / "hosts"
        if not image_hosts.is_file():
            raise NetworkPolicyRefused(
                f"network mode 'allowlist' needs an /etc/hosts in the sandbox's system "
                f"({image_hosts} is missing) to name the allowed hosts"
            )
        out = sdir / "hosts"
        out.write_text(hosts_file(image_hosts.read_text(errors="replace"), routes))
        out.chmod(0o644)
        return out

    # ----------------------------------------------------------------- lifecycle
    async def _start(self, sid: str, sdir: Path, spec: SandboxSpec) -> SandboxHandle:
        rootfs, env_version, system = self._system(spec)
        if rootfs is None and not Path("/usr/bin/python3").exists():
            raise BackendUnavailable(
                "local backend without an exported rootfs needs /usr/bin/python3 on the host "
                "(or run scripts/build_base_image.sh to export the image rootfs)"
            )
        r = spec.resources
        owner = self.sandbox_uid if self.is_root else None
        if r.disk_mb:
            rw = await asyncio.to_thread(make_disk, sdir, r.disk_mb, owner)
            (sdir / "run").mkdir()
            if owner is not None:
                os.chown(sdir / "run", owner, owner)
        else:
            rw = sdir
            for sub in ("tmp", "home", "run", "work"):
                (sdir / sub).mkdir()
                if owner is not None:
                    os.chown(sdir / sub, owner, owner)
        os.chmod(rw / "tmp", 0o1777 if not self.is_root else 0o700)
        make_task_dirs(rw, owner)
        cg: list[str] = []
        if self.cgroup_mode:
            cg = await asyncio.to_thread(
                create_cgroups, sid, r.memory_mb, r.pids, r.cpus, self.cgroup_root
            )
        info_r, info_w = os.pipe()
        # The compiled filter goes through a pipe (a few hundred bytes: fits its buffer).
        sc_r, sc_w = os.pipe()
        os.write(sc_w, sandbox_filter_bpf())
        os.close(sc_w)
        try:
            routes = egress_routes(spec.network)
            args = self._bwrap_args(rootfs, sdir, spec.workdir, info_w, sc_r, rw, routes)
            limits = []
            if r.nofile:
                limits.append(f"--nofile={r.nofile}:{r.nofile}")
            if r.memory_mb and not cg:
                # No memory cgroup: address-space cap (allocations fail, no OOM kill).
                b = r.memory_mb * 1024 * 1024 * 2
                limits.append(f"--as={b}:{b}")
            if r.pids and not cg and not self.is_root:
                limits.append(f"--nproc={r.pids * 4}:{r.pids * 4}")
            cmd = ["prlimit", *limits, "--", *args] if limits else args
            if self.is_root:
                u = str(self.sandbox_uid)
                cmd = ["setpriv", f"--reuid={u}", f"--regid={u}", "--clear-groups", "--", *cmd]
                # Join the cgroups *before* exec so every descendant is inside.
                shim = 'for d in $AR_CGROUPS; do echo $$ > "$d/cgroup.procs" || exit 97; done\n'
                cmd = ["/bin/sh", "-c", shim + 'exec "$@"', "sh", *cmd]
            env = {
                "PATH": SANDBOX_PATH,
                "HOME": AGENT_HOME,
                "LANG": "C.UTF-8",
                "AR_CGROUPS": " ".join(cg),
            }
            # The cgroups hold every process of the sandbox: recorded before it starts,
            # so a worker killed from here on leaves nothing the reaper cannot kill.
            (sdir / "pids.json").write_text(json.dumps({"cgroups": cg}))
            log = open(sdir / "bwrap.log", "wb")  # noqa: SIM115
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    pass_fds=(info_w, sc_r),
                    start_new_session=True,
                )
            finally:
                log.close()
            os.close(info_w)
            info_w = -1
            self._procs[sid] = proc
            # ... and bwrap's pid before waiting for its report (rlimit-only hosts).
            started = {"bwrap_pid": proc.pid, "bwrap_start": proc_start_time(proc.pid)}
            (sdir / "pids.json").write_text(json.dumps({**started, "cgroups": cg}))
            info = await asyncio.to_thread(_read_all, info_r)
            child = json.loads(info).get("child-pid") if info.strip() else None
            pids = {
                **started,
                "child_pid": child,
                "child_start": proc_start_time(child) if child else None,
                "cgroups": cg,
            }
            (sdir / "pids.json").write_text(json.dumps(pids))
            try:
                await wait_ready(
                    sdir / "run", self.ready_timeout, alive=lambda: proc.poll() is None
                )
                secure_control_socket(sdir)
                await self._serve_routes(sdir, child, routes)
            except SandboxError as e:
                logtail = (sdir / "bwrap.log").read_text(errors="replace")[-2000:]
                raise SandboxError(f"{e}; bwrap said: {logtail}") from e
        finally:
            if info_w >= 0:
                os.close(info_w)
            os.close(info_r)
            os.close(sc_r)
        return SandboxHandle(
            backend=self.name,
            sandbox_id=sid,
            rollout_id="",
            env_version=env_version,
            system=system,
            workdir=spec.workdir,
            details={
                "state_dir": str(sdir),
                "rootfs": rootfs,
                "limits": self.cgroup_mode or "rlimit",
                "disk": f"ext4:{r.disk_mb}MiB" if r.disk_mb else None,
                "seccomp": True,
                "cgroups": cg,
                "bwrap_pid": proc.pid,
                "child_pid": child,
                "owner": owner_token(),
                "sandbox_uid": self.sandbox_uid,
            },
        )

    async def _serve_routes(
        self, sdir: Path, child: int | None, routes: Sequence[EgressRoute]
    ) -> None:
        """Start the supervisor's listeners for the allowlist, once ports below 1024
        were opened where one is needed (`open_low_ports`)."""
        if not routes:
            return
        if any(r.port < 1024 for r in routes):
            if not self.is_root or not child:
                raise NetworkPolicyRefused(
                    "allowlisted ports below 1024 on the local backend need the worker to "
                    "run as root (it opens them in the sandbox's network namespace); give "
                    "the entries a port of 1024 or above, or use the docker backend"
                )
            await asyncio.to_thread(open_low_ports, child)
        client = SupervisorClient(control_socket_path(sdir))
        for r in routes:
            await client.forward(r.port, f"{RUN_DIR}/{r.socket_name}", r.inside_addr)

    async def _stop(self, handle: SandboxHandle) -> None:
        sid = handle.sandbox_id
        await asyncio.to_thread(self._kill, sid, self._sdir(sid))

    def _kill(self, sid: str, sdir: Path) -> None:
        """Kill every process of a sandbox (cgroups, else its pid namespace's init)."""
        pids: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            pids = json.loads((sdir / "pids.json").read_text())
        cg = pids.get("cgroups") or []
        if cg:
            kill_cgroup_procs(cg)
        # Killing the namespace's init kills every process in the pid namespace.
        for p, s in ((pids.get("child_pid"), pids.get("child_start")),
                     (pids.get("bwrap_pid"), pids.get("bwrap_start"))):  # fmt: skip
            if p and pid_alive(p, s):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
        proc = self._procs.pop(sid, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        for p, s in ((pids.get("child_pid"), pids.get("child_start")),
                     (pids.get("bwrap_pid"), pids.get("bwrap_start"))):  # fmt: skip
            while p and pid_alive(p, s) and time.monotonic() < deadline:
                time.sleep(0.01)
        if cg:
            kill_cgroup_procs(cg, timeout=2)
            remove_cgroups(cg)

    async def list(self) -> list[SandboxHandle]:
        return self._recorded_sandboxes()


def open_low_ports(child_pid: int) -> None:
    """Let the sandbox user bind ports below 1024 in the sandbox's own network namespace
    (``ip_unprivileged_port_start=0`` there; its only network is ``lo``), so the
    supervisor can serve allowlisted hosts on 80 and 443. Written from the host: inside,
    the sandbox has no capability, and bubblewrap's nested user namespace
    (``--disable-userns``) would not count one for its network namespace anyway. Needs
    root (entering another network namespace)."""
    r = subprocess.run(
        ["nsenter", f"--net=/proc/{child_pid}/ns/net", "--", "/bin/sh", "-c",
         "echo 0 > /proc/sys/net/ipv4/ip_unprivileged_port_start"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    if r.returncode != 0:
        raise SandboxError(f"cannot open ports below 1024 in the sandbox: {r.stderr.strip()}")


def _check_traversable(p: Path) -> None:
    """bwrap runs as the unprivileged sandbox uid: it must reach the state dir."""
    for d in [p.resolve(), *p.resolve().parents]:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            raise SandboxError(
                f"local sandbox state dir {p} is not reachable by the sandbox uid: "
                f"{d} lacks o+x (use a state dir under a world-traversable path)"
            )


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        b = os.read(fd, 4096)
        if not b:
            break
        chunks.append(b)
    return b"".join(chunks).decode(errors="replace")
