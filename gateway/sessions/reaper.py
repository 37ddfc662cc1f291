"""The session reaper: closes sessions past their TTL without waiting for a call.

Why: the agent of a terminated or timed-out rollout never calls again, so the TTL check on
each call alone would leave its session open (token valid, state in memory) for good. One
asyncio task per gateway process, started and stopped with the app. It also lets go of
sessions another process closed through their marker, and closes expired sessions left on
disk by a process that is gone (so a later restart cannot revive them).
"""

import asyncio
import logging

from gateway.capture.store import SessionMeta
from gateway.sessions.lifetime import expiry
from gateway.sessions.service import SessionService

log = logging.getLogger("rollout.gateway")


class SessionReaper:
    def __init__(self, gateway: SessionService) -> None:
        self.gateway = gateway
        self._closed_seen: set[str] = set()  # closed is final: never looked at again
        self._metas: dict[str, SessionMeta] = {}  # meta.json never changes

    async def run(self) -> None:
        """Sweep every `session_reaper_interval_s` until cancelled (0: never)."""
        interval = self.gateway.options.session_reaper_interval_s
        if interval <= 0:
            return
        while True:
            try:
                await self.sweep()
            except Exception:  # the reaper must never stop for good on one bad pass
                log.exception("session reaper pass failed")
            await asyncio.sleep(interval)

    async def sweep(self) -> list[str]:
        """One pass; returns the ids of the sessions it closed."""
        closed = self._sweep_live()
        live = frozenset(self.gateway.sessions)
        on_disk = await asyncio.to_thread(self._open_on_disk, live)
        return closed + self._sweep_disk(on_disk)

    def _sweep_live(self) -> list[str]:
        gateway, store = self.gateway, self.gateway.store
        closed: list[str] = []
        now = self.gateway.clock()
        for session_id, live in list(gateway.sessions.items()):
            try:
                if live.closed or store.is_closed(session_id):
                    gateway.release(session_id)  # closed elsewhere: free the memory
                    continue
                last = max(live.last_active, store.last_write(session_id))
            except OSError as exc:
                log.warning("session reaper: session %s: %s", session_id, exc)
                continue
            why = expiry(live.meta, last, now)
            if why is not None:
                gateway.expire(session_id, why)
                closed.append(session_id)
        return closed

    def _open_on_disk(self, live: frozenset[str]) -> list[tuple[SessionMeta, float]]:
        """(meta, last write) of open sessions not held here; file reads only (a thread)."""
        store = self.gateway.store
        found: list[tuple[SessionMeta, float]] = []
        for session_id in store.session_ids():
            if session_id in live or session_id in self._closed_seen:
                continue
            try:
                if store.is_closed(session_id):
                    self._closed_seen.add(session_id)
                    self._metas.pop(session_id, None)
                    continue
                meta = self._metas.get(session_id)
                if meta is None:
                    meta = self._metas[session_id] = store.load_meta(session_id)
                found.append((meta, store.last_write(session_id)))
            except (OSError, ValueError) as exc:
                log.warning("session reaper: session %s: %s", session_id, exc)
        return found

    def _sweep_disk(self, on_disk: list[tuple[SessionMeta, float]]) -> list[str]:
        """Expire sessions no process holds here. Another live process may hold one and
        know of a call still in flight, so for those only the absolute TTL counts here."""
        closed: list[str] = []
        now = self.gateway.clock()
        ours = (None, self.gateway.options.public_url)
        for meta, last_write in on_disk:
            session_id = meta.session_id
            if session_id in self.gateway.sessions:
                continue  # revived while the files were read: the live sweep owns it
            why = expiry(meta, last_write, now)
            if why is None or (why.kind == "idle" and meta.owner_url not in ours):
                continue
            self.gateway.expire(session_id, why)
            self._closed_seen.add(session_id)
            self._metas.pop(session_id, None)
            closed.append(session_id)
        return closed
