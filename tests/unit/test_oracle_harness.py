"""The oracle's solution dir exists empty in every supervised sandbox: on a read-only
root (docker over a sized disk, local on an image rootfs) nothing can create a new
top-level dir after start, so the backend makes it, like /tests and /logs."""

from pathlib import Path

from harnesses.oracle import SOLVE_SCRIPT
from sandboxes.base import SOLUTION_DIR
from sandboxes.supervision.supervised import make_task_dirs


def test_every_sandbox_gets_an_empty_solution_dir(tmp_path: Path) -> None:
    made = make_task_dirs(tmp_path, None)
    assert SOLUTION_DIR in made.values()
    (host_dir,) = [d for d, target in made.items() if target == SOLUTION_DIR]
    assert host_dir.is_dir() and not any(host_dir.iterdir())
    assert SOLVE_SCRIPT.startswith(SOLUTION_DIR + "/")
