"""Tokenize large new content off the event loop, in a pool of tokenizer processes.

`tokenizers` holds the GIL while it encodes, so a thread would not free the loop: a
200 KB tool output costs the tiny tokenizer about a second, during which every other
session of the process waits. Texts of at least `min_chars` characters therefore go to
a process pool (spawned on first use, each worker loads the same tokenizer.json and dies
with the gateway, SIGKILL included: `gateway.lifeline`), and smaller ones stay inline,
where a hop would cost more than the encode.

The planner is synchronous and never awaits. Inside `deferring_large_encodes()` the
`OffloadingTokenizer` raises `LargeEncode` instead of encoding a large text inline; the
caller awaits `LargeEncode.run()` (which leaves the ids ready for that exact text) and
plans again, and the second plan takes the ready ids. Outside that context (revival,
startup probes) every text is encoded inline, as before; `count_tokens` asks the pool
directly (`encode_in_pool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import multiprocessing
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import tokenizers

from gateway import lifeline
from gateway.prompt.incremental import Tokenizer

_deferring: contextvars.ContextVar[bool] = contextvars.ContextVar("deferring", default=False)
_worker_tokenizer: tokenizers.Tokenizer | None = None


def _load_worker(path: str, parent: str) -> None:
    """A pool worker's start: it dies with the gateway (`lifeline`), then loads."""
    global _worker_tokenizer
    lifeline.die_with_parent(parent)
    _worker_tokenizer = tokenizers.Tokenizer.from_file(path)


def _encode_in_worker(text: str) -> list[int]:
    assert _worker_tokenizer is not None, "pool worker started without its tokenizer"
    return _worker_tokenizer.encode(text, add_special_tokens=False).ids


@contextlib.contextmanager
def deferring_large_encodes() -> Iterator[None]:
    """Within this block, a large encode raises `LargeEncode` instead of running inline."""
    token = _deferring.set(True)
    try:
        yield
    finally:
        _deferring.reset(token)


class LargeEncode(Exception):
    """A text too large to encode on the event loop; `await run()`, then plan again."""

    def __init__(self, owner: OffloadingTokenizer, text: str) -> None:
        super().__init__(f"{len(text)} characters to encode off the event loop")
        self.owner = owner
        self.text = text

    async def run(self) -> None:
        await self.owner.encode_off_loop(self.text)


class OffloadingTokenizer:
    """A `Tokenizer` that encodes texts of `min_chars` or more in worker processes (when
    deferring) and everything else with `inner`. Both load the same tokenizer.json, so
    the ids are the same wherever a text was encoded."""

    def __init__(
        self, inner: Tokenizer, tokenizer_file: Path, min_chars: int, workers: int = 1
    ) -> None:
        if min_chars < 1 or workers < 1:
            raise ValueError("min_chars and workers must be >= 1")
        self.inner = inner
        self.tokenizer_file = tokenizer_file
        self.min_chars = min_chars
        self.workers = workers
        #: Texts encoded off the loop whose ids the next plan takes (then forgets).
        self._ready: dict[str, list[int]] = {}
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        #: How many texts went to the pool (a metric reads it).
        self.offloaded = 0

    def encode(self, text: str) -> list[int]:
        ready = self._ready.pop(text, None)
        if ready is not None:
            return ready
        if len(text) >= self.min_chars and _deferring.get():
            raise LargeEncode(self, text)
        return self.inner.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.inner.decode(ids)

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_load_worker,
                    # Workers are started from the thread that submits, this one.
                    initargs=(str(self.tokenizer_file), lifeline.parent_token()),
                )
            return self._pool

    async def encode_in_pool(self, text: str) -> list[int]:
        """The ids of `text`, encoded in the pool."""
        loop = asyncio.get_running_loop()
        ids = await loop.run_in_executor(self._executor(), _encode_in_worker, text)
        self.offloaded += 1
        return ids

    async def encode_off_loop(self, text: str) -> None:
        """Encode `text` in the pool; its ids wait in `_ready` for the next plan."""
        self._ready[text] = await self.encode_in_pool(text)

    def forget(self, text: str) -> None:
        """Drop ids left ready for `text` (a plan that failed after they were made)."""
        self._ready.pop(text, None)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
