"""Orchestration benchmark: N concurrent rollouts with a trivial agent on local sandboxes.

    python bench/orchestration.py --n 100 500 1000

Starts a Temporal dev server (WAL pragmas), a Gateway in front of the scripted engine
(in this process), and one worker process (`--role all`, local bubblewrap sandboxes).
For each N it submits N rollouts at once — each a real workflow with real activities:
session, sandbox, agent, trajectory → samples, cleanup — and reports:

- wall time and rollouts/s for the whole batch;
- Temporal overhead per rollout: the part of a rollout's lifetime during which none of
  its activities was executing (scheduling, queueing for a slot, workflow tasks), from
  each workflow's history — mean and p50/p95;
- activities and history events per rollout;
- the worker process's peak RSS (sandboxes are separate processes, not included).

The agent is `true` by default (no LLM call); `--agent-calls 1` runs a one-turn
Python agent against the Gateway instead.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devstack.background_server import BackgroundServer  # noqa: E402
from devstack.scripted_engine import Script, ScriptedEngine  # noqa: E402
from devstack.temporal_dev_server import TemporalDevServer  # noqa: E402
from devstack.tiny_model import ensure_tiny_model  # noqa: E402
from examples.make_tasks import task as make_task  # noqa: E402
from schemas.client import RolloutClient  # noqa: E402
from schemas.rollout import SEARCH_ATTRIBUTES  # noqa: E402
from schemas.tasks import RolloutTask  # noqa: E402


def rss_kib(pid: int) -> tuple[int, int]:
    """(current, peak) RSS of one process in KiB."""
    cur = peak = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1])
    return cur, peak


def cpu_s(pid: int) -> float:
    """User+system CPU seconds of one process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_task(agent_calls: int) -> RolloutTask:
    if agent_calls:
        data = make_task("bench", "What is 6 times 7?", "42", turns=agent_calls)
        data["hooks"] = [{"name": "metrics", "params": {"write_file": False}}]
        data["evaluation"] = None
    else:
        data = {
            "task_id": "bench",
            "prompt": "noop",
            "harness": {"name": "command", "config": {"command": "true"}, "budget_s": 60},
            "sandbox": {"backend": "local", "resources": {"memory_mb": 256, "pids": 64}},
            "hooks": [{"name": "metrics", "params": {"write_file": False}}],
        }
    data["budget"] = {"host_queue_wait_s": 600}
    return RolloutTask.model_validate(data)


def overhead_s(events: list[Any]) -> tuple[float, int, int]:
    """(seconds with no activity executing, activities scheduled, events)."""
    start = events[0].event_time.ToDatetime()
    end = events[-1].event_time.ToDatetime()
    started: dict[int, Any] = {}
    intervals: list[tuple[float, float]] = []
    scheduled = 0
    for e in events:
        t = e.event_time.ToDatetime()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled += 1
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[e.activity_task_started_event_attributes.scheduled_event_id] = t
        elif e.event_type in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
        ):
            attrs = (
                e.activity_task_completed_event_attributes
                if e.HasField("activity_task_completed_event_attributes")
                else e.activity_task_failed_event_attributes
                if e.HasField("activity_task_failed_event_attributes")
                else e.activity_task_timed_out_event_attributes
            )
            s = started.get(attrs.scheduled_event_id)
            if s is not None:
                intervals.append(((s - start).total_seconds(), (t - start).total_seconds()))
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return (end - start).total_seconds() - busy, scheduled, len(events)


async def run_one(
    client: RolloutClient, n: int, task: RolloutTask, out: str, pid: int, server_pid: int
) -> dict:
    peak_during = 0
    cpu0 = (cpu_s(pid), cpu_s(server_pid))
    t0 = time.monotonic()
    batch = await client.submit([task], out, samples_per_task=n, max_concurrent_starts=128)
    submitted = time.monotonic() - t0
    done = failed = 0
    async for outcome in client.results(batch, poll_s=0.5):
        done += 1
        failed += 0 if outcome.ok else 1
        peak_during = max(peak_during, rss_kib(pid)[0])
        if failed and failed < 4:
            print(f"  failed: {outcome.rollout_id}: {outcome.error}", flush=True)
    wall = time.monotonic() - t0
    worker_cpu, server_cpu = cpu_s(pid) - cpu0[0], cpu_s(server_pid) - cpu0[1]
    sample = batch.rollout_ids if n <= 200 else batch.rollout_ids[:: max(1, n // 200)]
    overheads, acts, evs = [], [], []
    for rid in sample:
        history = await client.client.get_workflow_handle(rid).fetch_history()
        o, a, e = overhead_s(list(history.events))
        overheads.append(o)
        acts.append(a)
        evs.append(e)
    overheads.sort()
    return {
        "n": n,
        "failed": failed,
        "wall_s": round(wall, 1),
        "submit_s": round(submitted, 1),
        "rollouts_per_s": round(n / wall, 2),
        "temporal_overhead_mean_s": round(statistics.fmean(overheads), 3),
        "temporal_overhead_p50_s": round(overheads[len(overheads) // 2], 3),
        "temporal_overhead_p95_s": round(overheads[int(len(overheads) * 0.95) - 1], 3),
        "server_cpu_ms_per_rollout": round(server_cpu / n * 1000, 1),
        "worker_cpu_ms_per_rollout": round(worker_cpu / n * 1000, 1),
        "activities_per_rollout": round(statistics.fmean(acts), 2),
        "events_per_rollout": round(statistics.fmean(evs), 1),
        "worker_rss_mib_max_seen": round(peak_during / 1024, 1),
        "worker_rss_mib_peak": round(rss_kib(pid)[1] / 1024, 1),
    }


async def serial(client: RolloutClient, k: int, task: RolloutTask, out: str) -> dict:
    """K rollouts one after another: Temporal's own latency per rollout, no queueing."""
    overheads, walls = [], []
    for _ in range(k):
        t0 = time.monotonic()
        batch = await client.submit([task], out, samples_per_task=1)
        outcome = await client.outcome(batch.rollout_ids[0])
        walls.append(time.monotonic() - t0)
        assert outcome.ok, outcome
        history = await client.client.get_workflow_handle(batch.rollout_ids[0]).fetch_history()
        overheads.append(overhead_s(list(history.events))[0])
    return {
        "serial_rollouts": k,
        "serial_wall_mean_s": round(statistics.fmean(walls), 3),
        "serial_temporal_overhead_mean_s": round(statistics.fmean(overheads), 3),
    }


async def main(args: argparse.Namespace) -> list[dict]:
    work = Path(tempfile.mkdtemp(prefix="rollout-bench-", dir="/tmp"))
    work.chmod(0o755)
    server = TemporalDevServer(work / "temporal", ui=False, search_attributes=SEARCH_ATTRIBUTES)
    await server.start()
    model = ensure_tiny_model()
    engine = ScriptedEngine(model / "tokenizer.json", Script(default_reply="42"))
    engine_srv = BackgroundServer(engine.app()).start()
    from tests.fixtures.gateway import start_gateway

    gateway = start_gateway(engine_srv.url, model, work / "gateway", "tiny")
    log = open(work / "worker.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workers.worker",
            "--role=all",
            f"--temporal={server.address}",
            "--task-queue=bench",
            "--host-id=bench",
            f"--gateway={gateway.control_url}",
            f"--admin-token={gateway.admin_token}",
            f"--sandbox-state-dir={work / 'sandboxes'}",
            f"--data-dir={work / 'worker'}",
            f"--max-sandboxes={args.max_sandboxes}",
            f"--max-provisions={args.max_provisions}",
            "--count-calls-every-s=0",
            "--janitor-interval-s=0",
            "--log-level=WARNING",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    results: list[dict] = []
    try:
        client = await RolloutClient.connect(server.address, task_queue="bench")
        await asyncio.sleep(3)  # worker start-up
        task = bench_task(args.agent_calls)
        if args.serial:
            r = await serial(client, args.serial, task, str(work / "samples"))
            print(json.dumps(r), flush=True)
            results.append(r)
        for n in args.n:
            print(f"N={n} …", flush=True)
            assert server.proc is not None
            r = await run_one(client, n, task, str(work / "samples"), worker.pid, server.proc.pid)
            r["agent_calls"] = args.agent_calls
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
        gateway.server.stop()
        engine_srv.stop()
        server.stop()
        leftovers = list((work / "sandboxes").glob("lsb-*"))
        print(f"sandboxes left: {len(leftovers)}; work dir {work}")
    return results


def markdown(results: list[dict]) -> str:
    head = (
        "| N | wall s | rollouts/s | idle-in-Temporal mean / p50 / p95 s | "
        "server CPU ms/rollout | worker CPU ms/rollout | activities | events | "
        "worker RSS peak MiB | failed |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "n" not in r:
            continue
        lines.append(
            f"| {r['n']} | {r['wall_s']} | {r['rollouts_per_s']} | "
            f"{r['temporal_overhead_mean_s']} / {r['temporal_overhead_p50_s']} / "
            f"{r['temporal_overhead_p95_s']} | {r['server_cpu_ms_per_rollout']} | "
            f"{r['worker_cpu_ms_per_rollout']} | {r['activities_per_rollout']} | "
            f"{r['events_per_rollout']} | {r['worker_rss_mib_peak']} | {r['failed']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--agent-calls", type=int, default=0)
    parser.add_argument("--serial", type=int, default=0, help="K rollouts one at a time first")
    parser.add_argument("--max-sandboxes", type=int, default=64)
    parser.add_argument("--max-provisions", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    ns = parser.parse_args()
    res = asyncio.run(main(ns))
    print(markdown(res))
    if ns.json:
        ns.json.write_text(json.dumps(res, indent=2))
