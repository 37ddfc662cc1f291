"""`rollout worker`: Temporal workers by role, with limits, metrics and clean shutdown.

Roles (see `schemas.rollout.QueueNames` for the queues):
- orchestrator: runs `RolloutWorkflow` (deterministic, cheap; scale by processes);
- sandbox-host: provisions sandboxes from the shared sandbox queue and runs everything
  that touches them (run_harness, destroy) on this host's own queue; a reaper reaps
  sandboxes whose rollout is gone;
- gateway-host: next to the gateway processes, creates sessions and collects/closes
  them on its own queue, so trajectories are read locally and samples written from here;
  a reaper closes sessions whose workflow run has ended;
- all: everything in one process (the embedded default, tests, the demo).

Why explicit slot limits: the SDK default (100 per kind) is both too small for
orchestration and unrelated to how many sandboxes a host can hold.
"""

import asyncio
import contextlib
import logging
import os
import signal
import socket
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from prometheus_client import start_http_server
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import FixedSizeSlotSupplier, Worker, WorkerTuner

from rollout_client.temporal_connection import TemporalConnectError, TemporalTLS
from sandboxes.registry import BUILTIN_BACKENDS, backend_class
from workers.fleet_interceptor import FleetInterceptor
from workers.fleet_metrics import FleetMetrics
from workers.fleet_sampler import run_sampler
from workers.gc_policy import tune_gc_for_serving
from workers.model_options import model_options
from workers.temporal_options import TemporalOptions

log = logging.getLogger("rollout.worker")

Role = Literal["orchestrator", "sandbox-host", "gateway-host", "all"]
ROLES: tuple[str, ...] = ("orchestrator", "sandbox-host", "gateway-host", "all")


def default_host_id() -> str:
    return socket.gethostname().split(".")[0] or "host"


class WorkerSettings(BaseModel):
    """Everything `rollout worker` accepts, validated before connecting."""

    model_config = ConfigDict(extra="forbid")

    role: Role = "all"
    temporal: str = "127.0.0.1:7233"
    #: TLS and API key for a real cluster; the default is plain TCP (the dev server).
    temporal_tls: TemporalTLS = Field(default_factory=TemporalTLS)
    namespace: str = "default"
    task_queue: str = "rollouts"
    #: Stable per host: a restarted worker drains its host queue (destroys included).
    host_id: str = Field(default_factory=default_host_id, pattern=r"^[A-Za-z0-9._-]+$")
    gateway_urls: list[str] = Field(default_factory=list)
    gateway_admin_token: str | None = None
    sandbox_backends: list[str] = Field(default_factory=lambda: ["local"])
    #: Backend settings, e.g. {"local": {"state_dir": "/var/lib/x"}}.
    backend_config: dict[str, dict[str, Any]] = Field(default_factory=dict)
    data_dir: Path = Path("./data/worker")
    max_sandboxes: int = Field(default=64, ge=1, description="live sandboxes on this host")
    max_provisions: int = Field(default=16, ge=1)
    max_session_activities: int = Field(default=256, ge=1)
    max_workflow_tasks: int = Field(default=200, ge=1)
    max_cached_workflows: int = Field(default=5000, ge=1)
    graceful_shutdown_s: float = Field(default=30.0, ge=0)
    reaper_interval_s: float = Field(default=300.0, ge=0, description="0: only at start")
    count_calls_every_s: float = Field(default=30.0, ge=0)
    #: The fleet metrics (`workers.fleet_metrics`) on metrics_host:metrics_port; None: off.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    #: How often the backlog and the live/warm sandboxes are sampled.
    metrics_interval_s: float = Field(default=15.0, gt=0)
    #: The Temporal SDK's own Prometheus metrics (slots, pollers, latencies); None: off.
    sdk_metrics_port: int | None = Field(default=None, ge=0, le=65535)
    register_search_attributes: bool = True
    #: Keys (base64, one a line, the first encrypts) for the Temporal payload codec;
    #: None: `ROLLOUT_PAYLOAD_KEY`, else no encryption (see `rollout_client.codec`).
    payload_key_file: Path | None = None

    def has(self, role: str) -> bool:
        return self.role == "all" or self.role == role


def make_runtime(metrics_port: int | None, host: str = "127.0.0.1") -> Runtime | None:
    """Prometheus metrics of the SDK (slots, pollers, schedule-to-start latency…)."""
    if metrics_port is None:
        return None
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=f"{host}:{metrics_port}"),
            global_tags={"service": "rollout-worker"},
        )
    )


class RolloutWorker:
    """The workers of one process for one role; `run()` until `stop()`."""

    def __init__(self, settings: WorkerSettings, client: Client | None = None) -> None:
        self.settings = settings
        self.client = client
        self.workers: list[Worker] = []
        self._stop = asyncio.Event()
        self._closers: list[Any] = []
        self._backends: Any = None
        self._capacity: Any = None
        self._gateway_access: Any = None
        self.metrics = FleetMetrics() if settings.metrics_port is not None else None
        self._interceptors = [FleetInterceptor(self.metrics)] if self.metrics else []
        self.ready = asyncio.Event()

    async def connect(self) -> Client:
        from rollout_client.client import connect, ensure_search_attributes
        from rollout_client.codec import load_keys

        s = self.settings
        if self.client is None:
            runtime = make_runtime(s.sdk_metrics_port, s.metrics_host)
            kwargs = {"runtime": runtime} if runtime else {}
            keys = load_keys(s.payload_key_file)
            if not keys:
                log.warning(
                    "no payload key: session tokens are stored in plain text in Temporal "
                    "history (set --payload-key-file or ROLLOUT_PAYLOAD_KEY)"
                )
            self.client = await connect(s.temporal, s.namespace, keys, s.temporal_tls, **kwargs)
        if s.register_search_attributes:
            added = await ensure_search_attributes(self.client)
            if added:
                log.info("registered search attributes: %s", ", ".join(added))
        return self.client

    def build(self, client: Client) -> list[Worker]:
        from schemas.rollout import QueueNames

        s = self.settings
        q = QueueNames(base=s.task_queue)
        workers: list[Worker] = []
        shutdown = timedelta(seconds=s.graceful_shutdown_s)
        if s.has("orchestrator"):
            from workflows.rollout import RolloutWorkflow

            workers.append(
                Worker(
                    client,
                    task_queue=q.base,
                    workflows=[RolloutWorkflow],
                    max_concurrent_workflow_tasks=s.max_workflow_tasks,
                    max_cached_workflows=s.max_cached_workflows,
                    graceful_shutdown_timeout=shutdown,
                    interceptors=self._interceptors,
                )
            )
        if s.has("sandbox-host"):
            from activities.harness import HarnessActivities
            from activities.sandbox import HostCapacity, SandboxActivities, SandboxBackends

            config = {b: dict(s.backend_config.get(b, {})) for b in s.sandbox_backends}
            self._backends = backends = SandboxBackends(config)
            self._closers.append(backends.aclose)
            host_queue = q.host(s.host_id)
            self._capacity = capacity = HostCapacity(s.max_sandboxes, s.max_provisions)
            on_image = self.metrics.image_ready if self.metrics else None
            sandboxes = SandboxActivities(backends, s.host_id, host_queue, capacity, on_image)
            harness = HarnessActivities(
                backends,
                s.data_dir / "artifacts",
                gateway_admin_token=s.gateway_admin_token,
                count_calls_every_s=s.count_calls_every_s,
            )
            self._closers.append(harness.aclose)
            fixed = FixedSizeSlotSupplier
            workers.append(
                Worker(
                    client,
                    task_queue=q.sandbox,
                    activities=[sandboxes.provision_sandbox],
                    # a provision is taken only while this host has room for a sandbox
                    tuner=WorkerTuner.create_composite(
                        workflow_supplier=fixed(1),
                        activity_supplier=capacity,
                        local_activity_supplier=fixed(1),
                        nexus_supplier=fixed(1),
                    ),
                    graceful_shutdown_timeout=shutdown,
                    interceptors=self._interceptors,
                )
            )
            workers.append(
                Worker(
                    client,
                    task_queue=host_queue,
                    activities=[harness.run_harness, sandboxes.destroy_sandbox],
                    # every live sandbox's run plus its destroy: neither ever starves
                    max_concurrent_activities=s.max_sandboxes * 2,
                    graceful_shutdown_timeout=shutdown,
                    interceptors=self._interceptors,
                )
            )
        if s.has("gateway-host"):
            from activities.collect import CollectActivities
            from activities.session import GatewayAccess, SessionActivities

            gateway_id = s.host_id
            access = GatewayAccess(
                s.gateway_urls, s.gateway_admin_token, q.gateway_owner(gateway_id)
            )
            self._closers.append(access.aclose)
            self._gateway_access = access
            sessions = SessionActivities(access)
            collect = CollectActivities(access)
            workers.append(
                Worker(
                    client,
                    task_queue=q.gateway,
                    activities=[sessions.create_session],
                    max_concurrent_activities=s.max_session_activities,
                    graceful_shutdown_timeout=shutdown,
                    interceptors=self._interceptors,
                )
            )
            workers.append(
                Worker(
                    client,
                    task_queue=q.gateway_owner(gateway_id),
                    activities=[collect.collect_trajectory, sessions.close_session],
                    max_concurrent_activities=s.max_session_activities,
                    graceful_shutdown_timeout=shutdown,
                    interceptors=self._interceptors,
                )
            )
        return workers

    async def _reaper(self, client: Client) -> None:
        from activities.sandbox import reap_orphans
        from activities.session_reaper import close_orphan_sessions

        if self._backends is None and self._gateway_access is None:
            return
        for name in self.settings.sandbox_backends if self._backends is not None else ():
            with contextlib.suppress(Exception):
                self._backends.get(name)  # instantiate so the reaper sees it
        while True:
            # the reaper must never take the worker down
            if self._backends is not None:
                try:
                    await reap_orphans(client, self._backends, self._capacity)
                except Exception as exc:
                    log.warning("reaper pass failed: %r", exc)
            if self._gateway_access is not None:
                try:
                    await close_orphan_sessions(client, self._gateway_access)
                except Exception as exc:
                    log.warning("session reaper pass failed: %r", exc)
            if self.settings.reaper_interval_s <= 0:
                return
            await asyncio.sleep(self.settings.reaper_interval_s)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        client = await self.connect()
        self.workers = self.build(client)
        if not self.workers:
            raise RuntimeError(f"role {self.settings.role!r} runs no worker")
        sampler, http = self._serve_metrics(client)
        runs = [asyncio.ensure_future(w.run()) for w in self.workers]
        reaper = asyncio.ensure_future(self._reaper(client))
        self.ready.set()
        log.info(
            "worker up: role=%s queue=%s host=%s (%d workers), Temporal %s over %s",
            self.settings.role,
            self.settings.task_queue,
            self.settings.host_id,
            len(self.workers),
            self.settings.temporal,
            self.settings.temporal_tls.describe(),
        )
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            done, _ = await asyncio.wait([stopper, *runs], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not stopper and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            reaper.cancel()
            stopper.cancel()
            if sampler is not None:
                sampler.cancel()
            # Graceful: stop polling, let running activities finish (up to the timeout),
            # then cancel them; the workflow retries what was handed back.
            await asyncio.gather(*(w.shutdown() for w in self.workers), return_exceptions=True)
            await asyncio.gather(*runs, reaper, return_exceptions=True)
            for close in self._closers:
                with contextlib.suppress(Exception):
                    await close()
            if http is not None:
                http.shutdown()
                http.server_close()

    def _serve_metrics(self, client: Client) -> tuple[asyncio.Task[None] | None, Any]:
        """The fleet metrics' HTTP server and sampler (none when metrics are off)."""
        s = self.settings
        if self.metrics is None or s.metrics_port is None:
            return None, None
        http, _ = start_http_server(s.metrics_port, s.metrics_host, self.metrics.registry)
        log.info("fleet metrics on http://%s:%d/metrics", s.metrics_host, http.server_port)
        sampler = asyncio.ensure_future(
            run_sampler(
                # the shared queues' backlog: from the orchestrators only (few, and one
                # answer is the fleet's), not from every host
                (client, s.namespace, s.task_queue) if s.has("orchestrator") else None,
                self._backends,
                self.metrics,
                s.metrics_interval_s,
            )
        )
        return sampler, http


async def serve(settings: WorkerSettings) -> None:
    """Run until SIGINT/SIGTERM, then shut down gracefully."""
    worker = RolloutWorker(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, worker.stop)
    tune_gc_for_serving()  # it holds every running rollout's workflow state
    await worker.run()


def parse_egress_hosts(pairs: list[str] | None) -> dict[str, str]:
    """`--egress-host NAME=ADDRESS` pairs → the backends' `egress_hosts` option."""
    pins: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, address = pair.partition("=")
        if not sep or not name.strip() or not address.strip():
            raise typer.BadParameter(f"{pair!r} is not NAME=ADDRESS", param_hint="--egress-host")
        pins[name.strip()] = address.strip()
    return pins


def backend_options(
    offered: list[str],
    sandbox_state_dir: Path | None,
    allow_public_network: bool,
    egress_hosts: dict[str, str] | None = None,
    warm_pool_size: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per-backend settings from the worker's flags."""
    config: dict[str, dict[str, Any]] = {}
    if sandbox_state_dir is not None:
        config["local"] = {"state_dir": str(sandbox_state_dir)}
    if warm_pool_size:
        for b in offered:
            if hasattr(backend_class(b), "warm"):  # the host-local ones keep a pool
                config.setdefault(b, {})["pool_size"] = warm_pool_size
    if allow_public_network:
        for b in offered:
            if b in BUILTIN_BACKENDS:  # a registered backend may not take the option
                config.setdefault(b, {})["allow_public_network"] = True
    if egress_hosts:
        for b in offered:
            if backend_class(b).egress_relays:
                config.setdefault(b, {})["egress_hosts"] = dict(egress_hosts)
    return config


@model_options("temporal")
def worker_cmd(
    role: Annotated[str, typer.Option(help="orchestrator | sandbox-host | gateway-host | all")] = (
        "all"
    ),
    task_queue: Annotated[str, typer.Option(help="base task queue name")] = "rollouts",
    host_id: Annotated[
        str | None, typer.Option(help="stable host name for the host queue (default: hostname)")
    ] = None,
    gateway: Annotated[
        str | None,
        typer.Option(help="gateway control API URL(s) (its --control-port), comma-separated"),
    ] = None,
    admin_token: Annotated[
        str | None, typer.Option(envvar="ROLLOUT_ADMIN_TOKEN", help="gateway admin token")
    ] = None,
    backends: Annotated[str, typer.Option(help="sandbox backends offered here")] = "local",
    sandbox_state_dir: Annotated[
        Path | None, typer.Option(help="local backend state dir (reaper scope)")
    ] = None,
    allow_public_network: Annotated[
        bool,
        typer.Option(
            envvar="ROLLOUT_ALLOW_PUBLIC_NETWORK",
            help="give tasks that ask for network mode 'public' the internet (docker: a "
            "network of the sandbox's own, not reaching other sandboxes or this host; needs "
            "root and iptables; e2b: internet on; local: always refused)",
        ),
    ] = False,
    egress_host: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=ADDRESS: an allowlisted name the docker/local relays connect to at "
            "ADDRESS (e.g. a mirror on a private network; repeatable)"
        ),
    ] = None,
    data_dir: Annotated[Path, typer.Option(help="artifacts and worker state")] = Path(
        "./data/worker"
    ),
    max_sandboxes: Annotated[int, typer.Option(help="concurrent agent runs on this host")] = 64,
    max_provisions: int = 16,
    max_session_activities: int = 256,
    max_workflow_tasks: int = 200,
    graceful_shutdown_s: float = 30.0,
    count_calls_every_s: Annotated[
        float, typer.Option(help="poll the session's call count for heartbeats (0: off)")
    ] = 30.0,
    reaper_interval_s: Annotated[float, typer.Option(help="0: reap only at start")] = 300.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="serve the fleet metrics (Prometheus /metrics) on this port"),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(help="address the metrics ports bind to")
    ] = "127.0.0.1",
    metrics_interval_s: Annotated[
        float, typer.Option(help="how often the queue backlog and sandboxes are sampled")
    ] = 15.0,
    sdk_metrics_port: Annotated[
        int | None, typer.Option(help="serve the Temporal SDK's own Prometheus metrics here")
    ] = None,
    warm_pool_size: Annotated[
        int, typer.Option(min=0, help="blank sandboxes kept warm per shape (local, docker)")
    ] = 0,
    payload_key_file: Annotated[
        Path | None,
        typer.Option(
            envvar="ROLLOUT_PAYLOAD_KEY_FILE",
            help="keys encrypting Temporal payloads (`rollout keygen`); default: "
            "$ROLLOUT_PAYLOAD_KEY, else none",
        ),
    ] = None,
    log_level: str = "INFO",
    *,
    temporal: TemporalOptions,
) -> None:
    """Run Temporal workers for one role until SIGINT/SIGTERM."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    if role not in ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(ROLES)}")
    offered = [b.strip() for b in backends.split(",") if b.strip()]
    backend_config = backend_options(
        offered,
        sandbox_state_dir,
        allow_public_network,
        parse_egress_hosts(egress_host),
        warm_pool_size,
    )
    settings = WorkerSettings(
        role=role,  # type: ignore[arg-type]
        temporal=temporal.temporal,
        temporal_tls=temporal.tls(),
        namespace=temporal.namespace,
        task_queue=task_queue,
        host_id=host_id or default_host_id(),
        gateway_urls=[u.strip() for u in (gateway or "").split(",") if u.strip()],
        gateway_admin_token=admin_token or os.environ.get("ROLLOUT_ADMIN_TOKEN"),
        sandbox_backends=offered,
        backend_config=backend_config,
        data_dir=data_dir,
        max_sandboxes=max_sandboxes,
        max_provisions=max_provisions,
        max_session_activities=max_session_activities,
        max_workflow_tasks=max_workflow_tasks,
        graceful_shutdown_s=graceful_shutdown_s,
        count_calls_every_s=count_calls_every_s,
        reaper_interval_s=reaper_interval_s,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        metrics_interval_s=metrics_interval_s,
        sdk_metrics_port=sdk_metrics_port,
        payload_key_file=payload_key_file,
    )
    if settings.has("gateway-host") and not settings.gateway_urls:
        raise typer.BadParameter(
            "--gateway (the gateway's control API URL) is required for the gateway-host / all roles"
        )
    try:
        asyncio.run(serve(settings))
    except TemporalConnectError as exc:  # the reason, not a traceback
        log.error("%s", exc)
        raise typer.Exit(code=2) from exc


if __name__ == "__main__":
    typer.run(worker_cmd)
