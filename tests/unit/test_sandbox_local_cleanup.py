"""Removing a local sandbox's directory never changes the permissions above it: the state
dir must stay traversable for the sandbox uid, or every later sandbox fails to start."""

import os
import shutil
import stat
from pathlib import Path

import pytest

from sandboxes.host.state import remove_tree


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_unreadable_dirs_inside_the_sandbox_are_removed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    sandbox = state / "lsb-000000000001"
    locked = sandbox / "work" / "locked"
    locked.mkdir(parents=True)
    (locked / "f").write_text("x")
    state.chmod(0o755)
    locked.chmod(0o000)
    remove_tree(sandbox)
    assert not sandbox.exists()
    assert mode(state) == 0o755


def test_a_failing_removal_of_the_sandbox_dir_leaves_the_state_dir_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E.g. a process of the dying sandbox still writing: rmdir of the top fails."""
    state = tmp_path / "state"
    sandbox = state / "lsb-000000000002"
    (sandbox / "tmp").mkdir(parents=True)
    state.chmod(0o755)
    real_rmdir = os.rmdir

    def busy_rmdir(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        if os.fspath(path) == os.fspath(sandbox):
            raise OSError(16, "Device or resource busy")
        real_rmdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "rmdir", busy_rmdir)
    remove_tree(sandbox)
    assert mode(state) == 0o755, "the state dir above the sandbox must keep its mode"
    monkeypatch.setattr(os, "rmdir", real_rmdir)
    shutil.rmtree(sandbox, ignore_errors=True)
