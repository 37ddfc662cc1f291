"""The chaos run's leftover check against a real local sandbox: what a SIGKILLed worker
leaves (its bubblewrap sandbox, directory and processes) is found in the state dir the
worker was given; once the backend destroys it, nothing is."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.backends.local import LocalBackend
from sandboxes.base import SandboxSpec
from stress.chaos import sandbox_processes, sandboxes_left
from tests.fixtures.sandboxes import require_bwrap

pytestmark = [pytest.mark.integration, pytest.mark.needs("base_image")]


@pytest.fixture
def state_dirs() -> Iterator[list[Path]]:
    """Two workers' state dirs, as `run_chaos` makes them (the sandbox uid traverses)."""
    work = Path(tempfile.mkdtemp(prefix="rollout-chaos-check-", dir="/tmp"))
    work.chmod(0o755)
    yield [work / "sandboxes-0", work / "sandboxes-1"]
    shutil.rmtree(work, ignore_errors=True)


async def test_a_sandbox_left_behind_is_found_and_a_destroyed_one_is_not(
    state_dirs: list[Path],
) -> None:
    require_bwrap()
    backend = LocalBackend(state_dir=state_dirs[1], rootfs=None)
    assert sandboxes_left(state_dirs) == []  # control: an empty (or absent) state dir
    sandbox = await backend.create(SandboxSpec(rollout_id="chaos-left"))
    try:
        assert sandboxes_left(state_dirs) == [state_dirs[1] / sandbox.handle.sandbox_id]
        running = sandbox_processes(state_dirs, exclude={os.getpid()})
        assert any("bwrap" in p for p in running), running
    finally:
        await backend.destroy(sandbox.handle)
        await backend.close()
    assert sandboxes_left(state_dirs) == []
    assert sandbox_processes(state_dirs, exclude={os.getpid()}) == []
