"""The Prometheus family of the router's replica calls that raised, built from the router's views
at each scrape by ``ClusterCollector`` (label ``replica``, never the incarnation).

- ``session_router_router_call_errors_total{replica,method,kind}``: the router's calls to the
  replica (opens, moves, imports of a failover, health probes) that raised, by the kind
  ``router.call_errors`` read (application|transient|dead), or ``object_lost`` for an export
  whose object an importing target could not fetch (counted on the source, which is blamed). A
  failed health probe is counted ``dead`` (it fences, whatever it raised). Only the series that
  happened are exported; a replica's go when the router forgets it.

The gateway's own calls are counted in ``session_router_replica_call_errors_total{method,kind}``
(``GatewayMetrics``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, Metric

from router.control.api import ReplicaView


def router_call_error_family(views: Sequence[ReplicaView]) -> Iterator[Metric]:
    errors = CounterMetricFamily(
        "session_router_router_call_errors",
        "The router's calls to the replica that raised, by method and kind "
        "(application, transient, dead, object_lost).",
        labels=["replica", "method", "kind"],
    )
    for view in views:
        for (method, kind), count in sorted(view.call_errors.items()):
            errors.add_metric([view.replica_id, method, kind], count)
    yield errors
