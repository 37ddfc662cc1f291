"""A task's Dockerfile built into a local image on the real Docker engine, cached, mapped.

`ubuntu:24.04` cannot be pulled here: the tests map it to our recipe-built base image.
Each test writes its own build context (a unique marker file), so its key is new and a
build really runs; the cache dir (logs, locks, exported rootfs) is per test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities, SandboxBackends
from sandboxes.base import SandboxHandle
from sandboxes.image.task_images import (
    BuildFailed,
    ImageNotAvailable,
    TaskImage,
    content_hash_of,
    ensure_task_image,
    prebuild_tasks,
)
from schemas.environment import EnvironmentBuild
from schemas.rollout import BAD_TASK_SPEC
from schemas.tasks import RolloutTask
from tests.fixtures.sandboxes import provision_request

pytestmark = [pytest.mark.integration]
session_loop = pytest.mark.asyncio(loop_scope="session")

BASE = "agentic-rollout/sandbox-base:latest"
MAP = {"ubuntu:24.04": BASE}
DOCKERFILE = (
    "FROM ubuntu:24.04\n"
    "COPY marker.txt /opt/marker.txt\n"
    "RUN echo built-by-dockerfile > /opt/built.txt && chmod 644 /opt/built.txt\n"
)


class Built:
    """The images a test built, removed when it ends."""

    def __init__(self) -> None:
        self.tags: set[str] = set()

    def add(self, img: TaskImage) -> TaskImage:
        self.tags.add(img.tag)
        return img


@pytest.fixture
def cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sandbox_base_image: Any
) -> Iterator[Path]:
    d = tmp_path / "cache"
    monkeypatch.setenv("ROLLOUT_SANDBOX_CACHE_DIR", str(d))
    yield d
    shutil.rmtree(d, ignore_errors=True)  # an exported rootfs is large


@pytest.fixture
def built() -> Iterator[Built]:
    b = Built()
    yield b
    for tag in b.tags:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def context(tmp_path: Path, dockerfile: str = DOCKERFILE, marker: str | None = None) -> Path:
    ctx = tmp_path / f"ctx-{uuid.uuid4().hex[:8]}"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(dockerfile)
    (ctx / "marker.txt").write_text((marker or uuid.uuid4().hex) + "\n")
    return ctx


def build_of(
    ctx: Path, timeout_s: float = 300, image_map: dict[str, str] | None = None
) -> EnvironmentBuild:
    return EnvironmentBuild(
        context=str(ctx),
        content_hash=content_hash_of(ctx),
        timeout_s=timeout_s,
        base_image_map=MAP if image_map is None else image_map,
    )


def run_in(tag: str, path: str) -> str:
    r = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "cat", tag, path],
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.strip()


def test_builds_once_then_cached(tmp_path: Path, cache: Path, built: Built) -> None:
    ctx = context(tmp_path, marker="first")
    build = build_of(ctx)
    first = built.add(ensure_task_image(build))
    assert not first.cached and first.build_seconds > 0
    assert first.tag.startswith("agentic-rollout/task-env:") and first.key in first.tag
    log = Path(first.log_path or "")
    assert log.parent == cache / "builds" and "Successfully built" in log.read_text()
    assert run_in(first.tag, "/opt/marker.txt") == "first"
    assert run_in(first.tag, "/opt/built.txt") == "built-by-dockerfile"
    log.write_text("")  # a second build would write to it again
    second = ensure_task_image(build)
    assert second.cached and second.image_id == first.image_id and second.tag == first.tag
    assert log.read_text() == ""


NET_DOCKERFILE = (
    "FROM ubuntu:24.04\n"
    "COPY marker.txt /opt/marker.txt\n"
    "RUN ls /sys/class/net > /opt/ifaces.txt && chmod 644 /opt/ifaces.txt\n"
)


def test_run_steps_build_without_network_unless_the_run_says_otherwise(
    tmp_path: Path, cache: Path, built: Built
) -> None:
    """The RUN step lists its network interfaces (no traffic is sent). The control first:
    built with `host` it sees the host's, so the listing would show a network. Then the
    same Dockerfile as a task gives it (network `none`): only `lo`, so docker's layer
    cache did not hand it the step the host build ran. The network is part of the key."""
    ctx = context(tmp_path, NET_DOCKERFILE)
    default = build_of(ctx)
    assert default.network == "none"
    host = built.add(ensure_task_image(default.model_copy(update={"network": "host"})))
    host_ifaces = run_in(host.tag, "/opt/ifaces.txt").split()
    assert "lo" in host_ifaces and len(host_ifaces) > 1, host_ifaces
    isolated = built.add(ensure_task_image(default))
    assert isolated.key != host.key and not isolated.cached
    assert run_in(isolated.tag, "/opt/ifaces.txt").split() == ["lo"]
    assert "--network none" in Path(isolated.log_path or "").read_text()
    labels = json.loads(
        subprocess.run(
            ["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", isolated.tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert labels["agentic-rollout.build-network"] == "none"


def test_changed_context_file_or_rebuilt_base_is_a_new_key(
    tmp_path: Path, cache: Path, built: Built
) -> None:
    ctx = context(tmp_path, marker="one")
    first = built.add(ensure_task_image(build_of(ctx)))
    (ctx / "marker.txt").write_text("two\n")
    changed = built.add(ensure_task_image(build_of(ctx)))
    assert changed.key != first.key and not changed.cached
    assert run_in(changed.tag, "/opt/marker.txt") == "two"
    # Same context, but the mapped base tag now names another image: a new key.
    base_tag = f"agentic-rollout/test-base:{uuid.uuid4().hex[:8]}"
    built.tags.add(base_tag)
    subprocess.run(["docker", "tag", BASE, base_tag], check=True)
    on_base = built.add(ensure_task_image(build_of(ctx, image_map={"ubuntu:24.04": base_tag})))
    subprocess.run(["docker", "tag", first.tag, base_tag], check=True)  # "rebuilt"
    on_rebuilt = built.add(ensure_task_image(build_of(ctx, image_map={"ubuntu:24.04": base_tag})))
    assert on_rebuilt.key != on_base.key and not on_rebuilt.cached


def test_unmapped_missing_base_is_refused_before_building(tmp_path: Path, cache: Path) -> None:
    missing = f"never-built/{uuid.uuid4().hex[:8]}:1"
    ctx = context(tmp_path, dockerfile=f"FROM {missing}\nRUN true\n")
    with pytest.raises(ImageNotAvailable) as err:
        ensure_task_image(build_of(ctx))
    assert missing in str(err.value) and f"--image-map {missing}=LOCAL_TAG" in str(err.value)
    assert not list((cache / "builds").glob("*.log")) if (cache / "builds").exists() else True
    # Mapped, but the mapping's target is not here either.
    ctx2 = context(tmp_path)
    with pytest.raises(ImageNotAvailable, match=f"mapped to {missing}"):
        ensure_task_image(build_of(ctx2, image_map={"ubuntu:24.04": missing}))


def test_failing_run_reports_the_log_tail_and_keeps_the_log(tmp_path: Path, cache: Path) -> None:
    token = uuid.uuid4().hex
    ctx = context(tmp_path, dockerfile=f"FROM ubuntu:24.04\nRUN echo {token} && exit 3\n")
    with pytest.raises(BuildFailed) as err:
        ensure_task_image(build_of(ctx))
    assert token in str(err.value) and "failed" in str(err.value)
    assert err.value.log_path is not None and token in err.value.log_path.read_text()


def test_build_timeout_kills_the_build(tmp_path: Path, cache: Path) -> None:
    token = uuid.uuid4().hex
    ctx = context(tmp_path, dockerfile=f"FROM ubuntu:24.04\nRUN sleep 600 && echo {token}\n")
    with pytest.raises(BuildFailed, match=r"timed out after 3s and was killed"):
        ensure_task_image(build_of(ctx, timeout_s=3))
    # The daemon stops the build when its client is killed: its RUN container goes away.
    deadline = time.monotonic() + 60
    while True:
        ps = subprocess.run(
            ["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        left = [line.split()[0] for line in ps.splitlines() if token in line]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    for cid in left:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    assert not left, f"build container still there after the timeout: {left}"


def test_concurrent_ensures_of_one_build_build_once(
    tmp_path: Path, cache: Path, built: Built
) -> None:
    build = build_of(context(tmp_path))
    start = threading.Barrier(4)

    def ensure() -> TaskImage:
        start.wait()
        return ensure_task_image(build)

    with ThreadPoolExecutor(4) as pool:
        results = [built.add(r) for r in pool.map(lambda _: ensure(), range(4))]
    assert sorted(r.cached for r in results) == [False, True, True, True]
    assert len({r.image_id for r in results}) == 1
    log = Path(next(r.log_path for r in results if not r.cached) or "")
    assert log.read_text().count("Successfully built") == 1


def test_prebuild_refuses_bad_tasks_and_keeps_the_rest(
    tmp_path: Path, cache: Path, built: Built
) -> None:
    good = build_of(context(tmp_path))
    bad = build_of(context(tmp_path, dockerfile="FROM ubuntu:24.04\nRUN exit 7\n"))
    tasks = [
        task("a", "docker", build=good),
        task("b", "docker", build=good),
        task("c", "docker", build=bad),
        task("d", "docker", image=f"never-built/{uuid.uuid4().hex[:8]}:1"),
        task("e", "docker", image=BASE),
    ]
    result = prebuild_tasks(tasks)
    for img in result.images:
        built.add(img)
    assert [t.task_id for t in result.tasks] == ["a", "b", "e"]
    assert len(result.images) == 1 and not result.images[0].cached
    refused = dict(result.refused)
    assert set(refused) == {"c", "d"}
    assert "exit 7" in refused["c"] or "non-zero code: 7" in refused["c"]
    assert "never-built/" in refused["d"] and "--image-map" in refused["d"]


def test_images_build_command_builds_a_task_file(tmp_path: Path, cache: Path, built: Built) -> None:
    """`rollout images build` on a JSONL task file: one build for two tasks, then cached;
    a task whose build fails is listed and the exit status says so."""
    from typer.testing import CliRunner

    from workers.cli import app

    good = build_of(context(tmp_path))
    bad = build_of(context(tmp_path, dockerfile="FROM ubuntu:24.04\nRUN exit 9\n"))
    path = tmp_path / "tasks.jsonl"
    path.write_text(
        "\n".join(
            t.model_dump_json() for t in (task("a", "docker", good), task("b", "docker", good))
        )
        + "\n"
    )
    runner = CliRunner()
    first = runner.invoke(app, ["images", "build", str(path), "--json"])
    assert first.exit_code == 0, first.output
    out = json.loads(first.stdout)
    assert out["ready"] == ["a", "b"] and out["refused"] == []
    assert [i["cached"] for i in out["images"]] == [False]
    built.tags.add(out["images"][0]["tag"])
    again = json.loads(runner.invoke(app, ["images", "build", str(path), "--json"]).stdout)
    assert [i["cached"] for i in again["images"]] == [True]
    path.write_text(task("c", "docker", bad).model_dump_json() + "\n")
    failed = runner.invoke(app, ["images", "build", str(path)])
    assert failed.exit_code == 1 and "refused c: sandbox.build:" in failed.output
    bad_map = runner.invoke(app, ["images", "build", str(path), "--image-map", "nothing"])
    assert bad_map.exit_code == 2 and "FROM=LOCAL_TAG" in bad_map.output


# ------------------------------------------------------------------ through provision
def task(
    task_id: str, backend: str, build: EnvironmentBuild | None = None, image: str | None = None
) -> RolloutTask:
    sandbox: dict[str, Any] = {"backend": backend}
    if build is not None:
        sandbox["build"] = build.model_dump()
    if image is not None:
        sandbox["image"] = image
    return RolloutTask.model_validate(
        {
            "task_id": task_id,
            "prompt": "p",
            "harness": {"name": "command", "config": {"command": "true"}},
            "sandbox": sandbox,
        }
    )


@pytest.fixture
async def host(sandbox_state_dir: Path) -> Any:
    backends = SandboxBackends(
        {
            "docker": {"state_dir": str(sandbox_state_dir / f"ti-docker-{uuid.uuid4().hex[:6]}")},
            "local": {"state_dir": str(sandbox_state_dir / f"ti-local-{uuid.uuid4().hex[:6]}")},
        }
    )
    yield SandboxActivities(backends, "h1", "q-h1")
    for b in backends.active():
        for h in await b.list():
            await b.destroy(h)
    await backends.aclose()


async def provision_and_read(host: SandboxActivities, t: RolloutTask) -> tuple[Any, str]:
    """Provision `t` through the real activity; its sandbox's view of the built files."""
    ref = await ActivityEnvironment().run(host.provision_sandbox, provision_request(t))
    handle = SandboxHandle.model_validate(ref.handle)
    sb = await host.backends.get(t.sandbox.backend).attach(handle)
    try:
        r = await sb.exec(["cat", "/opt/marker.txt", "/opt/built.txt"], timeout=30)
        assert r.exit_code == 0, r.stderr
        return ref, r.stdout
    finally:
        await sb.destroy()


@session_loop
async def test_provision_builds_and_the_docker_backend_runs_the_image(
    tmp_path: Path, cache: Path, built: Built, host: SandboxActivities
) -> None:
    token = uuid.uuid4().hex
    build = build_of(context(tmp_path, marker=token))
    ref, seen = await provision_and_read(host, task("t1", "docker", build))
    img = built.add(ensure_task_image(build))
    assert img.cached  # the provision built it
    assert ref.env_version == img.image_id
    assert seen.split() == [token, "built-by-dockerfile"]


@session_loop
async def test_the_local_backend_runs_the_built_image_rootfs(
    tmp_path: Path, sandbox_base_image: Any, host: SandboxActivities
) -> None:
    """On this host's real cache dir with a fixed context: the rootfs export of a ~3 GB
    image is slow, so its image (and export) is kept for the next run, like the base's."""
    ctx = context(tmp_path, marker="local-backend-task-image")
    ref, seen = await provision_and_read(host, task("t1", "local", build_of(ctx)))
    img = ensure_task_image(build_of(ctx))
    assert ref.env_version == img.image_id
    assert seen.split() == ["local-backend-task-image", "built-by-dockerfile"]


@session_loop
async def test_provision_refuses_a_failing_build_as_a_bad_task(
    tmp_path: Path, cache: Path, host: SandboxActivities
) -> None:
    token = uuid.uuid4().hex
    build = build_of(context(tmp_path, dockerfile=f"FROM ubuntu:24.04\nRUN echo {token}; exit 5\n"))
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            host.provision_sandbox, provision_request(task("t-bad", "docker", build))
        )
    assert err.value.type == BAD_TASK_SPEC and err.value.non_retryable
    assert "t-bad" in err.value.message and token in err.value.message


@session_loop
@pytest.mark.parametrize("backend", ["docker", "local"])
async def test_provision_refuses_an_image_that_is_neither_local_nor_mapped(
    backend: str, cache: Path, host: SandboxActivities
) -> None:
    missing = f"never-built/{uuid.uuid4().hex[:8]}:1"
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            host.provision_sandbox, provision_request(task("t-img", backend, image=missing))
        )
    assert err.value.type == BAD_TASK_SPEC and err.value.non_retryable
    assert missing in err.value.message and "--image-map" in err.value.message
    assert not await host.backends.get(backend).list()


@session_loop
async def test_provision_refuses_a_build_on_e2b(tmp_path: Path, cache: Path) -> None:
    acts = SandboxActivities(SandboxBackends({"e2b": {}}), "h1", "q-h1")
    build = build_of(context(tmp_path))
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            acts.provision_sandbox, provision_request(task("t-e2b", "e2b", build))
        )
    assert err.value.type == BAD_TASK_SPEC and "e2b template" in err.value.message
