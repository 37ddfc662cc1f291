"""The span histograms (`observability.span_histograms`) expose on /metrics the series that
prometheus_client's own `Histogram` writes for the same observations."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.observability.metrics import SPAN_BUCKETS
from gateway.observability.span_histograms import SpanHistograms
from gateway.observability.spans import SPANS

WALL = ("rollout_gateway_call_span_seconds", "Wall time of one span.")
CPU = ("rollout_gateway_call_span_cpu_seconds", "CPU time of one span.")


def exposition(registry: CollectorRegistry) -> list[str]:
    """The /metrics lines, `_created` ones without their value (a clock reading)."""
    lines = generate_latest(registry).decode().splitlines()
    return sorted(line.rsplit(" ", 1)[0] if "_created{" in line else line for line in lines)


def test_the_series_are_those_of_prometheus_client_histograms() -> None:
    ours, reference = CollectorRegistry(), CollectorRegistry()
    spans = SpanHistograms(ours, WALL, CPU, SPAN_BUCKETS)
    wall_h, cpu_h = (
        Histogram(name, doc, ["protocol", "span"], buckets=SPAN_BUCKETS, registry=reference)
        for name, doc in (WALL, CPU)
    )
    rng = random.Random(7)
    # bounds themselves (a value on a bound counts in its bucket), past the last bound,
    # zero, and values in between
    values = [*SPAN_BUCKETS, 0.0, 500.0, 1e-6]
    for _ in range(300):
        protocol = rng.choice(["openai_chat", "anthropic_messages"])
        wall = {s: rng.choice([*values, rng.random() / 50]) for s in SPANS[rng.randrange(3) :]}
        cpu = {s: seconds / 3 for s, seconds in wall.items()}
        spans.observe(protocol, wall, cpu)
        for span, seconds in wall.items():
            wall_h.labels(protocol, span).observe(seconds)
            cpu_h.labels(protocol, span).observe(cpu[span])
    ours_lines = exposition(ours)
    assert any(line.startswith(f'{WALL[0]}_bucket{{le="+Inf"') for line in ours_lines)
    assert ours_lines == exposition(reference)
