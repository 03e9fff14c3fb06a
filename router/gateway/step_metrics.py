"""The Prometheus families of the replicas' engine forwards, built from the router's views at
each scrape by ``ClusterCollector`` (label ``replica``, never the incarnation), from each live
replica's latest snapshot (``replica.api.StepStats``):

- ``session_router_engine_steps_total{replica,kind}``: forwards the engine ran, kind ∈ decode |
  prefill (a step runs a decode forward, a prefill forward, or both).
- ``session_router_engine_step_rows_total{replica,kind}``: the rows they ran (decode: turns
  that took a token; prefill: chunks folded in). Rows per step, ``rate(rows) / rate(steps)``, is
  how full the batches are: a step's fixed cost is shared by its rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, Metric

from router.control.api import ReplicaHealth, ReplicaView


def step_families(views: Sequence[ReplicaView]) -> Iterator[Metric]:
    """The families above, from ``views`` (sorted by replica id)."""
    steps = CounterMetricFamily(
        "session_router_engine_steps",
        "Forwards the replica's engine ran, by kind (decode, prefill).",
        labels=["replica", "kind"],
    )
    rows = CounterMetricFamily(
        "session_router_engine_step_rows",
        "Rows those forwards ran: decode turns that took a token, prefill chunks folded in.",
        labels=["replica", "kind"],
    )
    for view in views:
        if view.health == ReplicaHealth.DEAD or view.snapshot is None:
            continue
        rid, stats = view.replica_id, view.snapshot.steps
        steps.add_metric([rid, "decode"], stats.decode_steps_total)
        steps.add_metric([rid, "prefill"], stats.prefill_steps_total)
        rows.add_metric([rid, "decode"], stats.decode_rows_total)
        rows.add_metric([rid, "prefill"], stats.prefill_rows_total)
    yield from (steps, rows)
