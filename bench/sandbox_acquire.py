"""Cold create vs warm-pool acquire latency for the docker and local backends.

Usage: python -m bench.sandbox_acquire [--n-cold 20] [--n-warm 50] [--backends local,docker]
                                       [--disk-mb N|none]

cold  = `create()` with an empty pool (start container / bwrap + supervisor, assign).
warm  = `create()` served from a filled pool (refills paused so only the acquire path
        is timed), without and with the Gateway channel (host bridge + forwarder).
Every sandbox is destroyed after the timed section (not timed). Goal: warm p50 ≤ 5 ms.
Needs the base image (scripts/build_base_image.sh) and docker/bwrap
(scripts/install_system_deps.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import percentile
from sandboxes.base import GatewayChannel, ResourceLimits, SandboxSpec

#: The sandboxes' resources (``--disk-mb`` changes the disk limit: its cost is at create).
RESOURCES = ResourceLimits()


def summary(xs: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in xs]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }


def spec(gateway: str | None = None) -> SandboxSpec:
    return SandboxSpec(
        rollout_id=f"bench-{uuid.uuid4().hex[:10]}",
        gateway=GatewayChannel(target=gateway) if gateway else None,
        resources=RESOURCES,
    )


async def bench_backend(name: str, n_cold: int, n_warm: int, state: Path) -> dict[str, Any]:
    from sandboxes.registry import get_backend

    b: Any = get_backend(name, state_dir=state / name)
    out: dict[str, Any] = {}
    try:
        # Warm-up (image checks, rootfs lookup, first-run caches) — not timed.
        sb = await b.create(spec())
        await sb.destroy()
        cold: list[float] = []
        made = []
        for _ in range(n_cold):
            t0 = time.perf_counter()
            made.append(await b.create(spec()))
            cold.append(time.perf_counter() - t0)
        for sb in made:
            await sb.destroy()
        out["cold_create"] = summary(cold)

        for label, gw in (("warm_acquire", None), ("warm_acquire_gateway", "http://127.0.0.1:9")):
            b.pool.size, b.pool.paused = n_warm, False
            s0 = spec(gw)
            key = b._key(s0)
            t_fill = time.perf_counter()
            await b.pool.wait_full(key, timeout=600)
            fill_s = time.perf_counter() - t_fill
            b.pool.paused = True  # no refills: time only the acquire path
            warm: list[float] = []
            made = []
            for _ in range(n_warm):
                s = spec(gw)
                t0 = time.perf_counter()
                made.append(await b.create(s))
                warm.append(time.perf_counter() - t0)
            assert all(sb.handle.rollout_id for sb in made)
            r = await made[-1].exec(["echo", "ok"])
            assert r.stdout == "ok\n", r
            for sb in made:
                await sb.destroy()
            out[label] = summary(warm)
            out[label]["pool_fill_s"] = round(fill_s, 2)
    finally:
        await b.pool.close()
        for h in await b.list():
            await b.destroy(h)
        await b.close()
    return out


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-cold", type=int, default=20)
    ap.add_argument("--n-warm", type=int, default=50)
    ap.add_argument("--backends", default="local,docker")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument(
        "--disk-mb", default=None, help="resources.disk_mb (default: the spec default; none)"
    )
    a = ap.parse_args()
    if a.disk_mb is not None:
        global RESOURCES
        disk = None if a.disk_mb == "none" else int(a.disk_mb)
        RESOURCES = ResourceLimits(disk_mb=disk)
    state = Path(tempfile.mkdtemp(prefix="ar-bench-", dir="/tmp"))
    state.chmod(0o755)
    results = {}
    try:
        for name in a.backends.split(","):
            results[name] = await bench_backend(name, a.n_cold, a.n_warm, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    if a.json:
        print(json.dumps(results))
        return 0
    print(f"{'backend':8} {'phase':22} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for name, phases in results.items():
        for phase, s in phases.items():
            print(
                f"{name:8} {phase:22} {s['n']:>4} {s['p50_ms']:>9.2f} "
                f"{s['p99_ms']:>9.2f} {s['max_ms']:>9.2f}"
            )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
