"""Group commit: many appends, one fsync per batch, each call acknowledged once synced.

One fsync per call would put a disk flush (milliseconds) on every agent call and cap a
busy gateway at a few hundred calls per second; none leaves acknowledged calls in the page
cache, lost with the machine. A single thread syncs whatever was written since its last
batch, starts a batch at most every `interval_s`, and resolves each writer's future after
the batch holding its bytes is on disk.

A writer on an event loop waits on a future of that loop (`submit_on_loop`), set from the
sync thread by one call on that loop: cheaper for the loop than bridging a thread-safe
future to it (`asyncio.wrap_future`).
"""

import asyncio
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Future

log = logging.getLogger("rollout.gateway")

Waiter = Future[None] | asyncio.Future[None]
"""What a writer waits on: a thread-safe future, or a future of its event loop."""


def fsync_dir(path: os.PathLike[str] | str) -> None:
    """Make a directory's entries (a created or renamed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GroupCommit:
    """Takes ownership of written file descriptors and fsyncs them in batches."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._cond = threading.Condition()
        self._pending: list[tuple[int, Waiter]] = []
        self._last_batch = float("-inf")
        self._thread: threading.Thread | None = None

    def submit(self, fd: int) -> Future[None]:
        """Sync `fd` in the next batch, then close it; the future fails if the fsync did."""
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()  # a caller that stops waiting cannot cancel it
        self._enqueue(fd, done)
        return done

    def submit_on_loop(self, fd: int) -> asyncio.Future[None]:
        """`submit` for a caller on the running event loop: the future is that loop's (a
        caller that stops waiting cancels only its wait, never the sync)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(fd, done)
        return done

    def _enqueue(self, fd: int, done: Waiter) -> None:
        with self._cond:
            self._pending.append((fd, done))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rollout-group-commit", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
            wait = self._last_batch + self.interval_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # writes keep joining the batch meanwhile
            with self._cond:
                batch, self._pending = self._pending, []
            self._last_batch = time.monotonic()
            self._sync(batch)

    @staticmethod
    def _sync(batch: list[tuple[int, Waiter]]) -> None:
        """One fsync per file in the batch (descriptors of one file share it), then close."""
        outcome: dict[tuple[int, int], OSError | None] = {}
        for fd, done in batch:
            error: OSError | None = None
            try:
                stat = os.fstat(fd)
                key = (stat.st_dev, stat.st_ino)
                if key not in outcome:
                    outcome[key] = _fsync(fd)
                error = outcome[key]
            except OSError as exc:
                error = exc
            with contextlib.suppress(OSError):
                os.close(fd)
            if isinstance(done, asyncio.Future):
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    done.get_loop().call_soon_threadsafe(_settle, done, error)
            else:
                _settle(done, error)


def _settle(done: Waiter, error: OSError | None) -> None:
    """Give a writer its outcome (on its loop, for a loop's future), unless it stopped
    waiting."""
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)


def _fsync(fd: int) -> OSError | None:
    try:
        os.fsync(fd)
    except OSError as exc:
        log.error("fsync failed: %s", exc)
        return exc
    return None
