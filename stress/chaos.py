"""The chaos run: N rollouts through the real stack while its processes are SIGKILLed.

`python -m bench.chaos` runs it (200 rollouts) and prints the table;
`tests/e2e/test_chaos.py` runs a short variant with the same faults and checks.

Real parts, each its own OS process: the Temporal dev server on a SQLite file, two
`rollout worker --role all` processes (local bubblewrap sandboxes), `rollout gateway
--processes 2`, and the scripted engine (`python -m devstack.scripted_engine`, which logs
every answer it samples to a file). Each rollout runs `stress/chaos_agent.py` in its
sandbox: several Chat Completions calls with pauses, retried the way agent SDKs retry.
The rollouts are submitted through the trainer client (`rollout_client.client.RolloutClient`).

While they run, the faults fire one after another, each once a share of the rollouts has
finished: SIGKILL a worker (restarted on the same host id), one gateway process
(restarted on the same data dir and port), the Temporal dev server (restarted on the same
file and port), the engine (restarted). Meanwhile `stress.fuzz` sends generated malformed
requests to the live gateway, whose witness sessions must not change.

Then it checks, from the trainer's side and from the files the parts left behind:
rollouts lost, duplicated samples, samples whose tokens differ from what the engine
sampled (token-exact against the engine's log), sandboxes and sessions left after the
reapers' next pass, and the fuzz tally.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import httpx
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.enums.v1 import EventType

from devstack.background_server import BackgroundServer
from devstack.ports import consecutive_free_ports, free_port
from devstack.scripted_engine import Script, ScriptedReply, read_log
from devstack.temporal_dev_server import TemporalDevServer
from devstack.tiny_model import ensure_tiny_model
from devstack.vllm_server import VllmServer
from gateway import lifeline
from rollout_client.client import RolloutClient, RolloutOutcome
from sandboxes.supervision.supervised import RUN_DIR
from schemas.outcome import RolloutStatus
from schemas.rollout import SEARCH_ATTRIBUTES
from schemas.tasks import RolloutTask
from stress.fuzz import LiveTarget, Tally, admin_get, fuzz, open_witness
from stress.malformed_requests import PROTOCOLS, Protocol

REPO = Path(__file__).resolve().parent.parent

MODEL = "tiny"
TASK_QUEUE = "chaos"
AGENT_PATH = "/home/agent/chaos_agent.py"
#: A held agent's last call waits for this file; it is put in every sandbox's run dir
#: (`<state>/lsb-*/run` on the host) once the last fault has fired.
RELEASE_NAME = "chaos-release"
#: What the gateway answers while the engine is away: its own kinds, and `overloaded`
#: (OpenAI code; Anthropic type `overloaded_error`) when the engine answers 503.
ENGINE_ERRORS = {
    "engine_unavailable",
    "engine_timeout",
    "engine_bad_reply",
    "overloaded",
    "overloaded_error",
}


class Fault(StrEnum):
    worker = "worker"
    gateway = "gateway"
    temporal = "temporal"
    engine = "engine"


DEFAULT_FAULTS = [Fault.worker, Fault.gateway, Fault.temporal, Fault.worker, Fault.engine]


class ChaosConfig(BaseModel):
    """One chaos run."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(default=200, ge=1, description="rollouts")
    engine: Literal["scripted", "vllm"] = "scripted"
    seed: int = 0
    faults: list[Fault] = Field(default_factory=lambda: list(DEFAULT_FAULTS))
    fuzz_examples: int = Field(default=10_000, ge=0, description="per protocol; 0: no fuzz")
    tasks: int = Field(default=4, ge=1, description="distinct tasks (GRPO groups)")
    turns: int = Field(default=4, ge=1, description="agent calls per rollout")
    pause_s: float = Field(default=0.5, ge=0, description="agent pause before each call")
    agent_retries: int = Field(default=12, ge=0, description="SDK-style retries per call")
    held_tasks: int = Field(
        default=0,
        ge=0,
        description="tasks whose agents hold their last call until every fault has fired: "
        "work in flight for each fault however fast the rest goes (keep their rollouts "
        "under half of n and of the sandbox slots)",
    )
    workers: int = Field(default=2, ge=1)
    max_sandboxes: int = Field(default=8, ge=1, description="per worker")
    down_s: float = Field(default=3.0, ge=0, description="how long a killed part stays down")
    heartbeat_s: float = Field(default=10.0, gt=0, description="dead worker detection")
    reaper_interval_s: float = Field(default=10.0, gt=0)
    deadline_s: float = Field(default=1800.0, gt=0, description="rollouts not done by then: lost")
    work_dir: Path | None = None
    keep: bool = Field(default=False, description="keep the work dir")


# --------------------------------------------------------------------------- processes


def wait_http(url: str, alive: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"process serving {url} exited")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


@dataclass
class Proc:
    """One child process we start, SIGKILL and restart; its output goes to `log`."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    ready: Callable[[Proc, int], None]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=REPO,
                start_new_session=True,
            )
        self.ready(self, offset)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL this process only (its children, e.g. sandboxes, are left as a crash
        leaves them)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 40.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_text(self, offset: int = 0) -> str:
        return self.log.read_bytes()[offset:].decode(errors="replace") if self.log.exists() else ""


def _worker_ready(proc: Proc, offset: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if "worker up" in proc.log_text(offset):
            return
        if not proc.alive():
            break
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not start:\n{proc.log_text(offset)[-3000:]}")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    return found


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        raw = f.read().split(b"\0")
    pairs = (item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
    return dict(pairs)


@dataclass
class GatewayGroup:
    """`rollout gateway --processes 2`, and restarts of a killed child process.

    A killed child is restarted as the supervisor started it (same environment, so the
    same settings: data dir, port, admin token), but by us, since the supervisor does not
    restart children."""

    supervisor: Proc
    agent_urls: list[str]
    control_urls: list[str]
    admin_token: str
    restarted: dict[int, Proc] = field(default_factory=dict)

    def child_pid(self, index: int) -> int:
        if index in self.restarted:
            assert self.restarted[index].proc is not None
            return self.restarted[index].proc.pid
        assert self.supervisor.proc is not None
        port = int(self.agent_urls[index].rsplit(":", 1)[1])
        for pid in _children(self.supervisor.proc.pid):
            settings = json.loads(_environ(pid).get("ROLLOUT_GATEWAY_SETTINGS", "{}"))
            if settings.get("port") == port:
                return pid
        raise RuntimeError(f"no gateway child serves port {port}")

    def kill(self, index: int) -> dict[str, str]:
        pid = self.child_pid(index)
        env = _environ(pid)
        os.kill(pid, signal.SIGKILL)
        if index in self.restarted:
            self.restarted[index].proc.wait(timeout=30)  # type: ignore[union-attr]
        else:
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists() and _zombie_or_running(pid):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway child {pid} did not die")
                time.sleep(0.05)
        return env

    def restart(self, index: int, env: dict[str, str], log: Path) -> None:
        url = self.control_urls[index] + "/health"
        # Not the supervisor's child: it must not watch the supervisor as its parent.
        env = {k: v for k, v in env.items() if k != lifeline.PARENT_ENV}
        proc = Proc(
            f"gateway-{index}",
            [sys.executable, "-m", "workers.gateway_server"],
            log,
            env,
            lambda p, _o: wait_http(url, p.alive),
        )
        proc.start()
        self.restarted[index] = proc

    def stop(self) -> None:
        for proc in self.restarted.values():
            proc.stop()
        self.supervisor.stop()


def _zombie_or_running(pid: int) -> bool:
    """True while `pid` is running (a zombie child of the supervisor counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


# --------------------------------------------------------------------------- engines


def scripted_engine(model: Path, port: int, log: Path, work: Path, env: dict[str, str]) -> Proc:
    """The scripted engine as its own process; every answer ends in a fresh nonce."""
    script = work / "engine-script.json"
    script.write_text(Script(default_reply="42 {nonce}").model_dump_json())
    argv = [sys.executable, "-m", "devstack.scripted_engine", "--tokenizer"]
    argv += [str(model / "tokenizer.json"), "--script", str(script), "--port", str(port)]
    argv += ["--model", MODEL, "--log", str(log)]
    url = f"http://127.0.0.1:{port}/health"
    return Proc("engine", argv, work / "engine.log", env, lambda p, _o: wait_http(url, p.alive))


class VllmEngine:
    """vLLM CPU with the tiny model (its own process group, killed and restarted on the
    same port), behind a forwarding proxy in this process that appends every completion
    it passes on to `log` in the scripted engine's format, so the samples are checked
    token for token against what vLLM really sampled."""

    def __init__(self, model: Path, port: int, log: Path, server_log: Path) -> None:
        self.server = VllmServer(
            model_dir=model, served_model_name=MODEL, port=port, log_path=server_log
        )
        self.log = open(log, "a", encoding="utf-8")  # noqa: SIM115
        self.lock = threading.Lock()
        self.proxy = BackgroundServer(self._app())
        self.proxy_up = False

    @property
    def url(self) -> str:
        return self.proxy.url

    def _app(self) -> Starlette:
        async def forward(request: Request) -> Response:
            body = await request.body()
            try:
                async with httpx.AsyncClient(timeout=600) as client:
                    reply = await client.request(
                        request.method,
                        self.server.url + request.url.path,
                        content=body,
                        headers={"content-type": "application/json"},
                    )
            except httpx.HTTPError as exc:  # vLLM is down: what its absence looks like
                return JSONResponse({"error": {"message": repr(exc)}}, 503)
            if request.url.path == "/v1/completions" and reply.is_success:
                self._record(json.loads(body), reply.json())
            return Response(reply.content, reply.status_code, media_type="application/json")

        return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])

    def _record(self, sent: dict[str, Any], got: dict[str, Any]) -> None:
        choice = got["choices"][0]
        answer = ScriptedReply(
            prompt_ids=sent["prompt"],
            output_ids=choice["token_ids"],
            output_logprobs=choice["logprobs"]["token_logprobs"],
            finish_reason=choice["finish_reason"],
            rule=None,
        )
        with self.lock:
            self.log.write(answer.model_dump_json() + "\n")
            self.log.flush()

    def start(self) -> None:
        if not self.proxy_up:
            self.proxy.start()
            self.proxy_up = True
        self.server.start()

    def kill(self) -> None:
        assert self.server.pid is not None
        os.killpg(self.server.pid, signal.SIGKILL)
        self.server.stop()  # reaps what the kill left

    def stop(self) -> None:
        self.server.stop()
        self.proxy.stop()
        self.log.close()


# --------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    work: Path
    config: ChaosConfig
    temporal: TemporalDevServer
    engine: Proc | VllmEngine
    engine_log: Path
    gateway: GatewayGroup
    workers: list[Proc]
    sandbox_dirs: list[Path]
    gateway_dir: Path
    out_dir: Path


def task_specs(config: ChaosConfig) -> list[RolloutTask]:
    agent = (Path(__file__).parent / "chaos_agent.py").read_text()
    tasks = []
    for index in range(config.tasks):
        tasks.append(
            RolloutTask.model_validate(
                {
                    "task_id": f"chaos{index}",
                    "prompt": f"What is 6 times 7? (task {index}) Reply with the number only.",
                    "harness": {
                        "name": "command",
                        "config": {
                            "command": f"python3 {AGENT_PATH}",
                            "env": {
                                "AGENT_TURNS": str(config.turns),
                                "AGENT_SLEEP_S": str(config.pause_s),
                                "AGENT_MAX_RETRIES": str(config.agent_retries),
                            }
                            | (
                                {"AGENT_HOLD_FILE": f"{RUN_DIR}/{RELEASE_NAME}"}
                                if index < config.held_tasks
                                else {}
                            ),
                        },
                        "budget_s": 600,
                    },
                    "sandbox": {
                        "backend": "local",
                        "files": [{"path": AGENT_PATH, "content": agent}],
                        "resources": {"cpus": 1.0, "memory_mb": 256, "pids": 64},
                    },
                    "hooks": [{"name": "collect_logs"}, {"name": "evaluate"}],
                    "evaluation": {
                        "checks": [{"kind": "file", "path": "answer.txt", "contains": ["42"]}]
                    },
                    "budget": {
                        "heartbeat_s": config.heartbeat_s,
                        "host_queue_wait_s": 120,
                        "total_s": config.deadline_s,
                    },
                    "policy_version": "chaos-v0",
                    "sampling": {"temperature": 1.0, "max_tokens": 32},
                }
            )
        )
    return tasks


async def start_stack(config: ChaosConfig, work: Path) -> Stack:
    """Start every part; on failure, stop what was started."""
    model = ensure_tiny_model()
    admin = "chaos-" + os.urandom(8).hex()
    env = dict(os.environ, PYTHONPATH=str(REPO), ROLLOUT_ADMIN_TOKEN=admin)
    started: list[Callable[[], None]] = []
    try:
        temporal = TemporalDevServer(
            work / "temporal", ui=False, search_attributes=SEARCH_ATTRIBUTES
        )
        await temporal.start()
        started.append(temporal.stop)

        engine_port = free_port()
        engine_log = work / "engine-answers.jsonl"
        if config.engine == "vllm":
            vllm = VllmEngine(model, engine_port, engine_log, work / "vllm.log")
            await asyncio.to_thread(vllm.start)
            started.append(vllm.stop)
            engine: Proc | VllmEngine = vllm
            engine_url = vllm.url
        else:
            engine = scripted_engine(model, engine_port, engine_log, work, env)
            engine.start()
            started.append(engine.stop)
            engine_url = f"http://127.0.0.1:{engine_port}"

        base = consecutive_free_ports(4)  # agent API: base, base+1; control: base+2, base+3
        agent_urls = [f"http://127.0.0.1:{base + i}" for i in range(2)]
        control_urls = [f"http://127.0.0.1:{base + 2 + i}" for i in range(2)]
        gateway_dir = work / "gateway"
        supervisor = Proc(
            "gateway",
            [
                sys.executable,
                "-m",
                "workers.cli",
                "gateway",
                "--engine",
                engine_url,
                "--model",
                MODEL,
                "--tokenizer",
                str(model),
                "--port",
                str(base),
                "--control-port",
                str(base + 2),
                "--processes",
                "2",
                "--session-reaper-interval-s",
                str(config.reaper_interval_s),
                "--data-dir",
                str(gateway_dir),
            ],
            work / "gateway.log",
            env,
            lambda p, _o: [wait_http(u + "/health", p.alive) for u in control_urls] and None,
        )
        supervisor.start()
        gateway = GatewayGroup(supervisor, agent_urls, control_urls, admin)
        started.append(gateway.stop)

        workers: list[Proc] = []
        sandbox_dirs: list[Path] = []
        for index in range(config.workers):
            sandboxes = work / f"sandboxes-{index}"
            sandbox_dirs.append(sandboxes)
            worker = Proc(
                f"worker-{index}",
                [
                    sys.executable,
                    "-m",
                    "workers.worker",
                    "--role=all",
                    f"--temporal={temporal.address}",
                    f"--task-queue={TASK_QUEUE}",
                    f"--host-id=chaos-{index}",
                    f"--gateway={','.join(control_urls)}",
                    f"--admin-token={admin}",
                    f"--sandbox-state-dir={sandboxes}",
                    f"--data-dir={work / f'worker-{index}'}",
                    f"--max-sandboxes={config.max_sandboxes}",
                    "--max-provisions=4",
                    "--graceful-shutdown-s=5",
                    "--count-calls-every-s=5",
                    f"--reaper-interval-s={config.reaper_interval_s}",
                    "--log-level=INFO",
                ],
                work / f"worker-{index}.log",
                env,
                _worker_ready,
            )
            worker.start()
            workers.append(worker)
            started.append(worker.stop)
    except BaseException:
        for stop in reversed(started):
            with contextlib.suppress(Exception):
                stop()
        raise
    return Stack(
        work, config, temporal, engine, engine_log, gateway, workers, sandbox_dirs,
        gateway_dir, work / "samples",
    )  # fmt: skip


def stop_stack(stack: Stack) -> None:
    for worker in stack.workers:
        worker.stop()
    stack.gateway.stop()
    stack.engine.stop()
    stack.temporal.stop()
    for state in stack.sandbox_dirs:  # nothing may outlive the bench
        if any(state.glob("lsb-*")):
            from sandboxes.backends.local import LocalBackend

            asyncio.run(LocalBackend(state_dir=state).reap(frozenset()))


# --------------------------------------------------------------------------- faults


class FaultRecord(BaseModel):
    fault: Fault
    target: str
    at_done: int
    killed_at_s: float
    back_at_s: float
    note: str = ""
    #: Fuzz requests sent from the kill to the restart: the fuzzing overlapped this fault.
    fuzz_sent: int = 0


class Faults:
    """Fires the configured faults one by one, each once enough rollouts are done."""

    def __init__(self, stack: Stack, rng: random.Random, t0: float) -> None:
        self.stack = stack
        self.rng = rng
        self.t0 = t0
        self.records: list[FaultRecord] = []
        #: (killed, back) of each record, unrounded (monotonic time).
        self.windows: list[tuple[float, float]] = []
        self.sent_since: Callable[[float], bool] = lambda _: True
        self.engine_down: list[tuple[float, float]] = []
        self._worker_kills = 0

    def thresholds(self, n: int) -> list[int]:
        count = len(self.stack.config.faults)
        return [max(1, round(n * (0.05 + 0.45 * i / max(1, count - 1)))) for i in range(count)]

    async def run(
        self, progress: Progress, sent_since: Callable[[float], bool] = lambda _: True
    ) -> None:
        """`sent_since(t)`: whether the fuzzer sent a request after `t`. A part stays down
        until one was sent while it was (30 s more at most): on a loaded box the fuzzer
        can pause for seconds between requests, and a fault it did not overlap proves
        nothing."""
        self.sent_since = sent_since
        n = self.stack.config.n
        for fault, threshold in zip(self.stack.config.faults, self.thresholds(n), strict=True):
            while progress.done < threshold and not progress.finished:
                await asyncio.sleep(0.2)
            if progress.finished:
                return
            await self.fire(fault, progress.done)

    def in_flight(self, fault: Fault) -> bool:
        """Whether the part about to be killed has work in flight: sandboxes on the worker,
        a conversation under way on the gateway process (any, for the engine)."""
        stack = self.stack
        if fault is Fault.worker:
            index = self._worker_kills % len(stack.workers)
            return any(stack.sandbox_dirs[index].glob("lsb-*"))
        if fault in (Fault.gateway, Fault.engine):
            owner = stack.gateway.agent_urls[-1] if fault is Fault.gateway else None
            return bool(talking_sessions(stack.gateway_dir, owner))
        return True

    async def stay_down(self, killed: float) -> None:
        """The part's down time, then until the fuzzer sent a request since `killed`."""
        await asyncio.sleep(self.stack.config.down_s)
        deadline = time.monotonic() + 30
        while not self.sent_since(killed) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def fire(self, fault: Fault, done: int) -> None:
        stack = self.stack
        deadline = time.monotonic() + 30
        busy = self.in_flight(fault)  # looked at once per try: the kill follows what was seen
        while not busy and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            busy = self.in_flight(fault)
        note = "" if busy else "nothing in flight"
        killed = time.monotonic()
        if fault is Fault.worker:
            index = self._worker_kills % len(stack.workers)
            self._worker_kills += 1
            worker = stack.workers[index]
            target = worker.name
            worker.kill()
            await self.stay_down(killed)
            await asyncio.to_thread(worker.start)
        elif fault is Fault.gateway:
            index = len(stack.gateway.agent_urls) - 1
            target = f"gateway process {index} ({stack.gateway.agent_urls[index]})"
            env = stack.gateway.kill(index)
            await self.stay_down(killed)
            log = stack.work / f"gateway-{index}-restarted.log"
            await asyncio.to_thread(stack.gateway.restart, index, env, log)
        elif fault is Fault.temporal:
            target = f"temporal dev server ({stack.temporal.address})"
            stack.temporal.kill()
            await self.stay_down(killed)
            await stack.temporal.restart()
        else:
            target = f"engine ({stack.config.engine})"
            stack.engine.kill()
            await self.stay_down(killed)
            await asyncio.to_thread(stack.engine.start)
        back = time.monotonic()
        if fault is Fault.engine:
            self.engine_down.append((killed, back))
        self.windows.append((killed, back))
        self.records.append(
            FaultRecord(
                fault=fault,
                target=target,
                at_done=done,
                killed_at_s=round(killed - self.t0, 1),
                back_at_s=round(back - self.t0, 1),
                note=note,
            )
        )


async def release_held(
    stack: Stack, injector: asyncio.Future[None], follower: asyncio.Future[None]
) -> None:
    """Once the faults are done, let the held agents make their last call: the release
    file in every sandbox's run dir, again every half second for sandboxes started later
    (retried attempts) until the batch is done."""
    if not stack.config.held_tasks:
        return
    await asyncio.wait([injector])  # fired them all (or stopped): release either way
    while not follower.done():
        for state in stack.sandbox_dirs:
            for run in state.glob("lsb-*/run"):
                with contextlib.suppress(OSError):
                    (run / RELEASE_NAME).touch()
        await asyncio.sleep(0.5)


class Progress:
    """How many rollouts of the batch are closed, polled through visibility; a poll that
    fails (Temporal is down) keeps the last count."""

    def __init__(self) -> None:
        self.done = 0
        self.finished = False

    async def follow(self, client: RolloutClient, batch_id: str, n: int, deadline: float) -> None:
        query = f"RolloutBatchId = '{batch_id}' AND ExecutionStatus != 'Running'"
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                self.done = (await client.client.count_workflows(query)).count
            if self.done >= n:
                break
            await asyncio.sleep(1.0)
        self.finished = True


# --------------------------------------------------------------------------- fuzz


#: Requests per protocol in each extra round sent while faults are still to come.
EXTRA_ROUND = 100


@dataclass
class FuzzRun:
    tallies: dict[str, Tally] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0
    error: str | None = None
    #: Set once the last fault is back: until then the fuzzer keeps sending.
    faults_over: threading.Event = field(default_factory=threading.Event)


def run_fuzz(target: LiveTarget, examples: int, seed: int, out: FuzzRun) -> None:
    """One thread per protocol (Hypothesis is thread-safe since 6.136): the gateway
    works on one request while the next ones are generated. `examples` per protocol at
    least, then more rounds (new seeds) until `out.faults_over`, so the malformed
    requests overlap every fault however fast they go."""
    out.started = time.monotonic()

    def one(name: str, protocol: Protocol) -> None:
        t = time.monotonic()
        try:
            tally = out.tallies[name] = fuzz(target, protocol, examples, seed)
            extra = 0
            while not out.faults_over.is_set() and out.error is None:
                extra += 1
                fuzz(target, protocol, EXTRA_ROUND, seed + extra, tally)
        except Exception as exc:  # reported in the table and failed on, never swallowed
            out.error = f"{name}: {exc!r}"[:2000]
        out.seconds[name] = time.monotonic() - t

    threads = [threading.Thread(target=one, args=item) for item in PROTOCOLS.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.ended = time.monotonic()


def gateway_tracebacks(work: Path, most: int = 3) -> list[str]:
    """The last `most` tracebacks the gateway processes logged (a 5xx the fuzzer got is
    explained there, and the run's work directory is removed afterwards)."""
    out: list[str] = []
    for log in sorted(work.glob("gateway*.log")):
        text = log.read_text(errors="replace")
        for block in text.split("Traceback (most recent call last):")[1:]:
            out.append(f"{log.name}: Traceback{block[:3000]}")
    return out[-most:]


def sent_during(sent_at: list[float], start: float, end: float) -> int:
    """How many of the requests sent at `sent_at` went out from `start` to `end`."""
    return sum(1 for t in sent_at if start <= t <= end)


# --------------------------------------------------------------------------- checks


class Report(BaseModel):
    """What a chaos run found; `problems()` lists every violated requirement."""

    n: int
    wall_s: float
    statuses: dict[str, int]
    lost: list[str]
    failed: list[str]
    gave_up: list[str]
    multi_attempt: int
    attempts_in_history: bool
    samples: int
    sampled_turns: int
    duplicated: int
    tokens_differ: int
    turns_missing: int
    sandboxes_left: int
    sandbox_processes_left: int
    sessions_left: int
    fuzz_requests: dict[str, int]
    fuzz_during_faults: int
    fuzz_seconds: float
    fuzz_5xx: int
    fuzz_5xx_engine_down: int
    fuzz_bad_shape: int
    fuzz_error: str | None
    witnesses_unchanged: bool
    faults: list[FaultRecord]
    details: list[str] = Field(default_factory=list)

    def problems(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"rollouts lost: {self.lost[:10]}")
        if self.failed:
            out.append(f"rollouts failed: {self.failed[:10]}")
        if self.gave_up:
            out.append(f"agents that gave up: {self.gave_up[:10]}")
        if not self.attempts_in_history:
            out.append("retried attempts missing from history")
        for name in ("duplicated", "tokens_differ", "turns_missing", "sandboxes_left"):
            if getattr(self, name):
                out.append(f"{name}: {getattr(self, name)}")
        if self.sandbox_processes_left or self.sessions_left:
            out.append(
                f"left behind: {self.sandbox_processes_left} sandbox processes, "
                f"{self.sessions_left} sessions"
            )
        if self.fuzz_5xx - self.fuzz_5xx_engine_down or self.fuzz_bad_shape or self.fuzz_error:
            out.append(
                f"fuzz: {self.fuzz_5xx} 5xx ({self.fuzz_5xx_engine_down} while the engine was "
                f"down), {self.fuzz_bad_shape} bad shape, error {self.fuzz_error}"
            )
        if not self.witnesses_unchanged:
            out.append("a witness session's trajectory changed")
        missed = [f.fault.value for f in self.faults if self.fuzz_requests and not f.fuzz_sent]
        if missed:
            out.append(f"no fuzz request sent while these were down: {missed}")
        return out


def engine_index(replies: list[ScriptedReply]) -> dict[tuple[int, ...], list[ScriptedReply]]:
    index: dict[tuple[int, ...], list[ScriptedReply]] = collections.defaultdict(list)
    for reply in replies:
        index[tuple(reply.prompt_ids)].append(reply)
    return index


def sampled_spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    return spans


#: The sample columns the checks read.
ROW_FIELDS = (
    "rollout_id", "segment_id", "status", "prompt_ids", "response_ids", "loss_mask", "logprobs",
)  # fmt: skip


def row_problem(
    row: dict[str, Any], engine: dict[tuple[int, ...], list[ScriptedReply]]
) -> str | None:
    """What is wrong with `row`, or None: it has every column the checks read, its mask
    and logprobs align with its response; an `infra_error` row trains no token; any
    other has at least one sampled token, a logprob only on sampled tokens, and every
    sampled span is, token for token and logprob for logprob, an answer the engine gave
    to exactly the tokens before it."""
    absent = [name for name in ROW_FIELDS if row.get(name) is None]
    if absent:
        return f"missing {', '.join(absent)}"
    n = len(row["response_ids"])
    mask, logprobs = row["loss_mask"], row["logprobs"]
    if len(mask) != n or len(logprobs) != n:
        return f"loss_mask {len(mask)}, logprobs {len(logprobs)} for {n} response tokens"
    if any(bit not in (0, 1) for bit in mask):
        return f"loss_mask holds {sorted(set(mask) - {0, 1})}"
    if row["status"] == RolloutStatus.infra_error.value:  # masked: out of the loss
        return f"{sum(mask)} trained tokens in an infra_error row" if any(mask) else None
    spans = sampled_spans(mask)
    if not spans:
        return "no sampled token (loss_mask has no 1)"
    stray = [i for i, (bit, lp) in enumerate(zip(mask, logprobs, strict=True)) if not bit and lp]
    if stray:
        return f"logprobs on unsampled tokens at {stray[:5]}"
    full = [*row["prompt_ids"], *row["response_ids"]]
    offset = len(row["prompt_ids"])
    for start, end in spans:
        answers = engine.get(tuple(full[: offset + start]), [])
        if not answers:
            return f"tokens {start}:{end}: the engine was never asked the tokens before them"
        out, lps = row["response_ids"][start:end], logprobs[start:end]
        same = [r for r in answers if r.output_ids == out]
        if not same:
            return f"tokens {start}:{end}: not an answer the engine gave to that prompt"
        if not any(all(abs(a - b) < 1e-6 for a, b in zip(r.output_logprobs, lps, strict=True))
                   for r in same):  # fmt: skip
            return f"tokens {start}:{end}: logprobs differ from the engine's"
    return None


def span_keys(row: dict[str, Any]) -> list[tuple[int, ...]]:
    full = [*row["prompt_ids"], *row["response_ids"]]
    offset = len(row["prompt_ids"])
    return [tuple(full[: offset + s]) for s, _ in sampled_spans(row["loss_mask"])]


class OutcomeCheck(BaseModel):
    """The rollouts' outcomes from the trainer's side."""

    statuses: dict[str, int]
    lost: list[str]
    failed: list[str]
    gave_up: list[str]
    retried: dict[str, int] = Field(description="rollout id → attempts, those with more than 1")
    complete: list[str] = Field(description="ok, agent exit 0: their samples hold every turn")
    details: list[str]


def check_outcomes(outcomes: dict[str, RolloutOutcome | None]) -> OutcomeCheck:
    """Lost: still running, or no result nor error, or a result whose samples file is not
    there; failed: the workflow failed with an error; gave up: the agent exited ≠ 0."""
    statuses: collections.Counter[str] = collections.Counter()
    lost, failed, gave_up, complete, details = [], [], [], [], []
    retried: dict[str, int] = {}
    for rid, outcome in outcomes.items():
        if outcome is None:
            lost.append(rid)
            statuses["still running"] += 1
            continue
        if outcome.result is None:
            statuses[f"workflow {outcome.workflow_status.lower()}"] += 1
            details.append(f"{rid}: {outcome.workflow_status}: {outcome.error}")
            (failed if outcome.error else lost).append(rid)
            continue
        result = outcome.result
        statuses[str(result.status.value)] += 1
        if result.attempts > 1:
            retried[rid] = result.attempts
        if result.agent_exit_code not in (0, None):
            gave_up.append(rid)
            details.append(f"{rid}: agent exit {result.agent_exit_code}: {result.error}")
        if result.samples_uri is None or not Path(result.samples_uri).exists():
            lost.append(rid)
            details.append(f"{rid}: {result.status.value} without samples ({result.error})")
        elif result.agent_exit_code == 0 and result.status.value == "ok":
            complete.append(rid)
    finished = [o.result for o in outcomes.values() if o is not None and o.result is not None]
    for result in sorted(finished, key=lambda r: -r.duration_s)[:3]:
        details.append(
            f"slowest: {result.rollout_id}: {result.duration_s:.0f} s, {result.attempts} "
            f"attempt(s), {result.status.value}"
        )
    return OutcomeCheck(
        statuses=dict(statuses), lost=lost, failed=failed, gave_up=gave_up,
        retried=retried, complete=complete, details=details,
    )  # fmt: skip


class SampleCheck(BaseModel):
    """The samples against the engine's log."""

    samples: int
    sampled_turns: int
    duplicated: int = Field(description="segments written twice, and turns recorded twice")
    tokens_differ: int = Field(description="rows `row_problem` finds wrong")
    turns_missing: int
    details: list[str]


def check_samples(
    rows: list[dict[str, Any]],
    engine: dict[tuple[int, ...], list[ScriptedReply]],
    complete: list[str],
    turns: int,
) -> SampleCheck:
    """Each row checked against the engine (`row_problem`); a (rollout, segment) written
    more than once, or a turn (the prompt before a sampled span) recorded twice in a
    rollout, is duplicated; each rollout of `complete` must hold `turns` turns."""
    details: list[str] = []
    segments = collections.Counter((r.get("rollout_id"), r.get("segment_id")) for r in rows)
    duplicated = sum(c - 1 for c in segments.values())
    for (rid, segment), count in segments.items():
        if count > 1:
            details.append(f"{rid}/{segment}: written {count} times")
    differ = 0
    sampled: collections.Counter[str] = collections.Counter()
    prefixes: dict[str, collections.Counter[tuple[int, ...]]] = collections.defaultdict(
        collections.Counter
    )
    for row in rows:
        problem = row_problem(row, engine)
        if problem is not None:
            differ += 1
            details.append(f"{row.get('rollout_id')}/{row.get('segment_id')}: {problem}")
            if any(row.get(name) is None for name in ROW_FIELDS):
                continue  # no turns to count in a row without its tokens
        keys = span_keys(row)
        sampled[row["rollout_id"]] += len(keys)
        prefixes[row["rollout_id"]].update(keys)
    for rid, counter in prefixes.items():
        extra = sum(c - 1 for c in counter.values())
        if extra:
            duplicated += extra
            details.append(f"{rid}: {extra} turn(s) recorded twice")
    missing = 0
    for rid in complete:
        if sampled[rid] < turns:
            missing += turns - sampled[rid]
            details.append(f"{rid}: {sampled[rid]} of {turns} turns in its samples")
    return SampleCheck(
        samples=len(rows), sampled_turns=sum(sampled.values()), duplicated=duplicated,
        tokens_differ=differ, turns_missing=missing, details=details,
    )  # fmt: skip


def sandboxes_left(dirs: list[Path]) -> list[Path]:
    """The local sandboxes still on disk in the workers' state dirs (`lsb-*`, what
    `LocalBackend` makes per sandbox and removes when it destroys or reaps one)."""
    return sorted(p for d in dirs for p in d.glob("lsb-*"))


def open_sessions(gateway_dir: Path, batch_id: str) -> list[str]:
    """Sessions of this batch's rollouts with no `closed` marker in the data dir."""
    left = []
    for meta in (gateway_dir / "sessions").glob("*/meta.json"):
        config = json.loads(meta.read_text()).get("config", {})
        if (
            str(config.get("rollout_id", "")).startswith(batch_id)
            and not (meta.parent / "closed").exists()
        ):
            left.append(meta.parent.name)
    return left


def talking_sessions(gateway_dir: Path, owner: str | None) -> list[str]:
    """Open sessions (of `owner`, an agent URL, if given) with at least one recorded call."""
    found = []
    for meta_path in (gateway_dir / "sessions").glob("*/meta.json"):
        folder = meta_path.parent
        with contextlib.suppress(OSError, ValueError):
            if (folder / "closed").exists() or not (folder / "records.jsonl").stat().st_size:
                continue
            meta = json.loads(meta_path.read_text())
            if str(meta.get("config", {}).get("rollout_id", "")).startswith(("witness", "fuzz")):
                continue
            if owner is None or str(meta.get("owner_url") or "").startswith(owner):
                found.append(folder.name)
    return found


def sandbox_processes(dirs: list[Path], exclude: set[int]) -> list[str]:
    """Live processes whose command line names a sandbox state dir (bwrap and its tree),
    other than `exclude` (the workers, whose options name it): `pid: command line`."""
    needles = [str(d).encode() for d in dirs]
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in exclude:
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if any(n in cmdline for n in needles):
                shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:300]
                found.append(f"{pid}: {shown}")
    return found


async def fetch_outcomes(client: RolloutClient, ids: list[str]) -> dict[str, RolloutOutcome | None]:
    gate = asyncio.Semaphore(16)

    async def one(rid: str) -> tuple[str, RolloutOutcome | None]:
        async with gate:
            desc = await client.client.get_workflow_handle(rid).describe()
            if desc.status is not None and desc.status.name == "RUNNING":
                return rid, None
            return rid, await client.outcome(rid)

    return dict(await asyncio.gather(*(one(r) for r in ids)))


async def creates_in_history(client: RolloutClient, rid: str) -> int:
    history = await client.client.get_workflow_handle(rid).fetch_history()
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "create_session"
    )


# --------------------------------------------------------------------------- the run


async def run_chaos(config: ChaosConfig, console: Console | None = None) -> Report:
    console = console or Console(stderr=True)
    work = config.work_dir or Path(tempfile.mkdtemp(prefix="rollout-chaos-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)  # the sandbox uid must traverse the local backend's state dir
    rng = random.Random(config.seed)
    console.log(f"work dir {work}")
    stack = await start_stack(config, work)
    try:
        return await _run(stack, rng, console)
    finally:
        stop_stack(stack)
        if not config.keep:
            shutil.rmtree(work, ignore_errors=True)


async def _run(stack: Stack, rng: random.Random, console: Console) -> Report:
    config = stack.config
    gw = stack.gateway
    witnesses = [
        (i, open_witness(gw.agent_urls[i], gw.control_urls[i], gw.admin_token,
                         rollout_id=f"witness-{i}", policy_version="chaos-v0"))
        for i in range(len(gw.agent_urls))
    ]  # fmt: skip
    before = {sid: admin_get(f"{gw.control_urls[0]}/sessions/{sid}/trajectory", gw.admin_token)
              for _, sid in witnesses}  # fmt: skip
    fuzz_session = httpx.post(
        gw.control_urls[0] + "/sessions",
        json={"rollout_id": "fuzz"},
        headers={"Authorization": f"Bearer {gw.admin_token}"},
        timeout=30,
    ).json()
    target = LiveTarget(gw.agent_urls[0], gw.control_urls[0], gw.admin_token, fuzz_session["token"])

    client = await RolloutClient.connect(stack.temporal.address, task_queue=TASK_QUEUE)
    tasks = task_specs(config)
    per_task = -(-config.n // len(tasks))
    t0 = time.monotonic()
    batch, requests = client.plan(tasks, str(stack.out_dir), per_task, seed=config.seed)
    requests = requests[: config.n]
    await asyncio.gather(*(client.start(r) for r in requests))
    ids = [r.rollout_id for r in requests]
    console.log(f"submitted {len(ids)} rollouts (batch {batch.batch_id})")

    fuzz_run = FuzzRun()
    fuzz_thread = None
    if config.fuzz_examples:
        fuzz_thread = threading.Thread(
            target=run_fuzz, args=(target, config.fuzz_examples, config.seed, fuzz_run)
        )
        fuzz_thread.start()
    progress = Progress()
    faults = Faults(stack, rng, t0)
    deadline = t0 + config.deadline_s
    follower = asyncio.ensure_future(progress.follow(client, batch.batch_id, len(ids), deadline))

    def fuzzed_since(t: float) -> bool:
        return fuzz_thread is None or bool(target.sent_at and max(target.sent_at[-8:]) >= t)

    injector = asyncio.ensure_future(faults.run(progress, sent_since=fuzzed_since))
    injector.add_done_callback(lambda _: fuzz_run.faults_over.set())
    releaser = asyncio.ensure_future(release_held(stack, injector, follower))
    last = -1
    while not follower.done():
        await asyncio.sleep(2)
        if progress.done != last:
            last = progress.done
            console.log(f"{progress.done}/{len(ids)} done; faults fired: {len(faults.records)}")
    await injector
    await releaser
    wall = time.monotonic() - t0
    if fuzz_thread is not None:
        await asyncio.to_thread(fuzz_thread.join)
    console.log(f"rollouts done in {wall:.0f} s; checking")

    # --- outcomes
    outcomes = await fetch_outcomes(client, ids)
    checked = check_outcomes(outcomes)
    details = list(checked.details)
    in_history = True
    for rid, attempts in checked.retried.items():
        if await creates_in_history(client, rid) < attempts:
            in_history = False
            details.append(f"{rid}: {attempts} attempts but fewer create_session in history")

    # --- samples against the engine's log
    rows = []
    for path in sorted(stack.out_dir.glob("*.parquet")):
        rows += pq.read_table(path).to_pylist()
    samples = check_samples(
        rows, engine_index(read_log(stack.engine_log)), checked.complete, config.turns
    )
    details += samples.details

    # --- what is left after the reapers' next pass
    await asyncio.sleep(config.reaper_interval_s * 1.5 + 2)
    # A sandbox tree still being torn down as the pass ends is gone moments later; a leak
    # stays. So look again until nothing is left or one more reaper interval has passed.
    worker_pids = {w.proc.pid for w in stack.workers if w.proc is not None}
    deadline = time.monotonic() + config.reaper_interval_s
    while True:
        left = sandboxes_left(stack.sandbox_dirs)
        processes_left = sandbox_processes(stack.sandbox_dirs, worker_pids)
        if not (left or processes_left) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    details += [f"sandbox left: {p}" for p in left[:10]]
    details += [f"sandbox process left: {p}" for p in processes_left[:10]]
    sessions_left = open_sessions(stack.gateway_dir, batch.batch_id)
    details += [f"session left open: {s}" for s in sessions_left[:10]]

    # --- fuzz
    after = {sid: admin_get(f"{gw.control_urls[0]}/sessions/{sid}/trajectory", gw.admin_token)
             for _, sid in witnesses}  # fmt: skip
    windows = [(a, b + 5) for a, b in faults.engine_down]
    for record, (killed, back) in zip(faults.records, faults.windows, strict=True):
        record.fuzz_sent = sent_during(target.sent_at, killed, back)
    fault_start = t0 + min((f.killed_at_s for f in faults.records), default=0.0)
    fault_end = t0 + max((f.back_at_s for f in faults.records), default=-1.0)
    engine_down_5xx = sum(
        1
        for e in target.server_errors
        if e.code in ENGINE_ERRORS and any(a <= e.at <= b for a, b in windows)
    )
    details += [
        f"fuzz {e.protocol}: {e.status} {e.code} at {e.at - t0:.1f}s: {e.text[:200]}"
        for e in target.server_errors[:10]
    ]
    if len(target.server_errors) > engine_down_5xx:  # the work dir goes: keep the why
        details += gateway_tracebacks(stack.work)
    return Report(
        n=len(ids),
        wall_s=round(wall, 1),
        statuses=checked.statuses,
        lost=checked.lost,
        failed=checked.failed,
        gave_up=checked.gave_up,
        multi_attempt=len(checked.retried),
        attempts_in_history=in_history,
        samples=samples.samples,
        sampled_turns=samples.sampled_turns,
        duplicated=samples.duplicated,
        tokens_differ=samples.tokens_differ,
        turns_missing=samples.turns_missing,
        sandboxes_left=len(left),
        sandbox_processes_left=len(processes_left),
        sessions_left=len(sessions_left),
        fuzz_requests={k: sum(t.statuses.values()) for k, t in fuzz_run.tallies.items()},
        fuzz_during_faults=sent_during(target.sent_at, fault_start, fault_end),
        fuzz_seconds=round(fuzz_run.ended - fuzz_run.started, 1),
        fuzz_5xx=len(target.server_errors),
        fuzz_5xx_engine_down=engine_down_5xx,
        fuzz_bad_shape=sum(t.bad_shape for t in fuzz_run.tallies.values()),
        fuzz_error=fuzz_run.error,
        witnesses_unchanged=before == after,
        faults=faults.records,
        details=details,
    )


# --------------------------------------------------------------------------- output


def render(report: Report, console: Console) -> None:
    table = Table(title=f"chaos: {report.n} rollouts, {report.wall_s} s")
    table.add_column("check")
    table.add_column("found", justify="right")
    table.add_column("required", justify="right")
    status_text = ", ".join(f"{k} {v}" for k, v in sorted(report.statuses.items()))
    rows = [
        ("rollouts by status", status_text, ""),
        ("rollouts lost", str(len(report.lost)), "0"),
        ("rollouts failed (after all attempts)", str(len(report.failed)), "0"),
        ("agents that gave up (exit ≠ 0)", str(len(report.gave_up)), "0"),
        ("rollouts retried (attempts > 1)", str(report.multi_attempt), ""),
        ("retried attempts visible in history", "yes" if report.attempts_in_history else "no",
         "yes"),
        ("samples / sampled turns", f"{report.samples} / {report.sampled_turns}", ""),
        ("samples duplicated", str(report.duplicated), "0"),
        ("samples not what the engine sampled (tokens, logprobs, mask)",
         str(report.tokens_differ), "0"),
        ("turns missing from samples", str(report.turns_missing), "0"),
        ("sandboxes left after the reapers' pass", str(report.sandboxes_left), "0"),
        ("sandbox processes left", str(report.sandbox_processes_left), "0"),
        ("sessions left open", str(report.sessions_left), "0"),
        ("fuzz requests per protocol",
         ", ".join(f"{k} {v}" for k, v in report.fuzz_requests.items()) or "off", ">= 10000"),
        ("fuzz requests sent from the first kill to the last restart",
         str(report.fuzz_during_faults), ""),
        ("fuzz wall time s", str(report.fuzz_seconds), ""),
        ("fuzz 5xx (while the engine was down)",
         f"{report.fuzz_5xx} ({report.fuzz_5xx_engine_down})", "0 (only engine-down)"),
        ("fuzz errors not in the protocol's shape", str(report.fuzz_bad_shape), "0"),
        ("witness trajectories unchanged", "yes" if report.witnesses_unchanged else "no", "yes"),
    ]  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console.print(table)
    faults = Table(title="faults (SIGKILL, then restart)")
    for col in ("fault", "target", "rollouts done", "killed at s", "back at s",
                "fuzz sent while down", "note"):  # fmt: skip
        faults.add_column(col)
    for f in report.faults:
        faults.add_row(f.fault.value, f.target, str(f.at_done), str(f.killed_at_s),
                       str(f.back_at_s), str(f.fuzz_sent), f.note)  # fmt: skip
    console.print(faults)
    for line in report.details[:40]:
        console.print(f"  {line}", markup=False, highlight=False)
