"""The /metrics exposition: docs/observability.md's names and labels, values from real
snapshots, promtool."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import urllib.request

import pytest
from prometheus_client import generate_latest

from router.control.api import ReplicaHealth
from router.gateway.metrics import RELEASE_REASONS, build_registry, serve_metrics
from tests.support.metrics import cluster_views, parse_samples, select

CLUSTER_FAMILIES = {
    "session_router_pool_slots": "gauge",
    "session_router_pool_capacity_slots": "gauge",
    "session_router_pool_leaked_slots": "gauge",
    "session_router_sessions": "gauge",
    "session_router_sessions_pinned": "gauge",
    "session_router_sessions_opened_total": "counter",
    "session_router_sessions_released_total": "counter",
    "session_router_replica_up": "gauge",
    "session_router_replica_draining": "gauge",
    "session_router_snapshot_age_seconds": "gauge",
    "session_router_sessions_parked": "gauge",
    "session_router_session_parks_total": "counter",
    "session_router_session_restores_total": "counter",
    "session_router_restore_seconds": "histogram",
    "session_router_sessions_migrated_total": "counter",
    "session_router_sessions_moving": "gauge",
    "session_router_checkpoints_written_total": "counter",
    "session_router_checkpoint_bytes_written_total": "counter",
    "session_router_checkpoint_bytes": "gauge",
    "session_router_cached_states": "gauge",
    "session_router_state_cache_lookups_total": "counter",
    "session_router_state_cache_evictions_total": "counter",
    "session_router_state_cache_reused_tokens_total": "counter",
    "session_router_sessions_unprotected": "gauge",
    "session_router_sessions_recheckpointed_total": "counter",
    "session_router_engine_steps_total": "counter",
    "session_router_engine_step_rows_total": "counter",
}
GATEWAY_FAMILIES = {
    "session_router_rpc_requests_total": "counter",
    "session_router_rpc_duration_seconds": "histogram",
    "session_router_time_to_first_token_seconds": "histogram",
    "session_router_generated_tokens_total": "counter",
    "session_router_open_rejected_total": "counter",
}


@pytest.fixture
def exposition() -> str:
    registry, gateway = build_registry(cluster_views)
    gateway.observe_rpc("OpenSession", "OK", 0.004)
    gateway.observe_rpc("OpenSession", "RESOURCE_EXHAUSTED", 2.0)
    gateway.observe_rpc("Generate", "OK", 0.3)
    gateway.observe_first_token(0.02)
    gateway.add_generated_tokens(17)
    gateway.open_rejected_for("no_room")
    return generate_latest(registry).decode()


def test_types_and_exposed_names_are_designs(exposition):
    types = {}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
    for name, kind in {**CLUSTER_FAMILIES, **GATEWAY_FAMILIES}.items():
        assert types.get(name) == kind, f"{name}: {types.get(name)}"
    samples = parse_samples(exposition)
    names = {name for name, _ in samples}
    assert "session_router_sessions_opened_total" in names
    assert "session_router_sessions_released_total" in names
    assert "session_router_generated_tokens_total" in names
    assert not any(name.endswith("_total_total") for name in names)


def test_values_come_from_the_snapshots(exposition):
    samples = parse_samples(exposition)
    held = select(samples, "session_router_pool_slots", pool="mamba", state="session_held")
    assert sum(held) == 18
    assert select(
        samples, "session_router_pool_slots", replica="replica-a", pool="kv_tokens", state="free"
    ) == [3000]
    assert sum(select(samples, "session_router_pool_slots", state="cached")) == 0
    assert select(
        samples, "session_router_pool_capacity_slots", replica="replica-b", pool="req"
    ) == [8]
    assert select(
        samples, "session_router_pool_leaked_slots", replica="replica-b", pool="mamba"
    ) == [2]
    assert sum(select(samples, "session_router_pool_leaked_slots")) == 2
    assert sum(select(samples, "session_router_sessions_pinned")) == 12
    assert select(samples, "session_router_sessions", replica="replica-a") == [8]
    assert select(samples, "session_router_sessions_opened_total", replica="replica-b") == [9]
    for replica in ("replica-a", "replica-b", "replica-c"):
        reasons = {
            dict(items)["reason"]
            for name, items in samples
            if name == "session_router_sessions_released_total" and ("replica", replica) in items
        }
        assert reasons == set(RELEASE_REASONS)
    assert select(
        samples, "session_router_sessions_released_total", replica="replica-a", reason="closed"
    ) == [4]
    assert select(
        samples,
        "session_router_sessions_released_total",
        replica="replica-c",
        reason="replica_lost",
    ) == [6]
    assert select(samples, "session_router_snapshot_age_seconds", replica="replica-b") == [1.5]


def test_migration_and_checkpoint_metrics_come_from_the_views(exposition):
    """Moves are counted on the replica sessions left (every reason on every listed replica,
    a dead one's failovers too); checkpoint totals and the checkpoints pool come from each live
    replica's snapshot."""
    samples = parse_samples(exposition)
    migrated = "session_router_sessions_migrated_total"
    for replica in ("replica-a", "replica-b", "replica-c"):
        assert len(select(samples, migrated, replica=replica)) == 3
    assert select(samples, migrated, replica="replica-b", reason="drain") == [3]
    assert select(samples, migrated, replica="replica-c", reason="failover") == [5]
    assert select(samples, migrated, replica="replica-a", reason="failover") == [0]
    assert select(samples, "session_router_sessions_moving", replica="replica-b") == [2]
    assert select(samples, "session_router_sessions_moving", replica="replica-c") == []
    written = "session_router_checkpoints_written_total"
    assert select(samples, written, replica="replica-a") == [40]
    assert select(samples, written, replica="replica-b") == [0]  # it does not checkpoint
    assert select(
        samples, "session_router_checkpoint_bytes_written_total", replica="replica-a"
    ) == [4_000_000]
    assert select(samples, "session_router_checkpoint_bytes", replica="replica-a") == [800_000]
    assert select(
        samples, "session_router_pool_slots", replica="replica-a", pool="checkpoints"
    ) == [10, 0, 8, 0]
    # sessions without a checkpoint: only where checkpoints are on (replica-b has no such pool)
    assert select(samples, "session_router_sessions_unprotected", replica="replica-a") == [2]
    assert select(samples, "session_router_sessions_unprotected", replica="replica-b") == []
    recheckpointed = "session_router_sessions_recheckpointed_total"
    assert select(samples, recheckpointed, replica="replica-a") == [6]


def test_state_cache_metrics_come_from_the_snapshots(exposition):
    """Cached states, lookups by result, evictions and reused prefix tokens, per live replica
    with a snapshot (a replica without a cache exports zeros)."""
    samples = parse_samples(exposition)
    assert select(samples, "session_router_cached_states", replica="replica-a") == [2]
    assert select(samples, "session_router_cached_states", replica="replica-b") == [0]
    lookups = "session_router_state_cache_lookups_total"
    assert select(samples, lookups, replica="replica-a", result="hit") == [5]
    assert select(samples, lookups, replica="replica-a", result="miss") == [3]
    assert select(samples, "session_router_state_cache_evictions_total", replica="replica-a") == [1]
    assert select(
        samples, "session_router_state_cache_reused_tokens_total", replica="replica-a"
    ) == [4000]
    assert select(samples, "session_router_cached_states", replica="replica-c") == []  # dead


def test_engine_step_metrics_come_from_the_snapshots(exposition):
    """Forwards and their rows by kind, from each live replica's snapshot (a replica that has
    run none exports zeros; a dead one nothing)."""
    samples = parse_samples(exposition)
    steps, rows = "session_router_engine_steps_total", "session_router_engine_step_rows_total"
    assert select(samples, steps, replica="replica-a", kind="decode") == [120]
    assert select(samples, rows, replica="replica-a", kind="decode") == [960]
    assert select(samples, steps, replica="replica-a", kind="prefill") == [30]
    assert select(samples, rows, replica="replica-a", kind="prefill") == [45]
    assert select(samples, steps, replica="replica-b", kind="decode") == [0]
    assert select(samples, steps, replica="replica-c", kind="decode") == []  # dead


def test_parking_metrics_come_from_the_snapshots(exposition):
    """Host pools join the pool gauges; parked sessions, parks, restores and the restore time
    histogram (cumulative buckets, +Inf = count) come from each replica's snapshot."""
    samples = parse_samples(exposition)
    assert select(samples, "session_router_pool_slots", replica="replica-a", pool="host_mamba") == [
        7,
        0,
        3,
        0,
    ]
    assert select(
        samples, "session_router_pool_capacity_slots", replica="replica-a", pool="host_kv_tokens"
    ) == [640]
    assert (
        select(samples, "session_router_pool_slots", replica="replica-b", pool="host_mamba") == []
    )
    assert select(samples, "session_router_sessions_parked", replica="replica-a") == [3]
    assert select(samples, "session_router_sessions_parked", replica="replica-b") == [0]
    assert select(samples, "session_router_session_parks_total", replica="replica-a") == [7]
    assert select(samples, "session_router_session_restores_total", replica="replica-a") == [4]
    buckets = {
        dict(items)["le"]: value
        for (name, items), value in samples.items()
        if name == "session_router_restore_seconds_bucket" and ("replica", "replica-a") in items
    }
    assert buckets == {"0.001": 1, "0.01": 3, "0.1": 4, "+Inf": 4}
    assert select(samples, "session_router_restore_seconds_sum", replica="replica-a") == [0.0125]
    assert select(samples, "session_router_restore_seconds_count", replica="replica-a") == [4]


def test_health_and_dead_replica_without_snapshot(exposition):
    samples = parse_samples(exposition)
    up = {
        r: select(samples, "session_router_replica_up", replica=r)
        for r in ("replica-a", "replica-b", "replica-c")
    }
    assert up == {"replica-a": [1], "replica-b": [1], "replica-c": [0]}
    draining = {
        r: select(samples, "session_router_replica_draining", replica=r)
        for r in ("replica-a", "replica-b", "replica-c")
    }
    assert draining == {"replica-a": [0], "replica-b": [1], "replica-c": []}
    assert select(samples, "session_router_pool_slots", replica="replica-c") == []
    assert select(samples, "session_router_snapshot_age_seconds", replica="replica-c") == []


def test_a_dead_replica_exports_up_and_counters_only():
    """Issue 8: a dead replica's last gauges stayed in /metrics forever, inflating cluster-wide
    free-slot sums and firing the pinned-vs-held alert next to ReplicaDown."""
    views = cluster_views()
    alive = parse_samples(generate_latest(build_registry(lambda: views)[0]).decode())
    healthy = views[0]
    views[0] = dataclasses.replace(healthy, health=ReplicaHealth.DEAD)
    samples = parse_samples(generate_latest(build_registry(lambda: views)[0]).decode())
    names = {name for (name, items) in samples if ("replica", "replica-a") in items}
    assert names == {
        "session_router_replica_up",
        "session_router_sessions_opened_total",
        "session_router_sessions_released_total",
        "session_router_sessions_migrated_total",
    }
    assert select(samples, "session_router_replica_up", replica="replica-a") == [0]
    free = sum(select(samples, "session_router_pool_slots", pool="mamba", state="free"))
    assert free == sum(select(alive, "session_router_pool_slots", pool="mamba", state="free")) - 6
    views.pop(0)  # the router forgot it: nothing of it is left
    gone = parse_samples(generate_latest(build_registry(lambda: views)[0]).decode())
    assert not [key for key in gone if ("replica", "replica-a") in key[1]]


def test_gateway_metrics(exposition):
    samples = parse_samples(exposition)
    assert select(samples, "session_router_rpc_requests_total", method="OpenSession") == [1, 1]
    assert select(samples, "session_router_rpc_duration_seconds_count", method="OpenSession") == [2]
    assert select(
        samples, "session_router_rpc_duration_seconds_bucket", method="Generate", le="0.0005"
    ) == [0]
    assert select(
        samples, "session_router_rpc_duration_seconds_bucket", method="Generate", le="60.0"
    ) == [1]
    assert select(samples, "session_router_time_to_first_token_seconds_count") == [1]
    assert select(samples, "session_router_generated_tokens_total") == [17]
    assert select(samples, "session_router_open_rejected_total", reason="no_room") == [1]


def test_promtool_check_metrics_passes(exposition):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail(
            "promtool not found on PATH; install Debian's prometheus package "
            "(sudo .ci/install-system.sh, or apt-get install -y prometheus)"
        )
    result = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"promtool check metrics:\n{result.stdout}\n{result.stderr}"


def test_each_scrape_reads_the_views_and_registering_does_not():
    calls = []

    def views():
        calls.append(1)
        return cluster_views()[: len(calls)]

    registry, _ = build_registry(views)
    assert calls == []
    first = parse_samples(generate_latest(registry).decode())
    second = parse_samples(generate_latest(registry).decode())
    assert len(select(first, "session_router_replica_up")) == 1
    assert len(select(second, "session_router_replica_up")) == 2


def test_served_over_http():
    registry, gateway = build_registry(cluster_views)
    gateway.add_generated_tokens(5)
    server = serve_metrics(0, registry)
    try:
        assert server.port > 0
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert response.status == 200
            text = response.read().decode()
    finally:
        server.close()
    samples = parse_samples(text)
    assert select(samples, "session_router_generated_tokens_total") == [5]
    assert select(samples, "session_router_replica_up", replica="replica-c") == [0]
