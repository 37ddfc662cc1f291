"""Warm pool of pre-created, unassigned sandboxes, keyed by what cannot change later.

Why: creating a container or a bubblewrap sandbox costs 100s of ms (process start,
namespaces, the supervisor's Python start-up). Everything that depends on the
rollout (rollout id, env, Gateway socket, files, repo, setup) is applied *after*
taking a blank sandbox, so blanks can be made ahead of time. Taking one is a dict
lookup + deque pop; refills run in the background. Used sandboxes are discarded,
never reset (a reset cannot prove the previous agent left nothing behind).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class WarmPool(Generic[T]):
    """Blanks per key, made by `make(key)` ahead of use and handed out by `take`."""

    def __init__(
        self,
        make: Callable[[Hashable], Awaitable[T]],
        discard: Callable[[T], Awaitable[None]],
        size: int,
        concurrency: int = 2,
    ) -> None:
        self._make = make
        self._discard = discard
        self.size = size
        self._idle: dict[Hashable, collections.deque[T]] = collections.defaultdict(
            collections.deque
        )
        self._pending: dict[Hashable, int] = collections.defaultdict(int)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sem = asyncio.Semaphore(concurrency)
        self._closed = False
        #: When True, taking does not trigger refills (benchmarks, draining a worker).
        self.paused = False
        self.errors = 0

    def take(self, key: Hashable) -> T | None:
        """A ready blank for `key`, or None. O(1); schedules a refill."""
        q = self._idle.get(key)
        item = q.popleft() if q else None
        self.refill(key)
        return item

    def idle(self, key: Hashable) -> int:
        """How many ready blanks `key` has."""
        return len(self._idle.get(key, ()))

    def idle_items(self) -> list[T]:
        """Every ready blank, across keys (the reaper must not reap these)."""
        return [item for q in self._idle.values() for item in q]

    def refill(self, key: Hashable) -> None:
        """Start creating the blanks `key` lacks (no-op when paused, closed or size 0)."""
        if self._closed or self.paused or self.size <= 0:
            return
        missing = self.size - len(self._idle[key]) - self._pending[key]
        for _ in range(max(0, missing)):
            self._pending[key] += 1
            t = asyncio.get_running_loop().create_task(self._fill_one(key))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _fill_one(self, key: Hashable) -> None:
        try:
            async with self._sem:
                if self._closed:
                    return
                item = await self._make(key)
            if self._closed:
                await self._discard(item)
            else:
                self._idle[key].append(item)
        except Exception:
            self.errors += 1
            log.exception("warm pool refill failed for %r", key)
        finally:
            self._pending[key] -= 1

    async def wait_full(self, key: Hashable, timeout: float = 120.0) -> None:
        """Fill `key` to `size` and wait until it is (bench/tests; workers don't wait)."""
        self.refill(key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._idle[key]) < self.size:
            if loop.time() > deadline:
                raise TimeoutError(f"warm pool for {key!r} not full after {timeout}s")
            if not self._pending[key]:
                self.refill(key)
                if not self._pending[key]:
                    raise RuntimeError("warm pool is paused, closed or has size 0")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Stop refilling and discard every idle blank."""
        self._closed = True
        # In-flight creations finish and discard themselves (cancelling mid-create
        # could leak a half-made sandbox).
        await asyncio.gather(*self._tasks, return_exceptions=True)
        items = self.idle_items()
        self._idle.clear()
        for i in items:
            with contextlib.suppress(Exception):
                await self._discard(i)
