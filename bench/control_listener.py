"""The control listener under a saturated agent listener: `/health`, `GET /policy` and a
`POST /policy` the gateway refuses at once (a no-op that still runs on the agent loop,
where policy updates live), timed idle and while K agent streams (default 500) run back
to back, with the control listener on its own thread and loop (the default) and on the
agent loop (`control_own_loop` off, as before), side by side in one run.

The engine is `devstack.fixed_latency_engine` (a FAKE answering every call after
`--engine-latency-ms`, streamed token by token over that delay when the call streams, in
its own process): the load is the Gateway's. The agents are `bench.gateway_load`'s raw
keep-alive clients with no think time, every call a streamed Chat Completions call
(`--no-stream`: whole replies, as before), in a child process so their event loop cannot
delay the probes; the probes are sequential, one every `--probe-interval-ms`, from this
process.

Run: `python -m bench.control_listener [--agents 500] [--seconds 30] [--modes shared,own]
[--no-stream]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import fixed_latency_engine, percentile, stop_process, wait_healthy
from bench.gateway_load import Results, agent, create_sessions, lag_quantiles, scrape
from devstack.ports import consecutive_free_ports
from devstack.tiny_model import ensure_tiny_model

PROBES = ("GET /health", "GET /policy", "POST /policy (refused)")


def _agents(sessions: list[dict[str, Any]], seconds: float, stream: bool, out: Any) -> None:
    """Child process: every agent calls back to back until the deadline."""
    args = argparse.Namespace(
        turns=10**6, warmup_s=1.0, think_s=0.0, large_every=0, large_chars=0,
        engine_latency_ms=0.0, stream=stream,
    )  # fmt: skip
    results = Results()
    deadline = time.monotonic() + seconds

    async def run() -> None:
        await asyncio.gather(*(agent(s, args, results, deadline) for s in sessions))

    asyncio.run(run())
    out.put({"calls": len(results.latencies), "errors": results.errors,
             "content_types": results.content_types,
             "events_p50": percentile([float(n) for n in results.stream_events], 0.5)})  # fmt: skip


def probe(client: httpx.Client, control: str, what: str) -> float:
    started = time.perf_counter()
    if what == "GET /health":
        reply = client.get(f"{control}/health")
    elif what == "GET /policy":
        reply = client.get(f"{control}/policy")
    else:  # validated, handed to the agent loop, refused there: a relative checkpoint
        reply = client.post(
            f"{control}/policy", json={"policy_version": "noop", "checkpoint": "not/absolute"}
        )
    elapsed = time.perf_counter() - started
    expected = 200 if what.startswith("GET") else reply.status_code
    if reply.status_code != expected or reply.status_code >= 500:
        raise SystemExit(f"{what}: HTTP {reply.status_code} {reply.text[:200]}")
    return elapsed


def probe_for(control: str, seconds: float, interval_s: float) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {p: [] for p in PROBES}
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < deadline:
            for what in PROBES:
                times[what].append(probe(client, control, what))
                time.sleep(interval_s)
    return times


def run_mode(args: argparse.Namespace, model: Path, engine_url: str, own_loop: bool) -> dict:
    port = consecutive_free_ports(2)
    with tempfile.TemporaryDirectory(prefix="gw-control-") as data_dir:
        settings = {
            "engine_urls": [engine_url], "model": "tiny", "tokenizer": str(model),
            "insecure_dev": True, "port": port, "control_port": port + 1,
            "data_dir": data_dir, "context_window": 1048576,
            "control_own_loop": own_loop,
        }  # fmt: skip
        env = dict(os.environ, ROLLOUT_GATEWAY_SETTINGS=json.dumps(settings))
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers.gateway_server"], env=env, stdout=subprocess.DEVNULL
        )
        control = f"http://127.0.0.1:{port + 1}"
        try:
            wait_healthy(control, proc)
            sessions = asyncio.run(create_sessions([control], args.agents))
            idle = probe_for(control, args.idle_seconds, args.probe_interval_ms / 1000)
            out: Any = multiprocessing.get_context("spawn").Queue()
            load_s = args.warmup_s + args.seconds
            child = multiprocessing.get_context("spawn").Process(
                target=_agents, args=(sessions, load_s, args.stream, out)
            )
            child.start()
            time.sleep(args.warmup_s)
            before = asyncio.run(_scrape(control))
            loaded = probe_for(control, args.seconds, args.probe_interval_ms / 1000)
            after = asyncio.run(_scrape(control))
            load = out.get(timeout=load_s + 600)
            child.join()
        finally:
            stop_process(proc)
    lag50, lag99, _ = lag_quantiles(before, after)
    return {"own_loop": own_loop, "idle": idle, "loaded": loaded, "load": load,
            "lag_p50_ms": 1000 * lag50, "lag_p99_ms": 1000 * lag99,
            "calls_per_s": load["calls"] / (args.warmup_s + args.seconds)}  # fmt: skip


async def _scrape(control: str) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        return await scrape(client, [control])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=500, help="concurrent agent streams")
    parser.add_argument("--seconds", type=float, default=30.0, help="loaded probe window")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="idle probe window")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="load ramp before it")
    parser.add_argument("--probe-interval-ms", type=float, default=50.0)
    parser.add_argument("--engine-latency-ms", type=float, default=50.0)
    parser.add_argument("--modes", default="own,shared", help="own: own loop; shared: agent's")
    parser.add_argument(
        "--no-stream", dest="stream", action="store_false", help="agents' calls not streamed"
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model = ensure_tiny_model()
    rows = []
    with fixed_latency_engine(model, args.engine_latency_ms) as engine_url:
        for mode in args.modes.split(","):
            rows.append(run_mode(args, model, engine_url, own_loop=mode == "own"))
    calls = "streamed calls (SSE)" if args.stream else "whole (not streamed) calls"
    print(
        f"\n{args.agents} agents, {calls} back to back, "
        f"engine latency {args.engine_latency_ms:g} ms, "
        f"probes every {args.probe_interval_ms:g} ms, idle {args.idle_seconds:g} s, "
        f"loaded {args.seconds:g} s after a {args.warmup_s:g} s ramp\n"
    )
    print(
        "| control listener | probe | idle p50 / p99 ms | loaded p50 / p99 / max ms "
        "| loaded ÷ idle (p50, p99) |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        where = "own thread and loop" if r["own_loop"] else "on the agent loop"
        for what in PROBES:
            idle, loaded = r["idle"][what], r["loaded"][what]
            i50, i99 = 1000 * percentile(idle, 0.5), 1000 * percentile(idle, 0.99)
            l50, l99 = 1000 * percentile(loaded, 0.5), 1000 * percentile(loaded, 0.99)
            print(
                f"| {where} | {what} | {i50:.1f} / {i99:.1f} | {l50:.1f} / {l99:.1f} / "
                f"{1000 * max(loaded):.0f} | {l50 / i50:.1f}× / {l99 / i99:.1f}× |"
            )
    for r in rows:
        where = "own thread and loop" if r["own_loop"] else "on the agent loop"
        errors = sum(r["load"]["errors"].values())
        print(
            f"{where}: agent calls/s {r['calls_per_s']:.0f}, agent loop lag p50 / p99 "
            f"≤{r['lag_p50_ms']:g} / ≤{r['lag_p99_ms']:g} ms, agent errors {errors} "
            f"{r['load']['errors'] or ''}"
        )
        print(
            f"{where}: agent replies by content type {r['load']['content_types']}, "
            f"SSE events per call p50 {r['load']['events_p50']:g}"
        )


if __name__ == "__main__":
    main()
