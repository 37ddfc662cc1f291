"""N tasks sharing one Dockerfile: builds run, and provision latency next to today's.

Usage: python -m bench.task_images [--tasks 100] [--wave 8] [--keep]

Every task carries the same `sandbox.build` (FROM ubuntu:24.04, mapped to our base
image; a fresh context per run, so the first provisions really build). Provisions go
through the real `provision_sandbox` activity on the docker backend:
  wave      the first `--wave` tasks at once: the build runs once (counted from the
            Docker engine's image tag events), the rest wait on its lock and reuse it;
  cached    the remaining tasks one by one (image found: a key check, then create);
  base      as many provisions of a task without a build (the base image: today's
            docker cold create through the same activity), interleaved with `cached`
            so load drifts hit both alike;
  ensure    `ensure_task_image` alone on the built image, `--tasks` times (its cost in
            a provision).
Each sandbox is destroyed after its timing (not timed). Needs the base image
(scripts/build_base_image.sh) and the docker engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities, SandboxBackends
from bench.common import percentile
from sandboxes.image import task_images
from sandboxes.image.base_image import IMAGE_REPO
from schemas.environment import EnvironmentBuild
from schemas.rollout import ProvisionRequest, SessionRef
from schemas.tasks import RolloutTask

DOCKERFILE = (
    "FROM ubuntu:24.04\n"
    "COPY marker.txt /opt/marker.txt\n"
    "RUN echo built > /opt/built.txt\n"
    "WORKDIR /app\n"
)


def summary(xs: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in xs)
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 0.5), 1),
        "p99_ms": round(percentile(ms, 0.99), 1),
        "max_ms": round(ms[-1], 1) if ms else 0.0,
    }


def make_task(i: int, build: EnvironmentBuild | None) -> RolloutTask:
    sandbox: dict[str, Any] = {"backend": "docker"}
    if build is not None:
        sandbox["build"] = build.model_dump()
    return RolloutTask.model_validate(
        {
            "task_id": f"t{i}",
            "prompt": "p",
            "harness": {"name": "command", "config": {"command": "true"}},
            "sandbox": sandbox,
        }
    )


def request(t: RolloutTask) -> ProvisionRequest:
    return ProvisionRequest(
        rollout_id=f"bench-{uuid.uuid4().hex[:10]}",
        attempt=1,
        task=t,
        session=SessionRef(
            session_id="s",
            token="t",
            openai_base_url="http://127.0.0.1:9/v1",
            anthropic_base_url="http://127.0.0.1:9",
            gateway_url="http://127.0.0.1:9",
            owner_queue="q-gw",
        ),
        timeout_s=600,
    )


class TagWatch:
    """The builds that really ran, as the Docker engine reports them: each finished build
    tags its image once (an image `tag` event), and nothing else here tags the task image.
    Watched from outside (`docker events`), so the product runs unpatched."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["docker", "events", "--since", f"{time.time():.3f}",
             "--filter", "type=image", "--filter", "event=tag",
             "--format", "{{.TimeNano}} {{.Actor.Attributes.name}}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.lines: list[str] | None = None

    def stop(self, tag: str | None) -> list[int]:
        """Stop watching; when each build of `tag` finished (ns since the epoch), in order.

        `docker events` streams from the engine as events happen; by the time the cached
        provisions have run, every tag of the wave has long been delivered."""
        if self.lines is None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=30)
            self.lines = out.splitlines()
        if tag is None:
            return []
        found = (line.split(" ", 1) for line in self.lines)
        return sorted(int(ns) for ns, name in found if name == tag)


class Host:
    """The real provision activity on a docker backend; destroys what it times."""

    def __init__(self, state: Path) -> None:
        self.backends = SandboxBackends({"docker": {"state_dir": str(state / "docker")}})
        self.acts = SandboxActivities(self.backends, "bench", "q-bench")

    async def provision(self, t: RolloutTask) -> tuple[float, Any]:
        t0 = time.perf_counter()
        ref = await ActivityEnvironment().run(self.acts.provision_sandbox, request(t))
        return time.perf_counter() - t0, ref

    async def destroy_all(self) -> None:
        b = self.backends.get("docker")
        for h in await b.list():
            await b.destroy(h)


async def run(n_tasks: int, wave: int, state: Path) -> dict[str, Any]:
    ctx = state / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "marker.txt").write_text(uuid.uuid4().hex + "\n")  # new key: a real build
    build = EnvironmentBuild(
        context=str(ctx),
        content_hash=task_images.content_hash_of(ctx),
        base_image_map={"ubuntu:24.04": f"{IMAGE_REPO}:latest"},
    )
    host = Host(state)
    watch = TagWatch()
    try:
        await host.provision(make_task(-1, None))  # warm-up: image checks, first caches
        await host.destroy_all()
        wave_n = min(wave, n_tasks)
        wave_start_ns = time.time_ns()
        t0 = time.perf_counter()
        firsts = await asyncio.gather(*(host.provision(make_task(i, build)) for i in range(wave_n)))
        wave_s = time.perf_counter() - t0
        tag = firsts[0][1].handle.get("details", {}).get("image")
        await host.destroy_all()
        cached: list[float] = []
        base: list[float] = []
        for i in range(wave_n, n_tasks):
            for bucket, b in ((cached, build), (base, None)):
                dt, _ = await host.provision(make_task(i, b))
                bucket.append(dt)
                await host.destroy_all()
        checks: list[float] = []
        for _ in range(n_tasks):  # the cache check alone (plan + key + tag inspect)
            t1 = time.perf_counter()
            img = await asyncio.to_thread(task_images.ensure_task_image, build)
            checks.append(time.perf_counter() - t1)
            assert img.cached
        tagged = watch.stop(tag)
        return {
            "tasks": n_tasks,
            "ensure_cached": summary(checks),
            "builds": len(tagged),
            "tagged_after_s": round((tagged[0] - wave_start_ns) / 1e9, 2) if tagged else None,
            "wave": {"n": wave_n, "wall_s": round(wave_s, 2), **summary([d for d, _ in firsts])},
            "provision_cached": summary(cached),
            "provision_base_cold": summary(base),
            "image": tag,
        }
    finally:
        watch.stop(None)
        await host.destroy_all()
        await host.backends.aclose()


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--wave", type=int, default=8, help="first provisions started at once")
    ap.add_argument("--keep", action="store_true", help="keep the built image")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    a = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="ar-bench-ti-", dir="/tmp"))
    state.chmod(0o755)
    os.environ["ROLLOUT_SANDBOX_CACHE_DIR"] = str(state / "cache")  # logs, locks: this run's
    try:
        out = await run(a.tasks, a.wave, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if not a.keep and out.get("image"):
        subprocess.run(["docker", "rmi", "-f", out["image"]], capture_output=True)
    if not a.json:
        w = out["wave"]
        print(
            f"{out['tasks']} tasks, one Dockerfile: {out['builds']} build(s), the image tagged "
            f"{out['tagged_after_s']} s after the first wave started"
        )
        print(f"first wave: {w['n']} at once, {w['wall_s']} s wall (build included)")
        print(f"{'provision':28} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
        for name in ("ensure_cached", "provision_cached", "provision_base_cold"):
            s = out[name]
            print(f"{name:28} {s['n']:>4} {s['p50_ms']:>9} {s['p99_ms']:>9} {s['max_ms']:>9}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
