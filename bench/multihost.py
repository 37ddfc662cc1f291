"""Multi-host bench on one machine: a host of the fleet dies mid-run and nothing is lost.

    python -m bench.multihost --n 60

Every part is its own OS process, laid out as on a fleet: the Temporal dev server; two
engines (the scripted engine, `python -m devstack.scripted_engine`: a stand-in for vLLM,
so the answers cost no CPU here); two gateway hosts, each one `rollout gateway` process
(both engines behind it) and one `rollout worker --role gateway-host` (own host id, own
owner queue); three sandbox hosts, each one `rollout worker --role sandbox-host` (own
host id, host queue and local bubblewrap state dir); one `--role orchestrator` worker.
The rollouts run `stress/chaos_agent.py` (several Chat Completions calls with pauses).

Once sandbox host `sb-0` runs its share, the bench SIGKILLs it the way a host dies: its
worker and every process of its sandboxes. Its rollouts must re-provision on `sb-1` /
`sb-2` (the run's heartbeat times out, the workflow starts a new attempt); the bench
reports the time from the kill to each one running again on another host. When all are
done, `sb-0` comes back (same host id and state dir) and its reaper reaps what the
crash left; then the bench counts what is left: sandbox dirs, sandbox processes, loop
mounts, open gateway sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.enums.v1 import EventType

from bench.common import process_table, sandbox_trees
from devstack.ports import free_port
from devstack.scripted_engine import Script
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from rollout_client.client import RolloutClient
from schemas.rollout import RUN_HARNESS, SEARCH_ATTRIBUTES
from stress.chaos import ChaosConfig, Proc, _worker_ready, open_sessions, task_specs, wait_http

REPO = Path(__file__).resolve().parent.parent

MODEL = "tiny"
QUEUE = "multihost"
SANDBOX_HOSTS = ("sb-0", "sb-1", "sb-2")
GATEWAY_HOSTS = ("gw-0", "gw-1")
VICTIM = "sb-0"


class MultiHostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(default=60, ge=3)
    turns: int = Field(default=4, ge=1)
    pause_s: float = Field(default=1.0, ge=0)
    max_sandboxes: int = Field(default=8, ge=1, description="per sandbox host")
    heartbeat_s: float = Field(default=10.0, gt=0, description="dead host detection")
    reaper_interval_s: float = Field(default=10.0, gt=0)
    deadline_s: float = Field(default=900.0, gt=0)


@dataclass
class Fleet:
    work: Path
    temporal: TemporalDevServer
    engines: list[Proc]
    gateways: list[Proc]
    gateway_dirs: list[Path]
    gateway_workers: list[Proc]
    sandbox_workers: dict[str, Proc]
    sandbox_dirs: dict[str, Path]
    orchestrator: Proc

    def procs(self) -> list[Proc]:
        return [
            self.orchestrator,
            *self.sandbox_workers.values(),
            *self.gateway_workers,
            *self.gateways,
            *self.engines,
        ]


def worker_proc(name: str, args: list[str], work: Path, env: dict[str, str]) -> Proc:
    """`rollout worker` for one role of one host; `env` names the Temporal frontend."""
    argv = [sys.executable, "-m", "workers.worker", f"--task-queue={QUEUE}", *args]
    argv += [f"--temporal={env['ROLLOUT_BENCH_TEMPORAL']}"]
    argv += ["--log-level=INFO", "--graceful-shutdown-s=5"]
    return Proc(name, argv, work / f"{name}.log", env, _worker_ready)


async def start_fleet(config: MultiHostConfig, work: Path) -> Fleet:
    model = ensure_tiny_model()
    admin = "multihost-" + os.urandom(8).hex()
    temporal = TemporalDevServer(work / "temporal", ui=False, search_attributes=SEARCH_ATTRIBUTES)
    await temporal.start()
    env = dict(os.environ, PYTHONPATH=str(REPO), ROLLOUT_ADMIN_TOKEN=admin)
    env["ROLLOUT_BENCH_TEMPORAL"] = temporal.address
    fleet = Fleet(work, temporal, [], [], [], [], {}, {}, None)  # type: ignore[arg-type]
    try:
        script = work / "engine-script.json"
        script.write_text(Script(default_reply="42 {nonce}").model_dump_json())
        engine_urls = []
        for i in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            argv = [sys.executable, "-m", "devstack.scripted_engine", "--tokenizer"]
            argv += [str(model / "tokenizer.json"), "--script", str(script), "--port", str(port)]
            argv += ["--model", MODEL, "--log", str(work / f"engine-{i}-answers.jsonl")]
            engine = Proc(f"engine-{i}", argv, work / f"engine-{i}.log", env,
                          lambda p, _o, u=url: wait_http(u + "/health", p.alive))  # fmt: skip
            engine.start()
            fleet.engines.append(engine)
            engine_urls.append(url)
        for host in GATEWAY_HOSTS:
            port, control = free_port(), free_port()
            control_url = f"http://127.0.0.1:{control}"
            data = work / f"{host}-gateway"
            argv = [
                sys.executable,
                "-m",
                "workers.cli",
                "gateway",
                "--engine",
                ",".join(engine_urls),
            ]
            argv += ["--model", MODEL, "--tokenizer", str(model), "--port", str(port)]
            argv += ["--control-port", str(control), "--data-dir", str(data)]
            argv += ["--session-reaper-interval-s", str(config.reaper_interval_s)]
            ready = lambda p, _o, u=control_url: wait_http(u + "/health", p.alive)  # noqa: E731
            gateway = Proc(f"{host}-gateway", argv, work / f"{host}-gateway.log", env, ready)
            gateway.start()
            fleet.gateways.append(gateway)
            fleet.gateway_dirs.append(data)
            gw_worker = worker_proc(
                f"{host}-worker",
                ["--role=gateway-host", f"--host-id={host}", f"--gateway={control_url}",
                 f"--admin-token={admin}", f"--data-dir={work / f'{host}-worker'}",
                 f"--reaper-interval-s={config.reaper_interval_s}"],
                work, env,
            )  # fmt: skip
            gw_worker.start()
            fleet.gateway_workers.append(gw_worker)
        for host in SANDBOX_HOSTS:
            state = work / f"{host}-sandboxes"
            fleet.sandbox_dirs[host] = state
            sb_worker = worker_proc(
                f"{host}-worker",
                ["--role=sandbox-host", f"--host-id={host}", f"--admin-token={admin}",
                 f"--sandbox-state-dir={state}", f"--data-dir={work / f'{host}-worker'}",
                 f"--max-sandboxes={config.max_sandboxes}", "--max-provisions=4",
                 "--count-calls-every-s=5", f"--reaper-interval-s={config.reaper_interval_s}"],
                work, env,
            )  # fmt: skip
            sb_worker.start()
            fleet.sandbox_workers[host] = sb_worker
        fleet.orchestrator = worker_proc(
            "orchestrator", ["--role=orchestrator", "--host-id=orch"], work, env
        )
        fleet.orchestrator.start()
    except BaseException:
        stop_fleet(fleet)
        raise
    return fleet


def stop_fleet(fleet: Fleet) -> None:
    for proc in fleet.procs():
        if proc is not None:
            proc.stop()
    fleet.temporal.stop()
    for state in fleet.sandbox_dirs.values():  # nothing may outlive the bench
        if any(state.glob("lsb-*")):
            from sandboxes.backends.local import LocalBackend

            asyncio.run(LocalBackend(state_dir=state).reap(frozenset()))


def kill_host(fleet: Fleet, host: str) -> int:
    """SIGKILL a sandbox host: its worker, then every process of its sandboxes."""
    fleet.sandbox_workers[host].kill()
    pids = sandbox_trees(process_table(), fleet.sandbox_dirs[host])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


async def running_on(client: RolloutClient, batch_id: str, host: str) -> list[str]:
    query = (
        f"RolloutBatchId = '{batch_id}' AND RolloutSandboxHost = '{host}' "
        "AND RolloutPhase = 'running' AND ExecutionStatus = 'Running'"
    )
    return [wf.id async for wf in client.client.list_workflows(query)]


async def recovery(
    client: RolloutClient, rid: str, killed_at: datetime
) -> tuple[float | None, float | None]:
    """Seconds from the kill to (the dead host's run of this rollout timing out, its agent
    starting again: a run_harness task scheduled after the kill, started by a live host)."""
    history = await client.client.get_workflow_handle(rid).fetch_history()
    scheduled: set[int] = set()
    detected = None
    for e in history.events:
        t = e.event_time.ToDatetime(tzinfo=UTC)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT and detected is None:
            detected = (t - killed_at).total_seconds() if t > killed_at else None
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == RUN_HARNESS and t > killed_at:
                scheduled.add(e.event_id)
        elif (
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
        ):
            return detected, (t - killed_at).total_seconds()
    return detected, None


async def final_host(client: RolloutClient, rid: str) -> str:
    desc = await client.client.get_workflow_handle(rid).describe()
    for key, value in desc.typed_search_attributes:  # type: ignore[misc]
        if key.name == "RolloutSandboxHost":
            return str(value)
    return "?"


def loop_mounts(work: Path) -> int:
    with open("/proc/mounts") as f:
        return sum(1 for line in f if str(work) in line)


async def run(config: MultiHostConfig) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rollout-multihost-", dir="/tmp"))
    work.chmod(0o755)  # the sandbox uid must traverse the local backends' state dirs
    print(f"work dir {work}", flush=True)
    try:
        fleet = await start_fleet(config, work)
        try:
            return await _run(config, fleet)
        finally:
            stop_fleet(fleet)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _run(config: MultiHostConfig, fleet: Fleet) -> dict[str, Any]:
    chaos = ChaosConfig(
        n=config.n, turns=config.turns, pause_s=config.pause_s, tasks=3, fuzz_examples=0,
        heartbeat_s=config.heartbeat_s, deadline_s=config.deadline_s,
    )  # fmt: skip
    tasks = task_specs(chaos)
    client = await RolloutClient.connect(fleet.temporal.address, task_queue=QUEUE)
    t0 = time.monotonic()
    batch = await client.submit(tasks, str(fleet.work / "samples"), -(-config.n // len(tasks)))
    ids = batch.rollout_ids
    print(f"submitted {len(ids)} rollouts", flush=True)
    victims: list[str] = []
    want = min(config.max_sandboxes, max(1, len(ids) // 6))
    while time.monotonic() - t0 < config.deadline_s:
        victims = await running_on(client, batch.batch_id, VICTIM)
        if len(victims) >= want:
            break
        await asyncio.sleep(0.5)
    killed_at = datetime.now(UTC)
    t_kill = time.monotonic()
    killed_pids = kill_host(fleet, VICTIM)
    print(f"SIGKILLed {VICTIM} with {len(victims)} rollouts running ({killed_pids} sandbox "
          "processes)", flush=True)  # fmt: skip

    outcomes = {}
    async for outcome in client.results(batch, poll_s=1.0):
        outcomes[outcome.rollout_id] = outcome
        if time.monotonic() - t0 > config.deadline_s:
            break
    wall = time.monotonic() - t0
    all_done_after_kill = time.monotonic() - t_kill
    phases = [await recovery(client, rid, killed_at) for rid in victims]
    detected = [d for d, _ in phases if d is not None]
    recovered = [r for _, r in phases if r is not None]
    hosts_of_victims = [await final_host(client, rid) for rid in victims]
    spread: dict[str, int] = {}
    for rid in ids:
        host = await final_host(client, rid)
        spread[host] = spread.get(host, 0) + 1

    # The host comes back: same host id and state dir; its reaper reaps the crash's leftovers.
    fleet.sandbox_workers[VICTIM].start()
    await asyncio.sleep(config.reaper_interval_s * 2 + 5)
    table = process_table()
    return {
        "n": len(ids),
        "completed": sum(1 for o in outcomes.values() if o.ok),
        "failed": sum(1 for o in outcomes.values() if not o.ok),
        "lost": len(ids) - len(outcomes),
        "errors": sorted({o.error or "" for o in outcomes.values() if not o.ok})[:3],
        "wall_s": round(wall, 1),
        "killed_running": len(victims),
        "victims_rerun_elsewhere": sum(1 for h in hosts_of_victims if h != VICTIM),
        "detect_s_p50": round(statistics.median(detected), 1) if detected else None,
        "detect_s_max": round(max(detected), 1) if detected else None,
        "recover_s_p50": round(statistics.median(recovered), 1) if recovered else None,
        "recover_s_max": round(max(recovered), 1) if recovered else None,
        "recover_not_seen": len(victims) - len(recovered),
        "all_done_after_kill_s": round(all_done_after_kill, 1),
        "heartbeat_s": config.heartbeat_s,
        "rollouts_per_final_host": dict(sorted(spread.items())),
        "sandbox_dirs_left": sum(len(list(d.glob("lsb-*"))) for d in fleet.sandbox_dirs.values()),
        "sandbox_processes_left": sum(
            len(sandbox_trees(table, d)) for d in fleet.sandbox_dirs.values()
        ),
        "mounts_left": loop_mounts(fleet.work),
        "sessions_open": sum(len(open_sessions(d, batch.batch_id)) for d in fleet.gateway_dirs),
    }


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, spec in MultiHostConfig.model_fields.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(spec.default),
                            default=spec.default, help=spec.description)  # fmt: skip
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    ns = vars(parser.parse_args())
    out = ns.pop("json")
    report = asyncio.run(run(MultiHostConfig(**ns)))
    print(json.dumps(report, indent=2))
    if out:
        out.write_text(json.dumps(report, indent=2))
