"""The Prometheus exporter of the `serve` process (metric names: docs/observability.md).

``ClusterCollector`` turns the router's cached ``ReplicaView``s into per-replica metric families on
every scrape; it never calls an actor, so a scrape costs only the ``views_fn`` call. Series carry
the ``replica`` label and never the incarnation, so an actor's restart does not split them.
``build_registry`` wires it and the gateway's own counters and histograms
(``router.gateway.gateway_metrics``) into a fresh ``CollectorRegistry``, and ``serve_metrics``
serves it over HTTP.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from replica.api import POOL_NAMES, POOL_STATES, HistogramCounts, ReleaseReason
from router.control.api import ReplicaHealth, ReplicaView
from router.gateway.cache_metrics import state_cache_families
from router.gateway.call_error_metrics import router_call_error_family
from router.gateway.gateway_metrics import GatewayMetrics
from router.gateway.migration_metrics import migration_families
from router.gateway.step_metrics import step_families

RELEASE_REASONS = tuple(reason.value for reason in ReleaseReason)


class ClusterCollector(Collector):
    """Per-replica pool, session and health metrics built from ``views_fn()`` at scrape time.

    Every replica the router lists exports up and the session counters (all release reasons,
    0 when unknown). A live replica also exports draining, sessions_pinned and, once it has a
    snapshot, the pool gauges (the host tier's too, where it parks), sessions, parked sessions,
    parks, restores, the restore time histogram and snapshot age. A dead replica exports no gauge
    but up=0 (its last snapshot describes slots that are gone, so cluster sums count live replicas
    only), and nothing at all once the router has forgotten it (``dead_replica_retention_s``).
    """

    def __init__(self, views_fn: Callable[[], Sequence[ReplicaView]]) -> None:
        self._views_fn = views_fn

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not call ``views_fn`` (the router may not exist)."""
        return []

    def collect(self) -> Iterator[Metric]:
        views = sorted(self._views_fn(), key=lambda view: view.replica_id)
        slots = GaugeMetricFamily(
            "session_router_pool_slots",
            "Slots of a replica's pool by state, from its latest snapshot.",
            labels=["replica", "pool", "state"],
        )
        capacity = GaugeMetricFamily(
            "session_router_pool_capacity_slots",
            "Capacity of a replica's pool in slots.",
            labels=["replica", "pool"],
        )
        leaked = GaugeMetricFamily(
            "session_router_pool_leaked_slots",
            "capacity - (free + in_use + session_held + cached); must be 0.",
            labels=["replica", "pool"],
        )
        sessions = GaugeMetricFamily(
            "session_router_sessions", "Sessions the replica holds.", labels=["replica"]
        )
        pinned = GaugeMetricFamily(
            "session_router_sessions_pinned",
            "Sessions the router's table pins to the replica.",
            labels=["replica"],
        )
        opened = CounterMetricFamily(
            "session_router_sessions_opened_total",
            "Sessions opened on the replica.",
            labels=["replica"],
        )
        released = CounterMetricFamily(
            "session_router_sessions_released_total",
            "Sessions released on the replica, by reason.",
            labels=["replica", "reason"],
        )
        up = GaugeMetricFamily(
            "session_router_replica_up",
            "1 unless the router has marked the replica dead.",
            labels=["replica"],
        )
        draining = GaugeMetricFamily(
            "session_router_replica_draining",
            "1 while the replica takes no new sessions.",
            labels=["replica"],
        )
        age = GaugeMetricFamily(
            "session_router_snapshot_age_seconds",
            "Seconds since the replica's latest pool snapshot.",
            labels=["replica"],
        )
        parked = GaugeMetricFamily(
            "session_router_sessions_parked",
            "Open sessions whose state is parked in the replica's host memory.",
            labels=["replica"],
        )
        parks = CounterMetricFamily(
            "session_router_session_parks",
            "Sessions parked: their state moved from GPU slots to host memory.",
            labels=["replica"],
        )
        restores = CounterMetricFamily(
            "session_router_session_restores",
            "Parked sessions restored to GPU slots for a turn.",
            labels=["replica"],
        )
        restore_seconds = HistogramMetricFamily(
            "session_router_restore_seconds",
            "Seconds from a parked session's turn needing GPU room to its state restored "
            "(parking others to make room included).",
            labels=["replica"],
        )
        for view in views:
            rid, snap = view.replica_id, view.snapshot
            dead = view.health == ReplicaHealth.DEAD
            up.add_metric([rid], 0.0 if dead else 1.0)
            counts = dict(snap.sessions_released_total) if snap else {}
            counts["replica_lost"] = counts.get("replica_lost", 0) + view.sessions_lost
            extra = sorted(set(counts) - set(RELEASE_REASONS))
            for reason in (*RELEASE_REASONS, *extra):
                released.add_metric([rid, reason], counts.get(reason, 0))
            opened.add_metric([rid], snap.sessions_opened_total if snap else 0)
            if dead:
                continue
            is_draining = view.health == ReplicaHealth.DRAINING or bool(snap and snap.draining)
            draining.add_metric([rid], 1.0 if is_draining else 0.0)
            pinned.add_metric([rid], view.sessions_pinned)
            if math.isfinite(view.snapshot_age_s):  # a replica never heard from may report inf
                age.add_metric([rid], max(0.0, view.snapshot_age_s))
            if snap is None:
                continue
            sessions.add_metric([rid], snap.open_sessions)
            parked.add_metric([rid], snap.parking.sessions_parked)
            parks.add_metric([rid], snap.parking.parks_total)
            restores.add_metric([rid], snap.parking.restores_total)
            restore_seconds.add_metric([rid], *histogram_buckets(snap.parking.restore_seconds))
            for name in POOL_NAMES:
                try:
                    stats = snap.pool(name)
                except KeyError:
                    continue
                for state in POOL_STATES:
                    slots.add_metric([rid, name, state], getattr(stats, state))
                capacity.add_metric([rid, name], stats.capacity)
                leaked.add_metric([rid, name], stats.leaked)
        yield from (slots, capacity, leaked, sessions, pinned, opened, released, up, draining, age)
        yield from (parked, parks, restores, restore_seconds)
        yield from migration_families(views)
        yield from state_cache_families(views)
        yield from step_families(views)
        yield from router_call_error_family(views)


def histogram_buckets(counts: HistogramCounts) -> tuple[list[tuple[str, float]], float]:
    """A replica's ``HistogramCounts`` as Prometheus buckets (with ``+Inf``) and sum."""
    buckets = [(repr(float(b)), float(n)) for b, n in zip(counts.bounds, counts.buckets)]
    return [*buckets, ("+Inf", float(counts.count))], counts.total


def build_registry(
    views_fn: Callable[[], Sequence[ReplicaView]] | None,
) -> tuple[CollectorRegistry, GatewayMetrics]:
    """A fresh registry (no process/platform collectors) with the gateway's metrics, and the
    cluster's per-replica metrics from ``views_fn`` when given."""
    registry = CollectorRegistry(auto_describe=False)
    if views_fn is not None:
        registry.register(ClusterCollector(views_fn))
    return registry, GatewayMetrics(registry)


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running /metrics endpoint; ``close()`` stops it and frees the port."""

    server: WSGIServer
    thread: threading.Thread
    addr: str

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.addr in ("0.0.0.0", "") else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(port: int, registry: CollectorRegistry, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve ``registry`` on http://addr:port/metrics in a daemon thread (port 0: any free one)."""
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread, addr)
