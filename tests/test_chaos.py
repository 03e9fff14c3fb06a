"""A short run of the fault-injection soak (``bench/chaos.py``): misbehaving sessions while a
replica, the router and a checkpoint store are SIGKILLed, a replica is SIGSTOPped, a migration's
target and a draining replica die part-way; the cluster must heal to --replicas healthy replicas
with no session lost or doubled, every pool at capacity, 0 leaked, an empty router table, only
live replicas in /metrics, and every session completed or ended with a documented status code, no
call hung."""

from __future__ import annotations

from bench.chaos import ChaosConfig, run_chaos
from bench.chaos_faults import KINDS


def test_short_chaos_run_heals_with_nothing_lost_or_leaked(ray_cluster):
    config = ChaosConfig(
        sessions=160,
        concurrency=12,
        replica_kills=1,
        router_kills=1,
        store_kills=1,
        replica_stops=1,
        migration_kills=1,
        drain_kills=1,
        seed=3,
    )
    report = run_chaos(config, namespace="chaos-test")
    print("\n".join(report.lines()))
    assert not report.problems, report.problems
    assert report.lost == 0 and not report.doubled
    assert sum(report.tally.sessions.values()) == config.sessions
    assert all(len(report.heal_s[kind]) == 1 for kind in KINDS), report.heal_s
    assert report.tally.faults["bad inputs"] and report.tally.faults["client cancels"]
    assert report.replaced >= 1
