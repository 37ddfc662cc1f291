"""The in-sandbox supervisor and the host bridge, run directly on the host (no sandbox).

Proves the wire protocol both backends rely on: streamed exec, exit codes and signals,
timeouts and cancellation killing the whole process group, stdin, tar put/get, and
the loopback→Unix-socket forwarder chained with the host Unix→TCP bridge.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sandboxes.base import SandboxError, SandboxNotFound
from sandboxes.gateway_channel import bridge_is_open, close_bridge, ensure_bridge
from sandboxes.supervisor_client import SUPERVISOR_PATH, SupervisorClient, wait_ready

pytestmark = pytest.mark.asyncio(loop_scope="session")
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[tuple[SupervisorClient, Path]]:
    run = tmp_path / "run"
    run.mkdir()
    with socket.socket() as s:  # a free loopback port for the pre-started forwarder
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(SUPERVISOR_PATH), "--run-dir", str(run),
         "--forward", f"{port}:{run}/gateway.sock"],
        start_new_session=True,
    )  # fmt: skip
    await wait_ready(run, 10, alive=lambda: proc.poll() is None)
    client = SupervisorClient(run / "control.sock")
    client.test_port = port  # type: ignore[attr-defined]
    yield client, run
    proc.kill()
    proc.wait()


def _alive(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


async def test_exec_streams_and_reports_exit(supervisor: tuple[SupervisorClient, Path]) -> None:
    client, _ = supervisor
    chunks = []
    r = await client.exec(
        ["sh", "-c", "echo out; echo err >&2; kill -TERM $$"],
        env=ENV,
        cwd="/",
        timeout=10,
        stdin=None,
        on_output=chunks.append,
    )
    assert r.exit_code == 128 + 15 and r.stdout == "out\n" and r.stderr == "err\n"
    assert {c.stream for c in chunks} == {"stdout", "stderr"}
    r = await client.exec(["cat"], env=ENV, cwd="/", timeout=10, stdin=b"abc", on_output=None)
    assert r.stdout == "abc"
    r = await client.exec(["sh", "-c", "yes | head -c 100000"], env=ENV, cwd="/", timeout=10,
                          stdin=None, on_output=None, max_output_bytes=1000)  # fmt: skip
    assert r.truncated and len(r.stdout) == 1000


async def test_timeout_and_cancel_kill_process_group(
    supervisor: tuple[SupervisorClient, Path],
) -> None:
    client, _ = supervisor
    tag = f"sleep 31{os.getpid() % 1000}"
    t0 = time.monotonic()
    r = await client.exec(["sh", "-c", f"{tag} & {tag} & wait"], env=ENV, cwd="/", timeout=0.5,
                          stdin=None, on_output=None)  # fmt: skip
    assert r.timed_out and r.exit_code == 137 and time.monotonic() - t0 < 5
    await asyncio.sleep(0.2)
    assert not _alive(tag)
    task = asyncio.create_task(
        client.exec(
            ["sh", "-c", f"{tag}7 & wait"],
            env=ENV,
            cwd="/",
            timeout=None,
            stdin=None,
            on_output=None,
        )
    )
    await asyncio.sleep(0.3)
    assert _alive(f"{tag}7")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.3)
    assert not _alive(f"{tag}7")


async def test_put_get_archive(supervisor: tuple[SupervisorClient, Path], tmp_path: Path) -> None:
    client, _ = supervisor
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("d/x.txt", b"X"), ("../escape.txt", b"no")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    dest = tmp_path / "dest"
    await client.put_archive(str(dest), buf.getvalue())
    assert (dest / "d" / "x.txt").read_bytes() == b"X"
    assert not (tmp_path / "escape.txt").exists()  # path traversal member skipped
    raw = await client.get_archive(str(dest / "d"))
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        assert tf.getnames() == ["d", "d/x.txt"]
    with pytest.raises(SandboxNotFound):
        await client.get_archive(str(tmp_path / "missing"))


async def test_control_socket_must_be_a_real_socket(tmp_path: Path) -> None:
    fake = tmp_path / "control.sock"
    fake.symlink_to("/var/run/docker.sock")
    with pytest.raises(SandboxError):
        await SupervisorClient(fake).ping()
    with pytest.raises(SandboxNotFound):
        await SupervisorClient(tmp_path / "none.sock").ping()


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


async def test_forwarder_and_bridge_chain_to_loopback_http(
    supervisor: tuple[SupervisorClient, Path],
) -> None:
    client, run = supervisor
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    sock = str(run / "gateway.sock")
    try:
        ensure_bridge(sock, f"http://127.0.0.1:{srv.server_address[1]}")
        assert bridge_is_open(sock)
        port = client.test_port  # type: ignore[attr-defined]
        code = f"import urllib.request as u;print(u.urlopen('http://127.0.0.1:{port}/x').read())"
        r = await client.exec([sys.executable, "-c", code], env=ENV, cwd="/", timeout=20,
                              stdin=None, on_output=None)  # fmt: skip
        assert r.stdout.strip() == "b'hello /x'", r
        await client.forward(port + 1, sock)  # extra port on demand
        code2 = code.replace(str(port), str(port + 1))
        r = await client.exec([sys.executable, "-c", code2], env=ENV, cwd="/", timeout=20,
                              stdin=None, on_output=None)  # fmt: skip
        assert "hello" in r.stdout
    finally:
        close_bridge(sock)
        srv.shutdown()
        srv.server_close()
    assert not os.path.exists(sock)
