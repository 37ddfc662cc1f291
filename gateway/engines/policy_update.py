"""Policy updates without losing work: pause, drain, load, set the version, resume.

`PolicyGate` sits in front of every engine call of this process: a call is admitted
(and told the policy version it samples with) or waits while an update holds the gate
closed; it is never failed for it. An update closes the gate, waits until the admitted
calls have finished (drain), so no call straddles two sets of weights and every call
records the version that really sampled it.

`PolicyUpdater` runs `POST /policy`. Engines are shared by all gateway processes, so the
process that gets the call first pauses and drains every peer (`POST /policy/pause` on
their control listeners), then itself, has every engine load the checkpoint
(`Engine.weight_loader`; vLLM's reloads in place, `vllm_weights`), and resumes everyone
with the new version — or, when an engine fails to load, puts back the engines that had
loaded and resumes everyone on the old one. Updates are serialized; a peer paused by one
update refuses another (409) instead of deadlocking two coordinators. The history is one
JSONL file on the shared data dir, so every process (and a restarted one) reports the same.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from gateway.engines.base import WeightLoader, WeightLoadError
from gateway.engines.vllm_weights import VllmWeightLoader, check_checkpoint
from gateway.errors import GatewayError
from schemas.policy import (
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

HISTORY_FILE = "policy_history.jsonl"
PEER_LEASE_MARGIN_S = 900.0
"""How long past the drain a paused peer waits for the coordinator's resume (the loads)."""


class PolicyGate:
    """Admits engine calls, or holds them while an update has the gate closed."""

    def __init__(self, version: str | None = None) -> None:
        self.version = version
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.inflight = 0
        self.held = 0
        """Calls that found the gate closed since it last closed."""

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[str | None]:
        """One engine call: waits while the gate is closed; yields the version serving."""
        if not self._open.is_set():
            self.held += 1
        while not self._open.is_set():
            await self._open.wait()
        self.inflight += 1  # no await since the check: an update cannot slip in between
        self._idle.clear()
        try:
            yield self.version
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
        except TimeoutError:
            self.open()
            raise GatewayError(
                "conflict",
                f"{self.inflight} engine call(s) still running after {timeout_s:g}s of "
                "drain; the update was abandoned, the old policy keeps serving",
            ) from None
        return drained, time.monotonic() - started

    def open(self) -> None:
        self._open.set()


LoaderFactory = Callable[[str], WeightLoader]


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
    ) -> None:
        self.gate = gate
        self.engine_urls = engine_urls
        self.history_path = data_dir / HISTORY_FILE
        self.peers = [p.rstrip("/") for p in peers or []]
        self.headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.loader = loader
        self._lock = asyncio.Lock()
        self._peer_hold: tuple[str, asyncio.Task[None]] | None = None
        self.checkpoint: str | None = None
        last = self._last_applied()
        if last is not None and gate.version is None:
            gate.version, self.checkpoint = last.policy_version, last.checkpoint

    # ------------------------------------------------------------------ state
    def history(self) -> list[PolicyUpdateRecord]:
        if not self.history_path.exists():
            return []
        lines = self.history_path.read_text().splitlines()
        return [PolicyUpdateRecord.model_validate_json(line) for line in lines if line.strip()]

    def _last_applied(self) -> PolicyUpdateRecord | None:
        applied = [r for r in self.history() if r.status == "ok"]
        return applied[-1] if applied else None

    def state(self) -> PolicyState:
        return PolicyState(
            policy_version=self.gate.version,
            checkpoint=self.checkpoint,
            updating=self._lock.locked() or self._peer_hold is not None,
            history=self.history(),
        )

    def _append(self, record: PolicyUpdateRecord) -> None:
        self.history_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.history_path, "a") as fh:
            fh.write(record.model_dump_json() + "\n")

    # ------------------------------------------------------------------ the update
    def _check(self, update: PolicyUpdate) -> None:
        """Bad input before anything pauses: a missing checkpoint is a 404, an unusable
        one a 400, a version already served from another checkpoint a 409."""
        path = Path(update.checkpoint)
        if not path.is_absolute():
            raise GatewayError(
                "invalid_request", "checkpoint must be an absolute path", param="checkpoint"
            )
        if not path.is_dir():
            raise GatewayError("not_found", f"checkpoint {update.checkpoint} does not exist")
        try:
            check_checkpoint(update.checkpoint)
        except WeightLoadError as exc:
            raise GatewayError("invalid_request", str(exc), param="checkpoint") from exc
        for record in self.history():
            if (
                record.status == "ok"
                and record.policy_version == update.policy_version
                and record.checkpoint != update.checkpoint
            ):
                raise GatewayError(
                    "conflict",
                    f"policy_version {update.policy_version} was loaded from "
                    f"{record.checkpoint}; a version names one checkpoint",
                )

    async def update(self, update: PolicyUpdate) -> PolicyUpdateRecord:
        self._check(update)
        if self._peer_hold is not None:
            raise GatewayError(
                "conflict", "another gateway process is updating the policy; retry after it"
            )
        async with self._lock:  # serialized: a second update waits for the first
            self._check(update)  # the first may have changed the history
            return await self._run(update)

    async def _run(self, update: PolicyUpdate) -> PolicyUpdateRecord:
        update_id = uuid.uuid4().hex[:16]
        started_at, t0 = datetime.now(UTC), time.monotonic()
        previous, previous_checkpoint = self.gate.version, self.checkpoint

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

        if update.policy_version == previous and update.checkpoint == previous_checkpoint:
            done = record("unchanged", drained_calls=0, held_calls=0, drain_s=0.0, load_s=0.0)
            self._append(done)
            return done
        paused: list[str] = []
        drained = 0
        try:
            for peer in self.peers:
                pause = PeerPause(
                    update_id=update_id,
                    drain_timeout_s=update.drain_timeout_s,
                    lease_s=update.drain_timeout_s + PEER_LEASE_MARGIN_S,
                )
                reply = await self._peer(peer, "pause", pause)
                paused.append(peer)
                drained += PeerPaused.model_validate_json(reply.content).drained_calls
            here, _ = await self.gate.close_and_drain(update.drain_timeout_s)
            drained += here
        except GatewayError:
            await self._resume_peers(paused, update_id, None, None)
            raise
        drain_s = time.monotonic() - t0
        reports, error = await self._load_all(update, previous, previous_checkpoint)
        load_s = time.monotonic() - t0 - drain_s
        if error is None:
            self.gate.version, self.checkpoint = update.policy_version, update.checkpoint
        held = self.gate.held
        await self._resume_peers(paused, update_id, self.gate.version, self.checkpoint)
        self.gate.open()
        done = record(
            "ok" if error is None else "failed",
            error,
            drained_calls=drained,
            held_calls=held,
            drain_s=round(drain_s, 4),
            load_s=round(load_s, 4),
            engines=reports,
        )
        self._append(done)
        log.info(
            "policy update %s → %s: %s in %.2fs (drain %.2fs, load %.2fs)",
            previous,
            update.policy_version,
            done.status,
            done.total_s,
            drain_s,
            load_s,
        )
        if error is not None:
            raise GatewayError("engine_bad_reply", error)
        return done

    async def _load_all(
        self, update: PolicyUpdate, previous: str | None, previous_checkpoint: str | None
    ) -> tuple[list[WeightUpdateReport], str | None]:
        """Every engine loads the checkpoint; on a failure the engines that had loaded it
        go back to the previous checkpoint, so all serve one version. (reports, error)"""
        wanted = WeightUpdate(policy_version=update.policy_version, checkpoint=update.checkpoint)
        reports: list[WeightUpdateReport] = []
        for url in self.engine_urls:
            try:
                reports.append(await self.loader(url).load(wanted))
            except (WeightLoadError, httpx.HTTPError) as exc:
                error = (
                    f"policy update to {update.policy_version} failed: engine {url} did not "
                    f"load {update.checkpoint}: {exc}"
                )
                error += await self._restore(reports, previous, previous_checkpoint)
                return reports, error
        return reports, None

    async def _restore(
        self, loaded: list[WeightUpdateReport], previous: str | None, checkpoint: str | None
    ) -> str:
        """Put back the previous checkpoint on engines that had loaded the new one; the
        text that completes the error message."""
        if not loaded:
            return f"; every engine still serves {previous or 'its previous weights'}"
        if previous is None or checkpoint is None:
            names = ", ".join(r.engine for r in loaded)
            return f"; engines {names} loaded it and no earlier checkpoint is known to restore"
        back = WeightUpdate(policy_version=previous, checkpoint=checkpoint)
        for report in loaded:
            try:
                await self.loader(report.engine).load(back)
            except (WeightLoadError, httpx.HTTPError) as exc:
                return f"; restoring {previous} on {report.engine} failed too: {exc}"
        return f"; every engine serves {previous} again"

    # ------------------------------------------------------------------ peers
    async def _peer(self, peer: str, action: str, body: PeerPause | PeerResume) -> httpx.Response:
        timeout = (body.drain_timeout_s + 30) if isinstance(body, PeerPause) else 60.0
        try:
            async with httpx.AsyncClient(timeout=timeout, headers=self.headers) as client:
                reply = await client.post(f"{peer}/policy/{action}", json=body.model_dump())
        except httpx.HTTPError as exc:
            raise GatewayError(
                "engine_unavailable", f"gateway process {peer} unreachable for {action}: {exc}"
            ) from exc
        if reply.status_code != 200:
            raise GatewayError(
                "conflict",
                f"gateway process {peer} refused {action} ({reply.status_code}): "
                f"{reply.text[:300]}",
            )
        return reply

    async def _resume_peers(
        self, peers: list[str], update_id: str, version: str | None, checkpoint: str | None
    ) -> None:
        resume = PeerResume(update_id=update_id, policy_version=version, checkpoint=checkpoint)
        for peer in peers:
            try:
                await self._peer(peer, "resume", resume)
            except GatewayError as exc:  # its lease resumes it; the update itself stands
                log.error("policy update %s: %s", update_id, exc.message)

    async def pause_for_peer(self, pause: PeerPause) -> PeerPaused:
        """Another process coordinates an update: close this gate and drain it."""
        if self._lock.locked() or self._peer_hold is not None:
            raise GatewayError("conflict", "this gateway process is already in a policy update")
        drained, seconds = await self.gate.close_and_drain(pause.drain_timeout_s)
        lease = asyncio.create_task(self._lease(pause.update_id, pause.lease_s))
        self._peer_hold = (pause.update_id, lease)
        return PeerPaused(drained_calls=drained, drain_s=round(seconds, 4))

    async def _lease(self, update_id: str, lease_s: float) -> None:
        """Resume by itself when the coordinator never did (it died, or its resume was
        lost), on the version the shared history names as last applied."""
        await asyncio.sleep(lease_s)
        log.error("policy update %s: no resume within %gs; resuming", update_id, lease_s)
        last = self._last_applied()
        if last is not None:
            self.gate.version, self.checkpoint = last.policy_version, last.checkpoint
        self._peer_hold = None
        self.gate.open()

    def resume_for_peer(self, resume: PeerResume) -> None:
        if self._peer_hold is None or self._peer_hold[0] != resume.update_id:
            raise GatewayError("conflict", f"not paused for update {resume.update_id}")
        self._peer_hold[1].cancel()
        self._peer_hold = None
        if resume.policy_version is not None:
            self.gate.version, self.checkpoint = resume.policy_version, resume.checkpoint
        self.gate.open()
