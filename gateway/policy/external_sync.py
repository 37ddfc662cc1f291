"""External policy updates: the trainer syncs weights into its engines itself.

verl, slime, SkyRL and OpenRLHF move new weights into their inference engines over NCCL
or CUDA IPC, with no checkpoint directory the Gateway could load, so `POST /policy`
does not fit them. An external update is the same pause and drain, split in two calls
around the trainer's sync: `hold` pauses and drains every gateway process exactly as an
update does (peers first, then this gate) and keeps them paused; the trainer syncs;
`release` names the version the engines serve now (or the sync's failure), writes the
history entry (`kind: external`) and resumes everyone on it. No engine call is in
flight while the weights change, so every call still records the version that sampled
it.

The hold takes the updater's lock: a checkpoint update or a second hold meanwhile is
refused at once (409) rather than queued behind a sync whose length only the trainer
knows. A trainer that dies mid-sync must not leave every agent waiting, so a hold
without a release ends by itself after its lease; nothing here can tell whether the
sync finished, so every engine is then labelled `unknown` (its calls are never taken for
a policy's samples) until the next update or release.
"""

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from gateway.errors import GatewayError
from gateway.policy.update import PolicyUpdater, serving_text, unknown_on
from gateway.policy.update_marker import UpdateMark
from schemas.policy import (
    UNKNOWN_WEIGHTS,
    EngineServing,
    PeerPause,
    PolicyHeld,
    PolicyHold,
    PolicyRelease,
    PolicyUpdateRecord,
)

log = logging.getLogger("rollout.gateway")

T = TypeVar("T")

ENDED_KEPT = 64
"""Ended holds remembered, so a late release is told how its hold ended."""


@dataclass
class _Hold:
    request: PolicyHold
    before: dict[str, EngineServing]
    previous: str | None
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    t0: float = field(default_factory=time.monotonic)
    peers: list[str] = field(default_factory=list)
    """Peers sent a pause (also one whose answer was lost): each is resumed at the end."""
    drained: int = 0
    drain_s: float = 0.0
    held: bool = False
    """Drained: from now on a release ends it (before, the hold call is still running)."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    """The lease and the peers' lease renewal, cancelled when the hold ends."""

    @property
    def update_id(self) -> str:
        return self.request.update_id


class ExternalSync:
    """`POST /policy/hold` and `POST /policy/release` of one gateway process."""

    def __init__(self, updater: PolicyUpdater) -> None:
        self.updater = updater
        self._hold: _Hold | None = None
        self._ended: OrderedDict[str, str] = OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def _to_the_end(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` to its end even if the caller leaves: whoever closed the gates must
        open them."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    # ------------------------------------------------------------------ hold
    async def hold(self, request: PolicyHold) -> PolicyHeld:
        return await self._to_the_end(self._hold_now(request))

    async def _hold_now(self, request: PolicyHold) -> PolicyHeld:
        u = self.updater
        if self._hold is not None:
            raise GatewayError(
                "conflict",
                f"external update {self._hold.update_id} already holds the policy; release "
                "it before another hold",
            )
        if request.update_id in self._ended:
            raise GatewayError(
                "conflict",
                f"external update {request.update_id} has already ended "
                f"({self._ended[request.update_id]}); hold with a new update_id",
            )
        await u.claim(request.update_id)
        hold = _Hold(request, dict(u.serving), u.gate.version)
        self._hold = hold
        pause = PeerPause(
            update_id=request.update_id,
            drain_timeout_s=request.drain_timeout_s,
            lease_s=u.lease_s,
            policy_version=request.policy_version,
            external=True,
        )
        renewing = asyncio.create_task(u.renew_leases(hold.peers, request.update_id))
        try:
            await u.mark(
                UpdateMark(
                    update_id=request.update_id,
                    kind="external",
                    policy_version=request.policy_version,
                    checkpoint=None,
                    previous_version=hold.previous,
                    started_at=hold.started_at,
                )
            )
            drained = await u.pause_peers(pause, hold.peers)
            here, _ = await u.gate.close_and_drain(request.drain_timeout_s)
        except BaseException as exc:
            renewing.cancel()
            await self._not_held(hold, exc)
            raise  # unreachable: `_not_held` raises
        hold.drained, hold.drain_s = drained + here, round(time.monotonic() - hold.t0, 4)
        hold.held = True
        hold.tasks = [renewing, asyncio.create_task(self._expire(hold))]
        expires_at = datetime.now(UTC) + timedelta(seconds=request.lease_s)
        log.info(
            "external update %s: %d process(es) held, %d call(s) drained in %.2fs",
            hold.update_id,
            1 + len(u.peers),
            hold.drained,
            hold.drain_s,
        )
        return PolicyHeld(
            update_id=hold.update_id,
            processes=1 + len(u.peers),
            drained_calls=hold.drained,
            drain_s=hold.drain_s,
            previous_version=hold.previous,
            lease_s=request.lease_s,
            expires_at=expires_at,
        )

    async def _not_held(self, hold: _Hold, exc: BaseException) -> None:
        """The pause or the drain failed (a peer refused or is gone, calls outlasted the
        drain, cancellation): nothing changed on the engines; every process is resumed on
        what it served, the history records the failure, the caller gets the error."""
        if isinstance(exc, GatewayError):
            failure = exc
        elif isinstance(exc, asyncio.CancelledError):
            failure = GatewayError("internal", "the hold was cancelled (gateway stopping)")
        else:
            log.exception("external update %s: hold failed", hold.update_id, exc_info=exc)
            failure = GatewayError("internal", f"unexpected {type(exc).__name__}: {exc}")
        error = (
            f"external update {hold.update_id} could not hold the policy: {failure.message}; "
            f"{serving_text(hold.before)}"
        )
        await self._end(hold, hold.before, "failed", error, pause_failed=True)
        if not isinstance(exc, GatewayError | Exception):
            raise exc  # cancelled: recorded and resumed, now stop
        raise GatewayError(failure.kind, error, status=failure.status) from None

    # ------------------------------------------------------------------ release
    async def release(self, request: PolicyRelease) -> PolicyUpdateRecord:
        hold = self._holding(request.update_id)
        if request.error is None:
            assert request.policy_version is not None  # the model requires one of them
            await asyncio.to_thread(self._check_version, request.policy_version)
            hold = self._holding(request.update_id)  # a lease may have run out meanwhile
            serving = {
                u: EngineServing(engine=u, policy_version=request.policy_version, checkpoint=None)
                for u in hold.before
            }
            return await self._to_the_end(self._end(hold, serving, "ok", None, request))
        # a sync that may have changed weights leaves them unnamed; one that had not begun
        # leaves the previous version serving
        serving = {u: unknown_on(u) if request.touched else s for u, s in hold.before.items()}
        error = (
            f"external update {hold.update_id} failed (the trainer reports: {request.error}); "
            f"{serving_text(serving)}"
        )
        return await self._to_the_end(self._end(hold, serving, "failed", error, request))

    def _holding(self, update_id: str) -> _Hold:
        """The hold a release names, or a 409 that says why there is none."""
        hold = self._hold
        if hold is not None and hold.update_id == update_id:
            if not hold.held:
                raise GatewayError(
                    "conflict",
                    f"external update {update_id} is still pausing and draining; release "
                    "it once its hold has answered",
                )
            return hold
        if update_id in self._ended:
            how = self._ended[update_id]
            raise GatewayError("conflict", f"external update {update_id} has already ended: {how}")
        peer = self.updater.paused_for
        if peer == update_id:
            raise GatewayError(
                "conflict",
                f"this gateway process is paused for external update {update_id} by another "
                "process: release it on the control URL that took the hold",
            )
        if hold is not None:
            raise GatewayError(
                "conflict", f"external update {hold.update_id} holds the policy, not {update_id}"
            )
        raise GatewayError("conflict", f"no external update {update_id} holds the policy")

    def _check_version(self, version: str) -> None:
        """A version loaded from a checkpoint names those weights: the trainer's sync
        cannot take it over (409)."""
        for record in self.updater.history():
            if record.status == "ok" and record.policy_version == version and record.checkpoint:
                raise GatewayError(
                    "conflict",
                    f"policy_version {version} was loaded from {record.checkpoint}; a version "
                    "names one set of weights: release with a new version",
                )

    # ------------------------------------------------------------------ lease
    async def _expire(self, hold: _Hold) -> None:
        await self.updater.sleep(hold.request.lease_s)
        serving = {u: unknown_on(u) for u in hold.before}
        error = (
            f"external update {hold.update_id}: no release within its "
            f"{hold.request.lease_s:g}s lease; the gateway cannot know whether the trainer's "
            f"weight sync finished, so {serving_text(serving)} until the next update"
        )
        log.error("%s", error)
        try:
            await self._end(hold, serving, "expired", error)
        except GatewayError as exc:  # the history could not be written; the gates are open
            log.error("external update %s: %s", hold.update_id, exc.message)

    # ------------------------------------------------------------------ the end
    async def _end(
        self,
        hold: _Hold,
        serving: dict[str, EngineServing],
        status: str,
        error: str | None,
        release: PolicyRelease | None = None,
        pause_failed: bool = False,
    ) -> PolicyUpdateRecord:
        """End `hold` on `serving`: the history entry, then this gate and every peer
        resumed on it, then the lock freed. Ends each hold once (a release racing the
        lease: the second finds it ended)."""
        u = self.updater
        if self._hold is not hold:
            raise GatewayError(
                "conflict",
                f"external update {hold.update_id} has already ended: "
                f"{self._ended.get(hold.update_id, 'ended')}",
            )
        self._hold = None
        current = asyncio.current_task()
        for task in hold.tasks:
            if task is not current:
                task.cancel()
        version = (
            (release.policy_version if release is not None else None)
            or hold.request.policy_version
            or UNKNOWN_WEIGHTS
        )
        elapsed = time.monotonic() - hold.t0
        record = PolicyUpdateRecord(
            update_id=hold.update_id,
            kind="external",
            policy_version=version,
            checkpoint=None,
            previous_version=hold.previous,
            status=status,  # type: ignore[arg-type]  # one of the record's statuses
            error=error,
            started_at=hold.started_at,
            processes=1 + len(u.peers),
            drained_calls=hold.drained,
            held_calls=u.gate.held if hold.held else 0,
            drain_s=hold.drain_s if hold.held else round(elapsed, 4),
            load_s=round(elapsed - hold.drain_s, 4) if hold.held else 0.0,
            total_s=round(elapsed, 4),
            serving=list(serving.values()),
        )
        self._ended[hold.update_id] = (
            f"{status}, {serving_text(serving)}" if not pause_failed else "its hold failed"
        )
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        written: str | None = None
        try:
            try:
                u.apply(serving)
                written = await u.append(record)  # before the peers: their leases read it
                if written is None:
                    await u.unmark()
            finally:
                u.gate.open()
        finally:
            try:
                with contextlib.suppress(Exception):
                    await u.resume_peers(hold.peers, hold.update_id, serving)
            finally:
                u.unclaim()
        log.info(
            "external update %s %s → %s: %s in %.2fs (drain %.2fs, sync %.2fs)",
            hold.update_id,
            hold.previous,
            version,
            status,
            record.total_s,
            record.drain_s,
            record.load_s,
        )
        if written is not None:
            raise GatewayError(
                "storage_unavailable",
                f"external update {hold.update_id}: {serving_text(serving)}, but its history "
                f"entry could not be written ({written}); a restarted gateway would not know it",
            )
        return record
