"""Orchestration benchmark: N concurrent rollouts with a trivial agent on local sandboxes.

    python -m bench.orchestration --n 100 500 1000

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

`--agent-sleep-s 120` makes the agent `sleep 120` instead, so the N rollouts are all
live at once (set `--max-sandboxes` to at least N): it reports the ramp (seconds until
all N agents are running), the worker's RSS and the memory per live sandbox (the summed
PSS of the sandboxes' processes, and the host's MemAvailable drop, which also counts
kernel memory and anything else on the machine), and checks that nothing is left
afterwards (sandbox dirs, sandbox processes, open gateway sessions).
"""

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType

from bench.common import process_table, sandbox_trees
from devstack.background_server import BackgroundServer
from devstack.scripted_engine import Script, ScriptedEngine
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from examples.make_tasks import task as make_task
from rollout_client.client import RolloutClient
from schemas.rollout import SEARCH_ATTRIBUTES
from schemas.tasks import RolloutTask
from workers.local_stack import start_gateway

REPO = Path(__file__).resolve().parent.parent


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


#: The agent of `--hold-s`: blocks (asleep, no CPU) on a FIFO in its /tmp until the bench
#: writes a line to it.
RELEASE_FIFO = "release"
HOLD_COMMAND = f"mkfifo /tmp/{RELEASE_FIFO} && read -r _ < /tmp/{RELEASE_FIFO}"


def agent_command(sleep_s: float, hold: bool) -> str:
    if hold:
        return HOLD_COMMAND
    return f"sleep {sleep_s:g}" if sleep_s else "true"


def bench_task(agent_calls: int, sleep_s: float = 0.0, hold: bool = False) -> RolloutTask:
    if agent_calls:
        data = make_task("bench", "What is 6 times 7?", "42", turns=agent_calls)
        data["hooks"] = [{"name": "metrics", "params": {"write_file": False}}]
        data["evaluation"] = None
    else:
        data = {
            "task_id": "bench",
            "prompt": "noop",
            "harness": {
                "name": "command",
                "config": {"command": agent_command(sleep_s, hold)},
                "budget_s": 60 + sleep_s,
            },
            "sandbox": {"backend": "local", "resources": {"memory_mb": 256, "pids": 64}},
            "hooks": [{"name": "metrics", "params": {"write_file": False}}],
        }
    data["budget"] = {"host_queue_wait_s": 1800}
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
    client: RolloutClient,
    n: int,
    task: RolloutTask,
    out: str,
    pid: int,
    server_pid: int,
    hold: "Hold | None" = None,
) -> dict:
    peak_during = 0
    cpu0 = (cpu_s(pid), cpu_s(server_pid))
    t0 = time.monotonic()
    batch = await client.submit([task], out, samples_per_task=n, max_concurrent_starts=128)
    submitted = time.monotonic() - t0
    watcher = (
        asyncio.ensure_future(hold.watch(n, t0, pid, server_pid, lambda: client.cancel(batch)))
        if hold
        else None
    )
    done = failed = 0
    async for outcome in client.results(batch, poll_s=0.5):
        done += 1
        failed += 0 if outcome.ok else 1
        peak_during = max(peak_during, rss_kib(pid)[0])
        if failed and failed < 4:
            print(f"  failed: {outcome.rollout_id}: {outcome.error}", flush=True)
    wall = time.monotonic() - t0
    if watcher is not None:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
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
    held = hold.report(n) if hold else {}
    return held | {
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


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def host_tasks() -> int:
    """Kernel scheduling entities (processes and threads) on the host: what
    `kernel.pid_max` caps."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[1])


def pss_kib(pids: set[int]) -> int:
    total = 0
    for p in pids:
        with (
            contextlib.suppress(OSError, IndexError, ValueError),
            open(f"/proc/{p}/smaps_rollup") as f,
        ):
            for line in f:
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
    return total


def release_all(state_dir: Path) -> int:
    """Write a line to every waiting agent's FIFO (its /tmp is a dir of the sandbox's
    state on the host); returns how many were released."""
    released = 0
    try:  # sandboxes are destroyed meanwhile: a dir may vanish under the walk
        fifos = list(state_dir.glob(f"lsb-*/*/tmp/{RELEASE_FIFO}"))
    except OSError:
        return 0  # the next round tries again
    for fifo in fifos:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no reader (yet, or any more)
            continue
        with contextlib.suppress(OSError):
            os.write(fd, b"go\n")
            released += 1
        os.close(fd)
    return released


class Hold:
    """While a batch of sleeping agents runs: how fast all N become live, and what a
    live sandbox costs. An agent is live when its `sleep` runs in a sandbox of ours."""

    def __init__(
        self,
        sleep_s: float,
        state_dir: Path,
        min_available_mib: int,
        hold_s: float | None = None,
    ) -> None:
        self.min_available_kib = min_available_mib * 1024
        self.aborted = False
        self.hold_s = hold_s
        self.released_at: float | None = None
        self.marker = (
            f"/bin/sh\0-c\0{HOLD_COMMAND}\0" if hold_s is not None else f"sleep\0{sleep_s:g}\0"
        ).encode()
        self.state_dir = state_dir
        self.mem_before = mem_available_kib()
        self.tasks_before = host_tasks()
        self.ramp_s: float | None = None
        #: PSS walks every sandbox process's smaps: at most every `PSS_EVERY_S` on the
        #: ramp (thousands of processes), and always once all are live.
        self.pss_at = 0.0
        self.max_live = 0
        self.at_peak: dict[str, float] = {}

    PSS_EVERY_S = 15.0

    def _sample(self, n: int, pid: int, server_pid: int) -> tuple[int, dict[str, float]]:
        table = process_table()
        trees = sandbox_trees(table, self.state_dir)
        live = sum(1 for p in trees if table[p][1] == self.marker)
        sample = {
            "mem_available_kib": mem_available_kib(),
            "worker_rss_kib": rss_kib(pid)[0],
            "server_rss_kib": rss_kib(server_pid)[0],
            "worker_fds": len(os.listdir(f"/proc/{pid}/fd")),
            "processes": len(trees),
            "host_tasks": host_tasks(),
        }
        due = time.monotonic() - self.pss_at >= self.PSS_EVERY_S
        if live > self.max_live and (live >= n or due):
            self.pss_at = time.monotonic()
            sample["pss_kib"], sample["pss_live"] = pss_kib(trees), live
        return live, sample

    async def watch(
        self,
        n: int,
        t0: float,
        pid: int,
        server_pid: int,
        cancel: "Callable[[], Awaitable[int]]",
    ) -> None:
        while True:
            live, sample = await asyncio.to_thread(self._sample, n, pid, server_pid)
            if sample["mem_available_kib"] < self.min_available_kib and not self.aborted:
                # the machine is shared: give the memory back before the OOM killer acts
                self.aborted = True
                print(f"MemAvailable below the floor at {live} live: cancelling", flush=True)
                await cancel()
            if live > self.max_live:
                self.max_live = live
                self.at_peak |= sample  # keeps the last PSS when this sample took none
            if live >= n and self.ramp_s is None:
                self.ramp_s = time.monotonic() - t0
            due = self.ramp_s is not None and time.monotonic() - t0 >= self.ramp_s + (
                self.hold_s or 0
            )
            if self.hold_s is not None and (due or self.aborted):
                self.released_at = self.released_at or time.monotonic()
                await asyncio.to_thread(release_all, self.state_dir)
            await asyncio.sleep(1.0)

    def report(self, n: int) -> dict:
        live = max(self.max_live, 1)
        peak = self.at_peak
        pss_live = max(int(peak.get("pss_live", 1)), 1)
        return {
            "live_max": self.max_live,
            "aborted_low_memory": self.aborted,
            "ramp_s": round(self.ramp_s, 1) if self.ramp_s is not None else None,
            "sandbox_pss_mib_each": round(peak.get("pss_kib", 0) / pss_live / 1024, 2),
            "mem_available_drop_mib_each": round(
                (self.mem_before - peak.get("mem_available_kib", self.mem_before)) / live / 1024,
                2,
            ),
            "worker_rss_mib_at_peak": round(peak.get("worker_rss_kib", 0) / 1024, 1),
            "server_rss_mib_at_peak": round(peak.get("server_rss_kib", 0) / 1024, 1),
            "host_tasks_added_at_peak": int(peak.get("host_tasks", 0) - self.tasks_before),
            "sandbox_processes_at_peak": int(peak.get("processes", 0)),
            "worker_fds_at_peak": int(peak.get("worker_fds", 0)),
        }


def leftovers(state_dir: Path, gateway_dir: Path) -> dict:
    """What a finished batch must not leave behind."""
    from stress.chaos import open_sessions

    return {
        "sandbox_dirs_left": len(list(state_dir.glob("lsb-*"))),
        "sandbox_processes_left": len(sandbox_trees(process_table(), state_dir)),
        "sessions_open": len(open_sessions(gateway_dir, "")),
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
            "--reaper-interval-s=0",
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
        task = bench_task(args.agent_calls, args.agent_sleep_s, args.hold_s is not None)
        if args.serial:
            r = await serial(client, args.serial, task, str(work / "samples"))
            print(json.dumps(r), flush=True)
            results.append(r)
        for n in args.n:
            print(f"N={n} …", flush=True)
            assert server.proc is not None
            hold = (
                Hold(args.agent_sleep_s, work / "sandboxes", args.min_available_mib, args.hold_s)
                if args.agent_sleep_s
                else None
            )
            r = await run_one(
                client, n, task, str(work / "samples"), worker.pid, server.proc.pid, hold
            )
            r["agent_calls"] = args.agent_calls
            if hold:
                await asyncio.sleep(2)  # the last rollouts' session close is recorded
                r |= leftovers(work / "sandboxes", work / "gateway")
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
        left = leftovers(work / "sandboxes", work / "gateway")
        print(f"after shutdown: {json.dumps(left)}; work dir {work}")
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
    parser.add_argument(
        "--agent-sleep-s", type=float, default=0.0, help="agent sleeps this long (holds N live)"
    )
    parser.add_argument(
        "--hold-s",
        type=float,
        default=None,
        help="agents wait on a FIFO instead of sleeping, released this long after all N "
        "are live (--agent-sleep-s is then their budget)",
    )
    parser.add_argument(
        "--min-available-mib",
        type=int,
        default=1536,
        help="cancel the batch if the host's MemAvailable falls below this (shared machine)",
    )
    parser.add_argument("--serial", type=int, default=0, help="K rollouts one at a time first")
    parser.add_argument("--max-sandboxes", type=int, default=64)
    parser.add_argument("--max-provisions", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    ns = parser.parse_args()
    res = asyncio.run(main(ns))
    print(markdown(res))
    if ns.json:
        ns.json.write_text(json.dumps(res, indent=2))
