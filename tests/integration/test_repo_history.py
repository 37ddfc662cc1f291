"""Integration: the agent's repository holds its base commit's history and nothing after.

On real local (bubblewrap) and docker sandboxes, for the three ways a repo arrives: a
task's `sandbox.repo` (cloned on the host; `repo_url_template` is the same path), and a
repo already in the image at the path a `swebench` check names (docker; SWE-bench's own
images keep their upstream history). The repo (`tests.fixtures.leaky_repo`) keeps later
work in every kind of git storage; `PROBE` is what an agent could run to find it. Each
test's control is the same repo without the cut, in the same kind of sandbox, showing
the work.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities, SandboxBackends
from hooks.swebench_check import preflight
from sandboxes.base import RepoSpec, Sandbox, SandboxBackend, SandboxHandle, SandboxSpec
from sandboxes.workspace.repo_trim import TRIMMED
from schemas.evaluation import SweBenchCheck
from schemas.outcome import RolloutStatus
from schemas.rollout import BAD_TASK_SPEC
from schemas.session import SessionCreated
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
from tests.fixtures.runtime import RuntimeManager
from tests.fixtures.sandboxes import (  # noqa: F401 - fixtures
    docker_backend,
    local_backend,
    provision_request,
    sandbox_backend,
    sandbox_base_image,
    sandbox_state_dir,
)
from tests.fixtures.swebench_repo import F2P, FIX, FORMAT_OPTIONS, P2P, write_calc_instances

pytestmark = pytest.mark.integration
session_loop = pytest.mark.asyncio(loop_scope="session")

#: A test patch that applies to the leaky repo's base commit (a new file).
NEW_FILE_PATCH = (
    "diff --git a/test_new.py b/test_new.py\nnew file mode 100644\n"
    "--- /dev/null\n+++ b/test_new.py\n@@ -0,0 +1 @@\n+x = 1\n"
)


def rid() -> str:
    return f"it-history-{uuid.uuid4().hex[:10]}"


async def probe(sb: Sandbox, path: str) -> dict[str, str]:
    """What the agent's own git shows in `path`."""
    r = await sb.exec(["/bin/sh", "-c", PROBE], cwd=path, timeout=60)
    assert r.exit_code == 0, r.stdout + r.stderr
    return read_probe(r.stdout)


def tar_of(directory: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for child in sorted(directory.iterdir()):
            tf.add(str(child), arcname=child.name)
    return buf.getvalue()


def build_repo_image(base: str, repo: Path, tmp_path: Path) -> str:
    """An image with `repo` at /testbed, root's and mode 777 as in SWE-bench's images."""
    ctx = tmp_path / f"ctx-{uuid.uuid4().hex[:8]}"
    ctx.mkdir()
    shutil.copytree(repo, ctx / "testbed", symlinks=True)
    (ctx / "Dockerfile").write_text(
        f"FROM {base}\nUSER root\nCOPY testbed /testbed\nRUN chmod -R a+rwX /testbed\n"
        "USER 1000:1000\n"
    )
    tag = f"agentic-rollout-test/repo-history:{uuid.uuid4().hex[:10]}"
    r = subprocess.run(
        ["docker", "build", "--network", "none", "-q", "-t", tag, str(ctx)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return tag


@pytest.fixture
def leaky(tmp_path: Path) -> LeakyRepo:
    return make_leaky_repo(tmp_path / "src")


@pytest.fixture
def images() -> Iterator[list[str]]:
    tags: list[str] = []
    yield tags
    for tag in tags:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


async def test_a_cloned_repo_shows_the_agent_no_later_work(
    sandbox_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    leaky: LeakyRepo,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROLLOUT_SANDBOX_STATE_DIR", str(tmp_path / "state"))  # its mirror
    spec = SandboxSpec(
        rollout_id=rid(), repo=RepoSpec(url=str(leaky.path), commit=leaky.base, path="repo")
    )
    sb = await sandbox_backend.create(spec)
    try:
        assert sb.handle.facts == TRIMMED
        assert_trimmed(await probe(sb, f"{sb.workdir}/repo"), leaky)
        # Control: a clone of the repo (how it used to be copied in) next to it.
        old = tmp_path / "old"
        git(tmp_path, "clone", "-q", "--no-checkout", str(leaky.path), str(old))
        git(old, "checkout", "-q", "--detach", leaky.base)
        await sb.put_archive(f"{sb.workdir}/old", tar_of(old))
        assert_leaks(await probe(sb, f"{sb.workdir}/old"), leaky)
    finally:
        await sb.destroy()


# ------------------------------------------------------------------ a repo in the image
def swebench_task(image: str, base: str) -> RolloutTask:
    """A task whose `swebench` check names the image's /testbed at `base`."""
    check = SweBenchCheck(
        name="swebench",
        base_commit=base,
        test_patch=NEW_FILE_PATCH,
        test_command="true",
        fail_to_pass=["test_new.py::x"],
    )
    return RolloutTask.model_validate(
        {
            "task_id": "leaky-1",
            "prompt": "p",
            "harness": {"name": "command", "config": {"command": "true"}},
            "sandbox": {
                "backend": "docker",
                "image": image,
                "workdir": "/testbed",
                "resources": {"disk_mb": None},  # overlay2 on ext4: no quota, /testbed kept
            },
            "evaluation": {"checks": [check.model_dump()]},
        }
    )


@pytest.fixture
async def host(sandbox_state_dir: Path) -> Any:  # noqa: F811
    backends = SandboxBackends(
        {"docker": {"state_dir": str(sandbox_state_dir / f"rh-docker-{uuid.uuid4().hex[:6]}")}}
    )
    yield SandboxActivities(backends, "h1", "q-h1")
    for b in backends.active():
        for h in await b.list():
            await b.destroy(h)
    await backends.aclose()


@session_loop
async def test_a_repo_in_the_image_is_cut_before_the_agent(
    tmp_path: Path,
    leaky: LeakyRepo,
    sandbox_base_image: Any,  # noqa: F811
    images: list[str],
    host: SandboxActivities,
) -> None:
    image = build_repo_image(sandbox_base_image.tag, leaky.path, tmp_path)
    images.append(image)
    docker = host.backends.get("docker")
    # Control: the image's repo as it is, in a sandbox of the same image.
    plain = await docker.create(
        SandboxSpec(rollout_id=rid(), image=image, workdir="/testbed", resources={"disk_mb": None})
    )
    try:
        assert plain.handle.facts == {}
        assert_leaks(await probe(plain, "/testbed"), leaky)
    finally:
        await plain.destroy()

    task = swebench_task(image, leaky.base)
    ref = await ActivityEnvironment().run(host.provision_sandbox, provision_request(task))
    assert ref.facts == TRIMMED
    sb = await docker.attach(SandboxHandle.model_validate(ref.handle))
    try:
        assert sb.handle.facts == TRIMMED
        assert_trimmed(await probe(sb, "/testbed"), leaky)
        (check,) = task.evaluation.checks  # type: ignore[union-attr]
        assert isinstance(check, SweBenchCheck)
        assert await preflight(sb, check) is None  # the base commit is there for the tests
    finally:
        await sb.destroy()


@session_loop
async def test_an_image_repo_that_is_not_at_the_base_commit_refuses_the_task(
    tmp_path: Path,
    leaky: LeakyRepo,
    sandbox_base_image: Any,  # noqa: F811
    images: list[str],
    host: SandboxActivities,
) -> None:
    """The image's HEAD is the base commit, the task names its parent: the task is
    refused at provision, naming the field, not retried."""
    image = build_repo_image(sandbox_base_image.tag, leaky.path, tmp_path)
    images.append(image)
    task = swebench_task(image, leaky.ancestors[0])
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(host.provision_sandbox, provision_request(task))
    assert err.value.type == BAD_TASK_SPEC and err.value.non_retryable
    assert "image_repos:" in err.value.message
    assert f"not at its base commit {leaky.ancestors[0]}" in err.value.message
    assert await host.backends.get("docker").list() == []  # nothing left behind


async def test_a_swebench_instance_in_its_own_image_is_graded_on_the_cut_repo(
    docker_backend: SandboxBackend,  # noqa: F811
    tmp_path: Path,
    sandbox_base_image: Any,  # noqa: F811
    images: list[str],
) -> None:
    """SWE-bench's layout: the instance's image holds the repo at /testbed, its later
    fix on another branch. The agent's `git log --all` sees the base commit alone; the
    hidden tests are still placed from the base commit and the fix resolves it."""
    instances = write_calc_instances(tmp_path)
    calc = tmp_path / "calc"
    base = git(calc, "rev-parse", "HEAD")
    git(calc, "checkout", "-q", "-b", "fixed")
    sub = "def sub(a, b):\n    return a "
    (calc / "calc.py").write_text((calc / "calc.py").read_text().replace(sub + "+", sub + "-"))
    git(calc, "commit", "-qam", "the fix")
    fixed = git(calc, "rev-parse", "HEAD")
    git(calc, "checkout", "-q", "main")
    image = build_repo_image(sandbox_base_image.tag, calc, tmp_path)
    images.append(image)
    options = LoadOptions(
        harness=HarnessSpec(
            name="command",
            config={"command": f"git log --all --format=%H && git cat-file -t {fixed}; {FIX}"},
            budget_s=120,
        ),
        backend="docker",
        format_options={**FORMAT_OPTIONS, "image_template": image,
                        "sandbox": {"resources": {"disk_mb": None}}},
    )  # fmt: skip
    (task,) = load_task_source(instances, options, fmt="swebench").tasks
    session = SessionCreated(
        session_id="s", token="t", openai_base_url="http://127.0.0.1:9/v1",
        anthropic_base_url="http://127.0.0.1:9",
    )  # fmt: skip
    runtime = RuntimeManager(tmp_path / "runs", backends={"docker": docker_backend})
    r = await runtime.run(task, session, rid())
    assert r.status == RolloutStatus.ok, r.error
    assert r.agent is not None and r.agent.stdout_tail.split() == [base]
    assert "could not get object info" in r.agent.stderr_tail  # the fix's commit is gone
    assert r.evaluation is not None and r.evaluation.reward == 1.0, r.evaluation
    (check,) = r.evaluation.checks
    assert check.tests == {F2P: "PASSED", P2P: "PASSED"}
