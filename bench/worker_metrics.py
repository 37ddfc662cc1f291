"""Worker metrics overhead: the orchestration bench's rollouts with fleet metrics on and
off, side by side in one run.

    python -m bench.worker_metrics --n 200 --rounds 4

One Temporal dev server, one in-process Gateway in front of the scripted engine, and
two worker processes (`--role all`, local bubblewrap sandboxes), alike but for
`--metrics-port` on one of them (sampling every `--metrics-interval-s`, scraped every
`--scrape-s` as Prometheus would). Each round runs a batch of N trivial rollouts (the
orchestration bench's task: agent `true`, the metrics hook) on one worker, then on the
other, the order alternating by round; each worker's CPU is read from /proc over its own
batch (after one uncounted warm-up batch each). It reports CPU ms per rollout for each
side and round, and the overhead of the median on-worker over the median off-worker.

End-to-end CPU on a shared machine moves by more than the overhead itself, so it also
measures the metrics' own work directly, in this process: the updates the interceptor
makes for one rollout of this batch (as many step observations as it saw per rollout),
one sampler pass (the backlog of three queues from the dev server, the local backend's
sandboxes) and one scrape, each timed over many repetitions, turned into CPU per rollout
at the batch's rate and divided by the off-worker's CPU per rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import generate_latest

from bench.orchestration import REPO, bench_task, cpu_s
from devstack.background_server import BackgroundServer
from devstack.ports import free_port
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from rollout_client.client import RolloutClient
from schemas.rollout import SEARCH_ATTRIBUTES
from workers.fleet_metrics import FleetMetrics
from workers.fleet_sampler import sample_backlog, sample_sandboxes
from workers.local_stack import start_gateway


def start_worker(
    work: Path, name: str, temporal: str, gateway: Any, extra: list[str]
) -> subprocess.Popen[bytes]:
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.worker",
            "--role=all",
            f"--temporal={temporal}",
            f"--task-queue={name}",
            f"--host-id={name}",
            f"--gateway={gateway.control_url}",
            f"--admin-token={gateway.admin_token}",
            f"--sandbox-state-dir={work / name / 'sandboxes'}",
            f"--data-dir={work / name / 'worker'}",
            "--max-sandboxes=64",
            "--count-calls-every-s=0",
            "--reaper-interval-s=0",
            "--log-level=WARNING",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )


class Scraper:
    """Scrapes a /metrics URL every `every_s` in a thread until stopped; keeps the last
    text."""

    def __init__(self, url: str, every_s: float) -> None:
        self.url, self.every_s = url, every_s
        self.stop = threading.Event()
        self.last = ""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                self.last = httpx.get(self.url, timeout=10).text
            except httpx.HTTPError:
                continue


async def batch_cpu_ms(
    client: RolloutClient, n: int, out: str, pid: int
) -> tuple[float, float, int]:
    """(worker CPU ms per rollout, wall s, failed) of one batch of N."""
    cpu0, t0 = cpu_s(pid), time.monotonic()
    batch = await client.submit([bench_task(0)], out, samples_per_task=n)
    failed = 0
    async for outcome in client.results(batch, poll_s=0.5):
        failed += 0 if outcome.ok else 1
    return (cpu_s(pid) - cpu0) / n * 1000, time.monotonic() - t0, failed


def thread_cpu_us(fn: Any, repeat: int) -> float:
    """This thread's CPU µs per call of `fn`."""
    t0 = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - t0) / repeat * 1e6


def one_rollout(m: FleetMetrics, steps: list[str]) -> None:
    """The updates the interceptor makes for one rollout of this bench."""
    m.rollouts_started.labels("command").inc()
    for step in steps:
        m.step_seconds.labels(step).observe(0.1)
    m.rewards.labels("jsonl").observe(1.0)
    m.rollouts_finished.labels("ok", "command").inc()


def steps_per_rollout(text: str, rollouts: float) -> list[str]:
    """Each step label as often per rollout as the on-worker observed it (rounded)."""
    from prometheus_client.parser import text_string_to_metric_families

    steps: list[str] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "rollout_worker_step_seconds_count":
                steps += [s.labels["step"]] * round(s.value / rollouts)
    return steps


async def direct_costs(
    temporal: str, queue: str, state_dir: Path, scraped: str, rollouts: int
) -> dict[str, Any]:
    """The metrics' own CPU, measured in this process."""
    from activities.sandbox import SandboxBackends

    m = FleetMetrics()
    steps = steps_per_rollout(scraped, rollouts)
    update_us = thread_cpu_us(lambda: one_rollout(m, steps), 5000)
    scrape_us = thread_cpu_us(lambda: generate_latest(m.registry), 500)
    from temporalio.client import Client

    client = await Client.connect(temporal)
    passes = 50
    t0 = time.process_time()
    for _ in range(passes):
        await sample_backlog(client, "default", queue, m)
    backlog_us = (time.process_time() - t0) / passes * 1e6
    backends = SandboxBackends({"local": {"state_dir": str(state_dir)}})
    backends.get("local")
    t0 = time.process_time()
    for _ in range(passes):
        await sample_sandboxes(backends, m)
    sandboxes_us = (time.process_time() - t0) / passes * 1e6
    await backends.aclose()
    return {
        "steps_per_rollout": len(steps),
        "updates_us_per_rollout": round(update_us, 1),
        "scrape_us": round(scrape_us, 1),
        "sampler_pass_us": round(backlog_us + sandboxes_us, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rollout-bench-metrics-", dir="/tmp"))
    work.chmod(0o755)
    server = TemporalDevServer(work / "temporal", ui=False, search_attributes=SEARCH_ATTRIBUTES)
    await server.start()
    model = ensure_tiny_model()
    engine_srv = BackgroundServer(
        ScriptedEngine(model / "tokenizer.json", Script(default_reply="42")).app()
    ).start()
    gateway = start_gateway(engine_srv.url, model, work / "gateway", "tiny")
    port = free_port()
    on_args = [f"--metrics-port={port}", f"--metrics-interval-s={args.metrics_interval_s}"]
    workers = {
        "off": start_worker(work, "off", server.address, gateway, []),
        "on": start_worker(work, "on", server.address, gateway, on_args),
    }
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics", args.scrape_s)
    rounds: list[dict[str, Any]] = []
    try:
        clients = {
            side: await RolloutClient.connect(server.address, task_queue=side) for side in workers
        }
        await asyncio.sleep(3)  # worker start-up
        scraper.thread.start()
        for side in workers:  # warm-up, not counted: imports, caches, first sandboxes
            await batch_cpu_ms(clients[side], args.n, str(work / "samples"), workers[side].pid)
        for r in range(args.rounds):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for side in order:
                ms, wall, failed = await batch_cpu_ms(
                    clients[side], args.n, str(work / "samples"), workers[side].pid
                )
                rounds.append(
                    {
                        "round": r,
                        "side": side,
                        "cpu_ms_per_rollout": round(ms, 1),
                        "rollouts_per_s": round(args.n / wall, 2),
                        "failed": failed,
                    }
                )
                print(json.dumps(rounds[-1]), flush=True)
        scraped = httpx.get(scraper.url, timeout=10).text
        rollouts = args.n * (args.rounds + 1)
        direct = await direct_costs(
            server.address, "on", work / "on" / "sandboxes", scraped, rollouts
        )
    finally:
        scraper.stop.set()
        for proc in workers.values():
            proc.terminate()
        for proc in workers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        gateway.stop()
        engine_srv.stop()
        server.stop()
    off = statistics.median(x["cpu_ms_per_rollout"] for x in rounds if x["side"] == "off")
    on = statistics.median(x["cpu_ms_per_rollout"] for x in rounds if x["side"] == "on")
    rate = statistics.median(x["rollouts_per_s"] for x in rounds if x["side"] == "on")
    # the sampler's and scrapes' CPU spread over the rollouts done meanwhile
    periodic_us = direct["sampler_pass_us"] / args.metrics_interval_s / rate
    periodic_us += direct["scrape_us"] / args.scrape_s / rate
    direct_ms = (direct["updates_us_per_rollout"] + periodic_us) / 1000
    return {
        "n": args.n,
        "rounds": rounds,
        "off_cpu_ms_per_rollout": off,
        "on_cpu_ms_per_rollout": on,
        "end_to_end_overhead_pct": round((on - off) / off * 100, 2),
        **direct,
        "direct_ms_per_rollout": round(direct_ms, 4),
        "direct_overhead_pct": round(direct_ms / off * 100, 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="rollouts per batch")
    parser.add_argument("--rounds", type=int, default=4, help="batches per side")
    parser.add_argument("--metrics-interval-s", type=float, default=15.0)
    parser.add_argument("--scrape-s", type=float, default=15.0)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    ns = parser.parse_args()
    result = asyncio.run(main(ns))
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2))
