"""Metrics of a gateway process under load: how late its event loop runs, what each
engine does for it, and how many texts were tokenized off the loop.

Event-loop lag is what every call on the process pays for work done inline (parsing,
templating, tokenizing): a task that asks to wake every `interval_s` and notes how much
later it woke. The per-engine figures come from `EngineRouter.stats`, read at scrape time.
"""

import asyncio
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.engines.routing import EngineRouter
from gateway.prompt.incremental import Tokenizer
from gateway.prompt.tokenize_pool import OffloadingTokenizer

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


LAG_INTERVAL_S = 0.5
"""Two samples a second: enough for the histogram's mean and quantiles over a run of
tens of seconds, and each wakeup is event-loop CPU that a call waiting on its engine pays
for (at 0.05 s the probe cost a call waiting 200 ms about 0.5 ms)."""


class LoopLagMonitor:
    """Samples the event loop's lag every `interval_s` into a histogram."""

    def __init__(self, registry: CollectorRegistry, interval_s: float = LAG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lag = Histogram(
            "rollout_gateway_event_loop_lag_seconds",
            "How much later than asked the event loop woke a sleeping task.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )

    async def run(self) -> None:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(self.interval_s)
            self.lag.observe(max(0.0, time.monotonic() - asked - self.interval_s))


class EngineCollector(Collector):
    """Per-engine gauges and counters of one gateway process, labelled by engine URL."""

    def __init__(self, engine: EngineRouter, tokenizer: Tokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer

    def collect(self) -> Iterator[Metric]:
        label = ["engine"]
        sessions = GaugeMetricFamily(
            "rollout_gateway_engine_sessions", "Sessions assigned to each engine.", labels=label
        )
        inflight = GaugeMetricFamily(
            "rollout_gateway_engine_calls_inflight", "Calls in flight per engine.", labels=label
        )
        calls = CounterMetricFamily(
            "rollout_gateway_engine_calls", "Engine calls by engine and outcome.",
            labels=["engine", "outcome"],
        )  # fmt: skip
        busy = CounterMetricFamily(
            "rollout_gateway_engine_busy_seconds",
            "Seconds with at least one call of this process in flight on the engine.",
            labels=label,
        )
        prompt = CounterMetricFamily(
            "rollout_gateway_engine_prompt_tokens", "Prompt tokens sent per engine.", labels=label
        )
        cached = CounterMetricFamily(
            "rollout_gateway_engine_cached_prompt_tokens",
            "Prompt tokens the engine reported as served from its prefix cache.",
            labels=label,
        )
        assigned = self.engine.sessions_per_url()
        for url, stats in self.engine.stats.items():
            sessions.add_metric([url], assigned.get(url, 0))
            inflight.add_metric([url], stats.inflight)
            calls.add_metric([url, "ok"], stats.calls)
            calls.add_metric([url, "failed"], stats.failed)
            busy.add_metric([url], stats.busy_seconds())
            prompt.add_metric([url], stats.prompt_tokens)
            cached.add_metric([url], stats.cached_prompt_tokens)
        yield from (sessions, inflight, calls, busy, prompt, cached)
        offloaded = CounterMetricFamily(
            "rollout_gateway_offloaded_encodes",
            "Texts tokenized in the tokenizer pool instead of on the event loop.",
        )
        tok = self.tokenizer
        offloaded.add_metric([], tok.offloaded if isinstance(tok, OffloadingTokenizer) else 0)
        yield offloaded
