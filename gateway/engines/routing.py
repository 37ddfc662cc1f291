"""Which engine serves a call, and what each engine did: the `EngineRouter` in front of
one `Engine` implementation and the URLs of its servers.

Sessions are sticky: a session keeps the engine URL it was assigned (the least-loaded at
creation), so its growing prefix hits that engine's prefix cache. Every call is counted
on the engine that served it (`stats`), whatever the implementation.
"""

from __future__ import annotations

import itertools
from collections.abc import Coroutine
from typing import Any, Literal

from gateway.engines.base import (
    Engine,
    EngineCompletion,
    EngineModelInfo,
    TokenSink,
    WeightLoader,
)
from gateway.engines.stats import EngineStats
from schemas.sampling import SamplingParams

#: How calls pick an engine: `sticky` keeps a session on the engine it was assigned
#: (least-loaded at creation), so its growing prefix hits that engine's prefix cache;
#: `round_robin` sends each call to the next engine (only to compare the two).
EngineRouting = Literal["sticky", "round_robin"]


class EngineRouter:
    """Places sessions on engines, routes each call and keeps per-engine stats; the
    engine calls themselves go to `engine`. It is an `Engine` too, so the call pipeline
    holds one object."""

    def __init__(self, urls: list[str], engine: Engine, routing: EngineRouting = "sticky") -> None:
        if not urls:
            raise ValueError("EngineRouter needs at least one engine URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.engine = engine
        self.routing = routing
        self._session_url: dict[str, str] = {}
        self._load: dict[str, int] = dict.fromkeys(self.urls, 0)
        self._next = itertools.cycle(self.urls)
        self.stats: dict[str, EngineStats] = {u: EngineStats() for u in self.urls}

    # --- session placement ----------------------------------------------------------------

    def assign(self, session_id: str) -> str:
        """The engine URL for a session: its existing one, else the least-loaded (ties by order)."""
        url = self._session_url.get(session_id)
        if url is not None:
            return url
        url = min(self.urls, key=lambda u: self._load[u])  # min() keeps the first on ties
        self._session_url[session_id] = url
        self._load[url] += 1
        return url

    def release(self, session_id: str) -> None:
        """Forget a session's placement; idempotent."""
        url = self._session_url.pop(session_id, None)
        if url is not None:
            self._load[url] -= 1

    def sessions_per_url(self) -> dict[str, int]:
        return dict(self._load)

    # --- calls ----------------------------------------------------------------------------

    def route(self, url: str) -> str:
        """The engine a call goes to: the session's (`url`), or the next one under
        `round_robin`."""
        return next(self._next) if self.routing == "round_robin" else url.rstrip("/")

    def stats_for(self, url: str) -> EngineStats:
        stats = self.stats.get(url)
        if stats is None:  # an engine this process was not started with (old session meta)
            stats = self.stats[url] = EngineStats()
        return stats

    @property
    def returns_routing(self) -> bool:
        return self.engine.returns_routing

    async def complete(
        self,
        url: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        routing_from: int | None = None,
    ) -> EngineCompletion:
        """Sample on engine `url` (the session's; the next engine under `round_robin`)."""
        url = self.route(url)
        call = self.engine.complete(url, prompt_ids, sampling, routing_from)
        return await self._counted(url, call)

    async def stream(
        self,
        url: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        on_tokens: TokenSink,
        routing_from: int | None = None,
    ) -> EngineCompletion:
        """Sample like `complete`, on the engine's stream (see `Engine.stream`)."""
        url = self.route(url)
        call = self.engine.stream(url, prompt_ids, sampling, on_tokens, routing_from)
        return await self._counted(url, call)

    async def _counted(
        self, url: str, call: Coroutine[Any, Any, EngineCompletion]
    ) -> EngineCompletion:
        """Run one engine call, counted in `url`'s stats (in flight, busy, done or failed)."""
        stats = self.stats_for(url)
        stats.started()
        completion: EngineCompletion | None = None
        try:
            completion = await call
            return completion
        finally:
            stats.finished(completion)

    async def model_info(self, url: str) -> EngineModelInfo:
        return await self.engine.model_info(url)

    def weight_loader(self, url: str) -> WeightLoader:
        return self.engine.weight_loader(url)

    async def aclose(self) -> None:
        await self.engine.aclose()

    async def __aenter__(self) -> EngineRouter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
