"""Warm pools, the reaper, and backend-specific details (rootfs choice, image id)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sandboxes import reaper
from sandboxes.base import SandboxSpec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.needs("base_image"),
]


def rid() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


async def test_warm_pool_acquire_is_fast_and_refills(sandbox_backend: Any) -> None:
    """A create with a warm pool hands out one of the blanks made ahead of time, and
    takes less time than a cold create of the same spec measured beside it (the
    `sandbox_acquire` bench has the figures)."""
    spec = SandboxSpec(rollout_id=rid())
    key = sandbox_backend._key(spec)
    sandbox_backend.pool.size = 0  # no pool: this create starts a sandbox of its own
    t0 = time.perf_counter()
    cold = await sandbox_backend.create(SandboxSpec(rollout_id=rid()))
    cold_s = time.perf_counter() - t0
    await cold.destroy()
    sandbox_backend.pool.size = 2
    await sandbox_backend.warm(spec)
    assert sandbox_backend.pool.idle(key) == 2
    blanks = {b.handle.sandbox_id for b in sandbox_backend.pool.idle_items()}
    sandbox_backend.pool.paused = True  # no refill competes with the timed acquire
    t0 = time.perf_counter()
    sb = await sandbox_backend.create(spec)
    warm_s = time.perf_counter() - t0
    sandbox_backend.pool.paused = False
    try:
        assert sb.handle.sandbox_id in blanks, "the create did not take a pooled blank"
        assert warm_s < cold_s, f"warm {warm_s * 1000:.1f} ms, cold {cold_s * 1000:.1f} ms"
        assert sb.handle.rollout_id == spec.rollout_id
        assert (await sb.exec(["echo", "warm"])).stdout == "warm\n"
        assert sb.env["AGENTIC_ROLLOUT_ID"] == spec.rollout_id
        # The reaper sees the assignment (state file) even though pooled containers
        # could not be labelled with it at creation.
        listed = {h.sandbox_id: h.rollout_id for h in await sandbox_backend.list()}
        assert listed[sb.handle.sandbox_id] == spec.rollout_id
        await sandbox_backend.pool.wait_full(key, timeout=60)  # refilled in the background
        assert sandbox_backend.pool.idle(key) == 2
    finally:
        await sb.destroy()
        await sandbox_backend.pool.close()
    # Closing the pool discards its blanks.
    assert [h for h in await sandbox_backend.list() if not h.rollout_id] == []


async def test_reaper_reaps_only_inactive_rollouts(local_backend: Any, docker_backend: Any) -> None:
    keep_l, gone_l, keep_d, gone_d = rid(), rid(), rid(), rid()
    sbs = [
        await local_backend.create(SandboxSpec(rollout_id=keep_l)),
        await local_backend.create(SandboxSpec(rollout_id=gone_l)),
        await docker_backend.create(SandboxSpec(rollout_id=keep_d)),
        await docker_backend.create(SandboxSpec(rollout_id=gone_d)),
    ]
    expired = await local_backend.create(SandboxSpec(rollout_id=rid(), timeout_s=0.01))
    await asyncio.sleep(0.05)
    active = {keep_l, keep_d, expired.handle.rollout_id}
    res = await reaper.reap(active, backends=[local_backend, docker_backend])
    assert sorted(res["local"]) == sorted([sbs[1].handle.sandbox_id, expired.handle.sandbox_id])
    assert res["docker"] == [sbs[3].handle.sandbox_id]
    left = {h.rollout_id for b in (local_backend, docker_backend) for h in await b.list()}
    assert {keep_l, keep_d} <= left and not {gone_l, gone_d} & left
    assert (await sbs[0].exec(["true"])).ok and (await sbs[2].exec(["true"])).ok
    for sb in sbs:
        await sb.destroy()


async def test_reaper_reaps_blanks_of_a_dead_owner(local_backend: Any) -> None:
    """A worker that crashed with a filled pool leaves blanks: they are reaped."""
    sb = await local_backend.create(SandboxSpec(rollout_id=rid()))
    sdir = Path(sb.handle.details["state_dir"])
    h = json.loads((sdir / "handle.json").read_text())
    h["rollout_id"] = ""
    h["details"]["owner"] = f"{os.uname().nodename}:999999999:1"  # a pid that cannot exist
    (sdir / "handle.json").write_text(json.dumps(h))
    live_blank = await local_backend._make_blank(local_backend._key(SandboxSpec(rollout_id="x")))
    reaped = await local_backend.reap(set())
    assert sb.handle.sandbox_id in reaped
    assert live_blank.handle.sandbox_id not in reaped  # owned by this live process
    await live_blank.destroy()


async def test_reaper_reports_unavailable_backend() -> None:
    res = await reaper.reap(set(), backends=["e2b"], config={"e2b": {"api_key": ""}})
    assert isinstance(res["e2b"], str) and res["e2b"].startswith("unavailable")


async def test_local_uses_image_rootfs_and_records_image_id(
    local_backend: Any, sandbox_base_image: Any
) -> None:
    sb = await local_backend.create(SandboxSpec(rollout_id=rid()))
    try:
        assert sb.handle.system == "image-rootfs"
        assert sb.handle.env_version == sandbox_base_image.image_id
        r = await sb.exec("node --version; claude --version; codex --version; which mini hermes")
        assert r.ok and r.stdout.startswith("v22."), r
    finally:
        await sb.destroy()


async def test_local_falls_back_to_host_system_dirs(sandbox_state_dir: Path) -> None:
    from tests.fixtures.sandboxes import require_bwrap

    require_bwrap()
    from sandboxes.backends.local import LocalBackend

    b = LocalBackend(state_dir=sandbox_state_dir / "local-host", rootfs=None)
    sb = await b.create(SandboxSpec(rollout_id=rid()))
    try:
        assert sb.handle.system == "host-readonly"
        assert sb.handle.env_version.startswith("host:")
        r = await sb.exec("ls /root 2>&1; test -w /usr && echo writable || echo ro; id -u")
        assert "ro" in r.stdout.split() and "1000" in r.stdout.split()
        assert "No such file" in r.stdout  # /root of the host is not visible
        shadow = await sb.exec(["cat", "/etc/shadow"])
        assert shadow.exit_code != 0  # host root-only files stay unreadable
    finally:
        await sb.destroy()
        await b.close()


async def test_docker_records_image_digest_and_limits(docker_backend: Any) -> None:
    import docker

    from sandboxes.base import ResourceLimits

    spec = SandboxSpec(
        rollout_id=rid(), resources=ResourceLimits(cpus=0.5, memory_mb=300, pids=100)
    )
    sb = await docker_backend.create(spec)
    try:
        img = docker.from_env().images.get(docker_backend.image)
        assert sb.handle.env_version == img.id
        attrs = docker.from_env().api.inspect_container(sb.handle.details["container_id"])
        hc = attrs["HostConfig"]
        assert hc["NetworkMode"] == "none"
        assert hc["Memory"] == 300 * 1024 * 1024 and hc["MemorySwap"] == hc["Memory"]
        assert hc["NanoCpus"] == 500_000_000 and hc["PidsLimit"] == 100
        assert attrs["Config"]["Labels"]["agentic-rollout.rollout-id"] == spec.rollout_id
    finally:
        await sb.destroy()
