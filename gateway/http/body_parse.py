"""Parse large agent bodies in a worker process, so their parse never holds this process's GIL.

A maximum-size body costs tens of milliseconds of JSON parse and pydantic validation and
conversion, much of it inside single Rust calls that no other thread can interrupt. In a
thread of the gateway process that still stalls the agent loop and the control listener
(`/health`) for the whole call; in a process it costs them nothing. So a body of at least
`GatewayOptions.parse_offload_bytes` goes, as the bytes read, to a worker (spawned on
first use, dying with the gateway: `lifeline`), which parses it exactly as the gateway
would (`parse_body`: the same functions, without the session's history cache) and checks
the prompt caps there: a body the caps refuse costs this process only the hand-over of its
bytes. What comes back is the canonical request and the body as JSON values.

The worker runs at a lower CPU priority: its work is bulk (a large body's call takes far
longer anyway), and on a busy machine the gateway's loop should win a shared core.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from gateway import lifeline
from gateway.calls.prompt_limits import (
    check_history_items,
    check_prompt_size,
    history_items,
    prompt_size,
)
from gateway.canonical import CanonicalRequest
from gateway.errors import GatewayError
from gateway.protocols import registry
from gateway.protocols.opaque_token import TokenSeal
from gateway.protocols.wire import load_object

WORKER_NICENESS = 10
"""How much lower than the gateway's the worker's CPU priority is."""


@dataclass(frozen=True)
class PromptCaps:
    """The prompt caps a parse checks (`calls.prompt_limits`; 0: none)."""

    max_messages: int
    max_chars: int


def parse_body(
    data: bytes,
    path: str,
    headers: Mapping[str, str],
    seal: TokenSeal,
    caps: PromptCaps,
) -> tuple[CanonicalRequest, dict[str, Any]]:
    """A body of the route at `path`, parsed as JSON, checked against the message cap
    before its protocol parse and the prompt caps after: (the canonical request, the
    body). Raises `GatewayError` for anything the client must fix."""
    body = load_object(data)
    check_history_items(history_items(body), caps.max_messages)
    canonical: CanonicalRequest | None = None
    for protocol in registry.PROTOCOLS:
        for route in protocol.routes:
            if route.path == path:
                canonical = route.parse(body, headers, path, None, seal)
        for counted in protocol.count_routes:
            if counted.path == path:
                canonical = counted.parse(body, headers, path, seal)
    if canonical is None:
        raise ValueError(f"no protocol route at {path}")
    check_prompt_size(prompt_size(canonical), caps.max_messages, caps.max_chars)
    return canonical, body


def _start_worker(parent: str) -> None:
    lifeline.die_with_parent(parent)
    os.nice(WORKER_NICENESS)


class BodyParser:
    """The worker process that parses large bodies (one: a session's body budget already
    admits one maximum-size body at a time, and the machine's cores are the gateway's)."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        #: How many bodies went to the worker, refused ones included.
        self.offloaded = 0

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_worker,
                    initargs=(lifeline.parent_token(),),
                )
            return self._pool

    async def parse(
        self,
        data: bytes,
        path: str,
        headers: Mapping[str, str],
        seal: TokenSeal,
        caps: PromptCaps,
    ) -> tuple[CanonicalRequest, dict[str, Any]]:
        """`parse_body` in the worker. A worker that died (killed, out of memory) is
        replaced for the next body; this one is answered with a 503."""
        loop = asyncio.get_running_loop()
        pool = self._executor()
        self.offloaded += 1
        try:
            parsed = await loop.run_in_executor(
                pool, parse_body, data, path, dict(headers), seal, caps
            )
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            raise GatewayError(
                "overloaded", "the body parser's worker died; retry", retry_after=1.0
            ) from None
        return parsed

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
