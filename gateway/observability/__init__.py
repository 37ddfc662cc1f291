"""Observability: the Prometheus metrics, the per-call spans and the load gauges
(event-loop lag, per-engine stats).

It must not import the HTTP app, calls, sessions or capture: they report into it.
"""
