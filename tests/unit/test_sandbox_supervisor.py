"""The in-sandbox supervisor and the host bridge, run directly on the host (no sandbox).

Proves the wire protocol both backends rely on: streamed exec, exit codes and signals,
timeouts and cancellation killing the whole process group, stdin, tar put/get (capped
reads, no writes through planted symlinks), killing everything exec started, the
control socket moved out of the run dir, and the loopback→Unix-socket forwarder
chained with the host Unix→TCP bridge.
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
import tracemalloc
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from devstack.ports import free_port
from sandboxes.base import UNREADABLE_PAX, ArchiveTooLarge, SandboxError, SandboxNotFound
from sandboxes.network.gateway_channel import bridge_is_open, close_bridge, ensure_bridge
from sandboxes.supervision.supervisor_client import (
    ARCHIVE_CHUNK,
    SUPERVISOR_FLAGS,
    SUPERVISOR_PATH,
    SupervisorClient,
    control_socket_path,
    secure_control_socket,
    wait_ready,
)

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
        [sys.executable, *SUPERVISOR_FLAGS, str(SUPERVISOR_PATH), "--run-dir", str(run),
         "--forward", f"{port}:{run}/gateway.sock"],
        start_new_session=True,
    )  # fmt: skip
    await wait_ready(run, 10, alive=lambda: proc.poll() is None)
    client = SupervisorClient(run / "control.sock")
    client.test_port = port  # type: ignore[attr-defined]
    yield client, run
    proc.kill()
    proc.wait()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--run-dir is required"),
        (["--run-dir"], "--run-dir needs a value"),
        (["--run-dir", "/tmp", "--forward"], "--forward needs a value"),
        (["--run-dir", "/tmp", "--verbose"], "unknown argument '--verbose'"),
    ],
)
async def test_bad_arguments_stop_the_supervisor_with_a_clear_message(
    argv: list[str], message: str
) -> None:
    r = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, *SUPERVISOR_FLAGS, str(SUPERVISOR_PATH), *argv],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    assert r.stderr.strip() == f"supervisor: {message}"


def _alive(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


async def _until_alive(pattern: str, alive: bool, what: str) -> None:
    """Wait until a process matching `pattern` is (or is no longer) running: a deadline
    for a condition (30 s), not a bound on how fast a busy machine gets there."""
    deadline = time.monotonic() + 30
    while _alive(pattern) != alive:
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


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


async def test_exit_frame_comes_after_all_output_the_command_wrote(
    supervisor: tuple[SupervisorClient, Path],
) -> None:
    """A slow reader and a background child that holds the pipe and keeps writing:
    everything the command itself wrote arrives before the exit status, and the exec ends
    (the pumps stop after a bounded drain instead of following the child)."""
    client, _ = supervisor
    tag = f"bgwriter{os.getpid()}"

    async def slow_consumer(chunk: object) -> None:
        await asyncio.sleep(0.005)

    script = (
        f"(exec -a {tag} sh -c 'while :; do echo bg; sleep 0.01; done') & "
        "head -c 300000 /dev/zero | tr '\\0' x; echo; echo END"
    )
    r = await client.exec(["bash", "-c", script], env=ENV, cwd="/", timeout=30, stdin=None,
                          on_output=slow_consumer)  # fmt: skip
    assert r.exit_code == 0 and not r.timed_out  # the writer kept running did not hold it
    assert r.stdout.count("x") == 300_000
    assert "\nEND\n" in r.stdout
    await _until_alive(tag, False, "the writer dies on the closed pipe")


async def test_timeout_and_cancel_kill_process_group(
    supervisor: tuple[SupervisorClient, Path],
) -> None:
    client, _ = supervisor
    tag = f"sleep 31{os.getpid() % 1000}"
    t0 = time.monotonic()
    r = await client.exec(["sh", "-c", f"{tag} & {tag} & wait"], env=ENV, cwd="/", timeout=0.5,
                          stdin=None, on_output=None)  # fmt: skip
    # Returned without waiting for the children (their sleep lasts over 8 hours).
    assert r.timed_out and r.exit_code == 137 and time.monotonic() - t0 < 31_000
    await _until_alive(tag, False, "the timed-out command's children survived")
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
    await _until_alive(f"{tag}7", True, "the command never started")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until_alive(f"{tag}7", False, "a cancelled command survived")


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


async def test_put_replaces_a_planted_symlink_instead_of_writing_through_it(
    supervisor: tuple[SupervisorClient, Path], tmp_path: Path
) -> None:
    """An agent that symlinks the path of a file the host will put there (an evaluation
    script, a hidden test) to /dev/null or to its own file must not make that file
    vanish or redirect it: the put replaces the link."""
    client, _ = supervisor
    dest = tmp_path / "work"
    dest.mkdir()
    decoy = tmp_path / "decoy.txt"
    decoy.write_text("agent's own")
    (dest / "check.sh").symlink_to("/dev/null")
    (dest / "hidden.py").symlink_to(decoy)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in (("check.sh", b"exit 1\n"), ("hidden.py", b"assert False\n")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    await client.put_archive(str(dest), buf.getvalue())
    assert not (dest / "check.sh").is_symlink() and (dest / "check.sh").read_bytes() == b"exit 1\n"
    assert not (dest / "hidden.py").is_symlink()
    assert (dest / "hidden.py").read_bytes() == b"assert False\n"
    assert decoy.read_text() == "agent's own"


async def test_get_archive_stops_at_its_byte_cap(
    supervisor: tuple[SupervisorClient, Path], tmp_path: Path
) -> None:
    """A file far larger than the cap: a clear error, and the host read (and held)
    only about the cap, not the whole archive."""
    client, _ = supervisor
    big = tmp_path / "big.bin"
    r = await client.exec(["sh", "-c", f"head -c {64 << 20} /dev/zero > {big}"], env=ENV,
                          cwd="/", timeout=60, stdin=None, on_output=None)  # fmt: skip
    assert r.ok, r
    cap = 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveTooLarge, match="exceeds 1048576 bytes") as exc:
            await client.get_archive(str(big), max_bytes=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cap < exc.value.read_bytes <= cap + ARCHIVE_CHUNK
    assert peak < 8 << 20, f"peak {peak} bytes while reading with a 1 MiB cap"
    # Below the cap the same read works, and the supervisor is still serving.
    (tmp_path / "small.txt").write_bytes(b"s" * 1000)
    raw = await client.get_archive(str(tmp_path / "small.txt"), max_bytes=cap)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        assert tf.getnames() == ["small.txt"]


def _past_path_max(root: Path) -> str:
    """Make dirs below `root` until a file's absolute path passes PATH_MAX (4096); the
    file's path relative to `root`."""
    name = "d" * 250
    depth = (4200 - len(str(root))) // 251 + 1
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):  # relative to an open dir: every call stays short
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("deep.log", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
            f.write(b"deep")
    finally:
        os.close(fd)
    return "/".join([name] * depth + ["deep.log"])


async def test_get_archive_goes_on_past_an_entry_it_cannot_read(
    supervisor: tuple[SupervisorClient, Path], tmp_path: Path
) -> None:
    """An entry the supervisor cannot read (here: a path past PATH_MAX) comes as an empty
    member whose `UNREADABLE_PAX` header says why; the entries after it still come."""
    client, _ = supervisor
    tree = tmp_path / "logs"
    tree.mkdir()
    (tree / "a.log").write_bytes(b"a")
    deep = _past_path_max(tree)
    (tree / "z.log").write_bytes(b"z")
    raw = await client.get_archive(str(tree))
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        members = {m.name: m for m in tf.getmembers()}
        assert tf.extractfile(members["logs/z.log"]).read() == b"z"  # type: ignore[union-attr]
    marked = [m for m in members.values() if UNREADABLE_PAX in m.pax_headers]
    assert len(marked) == 1 and marked[0].size == 0
    assert ("logs/" + deep).startswith(marked[0].name)
    assert "File name too long" in marked[0].pax_headers[UNREADABLE_PAX]
    # Control: tarfile's own recursive add (what the supervisor ran before) stops there.
    with tarfile.open(fileobj=io.BytesIO(), mode="w|") as tf, pytest.raises(OSError):
        tf.add(str(tree), arcname="logs")


async def test_kill_all_stops_every_process_exec_started(
    supervisor: tuple[SupervisorClient, Path],
) -> None:
    """Detached (setsid, double-forked) leftovers of finished commands are killed; the
    supervisor keeps serving and processes it did not start are left alone."""
    client, _ = supervisor
    tag = f"sleep 32{os.getpid() % 1000}"
    outsider = subprocess.Popen(["sh", "-c", f"exec {tag}9"])
    try:
        r = await client.exec(
            ["sh", "-c", f"setsid sh -c '{tag}1 & {tag}2' >/dev/null 2>&1 & "
                         f"nohup {tag}3 >/dev/null 2>&1 &"],
            env=ENV, cwd="/", timeout=10, stdin=None, on_output=None,
        )  # fmt: skip
        assert r.ok
        deadline = time.monotonic() + 30
        while not all(_alive(f"{tag}{i}") for i in (1, 2, 3)):
            assert time.monotonic() < deadline, "the leftovers never started"
            await asyncio.sleep(0.05)
        assert await client.kill_all() >= 3
        assert not any(_alive(f"{tag}{i}") for i in (1, 2, 3))
        assert outsider.poll() is None
        r = await client.exec(["echo", "alive"], env=ENV, cwd="/", timeout=10, stdin=None,
                              on_output=None)  # fmt: skip
        assert r.stdout == "alive\n"
    finally:
        outsider.kill()
        outsider.wait()


async def test_control_socket_is_taken_out_of_the_run_dir(
    supervisor: tuple[SupervisorClient, Path], tmp_path: Path
) -> None:
    """After `secure_control_socket` the host talks to the supervisor at a path outside
    the run dir; a socket bound at the old place (as an agent could) is never used."""
    client, run = supervisor
    real_pid = (await client.ping())["pid"]
    path = secure_control_socket(run.parent)
    assert path == control_socket_path(run.parent) and path.parent != run
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(str(run / "control.sock"))
    impostor.listen(1)
    try:
        assert (await SupervisorClient(path).ping())["pid"] == real_pid
    finally:
        impostor.close()


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
        extra = free_port()  # not port + 1: on the host's loopback that one may be taken
        await client.forward(extra, sock)  # extra port on demand
        code2 = code.replace(str(port), str(extra))
        r = await client.exec([sys.executable, "-c", code2], env=ENV, cwd="/", timeout=20,
                              stdin=None, on_output=None)  # fmt: skip
        assert "hello" in r.stdout
    finally:
        close_bridge(sock)
        srv.shutdown()
        srv.server_close()
    assert not os.path.exists(sock)
