"""Host-side async client for the in-sandbox supervisor (`supervisor.py`).

The local and docker sandboxes both run the supervisor as their long-lived process;
this client speaks its wire protocol over the Unix socket in the sandbox's run dir
(exec with streamed output, stdin and a kill on disconnect; tar put/get; the Gateway
forwarder; killing every process the agent left), so both backends stream output,
enforce timeouts and kill whole process trees the same way.

The control socket: the supervisor binds it in the run dir, which the sandbox can
write; once it is ready (before any agent command ran) the host renames it into the
state dir's ``ctl`` dir, which is never mounted into the sandbox. The bound socket
keeps working under its new name, and nothing the agent does in the run dir reaches
the host's control channel; the run dir itself then becomes read-only to the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandboxes.base import (
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_OUTPUT_BYTES,
    ArchiveTooLarge,
    ExecResult,
    OutputCallback,
    OutputChunk,
    SandboxError,
    SandboxNotFound,
)

HDR = struct.Struct(">cI")
SUPERVISOR_PATH = Path(__file__).with_name("supervisor.py")
#: Where both backends mount it inside a sandbox (read-only).
SUPERVISOR_IN_SANDBOX = "/run/supervisor.py"
#: The interpreter's flags: isolated (-I: no PYTHON* variables, no user site) and without
#: `site` (-S): it needs only the stdlib, and skipping the image's site-packages saves
#: ~1-2 MB in every sandbox it lives in.
SUPERVISOR_FLAGS = ("-I", "-S")
#: How a sandbox starts it.
SUPERVISOR_ARGV = ("python3", *SUPERVISOR_FLAGS, SUPERVISOR_IN_SANDBOX)
#: Read size when streaming an archive out of a sandbox.
ARCHIVE_CHUNK = 256 * 1024


def control_socket_path(state_dir: Path) -> Path:
    """Where the host reaches a sandbox's supervisor: outside what the sandbox sees."""
    return state_dir / "ctl" / "control.sock"


def secure_control_socket(state_dir: Path) -> Path:
    """Move the freshly bound control socket from the run dir (sandbox-writable) to
    `control_socket_path` (host-only, 0700). Call it right after `wait_ready`."""
    ctl = state_dir / "ctl"
    ctl.mkdir(mode=0o700, exist_ok=True)
    src = state_dir / "run" / "control.sock"
    if not stat.S_ISSOCK(os.lstat(src).st_mode):
        raise SandboxError(f"{src} is not a socket")
    dst = control_socket_path(state_dir)
    os.rename(src, dst)
    seal_run_dir(state_dir / "run")
    return dst


def seal_run_dir(run: Path) -> None:
    """Take the run dir back from the sandbox once the supervisor is up: it is a host
    dir outside the sandbox's sized disk (`disk.py`), so an agent that could write
    there would write to the host's disk past ``disk_mb``. Only the host creates files
    in it from now on (the Gateway channel's socket)."""
    if os.geteuid() == 0:
        os.chown(run, 0, 0)
    os.chmod(run, 0o755)


def normalize_cmd(cmd: Sequence[str] | str) -> list[str]:
    """A string runs under /bin/sh -c; a sequence is an argv."""
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    argv = [str(a) for a in cmd]
    if not argv:
        raise ValueError("empty command")
    return argv


class SupervisorClient:
    """Talks to one sandbox's supervisor over its control socket."""

    def __init__(self, socket_path: str | os.PathLike[str]) -> None:
        self.socket_path = str(socket_path)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        # Refuse anything but a real socket (no symlink to a host socket).
        try:
            st = os.lstat(self.socket_path)
        except FileNotFoundError as e:
            raise SandboxNotFound(f"sandbox control socket missing: {self.socket_path}") from e
        if not stat.S_ISSOCK(st.st_mode):
            raise SandboxError(f"{self.socket_path} is not a socket")
        try:
            return await asyncio.open_unix_connection(self.socket_path, limit=2**20)
        except (ConnectionRefusedError, FileNotFoundError) as e:
            raise SandboxNotFound(f"sandbox supervisor not running ({e})") from e

    async def request(self, req: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        r, w = await self._connect()
        try:
            w.write(json.dumps(req).encode() + b"\n")
            await w.drain()
            line = await asyncio.wait_for(r.readline(), timeout)
            if not line:
                raise SandboxError(f"supervisor closed the connection on {req.get('op')}")
            return json.loads(line)
        finally:
            w.close()

    async def ping(self, timeout: float = 5.0) -> dict[str, Any]:
        return await self.request({"op": "ping"}, timeout)

    async def forward(self, port: int, unix_path: str, addr: str = "127.0.0.1") -> None:
        """Listen on loopback `addr`:`port` in the sandbox, forwarding to `unix_path`."""
        req = {"op": "forward", "port": port, "unix": unix_path, "addr": addr}
        res = await self.request(req)
        if not res.get("ok"):
            raise SandboxError(f"forwarder on {addr}:{port} failed: {res.get('error')}")

    async def put_archive(self, dest_dir: str, tar_bytes: bytes) -> None:
        r, w = await self._connect()
        try:
            w.write(json.dumps({"op": "put", "dest": dest_dir}).encode() + b"\n")
            w.write(tar_bytes)
            await w.drain()
            w.write_eof()
            line = await r.readline()
        finally:
            w.close()
        res = json.loads(line) if line else {"ok": False, "error": "no reply"}
        if not res.get("ok"):
            raise SandboxError(f"put_archive({dest_dir}) failed: {res.get('error')}")

    async def get_archive(self, path: str, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> bytes:
        """The tar stream of `path`, read in chunks and cut off past `max_bytes`
        (closing the connection stops the supervisor's tar)."""
        r, w = await self._connect()
        try:
            w.write(json.dumps({"op": "get", "path": path}).encode() + b"\n")
            await w.drain()
            line = await r.readline()
            res = json.loads(line) if line else {"ok": False, "error": "no reply"}
            if not res.get("ok"):
                if res.get("error") == "ENOENT":
                    raise SandboxNotFound(f"{path}: no such file in the sandbox")
                raise SandboxError(f"get_archive({path}) failed: {res.get('error')}")
            buf = bytearray()
            while chunk := await r.read(ARCHIVE_CHUNK):
                buf += chunk
                if len(buf) > max_bytes:
                    raise ArchiveTooLarge(path, max_bytes, len(buf))
            return bytes(buf)
        finally:
            w.close()

    async def kill_all(self, timeout: float = 30.0) -> int:
        """Kill every process started by exec (see `supervisor.kill_all`); how many."""
        res = await self.request({"op": "kill_all"}, timeout)
        if not res.get("ok"):
            raise SandboxError(f"kill_all failed: {res.get('error')}")
        return int(res.get("killed", 0))

    async def exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        timeout: float | None,
        stdin: bytes | None,
        on_output: OutputCallback | None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        t0 = time.monotonic()
        r, w = await self._connect()
        req = {
            "op": "exec",
            "argv": argv,
            "env": dict(env),
            "cwd": cwd,
            "timeout": timeout,
            "stdin": stdin is not None,
        }
        out = {b"O": bytearray(), b"E": bytearray()}
        truncated = False
        try:
            w.write(json.dumps(req).encode() + b"\n")
            if stdin is not None:
                for i in range(0, len(stdin), 65536):
                    part = stdin[i : i + 65536]
                    w.write(HDR.pack(b"I", len(part)) + part)
                w.write(HDR.pack(b"C", 0))
            await w.drain()
            deadline = None if timeout is None else t0 + timeout + 10.0
            while True:
                remaining = None if deadline is None else max(0.1, deadline - time.monotonic())
                try:
                    hdr = await asyncio.wait_for(r.readexactly(HDR.size), remaining)
                except TimeoutError:
                    # Supervisor missed its own deadline (frozen sandbox?): kill from here.
                    w.write(HDR.pack(b"K", 0))
                    with contextlib.suppress(Exception):
                        await w.drain()
                    raise SandboxError("exec did not finish after its timeout") from None
                kind, n = HDR.unpack(hdr)
                payload = await r.readexactly(n) if n else b""
                if kind == b"X":
                    res = json.loads(payload)
                    break
                buf = out[kind]
                room = max_output_bytes - len(buf)
                if len(payload) > room:
                    truncated = True
                if room > 0:
                    buf += payload[:room]
                if on_output is not None:
                    chunk = OutputChunk(stream="stdout" if kind == b"O" else "stderr", data=payload)
                    maybe = on_output(chunk)
                    if asyncio.iscoroutine(maybe):
                        await maybe
        except asyncio.IncompleteReadError as e:
            raise SandboxError(
                "sandbox supervisor went away during exec (sandbox destroyed or crashed)"
            ) from e
        finally:
            # On cancellation this close makes the supervisor kill the process group.
            w.close()
        return ExecResult(
            exit_code=int(res["exit_code"]),
            stdout=out[b"O"].decode("utf-8", errors="replace"),
            stderr=out[b"E"].decode("utf-8", errors="replace"),
            timed_out=bool(res.get("timed_out")),
            duration_s=round(time.monotonic() - t0, 4),
            truncated=truncated,
        )


async def wait_ready(
    run_dir: Path, timeout: float, alive: Callable[[], bool] | None = None
) -> None:
    """Wait for the supervisor's ready marker (poll: cheaper than inotify here)."""
    deadline = time.monotonic() + timeout
    marker = run_dir / "ready"
    delay = 0.002
    while not marker.exists():
        if alive is not None and not alive():
            raise SandboxError("sandbox process exited during startup")
        if time.monotonic() > deadline:
            raise SandboxError(f"sandbox supervisor not ready after {timeout}s")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.05)
