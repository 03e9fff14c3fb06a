"""What session checkpoints cost the demo's many short sessions: ``session-router demo`` (its
300 sessions from 16 clients on 2 replicas, no parking phase) with checkpoints on and with
``--no-session-checkpoints``, the two alternating, each run a fresh process with its own local
cluster, as a user runs it. Prints each run's sessions/s, time to first token p50 and the CPU
seconds its processes spent per session while the sessions ran (from the demo's "before:" table
to its result line: the cluster's start-up is left out), by process: the demo (its gateways and
clients), the replicas, their checkpoint stores, the router and the rest of Ray. The ratios on ÷
off are of each repetition's pair: sessions/s, and CPU per session off ÷ on (what the rate would
be on a box the demo keeps busy; other work on a shared box moves the rate more than this).

Run: ``python -m bench.demo_checkpoints [--quick]``. Goal: sessions/s on ÷ off >= 0.9.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

from bench.harness import cli
from bench.harness.cpu import CpuMeter
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import ratios

GOAL = 0.9
RATE = re.compile(r"= ([\d.]+) sessions/s")
SESSIONS = re.compile(r"^sessions: (\d+)")
TTFT = re.compile(r"p50 ([\d.]+) ms")
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
    lines, before, after, done = [], None, None, 0
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("before:"):
            before = meter.sample()
        elif (m := SESSIONS.match(line)) and before is not None:
            after, done = meter.sample(), int(m[1])
    if proc.wait(timeout=900) != 0 or after is None:
        raise RuntimeError(f"the demo failed ({proc.returncode}):\n{''.join(lines)[-3000:]}")
    out = "".join(lines)
    rate, ttft = RATE.search(out), TTFT.search(out)
    spent = CpuMeter.delta(before, after)
    cpu = {group: 1000 * spent.get(group, 0.0) / done for group in GROUPS}
    return DemoRun(float(rate[1]), float(ttft[1]) if ttft else float("nan"), cpu)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--sessions", type=int, default=300)
    args = cli.parse(parser)
    runs: dict[bool, list[DemoRun]] = {True: [], False: []}
    for _ in range(args.repeats):
        for checkpoints in (False, True):
            runs[checkpoints].append(demo(checkpoints, args.sessions))
    table = Table("run", "checkpoints", "sessions/s", "TTFT p50 ms", "CPU ms/session", *GROUPS)
    for i, pair in enumerate(zip(runs[False], runs[True]), 1):
        for checkpoints, run in zip(("off", "on"), pair):
            cpu = (f"{run.cpu_ms[g]:.1f}" for g in GROUPS)
            table.add(i, checkpoints, f"{run.rate:.1f}", f"{run.ttft_ms:.0f}",
                      f"{run.cpu_total_ms:.1f}", *cpu)  # fmt: skip
    table.print()
    rate = ratios([r.rate for r in runs[True]], [r.rate for r in runs[False]])
    cpu = ratios([r.cpu_total_ms for r in runs[False]], [r.cpu_total_ms for r in runs[True]])
    print_goals(
        [
            Goal("demo sessions/s, checkpoints on / off", rate, GOAL),
            Goal("demo CPU per session, checkpoints off / on", cpu, GOAL),
        ]
    )


if __name__ == "__main__":
    main()
