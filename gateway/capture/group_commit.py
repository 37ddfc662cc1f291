"""Group commit: many appends, one fsync per batch, each call acknowledged once synced.

One fsync per call would put a disk flush (milliseconds) on every agent call and cap a
busy gateway at a few hundred calls per second; none leaves acknowledged calls in the page
cache, lost with the machine. A single thread syncs whatever was written since its last
batch, starts a batch at most every `interval_s`, and resolves each writer's future after
the batch holding its bytes is on disk.
"""

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Future

log = logging.getLogger("rollout.gateway")


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
        self._pending: list[tuple[int, Future[None]]] = []
        self._last_batch = float("-inf")
        self._thread: threading.Thread | None = None

    def submit(self, fd: int) -> Future[None]:
        """Sync `fd` in the next batch, then close it; the future fails if the fsync did."""
        done: Future[None] = Future()
        done.set_running_or_notify_cancel()  # a caller that stops waiting cannot cancel it
        with self._cond:
            self._pending.append((fd, done))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rollout-group-commit", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return done

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
    def _sync(batch: list[tuple[int, Future[None]]]) -> None:
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
