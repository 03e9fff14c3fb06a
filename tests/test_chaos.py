"""A short run of the fault-injection soak (``bench/chaos.py``, its ``--quick``): misbehaving
sessions while a replica, the router and a checkpoint store are SIGKILLed, a replica is
SIGSTOPped until the router fences it and then continued, a migration's target is SIGKILLed while
the session moves and a replica is SIGKILLed while it drains, each fault on something it can
hit; the cluster must heal to --replicas healthy replicas with no session lost or doubled, every
pool at capacity, 0 leaked, an empty router table, only live replicas in /metrics, and every
session completed or ended with a documented status code, no call hung."""

from __future__ import annotations

from bench.chaos import QUICK, ChaosConfig, run_chaos


def test_every_fault_lands_and_the_cluster_heals_with_nothing_lost_or_leaked(ray_cluster):
    config = ChaosConfig(**QUICK)
    report = run_chaos(config, namespace="chaos-test")
    print("\n".join(report.lines()))
    assert not report.problems, report.problems
    # each fault landed on something: sessions, checkpoints, a move or a drain in flight
    for kind, asked in config.counts.items():
        assert report.landed(kind) == asked, (kind, report.hits[kind])
        assert len(report.heal_s[kind]) >= asked, kind
    assert report.lost == 0  # checkpoints on: a replica's death costs no session
    assert not report.doubled and report.leaked == 0
    assert sum(report.tally.sessions.values()) >= config.sessions
    assert report.tally.faults["bad inputs"] and report.tally.faults["client cancels"]
    assert report.replaced >= 1
