"""The sessions of one gateway process: create (idempotently), authenticate, revive after a
restart, summarise, expire and close them, and read their trajectories.

The call pipeline (`gateway.calls.pipeline.Gateway`) extends this service with the agent
calls; the session reaper and the control API use only what is here.
"""

import hmac
import logging
import secrets
import time
import uuid
from datetime import UTC, datetime

from gateway.capture.retries import RetryReplies
from gateway.capture.revival import revive
from gateway.capture.store import CorruptRecordError, SessionMeta, SessionStore
from gateway.capture.trajectory import (
    TrajectoryCorruptError,
    build_segments,
    recorded_calls,
    routing_notes,
)
from gateway.engines.routing import EngineRouter
from gateway.errors import GatewayError
from gateway.observability.metrics import GatewayMetrics
from gateway.options import GatewayOptions
from gateway.parsers.base import OutputParser
from gateway.prompt.chat_template import ChatTemplate
from gateway.prompt.incremental import IncrementalTokenizer
from gateway.protocols.opaque_token import TokenSeal
from gateway.sessions.lifetime import Clock, Expiry, expiry
from gateway.sessions.live import LiveSession, hash_token
from schemas.sampling import SamplingParams
from schemas.session import SessionConfig, SessionCreated, SessionListing, SessionSummary
from schemas.trajectory import CallStatus, Trajectory

log = logging.getLogger("rollout.gateway")


class SessionService:
    """The sessions on this process's data dir, and the live ones it serves."""

    def __init__(
        self,
        options: GatewayOptions,
        template: ChatTemplate,
        incremental: IncrementalTokenizer,
        parser: OutputParser,
        engine: EngineRouter,
        metrics: GatewayMetrics | None = None,
        clock: Clock = time.time,
    ) -> None:
        self.options = options
        self.clock = clock
        """Session time (creation, last use, TTL checks; the reaper's too)."""
        self.template = template
        self.incremental = incremental
        self.parser = parser
        self.engine = engine
        self.metrics = metrics or GatewayMetrics()
        self.store = SessionStore(
            options.data_dir, options.fsync, sync_interval_s=options.fsync_interval_ms / 1000
        )
        self.sessions: dict[str, LiveSession] = {}
        self._secret: bytes | None = None

    def create_session(self, config: SessionConfig) -> tuple[SessionCreated, bool]:
        """Open a session; returns (reply, created). With an `idempotency_key` the session
        id and token derive from the key (HMAC with this data dir's secret), so a retried
        create — also after a gateway restart — gets the same session back, not a second."""
        self.check_logit_bias(config.sampling, "sampling.logit_bias")
        if config.routed_experts and not self.engine.returns_routing:
            raise GatewayError(
                "invalid_request",
                "routed_experts: this gateway's engine API cannot return routed experts "
                "(run it with --engine-api generate, on vLLM >= 0.32 started with "
                "--enable-return-routed-experts, or sglang with the model's routing shape)",
                param="routed_experts",
            )
        if config.idempotency_key is None:
            session_id = "s" + uuid.uuid4().hex
            token = f"{session_id}.{secrets.token_urlsafe(24)}"
        else:
            session_id, token = self._derived_identity(config.idempotency_key)
            existing = self._existing_session(session_id, config)
            if existing is not None:
                return self._created_reply(session_id, token, existing.owner_url), False
        meta = SessionMeta(
            session_id=session_id,
            config=config,
            token_sha256=hash_token(token),
            engine_url=self.engine.assign(session_id),
            prompt_template_version=self.template.version,
            created_at=datetime.fromtimestamp(self.clock(), UTC),
            owner_url=self.options.public_url,
        )
        self.store.create(meta)
        self.sessions[session_id] = LiveSession(meta, self.clock(), self._seal(session_id))
        self.metrics.sessions_open.inc()
        return self._created_reply(session_id, token), True

    def wants_routing(self, session: LiveSession) -> bool:
        """Whether the session's calls record routed experts (its create, or the gateway's
        `--routed-experts`)."""
        return self.options.routed_experts or session.meta.config.routed_experts

    def check_logit_bias(self, sampling: SamplingParams, param: str) -> None:
        """A bias on a token id the model does not have is refused as a 400 naming it,
        before an engine sees it (its refusal would be recorded as a failed call)."""
        vocab = self.options.vocab_size
        if vocab is None or not sampling.logit_bias:
            return
        bad = sorted(t for t in sampling.logit_bias if t >= vocab)
        if bad:
            raise GatewayError(
                "invalid_request",
                f"logit_bias names token id {bad[0]}; the model's ids are 0 to {vocab - 1}",
                param=f"{param}.{bad[0]}",
            )

    def _seal(self, session_id: str) -> TokenSeal:
        """The session's token seal, from this data dir's secret: the same in every
        process on the dir and after a restart, different for any other session or dir."""
        if self._secret is None:
            self._secret = self.store.secret()
        return TokenSeal.for_session(self._secret, session_id)

    def _derived_identity(self, key: str) -> tuple[str, str]:
        secret = self.store.secret()
        session_id = "s" + hmac.new(secret, b"id:" + key.encode(), "sha256").hexdigest()[:32]
        proof = hmac.new(secret, b"token:" + key.encode(), "sha256").hexdigest()
        return session_id, f"{session_id}.{proof}"

    def _existing_session(self, session_id: str, config: SessionConfig) -> SessionMeta | None:
        """The open session a repeated idempotency key names: ours (revived after a restart
        of this process) or another process's on the same data dir, whose URLs the reply
        then carries. Refuses a key reused with another config (never passes) and a closed
        or expired session (a state: the caller moves on to a new key)."""
        if not self.store.exists(session_id):
            return None
        meta = self.store.load_meta(session_id)
        if meta.config != config:
            raise GatewayError(
                "idempotency_mismatch",
                "idempotency key was already used with a different session config",
                param="idempotency_key",
            )
        if self.store.is_closed(session_id):
            raise self._closed_error(session_id)
        live = self.sessions.get(session_id)
        self.check_lifetime(meta, live)
        if live is None and meta.owner_url in (None, self.options.public_url):
            # Our own session from before a restart: serve it again, held segments and all.
            self._revive(meta)
        return meta

    def _revive(self, meta: SessionMeta) -> LiveSession:
        """Serve again a session this process owns, from before a restart: its held
        segments, counters and answered requests are rebuilt from its records, so the
        conversation continues on its held segment (see `revival`)."""
        session_id = meta.session_id
        try:
            state = revive(self.store.load_records(session_id), self.incremental, self.parser)
        except CorruptRecordError as exc:
            raise GatewayError("corrupt_record", f"session {session_id}: {exc}") from exc
        live = LiveSession(meta, self.clock(), self._seal(session_id))
        live.held = state.held
        live.segment_scenes = state.segment_scenes
        live.last_call = state.last_call
        live.calls, live.failed_calls = state.calls, state.failed_calls
        live.replies = RetryReplies(state.answered, state.offsets)
        self.sessions[session_id] = live
        self.engine.assign(session_id)
        self.metrics.sessions_open.inc()
        log.info(
            "session %s revived: %d calls, %d segments held",
            session_id,
            live.calls,
            len(live.held),
        )
        return live

    def _created_reply(
        self, session_id: str, token: str, owner_url: str | None = None
    ) -> SessionCreated:
        base = (self.options.advertised_url or owner_url or self.options.public_url).rstrip("/")
        return SessionCreated(
            session_id=session_id,
            token=token,
            openai_base_url=f"{base}/v1",
            anthropic_base_url=base,
        )

    def summary(self, session_id: str) -> SessionSummary:
        """Call and segment counts; from memory when this process owns the session."""
        live = self.sessions.get(session_id)
        if live is not None:
            return SessionSummary(
                session_id=session_id,
                rollout_id=live.meta.config.rollout_id,
                policy_version=live.meta.config.policy_version,
                closed=live.closed or self.store.is_closed(session_id),
                calls=live.calls,
                failed_calls=live.failed_calls,
                segments=len(live.segment_scenes),
            )
        trajectory = self.trajectory(session_id)
        failed = sum(1 for c in trajectory.calls if c.status != CallStatus.ok)
        return SessionSummary(
            session_id=session_id,
            rollout_id=trajectory.rollout_id,
            policy_version=trajectory.policy_version,
            closed=trajectory.closed,
            calls=len(trajectory.calls),
            failed_calls=failed,
            segments=len(trajectory.segments),
        )

    def close_session(self, session_id: str, reason: str | None = None) -> None:
        """Idempotent; a session owned by another process is closed through its marker
        (that process lets go of it on its next call or reaper pass)."""
        if not self.store.exists(session_id):
            raise GatewayError("not_found", f"session {session_id} does not exist")
        self.store.mark_closed(session_id, reason)
        self.release(session_id)

    def release(self, session_id: str) -> None:
        """Forget a closed session's in-memory state; the records on disk keep everything."""
        live = self.sessions.pop(session_id, None)
        if live is not None and not live.closed:
            live.closed = True
            live.held.clear()
            self.engine.release(session_id)
            self.metrics.sessions_open.dec()

    def expire(self, session_id: str, why: Expiry) -> None:
        """Close a session that outlived a TTL, saying so in its `closed` marker."""
        self.close_session(session_id, why.reason)
        self.metrics.sessions_expired.labels(why.kind).inc()
        log.info("session %s %s", session_id, why.reason)

    def check_lifetime(self, meta: SessionMeta, live: LiveSession | None = None) -> None:
        """409 (and the session closed) once a TTL ran out; else note the session in use."""
        now = self.clock()
        last = self.store.last_write(meta.session_id)
        if live is not None:
            last = max(last, live.last_active)
        why = expiry(meta, last, now)
        if why is not None:
            self.expire(meta.session_id, why)
            raise GatewayError(
                "conflict",
                f"session {meta.session_id} {why.reason}; it is closed, its recorded calls "
                "are kept",
            )
        if live is not None:
            live.last_active = now

    def _closed_error(self, session_id: str) -> GatewayError:
        reason = self.store.closed_reason(session_id)
        detail = f" ({reason})" if reason else ""
        return GatewayError("conflict", f"session {session_id} is closed{detail}")

    def list_sessions(self) -> list[SessionListing]:
        """Open sessions on the data dir (every process's): for reapers. Reads files only,
        so it may run in a thread."""
        listing: list[SessionListing] = []
        for session_id in self.store.session_ids():
            if self.store.is_closed(session_id):
                continue
            try:
                meta = self.store.load_meta(session_id)
            except (OSError, ValueError) as exc:
                log.warning("session %s: unreadable meta: %s", session_id, exc)
                continue
            listing.append(
                SessionListing(
                    session_id=session_id,
                    rollout_id=meta.config.rollout_id,
                    created_at=meta.created_at,
                    owner_url=meta.owner_url,
                    metadata=meta.config.metadata,
                )
            )
        return listing

    def trajectory(self, session_id: str) -> Trajectory:
        if not self.store.exists(session_id):
            raise GatewayError("not_found", f"session {session_id} does not exist")
        meta = self.store.load_meta(session_id)
        try:
            records = self.store.load_records(session_id)
            segments = build_segments(records, set(meta.config.scenes.trainable))
        except (CorruptRecordError, TrajectoryCorruptError) as exc:
            raise GatewayError("corrupt_record", f"session {session_id}: {exc}") from exc
        return Trajectory(
            session_id=session_id,
            rollout_id=meta.config.rollout_id,
            policy_version=meta.config.policy_version,
            closed=self.store.is_closed(session_id),
            prompt_template_version=meta.prompt_template_version,
            calls=(calls := recorded_calls(records)),
            segments=segments,
            metadata=meta.config.metadata,
            limit_refusals=live.limit_refusals if (live := self.sessions.get(session_id)) else {},
            notes=routing_notes(calls),
        )

    def authenticate(self, token: str | None) -> LiveSession:
        """Session token (`<session_id>.<secret>`) → live session.

        401 missing or wrong secret, 404 unknown session, 409 closed session (or one this
        process does not serve: it was created on another gateway process). A session this
        process owns from before a restart is revived on its first call.
        """
        if not token:
            raise GatewayError("authentication", "missing session token (use it as the API key)")
        session_id, dot, _ = token.partition(".")
        if not dot:
            raise GatewayError("authentication", "malformed session token")
        live = self.sessions.get(session_id)
        if live is None:
            if not self.store.exists(session_id):
                raise GatewayError("not_found", f"session {session_id} does not exist")
            meta = self.store.load_meta(session_id)
            if not hmac.compare_digest(meta.token_sha256, hash_token(token)):
                raise GatewayError("authentication", "invalid session token")
            if self.store.is_closed(session_id):
                raise self._closed_error(session_id)
            self.check_lifetime(meta)  # an expired session stays closed, never revived
            if meta.owner_url not in (None, self.options.public_url):
                raise GatewayError(
                    "conflict", f"session {session_id} is not served by this process"
                )
            live = self._revive(meta)
        if not hmac.compare_digest(live.meta.token_sha256, hash_token(token)):
            raise GatewayError("authentication", "invalid session token")
        if live.closed or self.store.is_closed(session_id):
            self.release(session_id)  # closed through another process's marker
            raise self._closed_error(session_id)
        self.check_lifetime(live.meta, live)
        return live
