"""The call pipeline: one protocol-independent path for every agent call.

prepare prompt (held tokens + new part) → engine (token IDs in, sampled IDs out) → parse →
commit to the held segment → append the record to disk (undoing the commit if that fails)
→ wait for its group commit → hand the result to the protocol's reply.
Protocols only translate; everything that makes trajectories exact lives here.
"""

import asyncio
import dataclasses
import json
import logging
import os
import time
from datetime import UTC, datetime
from typing import Any
from weakref import WeakKeyDictionary

from gateway.calls.prompt_limits import PromptSizes, check_prompt_size, prompt_size
from gateway.calls.routing import recorded_routing, remember, routing_from
from gateway.calls.stream_relay import StreamAborted, StreamRelay
from gateway.canonical import CanonicalRequest, Message, ParsedOutput, Reply
from gateway.capture.recording import PlannedCall, reuse_of, stored_request
from gateway.capture.replies import parse_output, reply_message, reply_of
from gateway.capture.retries import is_retry
from gateway.capture.store import CorruptRecordError, Entry
from gateway.engines.base import EngineCompletion
from gateway.engines.routing import EngineRouter
from gateway.errors import GatewayError
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.spans import lap
from gateway.options import GatewayOptions
from gateway.parsers.base import OutputParser
from gateway.policy.update import PolicyGate
from gateway.prompt.chat_template import ChatTemplate, TemplateRenderError
from gateway.prompt.incremental import HeldSegment, IncrementalTokenizer, PromptPlan
from gateway.prompt.tokenize_pool import LargeEncode, OffloadingTokenizer, deferring_large_encodes
from gateway.sessions.lifetime import Clock
from gateway.sessions.limits import call_slot, check_room, limits_of
from gateway.sessions.live import LiveSession
from gateway.sessions.scenes import classify
from gateway.sessions.service import SessionService
from schemas.sampling import AppliedSampling, SamplingParams
from schemas.scenes import Scene
from schemas.session import SessionConfig
from schemas.trajectory import CallStatus, MatchKind, RecordedCall

log = logging.getLogger("rollout.gateway")

PROMPT_TAIL_IDS = 256
"""How much of a recorded prompt's end a retry's answer reads back: what
`prompt_opens_reasoning` looks at (at least its `window` of 64 ids)."""


class Gateway(SessionService):
    """The Gateway core: its sessions (`SessionService`) and the calls made in them."""

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
        super().__init__(options, template, incremental, parser, engine, metrics, clock)
        self._engine_slots = asyncio.Semaphore(options.max_inflight_engine_calls)
        self.policy = PolicyGate()  # a policy update holds engine calls here (gateway.policy)
        self._waiting = 0
        #: each session's last prompt size, message by message (`prompt_limits`)
        self._prompt_sizes: WeakKeyDictionary[LiveSession, PromptSizes] = WeakKeyDictionary()

    async def complete(
        self,
        session: LiveSession,
        request: CanonicalRequest,
        raw_request: dict[str, Any],
        digest: str,
        relay: StreamRelay | None = None,
    ) -> Reply:
        """One agent call (`digest`: its body's, `retries.request_digest`). A retry
        (`retries.is_retry`) of a body this session answered gets that answer again,
        same call id, nothing sampled or recorded; if the original is still running,
        once it finishes (see `retries` for why only declared retries).
        With a `relay` the engine streams and the relay sees the tokens as they arrive
        (an answered retry never reaches it: the caller replays the result). Every call,
        retries included, holds one of the session's call slots while it runs (`limits`);
        a call a limit refuses is counted on the session (its trajectory says so)."""
        try:
            return await self._complete(session, request, raw_request, digest, relay)
        except GatewayError as err:
            session.refused(err.limit)
            raise

    async def _complete(
        self,
        session: LiveSession,
        request: CanonicalRequest,
        raw_request: dict[str, Any],
        digest: str,
        relay: StreamRelay | None,
    ) -> Reply:
        opts = self.options
        sizes = self._prompt_sizes.get(session)
        if sizes is None:
            sizes = self._prompt_sizes[session] = PromptSizes()
        size = sizes.size(request)
        check_prompt_size(size, opts.max_prompt_messages, opts.max_prompt_chars)
        with call_slot(session, limits_of(session.meta.config, opts)):
            if is_retry(request.headers):
                answer = await session.replies.reply_for(digest)
                if answer is not None:
                    self.metrics.retries_answered.inc()
                    if isinstance(answer, Reply):
                        return answer
                    return await self._recorded_reply(session, answer, request)
            with session.replies.replying(digest) as inflight:
                if relay is not None:
                    relay.wanted_by_retry = inflight.awaited
                result = await self._sample(session, request, raw_request, digest, relay)
                inflight.answer.set_result(result)
            return result

    async def _recorded_reply(
        self, session: LiveSession, call_id: str, request: CanonicalRequest
    ) -> Reply:
        """The answer of a recorded call, read back from its record alone (and, for the
        prompt's tail, the few records its prompt refers to), in a thread."""
        session_id = session.meta.session_id
        offset = session.replies.offset_of(call_id)
        if offset is None:
            raise GatewayError("corrupt_record", f"session {session_id}: call {call_id} is lost")

        def read() -> tuple[RecordedCall, int]:
            entry = self.store.read_entry(session_id, offset)
            if entry.call.call_id != call_id:
                raise CorruptRecordError(f"call {call_id} is not at byte {offset}")
            length, tail = self.store.prompt_tail(
                session_id, entry, session.replies.offset_of, PROMPT_TAIL_IDS
            )
            return entry.call.model_copy(update={"prompt_ids": tail}), length

        try:
            call, prompt_tokens = await asyncio.to_thread(read)
        except (CorruptRecordError, OSError) as exc:
            raise GatewayError("corrupt_record", f"session {session_id}: {exc}") from exc
        parsed = parse_output(
            self.incremental, self.parser, call_id, call.prompt_ids, call.output_ids, request.tools
        )
        model = request.model or self.options.model_name
        return reply_of(call, parsed, model, prompt_tokens)

    async def _sample(
        self,
        session: LiveSession,
        request: CanonicalRequest,
        raw_request: dict[str, Any],
        digest: str,
        relay: StreamRelay | None = None,
    ) -> Reply:
        """A call that samples, step by step; each step closes its span (`lap`)."""
        planned = await self._plan_call(session, request, raw_request, digest)
        lap("plan")
        if relay is not None:
            relay.started(planned, request.model or self.options.model_name)
        planned, completion = await self._sample_on_engine(session, planned, relay)
        lap("engine")
        prompt_ids = planned.plan.prompt_ids
        parsed = parse_output(
            self.incremental,
            self.parser,
            planned.call_id,
            prompt_ids,
            completion.output_ids,
            request.tools,
        )
        reply = reply_message(parsed)
        lap("output_parse")
        call, synced = await self._record_call(session, planned, completion, parsed, reply)
        lap("record")
        await self._synced(synced)
        lap("sync")
        self._count(request, planned.scene, call, planned.plan)
        model = request.model or self.options.model_name
        return reply_of(call, parsed, model, len(prompt_ids))

    async def _plan_call(
        self,
        session: LiveSession,
        request: CanonicalRequest,
        raw_request: dict[str, Any],
        digest: str,
    ) -> PlannedCall:
        """Classify the call's scene, plan its prompt on the session's held segments (under
        the session lock) and fix its sampling: everything known before the engine runs.
        A request the session's records have no room for is refused here (`limits`)."""
        config = session.meta.config
        limits = limits_of(config, self.options)
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
        applied = self._sampling_for(config, request, len(plan.prompt_ids))
        stored = stored_request(raw_request, request, reuse, limits.max_stored_request_bytes)
        planned = PlannedCall(
            meta=session.meta,
            request=request,
            plan=plan,
            reuse=reuse,
            scene=scene,
            sampling=applied.used,
            sampling_overridden=applied.overridden,
            call_id=os.urandom(12).hex(),  # 96 random bits, 5x cheaper than a uuid4
            started_at=started_at,
            wall_start=wall0,
            stored=stored,
            digest=digest,
            routing_from=routing_from(session, plan) if self.wants_routing(session) else None,
        )
        session_id = session.meta.session_id
        check_room(session_id, self.store.records_size(session_id), stored.size_bytes, limits)
        if stored.omitted is not None:
            self.metrics.requests_stored_truncated.inc()
        return planned

    async def _sample_on_engine(
        self, session: LiveSession, planned: PlannedCall, relay: StreamRelay | None
    ) -> tuple[PlannedCall, EngineCompletion]:
        """The engine call, admitted by the policy gate (which names the policy version that
        samples it). A call that fails, or whose stream the client left, is recorded as
        such before its error goes on."""
        try:
            url = session.meta.engine_url
            async with self.policy.admitted(url) as version:  # waits while weights change
                planned = dataclasses.replace(planned, policy_version=version)
                completion = await self._call_engine(
                    session, planned.plan.prompt_ids, planned.sampling, relay, planned.routing_from
                )
                if completion.url != url:  # routed elsewhere: that engine's version
                    version = self.policy.version_on(completion.url)
                    planned = dataclasses.replace(planned, policy_version=version)
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
        return planned, completion

    async def _record_call(
        self,
        session: LiveSession,
        planned: PlannedCall,
        completion: EngineCompletion,
        parsed: ParsedOutput,
        reply: Message,
    ) -> tuple[RecordedCall, asyncio.Future[None]]:
        """Commit the sampled ids to the session's held segment and append the call's records
        (under the session lock); memory is put back if the append fails. Returns the
        recorded call (its `prompt_ids` as written: maybe only a tail) and the future of
        its group commit."""
        plan = planned.plan
        experts, routing_missing = None, None
        if planned.routing_from is not None:
            experts, routing_missing = recorded_routing(session, self.options, completion)
        async with session.lock:
            undo = session.checkpoint(plan)
            segment = self.incremental.commit(
                session.held,
                plan,
                completion.output_ids,
                completion.output_logprobs,
                reply,
                finished_with_eot=completion.finish_reason != "length",
            )
            records: list[Entry] = []
            if segment.segment_id not in session.segment_scenes:
                records.append(session.open_segment(segment, planned.scene))
            conflict = segment.segment_id != plan.segment_id
            entry = planned.record(
                segment_id=segment.segment_id,
                status=CallStatus.ok,
                match=MatchKind.fork if conflict else plan.kind,
                output_ids=completion.output_ids,
                output_logprobs=completion.output_logprobs,
                finish_reason=completion.finish_reason,
                parse_error=parsed.parse_error,
                reply=parsed,
                drift=plan.drift,
                fork_reason=(
                    "a concurrent call extended the same segment first"
                    if conflict
                    else plan.fork_reason
                ),
                routed_experts=experts,
                routing_missing=routing_missing,
            )
            records.append(entry)
            try:
                synced = self._append(session, records)
            except Exception:
                undo()  # memory agrees with the file again: the call never happened
                raise
            session.last_call[segment.segment_id] = planned.call_id
            if planned.routing_from is not None:
                remember(session, plan, segment.segment_id, experts)
            session.calls += 1
            session.replies.recorded(planned.digest, planned.call_id, entry.offset)
        return entry.call, synced

    async def _plan(self, candidates: list[HeldSegment], request: CanonicalRequest) -> PromptPlan:
        """`prepare`, with large new content tokenized off the event loop: the planner asks
        for it by raising `LargeEncode`, and plans again once the ids are ready (see
        `tokenize_pool`). Identical text whose ids another call took is encoded inline.
        A request of many messages is planned in a thread: its keys, match and any full
        render are Python work that grows with the conversation, and a thread gives the
        loop its turn every switch interval (a render of 10,000 messages: ~190 ms of loop
        lag inline, ≤ 8 ms from a thread; the tokenizer holds the GIL, hence its pool)."""
        offloaded: set[str] = set()
        args = (candidates, request.messages, request.tools, request.template_kwargs)
        threshold = self.options.plan_thread_messages
        in_thread = bool(threshold) and len(request.messages) >= threshold

        def deferring() -> PromptPlan:
            with deferring_large_encodes():
                return self.incremental.prepare(*args)

        while True:
            try:
                return await asyncio.to_thread(deferring) if in_thread else deferring()
            except LargeEncode as large:
                if large.text in offloaded:
                    return self.incremental.prepare(*args)
                offloaded.add(large.text)
                try:
                    await large.run()
                except BaseException:
                    large.owner.forget(large.text)
                    raise

    def check_prompt_size(self, request: CanonicalRequest) -> None:
        """A 413 naming the limit for a request over the prompt caps (`prompt_limits`)."""
        opts = self.options
        check_prompt_size(prompt_size(request), opts.max_prompt_messages, opts.max_prompt_chars)

    async def count_tokens(self, request: CanonicalRequest) -> int:
        """Exact prompt length of a request under our template and tokenizer, counted off
        the event loop: rendered in a thread, a large text tokenized in the pool."""
        self.check_prompt_size(request)
        try:
            text = await asyncio.to_thread(
                self.template.render,
                request.messages,
                request.tools,
                add_generation_prompt=True,
                **request.template_kwargs,
            )
        except TemplateRenderError as exc:
            raise GatewayError("invalid_request", f"chat template: {exc}") from exc
        tokenizer = self.incremental.tokenizer
        if isinstance(tokenizer, OffloadingTokenizer) and len(text) >= tokenizer.min_chars:
            return len(await tokenizer.encode_in_pool(text))
        return len(tokenizer.encode(text))

    # ------------------------------------------------------------------ helpers
    def _sampling_for(
        self, config: SessionConfig, request: CanonicalRequest, prompt_len: int
    ) -> AppliedSampling:
        """The call's sampling under the session's control (`SamplingControl.apply`), its
        `max_tokens` cut to the room the context window leaves. A pinned field the agent
        asked otherwise is served pinned, or refused when the session says so."""
        room = self.options.context_window - prompt_len
        if room < 1:
            raise GatewayError(
                "invalid_request",
                f"prompt is {prompt_len} tokens; the context window is "
                f"{self.options.context_window}",
                param="messages",
            )
        control = config.sampling_control
        applied = control.apply(config.sampling, request.sampling)
        if applied.overridden and control.on_conflict == "refuse":
            raise _pinned(next(iter(applied.overridden)), applied.used)
        self.check_logit_bias(applied.used, "logit_bias")
        for name in applied.overridden:
            self.metrics.sampling_overridden.labels(name).inc()
        cap = min(applied.used.max_tokens or self.options.default_max_tokens, room)
        if applied.used.max_tokens == cap:
            return applied
        used = applied.used.model_copy(update={"max_tokens": cap})
        return applied.model_copy(update={"used": used})

    async def _call_engine(
        self,
        session: LiveSession,
        prompt_ids: list[int],
        sampling: SamplingParams,
        relay: StreamRelay | None = None,
        routing_from: int | None = None,
    ) -> EngineCompletion:
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
                    self.engine.stream(url, prompt_ids, sampling, relay.on_tokens, routing_from)
                )
            return await self.engine.complete(url, prompt_ids, sampling, routing_from)
        finally:
            self.metrics.engine_inflight.dec()
            self._engine_slots.release()

    def _append(self, session: LiveSession, records: list[Entry]) -> asyncio.Future[None]:
        """Append a call's records; nothing is written when this raises."""
        try:
            return self.store.append_on_loop(session.meta.session_id, *records)
        except OSError as exc:
            log.error("session %s: could not append: %s", session.meta.session_id, exc)
            raise GatewayError(
                "storage_unavailable",
                f"the gateway could not record this call ({exc.strerror or exc}); "
                "nothing was recorded, retry later",
                retry_after=1.0,
            ) from exc

    async def _synced(self, synced: asyncio.Future[None]) -> None:
        """Wait until the batch holding a call's records is on disk (group commit)."""
        try:
            await synced
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
        entry = planned.record(
            segment_id=plan.segment_id,
            status=status,
            match=plan.kind,
            output_ids=output_ids or [],
            output_logprobs=output_logprobs or [],
            error=what,
            fork_reason=plan.fork_reason,
        )
        async with session.lock:
            synced = self._append(session, [entry])
            session.calls += 1
            session.failed_calls += 1
        await self._synced(synced)
        self.metrics.calls.labels(
            planned.request.protocol, planned.scene.value, status.value, plan.kind
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


def _pinned(name: str, used: SamplingParams) -> GatewayError:
    """The 400 for a call that asks pinned field `name` for another value."""
    pinned = used.model_dump(mode="json", include={name})[name]
    if pinned in (None, {}):
        told = "the engine's default; omit it"
    else:
        told = f"{json.dumps(pinned)}; omit it or send that value"
    return GatewayError(
        "invalid_request", f"{name} is pinned by this session to {told}", param=name
    )
