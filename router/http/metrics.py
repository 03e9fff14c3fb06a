"""The front door's metrics, on the gateway's registry: requests by route and status, their
duration, prompt tokens and the part of them reused from a held state (not prefilled). Time to
first token and generated tokens are the gateway's own (every turn goes through it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from router.http.realtime_metrics import RealtimeMetrics

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "session_router_http_requests_total",
            "HTTP requests of the OpenAI-compatible front door, by route and status.",
            ["route", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "session_router_http_request_duration_seconds",
            "HTTP request duration in seconds (streams: to the last event), by route.",
            ["route"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "session_router_http_prompt_tokens_total",
            "Prompt tokens of front-door turns, by route.",
            ["route"],
            registry=registry,
        )
        self.cached_tokens = Counter(
            "session_router_http_cached_prompt_tokens_total",
            "Prompt tokens of front-door turns taken from a held state instead of prefilled.",
            ["route"],
            registry=registry,
        )
        self.realtime = RealtimeMetrics(registry)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.duration.labels(route).observe(seconds)

    def observe_prompt(self, route: str, tokens: int, cached: int) -> None:
        self.prompt_tokens.labels(route).inc(tokens)
        self.cached_tokens.labels(route).inc(cached)
