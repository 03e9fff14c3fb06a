"""The Realtime endpoint's metrics, on the gateway's registry: the WebSocket sessions open now,
responses by how they ended, and the cancels (``response.cancel`` or a barge-in
``response.create``) that interrupted a running response."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RealtimeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = Gauge(
            "session_router_realtime_sessions",
            "Realtime WebSocket connections open now (one live session each).",
            registry=registry,
        )
        self.responses = Counter(
            "session_router_realtime_responses_total",
            "Realtime responses by status (completed, cancelled, incomplete, failed).",
            ["status"],
            registry=registry,
        )
        self.cancels = Counter(
            "session_router_realtime_cancels_total",
            "Running Realtime responses interrupted (response.cancel or a new response.create).",
            registry=registry,
        )
        self.dropped = Counter(
            "session_router_realtime_dropped_total",
            "Realtime connections closed by the server, by close code.",
            ["code"],
            registry=registry,
        )
