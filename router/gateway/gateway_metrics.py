"""``GatewayMetrics``: the gateway's own counters and histograms (metric names:
docs/observability.md): its gRPC calls by method and code, time to first token, tokens streamed,
refused opens and failed replica calls.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from replica.api import StatusCode

RPC_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """The gateway's own metrics, registered on ``registry`` (once per registry). Thread-safe."""

    __slots__ = (
        "rpc_requests",
        "rpc_duration",
        "time_to_first_token",
        "generated_tokens",
        "open_rejected",
        "replica_call_errors",
        "_rpc_children",
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rpc_requests = Counter(
            "session_router_rpc_requests_total",
            "gRPC calls handled, by method and status code.",
            ["method", "code"],
            registry=registry,
        )
        self.rpc_duration = Histogram(
            "session_router_rpc_duration_seconds",
            "gRPC call duration in seconds (streams: to the last chunk).",
            ["method"],
            buckets=RPC_BUCKETS,
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "session_router_time_to_first_token_seconds",
            "Seconds from a turn's submission to its first token.",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.generated_tokens = Counter(
            "session_router_generated_tokens_total",
            "Tokens streamed to clients.",
            registry=registry,
        )
        self._rpc_children: dict[tuple[str, StatusCode], tuple] = {}
        self.open_rejected = Counter(
            "session_router_open_rejected_total",
            "OpenSession calls refused, by reason.",
            ["reason"],
            registry=registry,
        )
        self.replica_call_errors = Counter(
            "session_router_replica_call_errors_total",
            "Calls of this gateway to a replica that raised, by method and kind "
            "(application: the replica raised; transient: retried, then UNAVAILABLE; dead).",
            ["method", "kind"],
            registry=registry,
        )

    def observe_rpc(self, method: str, code: StatusCode, seconds: float) -> None:
        """Count one finished call (label ``code``: the status name, e.g. "OK")."""
        children = self._rpc_children.get((method, code))
        if children is None:  # labels() takes a lock and a lookup: once per method and code
            children = self._rpc_children[method, code] = (
                self.rpc_requests.labels(method=method, code=StatusCode(code).value),
                self.rpc_duration.labels(method=method),
            )
        children[0].inc()
        children[1].observe(max(0.0, seconds))

    def observe_first_token(self, seconds: float) -> None:
        self.time_to_first_token.observe(max(0.0, seconds))

    def add_generated_tokens(self, count: int) -> None:
        if count > 0:
            self.generated_tokens.inc(count)

    def open_rejected_for(self, reason: str) -> None:
        """Count one refused OpenSession (e.g. reason="no_room", "no_replicas", "timeout")."""
        self.open_rejected.labels(reason=reason).inc()

    def replica_call_failed(self, method: str, kind: str) -> None:
        """Count one replica call that raised (kind: "application", "transient" or "dead")."""
        self.replica_call_errors.labels(method=method, kind=kind).inc()
