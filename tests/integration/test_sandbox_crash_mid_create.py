"""A worker SIGKILLed while its local sandbox is starting leaves nothing running once the
next worker's reaper has passed (found by `bench/chaos.py`: bwrap trees of sandboxes
whose state dir the reaper had already removed kept running for good)."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandboxes.backends.local import LocalBackend
from tests.fixtures.sandboxes import require_bwrap

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]

REPO = Path(__file__).resolve().parents[2]

# A worker process held where bwrap has reported its child but the report is not read
# yet (the hold below): the moment the chaos bench's worker kills hit.
WORKER = """
import asyncio, select, sys, time
import sandboxes.backends.local as local

def hold(fd):
    select.select([fd], [], [])
    print("bwrap started", flush=True)
    time.sleep(3600)

local._read_all = hold
from sandboxes.base import SandboxSpec
backend = local.LocalBackend(state_dir=sys.argv[1], rootfs=sys.argv[2])
asyncio.run(backend.create(SandboxSpec(rollout_id="killed-mid-create")))
"""


def processes_naming(path: Path) -> list[int]:
    needle = str(path).encode()
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                continue
    return found


async def test_reaper_kills_a_sandbox_whose_worker_died_while_it_started(
    sandbox_state_dir: Path, sandbox_base_image: Any
) -> None:
    require_bwrap()
    state = sandbox_state_dir / "crash"
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(state), sandbox_base_image.rootfs],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline() == b"bwrap started\n"
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    backend = LocalBackend(state_dir=state, rootfs=sandbox_base_image.rootfs)
    try:
        # the sandbox outlives its worker (bwrap runs in its own session) and comes up
        assert await wait_for(lambda: any(state.glob("lsb-*/run/ready")))
        assert processes_naming(state)
        reaped = await backend.reap(frozenset())
        assert len(reaped) == 1
        assert await wait_for(lambda: not processes_naming(state))
        assert await backend.list() == []
    finally:
        await backend.close()
        for pid in processes_naming(state):  # never leave a sandbox behind, even on failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Whether `condition` holds within the timeout (processes start and die
    asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True
