"""Behaviour of the local (bubblewrap) and docker backends on the real runtimes.

Every test runs against both backends (`sandbox_backend` fixture) so the protocol
means the same thing everywhere. Network checks only *read* routing state inside the
sandbox; no test sends traffic anywhere but host loopback via the Gateway channel.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandboxes.base import (
    ArchiveTooLarge,
    ExecResult,
    GatewayChannel,
    OutputChunk,
    ResourceLimits,
    SandboxError,
    SandboxFile,
    SandboxNotFound,
    SandboxSpec,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("system"),
]


def rid() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


async def test_exec_argv_shell_env_cwd_stdin(sandbox_backend: Any) -> None:
    sb = await sandbox_backend.create(SandboxSpec(rollout_id=rid(), env={"SPEC_VAR": "s"}))
    try:
        r = await sb.exec(["printf", "%s|", "a b", "$HOME"])
        assert r.ok and r.stdout == "a b|$HOME|"  # argv: no shell expansion
        r = await sb.exec(
            "echo $SPEC_VAR $CALL_VAR; pwd; echo err >&2; exit 3", env={"CALL_VAR": "c"}
        )
        assert r.exit_code == 3 and r.stdout == f"s c\n{sb.workdir}\n" and r.stderr == "err\n"
        r = await sb.exec(["pwd"], cwd="/tmp")
        assert r.stdout.strip() == "/tmp"
        r = await sb.exec(["wc", "-c"], stdin=b"x" * 100_000)
        assert r.stdout.strip() == "100000"
        r = await sb.exec(["/no/such/binary"])
        assert r.exit_code == 127
        assert sb.handle.rollout_id and sb.handle.env_version
        r = await sb.exec(["id", "-u"])
        assert r.stdout.strip() == "1000"  # agents run unprivileged
    finally:
        await sb.destroy()


async def test_streaming_output_arrives_before_exit(sandbox_backend: Any) -> None:
    """The command waits for a file the test creates only once the first chunk of its
    output arrived: output that came only at exit would never let it finish."""
    sb = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        seen: list[OutputChunk] = []
        first_seen = asyncio.Event()

        def on_output(chunk: OutputChunk) -> None:
            seen.append(chunk)
            if chunk.stream == "stdout" and b"first" in chunk.data:
                first_seen.set()

        running = asyncio.create_task(
            sb.exec(
                "echo first; while [ ! -e gate ]; do sleep 0.05; done; echo second >&2",
                timeout=120,
                on_output=on_output,
            )
        )
        try:
            await asyncio.wait_for(first_seen.wait(), 60)  # TimeoutError: held until exit
            assert not running.done(), "the command ended before it was let through"
            await sb.exec(["touch", "gate"])
            r = await running
        finally:
            running.cancel()
        assert r.ok and not r.timed_out, r
        assert any(c.stream == "stderr" and b"second" in c.data for c in seen)
        items = [i async for i in sb.exec_stream(["sh", "-c", "echo a; echo b"])]
        assert isinstance(items[-1], ExecResult) and items[-1].stdout == "a\nb\n"
    finally:
        await sb.destroy()


async def test_files_and_directories_roundtrip(sandbox_backend: Any, tmp_path: Path) -> None:
    spec = SandboxSpec(
        rollout_id=rid(),
        files=[
            SandboxFile(path="task/prompt.md", content="fix the bug\n"),
            SandboxFile.from_bytes("/tmp/blob.bin", bytes(range(256)), mode=0o600),
            SandboxFile(path="run.sh", content="#!/bin/sh\necho ran\n", mode=0o755),
        ],
        setup=["mkdir -p built && echo ok > built/marker"],
    )
    sb = await sandbox_backend.create(spec)
    try:
        assert await sb.get_file(f"{sb.workdir}/task/prompt.md") == b"fix the bug\n"
        assert await sb.get_file("/tmp/blob.bin") == bytes(range(256))
        assert (await sb.exec(["./run.sh"])).stdout == "ran\n"
        assert (await sb.exec(["cat", "built/marker"])).stdout == "ok\n"
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "a.txt").write_text("A")
        (src / "sub" / "b.txt").write_text("B")
        await sb.put_dir(src, f"{sb.workdir}/copied")
        r = await sb.exec("cat copied/a.txt copied/sub/b.txt")
        assert r.stdout == "AB"
        out = tmp_path / "out"
        await sb.get_dir(f"{sb.workdir}/copied", out)
        assert (out / "sub" / "b.txt").read_text() == "B"
        raw = await sb.get_archive(f"{sb.workdir}/copied")
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            assert "copied/sub/b.txt" in tf.getnames()
        with pytest.raises(SandboxNotFound):
            await sb.get_file("/does/not/exist")
    finally:
        await sb.destroy()


async def test_setup_failure_raises_and_cleans_up(sandbox_backend: Any) -> None:
    r = rid()
    with pytest.raises(SandboxError, match="setup command failed"):
        await sandbox_backend.create(SandboxSpec(rollout_id=r, setup=["echo boom >&2; exit 7"]))
    assert [h for h in await sandbox_backend.list() if h.rollout_id == r] == []


async def until_count(sb: Any, pattern: str, count: int, what: str) -> None:
    """Wait (60 s at most: a condition, not a speed) until `count` processes match."""
    ps = f"ps -eo args | grep -c '{pattern}' || true"
    deadline = time.monotonic() + 60
    while (await sb.exec(ps)).stdout.strip() != str(count):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


async def test_timeout_kills_the_whole_process_tree(sandbox_backend: Any) -> None:
    sb = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        t0 = time.monotonic()
        r = await sb.exec("sleep 300 & sleep 301 & wait", timeout=1.0)
        assert r.timed_out and r.exit_code == 137
        # Waiting for the children would take their 300 s.
        assert time.monotonic() - t0 < 300, "the timed-out command's children were waited for"
        await until_count(sb, "^sleep 30[01]", 0, "background children of a timed-out command")
        # Cancelling the awaiting task kills the command too.
        task = asyncio.create_task(sb.exec(["sleep", "302"]))
        await until_count(sb, "^sleep 302", 1, "the command never started")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until_count(sb, "^sleep 302", 0, "a cancelled command survived")
    finally:
        await sb.destroy()


async def test_memory_limit_oom_is_killed_and_reported(sandbox_backend: Any) -> None:
    spec = SandboxSpec(rollout_id=rid(), resources=ResourceLimits(memory_mb=128, pids=256))
    sb = await sandbox_backend.create(spec)
    try:
        r = await sb.exec(["python3", "-c", "b = bytearray(512 * 1024 * 1024); print('survived')"])
        assert r.exit_code == 137 and r.oom_killed and not r.timed_out, r
        assert "survived" not in r.stdout
        ok = await sb.exec(["echo", "still alive"])  # the sandbox itself survives
        assert ok.ok and ok.stdout == "still alive\n"
        # pids limit: a fork bomb is contained, the sandbox stays usable.
        bomb = (
            "import subprocess\nps = []\ntry:\n    for _ in range(400):\n"
            "        ps.append(subprocess.Popen(['sleep', '30']))\nexcept OSError:\n    pass\n"
            "print(len(ps))\nfor p in ps:\n    p.kill()\n"
        )
        fb = await sb.exec(["python3", "-c", bomb], timeout=60)
        assert fb.ok and 0 < int(fb.stdout) < 256, fb
        assert (await sb.exec(["true"])).ok
    finally:
        await sb.destroy()


async def test_no_network_but_loopback(sandbox_backend: Any) -> None:
    sb = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        routes = await sb.exec(["cat", "/proc/net/route"])
        assert routes.ok and routes.stdout.strip().splitlines()[1:] == [], routes.stdout
        ip = await sb.exec(["ip", "route", "show", "table", "all"])
        assert "default" not in ip.stdout
        assert all(line.split()[0] in ("local", "broadcast", "multicast") or "dev lo" in line
                   for line in ip.stdout.splitlines() if line.strip())  # fmt: skip
        links = await sb.exec(["ip", "-o", "link"])
        names = [ln.split(":")[1].strip() for ln in links.stdout.splitlines()]
        assert names == ["lo"], links.stdout
        dev = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert dev.stdout.split() == ["lo"]
        sysnet = await sb.exec("ls /sys/class/net 2>/dev/null || echo lo")
        assert sysnet.stdout.split() == ["lo"]
    finally:
        await sb.destroy()


async def test_rm_rf_root_leaves_host_and_other_sandboxes_intact(
    sandbox_backend: Any, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    canary.write_text("alive")
    a = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    b = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        await b.put_file(f"{b.workdir}/keep.txt", b"b's data")
        await a.put_file(f"{a.workdir}/mine.txt", b"a's data")
        r = await a.exec("rm -rf --no-preserve-root / 2>/dev/null; echo done", timeout=120)
        # The shell outlives the deletion (it is in memory): the command completes.
        assert r.exit_code == 0 and r.stdout == "done\n", r
        assert canary.read_text() == "alive"
        assert Path("/usr/bin/env").exists() and Path("/etc/passwd").exists()
        assert await b.get_file(f"{b.workdir}/keep.txt") == b"b's data"
        assert (await b.exec(["ls", "/usr/bin/python3"])).ok
        # The agent may break its own sandbox (its run dir is gone), but destroy still
        # cleans it up completely.
    finally:
        await a.destroy()
        await b.destroy()
    assert not Path(a.handle.details["state_dir"]).exists()


async def test_gateway_channel_reaches_host_loopback_server(
    sandbox_backend: Any, loopback_http_server: str
) -> None:
    spec = SandboxSpec(rollout_id=rid(), gateway=GatewayChannel(target=loopback_http_server))
    sb = await sandbox_backend.create(spec)
    try:
        url = sb.gateway_base_url
        assert url == "http://127.0.0.1:18080"
        assert sb.env["AGENTIC_ROLLOUT_GATEWAY_URL"] == url
        code = (
            "import json,os,urllib.request as u;"
            "req=u.Request(os.environ['AGENTIC_ROLLOUT_GATEWAY_URL']+'/v1/chat/completions',"
            "data=b'{\"x\":1}',headers={'Authorization':'Bearer tok'});"
            "print(u.urlopen(req,timeout=10).read().decode())"
        )
        r = await sb.exec(["python3", "-c", code], timeout=30)
        assert r.ok, r
        echoed = json.loads(r.stdout)
        assert echoed == {
            "method": "POST",
            "path": "/v1/chat/completions",
            "auth": "Bearer tok",
            "body": '{"x":1}',
        }
        # Many concurrent requests through the channel.
        code2 = (
            "import os,urllib.request as u,concurrent.futures as f;"
            "b=os.environ['AGENTIC_ROLLOUT_GATEWAY_URL'];"
            "print(sum(1 for _ in f.ThreadPoolExecutor(16).map("
            "lambda i:u.urlopen(b+'/p%d'%i,timeout=10).read(),range(64))))"
        )
        r = await sb.exec(["python3", "-c", code2], timeout=60)
        assert r.stdout.strip() == "64", r
    finally:
        await sb.destroy()


async def test_gateway_channel_to_unix_socket_gateway(
    sandbox_backend: Any, unix_http_server: str
) -> None:
    spec = SandboxSpec(
        rollout_id=rid(), gateway=GatewayChannel(target=unix_http_server, inside_port=8765)
    )
    sb = await sandbox_backend.create(spec)
    try:
        code = "import urllib.request as u;print(u.urlopen('http://127.0.0.1:8765/hi').read().decode())"
        r = await sb.exec(["python3", "-c", code], timeout=30)
        assert json.loads(r.stdout)["path"] == "/hi", r
    finally:
        await sb.destroy()


async def test_create_is_idempotent_per_rollout_and_attach_works(sandbox_backend: Any) -> None:
    r = rid()
    first = await sandbox_backend.create(SandboxSpec(rollout_id=r))
    await first.put_file(f"{first.workdir}/x", b"1")
    second = await sandbox_backend.create(SandboxSpec(rollout_id=r))  # a retried activity
    try:
        mine = [h for h in await sandbox_backend.list() if h.rollout_id == r]
        assert [h.sandbox_id for h in mine] == [second.handle.sandbox_id]
        again = await sandbox_backend.attach(second.handle.model_copy())
        assert (await again.exec(["echo", "hi"])).stdout == "hi\n"
        with pytest.raises(SandboxNotFound):
            await sandbox_backend.attach(first.handle)
    finally:
        await second.destroy()
        await second.destroy()  # idempotent
        await first.destroy()


def _host_pids_of(handle: Any) -> list[int]:
    """Host pids that belong to the sandbox (by its state dir in their cmdline/cgroup)."""
    out = []
    sid = handle.sandbox_id
    cid = handle.details.get("container_id") or "\0"
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cg = (p / "cgroup").read_text()
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if sid in cg or cid in cg or sid in cmd:
            out.append(int(p.name))
    return out


async def test_destroy_after_crash_leaves_nothing(sandbox_backend: Any) -> None:
    sb = await sandbox_backend.create(
        SandboxSpec(rollout_id=rid(), gateway=GatewayChannel(target="http://127.0.0.1:9"))
    )
    h = sb.handle
    # An agent that double-forks and detaches, then the sandbox "crashes".
    await sb.exec("setsid sh -c 'sleep 600 & sleep 601' >/dev/null 2>&1 & echo started")
    assert _host_pids_of(h)
    if h.backend == "docker":
        import docker

        docker.from_env().containers.get(h.details["container_id"]).kill()
    else:
        os.kill(h.details["child_pid"], 9)  # the sandbox's init / supervisor tree
        os.kill(h.details["bwrap_pid"], 9)
    await asyncio.sleep(0.3)
    await sandbox_backend.destroy(h)
    sdir = Path(h.details["state_dir"])
    assert not sdir.exists(), "state dir left behind"
    assert _host_pids_of(h) == [], "processes left behind"
    mounts = Path("/proc/self/mountinfo").read_text()
    assert h.sandbox_id not in mounts and str(sdir) not in mounts, "mounts left behind"
    for cg in h.details.get("cgroups") or []:
        assert not Path(cg).exists(), "cgroup left behind"
    if h.backend == "docker":
        import docker

        with pytest.raises(docker.errors.NotFound):
            docker.from_env().containers.get(h.details["container_id"])
    assert not Path(sdir / "run" / "gateway.sock").exists()
    assert [x for x in await sandbox_backend.list() if x.sandbox_id == h.sandbox_id] == []


async def test_repo_checked_out_at_immutable_commit(sandbox_backend: Any, tmp_path: Path) -> None:
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *a],
            cwd=repo, check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip

    git("init", "-q")
    (repo / "f.txt").write_text("v1\n")
    git("add", ".")
    git("commit", "-qm", "one")
    first = git("rev-parse", "HEAD")
    (repo / "f.txt").write_text("v2\n")
    git("commit", "-qam", "two")
    from sandboxes.base import RepoSpec

    spec = SandboxSpec(rollout_id=rid(), repo=RepoSpec(url=str(repo), commit=first, path="src"))
    sb = await sandbox_backend.create(spec)
    try:
        r = await sb.exec("cat src/f.txt; git -C src rev-parse HEAD; git -C src status --porcelain")
        assert r.ok and r.stdout.split() == ["v1", first], r
    finally:
        await sb.destroy()


async def test_kill_all_processes_leaves_nothing_the_agent_started(sandbox_backend: Any) -> None:
    """Leftovers that left their process group and session (setsid, double fork,
    nohup) are all killed; the sandbox, its files and the Gateway forwarder stay."""
    sb = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        r = await sb.exec(
            "setsid sh -c 'sleep 701 & sleep 702' >/dev/null 2>&1 & "
            "nohup sleep 703 >/dev/null 2>&1 & "
            "(sleep 704 &) ; echo kept > kept.txt"
        )
        assert r.ok, r
        ps = "ps -eo args | grep -c '^sleep 70[1-4]' || true"
        deadline = time.monotonic() + 60
        while (await sb.exec(ps)).stdout.strip() != "4":
            assert time.monotonic() < deadline, "the leftovers never started"
            await asyncio.sleep(0.1)
        await sb.kill_all_processes()
        assert (await sb.exec(ps)).stdout.strip() == "0"
        assert (await sb.exec(["cat", "kept.txt"])).stdout == "kept\n"
        await sb.kill_all_processes()  # nothing left: a no-op, not an error
        assert (await sb.exec(["true"])).ok
    finally:
        await sb.destroy()


IMPOSTOR = """
import json, os, socket, struct
path = "/run/rollout/control.sock"
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv.bind(path)
except PermissionError:  # the run dir is read-only to the sandbox: nothing to replace
    open("/tmp/impostor.ready", "w").write("refused")
    raise SystemExit(0)
srv.listen(8)
open("/tmp/impostor.ready", "w").write("bound")
while True:
    c, _ = srv.accept()
    line = b""
    while not line.endswith(b"\\n"):
        b = c.recv(1)
        if not b:
            break
        line += b
    if json.loads(line or b"{}").get("op") == "exec":
        x = json.dumps({"exit_code": 0}).encode()
        c.sendall(struct.pack(">cI", b"X", len(x)) + x)
    else:
        c.sendall(b'{"ok": true, "pid": 0, "killed": 0}\\n')
    c.close()
"""

SNOOP = """
import os
def cmdline(p):
    try:
        return open("/proc/%s/cmdline" % p, "rb").read()
    except OSError:
        return b""
# The supervisor itself (init's argv names it too): python3 -I -S /run/supervisor.py ...
def is_supervisor(argv):
    return argv[0].endswith(b"python3") and b"/run/supervisor" + b".py" in argv
sup = [p for p in os.listdir("/proc") if p.isdigit()
       and is_supervisor(cmdline(p).split(b"\\0"))]
try:
    os.listdir("/proc/%s/fd" % sup[0])
    print("open")
except PermissionError:
    print("denied")
"""


async def test_agent_cannot_reach_or_replace_the_control_socket(sandbox_backend: Any) -> None:
    """The directory of the host's control socket is not reachable from inside, an
    impostor socket bound where the supervisor first listened is never used, and the
    supervisor's file descriptors (its listening socket) are out of the agent's reach."""
    sb = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        ctl = Path(sb.supervisor.socket_path).parent
        marker = f"marker-{uuid.uuid4().hex}"
        (ctl / marker).write_text("host only")
        found = await sb.exec(
            f"find / -path /proc -prune -o -path /sys -prune -o -name {marker} -print"
            " 2>/dev/null; true",
            timeout=300,
        )
        assert found.stdout == "", "the control socket's directory is visible in the sandbox"
        await sb.put_file("/tmp/impostor.py", IMPOSTOR)
        r = await sb.exec("setsid python3 /tmp/impostor.py </dev/null >/tmp/imp.log 2>&1 &")
        assert r.ok
        deadline = time.monotonic() + 60
        while not (await sb.exec(["test", "-e", "/tmp/impostor.ready"])).ok:
            assert time.monotonic() < deadline, (await sb.exec(["cat", "/tmp/imp.log"])).stdout
            await asyncio.sleep(0.1)
        # docker seals its run dir once the supervisor is up; local's stays the sandbox's.
        # The run dir is read-only to the agent once the supervisor is up, on every backend.
        assert (await sb.exec(["cat", "/tmp/impostor.ready"])).stdout == "refused"
        assert (await sb.exec(["false"])).exit_code == 1  # the real supervisor answered
        assert (await sb.supervisor.ping())["pid"] != 0
        snoop = await sb.exec(["python3", "-c", SNOOP])
        assert snoop.stdout.strip() == "denied", snoop
    finally:
        await sb.destroy()


async def test_get_archive_over_its_cap_fails_clearly_and_stops_reading(
    sandbox_backend: Any,
) -> None:
    """A sandbox file much larger than the cap: ArchiveTooLarge naming the cap, the
    read stopped at about the cap, and the worker never held the file."""
    sb = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        assert (await sb.exec(f"head -c {48 << 20} /dev/zero > big.bin", timeout=120)).ok
        cap = 2 << 20
        tracemalloc.start()
        try:
            with pytest.raises(ArchiveTooLarge, match=f"exceeds {cap} bytes") as exc:
                await sb.get_file(f"{sb.workdir}/big.bin", max_bytes=cap)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert cap < exc.value.read_bytes <= cap + (1 << 20)
        assert peak < 16 << 20, f"peak {peak} bytes while reading with a 2 MiB cap"
        assert await sb.get_file(f"{sb.workdir}/big.bin", max_bytes=64 << 20) == bytes(48 << 20)
    finally:
        await sb.destroy()
