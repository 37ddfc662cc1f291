"""Per-engine counters of one gateway process, kept by the router (`routing`) around
every call, whichever engine implementation serves it."""

from __future__ import annotations

import time

from gateway.engines.base import EngineCompletion


class EngineStats:
    """What one engine did for this gateway process: calls in flight, calls, busy time
    (seconds with at least one call in flight) and prompt tokens sent / found cached. The
    gateway's /metrics reports them per engine, so a fleet shows an idle or hot engine."""

    def __init__(self) -> None:
        self.inflight = 0
        self.calls = 0
        self.failed = 0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self._busy_s = 0.0
        self._busy_since = 0.0

    def started(self) -> None:
        if self.inflight == 0:
            self._busy_since = time.monotonic()
        self.inflight += 1

    def finished(self, completion: EngineCompletion | None) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._busy_s += time.monotonic() - self._busy_since
        if completion is None:
            self.failed += 1
            return
        self.calls += 1
        self.prompt_tokens += completion.prompt_tokens
        self.cached_prompt_tokens += completion.cached_prompt_tokens

    def busy_seconds(self) -> float:
        """Busy time so far, the current busy stretch included."""
        current = time.monotonic() - self._busy_since if self.inflight else 0.0
        return self._busy_s + current
