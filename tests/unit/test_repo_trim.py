"""A task's repository holds its base commit's history and nothing after it (real git).

The repo (`tests.fixtures.leaky_repo`) keeps later work in every kind of git storage:
branches, tags, a remote's refs, packed-refs, notes, a stash, reflog, loose objects,
FETCH_HEAD and ORIG_HEAD. Each test has its control: the repo as it came shows the work.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from activities.sandbox import sandbox_spec
from sandboxes.base import ImageRepo
from sandboxes.workspace.provisioning import _mirror, repo_tar
from sandboxes.workspace.repo_trim import _TRIM
from schemas.tasks import HarnessSpec, RolloutTask
from task_formats import LoadOptions, load_task_source
from tests.fixtures.leaky_repo import (
    PROBE,
    LeakyRepo,
    assert_leaks,
    assert_trimmed,
    git,
    make_leaky_repo,
    read_probe,
)
from tests.fixtures.swebench_repo import FORMAT_OPTIONS, write_calc_instances


def probe(repo: Path) -> dict[str, str]:
    r = subprocess.run(["sh", "-c", PROBE], cwd=repo, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return read_probe(r.stdout)


def trim(repo: Path, commit: str) -> subprocess.CompletedProcess[str]:
    """The in-sandbox cut, run on the host's git."""
    return subprocess.run(
        ["sh", "-c", _TRIM, "trim", str(repo), commit], capture_output=True, text=True
    )


@pytest.fixture
def leaky(tmp_path: Path) -> LeakyRepo:
    return make_leaky_repo(tmp_path / "src")


def test_a_cloned_repo_holds_the_base_commits_history_only(
    tmp_path: Path, leaky: LeakyRepo
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    # Control: the mirror holds the later work, and a clone of it (how the repo used to
    # be copied in) shows it to `git log --all -p`.
    mirror = _mirror(str(leaky.path), leaky.base, cache)
    old = tmp_path / "old"
    git(tmp_path, "clone", "-q", "--no-checkout", str(mirror), str(old))
    git(old, "checkout", "-q", "--detach", leaky.base)
    assert_leaks(probe(old), leaky)

    with tarfile.open(fileobj=io.BytesIO(repo_tar(str(leaky.path), leaky.base, cache))) as tf:
        tf.extractall(tmp_path / "new", filter="tar")
    assert_trimmed(probe(tmp_path / "new"), leaky)
    remotes = subprocess.run(
        ["git", "-C", str(tmp_path / "new"), "config", "--get-regexp", "^remote[.]"],
        capture_output=True,
    )
    assert remotes.returncode == 1 and remotes.stdout == b""  # no remote, not even a URL


def test_the_image_repo_cut_drops_every_later_object_and_keeps_the_work_tree(
    leaky: LeakyRepo,
) -> None:
    assert_leaks(probe(leaky.path), leaky)  # control: the repo as the image holds it
    (leaky.path / "untracked.txt").write_text("the image's own file\n")
    r = trim(leaky.path, leaky.base)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_trimmed(probe(leaky.path), leaky)
    assert (leaky.path / "untracked.txt").read_text() == "the image's own file\n"
    packs = list((leaky.path / ".git" / "objects" / "pack").glob("*.pack"))
    assert len(packs) == 1
    again = trim(leaky.path, leaky.base)  # a retried provision cuts again
    assert again.returncode == 0, again.stdout + again.stderr
    assert_trimmed(probe(leaky.path), leaky)


def test_kept_packs_borrowed_objects_and_commit_graphs_are_cut_too(
    tmp_path: Path, leaky: LeakyRepo
) -> None:
    """A repo that borrows its objects from another (alternates), keeps a pack marked
    `.keep` (which a plain repack leaves) and has a commit-graph naming later commits."""
    shared = tmp_path / "shared"
    git(tmp_path, "clone", "-q", "--shared", str(leaky.path), str(shared))
    git(shared, "checkout", "-q", "--detach", leaky.base)
    git(
        shared, "fetch", "-q", str(leaky.path), "refs/stash:refs/stash", "refs/notes/*:refs/notes/*"
    )
    git(leaky.path, "repack", "-q", "-a", "-d")
    for pack in (leaky.path / ".git" / "objects" / "pack").glob("*.pack"):
        pack.with_suffix(".keep").touch()
    git(leaky.path, "commit-graph", "write", "--reachable")
    assert_leaks(probe(shared), leaky)  # control
    for repo in (shared, leaky.path):
        r = trim(repo, leaky.base)
        assert r.returncode == 0, r.stdout + r.stderr
    shutil.rmtree(leaky.path)  # what `shared` borrowed was copied in: it stands alone
    assert_trimmed(probe(shared), leaky)
    assert not (shared / ".git" / "objects" / "info" / "alternates").exists()
    assert subprocess.run(["git", "-C", str(shared), "fsck", "--strict"]).returncode == 0


def test_the_image_repo_cut_refuses_what_is_not_the_tasks_repo(
    tmp_path: Path, leaky: LeakyRepo
) -> None:
    (tmp_path / "plain").mkdir()
    first = leaky.ancestors[0]
    cases = {
        "missing": (tmp_path / "nothing", leaky.base, 3, "is not a directory"),
        "not a repo": (tmp_path / "plain", leaky.base, 3, "is not the top of a git repository"),
        "a subdirectory": (leaky.path / ".git", leaky.base, 3, "not the top of a git repository"),
        "no such commit": (leaky.path, "1" * 40, 4, "is not in the repository"),
        "HEAD elsewhere": (leaky.path, first, 5, f"{leaky.base}, not at its base commit {first}"),
    }  # fmt: skip
    for name, (path, commit, code, message) in cases.items():
        r = trim(path, commit)
        assert (r.returncode, message in r.stdout) == (code, True), (name, r.stdout, r.stderr)
    assert_leaks(probe(leaky.path), leaky)  # refused before anything changed


def test_a_linked_worktree_is_refused(tmp_path: Path, leaky: LeakyRepo) -> None:
    wt = tmp_path / "wt"
    git(leaky.path, "worktree", "add", "-q", "--detach", str(wt), leaky.base)
    r = trim(wt, leaky.base)
    assert r.returncode == 3 and "is a linked worktree" in r.stdout, r.stdout
    shutil.rmtree(wt)


def _swebench_task(tmp_path: Path, **format_options: object) -> RolloutTask:
    instances = write_calc_instances(tmp_path)
    options = LoadOptions(
        harness=HarnessSpec(name="command", config={"command": "true"}),
        backend="docker",
        format_options={**FORMAT_OPTIONS, **format_options},
    )
    (task,) = load_task_source(instances, options, fmt="swebench").tasks
    return task


def test_a_swebench_repo_in_the_image_is_cut_and_a_cloned_one_is_not_cut_twice(
    tmp_path: Path,
) -> None:
    task = _swebench_task(tmp_path / "image")
    (check,) = task.evaluation.checks  # type: ignore[union-attr]
    spec = sandbox_spec(task, "r1", "http://127.0.0.1:9/v1", 60)
    assert spec.repo is None
    assert spec.image_repos == [ImageRepo(path="/testbed", commit=check.base_commit)]

    cloned = _swebench_task(tmp_path / "url", repo_url_template=str(tmp_path / "url" / "calc"))
    spec = sandbox_spec(cloned, "r2", "http://127.0.0.1:9/v1", 60)
    assert spec.repo is not None and spec.repo.path == "/testbed"
    assert spec.image_repos == []


def test_a_tasks_own_image_repo_at_the_checks_path_is_the_one_cut(tmp_path: Path) -> None:
    task = _swebench_task(tmp_path)
    raw = task.model_dump(mode="json")
    raw["sandbox"]["image_repos"] = [{"path": "/testbed/", "commit": "A" * 40}]
    spec = sandbox_spec(RolloutTask.model_validate(raw), "r1", "http://127.0.0.1:9/v1", 60)
    assert spec.image_repos == [ImageRepo(path="/testbed", commit="a" * 40)]
    with pytest.raises(ValueError, match=re.escape("image_repos[].path must be absolute")):
        ImageRepo(path="testbed", commit="a" * 40)
    with pytest.raises(ValueError, match=re.escape("image_repos[].commit must be a full")):
        ImageRepo(path="/testbed", commit="main")
