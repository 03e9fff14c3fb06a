"""What session checkpoints cost the demo's many short sessions: ``session-router demo`` (its
300 sessions from 16 clients on 2 replicas, no parking phase) with checkpoints on and with
``--no-session-checkpoints``, the two alternating, each run a fresh process with its own local
cluster, as a user runs it. Prints each run's sessions/s, time to first token p50 and the CPU
seconds its processes spent per session while the sessions ran (from the demo's "before:" table
to its result line: the cluster's start-up is left out), by process: the demo (its gateways and
clients), the replicas, their checkpoint stores, the router and the rest of Ray. The ratios on ÷
off are of each repetition's pair: sessions/s, and CPU per session off ÷ on (what the rate would
be on a box the demo keeps busy; other work on a shared box moves the rate more than this).

The floor, measured in the same run: a replica sends each checkpoint to its store as one item
over the store's checkpoint socket (the next once the store has taken it; a Ray stream when no
socket can be had), so each costs at least the CPU of such an item in two processes
(``bench.harness.stream_item_floor``: a bare producer and consumer actor over that socket, items
of a checkpoint's shape at the rate the demo wrote them). With the checkpoints per session the
run wrote (the replicas' ``checkpoints_written`` counters on the demo's /metrics), the best on ÷
off that one item per checkpoint allows is CPU off ÷ (CPU off + checkpoints per session x that
item's CPU).

Before the pairs, one demo run that is not counted warms the box (the first process to import
torch and start Ray on it pays for cold caches: 40 % slower in one run); the pairs alternate
which of the two runs first, so neither always runs on a box the other just warmed.

Run: ``python -m bench.demo_checkpoints [--quick] [--warmups N]``. Goal: sessions/s on ÷ off
>= 0.9.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import urllib.request
from dataclasses import dataclass

import ray
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import cli
from bench.harness.cpu import CpuMeter
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import Spread, ratios
from bench.harness.stream_item_floor import ItemCost, SocketProducer, stream_item_cost

GOAL = 0.9
RATE = re.compile(r"= ([\d.]+) sessions/s")
SESSIONS = re.compile(r"^sessions: (\d+)")
TTFT = re.compile(r"p50 ([\d.]+) ms")
METRICS = re.compile(r"metrics on (http://\S+)")
WRITTEN = "session_router_checkpoints_written_total"
ACTORS = {
    b"ray::ReplicaActor": "replicas",
    b"ray::CheckpointStore": "stores",
    b"ray::SessionRouter": "router",
}
GROUPS = ("demo", "replicas", "stores", "router", "ray")


@dataclass(frozen=True)
class DemoRun:
    rate: float  # sessions/s
    ttft_ms: float  # p50
    cpu_ms: dict[str, float]  # CPU ms per session, by group, while the sessions ran
    checkpoints: float  # checkpoints written per session
    seconds: float  # how long the sessions ran

    @property
    def cpu_total_ms(self) -> float:
        return sum(self.cpu_ms.values())


def demo(checkpoints: bool, sessions: int) -> DemoRun:
    """One demo run, its CPU read from /proc when it prints its tables before and after."""
    args = [sys.executable, "-m", "router.ops.cli", "demo", "--sessions", str(sessions)]
    args += ["--parked-sessions", "0"]
    if not checkpoints:
        args.append("--no-session-checkpoints")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    pipe = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc = subprocess.Popen(args, env=env, **pipe)
    meter = CpuMeter({proc.pid: "demo"}, ACTORS)
    lines, before, after, done, url, written = [], None, None, 0, "", [0.0, 0.0]
    for line in proc.stdout:
        lines.append(line)
        if m := METRICS.search(line):
            url = m[1]
        if line.startswith("before:"):
            before, written[0] = meter.sample(), checkpoints_written(url)
        elif line.startswith("after:"):
            written[1] = checkpoints_written(url)  # the cluster is up until the result line
        elif (m := SESSIONS.match(line)) and before is not None:
            after, done = meter.sample(), int(m[1])
    if proc.wait(timeout=900) != 0 or after is None:
        raise RuntimeError(f"the demo failed ({proc.returncode}):\n{''.join(lines)[-3000:]}")
    out = "".join(lines)
    rate, ttft = RATE.search(out), TTFT.search(out)
    spent = CpuMeter.delta(before, after)
    cpu = {group: 1000 * spent.get(group, 0.0) / done for group in GROUPS}
    ttft_ms = float(ttft[1]) if ttft else float("nan")
    per_session = (written[1] - written[0]) / done
    return DemoRun(float(rate[1]), ttft_ms, cpu, per_session, done / float(rate[1]))


def checkpoints_written(metrics_url: str) -> float:
    """Checkpoints the replicas wrote so far, from the demo's /metrics (0 without one)."""
    if not metrics_url:
        return 0.0
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == WRITTEN
    )


def item_floor(runs: list[DemoRun], replicas: int = 2) -> ItemCost:
    """One checkpoint socket item's CPU at the rate the runs wrote checkpoints per replica."""
    rate = sum(r.checkpoints * r.rate for r in runs) / len(runs) / replicas
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        return asyncio.run(stream_item_cost(rate=max(rate, 1.0), producer_class=SocketProducer))
    finally:
        ray.shutdown()


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--warmups", type=int, default=1, help="demo runs not counted (1)")
    args = cli.parse(parser)
    for _ in range(args.warmups):
        demo(True, args.sessions)
    runs: dict[bool, list[DemoRun]] = {True: [], False: []}
    for i in range(args.repeats):
        for checkpoints in (False, True) if i % 2 == 0 else (True, False):
            runs[checkpoints].append(demo(checkpoints, args.sessions))
    floor = item_floor(runs[True])
    table = Table(
        "run", "checkpoints", "sessions/s", "TTFT p50 ms", "checkpoints/session",
        "CPU ms/session", *GROUPS,
    )  # fmt: skip
    for i, pair in enumerate(zip(runs[False], runs[True]), 1):
        for checkpoints, run in zip(("off", "on"), pair):
            cpu = (f"{run.cpu_ms[g]:.1f}" for g in GROUPS)
            table.add(i, checkpoints, f"{run.rate:.1f}", f"{run.ttft_ms:.0f}",
                      f"{run.checkpoints:.2f}", f"{run.cpu_total_ms:.1f}", *cpu)  # fmt: skip
    table.print()
    print(
        f"\nfloor: one checkpoint-shaped item over a checkpoint socket costs "
        f"{floor.producer_ms:.2f} ms of CPU in the producer and {floor.consumer_ms:.2f} ms in the "
        f"consumer ({floor.total_ms:.2f} ms)"
    )
    rate = ratios([r.rate for r in runs[True]], [r.rate for r in runs[False]])
    cpu = ratios([r.cpu_total_ms for r in runs[False]], [r.cpu_total_ms for r in runs[True]])
    ceiling = [
        off.cpu_total_ms / (off.cpu_total_ms + on.checkpoints * floor.total_ms)
        for off, on in zip(runs[False], runs[True])
    ]
    above = [
        on.cpu_total_ms - off.cpu_total_ms - on.checkpoints * floor.total_ms
        for off, on in zip(runs[False], runs[True])
    ]
    print(
        "CPU per session that checkpoints cost above that floor: "
        + ", ".join(f"{ms:.1f} ms" for ms in above)
    )
    print_goals(
        [
            Goal("demo sessions/s, checkpoints on / off", rate, GOAL),
            Goal("demo CPU per session, checkpoints off / on", cpu, GOAL),
            Goal(
                "floor: CPU off / (off + one socket item per checkpoint)",
                Spread.of(ceiling),
                GOAL,
            ),
        ]
    )


if __name__ == "__main__":
    main()
