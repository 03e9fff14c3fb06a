"""The Prometheus families of migration, failover and checkpoints, built from the router's views
at each scrape by ``ClusterCollector`` (same conventions: label ``replica``, never the
incarnation).

- ``session_router_sessions_migrated_total{replica,reason}``: sessions moved off the replica
  (the source), reason ∈ drain|admin|failover; every listed replica exports every reason, a dead
  one too (failover counts there), until the router forgets it.
- ``session_router_sessions_moving{replica}``: sessions moving off it now.
- ``session_router_checkpoints_written_total{replica}``,
  ``session_router_checkpoint_bytes_written_total{replica}`` and
  ``session_router_checkpoint_bytes{replica}`` (what its store holds), from its snapshot. The
  ``checkpoints`` pool itself (held, free, leaked) is in the pool families.
- With checkpoints on (the replica has a ``checkpoints`` pool):
  ``session_router_sessions_unprotected{replica}``, its open sessions of which its store holds
  no checkpoint now (its store died, or their first checkpoint is on its way), and
  ``session_router_sessions_recheckpointed_total{replica}``, sessions checkpointed again because
  a new store followed the replica (its old one died).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from replica.api import CHECKPOINT_POOL, MigrationReason
from router.control.api import ReplicaHealth, ReplicaView

MIGRATION_REASONS = tuple(reason.value for reason in MigrationReason)


def migration_families(views: Sequence[ReplicaView]) -> Iterator[Metric]:
    """The families above, from ``views`` (sorted by replica id)."""
    migrated = CounterMetricFamily(
        "session_router_sessions_migrated",
        "Sessions moved off the replica to another, by reason (drain, admin, failover).",
        labels=["replica", "reason"],
    )
    moving = GaugeMetricFamily(
        "session_router_sessions_moving",
        "Sessions moving off the replica now.",
        labels=["replica"],
    )
    written = CounterMetricFamily(
        "session_router_checkpoints_written",
        "Session checkpoints the replica wrote (one per session whose state changed).",
        labels=["replica"],
    )
    written_bytes = CounterMetricFamily(
        "session_router_checkpoint_bytes_written",
        "Bytes of the session checkpoints the replica wrote.",
        labels=["replica"],
    )
    held_bytes = GaugeMetricFamily(
        "session_router_checkpoint_bytes",
        "Bytes of session checkpoints the replica's checkpoint store holds.",
        labels=["replica"],
    )
    unprotected = GaugeMetricFamily(
        "session_router_sessions_unprotected",
        "Open sessions of the replica of which its checkpoint store holds no checkpoint now.",
        labels=["replica"],
    )
    recheckpointed = CounterMetricFamily(
        "session_router_sessions_recheckpointed",
        "Sessions checkpointed again because a new checkpoint store followed the replica.",
        labels=["replica"],
    )
    for view in views:
        rid = view.replica_id
        for reason in MIGRATION_REASONS:
            migrated.add_metric([rid, reason], view.sessions_migrated.get(reason, 0))
        if view.health == ReplicaHealth.DEAD:
            continue
        moving.add_metric([rid], view.sessions_moving)
        if view.snapshot is not None:
            stats = view.snapshot.checkpoints
            written.add_metric([rid], stats.written_total)
            written_bytes.add_metric([rid], stats.bytes_written_total)
            held_bytes.add_metric([rid], stats.bytes_held)
            if any(pool.pool == CHECKPOINT_POOL for pool in view.snapshot.pools):
                unprotected.add_metric([rid], stats.unprotected)
                recheckpointed.add_metric([rid], stats.recheckpointed_total)
    yield from (migrated, moving, written, written_bytes, held_bytes, unprotected, recheckpointed)
