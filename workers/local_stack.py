"""The local stack in this process: a Gateway on loopback (`start_gateway`) and, around
it, the Temporal dev server, an engine and a worker (`LocalStack`).

One place for what `rollout demo`, `demo --train`, the benches and the test fixtures
start: the Gateway is assembled as `rollout gateway` assembles it (settings, core, both
listeners with the read deadlines), served from a background thread of the caller. It
lives beside the demo because a whole stack runs a worker, an entry point of this
package; the stand-ins it starts come from `devstack`.
"""

import asyncio
import contextlib
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from devstack.background_server import BackgroundServer
from devstack.temporal_dev_server import TemporalDevServer
from gateway.calls.pipeline import Gateway
from gateway.http.app import GatewayApp
from gateway.sessions.lifetime import Clock
from workers.gateway_server import GatewaySettings, build_gateway, check_admin_policy, http_protocol
from workers.temporal_options import UnusableTemporal

if TYPE_CHECKING:
    from rich.console import Console

    from rollout_client.temporal_connection import TemporalTLS
    from workers.temporal_options import TemporalOptions


@dataclass
class InProcessGateway:
    """Both listeners of a real Gateway, served from a background thread of this process."""

    #: The agent API listener (what session base URLs name).
    url: str
    #: The control API + /metrics + /health listener.
    control_url: str
    #: None: started with insecure_dev (no admin token on the control listener).
    admin_token: str | None
    gateway: Gateway
    #: The app around `gateway` (its policy updater: `app.policy`).
    app: GatewayApp
    server: BackgroundServer

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def create_session(self, **config: Any) -> dict[str, Any]:
        """A session on the control API (`config`: its create body); its created reply."""
        body = {"rollout_id": f"r-{secrets.token_hex(4)}", **config}
        reply = httpx.post(f"{self.control_url}/sessions", json=body, headers=self.admin_headers)
        if reply.status_code != 201:
            raise RuntimeError(f"session create: {reply.status_code} {reply.text}")
        return reply.json()

    def trajectory(self, session_id: str) -> dict[str, Any]:
        reply = httpx.get(
            f"{self.control_url}/sessions/{session_id}/trajectory", headers=self.admin_headers
        )
        if reply.status_code != 200:
            raise RuntimeError(f"trajectory of {session_id}: {reply.status_code} {reply.text}")
        return reply.json()

    def stop(self) -> None:
        self.server.stop()


def start_gateway(
    engine_url: str,
    tokenizer: Path,
    data_dir: Path,
    model: str,
    *,
    clock: Clock = time.time,
    wrap_agent: Callable[[Any], Any] | None = None,
    **settings: Any,
) -> InProcessGateway:
    """A Gateway in front of `engine_url` on loopback with a fresh admin token (none with
    `insecure_dev`); stop it with `.stop()`. `settings`: other `GatewaySettings` fields
    (`checkpoint_roots`: where policy updates may load from), else `rollout gateway`'s
    defaults; `clock`: its session time (a test moves it to pass a TTL); `wrap_agent`:
    middleware around the agent app (a test's wire log)."""
    admin = None if settings.get("insecure_dev") else secrets.token_urlsafe(24)
    config = GatewaySettings(
        engine_urls=[engine_url],
        model=model,
        tokenizer=tokenizer,
        data_dir=data_dir,
        admin_token=admin,
        **settings,
    )
    check_admin_policy(config)
    core = build_gateway(config, clock)
    app = GatewayApp(
        core,
        admin,
        config.max_body_bytes,
        peers=config.peer_control_urls,
        checkpoint_roots=config.checkpoint_roots,
    )
    agent = app.build("agent")
    # read deadlines on both listeners, as `rollout gateway`'s
    server = BackgroundServer(
        wrap_agent(agent) if wrap_agent else agent, http=http_protocol(config, core.metrics)
    )
    control_url = server.add(app.build("control"))
    server.start()
    if config.public_url is None:
        core.options.public_url = server.url
    return InProcessGateway(server.url, control_url, admin, core, app, server)


ORPHAN_REASON = "left running by a previous demo process; its gateway and sandboxes are gone"


async def end_orphaned_rollouts(temporal_address: str) -> int:
    """Terminate the workflows still running in a demo's persisted Temporal DB.

    Everything the demo starts dies with its process, but the DB (kept for the UI's
    history) holds the workflows it had in flight; the next demo's worker would pick them
    up and spend minutes on rollouts whose sessions lived on a gateway that is gone (a
    killed training demo left 512 here). At start nothing of this demo runs yet, so every
    running workflow is such an orphan."""
    from temporalio.client import Client
    from temporalio.service import RPCError

    client = await Client.connect(temporal_address)
    ended = 0
    async for execution in client.list_workflows('ExecutionStatus="Running"'):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        try:
            await handle.terminate(reason=ORPHAN_REASON)
        except RPCError:  # ended meanwhile (it cannot have been ours)
            continue
        ended += 1
    return ended


@dataclass(frozen=True)
class TemporalEndpoint:
    """The Temporal a stack uses: its own dev server (with a UI) or one it was given."""

    address: str
    namespace: str
    tls: "TemporalTLS"
    ui_url: str | None

    def ui_link(self, query: str) -> str | None:
        if self.ui_url is None:
            return None
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows?query={query}"


async def check_search_attributes(address: str, namespace: str, tls: "TemporalTLS") -> None:
    """Refuse a given Temporal that lacks our search attributes (every workflow would fail
    to start), naming the command that adds them; we never add them to someone's server."""
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
    from temporalio.service import RPCError

    from rollout_client.client import connect
    from schemas.rollout import SEARCH_ATTRIBUTES

    try:
        client = await connect(address, namespace, tls=tls)
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
    except (RuntimeError, RPCError) as exc:  # temporalio: cannot connect; a refused call
        raise UnusableTemporal(f"Temporal {address} namespace {namespace}: {exc}") from exc
    missing = sorted(set(SEARCH_ATTRIBUTES) - set(listed.custom_attributes))
    if missing:
        adds = " ".join(f"--name {n} --type {SEARCH_ATTRIBUTES[n]}" for n in missing)
        raise UnusableTemporal(
            f"Temporal {address} namespace {namespace} lacks the search attributes "
            f"{', '.join(missing)}; add them once with `temporal operator search-attribute "
            f"create --namespace {namespace} {adds}`"
        )


class LocalStack:
    """Temporal (its own dev server, or the one `temporal` names), engine, Gateway and
    worker on loopback, all in this process but the engine and Temporal; `stop()` takes
    down all it started."""

    def __init__(
        self,
        data_dir: Path,
        console: "Console",
        temporal: "TemporalOptions | None" = None,
        metrics_port: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.console = console
        self.temporal_options = temporal
        #: The worker's fleet metrics on 127.0.0.1:metrics_port (None: off).
        self.metrics_port = metrics_port
        self.temporal: TemporalDevServer | None = None
        self.endpoint: TemporalEndpoint | None = None
        self.engine_stop: list[Callable[[], None]] = []
        self.engine_label = ""
        self.gateway: InProcessGateway | None = None
        self.worker: Any = None
        self.worker_task: asyncio.Task[None] | None = None
        self.sandbox_state = Path(tempfile.mkdtemp(prefix="rollout-demo-sandboxes-", dir="/tmp"))
        self.sandbox_state.chmod(0o755)  # the sandbox uid must traverse it

    async def start_temporal(self) -> TemporalEndpoint:
        """The given Temporal, checked, else a dev server of our own in DATA_DIR/temporal
        (its orphaned rollouts of an earlier demo ended). Says which."""
        from rollout_client.temporal_connection import TemporalTLS
        from schemas.rollout import SEARCH_ATTRIBUTES

        given = self.temporal_options
        if given is not None and given.temporal:
            tls = given.tls()
            await check_search_attributes(given.temporal, given.namespace, tls)
            self.endpoint = TemporalEndpoint(given.temporal, given.namespace, tls, None)
            self.console.print(
                f"Temporal: {given.temporal} namespace {given.namespace} ({tls.describe()})",
                soft_wrap=True,
                highlight=False,
            )
            return self.endpoint
        server = TemporalDevServer(
            self.data_dir / "temporal", ui=True, search_attributes=SEARCH_ATTRIBUTES
        )
        self.temporal = await server.start()
        orphans = await end_orphaned_rollouts(self.temporal.address)
        if orphans:
            self.console.print(
                f"terminated {orphans} rollout(s) a previous demo left running in "
                f"{self.data_dir / 'temporal'}: their gateway sessions and sandboxes stopped "
                "with it (a rerun of a training run with the same --out runs them again)",
                highlight=False,
                soft_wrap=True,
            )
        self.endpoint = TemporalEndpoint(
            self.temporal.address, "default", TemporalTLS(), self.temporal.ui_url
        )
        self.console.print(
            f"Temporal dev server: {self.temporal.address}  UI: [bold]{self.temporal.ui_url}[/]",
            soft_wrap=True,
        )
        return self.endpoint

    def start_engine(
        self,
        engine: str,
        model_dir: Path | None = None,
        script_rules: list[tuple[str, str]] | None = None,
    ) -> tuple[str, str, Path]:
        """(engine URL, served model name, tokenizer dir); says clearly which engine.

        `model_dir` (vLLM only): serve that model in float32 instead of the tiny random one;
        `script_rules` (scripted only): (prompt contains, reply) pairs."""
        from devstack.tiny_model import ensure_tiny_model

        if engine == "vllm" and model_dir is not None:
            url, model = self.start_vllm(model_dir, trainable=True)
            self.engine_label = f"vLLM CPU float32, model {model_dir.name}"
            return url, model, model_dir
        model_dir = ensure_tiny_model()
        if engine == "vllm":
            self.console.print("engine: [bold]vLLM CPU[/] serving the tiny random model (~30 s)…")
            url, model = self.start_vllm(model_dir)
            self.engine_label = "vLLM CPU (tiny random model: real sampling, random text)"
            return url, model, model_dir
        from devstack.scripted_engine import Script, ScriptedEngine, ScriptRule

        rules = [ScriptRule(when_contains=k, reply=v, repeat=True) for k, v in script_rules or []]
        scripted = ScriptedEngine(
            model_dir / "tokenizer.json", Script(rules=rules, default_reply="I am not sure.")
        )
        server = BackgroundServer(scripted.app()).start()
        self.engine_stop.append(server.stop)
        self.engine_label = "SCRIPTED engine (requested): fixed replies, real tokenizer"
        self.console.print(f"engine: [bold yellow]{self.engine_label}[/]")
        return server.url, scripted.model, model_dir

    def start_vllm(self, model_dir: Path, trainable: bool = False) -> tuple[str, str]:
        """vLLM CPU serving `model_dir`; (URL, served model name). `trainable`: float32
        (its log-probs then agree with a float32 trainer) and the dev endpoints that load
        new weights in place."""
        from devstack.vllm_server import VllmServer, VllmServerConfig

        log_path = self.data_dir / "vllm.log"
        config = (
            VllmServerConfig.trainable(model_dir, log_path=log_path)
            if trainable
            else VllmServerConfig(
                model_dir=model_dir, extra_args=["--enforce-eager"], log_path=log_path
            )
        )
        server = VllmServer(config)
        server.start()
        self.engine_stop.append(server.stop)
        return server.url, server.model

    def start_gateway(
        self,
        engine_url: str,
        model: str,
        tokenizer: Path,
        checkpoint_roots: list[Path] | None = None,
    ) -> InProcessGateway:
        """Both listeners on loopback; `checkpoint_roots`: where policy updates may load
        from (none: no updates)."""
        self.gateway = start_gateway(
            engine_url,
            tokenizer,
            self.data_dir / "gateway",
            model,
            checkpoint_roots=checkpoint_roots or [],
        )
        return self.gateway

    async def start_worker(self, gateway_url: str, admin_token: str | None) -> None:
        from workers.worker import RolloutWorker, WorkerSettings

        assert self.endpoint is not None
        settings = WorkerSettings(
            role="all",
            temporal=self.endpoint.address,
            namespace=self.endpoint.namespace,
            temporal_tls=self.endpoint.tls,
            task_queue="rollouts",
            host_id="demo",
            gateway_urls=[gateway_url],
            gateway_admin_token=admin_token,
            backend_config={"local": {"state_dir": str(self.sandbox_state)}},
            data_dir=self.data_dir / "worker",
            max_sandboxes=16,
            graceful_shutdown_s=5,
            reaper_interval_s=0,
            metrics_port=self.metrics_port,
        )
        worker = RolloutWorker(settings)
        self.worker = worker
        self.worker_task = asyncio.ensure_future(worker.run())
        ready = asyncio.ensure_future(worker.ready.wait())
        await asyncio.wait([ready, self.worker_task], return_when=asyncio.FIRST_COMPLETED)
        if self.worker_task.done():
            self.worker_task.result()  # raises the start-up error
        if self.metrics_port is not None:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            self.console.print(f"worker metrics: {url}", highlight=False, soft_wrap=True)

    async def stop(self) -> None:
        """Stop everything this stack started, newest first; never raises."""
        if self.worker is not None and self.worker_task is not None:
            self.worker.stop()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.worker_task, 30)
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                self.gateway.stop()
        for stop in reversed(self.engine_stop):
            with contextlib.suppress(Exception):
                stop()
        if self.temporal is not None:
            self.temporal.stop()
        with contextlib.suppress(Exception):
            from sandboxes.backends.local import LocalBackend

            leftovers = await LocalBackend(state_dir=self.sandbox_state).reap(frozenset())
            if leftovers:
                self.console.print(f"reaped {len(leftovers)} leftover sandbox(es)")
        shutil.rmtree(self.sandbox_state, ignore_errors=True)
