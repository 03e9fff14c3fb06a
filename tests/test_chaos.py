"""A short run of the fault-injection soak (``bench/chaos.py``, its ``--quick`` but for the
SIGSTOP and the drain kill): misbehaving sessions while a replica, the router and a checkpoint
store are SIGKILLed and a migration's target is SIGKILLed while the session moves, each fault on
something it can hit; the cluster must heal to --replicas healthy replicas with no session lost
or doubled, every pool at capacity, 0 leaked, an empty router table, only live replicas in
/metrics, and every session completed or ended with a documented status code, no call hung. The
SIGSTOP of a replica and the SIGKILL of a draining one are left out: with them the run took
261 s under load (too long for CI) and failed once; tests/test_e2e_paused_replica.py and
tests/test_e2e_migration_faults.py make those faults, focused (docs/benchmarks.md#benchchaos)."""

from __future__ import annotations

from bench.chaos import run_chaos
from bench.chaos_config import QUICK, ChaosConfig


def test_every_fault_lands_and_the_cluster_heals_with_nothing_lost_or_leaked(ray_cluster):
    config = ChaosConfig(**{**QUICK, "replica_stops": 0, "drain_kills": 0})
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
