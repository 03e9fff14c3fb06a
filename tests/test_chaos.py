"""A short run of the fault-injection soak (``bench/chaos.py``): misbehaving sessions while a
replica, the router and a checkpoint store are SIGKILLed; the cluster must heal to --replicas
healthy replicas with no session lost or doubled, every pool at capacity, 0 leaked, an empty
router table, only live replicas in /metrics, and every session completed or ended with a
documented status code, no call hung."""

from __future__ import annotations

from bench.chaos import ChaosConfig, run_chaos


def test_short_chaos_run_heals_with_nothing_doubled_or_leaked(ray_cluster):
    config = ChaosConfig(sessions=120, concurrency=12, replica_kills=1, router_kills=1, seed=3)
    report = run_chaos(config, namespace="chaos-test")
    print("\n".join(report.lines()))
    assert not report.problems, report.problems
    assert not report.doubled
    assert report.lost == 0  # checkpoints on: a replica's death costs no session
    assert len(report.heal_s["store"]) == 1  # its store SIGKILLed too, and replaced
    assert sum(report.tally.sessions.values()) == config.sessions
    assert len(report.heal_s["replica"]) == 1 and len(report.heal_s["router"]) == 1
    assert report.tally.faults["bad inputs"] and report.tally.faults["client cancels"]
    assert report.replaced >= 1
