"""E2B backend: cloud sandboxes through the `e2b` SDK (templates, commands, files).

Mapping: `SandboxSpec.image` → E2B template; `timeout_s` → the sandbox's own TTL
(E2B kills it even if every worker dies, so cleanup does not depend on us); rollout
id and labels → sandbox metadata (the reaper lists by it); exec → `commands.run`
in the background + wait, killed on timeout/cancel; files → tar uploaded/downloaded
with `files.write`/`files.read` and unpacked with `tar` in the sandbox.

Network: the sandbox is remote, so the Unix-socket Gateway channel does not apply;
the agent talks to `gateway.public_url` and outbound traffic is restricted to that
endpoint (`egress_policy`) plus the task's allowlisted names (`network_options`);
with neither, internet access is off. Network mode `public` turns it on, only with the
operator's permission.

Not available here: OOM reporting (E2B does not expose it; `oom_killed` stays
False) and per-sandbox memory/CPU caps (they are properties of the template).
E2B starts every command as ``bash -l -c``, a login shell that reads the profile files in
HOME; the backend's own commands (file moves, the kill) and the clean room's launcher
(`Sandbox.evaluator_exec`) run with ``NO_PROFILE_ENV`` so none of the agent's runs there.
A template whose user can become root (`sudo -n true` succeeds, as in E2B's default
template) is refused at create, before the agent, unless the task's sandbox says
`allow_root_escalation: true` (`RootEscalationRefused`): root in the sandbox reaches
everything the evaluation relies on. `kill_all_processes` is a best effort: a shell run
as the sandbox user kills every process it may signal except itself, its ancestors
(envd) and init, until none is left; it cannot reach processes of other users, and
unlike the supervised backends there is no pid namespace of our own that would make one
`kill(-1)` reach them all at once.
The E2B cloud cannot be reached from this workplace; see docs/sandboxes.md for what
was verified against a loopback stand-in of the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shlex
import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from sandboxes.base import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_OUTPUT_BYTES,
    MANAGED_LABEL,
    NO_PROFILE_ENV,
    ROLLOUT_LABEL,
    SYSTEM_TOOLS_ENV,
    ArchiveTooLarge,
    BackendUnavailable,
    Command,
    ExecResult,
    NetworkPolicyRefused,
    OutputCallback,
    OutputChunk,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxHandle,
    SandboxNotFound,
    SandboxSpec,
)
from sandboxes.network.egress_relay import check_policy, public_network_allowed
from sandboxes.workspace.provisioning import base_env, merged_env, populate
from schemas.environment import parse_allowed_host

INSTALL_HINT = "the e2b backend needs the `e2b` package (pip install e2b) and E2B_API_KEY"
HOME = "/home/user"

#: Kills every process this user may signal but itself, its ancestors and init, in
#: rounds until a round finds none alive (zombies are left to their reaper). Shell
#: builtins only inside the loops, so it never forks a child it would then kill.
_KILL_ALL_SH = r"""
keep=" 1 $$ "; p=$$
while [ "$p" -gt 1 ]; do
  read -r s 2>/dev/null </proc/$p/stat || break
  s=${s##*) }; set -- $s; p=$2; keep="$keep$p "
done
for round in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  n=0
  for d in /proc/[0-9]*; do
    q=${d#/proc/}
    case "$keep" in *" $q "*) continue ;; esac
    read -r s 2>/dev/null <$d/stat || continue
    s=${s##*) }
    case "$s" in Z*|X*) continue ;; esac
    kill -9 "$q" 2>/dev/null && n=$((n + 1))
  done
  [ "$n" -eq 0 ] && exit 0
  sleep 0.05
done
echo "processes survived SIGKILL" >&2
exit 1
"""


#: Says how the sandbox's user can become root: "root" (it is), "sudo" (without a
#: password), nothing when it cannot. Programs from the system dirs only.
_ROOT_CHECK_SH = (
    'if [ "$(id -u)" = 0 ]; then echo root; elif sudo -n true 2>/dev/null; then echo sudo; fi'
)
TASK_ID_LABEL = "agentic-rollout.task-id"


class RootEscalationRefused(SandboxError, ValueError):
    """The template lets the agent's user become root and the task did not opt in: the
    task's fault (a ValueError: refused, not retried), found before the agent runs."""


#: E2B's "all traffic" selector: deny everything that is not explicitly allowed.
ALL_TRAFFIC = "0.0.0.0/0"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def egress_policy(gateway_url: str) -> dict[str, Any]:
    """The E2B `network` option that lets a sandbox reach only the Gateway's agent endpoint.

    E2B's firewall has no port field: an IP or CIDR entry opens every port of that
    address, while a domain entry is matched by name only on port 80 (HTTP Host) and
    443 (TLS SNI) and nothing else. So the endpoint must be a DNS name on its scheme's
    default port; anything else would open the whole host and is refused. Everything
    not allowed is denied (an allow list alone does not restrict E2B's egress).
    """
    u = urlparse(gateway_url)
    host = (u.hostname or "").rstrip(".")
    why = ""
    try:
        port = u.port or _DEFAULT_PORTS.get(u.scheme)
    except ValueError:
        port, why = None, "its port is not a number"
    if not why and u.scheme not in _DEFAULT_PORTS:
        why = f"its scheme {u.scheme!r} is not http or https"
    elif not why and not host:
        why = "it has no host"
    elif not why and _is_ip(host):
        why = f"{host} is an IP address, and an IP entry opens every port of that host"
    elif not why and port != _DEFAULT_PORTS[u.scheme]:
        why = (
            f"port {port} is not {u.scheme}'s default ({_DEFAULT_PORTS[u.scheme]}); E2B "
            "filters a name only on 80/443, so any other port is reachable only by opening "
            "every port of the host"
        )
    if why:  # a deployment error no retry can fix: ValueError makes it non-retryable
        raise ValueError(
            f"e2b: cannot restrict egress to the Gateway at {gateway_url!r}: {why}. Serve the "
            "Gateway's agent endpoint under a DNS name on port 443 (https) or 80 (http)."
        )
    return {"allow_out": [host], "deny_out": [ALL_TRAFFIC]}


def network_options(spec: SandboxSpec, public_allowed: bool) -> dict[str, Any]:
    """The SDK's network arguments for the task's policy plus the Gateway endpoint.

    public (with the operator's permission): internet on, nothing filtered. allowlist:
    the Gateway's name (`egress_policy`) and the allowed names, everything else denied;
    E2B matches a name only on ports 80 and 443 (both, whichever the entry gives), so
    an entry on another port is refused. no-network: the Gateway only, else internet off.
    """
    policy = spec.network
    check_policy(policy, "e2b", public_allowed=public_allowed)
    if policy.effective_mode() == "public":
        return {"allow_internet_access": True}
    gw_url = spec.gateway.public_url if spec.gateway else None
    allow: list[str] = egress_policy(gw_url)["allow_out"] if gw_url else []
    if policy.effective_mode() == "allowlist":
        for entry in policy.allowed_hosts:
            host, port = parse_allowed_host(entry)
            if port not in (None, *_DEFAULT_PORTS.values()):
                raise NetworkPolicyRefused(
                    f"allowed host {entry!r} on the e2b backend: E2B's firewall matches a "
                    "name only on ports 80 and 443, so any other port cannot be allowed alone"
                )
            if host not in allow:
                allow.append(host)
    if not allow:
        return {"allow_internet_access": False}
    return {"network": {"allow_out": allow, "deny_out": [ALL_TRAFFIC]}}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _sdk() -> Any:
    try:
        import e2b
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise BackendUnavailable(INSTALL_HINT) from e
    return e2b


class E2BSandbox(Sandbox):
    def __init__(self, backend: E2BBackend, handle: SandboxHandle, sbx: Any) -> None:
        self._backend = backend
        self.handle = handle
        self._sbx = sbx

    @property
    def backend(self) -> E2BBackend:
        return self._backend

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
        e2b = _sdk()
        line = cmd if isinstance(cmd, str) else shlex.join([str(a) for a in cmd])
        if stdin is not None:
            # envd's stdin stream needs a second RPC per chunk; a here-file is simpler.
            tmp = f"/tmp/.stdin-{uuid.uuid4().hex}"
            await self._sbx.files.write(tmp, stdin, use_octet_stream=True)
            line = f"( {line} ) < {shlex.quote(tmp)}; __rc=$?; rm -f {shlex.quote(tmp)}; exit $__rc"
        out = {"stdout": bytearray(), "stderr": bytearray()}
        pending: list[Any] = []
        truncated = False

        def sink(kind: str) -> Any:
            def cb(text: str) -> None:
                nonlocal truncated
                data = text.encode()
                buf = out[kind]
                room = max_output_bytes - len(buf)
                if len(data) > room:
                    truncated = True
                if room > 0:
                    buf += data[:room]
                if on_output is not None:
                    r = on_output(OutputChunk(stream=kind, data=data))  # type: ignore[arg-type]
                    if asyncio.iscoroutine(r):
                        pending.append(asyncio.ensure_future(r))

            return cb

        t0 = time.monotonic()
        h = await self._sbx.commands.run(
            line,
            background=True,
            envs=merged_env(self.handle, env),
            cwd=cwd or self.handle.workdir,
            on_stdout=sink("stdout"),
            on_stderr=sink("stderr"),
            timeout=0,  # we enforce the deadline ourselves and kill the process
        )
        timed_out = False
        try:
            res = await asyncio.wait_for(h.wait(), timeout)
            code = res.exit_code
        except e2b.CommandExitException as e:
            code = e.exit_code
        except TimeoutError:
            timed_out = True
            await h.kill()
            code = 137
        except asyncio.CancelledError:
            await asyncio.shield(h.kill())
            raise
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return ExecResult(
            exit_code=code,
            stdout=out["stdout"].decode(errors="replace"),
            stderr=out["stderr"].decode(errors="replace"),
            timed_out=timed_out,
            duration_s=round(time.monotonic() - t0, 4),
            truncated=truncated,
        )

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        tmp = f"/tmp/.put-{uuid.uuid4().hex}.tar"
        await self._sbx.files.write(tmp, tar_bytes, use_octet_stream=True)
        q = shlex.quote
        res = await self.exec(
            f"mkdir -p {q(dest_dir)} && tar -xf {q(tmp)} -C {q(dest_dir)}; rc=$?; rm -f {q(tmp)};"
            " exit $rc",
            env=NO_PROFILE_ENV,
            cwd="/",
        )
        if not res.ok:
            raise SandboxError(f"put_archive({dest_dir}) failed: {res.stderr[-1000:]}")

    async def get_archive(self, path: str, *, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> bytes:
        tmp = f"/tmp/.get-{uuid.uuid4().hex}.tar"
        p = path.rstrip("/") or "/"
        parent, base = os.path.split(p)
        q = shlex.quote
        res = await self.exec(
            f"test -e {q(p)} || exit 44; tar -cf {q(tmp)} -C {q(parent or '/')} {q(base or '.')}"
            f" && wc -c < {q(tmp)}",
            env=NO_PROFILE_ENV,
            cwd="/",
        )
        if res.exit_code == 44:
            raise SandboxNotFound(f"{path}: no such file in the sandbox")
        if not res.ok:
            raise SandboxError(f"get_archive({path}) failed: {res.stderr[-1000:]}")
        try:
            if int(res.stdout.split()[-1]) > max_bytes:
                raise ArchiveTooLarge(path, max_bytes, 0)
            # The size above is the sandbox's word: the download is capped as well.
            buf = bytearray()
            async with await self._sbx.files.read(tmp, format="stream") as stream:
                async for chunk in stream:
                    buf += chunk
                    if len(buf) > max_bytes:
                        raise ArchiveTooLarge(path, max_bytes, len(buf))
        finally:
            await self.exec(["rm", "-f", tmp], env=NO_PROFILE_ENV, cwd="/")
        return bytes(buf)

    async def kill_all_processes(self) -> None:
        res = await self.exec(
            ["/bin/sh", "-c", _KILL_ALL_SH], env=NO_PROFILE_ENV, cwd="/", timeout=60
        )
        if not res.ok:
            raise SandboxError(f"kill_all_processes failed: {(res.stderr or res.stdout)[-500:]}")


class E2BBackend(SandboxBackend):
    """Sandboxes in the E2B cloud (or anything speaking its API at `api_url`)."""

    name = "e2b"
    host_local = False
    runs_local_images = False
    runs_image_rootfs = False
    egress_relays = False

    def __init__(
        self,
        *,
        template: str = "base",
        api_key: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        domain: str | None = None,
        http_version: str | None = None,
        request_timeout: float | None = None,
        workdir: str = f"{HOME}/workspace",
        allow_public_network: bool | None = None,
    ) -> None:
        self.template = template
        #: The operator's permission for network mode `public`.
        self.allow_public_network = public_network_allowed(allow_public_network)
        self.workdir = workdir
        opts: dict[str, Any] = {
            "api_key": api_key or os.environ.get("E2B_API_KEY"),
            "api_url": api_url,
            "sandbox_url": sandbox_url,
            "domain": domain,
            "http_version": http_version,
            "request_timeout": request_timeout,
        }
        self.opts = {k: v for k, v in opts.items() if v is not None}

    def _require(self) -> Any:
        e2b = _sdk()
        if not self.opts.get("api_key"):
            raise BackendUnavailable(INSTALL_HINT + " (E2B_API_KEY is not set)")
        return e2b

    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        e2b = self._require()
        if not spec.rollout_id:
            raise ValueError("spec.rollout_id is required")
        gw_url = spec.gateway.public_url if spec.gateway else None
        # Refused before anything is created.
        kw = network_options(spec, self.allow_public_network)
        # Idempotent per rollout: a retried create kills what an earlier attempt made.
        for h in await self._list({ROLLOUT_LABEL: spec.rollout_id}):
            await self.destroy(h)
        metadata = {MANAGED_LABEL: "1", ROLLOUT_LABEL: spec.rollout_id, **spec.labels}
        sbx = await e2b.AsyncSandbox.create(
            template=spec.image or self.template,
            timeout=max(1, int(spec.timeout_s)),
            metadata=metadata,
            envs=spec.env,
            **kw,
            **self.opts,
        )
        # E2B's default user cannot create /workspace: the default maps under $HOME.
        workdir = spec.workdir if spec.workdir != "/workspace" else self.workdir
        handle = SandboxHandle(
            backend=self.name,
            sandbox_id=sbx.sandbox_id,
            rollout_id=spec.rollout_id,
            env_version=f"e2b-template:{spec.image or self.template}",
            system="template",
            workdir=workdir,
            gateway_base_url=gw_url,
            env=base_env(spec, HOME, gw_url),
            details={"labels": spec.labels, "expires_at": time.time() + spec.timeout_s},
        )
        sb = E2BSandbox(self, handle, sbx)
        try:
            res = await sb.exec(["mkdir", "-p", workdir], cwd="/")
            if not res.ok:
                raise SandboxError(f"cannot create workdir {workdir}: {res.stderr}")
            await populate(sb, spec)
            await self._check_root_escalation(sb, spec)
        except BaseException:
            await asyncio.shield(self.destroy(handle))
            raise
        return sb

    async def _check_root_escalation(self, sb: E2BSandbox, spec: SandboxSpec) -> None:
        """Refuse a sandbox whose user can become root, unless the task allows it; run
        after the task's own setup, before the agent. Not repeated after the agent: a
        user that cannot become root here has no way to make itself one that this check
        would see (it cannot write sudoers or a setuid-root file), and what this check
        cannot see (a kernel exploit) a second run would not see either."""
        res = await sb.exec(["/bin/sh", "-c", _ROOT_CHECK_SH], env=SYSTEM_TOOLS_ENV, cwd="/")
        if not res.ok:
            raise SandboxError(f"root escalation check failed: {(res.stderr or res.stdout)[-500:]}")
        how = res.stdout.strip()
        sb.handle.details["root_escalation"] = how or None
        if not how or spec.allow_root_escalation:
            return
        task = spec.labels.get(TASK_ID_LABEL, "?")
        template = spec.image or self.template
        what = "runs as root" if how == "root" else "can become root (`sudo -n true` succeeds)"
        raise RootEscalationRefused(
            f"task {task}: the agent's user in e2b template {template} {what}, so it could "
            "reach everything the evaluation relies on; use a template without sudo for the "
            "user, or set sandbox.allow_root_escalation: true in the task to run it anyway"
        )

    async def attach(self, handle: SandboxHandle) -> E2BSandbox:
        e2b = self._require()
        try:
            sbx = await e2b.AsyncSandbox.connect(handle.sandbox_id, **self.opts)
        except e2b.NotFoundException as e:
            raise SandboxNotFound(f"e2b sandbox {handle.sandbox_id} is gone") from e
        return E2BSandbox(self, handle, sbx)

    async def destroy(self, handle: SandboxHandle) -> None:
        e2b = self._require()
        with contextlib.suppress(e2b.NotFoundException):
            await e2b.AsyncSandbox.kill(handle.sandbox_id, **self.opts)

    async def _list(self, metadata: dict[str, str]) -> list[SandboxHandle]:
        e2b = self._require()
        pager = e2b.AsyncSandbox.list(query=e2b.SandboxQuery(metadata=metadata), **self.opts)
        out: list[SandboxHandle] = []
        while pager.has_next:
            for info in await pager.next_items():
                md = dict(info.metadata or {})
                out.append(
                    SandboxHandle(
                        backend=self.name,
                        sandbox_id=info.sandbox_id,
                        rollout_id=md.get(ROLLOUT_LABEL, ""),
                        env_version=f"e2b-template:{info.template_id}",
                        system="template",
                        details={"metadata": md},
                    )
                )
        return out

    async def list(self) -> list[SandboxHandle]:
        return await self._list({MANAGED_LABEL: "1"})
