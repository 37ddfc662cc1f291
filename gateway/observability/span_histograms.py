"""The per-call span histograms (wall and event-loop CPU seconds, by protocol and span) as
one collector of plain bucket counts.

Each model call observes every span twice; as prometheus_client `Histogram` children
that was a lock, a walk over the buckets and a locked counter per observation, about a
tenth of a millisecond of the event loop per call. Here a call's spans are counted under
one lock with a binary search each, and the series read on `/metrics` are the same: the
`_bucket`, `_count`, `_sum` and `_created` samples of two histograms labelled
`protocol` and `span`.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class _Series:
    """One (protocol, span): per histogram (wall, CPU), the counts per bucket (the last
    past every bound) and the sum."""

    __slots__ = ("counts", "created", "sums")

    def __init__(self, buckets: int) -> None:
        self.counts = ([0] * (buckets + 1), [0] * (buckets + 1))
        self.sums = [0.0, 0.0]
        self.created = time.time()


class SpanHistograms(Collector):
    """`wall` (`wall_doc`) and `cpu` (`cpu_doc`): the names of the two histograms, with
    upper bounds `buckets`; registered on `registry`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        wall: tuple[str, str],
        cpu: tuple[str, str],
        buckets: Sequence[float],
    ) -> None:
        self._names = (wall, cpu)
        self._bounds = tuple(buckets)
        self._labels = (*(floatToGoString(b) for b in self._bounds), "+Inf")
        self._series: dict[tuple[str, str], _Series] = {}
        # observed on the agent loop, collected on the control listener's thread
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, protocol: str, wall: Mapping[str, float], cpu: Mapping[str, float]) -> None:
        """One finished call's spans (wall and CPU seconds by span name)."""
        bounds = self._bounds
        with self._lock:
            for span, seconds in wall.items():
                series = self._series.get((protocol, span))
                if series is None:
                    series = self._series[(protocol, span)] = _Series(len(bounds))
                used = cpu.get(span, 0.0)
                series.counts[0][bisect_left(bounds, seconds)] += 1
                series.counts[1][bisect_left(bounds, used)] += 1
                series.sums[0] += seconds
                series.sums[1] += used

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [
                (key, (s.counts[0][:], s.counts[1][:]), s.sums[:], s.created)
                for key, s in self._series.items()
            ]
        for which, (name, doc) in enumerate(self._names):
            family = HistogramMetricFamily(name, doc, labels=("protocol", "span"))
            for (protocol, span), counts_of, sums, created in rows:
                counts, total = counts_of[which], sums[which]
                cumulative, buckets = 0, []
                for label, count in zip(self._labels, counts, strict=True):
                    cumulative += count
                    buckets.append((label, float(cumulative)))
                family.add_metric([protocol, span], buckets, total)
                labels = {"protocol": protocol, "span": span}
                family.samples.append(Sample(f"{name}_created", labels, created))
            yield family
