"""The Gateway core: sessions, and one protocol-independent path for every agent call.

prepare prompt (held tokens + new part) → engine (token IDs in, sampled IDs out) → parse →
commit to the held segment → append the record to disk (undoing the commit if that fails)
→ wait for its group commit → hand the result to the adapter.
Adapters only translate protocols; everything that makes trajectories exact lives here.
"""

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import secrets
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.calls.stream_relay import StreamAborted, StreamRelay
from gateway.canonical import CanonicalRequest, CompletionResult
from gateway.capture.recording import PlannedCall, reuse_of
from gateway.capture.replies import completion_of, parse_output, reply_message
from gateway.capture.retries import Answers, is_retry, request_digest
from gateway.capture.revival import revive
from gateway.capture.store import (
    CallRecord,
    CorruptRecordError,
    Durability,
    Record,
    SegmentOpened,
    SessionMeta,
    SessionStore,
)
from gateway.capture.trajectory import TrajectoryCorruptError, build_segments, recorded_calls
from gateway.engines.policy_update import PolicyGate
from gateway.engines.routing import EngineRouter
from gateway.errors import GatewayError
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.spans import lap
from gateway.parsers.base import OutputParser
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError
from gateway.prompt.incremental import HeldSegment, IncrementalTokenizer, PromptPlan
from gateway.prompt.tokenize_pool import LargeEncode, deferring_large_encodes
from gateway.protocols.history import HistoryCache
from gateway.sessions.lifetime import Expiry, expiry
from gateway.sessions.scenes import classify
from schemas.sampling import SamplingParams
from schemas.scenes import Scene
from schemas.session import SessionConfig, SessionCreated, SessionListing, SessionSummary
from schemas.trajectory import CallStatus, MatchKind, RecordedCall, Trajectory

log = logging.getLogger("rollout.gateway")


class GatewayOptions(BaseModel):
    """Settings of one gateway process that the core needs."""

    model_config = ConfigDict(extra="forbid")

    model_name: str
    public_url: str
    advertised_url: str | None = None
    """The one address agents are given when processes share a port (`owner_forwarding`);
    None: this process's own `public_url`, which always identifies the owner."""
    data_dir: Path
    context_window: int
    default_max_tokens: int = 4096
    max_inflight_engine_calls: int = 256
    max_queued_engine_calls: int = 4096
    fsync: Durability = "group"
    """`group`: a call is answered only once its record is fsynced (batched); `off`: once
    it is written (survives a gateway crash, not a machine crash)."""
    fsync_interval_ms: float = Field(default=5.0, gt=0)
    """Group commit starts a batch at most this often."""
    session_janitor_interval_s: float = Field(default=30.0, ge=0)
    """How often the session janitor closes sessions past their TTL (0: never; calls to
    an expired session are refused all the same)."""
    stream_abort_grace_s: float = Field(default=2.0, ge=0)
    """How long a streamed call whose client left keeps sampling before the engine request
    is cancelled: an SDK that timed out resends within a second, and that retry then
    gets this call's answer instead of a second sample (see `stream_relay`)."""


class LiveSession:
    """In-memory state of a session owned by this process."""

    def __init__(self, meta: SessionMeta) -> None:
        self.meta = meta
        self.held: list[HeldSegment] = []
        self.segment_scenes: dict[str, Scene] = {}
        self.last_call: dict[str, str] = {}
        self.calls = 0
        self.failed_calls = 0
        self.answers = Answers()
        self.history: HistoryCache | None = HistoryCache()
        """The request history already converted (None: convert every request in full)."""
        self.lock = asyncio.Lock()
        self.closed = False
        self.last_active = time.time()  # wall clock, like created_at and file mtimes

    def checkpoint(self, plan: PromptPlan) -> Callable[[], None]:
        """An undo for committing `plan`: drops the segments it adds and restores the one it
        extends, so a call whose record cannot be written leaves no trace in memory."""
        held, scenes = list(self.held), dict(self.segment_scenes)
        restore = plan.segment.checkpoint() if plan.segment is not None else None

        def undo() -> None:
            self.held[:] = held
            self.segment_scenes.clear()
            self.segment_scenes.update(scenes)
            if restore is not None:
                restore()

        return undo

    def _latest(self, *scenes: Scene) -> str | None:
        for segment_id, scene in reversed(self.segment_scenes.items()):
            if scene in scenes:
                return segment_id
        return None

    def open_segment(self, segment: HeldSegment, scene: Scene) -> SegmentOpened:
        """Place a new segment in the session's tree.

        A sub-agent's conversation is `spawned_by` the latest main segment; a compaction
        `continues` the main conversation it summarises, and the main conversation that
        resumes from the summary `continues` that compaction. Anything else keeps the
        parent the prefix matcher found (a fork of shared history), unlinked.
        """
        parent, link = segment.parent_id, None
        if scene is Scene.subagent:
            parent, link = self._latest(Scene.main) or parent, "spawned_by"
        elif scene is Scene.compaction:
            parent, link = self._latest(Scene.main) or parent, "continues"
        elif scene is Scene.main:
            latest = self._latest(Scene.main, Scene.compaction)
            if latest is not None and self.segment_scenes[latest] is Scene.compaction:
                parent, link = latest, "continues"
        if link is not None and parent is None:
            link = None
        self.segment_scenes[segment.segment_id] = scene
        return SegmentOpened(
            segment_id=segment.segment_id, parent_id=parent, link=link, scene=scene.value
        )


def _hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Gateway:
    def __init__(
        self,
        options: GatewayOptions,
        template: ChatTemplate,
        incremental: IncrementalTokenizer,
        parser: OutputParser,
        engine: EngineRouter,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.options = options
        self.template = template
        self.incremental = incremental
        self.parser = parser
        self.engine = engine
        self.metrics = metrics or GatewayMetrics()
        self.store = SessionStore(
            options.data_dir, options.fsync, sync_interval_s=options.fsync_interval_ms / 1000
        )
        self.sessions: dict[str, LiveSession] = {}
        self._engine_slots = asyncio.Semaphore(options.max_inflight_engine_calls)
        self.policy = PolicyGate()  # a policy update holds engine calls here (policy_update)
        self._waiting = 0

    # ------------------------------------------------------------------ control API
    def create_session(self, config: SessionConfig) -> tuple[SessionCreated, bool]:
        """Open a session; returns (reply, created). With an `idempotency_key` the session
        id and token derive from the key (HMAC with this data dir's secret), so a retried
        create — also after a gateway restart — gets the same session back, not a second."""
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
            token_sha256=_hash_token(token),
            engine_url=self.engine.assign(session_id),
            prompt_template_version=self.template.version,
            created_at=datetime.now(UTC),
            owner_url=self.options.public_url,
        )
        self.store.create(meta)
        self.sessions[session_id] = LiveSession(meta)
        self.metrics.sessions_open.inc()
        return self._created_reply(session_id, token), True

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
        live = LiveSession(meta)
        live.held = state.held
        live.segment_scenes = state.segment_scenes
        live.last_call = state.last_call
        live.calls, live.failed_calls = state.calls, state.failed_calls
        live.answers = Answers(state.answered)
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
        (that process lets go of it on its next call or janitor pass)."""
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
        now = time.time()
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
        """Open sessions on the data dir (every process's): for janitors. Reads files only,
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
            calls=recorded_calls(records),
            segments=segments,
            metadata=meta.config.metadata,
        )

    # ------------------------------------------------------------------ agent API
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
            if not hmac.compare_digest(meta.token_sha256, _hash_token(token)):
                raise GatewayError("authentication", "invalid session token")
            if self.store.is_closed(session_id):
                raise self._closed_error(session_id)
            self.check_lifetime(meta)  # an expired session stays closed, never revived
            if meta.owner_url not in (None, self.options.public_url):
                raise GatewayError(
                    "conflict", f"session {session_id} is not served by this process"
                )
            live = self._revive(meta)
        if not hmac.compare_digest(live.meta.token_sha256, _hash_token(token)):
            raise GatewayError("authentication", "invalid session token")
        if live.closed or self.store.is_closed(session_id):
            self.release(session_id)  # closed through another process's marker
            raise self._closed_error(session_id)
        self.check_lifetime(live.meta, live)
        return live

    async def complete(
        self,
        session: LiveSession,
        request: CanonicalRequest,
        raw_request: dict[str, Any],
        relay: StreamRelay | None = None,
    ) -> CompletionResult:
        """One agent call. A retry (`retries.is_retry`) of a body this session answered
        gets that answer again, same call id, nothing sampled or recorded; if the original
        is still running, once it finishes (see `retries` for why only declared retries).
        With a `relay` the engine streams and the relay sees the tokens as they arrive
        (an answered retry never reaches it: the caller replays the result)."""
        digest = request_digest(request.path, raw_request)
        if is_retry(request.headers):
            answer = await session.answers.answer_for(digest)
            if answer is not None:
                self.metrics.retries_answered.inc()
                if isinstance(answer, CompletionResult):
                    return answer
                return await self._recorded_answer(session, answer, request)
        with session.answers.answering(digest) as inflight:
            if relay is not None:
                relay.wanted_by_retry = inflight.awaited
            result = await self._sample(session, request, raw_request, digest, relay)
            inflight.answer.set_result(result)
        return result

    async def _recorded_answer(
        self, session: LiveSession, call_id: str, request: CanonicalRequest
    ) -> CompletionResult:
        """The answer of a recorded call, read back from the session's records."""
        session_id = session.meta.session_id
        try:
            records = await asyncio.to_thread(self.store.load_records, session_id)
        except CorruptRecordError as exc:
            raise GatewayError("corrupt_record", f"session {session_id}: {exc}") from exc
        for record in records:
            if isinstance(record, CallRecord) and record.call.call_id == call_id:
                call = record.call
                parsed = parse_output(
                    self.incremental, self.parser, call_id, call.prompt_ids, call.output_ids
                )
                return completion_of(call, parsed, request.model or self.options.model_name)
        raise GatewayError("corrupt_record", f"session {session_id}: call {call_id} is lost")

    async def _sample(
        self,
        session: LiveSession,
        request: CanonicalRequest,
        raw_request: dict[str, Any],
        digest: str,
        relay: StreamRelay | None = None,
    ) -> CompletionResult:
        config = session.meta.config
        scene = classify(request, config.scenes)
        started_at = datetime.now(UTC)
        wall0 = time.perf_counter()
        async with session.lock:
            cpu0 = time.process_time()
            try:
                # A call extends only segments of its own scene: a compaction that happens
                # to append to the main conversation still opens its own linked segment.
                candidates = [
                    h for h in session.held if session.segment_scenes.get(h.segment_id) is scene
                ]
                plan = await self._plan(candidates, request)
            except TemplateRenderError as exc:
                raise GatewayError("invalid_request", f"chat template: {exc}") from exc
            self.metrics.prepare_seconds.observe(time.process_time() - cpu0)
            reuse = reuse_of(plan, session.last_call)
        sampling = self._sampling_for(config.sampling, request.sampling, len(plan.prompt_ids))
        call_id = uuid.uuid4().hex[:24]
        planned = PlannedCall(
            meta=session.meta,
            request=request,
            raw_request=raw_request,
            plan=plan,
            reuse=reuse,
            scene=scene,
            sampling=sampling,
            call_id=call_id,
            started_at=started_at,
            wall_start=wall0,
            digest=digest,
        )
        planned.check_storable()
        lap("plan")
        if relay is not None:
            relay.started(planned, request.model or self.options.model_name)
        try:
            async with self.policy.admitted() as version:  # waits while weights change
                planned = dataclasses.replace(planned, policy_version=version)
                completion = await self._call_engine(session, plan.prompt_ids, sampling, relay)
        except GatewayError as err:
            partial = (relay.output_ids, relay.output_logprobs) if relay else ([], [])
            await self._record_failure(session, planned, err, *partial)
            raise
        except StreamAborted as aborted:
            await self._record_failure(
                session,
                planned,
                aborted,
                aborted.output_ids,
                aborted.output_logprobs,
                CallStatus.cancelled,
            )
            raise
        lap("engine")
        parsed = parse_output(
            self.incremental, self.parser, call_id, plan.prompt_ids, completion.output_ids
        )
        reply = reply_message(parsed)
        lap("output_parse")
        finish = "length" if completion.finish_reason == "length" else "stop"
        async with session.lock:
            undo = session.checkpoint(plan)
            segment = self.incremental.commit(
                session.held,
                plan,
                completion.output_ids,
                completion.output_logprobs,
                reply,
                finished_with_eot=finish == "stop",
            )
            records: list[Record] = []
            if segment.segment_id not in session.segment_scenes:
                records.append(session.open_segment(segment, scene))
            conflict = segment.segment_id != plan.segment_id
            match = MatchKind.fork if conflict else plan.kind
            fork_reason = (
                "a concurrent call extended the same segment first"
                if conflict
                else plan.fork_reason
            )
            call = planned.recorded_call(
                segment_id=segment.segment_id,
                status=CallStatus.ok,
                match=match,
                output_ids=completion.output_ids,
                output_logprobs=completion.output_logprobs,
                finish_reason=completion.finish_reason,
                parse_error=parsed.parse_error,
                drift=plan.drift,
                fork_reason=fork_reason,
            )
            records.append(planned.durable_record(call))
            try:
                synced = self._append(session, records)
            except Exception:
                undo()  # memory agrees with the file again: the call never happened
                raise
            session.last_call[segment.segment_id] = call_id
            session.calls += 1
            session.answers.recorded(digest, call_id)
        lap("record")
        await self._synced(synced)
        lap("sync")
        self._count(request, scene, call, plan)
        return completion_of(call, parsed, request.model or self.options.model_name)

    async def _plan(self, candidates: list[HeldSegment], request: CanonicalRequest) -> PromptPlan:
        """`prepare`, with large new content tokenized off the event loop: the planner asks
        for it by raising `LargeEncode`, and plans again once the ids are ready (see
        `tokenize_pool`). Identical text whose ids another call took is encoded inline."""
        offloaded: set[str] = set()
        args = (candidates, request.messages, request.tools, request.template_kwargs)
        while True:
            try:
                with deferring_large_encodes():
                    return self.incremental.prepare(*args)
            except LargeEncode as large:
                if large.text in offloaded:
                    return self.incremental.prepare(*args)
                offloaded.add(large.text)
                try:
                    await large.run()
                except BaseException:
                    large.owner.forget(large.text)
                    raise

    def count_tokens(self, request: CanonicalRequest) -> int:
        """Exact prompt length of a request under our template and tokenizer."""
        try:
            text = self.template.render(
                request.messages,
                request.tools,
                add_generation_prompt=True,
                **request.template_kwargs,
            )
        except TemplateRenderError as exc:
            raise GatewayError("invalid_request", f"chat template: {exc}") from exc
        return len(self.incremental.tokenizer.encode(text))

    # ------------------------------------------------------------------ helpers
    def _sampling_for(
        self, policy: SamplingParams, requested: SamplingParams, prompt_len: int
    ) -> SamplingParams:
        room = self.options.context_window - prompt_len
        if room < 1:
            raise GatewayError(
                "invalid_request",
                f"prompt is {prompt_len} tokens; the context window is "
                f"{self.options.context_window}",
                param="messages",
            )
        used = policy.merged_over(requested)
        cap = min(used.max_tokens or self.options.default_max_tokens, room)
        return used.model_copy(update={"max_tokens": cap})

    async def _call_engine(
        self,
        session: LiveSession,
        prompt_ids: list[int],
        sampling: Any,
        relay: StreamRelay | None = None,
    ) -> Any:
        if self._waiting >= self.options.max_queued_engine_calls:
            raise GatewayError("overloaded", "gateway queue is full", status=429, retry_after=1.0)
        self._waiting += 1
        try:
            await self._engine_slots.acquire()
        finally:
            self._waiting -= 1
        lap("engine_queue")
        self.metrics.engine_inflight.inc()
        try:
            url = session.meta.engine_url
            if relay is not None:
                return await relay.run(
                    self.engine.stream(url, prompt_ids, sampling, relay.on_tokens)
                )
            return await self.engine.complete(url, prompt_ids, sampling)
        finally:
            self.metrics.engine_inflight.dec()
            self._engine_slots.release()

    def _append(self, session: LiveSession, records: list[Record]) -> Future[None]:
        """Append a call's records; nothing is written when this raises."""
        try:
            return self.store.append(session.meta.session_id, *records)
        except OSError as exc:
            log.error("session %s: could not append: %s", session.meta.session_id, exc)
            raise GatewayError(
                "storage_unavailable",
                f"the gateway could not record this call ({exc.strerror or exc}); "
                "nothing was recorded, retry later",
                retry_after=1.0,
            ) from exc

    async def _synced(self, synced: Future[None]) -> None:
        """Wait until the batch holding a call's records is on disk (group commit)."""
        try:
            if not synced.done():
                await asyncio.wrap_future(synced)
            synced.result()
        except OSError as exc:
            # The record stays written (memory and file agree); only its durability is unknown.
            raise GatewayError(
                "storage_unavailable",
                f"the gateway could not sync this call to disk ({exc.strerror or exc}); "
                "retry later",
                retry_after=1.0,
            ) from exc

    async def _record_failure(
        self,
        session: LiveSession,
        planned: PlannedCall,
        err: GatewayError | StreamAborted,
        output_ids: list[int] | None = None,
        output_logprobs: list[float] | None = None,
        status: CallStatus = CallStatus.engine_error,
    ) -> None:
        """Record a call that sampled no reply: an engine failure, or a stream the client
        closed (`cancelled`, with the tokens sampled before it). No segment holds its
        tokens, so no trajectory trains on them; the record keeps them for inspection."""
        plan = planned.plan
        what = (
            str(err)
            if isinstance(err, StreamAborted)
            else f"{err.status} {err.kind}: {err.message}"
        )
        call = planned.recorded_call(
            segment_id=plan.segment_id,
            status=status,
            match=plan.kind,
            output_ids=output_ids or [],
            output_logprobs=output_logprobs or [],
            error=what,
            fork_reason=plan.fork_reason,
        )
        async with session.lock:
            synced = self._append(session, [planned.durable_record(call)])
            session.calls += 1
            session.failed_calls += 1
        await self._synced(synced)
        self.metrics.calls.labels(
            planned.request.protocol, planned.scene.value, call.status.value, plan.kind
        ).inc()

    def _count(
        self, request: CanonicalRequest, scene: Scene, call: RecordedCall, plan: PromptPlan
    ) -> None:
        m = self.metrics
        m.calls.labels(request.protocol, scene.value, call.status.value, call.match.value).inc()
        m.new_prompt_tokens.inc(plan.new_token_count)
        m.reused_prompt_tokens.inc(plan.base_length)
        m.sampled_tokens.inc(len(call.output_ids))
        m.call_seconds.labels(request.protocol).observe(call.duration_s)
