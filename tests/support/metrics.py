"""Shared by the metrics and top tests: replica views built from real snapshots, and a parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from replica.api import (
    CheckpointStats,
    HistogramCounts,
    ParkingStats,
    PoolSnapshot,
    PoolStats,
    StateCacheStats,
    StepStats,
)
from router.control.api import ReplicaHealth, ReplicaView


def cluster_views() -> list[ReplicaView]:
    """Three replicas: healthy (parking 3 sessions, checkpointing 8), draining (with 2 leaked
    mamba slots, no parking, 2 sessions moving off it), dead without a snapshot (5 of its
    sessions restored elsewhere from checkpoints, 6 lost)."""
    healthy = PoolSnapshot(
        "replica-a",
        "inc-1",
        (
            PoolStats("mamba", 16, 6, 2, 8),
            PoolStats("kv_tokens", 4096, 3000, 96, 1000),
            PoolStats("req", 8, 3, 1, 4),
            PoolStats("host_mamba", 10, 7, 0, 3),
            PoolStats("host_kv_tokens", 640, 448, 0, 192),
            PoolStats("checkpoints", 18, 10, 0, 8),
        ),
        open_sessions=8,
        running_requests=1,
        waiting_requests=0,
        taken_at=100.0,
        sessions_opened_total=15,
        sessions_released_total={"closed": 4, "stream_ended": 2, "idle_timeout": 1},
        parking=ParkingStats(3, 7, 4, HistogramCounts((0.001, 0.01, 0.1), (1, 3, 4), 4, 0.0125)),
        checkpoints=CheckpointStats(40, 4_000_000, 800_000, unprotected=2, recheckpointed_total=6),
        state_cache=StateCacheStats(2, 8, 5, 3, 1, 4000, 64, frozenset({11, 12})),
        steps=StepStats(120, 960, 30, 45),
    )
    draining = PoolSnapshot(
        "replica-b",
        "inc-7",
        (
            PoolStats("mamba", 16, 4, 0, 10),
            PoolStats("kv_tokens", 4096, 3896, 0, 200),
            PoolStats("req", 8, 3, 0, 5),
        ),
        open_sessions=5,
        running_requests=0,
        waiting_requests=0,
        taken_at=100.0,
        draining=True,
        sessions_opened_total=9,
        sessions_released_total={"closed": 3, "aborted": 1},
    )
    return [
        ReplicaView(
            "replica-a", "node-1", ReplicaHealth.HEALTHY, healthy, 0.25, 8, 2, 64,
            sessions_migrated={"admin": 1},
        ),
        ReplicaView(
            "replica-b", "node-2", ReplicaHealth.DRAINING, draining, 1.5, 4, 2, 64,
            sessions_migrated={"drain": 3}, sessions_moving=2,
        ),
        ReplicaView(
            "replica-c", "node-3", ReplicaHealth.DEAD, None, float("inf"), 0, 2, 64,
            sessions_lost=6, sessions_migrated={"failover": 5},
        ),
    ]  # fmt: skip


def parse_samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of label items): value} of an exposition."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def select(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> list[float]:
    """Values of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return [
        value for (sample, items), value in samples.items() if sample == name and wanted <= items
    ]
