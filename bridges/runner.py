"""Running our async clients for trainers, whichever way the trainer calls us.

The Temporal client, the Gateway's policy client and asyncio primitives belong to the
event loop they were made on. A trainer that calls us synchronously (TRL's
`rollout_func`, slime's hooks) gets :class:`EventLoopThread`: one loop on a thread of its
own that outlives the call, so a client made in one call serves the next, even when the
calling thread runs a loop of its own. A trainer that calls us on its own loops (verl
and OpenRLHF actors, SkyRL's generator) gets :class:`PerLoop`: one value per running
loop, made once even when many calls race for it. :class:`Connection` is the settings
block of a bridge its trainer configures (where Temporal and the Gateway are).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field

from rollout_client import RolloutClient

T = TypeVar("T")


class EventLoopThread:
    """One asyncio loop on a daemon thread; `run` waits for a coroutine on it from any
    thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start `coro` on the loop; `.result()` waits for it from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(coro).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


_shared: EventLoopThread | None = None
_shared_lock = threading.Lock()


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the process's shared :class:`EventLoopThread` (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = EventLoopThread()
    return _shared.run(coro)


class PerLoop(Generic[T]):
    """One value per running event loop, made by `make` on first use there. Callers that
    race share one making; a failed making is forgotten, so the next call tries again."""

    def __init__(self, make: Callable[[], Awaitable[T]]) -> None:
        self._make = make
        self._made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[T]] = (
            weakref.WeakKeyDictionary()
        )

    async def get(self) -> T:
        loop = asyncio.get_running_loop()
        task = self._made.get(loop)
        if task is None:
            task = self._made[loop] = loop.create_task(_await(self._make))
        try:
            return await asyncio.shield(task)
        except Exception:
            if self._made.get(loop) is task:
                del self._made[loop]
            raise


async def _await(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


class Connection(BaseModel):
    """Where a bridge reaches Temporal and the Gateway: the fields of the settings of
    every bridge its trainer configures (slime's `args`, OpenRLHF's settings)."""

    temporal: str = "127.0.0.1:7233"
    namespace: str = "default"
    task_queue: str = "rollouts"
    gateway: str | None = Field(
        default=None,
        description="the Gateway's control URL: rollouts are labelled with the version it "
        "serves (the staleness rule) and new policies are published through it",
    )

    async def connect(self) -> RolloutClient:
        return await RolloutClient.connect(self.temporal, self.namespace, self.task_queue)
