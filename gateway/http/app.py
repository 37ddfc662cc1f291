"""The Gateway's HTTP surface, as two listeners: the agent API (session token) that
sandboxes reach, and the control API (admin token) with /metrics and /health that only
workers and trainers reach. A sandbox's bridge points at the agent listener, so no agent
can call the control API or read metrics, whatever the admin-token policy.

The control listener runs on its own thread and event loop (`workers.gateway_server`), so
a saturated agent loop cannot delay `/health`, `/metrics` or `GET /policy`; what it does to
the core's asyncio state (sessions, the policy gate) it hands to the agent loop (`_in_core`).

Every error leaves in the caller's protocol shape with a meaningful status; nothing an
agent can send yields a bare 500, and a failed request never touches recorded calls.
"""

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.calls.pipeline import Gateway
from gateway.calls.prompt_limits import check_history_items, history_items
from gateway.canonical import CanonicalRequest
from gateway.capture.retries import request_digest
from gateway.errors import GatewayError, body_timed_out, body_too_large
from gateway.http.body_parse import BodyParser, PromptCaps
from gateway.http.streaming import stream_reply
from gateway.observability.load_metrics import EngineCollector, LoopLagMonitor
from gateway.observability.spans import lap, measured
from gateway.policy.external_sync import ExternalSync
from gateway.policy.update import PolicyUpdater
from gateway.prompt.tokenize_pool import OffloadingTokenizer
from gateway.protocols import registry
from gateway.protocols.base import CountRoute, ErrorResponder, SamplingRoute
from gateway.protocols.wire import field_error, load_object
from gateway.sessions.limits import body_budget, limits_of
from gateway.sessions.live import LiveSession
from gateway.sessions.reaper import SessionReaper
from schemas.policy import PeerPause, PeerResume, PolicyHold, PolicyRelease, PolicyUpdate
from schemas.session import SessionConfig, SessionList

log = logging.getLogger("rollout.gateway")

Handler = Callable[[Request], Awaitable[Response]]
#: Which listener an app serves: the agent API, or the control API + /metrics + /health.
Listener = Literal["agent", "control"]
T = TypeVar("T")


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _require_json_content_type(request: Request) -> None:
    """Bodies are JSON: `application/json` (or a `+json` type), else 415. A form post or
    text/plain is refused rather than guessed at."""
    given = request.headers.get("content-type", "")
    media_type = given.split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        shown = repr(given) if given else "none"
        raise GatewayError(
            "unsupported_media_type",
            f"Content-Type must be application/json (got {shown})",
        )


def _body_pending(request: Request) -> bool:
    """Whether the request has body bytes the app has not read. A reply before them
    closes the connection: uvicorn would otherwise read the rest of the body, however
    large, only to discard it."""
    if getattr(request.state, "body_read", False):
        return False
    length = request.headers.get("content-length")
    return "transfer-encoding" in request.headers or length not in (None, "0")


def error_responder_for(path: str) -> ErrorResponder:
    """The error shape of the protocol a path speaks (`protocols.registry`); OpenAI's for
    the control API and any path no protocol owns."""
    return registry.error_response_for(path)


class GatewayApp:
    """Builds the Starlette app around one `Gateway` core."""

    def __init__(
        self,
        gateway: Gateway,
        admin_token: str | None,
        max_body_bytes: int = 32 * 2**20,
        peers: list[str] | None = None,
        checkpoint_roots: list[Path] | None = None,
    ) -> None:
        self.gateway = gateway
        self.admin_token = admin_token
        self.max_body_bytes = max_body_bytes
        #: `peers`: the other gateway processes' control URLs (paused by an update here);
        #: `checkpoint_roots`: where checkpoints may be loaded from (none: no updates)
        self.policy = PolicyUpdater(
            gateway.policy,
            gateway.engine.urls,
            gateway.options.data_dir,
            peers,
            admin_token,
            loader=gateway.engine.weight_loader,
            checkpoint_roots=checkpoint_roots,
            owner=gateway.options.public_url,
        )
        #: holds around a weight sync the trainer does itself (`external_sync`)
        self.external = ExternalSync(self.policy)
        registry = gateway.metrics.registry
        registry.register(EngineCollector(gateway.engine, gateway.incremental.tokenizer))
        self.loop_lag = LoopLagMonitor(registry)
        #: the worker process that parses large agent bodies (`body_parse`)
        self.body_parser = BodyParser()
        #: The agent listener's loop, which owns the core's asyncio state (set when the
        #: agent app starts); control handlers that touch that state run there.
        self.core_loop: asyncio.AbstractEventLoop | None = None

    async def _in_core(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work()` on the core's loop: directly when the control listener shares it."""
        core = self.core_loop
        if core is None or core is asyncio.get_running_loop():
            return await work()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work(), core))

    async def _core_call(self, fn: Callable[..., T], *args: Any) -> T:
        async def call() -> T:
            return fn(*args)

        return await self._in_core(call)

    # ------------------------------------------------------------------ plumbing
    async def _read_body(
        self, request: Request, limit: int, take: Callable[[int], None] | None = None
    ) -> bytes:
        """The whole body of a JSON request, refused before anything is read when its
        Content-Length passes `limit` and cut as soon as a chunked one does (413); `take`
        reserves its size in the session's body budget as it becomes known."""
        _require_json_content_type(request)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > limit:
                raise body_too_large(f"body is {declared} bytes", limit)
            if take is not None:
                take(int(declared))
        chunks: list[bytes] = []
        size = 0
        timeout = self.gateway.options.body_timeout_s
        try:
            async with asyncio.timeout(timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise body_too_large(f"body exceeds {limit} bytes", limit)
                    if take is not None:
                        take(size)
                    chunks.append(chunk)
        except TimeoutError:
            raise body_timed_out(timeout, size) from None
        request.state.body_read = True
        lap("body_read")
        return b"".join(chunks)

    async def _read_json(self, request: Request) -> dict[str, Any]:
        """A control API body (admin token checked first)."""
        return load_object(await self._read_body(request, self.max_body_bytes))

    def _guard(self, handler: Handler, respond: ErrorResponder) -> Handler:
        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except GatewayError as err:
                err_out = err
            except ValidationError as exc:
                err_out = field_error(exc)
            except Exception:  # the last line of defence: never a bare 500 page
                log.exception("unhandled error on %s %s", request.method, request.url.path)
                err_out = GatewayError("internal", "internal gateway error (see gateway log)")
            if _body_pending(request):
                err_out.close = True
            metrics = self.gateway.metrics
            metrics.errors.labels(str(err_out.status), err_out.kind).inc()
            if err_out.limit is not None:
                metrics.limit_refusals.labels(err_out.limit).inc()
            return respond(err_out)

        return guarded

    def _require_admin(self, request: Request) -> None:
        if self.admin_token is None:
            return  # --insecure-dev: the control listener is bound to loopback
        given = _bearer(request) or ""
        if not hmac.compare_digest(given.encode(), self.admin_token.encode()):
            raise GatewayError("authentication", "admin token required for the control API")

    # ------------------------------------------------------------------ control API
    async def create_session(self, request: Request) -> Response:
        self._require_admin(request)
        config = SessionConfig.model_validate(await self._read_json(request))
        reply, created = await self._core_call(self.gateway.create_session, config)
        return JSONResponse(reply.model_dump(), status_code=201 if created else 200)

    async def list_sessions(self, request: Request) -> Response:
        self._require_admin(request)
        listing = await asyncio.to_thread(self.gateway.list_sessions)  # reads many files
        return Response(
            SessionList(sessions=listing).model_dump_json(), media_type="application/json"
        )

    async def get_session(self, request: Request) -> Response:
        self._require_admin(request)
        # reads counters or files only; a session not live here is rebuilt from its records
        summary = await asyncio.to_thread(self.gateway.summary, request.path_params["session_id"])
        return Response(summary.model_dump_json(), media_type="application/json")

    async def get_trajectory(self, request: Request) -> Response:
        self._require_admin(request)
        session_id = request.path_params["session_id"]
        # reads and serialises every record: in a thread (it touches files only)
        text = await asyncio.to_thread(
            lambda: self.gateway.trajectory(session_id).model_dump_json()
        )
        return Response(text, media_type="application/json")

    async def delete_session(self, request: Request) -> Response:
        self._require_admin(request)
        session_id = request.path_params["session_id"]
        await self._core_call(self.gateway.close_session, session_id)
        return JSONResponse({"session_id": session_id, "closed": True})

    async def get_policy(self, request: Request) -> Response:
        self._require_admin(request)
        state = await asyncio.to_thread(self.policy.state)  # reads the history file
        return Response(state.model_dump_json(), media_type="application/json")

    async def update_policy(self, request: Request) -> Response:
        """Pause, drain, load into every engine, set the version, resume (`gateway.policy`)."""
        self._require_admin(request)
        update = PolicyUpdate.model_validate(await self._read_json(request))
        # Bad input is answered from here: a loaded agent loop never delays a refusal.
        await asyncio.to_thread(self.policy.check, update)
        done = await self._in_core(lambda: self.policy.update(update))
        return Response(done.model_dump_json(), media_type="application/json")

    async def hold_policy(self, request: Request) -> Response:
        """Pause and drain every process for the trainer's own weight sync (`external_sync`)."""
        self._require_admin(request)
        hold = PolicyHold.model_validate(await self._read_json(request))
        held = await self._in_core(lambda: self.external.hold(hold))
        return Response(held.model_dump_json(), media_type="application/json")

    async def release_policy(self, request: Request) -> Response:
        """End a hold with the version the engines serve now; resume every process."""
        self._require_admin(request)
        release = PolicyRelease.model_validate(await self._read_json(request))
        done = await self._in_core(lambda: self.external.release(release))
        return Response(done.model_dump_json(), media_type="application/json")

    async def pause_policy(self, request: Request) -> Response:
        self._require_admin(request)
        pause = PeerPause.model_validate(await self._read_json(request))
        paused = await self._in_core(lambda: self.policy.pause_for_peer(pause))
        return Response(paused.model_dump_json(), media_type="application/json")

    async def resume_policy(self, request: Request) -> Response:
        self._require_admin(request)
        resume = PeerResume.model_validate(await self._read_json(request))
        await self._core_call(self.policy.resume_for_peer, resume)
        return JSONResponse({"resumed": True, "policy_version": self.gateway.policy.version})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "sessions": len(self.gateway.sessions)})

    async def metrics(self, request: Request) -> Response:
        return Response(
            generate_latest(self.gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    # ------------------------------------------------------------------ agent API
    async def _agent_request(
        self, request: Request, route: SamplingRoute
    ) -> tuple[LiveSession, CanonicalRequest, dict[str, Any], str]:
        """Authenticate, read and translate an agent call with its protocol's parser."""
        session = self.gateway.authenticate(_bearer(request))
        lap("auth")
        headers, path = dict(request.headers), route.path
        canonical, body, digest = await self._agent_body(
            request,
            session,
            lambda body: route.parse(body, headers, path, session.history, session.seal),
            session.parse_lock,
        )
        lap("body_parse")
        return session, canonical, body, digest

    async def _agent_body(
        self,
        request: Request,
        session: LiveSession,
        parse: Callable[[dict[str, Any]], CanonicalRequest],
        lock: contextlib.AbstractAsyncContextManager[Any],
    ) -> tuple[CanonicalRequest, dict[str, Any], str]:
        """An agent call's body (the session authenticated from the headers first), read
        and parsed within the session's body budget (`limits.body_budget`): its cap, the
        session's own `max_body_bytes` under the process's, is known before any byte is
        read. A body of `parse_offload_bytes` or more is parsed in the worker process
        (`body_parse`), any other here with `parse` (its protocol's, which may use the
        session's history cache under `lock`). Returns the canonical request, the body and
        the digest of its bytes (`retries.request_digest`). A refusal is counted on the
        session."""
        opts = self.gateway.options
        cap = limits_of(session.meta.config, opts).max_body_bytes
        limit = min(cap, self.max_body_bytes)
        try:
            per_s, clock = opts.session_body_bytes_per_s, self.gateway.clock
            with body_budget(session, limit, per_s, clock) as take:
                data = await self._read_body(request, limit, take)
                path = request.url.path
                if opts.parse_offload_bytes and len(data) >= opts.parse_offload_bytes:
                    caps = PromptCaps(opts.max_prompt_messages, opts.max_prompt_chars)
                    canonical, body = await self.body_parser.parse(
                        data, path, request.headers, session.seal, caps
                    )
                else:
                    history = session.history
                    body = history.bodies.load(data) if history is not None else load_object(data)
                    canonical = await self._parse(body, lambda: parse(body), lock)
                return canonical, body, request_digest(path, data)
        except GatewayError as err:
            session.refused(err.limit)
            raise

    async def _parse(
        self,
        body: dict[str, Any],
        parse: Callable[[], CanonicalRequest],
        lock: contextlib.AbstractAsyncContextManager[Any],
    ) -> CanonicalRequest:
        """`parse()`, the protocol's parse of `body`: over the message cap, a 413 before it;
        a long history is parsed in a thread (its conversion is Python and pydantic, ~0.3 s
        per 10,000 messages; a thread cuts the loop's longest stall 2-10x)."""
        opts = self.gateway.options
        items = history_items(body)
        check_history_items(items, opts.max_prompt_messages)
        in_thread = bool(opts.plan_thread_messages) and items >= opts.plan_thread_messages
        async with lock:
            return await asyncio.to_thread(parse) if in_thread else parse()

    def _sampling(self, route: SamplingRoute) -> Handler:
        """The handler of a route that samples: the whole reply, or the protocol's live
        event stream when the request asks for one and the route streams."""

        async def sample(request: Request) -> Response:
            session, canonical, body, digest = await self._agent_request(request, route)
            if canonical.stream and route.stream_writer is not None:
                writer = route.stream_writer(canonical, session.seal)
                return await stream_reply(self.gateway, session, canonical, body, digest, writer)
            result = await self.gateway.complete(session, canonical, body, digest)
            return route.reply(result, canonical, session.seal)

        return sample

    def _counting(self, route: CountRoute) -> Handler:
        async def count(request: Request) -> Response:
            session = self.gateway.authenticate(_bearer(request))
            headers, path = dict(request.headers), request.url.path
            canonical, _, _ = await self._agent_body(
                request,
                session,
                lambda body: route.parse(body, headers, path, session.seal),
                contextlib.nullcontext(),
            )
            return route.reply(await self.gateway.count_tokens(canonical))

        return count

    async def models(self, request: Request) -> Response:
        self.gateway.authenticate(_bearer(request))
        opts = self.gateway.options
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": opts.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "agentic-rollout",
                        "max_model_len": opts.context_window,
                    }
                ],
            }
        )

    def _unrouted_on(
        self, listener: Listener
    ) -> Callable[[Request, Exception], Awaitable[Response]]:
        """Unknown paths and methods (Starlette's routing errors) as JSON errors in the
        protocol the path speaks, with `Allow` on a 405. The other listener's paths are
        unknown here too: a plain 404 that names this listener."""

        async def unrouted(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            where = f"{request.method} {request.url.path}"
            if exc.status_code == 404:
                err = GatewayError("not_found", f"No such endpoint on the {listener} API: {where}")
            elif exc.status_code == 405:
                allow = (exc.headers or {}).get("Allow")
                err = GatewayError(
                    "method_not_allowed",
                    f"Method {request.method} is not allowed on {request.url.path}"
                    + (f"; allowed: {allow}" if allow else ""),
                    allow=allow,
                )
            else:
                err = GatewayError(
                    "invalid_request", f"{where}: {exc.detail}", status=exc.status_code
                )
            self.gateway.metrics.errors.labels(str(err.status), err.kind).inc()
            return error_responder_for(request.url.path)(err)

        return unrouted

    def build(self, listener: Listener) -> ASGIApp:
        """The app of one listener. One route per path; each method's handler is guarded
        with the error shape of its protocol (the control API uses OpenAI's). The agent
        listener's model calls take the short way in (`_calls_first`)."""
        control = openai = registry.DEFAULT_ERROR_RESPONSE
        endpoints: list[tuple[Listener, str, Handler, ErrorResponder, str]] = [
            ("control", "/sessions", self.create_session, control, "POST"),
            ("control", "/sessions", self.list_sessions, control, "GET"),
            ("control", "/sessions/{session_id}/trajectory", self.get_trajectory, control, "GET"),
            ("control", "/sessions/{session_id}", self.delete_session, control, "DELETE"),
            ("control", "/sessions/{session_id}", self.get_session, control, "GET"),
            ("control", "/policy", self.get_policy, control, "GET"),
            ("control", "/policy", self.update_policy, control, "POST"),
            ("control", "/policy/hold", self.hold_policy, control, "POST"),
            ("control", "/policy/release", self.release_policy, control, "POST"),
            ("control", "/policy/pause", self.pause_policy, control, "POST"),
            ("control", "/policy/resume", self.resume_policy, control, "POST"),
        ]
        for protocol in registry.PROTOCOLS:
            respond = protocol.error_response
            for route in protocol.routes:
                endpoints.append(("agent", route.path, self._sampling(route), respond, "POST"))
            for counted in protocol.count_routes:
                endpoints.append(("agent", counted.path, self._counting(counted), respond, "POST"))
        endpoints.append(("agent", "/v1/models", self.models, openai, "GET"))
        by_path: dict[str, dict[str, Handler]] = {}
        for served_on, path, handler, respond, method in endpoints:
            if served_on == listener:
                by_path.setdefault(path, {})[method] = self._guard(handler, respond)
        if listener == "control":
            by_path["/health"] = {"GET": self.health}
            by_path["/metrics"] = {"GET": self.metrics}
        routes = [
            Route(path, _by_method(handlers), methods=list(handlers))
            for path, handlers in by_path.items()
        ]
        app = Starlette(
            routes=routes,
            exception_handlers={HTTPException: self._unrouted_on(listener)},
            # the reaper and loop-lag probe run once per process, on the core's loop
            lifespan=self._lifespan if listener == "agent" else None,
        )
        if listener == "control":
            return app
        labels = registry.span_labels()
        calls = {path: (labels[path], by_path[path]["POST"]) for path in labels}
        return self._calls_first(calls, app)

    def _calls_first(self, calls: dict[str, tuple[str, Handler]], app: ASGIApp) -> ASGIApp:
        """`app`, except that a POST to a route that samples (path → span label and
        guarded handler) goes straight to its handler, its spans measured
        (`observability.spans`). Starlette's routing and middleware only cost CPU there:
        the guard answers every error in the protocol's shape. Other methods, paths and
        the lifespan go to `app`."""
        metrics = self.gateway.metrics

        async def agent(scope: Scope, receive: Receive, send: Send) -> None:
            call = calls.get(scope["path"]) if scope["type"] == "http" else None
            if call is None or scope["method"] != "POST":
                await app(scope, receive, send)
                return
            label, handler = call

            async def answer() -> int:
                response = await handler(Request(scope, receive))
                await response(scope, receive, send)
                return response.status_code

            await measured(metrics, label, answer)

        return agent

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """What runs as long as the app serves: the session reaper, the loop-lag probe;
        the tokenizer pool (if one was started) and the engine connections stop with it.
        Runs with the agent app, whose loop owns the core's asyncio state."""
        self.core_loop = asyncio.get_running_loop()
        tasks = [
            asyncio.create_task(SessionReaper(self.gateway).run()),
            asyncio.create_task(self.loop_lag.run()),
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.gateway.engine.aclose()
            tokenizer = self.gateway.incremental.tokenizer
            if isinstance(tokenizer, OffloadingTokenizer):
                await asyncio.to_thread(tokenizer.close)
            await asyncio.to_thread(self.body_parser.close)


def _by_method(handlers: dict[str, Handler]) -> Handler:
    """One endpoint for several methods of a path, so a 405 lists them all in `Allow`."""

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers[method](request)

    return endpoint
