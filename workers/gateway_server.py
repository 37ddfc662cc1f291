"""Assemble and serve a Gateway process (or N of them), each on two listeners.

The agent API listens on `port` (what session base URLs and sandbox bridges point at);
the control API, /metrics and /health listen on `control_port` (what workers and
trainers use), served from their own thread and event loop so a loaded agent listener
cannot delay them. One process saturates on tokenization; N processes each own the sessions
created on them (the base URL handed to the agent names the owning process), sharing only
the data dir; process i listens on `port + i` and `control_port + i`. Both loops are
uvloop's, whose transports cost less CPU per call than asyncio's.
"""

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import uvicorn
import uvloop
from starlette.types import ASGIApp

from gateway import lifeline
from gateway.calls.pipeline import Gateway
from gateway.engines.registry import ENGINES
from gateway.engines.routing import EngineRouter
from gateway.http.app import GatewayApp, error_responder_for
from gateway.http.owner_forwarding import OwnerForwarder
from gateway.http.read_deadlines import deadline_protocol
from gateway.observability.metrics import GatewayMetrics
from gateway.options import CoreSettings, GatewayOptions
from gateway.parsers.selection import ParserSelectionError, parser_for_model
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.incremental import IncrementalTokenizer, Tokenizer, load_tokenizer
from gateway.prompt.model_files import ModelFilesError, load_model_files
from gateway.prompt.tokenize_pool import OffloadingTokenizer
from gateway.sessions.lifetime import Clock
from workers.gateway_settings import GatewaySettings
from workers.gc_policy import tune_gc_for_serving

log = logging.getLogger("rollout.gateway")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_model_family(settings: GatewaySettings) -> str:
    """The family whose output format this model writes, settled before any process
    starts: a wrong parser name or an unrecognised template stops here, with the names."""
    try:
        files = load_model_files(settings.tokenizer, settings.chat_template)
        return parser_for_model(
            files.chat_template,
            files.end_of_turn,
            family=settings.family,
            tool_call_parser=settings.tool_call_parser,
            reasoning_parser=settings.reasoning_parser,
        ).name
    except (ModelFilesError, ParserSelectionError) as exc:
        raise SystemExit(f"refusing to start: {exc}") from None


def check_admin_policy(settings: GatewaySettings) -> None:
    """The admin token guards the control listener. Without one (--insecure-dev) every
    control call is allowed, so that listener must be bound to loopback. The agent
    listener may bind anywhere: each agent call needs its session token."""
    if settings.admin_token:
        return
    if not settings.insecure_dev:
        raise SystemExit(
            "refusing to start: set --admin-token or ROLLOUT_ADMIN_TOKEN "
            "(or --insecure-dev with the control listener on loopback)"
        )
    if not is_loopback(settings.control_host):
        raise SystemExit(
            "refusing to start: --insecure-dev serves the control API without an admin "
            f"token, so --control-host must be loopback (got {settings.control_host!r}); "
            "set --admin-token or ROLLOUT_ADMIN_TOKEN to listen elsewhere"
        )


def check_checkpoint_roots(settings: GatewaySettings) -> None:
    """Each --checkpoint-root must be a directory; none is allowed (updates are refused)."""
    for root in settings.checkpoint_roots:
        if not root.is_dir():
            raise SystemExit(f"refusing to start: --checkpoint-root {root} is not a directory")


def check_ports(settings: GatewaySettings, processes: int) -> None:
    """The agent ports (port … port+N-1) and control ports must not overlap."""
    if settings.port == 0 or settings.control_port == 0:
        return  # ephemeral ports never collide
    agent = set(range(settings.port, settings.port + processes))
    control = set(range(settings.control_port, settings.control_port + processes))
    if settings.shared_port is not None and settings.shared_port in agent | control:
        raise SystemExit(
            f"refusing to start: --shared-port {settings.shared_port} is also one of the "
            "processes' own agent or control ports"
        )
    if agent & control or max(agent | control) > 65535:
        raise SystemExit(
            f"refusing to start: {processes} process(es) need agent ports {settings.port}-"
            f"{settings.port + processes - 1} and control ports {settings.control_port}-"
            f"{settings.control_port + processes - 1}, disjoint and at most 65535 "
            "(choose --port and --control-port further apart)"
        )


def engine_context_window(url: str, model: str) -> int | None:
    """Ask the engine for max_model_len so max_tokens can be capped by the real window."""
    try:
        reply = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=10.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    for entry in reply.get("data", []):
        if isinstance(entry, dict) and isinstance(entry.get("max_model_len"), int):
            return int(entry["max_model_len"])
    return None


def build_gateway(settings: GatewaySettings, clock: Clock = time.time) -> Gateway:
    """The Gateway core from settings: model files, template, tokenizer, engine client;
    `clock` is its session time (tests move it forward to pass a TTL)."""
    files = load_model_files(settings.tokenizer, settings.chat_template)
    template = ChatTemplate(
        files.chat_template, bos_token=files.bos_token, eos_token=files.eos_token
    )
    tokenizer: Tokenizer = load_tokenizer(files.tokenizer_path)
    if settings.tokenize_offload_chars:
        tokenizer = OffloadingTokenizer(
            tokenizer,
            files.tokenizer_path,
            settings.tokenize_offload_chars,
            settings.tokenize_workers,
        )
    parser = parser_for_model(
        files.chat_template,
        files.end_of_turn,
        family=settings.family,
        tool_call_parser=settings.tool_call_parser,
        reasoning_parser=settings.reasoning_parser,
    )
    incremental = IncrementalTokenizer(
        template, tokenizer, eot_token=files.end_of_turn, reasoning_tags=parser.reasoning_tags
    )
    window = (
        settings.context_window
        or engine_context_window(settings.engine_urls[0], settings.model)
        or files.context_window
        or 32768
    )
    public = settings.public_url or f"http://{settings.host}:{settings.port}"
    advertised = settings.advertised_url
    if advertised is None and settings.shared_port is not None:
        advertised = settings.public_url or f"http://{settings.host}:{settings.shared_port}"
    core = {name: getattr(settings, name) for name in CoreSettings.model_fields}
    core["advertised_url"] = advertised
    options = GatewayOptions(
        **core,
        model_name=settings.model,
        public_url=public,
        context_window=window,
        vocab_size=files.vocab_size,
    )
    client = ENGINES[settings.engine_api](
        settings.model,
        request_timeout_s=settings.request_timeout_s,
        connect_retries=3,
        routing_shape=settings.routing_shape,
    )
    engine = EngineRouter(settings.engine_urls, client, routing=settings.engine_routing)
    return Gateway(options, template, incremental, parser, engine, clock=clock)


def build_listener_apps(
    settings: GatewaySettings,
) -> tuple[ASGIApp, ASGIApp, OwnerForwarder]:
    """(agent app, control app, shared-port app) around one Gateway core: the shared-port
    app serves this process's sessions with the agent app and relays the others'."""
    _, agent, control, shared = _build_listener_apps(settings)
    return agent, control, shared


def _build_listener_apps(
    settings: GatewaySettings,
) -> tuple[GatewayApp, ASGIApp, ASGIApp, OwnerForwarder]:
    check_admin_policy(settings)
    app = GatewayApp(
        build_gateway(settings),
        settings.admin_token,
        settings.max_body_bytes,
        peers=settings.peer_control_urls,
        checkpoint_roots=settings.checkpoint_roots,
    )
    agent = app.build("agent")
    shared = OwnerForwarder(agent, app.gateway, error_responder_for, settings.max_body_bytes)
    return app, agent, app.build("control"), shared


def http_protocol(settings: GatewaySettings, metrics: GatewayMetrics) -> type[asyncio.Protocol]:
    """uvicorn's `http` for every listener of a process: httptools with read deadlines
    (gateway/http/read_deadlines.py), each cut counted as a limit refusal."""

    def cut(limit: str) -> None:
        metrics.limit_refusals.labels(limit).inc()

    return deadline_protocol(settings.header_timeout_s, settings.body_timeout_s, cut)


def listen(host: str, port: int, shared: bool = False) -> socket.socket:
    """Bind before anything loads, so a taken port fails at once with its address.
    proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections. `shared`: the
    port all gateway processes bind (SO_REUSEPORT; the kernel spreads connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"refusing to start: cannot listen on {host}:{port}: {exc}") from exc
    return sock


TICK_S = 1.0
"""How often a listener wakes by itself: to refresh its Date header (to the second, as
uvicorn's own tick does on every tenth of its 0.1 s ticks). `exit` wakes it at once."""


class _Listener(uvicorn.Server):
    """A uvicorn server that leaves signals to `serve_listeners` (which stops both) and
    ticks once a second instead of ten times: an idle tick costs event-loop CPU, and a
    call waiting on its engine pays for the ticks that land meanwhile."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while not await self.on_tick(0):  # tick 0: every tick refreshes the Date header
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()

    def exit(self) -> None:
        """Stop serving, from any thread: the tick sees it at once."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(wake.set)


class Listeners:
    """One process's listeners, bound at once (a taken port fails before anything loads):
    the agent API (and the shared port) on the running loop, which owns the core; the
    control API on its own thread and loop, unless `control_own_loop` is off."""

    def __init__(self, settings: GatewaySettings) -> None:
        check_admin_policy(settings)
        self.settings = settings
        agent_sock = listen(settings.host, settings.port)
        control_sock = listen(settings.control_host, settings.control_port)
        shared_sock = None
        if settings.shared_port is not None:
            shared_sock = listen(settings.host, settings.shared_port, shared=True)
        self.app, agent_app, control_app, self.shared_app = _build_listener_apps(settings)
        http = http_protocol(settings, self.app.gateway.metrics)

        def server(app: Any, **config: Any) -> _Listener:
            # proxy_headers off: nothing reads a client's address, so uvicorn need not
            # rewrite it from X-Forwarded-* on every request
            options = {"log_level": "warning", "http": http, "proxy_headers": False}
            return _Listener(uvicorn.Config(app, **options, **config))

        self.agent = [(server(agent_app), agent_sock)]
        if shared_sock is not None:
            self.agent.append((server(self.shared_app, lifespan="off"), shared_sock))
        self.control = (server(control_app), control_sock)

    def port(self, listener: Literal["agent", "control"]) -> int:
        sock = self.agent[0][1] if listener == "agent" else self.control[1]
        return int(sock.getsockname()[1])

    def stop(self) -> None:
        for server, _ in [*self.agent, self.control]:
            server.exit()

    async def serve(self) -> None:
        """Until `stop()`. The control listener starts once the agent app has started (its
        lifespan names the core's loop), so no control call runs before the core is up."""
        served = [asyncio.ensure_future(s.serve(sockets=[sock])) for s, sock in self.agent]
        control, control_sock = self.control
        thread: threading.Thread | None = None
        try:
            while not self.agent[0][0].started and not served[0].done():
                await asyncio.sleep(0.01)
            if not self.settings.control_own_loop:
                served.append(asyncio.ensure_future(control.serve(sockets=[control_sock])))
            elif not served[0].done():
                thread = threading.Thread(
                    target=uvloop.run,
                    args=(control.serve(sockets=[control_sock]),),
                    name="gateway-control",
                    daemon=True,
                )
                thread.start()
            await asyncio.gather(*served)
        finally:
            self.stop()
            if thread is not None:  # bounded: a control call may wait on the stopped core
                await asyncio.to_thread(thread.join, 30)
            await self.shared_app.aclose()


async def serve_listeners(settings: GatewaySettings) -> None:
    """This process: the agent and the control listener around one Gateway core.
    SIGTERM/SIGINT stop both gracefully."""
    listeners = Listeners(settings)
    tune_gc_for_serving()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, listeners.stop)
    await listeners.serve()


def _reachable(host: str) -> str:
    """A host the sibling processes can connect to (a wildcard bind means loopback too)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def serve(settings: GatewaySettings) -> None:
    """Serve in this process, or supervise `processes` children on consecutive port pairs."""
    processes = settings.processes
    check_admin_policy(settings)
    check_ports(settings, processes)
    check_checkpoint_roots(settings)
    family = check_model_family(settings)
    shared = ""
    if settings.shared_port is not None:
        shared = f"shared agent address http://{settings.host}:{settings.shared_port}, "
    if processes <= 1:
        print(
            f"gateway: {shared}agent API http://{settings.host}:{settings.port}, control API "
            f"http://{settings.control_host}:{settings.control_port}, model family {family}",
            flush=True,
        )
        uvloop.run(serve_listeners(settings))
        return
    children: list[subprocess.Popen[bytes]] = []
    controls = [
        f"http://{_reachable(settings.control_host)}:{settings.control_port + i}"
        for i in range(processes)
    ]
    advertised = None
    if settings.shared_port is not None:
        advertised = settings.public_url or f"http://{settings.host}:{settings.shared_port}"
    for index in range(processes):
        port, control_port = settings.port + index, settings.control_port + index
        child_settings = settings.model_copy(
            update={
                "port": port,
                "control_port": control_port,
                "processes": 1,
                "public_url": None,
                "advertised_url": advertised,
                "admin_token": settings.admin_token,
                "peer_control_urls": [u for i, u in enumerate(controls) if i != index],
            }
        )
        env = dict(os.environ, ROLLOUT_GATEWAY_SETTINGS=child_settings.model_dump_json())
        env[lifeline.PARENT_ENV] = lifeline.parent_token()  # a child dies with this process
        children.append(subprocess.Popen([sys.executable, "-m", "workers.gateway_server"], env=env))
        print(
            f"gateway process {index}: {shared}agent API http://{settings.host}:{port}, "
            f"control API http://{settings.control_host}:{control_port}",
            flush=True,
        )

    def stop(*_: object) -> None:
        for child in children:
            child.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    codes = [child.wait() for child in children]
    raise SystemExit(max(codes))


if __name__ == "__main__":  # one child of `serve` with `processes` > 1
    lifeline.from_environment()
    asyncio.run(
        serve_listeners(GatewaySettings.model_validate_json(os.environ["ROLLOUT_GATEWAY_SETTINGS"]))
    )
