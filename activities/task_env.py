"""The image a task's sandbox runs, made ready on this host before create.

A task with `sandbox.build` (and no `image`) gets its Dockerfile built here once
(`sandboxes.image.task_images`) and the spec's image set to the built tag; a task naming an
`image` on a host-local backend gets it checked (present locally, since nothing can be
pulled). The local backend runs an image's exported rootfs, so that is exported too and
named in the spec. A base or image that is neither local nor mapped, or a failed build,
is the task's fault: non-retryable, with the build log's tail. E2B builds templates in
its own cloud from a Dockerfile, which this host cannot do for it: refused clearly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from activities.errors import bad_task
from sandboxes.backends.local import lookup_rootfs
from sandboxes.base import SandboxSpec
from sandboxes.image.base_image import ensure_rootfs
from sandboxes.image.task_images import (
    DockerUnavailable,
    TaskImageError,
    ensure_task_image,
    resolve_image,
)
from sandboxes.registry import backend_class
from schemas.tasks import RolloutTask

#: Images seen present on this host (a positive answer is kept; tags are not reused).
_present: set[str] = set()

#: Told of each image made ready: (kind: "task_image" | "rootfs", cached).
ImageReady = Callable[[str, bool], None]


class EnvironmentUnavailable(RuntimeError):
    """This host cannot make the image (no Docker engine): retry elsewhere."""


def refuse_unbuildable(task: RolloutTask) -> None:
    """A build for a backend that does not run local images: the task's fault, said
    before that backend is even set up."""
    backend = task.sandbox.backend
    build = task.sandbox.build
    if build is None or task.sandbox.spec_fields().get("image"):
        return
    if backend_class(backend).runs_local_images:
        return
    raise bad_task(
        f"task {task.task_id}: sandbox.build: the {backend} backend cannot run an image "
        "built on this host; build a template from the Dockerfile with the backend's own "
        "tooling (e2b: `e2b template build`) and name it in sandbox.image"
    )


async def prepare_image(
    task: RolloutTask,
    spec: SandboxSpec,
    beat: Any,
    interval_s: float,
    on_ready: ImageReady | None = None,
) -> SandboxSpec:
    """`spec` with the task's image made ready here (built, checked, exported).

    `beat(...)` is awaited around the blocking work with `interval_s` heartbeats (the
    provision's `with_heartbeat`), so a long build keeps the activity alive. `on_ready`
    hears of each task image built or found, and each rootfs exported or found.
    """
    tell: ImageReady = on_ready or (lambda kind, cached: None)
    backend = backend_class(task.sandbox.backend)
    build = task.sandbox.build
    if build is not None and spec.image is None:
        refuse_unbuildable(task)
        try:
            img = await beat(asyncio.to_thread(ensure_task_image, build), interval_s)
        except TaskImageError as exc:
            raise bad_task(f"task {task.task_id}: sandbox.build", exc) from exc
        except DockerUnavailable as exc:
            raise EnvironmentUnavailable(str(exc)) from exc
        tell("task_image", img.cached)
        spec = spec.model_copy(update={"image": img.tag})
    elif spec.image is not None and backend.runs_local_images and spec.image not in _present:
        try:
            await asyncio.to_thread(resolve_image, spec.image)
        except TaskImageError as exc:
            raise bad_task(f"task {task.task_id}: sandbox.image", exc) from exc
        except DockerUnavailable as exc:
            if not backend.runs_image_rootfs:
                raise EnvironmentUnavailable(str(exc)) from exc
            return spec  # no docker here: the backend uses the rootfs exported before
        _present.add(spec.image)
    if backend.runs_image_rootfs and spec.image is not None and spec.rootfs is None:
        found = await asyncio.to_thread(lookup_rootfs, spec.image)
        if found is None:
            exported = await beat(asyncio.to_thread(ensure_rootfs, spec.image), interval_s)
        else:
            exported = found[0]
        tell("rootfs", found is not None)
        spec = spec.model_copy(update={"rootfs": str(exported)})
    return spec
