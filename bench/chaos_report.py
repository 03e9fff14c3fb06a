"""What a chaos run saw (``ChaosReport``: sessions, faults and what they hit, codes, time to
heal, problems) and the checks of its end state (``check_end_state``): the cluster back to
``--replicas`` healthy replicas, every pool at capacity with 0 leaked, the router's table empty,
/metrics listing the live replicas only, every fault asked for landed, no session lost, doubled
or unprotected past the bound, no call hung, only documented codes.
"""

from __future__ import annotations

import statistics
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import ray

from bench.chaos_config import ChaosConfig
from bench.chaos_faults import KINDS, Cluster, Hit
from bench.chaos_load import DOCUMENTED, Tally
from replica.api import PoolSnapshot

FAULT_NAMES = {
    "replica": "replica SIGKILLs",
    "router": "router SIGKILLs",
    "store": "store SIGKILLs",
    "stop": "replica SIGSTOPs",
    "migration": "migration targets killed",
    "drain": "replicas killed while draining",
}


@dataclass
class ChaosReport:
    config: ChaosConfig
    tally: Tally = field(default_factory=Tally)
    heal_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    hits: dict[str, list[Hit]] = field(default_factory=lambda: {k: [] for k in KINDS})
    lost_by: Counter = field(default_factory=Counter)  # sessions ABORTED from a fault to its heal
    doubled: set[str] = field(default_factory=set)
    unprotected_s: dict[str, float] = field(default_factory=dict)  # longest stretch per replica
    seconds: float = 0.0
    replaced: int = 0
    problems: list[str] = field(default_factory=list)
    leaked: int = 0  # slots leaked (or freed twice) on the live replicas at the end

    def lines(self) -> list[str]:
        t, c = self.tally, self.config

        def codes(counter: Counter) -> str:
            return ", ".join(f"{k} {v}" for k, v in counter.most_common())

        def heal(kind: str) -> str:
            s = self.heal_s[kind]
            return f"{kind} p50 {statistics.median(s):.1f} s, max {max(s):.1f} s" if s else kind

        def landed(kind: str) -> str:
            hits = self.hits[kind]
            where = "; ".join(h.describe() for h in hits)
            return f"{FAULT_NAMES[kind]} {self.landed(kind)}/{c.counts[kind]}" + (
                f" ({where})" if where else ""
            )

        return [
            f"chaos: {sum(t.sessions.values())} sessions from {c.concurrency} clients on "
            f"{c.replicas} replicas (seed {c.seed}) in {self.seconds:.0f} s",
            "faults landed/asked (what they hit): "
            + ", ".join(landed(k) for k in KINDS if c.counts[k] or self.hits[k]),
            f"clients: {codes(t.faults)}",
            f"sessions ended: {codes(t.sessions)}",
            f"sessions lost {self.lost}, doubled {len(self.doubled)}, slots leaked {self.leaked}; "
            "longest unprotected "
            f"{max(self.unprotected_s.values(), default=0.0):.1f} s "
            f"(bound {c.unprotected_bound_s:g} s)",
            f"calls: {sum(t.calls.values())} ({codes(t.calls)}); hung: {t.hung}",
            f"time to heal (fault -> {c.replicas} healthy replicas): "
            + "; ".join(heal(k) for k in KINDS if self.heal_s[k])
            + f"; {self.replaced} replacement replicas started",
            "end state: "
            + (
                "; ".join(self.problems)
                if self.problems
                else "OK: --replicas "
                "healthy, pools at capacity, 0 leaked, router table empty, /metrics live only"
            ),
        ]

    def landed(self, kind: str) -> int:
        """Faults of ``kind`` that hit something (sessions, checkpoints, a move in flight)."""
        return sum(1 for hit in self.hits[kind] if hit.count)

    @property
    def lost(self) -> int:
        """Sessions whose state was gone (their turn ended ABORTED)."""
        return self.tally.sessions["ABORTED"]


def metrics_replicas(url: str) -> set[str]:
    """The ``replica`` label values /metrics exports."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    return {line.split('replica="')[1].split('"')[0] for line in lines if 'replica="' in line}


def check_end_state(cluster: Cluster, report: ChaosReport) -> None:
    c, server, problems = report.config, cluster.server, report.problems
    deadline = time.monotonic() + c.heal_timeout_s
    # healthy at the router and the controller's own: a replica the controller killed (its
    # start failed) can be listed healthy until the router sees it die
    while True:
        fleet = cluster.fleet()
        live = sorted(cluster.healthy() & set(fleet.replicas))
        if len(live) >= c.replicas and not fleet.starting:
            break
        if time.monotonic() > deadline:
            problems.append(f"only {live} healthy")
            return
        time.sleep(0.2)
    report.replaced = fleet.replicas_replaced
    snaps: list = []
    while time.monotonic() < deadline:  # abandoned sessions end at their idle timeout
        snaps = ray.get([fleet.replicas[r].check_invariant.remote() for r in live], timeout=60)
        at_capacity = all(isinstance(s, PoolSnapshot) and s.at_capacity for s in snaps)
        if at_capacity and ray.get(server.router.session_count.remote()) == 0:
            break
        time.sleep(0.5)
    for r, snap in zip(live, snaps):
        if not isinstance(snap, PoolSnapshot):
            problems.append(f"{r}: invariant check failed: {snap}")
            continue
        report.leaked += sum(abs(p.leaked) for p in snap.pools)
        unsettled = [p for p in snap.pools if p.leaked or p.free + p.cached != p.capacity]
        problems += [f"{r}: {p.describe()}" for p in unsettled]
    if (held := ray.get(server.router.session_count.remote())) != 0:
        ids = {v.replica_id for v in ray.get(server.router.views.remote())}
        ids |= {hit.victim for hits in report.hits.values() for hit in hits}
        ids |= {f"replica-{n}" for n in range(fleet.replicas_replaced + 2 * c.replicas + 8)}
        pinned = {r: ray.get(server.router.pinned_sessions.remote(r)) for r in sorted(ids)}
        where = "; ".join(f"{r}: {', '.join(s)}" for r, s in pinned.items() if s)
        problems.append(f"the router still pins {held} sessions ({where})")
    while (listed := metrics_replicas(server.metrics_url)) != set(live):
        if time.monotonic() > deadline:  # dead replicas leave /metrics after their retention
            problems.append(f"/metrics lists {sorted(listed)}, live are {live}")
            break
        time.sleep(0.5)
    t = report.tally
    missed = [f"{k} {report.landed(k)}/{n}" for k, n in c.counts.items() if report.landed(k) < n]
    if missed:  # a fault that hit nothing tested nothing
        problems.append(f"faults that hit something, of those asked: {', '.join(missed)}")
    if report.lost:
        by = ", ".join(f"{k} {n}" for k, n in report.lost_by.items() if n)
        problems.append(f"{report.lost} sessions lost (ended ABORTED; during faults: {by})")
    if report.doubled:
        problems.append(f"{len(report.doubled)} sessions held by two replicas at once")
    if (longest := max(report.unprotected_s.values(), default=0.0)) > c.unprotected_bound_s:
        problems.append(f"sessions unprotected for {longest:.0f} s on one replica")
    if t.hung:
        problems.append(f"{t.hung} calls hung until their safety deadline")
    odd = {code for code in [*t.calls, *t.sessions] if code not in DOCUMENTED}
    odd -= {"completed", "left to the idle timeout"}
    if odd:
        problems.append(f"undocumented status codes: {sorted(odd)}")
