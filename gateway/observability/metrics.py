"""Prometheus metrics of the Gateway, on a private registry so several apps can coexist
in one test process without colliding on the global default registry."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.observability.span_histograms import SpanHistograms

SPAN_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
SPAN_BUCKETS += (0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "rollout_gateway_calls",
            "Agent LLM calls by protocol, scene, status and prefix match kind.",
            ["protocol", "scene", "status", "match"],
            registry=self.registry,
        )
        self.errors = Counter(
            "rollout_gateway_errors",
            "Requests answered with an error, by HTTP status and error kind.",
            ["status", "kind"],
            registry=self.registry,
        )
        self.limit_refusals = Counter(
            "rollout_gateway_limit_refusals",
            "Requests refused, or connections cut, by a configured limit (its name).",
            ["limit"],
            registry=self.registry,
        )
        self.requests_stored_truncated = Counter(
            "rollout_gateway_requests_stored_truncated",
            "Calls whose raw request was recorded without the fields past "
            "max_stored_request_bytes (their size and sha256 are kept).",
            registry=self.registry,
        )
        self.new_prompt_tokens = Counter(
            "rollout_gateway_new_prompt_tokens",
            "Prompt tokens tokenized by the gateway (new parts only).",
            registry=self.registry,
        )
        self.reused_prompt_tokens = Counter(
            "rollout_gateway_reused_prompt_tokens",
            "Prompt tokens re-used from held segments instead of re-tokenized.",
            registry=self.registry,
        )
        self.sampled_tokens = Counter(
            "rollout_gateway_sampled_tokens", "Tokens sampled by engines.", registry=self.registry
        )
        self.retries_answered = Counter(
            "rollout_gateway_retries_answered",
            "Client retries answered with the call already recorded for the same request.",
            registry=self.registry,
        )
        self.sampling_overridden = Counter(
            "rollout_gateway_sampling_overridden",
            "Calls served with a pinned sampling field the agent asked otherwise, by field.",
            ["field"],
            registry=self.registry,
        )
        self.sessions_open = Gauge(
            "rollout_gateway_sessions_open",
            "Sessions open in this process.",
            registry=self.registry,
        )
        self.sessions_expired = Counter(
            "rollout_gateway_sessions_expired",
            "Sessions closed because they outlived their idle or absolute TTL.",
            ["ttl"],
            registry=self.registry,
        )
        self.engine_inflight = Gauge(
            "rollout_gateway_engine_inflight", "Engine calls in flight.", registry=self.registry
        )
        self.call_seconds = Histogram(
            "rollout_gateway_call_seconds",
            "Wall time of a call, engine included.",
            ["protocol"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.prepare_seconds = Histogram(
            "rollout_gateway_prepare_seconds",
            "Gateway CPU time to prepare a prompt (template + incremental tokenization).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=self.registry,
        )
        #: per-call spans of the model calls (`gateway.observability.spans`)
        self.spans = SpanHistograms(
            self.registry,
            wall=(
                "rollout_gateway_call_span_seconds",
                "Wall time of one span of a successful agent call (see "
                "gateway.observability.spans.SPANS); a call's spans add up to the whole time "
                "the app held it.",
            ),
            cpu=(
                "rollout_gateway_call_span_cpu_seconds",
                "Event-loop thread CPU time of one span of a successful agent call.",
            ),
            buckets=SPAN_BUCKETS,
        )
