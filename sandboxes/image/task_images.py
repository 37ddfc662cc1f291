"""A task's Dockerfile (`EnvironmentBuild`) as a local image, built once per host.

Why: dataset tasks (Harbor, SWE-bench style) bring a Dockerfile, often the same one for
hundreds of tasks, and nothing can be pulled here. So the build is cached by a key made
of the task's `content_hash`, the base-image map entries the build uses and the image ids
those bases resolve to (a rebuilt base is a new key), tagged
`agentic-rollout/task-env:<key>`; a second provision finds the tag and builds nothing.
Every external image must be local or mapped (`--image-map FROM=LOCAL_TAG`) before the
build starts; the Dockerfile is rewritten through the map into a copy outside the
context; a mapped base that sets a non-root user gets `USER root` after its FROM, since
the official images such maps stand in for start as root. A per-key file lock makes
concurrent provisions of tasks sharing a Dockerfile build once. RUN steps get the
build's `network` (`none` unless the run said `--build-network`; part of the key, and a
label after every FROM so docker's layer cache never hands a network-less build a step
run with network), so a dataset's Dockerfile cannot fetch code or reach this host's
services. Logs are kept under the cache dir (`builds/<key>.log`, the newest
`KEEP_LOGS`); the build's `timeout_s` kills it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sandboxes.host.commands import dies_with_this_thread
from sandboxes.image import dockerfile_refs
from sandboxes.image.base_image import cache_dir
from sandboxes.registry import backend_class
from schemas.environment import EnvironmentBuild
from schemas.tasks import RolloutTask

TASK_IMAGE_REPO = "agentic-rollout/task-env"
KEY_LABEL = "agentic-rollout.task-env-key"
CONTENT_LABEL = "agentic-rollout.content-hash"
NETWORK_LABEL = "agentic-rollout.build-network"
#: Build logs kept per host (oldest removed first).
KEEP_LOGS = 200
#: Characters of the log's end carried by a build error.
TAIL_CHARS = 3000
#: Bump when the way the image is built changes meaning (new key for every build).
BUILD_RECIPE_VERSION = "1"
MAP_HINT = "map it to a local image: --image-map {ref}=LOCAL_TAG (or build/load it here first)"


class TaskImage(BaseModel):
    """The image a task's build resolved to on this host."""

    tag: str
    image_id: str
    cached: bool = Field(description="found already built: no build ran")
    build_seconds: float = 0.0
    log_path: str | None = None
    key: str = ""


class TaskImageError(RuntimeError):
    """The task's environment cannot be made here: the task is at fault, not the host."""


class ImageNotAvailable(TaskImageError):
    """An image the task names is neither present locally nor mapped."""


class BuildFailed(TaskImageError):
    """`docker build` failed or ran out of time; the message ends with the log's tail."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


class DockerUnavailable(RuntimeError):
    """No Docker engine here: the host's problem, not the task's."""


# ------------------------------------------------------------------ docker access
_client_lock = threading.Lock()
_client: Any = None


def _api() -> Any:
    """A low-level docker API client (inspects cost ~ms instead of a CLI process)."""
    global _client
    with _client_lock:
        if _client is None:
            try:
                import docker

                _client = docker.from_env().api
                _client.ping()
            except Exception as exc:  # any failure means: no engine
                _client = None
                raise DockerUnavailable(
                    f"docker engine not reachable ({exc}); task images are built with it: "
                    "run scripts/install_system_deps.sh"
                ) from exc
        return _client


def image_info(ref: str) -> dict[str, Any] | None:
    """`docker image inspect` of `ref`, or None when it is not present locally."""
    import docker.errors

    try:
        return dict(_api().inspect_image(ref))
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        if exc.status_code == 404:
            return None
        raise


def image_id(ref: str) -> str | None:
    info = image_info(ref)
    return str(info["Id"]) if info else None


def resolve_image(ref: str, image_map: dict[str, str] | None = None) -> str:
    """The local image to run for `ref`: its mapping when mapped (which must exist),
    else `ref` itself when present; otherwise `ImageNotAvailable` naming it."""
    mapped = dockerfile_refs.lookup(ref, image_map or {})
    if mapped is not None:
        if image_id(mapped) is None:
            raise ImageNotAvailable(
                f"image {ref} is mapped to {mapped}, which is not present locally "
                "(build or load it on this host first)"
            )
        return mapped
    if image_id(ref) is None:
        raise ImageNotAvailable(
            f"image {ref} is not present locally and cannot be pulled here; "
            + MAP_HINT.format(ref=ref)
        )
    return ref


def content_hash_of(context: Path | str) -> str:
    """`sha256:<hex>` of every file under `context` (relative path and bytes): the
    `EnvironmentBuild.content_hash` of a context, for callers that make builds by hand
    (a task format's loader computes its own)."""
    root = Path(context)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


# ------------------------------------------------------------------ the build plan
class _Plan(BaseModel):
    key: str
    tag: str
    dockerfile_text: str
    used_map: dict[str, str]
    base_ids: dict[str, str]


def builds_dir() -> Path:
    d = cache_dir() / "builds"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _plan(build: EnvironmentBuild) -> _Plan:
    """Read the Dockerfile, resolve every external image (refusing unmapped missing
    ones before anything is built), and derive the cache key."""
    context = Path(build.context)
    dockerfile = context / build.dockerfile
    if not context.is_dir():
        raise TaskImageError(f"build context {context} is not a directory on this host")
    try:
        text = dockerfile.read_text()
    except OSError as exc:
        raise TaskImageError(f"cannot read Dockerfile {dockerfile}: {exc.strerror}") from exc
    try:
        refs = dockerfile_refs.external_refs(text)
    except dockerfile_refs.DockerfileError as exc:
        raise TaskImageError(f"{dockerfile}: {exc}") from exc
    used: dict[str, str] = {}
    base_ids: dict[str, str] = {}
    replacements: dict[int, str] = {}
    as_root: set[int] = set()
    for ref in refs:
        mapped = dockerfile_refs.lookup(ref.resolved, build.base_image_map)
        local = mapped if mapped is not None else ref.resolved
        info = image_info(local)
        if info is None:
            where = f"{dockerfile}: {ref.keyword} {ref.written}"
            if mapped is not None:
                raise ImageNotAvailable(
                    f"{where}: mapped to {mapped}, which is not present locally "
                    "(build or load it on this host first)"
                )
            raise ImageNotAvailable(
                f"{where}: base image {ref.resolved} is not present locally and cannot "
                "be pulled here; " + MAP_HINT.format(ref=ref.resolved)
            )
        if mapped is not None:
            used[ref.resolved] = mapped
            replacements[ref.instruction] = mapped
            user = str((info.get("Config") or {}).get("User") or "")
            if ref.keyword == "FROM" and user not in ("", "root", "0", "0:0", "root:root"):
                as_root.add(ref.instruction)
        base_ids[local] = str(info["Id"])
    key_inputs = {
        "recipe": BUILD_RECIPE_VERSION,
        "content_hash": build.content_hash,
        "dockerfile": build.dockerfile,
        "map": used,
        "bases": base_ids,
        "network": build.network,
    }
    key = hashlib.sha256(json.dumps(key_inputs, sort_keys=True).encode()).hexdigest()[:16]
    return _Plan(
        key=key,
        tag=f"{TASK_IMAGE_REPO}:{key}",
        # The label after every FROM keeps docker's layer cache apart per network: a
        # network-less build never reuses a step an earlier build ran with network.
        dockerfile_text=dockerfile_refs.rewrite(
            text,
            replacements,
            frozenset(as_root),
            after_every_from=f"LABEL {NETWORK_LABEL}={build.network}\n",
        ),
        used_map=used,
        base_ids=base_ids,
    )


def _built(plan: _Plan) -> str | None:
    """The id of the already-built image for this key, if any."""
    info = image_info(plan.tag)
    if not info:
        return None
    labels = (info.get("Config") or {}).get("Labels") or {}
    return str(info["Id"]) if labels.get(KEY_LABEL) == plan.key else None


# ------------------------------------------------------------------ locking, logs
@contextlib.contextmanager
def _key_lock(key: str, wait_s: float) -> Iterator[None]:
    """Exclusive per-key lock across processes and threads (flock on its own file
    description), waited for at most `wait_s` so a stuck build cannot hold others
    forever."""
    path = builds_dir() / f"{key}.lock"
    deadline = time.monotonic() + wait_s
    with open(path, "w") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise TaskImageError(
                        f"waited {wait_s:.0f}s for another build of {key} to finish"
                    ) from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _prune_logs(keep: int = KEEP_LOGS) -> None:
    logs = sorted(builds_dir().glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in logs[keep:]:
        with contextlib.suppress(OSError):
            old.unlink()


def log_tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return ("…" if size > chars else "") + data


# ------------------------------------------------------------------ build
def _run_build(build: EnvironmentBuild, plan: _Plan, log_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="task-env-", dir=builds_dir()) as tmp:
        dockerfile = Path(tmp) / "Dockerfile"
        dockerfile.write_text(plan.dockerfile_text)
        cmd = [
            "docker", "build", "--pull=false", "--network", build.network, "--force-rm",
            "-f", str(dockerfile), "-t", plan.tag,
            "--label", f"{KEY_LABEL}={plan.key}",
            "--label", f"{CONTENT_LABEL}={build.content_hash}",
            build.context,
        ]  # fmt: skip
        with open(log_path, "wb") as log:
            log.write(f"+ {' '.join(cmd)}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "DOCKER_BUILDKIT": "0"},
                start_new_session=True,
                preexec_fn=dies_with_this_thread(),  # a killed worker's build stops too
            )
            try:
                rc = proc.wait(timeout=build.timeout_s)
            except subprocess.TimeoutExpired:
                # The client going away cancels the daemon's build (and --force-rm
                # removes its intermediate container).
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                log.write(f"\n[build killed: timeout {build.timeout_s:g}s]\n".encode())
                log.flush()
                raise BuildFailed(
                    f"build of {build.context} timed out after {build.timeout_s:g}s and was "
                    f"killed (log {log_path}); last output:\n{log_tail(log_path)}",
                    log_path,
                ) from None
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
    if rc != 0:
        raise BuildFailed(
            f"docker build of {build.context} failed (exit {rc}; log {log_path}); "
            f"last output:\n{log_tail(log_path)}",
            log_path,
        )


def ensure_task_image(build: EnvironmentBuild) -> TaskImage:
    """The built image for `build`, building it unless this host has it already.

    Blocking (run it off the event loop). Raises `ImageNotAvailable` (a base neither
    local nor mapped: before building), `BuildFailed` (with the log tail), other
    `TaskImageError`s for an unreadable context, `DockerUnavailable` without an engine.
    """
    plan = _plan(build)
    iid = _built(plan)
    if iid:
        return TaskImage(tag=plan.tag, image_id=iid, cached=True, key=plan.key)
    log_path = builds_dir() / f"{plan.key}.log"
    with _key_lock(plan.key, wait_s=build.timeout_s + 120):
        iid = _built(plan)  # built by whoever held the lock before us
        if iid:
            return TaskImage(
                tag=plan.tag, image_id=iid, cached=True, key=plan.key, log_path=str(log_path)
            )
        t0 = time.monotonic()
        try:
            _run_build(build, plan, log_path)
        finally:
            _prune_logs()
        iid = _built(plan)
        if not iid:
            raise BuildFailed(f"docker build reported success but {plan.tag} is missing", log_path)
    return TaskImage(
        tag=plan.tag,
        image_id=iid,
        cached=False,
        build_seconds=round(time.monotonic() - t0, 2),
        log_path=str(log_path),
        key=plan.key,
    )


# ------------------------------------------------------------------ batches
class Prebuilt(BaseModel):
    """What `prebuild_tasks` found: the tasks that can run, and why the others cannot."""

    tasks: list[RolloutTask] = Field(default_factory=list)
    refused: list[tuple[str, str]] = Field(default_factory=list)
    images: list[TaskImage] = Field(default_factory=list)


def prebuild_tasks(tasks: list[RolloutTask]) -> Prebuilt:
    """Build every distinct `sandbox.build` once (sequentially, each cached) and check
    every direct `image` on a docker/local task; a task whose environment cannot be made
    is refused with the reason (a failed build's log tail included), the rest run.
    `images`: each image once, however many task directories share its Dockerfile.

    For the submitting side when Docker is reachable there: the sandbox hosts then find
    the images built (same host) or the failures are known before anything is submitted.
    """
    out = Prebuilt()
    by_build: dict[str, TaskImage | str] = {}
    for task in tasks:
        build = task.sandbox.build
        if build is None:
            reason = _direct_image_problem(task)
            if reason:
                out.refused.append((task.task_id, reason))
            else:
                out.tasks.append(task)
            continue
        k = build.model_dump_json()
        if k not in by_build:
            try:
                by_build[k] = img = ensure_task_image(build)
                if all(seen.key != img.key for seen in out.images):
                    out.images.append(img)  # one line per image, not per task dir using it
            except TaskImageError as exc:
                by_build[k] = str(exc)
        result = by_build[k]
        if isinstance(result, str):
            out.refused.append((task.task_id, f"sandbox.build: {result}"))
        else:
            out.tasks.append(task)
    return out


def _direct_image_problem(task: RolloutTask) -> str | None:
    image = task.sandbox.spec_fields().get("image")
    if not image or not backend_class(task.sandbox.backend).runs_local_images:
        return None
    try:
        resolve_image(str(image))
    except ImageNotAvailable as exc:
        return f"sandbox.image: {exc}"
    return None
