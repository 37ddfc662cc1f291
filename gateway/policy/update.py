"""Policy updates without losing work: pause, drain, load, set the version, resume.

`PolicyGate` sits in front of every engine call of this process: a call is admitted
(and told the policy version its engine serves) or waits while an update holds the gate
closed; it is never failed for it. An update closes the gate, waits until the admitted
calls have finished (drain), so no call straddles two sets of weights and every call
records the version that really sampled it.

`PolicyUpdater` runs `POST /policy`. Engines are shared by all gateway processes, so the
process that gets the call first pauses and drains every peer (`POST /policy/pause` on
their control listeners, a lease it renews while the update runs), then itself, has
every engine load the checkpoint (`Engine.weight_loader`; vLLM's reloads in place,
`vllm_weights`), and resumes everyone with the new version.

Whatever fails (a peer, the drain, an engine's load, a bug, cancellation), the update
ends the same way: what each engine serves is kept true at every step (an engine that
failed after it began to change weights and could not be put back is `unknown`), the
history gets the entry, every peer and this gate resume on it, and the caller gets an
error naming what failed and what the engines serve. Updates are serialized and run to
their end even if their caller leaves; a peer paused by one update refuses another (409)
instead of deadlocking two coordinators. The history (`history`) is on the shared
data dir, so every process (and a restarted one) reports the same. A trainer that moves
weights into the engines itself splits the same pause and drain around its sync
(`external_sync`: hold, release), holding this updater's lock meanwhile.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from gateway.engines.base import WeightLoader, WeightLoadError
from gateway.engines.vllm_weights import VllmWeightLoader, check_checkpoint
from gateway.errors import GatewayError
from gateway.policy.checkpoint_roots import resolve_checkpoint, resolve_roots
from gateway.policy.history import HISTORY_FILE, PolicyHistory
from gateway.policy.update_marker import UpdateMark, UpdateMarker
from schemas.policy import (
    UNKNOWN_WEIGHTS,
    EngineServing,
    PeerPause,
    PeerPaused,
    PeerResume,
    PolicyState,
    PolicyUpdate,
    PolicyUpdateRecord,
    WeightUpdate,
    WeightUpdateReport,
)

log = logging.getLogger("rollout.gateway")

__all__ = ["HISTORY_FILE", "PolicyGate", "PolicyUpdater", "serving_text", "unknown_on"]

PEER_ANSWER_S = 30.0
"""How long a peer may take to answer beyond the drain it was given (then: unreachable)."""

PEER_LEASE_S = 60.0
"""How long a paused peer waits for the coordinator's word before it resumes by itself;
the coordinator renews the lease every third of it while the update runs."""

Sleep = Callable[[float], Awaitable[None]]
"""What lease timers wait with: `asyncio.sleep`, or a test's clock that moves on demand."""


class PolicyGate:
    """Admits engine calls, or holds them while an update has the gate closed."""

    def __init__(self, version: str | None = None) -> None:
        self.version = version
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._by_engine: dict[str, str | None] = {}
        self.inflight = 0
        self.held = 0
        """Calls that found the gate closed since it last closed."""

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    def serve(self, versions: dict[str, str | None]) -> None:
        """Set what each engine serves: one version when all agree, else per engine."""
        distinct = set(versions.values())
        if len(distinct) <= 1:
            self.version = next(iter(distinct), self.version)
            self._by_engine = {}
        else:
            self.version, self._by_engine = None, dict(versions)

    def version_on(self, url: str | None) -> str | None:
        """The version engine `url` serves (the process's one unless they differ)."""
        if url is None or not self._by_engine:
            return self.version
        return self._by_engine.get(url.rstrip("/"), self.version)

    @contextlib.asynccontextmanager
    async def admitted(self, url: str | None = None) -> AsyncIterator[str | None]:
        """One engine call: waits while the gate is closed; yields the version engine
        `url` serves (versions change only while no call is admitted)."""
        if not self._open.is_set():
            self.held += 1
        while not self._open.is_set():
            await self._open.wait()
        self.inflight += 1  # no await since the check: an update cannot slip in between
        self._idle.clear()
        try:
            yield self.version_on(url)
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    async def close_and_drain(self, timeout_s: float) -> tuple[int, float]:
        """Close the gate and wait for admitted calls; (calls drained, seconds). On a
        timeout the gate opens again and the error says how many calls were running."""
        self._open.clear()
        self.held = 0
        drained, started = self.inflight, time.monotonic()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except BaseException as exc:  # a timeout, or the update cancelled: open again
            self.open()
            if not isinstance(exc, TimeoutError):
                raise
            raise GatewayError(
                "conflict",
                f"{self.inflight} engine call(s) still running after {timeout_s:g}s of "
                "drain; the update was abandoned, the old policy keeps serving",
            ) from None
        return drained, time.monotonic() - started

    def open(self) -> None:
        self._open.set()


LoaderFactory = Callable[[str], WeightLoader]


def _starting(url: str) -> EngineServing:
    return EngineServing(engine=url, policy_version=None, checkpoint=None)


def unknown_on(url: str) -> EngineServing:
    """Engine `url` serves weights nobody can name."""
    return EngineServing(engine=url, policy_version=UNKNOWN_WEIGHTS, checkpoint=None)


def serving_text(serving: dict[str, EngineServing]) -> str:
    """What the engines serve, for an error message."""

    def name(s: EngineServing) -> str:
        return s.policy_version or "its starting weights"

    values = list(serving.values())
    if len({(s.policy_version, s.checkpoint) for s in values}) == 1:
        return f"every engine serves {name(values[0])}"
    return "engines serve: " + ", ".join(f"{s.engine} {name(s)}" for s in values)


class PolicyUpdater:
    """`POST /policy` and the peer calls of one gateway process."""

    def __init__(
        self,
        gate: PolicyGate,
        engine_urls: list[str],
        data_dir: Path,
        peers: list[str] | None = None,
        admin_token: str | None = None,
        loader: LoaderFactory = VllmWeightLoader,
        checkpoint_roots: list[Path] | None = None,
        lease_s: float = PEER_LEASE_S,
        owner: str | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """`owner`: this process's own address, which names its mark of an update in
        progress (`update_marker`); None: no mark (a process nothing restarts). `sleep`:
        how every lease of this process waits (its peers', its holds', their renewal)."""
        self.gate = gate
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.history_file = PolicyHistory(data_dir)
        self.history_path = self.history_file.path
        self.peers = [p.rstrip("/") for p in peers or []]
        self.headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.loader = loader
        self.roots = resolve_roots(checkpoint_roots or [])
        self.lease_s = lease_s
        self.sleep = sleep
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[PolicyUpdateRecord]] = set()
        self._peer_hold: tuple[PeerPause, asyncio.Task[None] | None] | None = None
        self.held_for: str | None = None
        """The external hold this process coordinates (`external_sync`); it holds `_lock`."""
        self._ended: deque[str] = deque(maxlen=64)
        """Updates whose resume came when this process was not paused for them (its
        lease had resumed it, or the pause is still on its way): a late pause is refused."""
        self.serving: dict[str, EngineServing] = {
            u: EngineServing(engine=u, policy_version=gate.version, checkpoint=None)
            for u in self.engine_urls
        }
        self.history_file.repair()  # a torn last line from a crash: dropped, never fatal
        if gate.version is None:
            self.apply(self.serving_from_history())
        self.marker = UpdateMarker(data_dir, owner) if owner is not None else None
        self._after_a_killed_update()

    # ------------------------------------------------------------------ state
    @property
    def checkpoint(self) -> str | None:
        checkpoints = {s.checkpoint for s in self.serving.values()}
        return checkpoints.pop() if len(checkpoints) == 1 else None

    @property
    def paused_for(self) -> str | None:
        """The update another process has paused this one for."""
        return self._peer_hold[0].update_id if self._peer_hold is not None else None

    def history(self) -> list[PolicyUpdateRecord]:
        return self.history_file.read()

    def serving_from_history(self) -> dict[str, EngineServing]:
        """What the last update left on each engine: its `serving`, or (older records)
        the version of the last applied one."""
        for record in reversed(self.history()):
            if record.serving:
                known = {s.engine: s for s in record.serving}
                return {u: known.get(u, _starting(u)) for u in self.engine_urls}
            if record.status == "ok":
                return {
                    u: EngineServing(
                        engine=u, policy_version=record.policy_version, checkpoint=record.checkpoint
                    )
                    for u in self.engine_urls
                }
        return {u: _starting(u) for u in self.engine_urls}

    def apply(self, serving: dict[str, EngineServing]) -> None:
        self.serving = {
            u: serving.get(u, self.serving.get(u, _starting(u))) for u in self.engine_urls
        }
        self.gate.serve({u: s.policy_version for u, s in self.serving.items()})

    def _after_a_killed_update(self) -> None:
        """This process was killed in the middle of an update or hold it ran (its mark is
        left): unless the history has that update's end, every engine is `unknown`, and
        the history says why."""
        if self.marker is None or (left := self.marker.left()) is None:
            return
        if any(r.update_id == left.update_id for r in self.history()):
            self.marker.end()  # it ended; only the mark's removal was lost
            return
        serving = {u: unknown_on(u) for u in self.engine_urls}
        self.apply(serving)
        error = (
            f"{left.kind} update {left.update_id} to {left.policy_version or 'a version not named'}"
            ": this gateway process stopped in its middle, so what the engines serve is not "
            f"known; {serving_text(serving)} until the next update"
        )
        log.error("%s", error)
        record = PolicyUpdateRecord(
            update_id=left.update_id,
            kind=left.kind,
            policy_version=left.policy_version or UNKNOWN_WEIGHTS,
            checkpoint=left.checkpoint,
            previous_version=left.previous_version,
            status="failed",
            error=error,
            started_at=left.started_at,
            processes=1 + len(self.peers),
            drained_calls=0,
            held_calls=0,
            drain_s=0.0,
            load_s=0.0,
            total_s=round((datetime.now(UTC) - left.started_at).total_seconds(), 4),
            serving=list(serving.values()),
        )
        try:
            self.history_file.append(record)
        except OSError as exc:  # labelled unknown all the same; the mark stays for next time
            log.error("policy update %s: history not written: %s", left.update_id, exc)
            return
        self.marker.end()

    async def mark(self, mark: UpdateMark) -> None:
        """Mark an update this process runs before it pauses anyone (503 if it cannot)."""
        if self.marker is None:
            return
        try:
            await asyncio.to_thread(self.marker.begin, mark)
        except OSError as exc:
            raise GatewayError(
                "storage_unavailable",
                f"update {mark.update_id} not started: its mark could not be written ({exc})",
            ) from exc

    async def unmark(self) -> None:
        """The update's history entry is written: its mark goes."""
        if self.marker is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self.marker.end)

    def state(self) -> PolicyState:
        return PolicyState(
            policy_version=self.gate.version,
            checkpoint=self.checkpoint if self.gate.version is not None else None,
            updating=self._lock.locked() or self._peer_hold is not None,
            held_for=self.held_for,
            waiting_calls=self.gate.held if self.gate.closed else 0,
            engines=list(self.serving.values()),
            history=self.history(),
        )

    # ------------------------------------------------------------------ the update
    def check(self, update: PolicyUpdate) -> PolicyUpdate:
        """Bad input before anything pauses: a path outside the checkpoint roots is a
        403, a missing checkpoint a 404, an unusable one a 400, a version already served
        from another checkpoint a 409. The update with the checkpoint's real path."""
        real = str(resolve_checkpoint(update.checkpoint, self.roots))
        try:
            check_checkpoint(real)
        except WeightLoadError as exc:
            raise GatewayError("invalid_request", str(exc), param="checkpoint") from exc
        for record in self.history():
            if (
                record.status == "ok"
                and record.policy_version == update.policy_version
                and record.checkpoint != real
            ):
                source = (
                    f"loaded from {record.checkpoint}; a version names one checkpoint"
                    if record.checkpoint is not None
                    else f"synced by the trainer (external update {record.update_id}); a "
                    "version names one set of weights"
                )
                raise GatewayError(
                    "conflict", f"policy_version {update.policy_version} was {source}"
                )
        return update.model_copy(update={"checkpoint": real})

    async def update(self, update: PolicyUpdate) -> PolicyUpdateRecord:
        """Run an update to its end even when the caller goes away (the gate and the
        peers must be resumed by whoever closed them)."""
        await asyncio.to_thread(self.check, update)  # bad input: refused before any wait
        self.refuse_if_busy(queue=True)
        task = asyncio.create_task(self._serialized(update))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def claim(self, update_id: str) -> None:
        """Take the update lock for external update `update_id` at once, or 409: a hold is
        never queued behind an update, nor an update behind a hold."""
        self.refuse_if_busy()
        await self._lock.acquire()  # free (checked just now): taken without waiting
        self.held_for = update_id

    def unclaim(self) -> None:
        self.held_for = None
        self._lock.release()

    def refuse_if_busy(self, queue: bool = False) -> None:
        """409 while an external hold is in force or another process pauses this one (an
        update then waits for a running update of this process when `queue`)."""
        if self.held_for is not None:
            raise GatewayError(
                "conflict",
                f"external update {self.held_for} holds the policy (a trainer is syncing "
                "weights); retry after its release",
            )
        if self._peer_hold is not None:
            raise GatewayError(
                "conflict", "another gateway process is updating the policy; retry after it"
            )
        if not queue and self._lock.locked():
            raise GatewayError("conflict", "a policy update is running; retry after it")

    async def _serialized(self, update: PolicyUpdate) -> PolicyUpdateRecord:
        self.refuse_if_busy(queue=True)  # a hold taken since `update` checked
        async with self._lock:  # serialized: a second update waits for the first
            checked = await asyncio.to_thread(self.check, update)  # the first may have moved
            if self._peer_hold is not None:
                raise GatewayError(
                    "conflict", "another gateway process is updating the policy; retry after it"
                )
            return await self._run(checked)

    async def _run(self, update: PolicyUpdate) -> PolicyUpdateRecord:
        update_id = uuid.uuid4().hex[:16]
        started_at, t0 = datetime.now(UTC), time.monotonic()
        before = dict(self.serving)
        previous = self.gate.version
        target = EngineServing(
            engine="", policy_version=update.policy_version, checkpoint=update.checkpoint
        )

        def record(status: str, error: str | None = None, **times: object) -> PolicyUpdateRecord:
            return PolicyUpdateRecord.model_validate(
                {
                    "update_id": update_id,
                    "policy_version": update.policy_version,
                    "checkpoint": update.checkpoint,
                    "previous_version": previous,
                    "status": status,
                    "error": error,
                    "started_at": started_at,
                    "processes": 1 + len(self.peers),
                    "total_s": round(time.monotonic() - t0, 4),
                    **times,
                }
            )

        if all(
            (s.policy_version, s.checkpoint) == (target.policy_version, target.checkpoint)
            for s in before.values()
        ):
            done = record("unchanged", drained_calls=0, held_calls=0, drain_s=0.0, load_s=0.0)
            await self.append(done)
            return done
        await self.mark(
            UpdateMark(
                update_id=update_id,
                kind="checkpoint",
                policy_version=update.policy_version,
                checkpoint=update.checkpoint,
                previous_version=previous,
                started_at=started_at,
            )
        )
        serving = dict(before)  # what each engine serves, kept true as the update goes
        to_resume: list[str] = []  # peers sent a pause (also one whose answer was lost)
        reports: list[WeightUpdateReport] = []
        drained, drain_s, load_s = 0, 0.0, 0.0
        failure: GatewayError | None = None
        cancelled: asyncio.CancelledError | None = None
        closed = False
        renewing = asyncio.create_task(self.renew_leases(to_resume, update_id))
        try:
            pause = PeerPause(
                update_id=update_id,
                drain_timeout_s=update.drain_timeout_s,
                lease_s=self.lease_s,
                policy_version=update.policy_version,
                checkpoint=update.checkpoint,
            )
            drained = await self.pause_peers(pause, to_resume)
            closed = True
            here, _ = await self.gate.close_and_drain(update.drain_timeout_s)
            drained += here
            drain_s = time.monotonic() - t0
            failure = await self._load_all(update, before, serving, reports)
            load_s = time.monotonic() - t0 - drain_s
        except GatewayError as exc:
            failure = exc
        except asyncio.CancelledError as exc:  # shutdown: record it and resume everyone
            cancelled = exc
            failure = GatewayError("internal", "the update was cancelled (gateway stopping)")
        except Exception as exc:  # a bug must not leave the gate closed either
            log.exception("policy update %s failed", update_id)
            failure = GatewayError("internal", f"unexpected {type(exc).__name__}: {exc}")
        finally:
            renewing.cancel()
        held = self.gate.held if closed else 0
        try:
            try:
                self.apply(serving)
                error = None
                if failure is not None:
                    error = (
                        f"policy update {update_id} to {update.policy_version} failed: "
                        f"{failure.message}; {serving_text(serving)}"
                    )
                done = record(
                    "ok" if failure is None else "failed",
                    error,
                    drained_calls=drained,
                    held_calls=held,
                    drain_s=round(drain_s, 4),
                    load_s=round(load_s, 4),
                    engines=reports,
                    serving=list(serving.values()),
                )
                written = await self.append(done)  # before the peers: their leases read it
                if written is None:
                    await self.unmark()
            finally:
                self.gate.open()
        finally:
            await self.resume_peers(to_resume, update_id, serving)
        log.info(
            "policy update %s %s → %s: %s in %.2fs (drain %.2fs, load %.2fs)%s",
            update_id,
            previous,
            update.policy_version,
            done.status,
            done.total_s,
            drain_s,
            load_s,
            f": {error}" if error else "",
        )
        if cancelled is not None:
            raise cancelled
        if failure is not None and error is not None:
            raise GatewayError(failure.kind, error, status=failure.status)
        if written is not None:
            raise GatewayError(
                "storage_unavailable",
                f"policy update {update_id}: {serving_text(serving)}, but its history entry "
                f"could not be written ({written}); a restarted gateway would not know it",
            )
        return done

    async def pause_peers(self, pause: PeerPause, paused: list[str]) -> int:
        """Pause and drain every peer, each listed in `paused` before it is asked (so a
        pause whose answer is lost is resumed too); the calls they drained."""
        drained = 0
        for peer in self.peers:
            paused.append(peer)
            reply = await self._peer(peer, "pause", pause)
            drained += PeerPaused.model_validate_json(reply.content).drained_calls
        return drained

    async def append(self, record: PolicyUpdateRecord) -> str | None:
        """Write a history entry; the error text when it could not be."""
        try:
            await asyncio.to_thread(self.history_file.append, record)
        except OSError as exc:
            log.error("policy update %s: history not written: %s", record.update_id, exc)
            return str(exc)
        return None

    async def _load_all(
        self,
        update: PolicyUpdate,
        before: dict[str, EngineServing],
        serving: dict[str, EngineServing],
        reports: list[WeightUpdateReport],
    ) -> GatewayError | None:
        """Every engine loads the checkpoint; on a failure the engines that changed
        weights go back to what they served before, where that is known. `serving` says
        what each engine serves at every step. The failure, or None."""
        wanted = WeightUpdate(policy_version=update.policy_version, checkpoint=update.checkpoint)
        for url in self.engine_urls:
            try:
                reports.append(await self.loader(url).load(wanted))
            except BaseException as exc:
                touched = exc.touched if isinstance(exc, WeightLoadError) else True
                if touched:
                    serving[url] = EngineServing(
                        engine=url, policy_version=UNKNOWN_WEIGHTS, checkpoint=None
                    )
                if not isinstance(exc, Exception):
                    raise  # cancelled: no restore, the record says what is known
                message = (
                    f"engine {url} did not load {update.checkpoint}: "
                    f"{exc if isinstance(exc, WeightLoadError) else repr(exc)}"
                )
                message += await self._restore(before, serving, update.policy_version)
                return GatewayError("engine_bad_reply", message)
            serving[url] = EngineServing(
                engine=url, policy_version=update.policy_version, checkpoint=update.checkpoint
            )
        return None

    async def _restore(
        self, before: dict[str, EngineServing], serving: dict[str, EngineServing], new: str
    ) -> str:
        """Put back, on every engine that changed weights, what it served before (when
        that has a checkpoint); the text that completes the error message."""
        notes: list[str] = []
        for url, now in serving.items():
            old = before[url]
            if now == old:
                continue
            if old.checkpoint is None or old.policy_version is None:
                notes.append(f"{url} keeps {now.policy_version}: no earlier checkpoint known")
                continue
            back = WeightUpdate(policy_version=old.policy_version, checkpoint=old.checkpoint)
            try:
                await self.loader(url).load(back)
            except Exception as exc:
                if not isinstance(exc, WeightLoadError) or exc.touched:
                    serving[url] = EngineServing(
                        engine=url, policy_version=UNKNOWN_WEIGHTS, checkpoint=None
                    )
                notes.append(f"restoring {old.policy_version} on {url} failed too: {exc!r}")
                continue
            serving[url] = old
        return "".join(f"; {note}" for note in notes)

    # ------------------------------------------------------------------ peers
    async def _peer(self, peer: str, action: str, body: PeerPause | PeerResume) -> httpx.Response:
        timeout = PEER_ANSWER_S + (body.drain_timeout_s if isinstance(body, PeerPause) else 0)
        try:
            async with httpx.AsyncClient(timeout=timeout, headers=self.headers) as client:
                reply = await client.post(f"{peer}/policy/{action}", json=body.model_dump())
        except httpx.HTTPError as exc:
            raise GatewayError(
                "engine_unavailable",
                f"gateway process {peer} unreachable for {action}: {exc!r}",
            ) from exc
        if reply.status_code != 200:
            raise GatewayError(
                "conflict",
                f"gateway process {peer} refused {action} ({reply.status_code}): "
                f"{reply.text[:300]}",
            )
        return reply

    async def renew_leases(self, peers: list[str], update_id: str) -> None:
        """While the update runs, extend the pause of every peer paused for it, so no
        lease runs out on a slow load (a peer that is gone is left to its lease)."""
        renew = PeerPause(update_id=update_id, lease_s=self.lease_s, renew=True)
        while self.peers:
            await self.sleep(self.lease_s / 3)
            for peer in list(peers):
                try:
                    await self._peer(peer, "pause", renew)
                except GatewayError as exc:
                    log.warning("policy update %s: lease not renewed: %s", update_id, exc.message)

    async def resume_peers(
        self, peers: list[str], update_id: str, serving: dict[str, EngineServing]
    ) -> None:
        versions = {s.policy_version for s in serving.values()}
        common = versions.pop() if len(versions) == 1 else None
        resume = PeerResume(
            update_id=update_id,
            policy_version=common if common != UNKNOWN_WEIGHTS else None,
            checkpoint=self.checkpoint,
            serving=list(serving.values()),
        )
        for peer in peers:
            try:
                await self._peer(peer, "resume", resume)
            except Exception as exc:  # its lease resumes it; the update itself stands
                log.error("policy update %s: resuming %s: %r", update_id, peer, exc)

    async def pause_for_peer(self, pause: PeerPause) -> PeerPaused:
        """Another process coordinates an update: close this gate and drain it (or, with
        `renew`, extend the lease of that pause)."""
        if pause.renew:
            if self._peer_hold is None or self._peer_hold[0].update_id != pause.update_id:
                raise GatewayError("conflict", f"not paused for update {pause.update_id}")
            self._hold(pause)
            return PeerPaused(drained_calls=0, drain_s=0.0)
        if pause.update_id in self._ended:
            raise GatewayError("conflict", f"update {pause.update_id} has already ended")
        if self.held_for is not None:
            raise GatewayError(
                "conflict", f"this gateway process holds the policy for {self.held_for}"
            )
        if self._lock.locked() or self._peer_hold is not None:
            raise GatewayError("conflict", "this gateway process is already in a policy update")
        self._peer_hold = (pause, None)  # held from now: no update of ours starts meanwhile
        try:
            drained, seconds = await self.gate.close_and_drain(pause.drain_timeout_s)
        except BaseException:
            self._peer_hold = None
            raise
        self._hold(pause)
        return PeerPaused(drained_calls=drained, drain_s=round(seconds, 4))

    def _hold(self, pause: PeerPause) -> None:
        """(Re)start the lease of the pause held for `pause.update_id`."""
        if self._peer_hold is not None and self._peer_hold[1] is not None:
            self._peer_hold[1].cancel()
        lease = asyncio.create_task(self._lease(pause))
        self._peer_hold = (pause, lease)

    async def _lease(self, pause: PeerPause) -> None:
        """Resume by itself when the coordinator never did (it died, or its resume was
        lost): each engine's version is asked of the engine, so an engine that did load
        the update's checkpoint is labelled with its version."""
        await self.sleep(pause.lease_s)
        log.error(
            "policy update %s: no resume within %gs; resuming", pause.update_id, pause.lease_s
        )
        try:
            serving = await self._probe(pause)
        except Exception as exc:  # never stay closed
            log.error("policy update %s: engines not probed: %r", pause.update_id, exc)
            serving = self.serving_from_history()
        self._ended.append(pause.update_id)
        self._peer_hold = None
        self.apply(serving)
        self.gate.open()

    async def _probe(self, pause: PeerPause) -> dict[str, EngineServing]:
        """What each engine serves after an update that ended unseen: the history's entry
        when the coordinator wrote one, else the engine's own weight version: the
        update's (it loaded), the one served before, or else not known."""
        for record in reversed(await asyncio.to_thread(self.history)):
            if record.update_id == pause.update_id and record.serving:
                return {s.engine: s for s in record.serving}
        if pause.external:  # the trainer's sync: nothing here can tell whether it finished
            return {u: unknown_on(u) for u in self.serving}
        serving: dict[str, EngineServing] = {}
        for url, now in self.serving.items():
            try:
                reported = await self.loader(url).current_version()
            except Exception as exc:
                log.error("policy update %s: %s not asked: %r", pause.update_id, url, exc)
                reported = None
            if pause.policy_version is not None and reported == pause.policy_version:
                serving[url] = EngineServing(
                    engine=url, policy_version=pause.policy_version, checkpoint=pause.checkpoint
                )
            elif reported == now.policy_version or now.policy_version is None:
                serving[url] = now
            else:
                serving[url] = EngineServing(
                    engine=url, policy_version=UNKNOWN_WEIGHTS, checkpoint=None
                )
        return serving

    def resume_for_peer(self, resume: PeerResume) -> None:
        """The coordinator's outcome: resume on it. A process whose lease already resumed
        it for this update still takes the outcome (the engines serve it)."""
        held = self._peer_hold
        if held is not None and held[0].update_id == resume.update_id:
            if held[1] is not None:
                held[1].cancel()
            self._peer_hold = None
            self.apply(self._outcome(resume))
            self.gate.open()
            return
        if resume.update_id in self._ended:
            log.warning(
                "policy update %s: resume after the lease; taking its outcome", resume.update_id
            )
            self.apply(self._outcome(resume))
            return
        self._ended.append(resume.update_id)
        raise GatewayError("conflict", f"not paused for update {resume.update_id}")

    def _outcome(self, resume: PeerResume) -> dict[str, EngineServing]:
        if resume.serving:
            return {s.engine: s for s in resume.serving}
        if resume.policy_version is not None:
            return {
                u: EngineServing(
                    engine=u, policy_version=resume.policy_version, checkpoint=resume.checkpoint
                )
                for u in self.engine_urls
            }
        return dict(self.serving)
