"""The host-side checkout of a task's repo (`sandboxes.workspace.provisioning.repo_tar`) on
real git: rollouts of one repo start together, so they must share one cached mirror safely."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandboxes.workspace.provisioning import repo_tar


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def make_repo(path: Path) -> tuple[str, str]:
    """A repo whose two commits give `calc.py` different contents; their ids."""
    path.mkdir()
    git("init", "--quiet", cwd=path)
    ids = []
    for body in ("def sub(a, b):\n    return a + b\n", "def sub(a, b):\n    return a - b\n"):
        (path / "calc.py").write_text(body)
        git("add", "calc.py", cwd=path)
        git("commit", "--quiet", "-m", "c", cwd=path)
        ids.append(git("rev-parse", "HEAD", cwd=path))
    return ids[0], ids[1]


def calc_in(tar_bytes: bytes) -> str:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tf:
        member = tf.extractfile("calc.py")
        assert member is not None
        return member.read().decode()


def test_rollouts_of_one_repo_starting_together_all_get_their_checkout(tmp_path: Path) -> None:
    """Seen on a loaded host: two instances of one repo provisioned at once left a
    half-made mirror (one thread's clone deleted by the other's cleanup), and every later
    rollout of that repo failed. Sixteen threads start together, at two commits."""
    first, second = make_repo(tmp_path / "repo")
    cache = tmp_path / "cache"
    cache.mkdir()
    start = threading.Barrier(16)

    def checkout(i: int) -> str:
        start.wait()
        return calc_in(repo_tar(str(tmp_path / "repo"), (first, second)[i % 2], cache))

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(checkout, range(16)))
    assert got == ["def sub(a, b):\n    return a + b\n", "def sub(a, b):\n    return a - b\n"] * 8
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == [
        hashlib.sha256(str(tmp_path / "repo").encode()).hexdigest()[:16] + ".git"
    ]  # one mirror, no clone left behind


def test_a_broken_mirror_is_made_again(tmp_path: Path) -> None:
    """A mirror left without its refs (what the race above left) is not a repository:
    it is cloned again instead of failing every rollout of the repo."""
    _, second = make_repo(tmp_path / "repo")
    cache = tmp_path / "cache"
    mirror = cache / (hashlib.sha256(str(tmp_path / "repo").encode()).hexdigest()[:16] + ".git")
    (mirror / "objects").mkdir(parents=True)
    (mirror / "config").write_text("[core]\n\tbare = true\n")
    assert calc_in(repo_tar(str(tmp_path / "repo"), second, cache)).endswith("a - b\n")
