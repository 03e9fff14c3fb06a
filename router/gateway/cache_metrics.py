"""The Prometheus families of the replicas' caches of states at turn boundaries, built from the
router's views at each scrape by ``ClusterCollector`` (label ``replica``, never the
incarnation), from each live replica's latest snapshot (``replica.api.StateCacheStats``):

- ``session_router_cached_states{replica}``: states cached now (each holds one mamba slot; the
  slots and KV pages they hold are the ``cached`` state of the pool families).
- ``session_router_state_cache_lookups_total{replica,result}``: opens with a prefix, result ∈
  hit (started from a cached state) | miss.
- ``session_router_state_cache_evictions_total{replica}``: cached states evicted (room needed,
  or the cache full).
- ``session_router_state_cache_reused_tokens_total{replica}``: prefix tokens taken from cached
  states, which were never prefilled.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from router.control.api import ReplicaHealth, ReplicaView


def state_cache_families(views: Sequence[ReplicaView]) -> Iterator[Metric]:
    """The families above, from ``views`` (sorted by replica id)."""
    cached = GaugeMetricFamily(
        "session_router_cached_states",
        "States the replica keeps at turn boundaries for new sessions with a prefix.",
        labels=["replica"],
    )
    lookups = CounterMetricFamily(
        "session_router_state_cache_lookups",
        "Opens with a prefix, by whether they started from a cached state (hit) or not (miss).",
        labels=["replica", "result"],
    )
    evictions = CounterMetricFamily(
        "session_router_state_cache_evictions",
        "Cached states the replica evicted (least recently used first).",
        labels=["replica"],
    )
    reused = CounterMetricFamily(
        "session_router_state_cache_reused_tokens",
        "Prefix tokens new sessions took from cached states instead of prefilling them.",
        labels=["replica"],
    )
    for view in views:
        if view.health == ReplicaHealth.DEAD or view.snapshot is None:
            continue
        rid, stats = view.replica_id, view.snapshot.state_cache
        cached.add_metric([rid], stats.cached_states)
        lookups.add_metric([rid, "hit"], stats.hits_total)
        lookups.add_metric([rid, "miss"], stats.misses_total)
        evictions.add_metric([rid], stats.evictions_total)
        reused.add_metric([rid], stats.reused_tokens_total)
    yield from (cached, lookups, evictions, reused)
