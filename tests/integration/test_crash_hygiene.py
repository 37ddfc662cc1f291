"""Nothing a gateway starts outlives it, SIGKILL included.

Real parts: `rollout gateway` as its own process (one, and a supervisor of two), the
tokenizer pool it starts for a large message, the multiprocessing resource tracker, a
scripted engine (a fake LLM on loopback). Every descendant is captured by pid (and start
time, so a reused pid is not mistaken for a survivor) before the SIGKILL, then polled
until gone. The control runs the same check on a parent with one protected child (a
tokenizer-pool worker) and one started without protection: the check reports the
unprotected one alive, so it would catch a leak.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.background_server import BackgroundServer
from devstack.ports import consecutive_free_ports
from devstack.scripted_engine import Script, ScriptedEngine
from tests.fixtures.gateway import wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.needs("system")]

Proc = tuple[int, str]  # (pid, start time in clock ticks): one process, never a reused pid
#: How long the check waits for a process to go (a bound on a poll, not a speed goal).
GONE_WITHIN_S = 30.0
BIG = "word " * 2000  # 10,000 characters: past the offload threshold the gateway is given


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return [raw[: raw.index(" (")], "comm", *raw[raw.rindex(")") + 2 :].split()]


def descendants(root: int) -> set[Proc]:
    """Every live process below `root`, by parent links in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(int(st[3]), []).append(int(entry))
    found: set[Proc] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        st = _stat(pid)
        if st is not None:
            found.add((pid, st[21]))
            todo.extend(children.get(pid, []))
    return found


def alive(procs: Iterable[Proc]) -> set[Proc]:
    """Those still running (a zombie has exited; a new start time is another process)."""
    out = set()
    for pid, start in procs:
        st = _stat(pid)
        if st is not None and st[21] == start and st[2] != "Z":
            out.add((pid, start))
    return out


def left_after_poll(procs: set[Proc]) -> set[Proc]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while (left := alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def kill_all(procs: Iterable[Proc]) -> None:
    for pid, _ in alive(procs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sigkill(parent: subprocess.Popen[Any]) -> None:
    """The crash under test: the parent is SIGKILLed and reaped (no cleanup of its runs)."""
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)


@contextlib.contextmanager
def killed_at_the_end(parent: subprocess.Popen[Any]) -> Iterator[set[Proc]]:
    """The descendants a test captures (add them to the set it yields): they and the
    parent are SIGKILLed when the test ends, whatever it found, so no check's failure
    leaves processes behind for the next test."""
    captured: set[Proc] = set()
    try:
        yield captured
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        kill_all(captured)


@pytest.mark.parametrize("processes", [1, 2])
def test_sigkilled_gateway_leaves_no_process(
    tiny_model_dir: Path, tmp_path: Path, processes: int
) -> None:
    """Seen before: a gateway killed with SIGKILL left its tokenizer-pool worker and the
    resource tracker running, parented to init. With `--processes 2` the supervisor is
    killed: its gateway processes, their pools and trackers go with it."""
    engine = ScriptedEngine(tiny_model_dir / "tokenizer.json", Script(default_reply="ok"))
    admin = secrets.token_urlsafe(12)
    with BackgroundServer(engine.app()) as engine_server:
        port = consecutive_free_ports(2 * processes)
        cmd = [
            sys.executable, "-m", "workers.cli", "gateway",
            "--engine", engine_server.url, "--model", "tiny-qwen3",
            "--tokenizer", str(tiny_model_dir), "--port", str(port),
            "--control-port", str(port + processes), "--processes", str(processes),
            "--data-dir", str(tmp_path / "gw"), "--tokenize-offload-chars", "1000",
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, env=dict(os.environ, ROLLOUT_ADMIN_TOKEN=admin))
        with killed_at_the_end(proc) as captured:
            for i in range(processes):
                control = f"http://127.0.0.1:{port + processes + i}"
                wait_healthy(control, proc, timeout_s=120)
                auth = {"Authorization": f"Bearer {admin}"}
                session = httpx.post(
                    f"{control}/sessions", json={"rollout_id": "r"}, headers=auth
                ).json()
                reply = httpx.post(
                    f"{session['openai_base_url']}/chat/completions",
                    headers={"Authorization": f"Bearer {session['token']}"},
                    json={"model": "tiny-qwen3", "messages": [{"role": "user", "content": BIG}]},
                    timeout=60,
                )
                assert reply.status_code == 200, reply.text
            captured |= descendants(proc.pid)
            lines = [cmdline(pid) for pid, _ in captured]
            # What the check must see go: each gateway's pool worker and resource tracker.
            assert sum("spawn_main" in c for c in lines) == processes, lines
            assert sum("resource_tracker" in c for c in lines) == processes, lines
            sigkill(proc)
            left = left_after_poll(captured)
            assert not left, [cmdline(pid) for pid, _ in left]


DEMO_PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import httpx
    from devstack.background_server import BackgroundServer
    from devstack.scripted_engine import Script, ScriptedEngine
    from workers.local_stack import start_gateway

    model_dir, data_dir, big = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    engine = ScriptedEngine(model_dir / "tokenizer.json", Script(default_reply="ok"))
    engine_server = BackgroundServer(engine.app()).start()
    gateway = start_gateway(
        engine_server.url, model_dir, data_dir, "tiny-qwen3", tokenize_offload_chars=1000
    )
    control, admin = gateway.control_url, gateway.admin_token
    session = httpx.post(
        f"{control}/sessions", json={"rollout_id": "r"},
        headers={"Authorization": f"Bearer {admin}"},
    ).json()
    reply = httpx.post(
        f"{session['openai_base_url']}/chat/completions",
        headers={"Authorization": f"Bearer {session['token']}"},
        json={"model": "tiny-qwen3", "messages": [{"role": "user", "content": big}]},
        timeout=60,
    )
    print(reply.status_code, flush=True)
    time.sleep(600)
    """
)


def test_sigkilled_demo_leaves_no_process_of_its_in_process_gateway(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`rollout demo` serves its Gateway from a thread of its own process: the tokenizer
    pool that gateway starts (from that thread, so only the pidfd watch can tell) and the
    resource tracker go when the demo is SIGKILLed."""
    parent = subprocess.Popen(
        [sys.executable, "-c", DEMO_PARENT, str(tiny_model_dir), str(tmp_path / "gw"), BIG],
        stdout=subprocess.PIPE,
        text=True,
    )
    with killed_at_the_end(parent) as captured:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "200"
        captured |= descendants(parent.pid)
        lines = [cmdline(pid) for pid, _ in captured]
        assert sum("spawn_main" in c for c in lines) == 1, lines
        assert sum("resource_tracker" in c for c in lines) == 1, lines
        sigkill(parent)
        left = left_after_poll(captured)
        assert not left, [cmdline(pid) for pid, _ in left]


CONTROL_PARENT = textwrap.dedent(
    """
    import asyncio, multiprocessing, sys, time
    from pathlib import Path
    from gateway.prompt.incremental import load_tokenizer
    from gateway.prompt.tokenize_pool import OffloadingTokenizer

    file = Path(sys.argv[1]) / "tokenizer.json"
    pool = OffloadingTokenizer(load_tokenizer(file), file, 1)
    asyncio.run(pool.encode_off_loop("x" * 100))  # starts the protected pool worker
    plain = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
    plain.start()  # started without protection
    print(plain.pid, flush=True)
    time.sleep(600)
    """
)


def test_control_the_check_catches_an_unprotected_child(tiny_model_dir: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", CONTROL_PARENT, str(tiny_model_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    with killed_at_the_end(parent) as captured:
        assert parent.stdout is not None
        plain_pid = int(parent.stdout.readline())
        captured |= descendants(parent.pid)
        plain = {p for p in captured if p[0] == plain_pid}
        protected = {p for p in captured if "spawn_main" in cmdline(p[0])} - plain
        assert plain and len(protected) == 1, [cmdline(pid) for pid, _ in captured]
        sigkill(parent)
        assert not left_after_poll(protected)  # the pool worker went with its parent ...
        # ... the unprotected child did not (nor, as it holds its pipe, the resource
        # tracker): a leak is seen.
        assert plain <= alive(captured)


TETHER_PARENT = textwrap.dedent(
    """
    import subprocess, time
    from devstack.tether import tethered

    group = ["sh", "-c", "sleep 600 & exec sleep 601"]  # a command and a child of its own
    tied = subprocess.Popen(tethered(group), start_new_session=True)
    plain = subprocess.Popen(["sleep", "602"], start_new_session=True)  # no tether
    print(tied.pid, plain.pid, flush=True)
    time.sleep(600)
    """
)


def test_tethered_process_group_dies_with_its_starter() -> None:
    """What `rollout demo` uses for vLLM, the Temporal dev server and the trainer: the
    whole group goes when the starter is SIGKILLed; a group started the old way stays."""
    parent = subprocess.Popen(
        [sys.executable, "-c", TETHER_PARENT], stdout=subprocess.PIPE, text=True
    )
    with killed_at_the_end(parent) as captured:
        assert parent.stdout is not None
        tied_pid, plain_pid = map(int, parent.stdout.readline().split())
        deadline = time.monotonic() + GONE_WITHIN_S
        while len(found := descendants(parent.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)  # the shim, sh's background sleep, the exec'd sleep, the plain one
        captured |= found
        plain = {p for p in captured if p[0] == plain_pid}
        tied = captured - plain
        assert len(tied) == 3 and any(p[0] == tied_pid for p in tied), captured
        sigkill(parent)
        assert not left_after_poll(tied)
        assert alive(captured) == plain  # control: the untethered one is a leak the check sees


def test_tethered_command_stops_as_before() -> None:
    """Signalling the group stops the command; the shim exits with its status."""
    from devstack.tether import tethered

    proc = subprocess.Popen(tethered(["sleep", "600"]), start_new_session=True)
    deadline = time.monotonic() + GONE_WITHIN_S
    while not descendants(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(GONE_WITHIN_S) == 128 + signal.SIGTERM


def test_tethered_command_dies_with_its_shim() -> None:
    """Should only the shim be SIGKILLed (not its group), the command goes with it."""
    from devstack.tether import tethered

    proc = subprocess.Popen(tethered(["sleep", "600"]), start_new_session=True)
    deadline = time.monotonic() + GONE_WITHIN_S
    while not (command := descendants(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert len(command) == 1, command
        proc.send_signal(signal.SIGKILL)
        proc.wait(GONE_WITHIN_S)
        assert not left_after_poll(command)
    finally:
        kill_all(command)


HOST_COMMAND_PARENT = textwrap.dedent(
    """
    import asyncio, os, subprocess
    from sandboxes.host.commands import dies_with_this_thread

    def start(tied):  # as a worker thread starts and waits for `docker build`
        arm = dies_with_this_thread() if tied else None
        proc = subprocess.Popen(["sleep", "600"], start_new_session=True, preexec_fn=arm)
        # one write(2) per line: two threads' print() calls can interleave on the pipe
        os.write(1, f"{'tied' if tied else 'plain'} {proc.pid}\\n".encode())
        proc.wait()

    async def main():
        await asyncio.gather(asyncio.to_thread(start, True), asyncio.to_thread(start, False))

    asyncio.run(main())
    """
)


def test_a_host_command_a_worker_thread_waits_for_dies_with_the_worker() -> None:
    """What a worker uses for `docker build` and `docker export | tar`: a command started
    from a thread of the event loop's pool (in its own session, as the build is) goes when
    the worker is SIGKILLed; the same command started without it stays (the control)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", HOST_COMMAND_PARENT], stdout=subprocess.PIPE, text=True
    )
    with killed_at_the_end(parent) as captured:
        assert parent.stdout is not None
        pids = dict(parent.stdout.readline().split() for _ in range(2))
        captured |= descendants(parent.pid)
        tied = {p for p in captured if p[0] == int(pids["tied"])}
        plain = {p for p in captured if p[0] == int(pids["plain"])}
        assert tied and plain, captured
        sigkill(parent)
        assert not left_after_poll(tied)
        assert alive(plain) == plain  # control: the untied one is a leak the check sees


BUILDING_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from sandboxes.image.task_images import content_hash_of, ensure_task_image
    from schemas.environment import EnvironmentBuild

    context, base = sys.argv[1], sys.argv[2]
    build = EnvironmentBuild(
        context=context, content_hash=content_hash_of(context), timeout_s=900,
        base_image_map={"ubuntu:24.04": base},
    )
    asyncio.run(asyncio.to_thread(ensure_task_image, build))  # as task_env runs it
    """
)


def test_a_task_image_build_stops_when_its_worker_is_sigkilled(tmp_path: Path) -> None:
    """Real Docker engine: a worker process building a task's image (a Dockerfile whose
    RUN sleeps) is SIGKILLed mid-build; the `docker build` client goes with it, and the
    daemon, its client gone, stops the build's container."""
    from tests.fixtures.sandboxes import require_docker

    require_docker()
    base = "agentic-rollout/sandbox-base:latest"
    if subprocess.run(["docker", "image", "inspect", base], capture_output=True).returncode:
        pytest.fail(f"{base} missing: build it with `rollout images build`")
    marker = f"sleep {600 + secrets.randbelow(300)}"  # names this build's container
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM ubuntu:24.04\nRUN {marker}\n")
    (context / "nonce.txt").write_text(secrets.token_hex(8))  # a new key: a build runs
    env = dict(os.environ, ROLLOUT_SANDBOX_CACHE_DIR=str(tmp_path / "cache"))
    worker = subprocess.Popen([sys.executable, "-c", BUILDING_WORKER, str(context), base], env=env)

    def sleeping_containers() -> list[str]:
        out = subprocess.run(
            ["docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Command}}"],
            capture_output=True,
            text=True,
        ).stdout
        return [line.split()[0] for line in out.splitlines() if marker in line]

    try:
        with killed_at_the_end(worker) as captured:
            deadline = time.monotonic() + 120
            while not sleeping_containers():
                assert worker.poll() is None, "the build ended early"
                assert time.monotonic() < deadline, "the build's RUN never started"
                time.sleep(0.2)
            captured |= descendants(worker.pid)
            clients = {p for p in captured if "docker build" in cmdline(p[0])}
            assert clients, [cmdline(pid) for pid, _ in captured]
            sigkill(worker)
            assert not left_after_poll(captured), [cmdline(pid) for pid, _ in alive(captured)]
            deadline = time.monotonic() + GONE_WITHIN_S
            while sleeping_containers() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not sleeping_containers(), "the build's container still runs"
    finally:
        for cid in sleeping_containers():
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
