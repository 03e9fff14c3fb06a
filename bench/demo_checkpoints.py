"""What session checkpoints cost the demo's many short sessions: ``session-router demo`` (its
300 sessions from 16 clients on 2 replicas, no parking phase) with checkpoints on and with
``--no-session-checkpoints``, the two alternating, each run a fresh process with its own local
cluster, as a user runs it. Prints each run's sessions/s and time to first token p50, and the
ratio on ÷ off of each repetition's pair.

Run: ``python -m bench.demo_checkpoints [--quick]``. Goal: sessions/s on ÷ off >= 0.9.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from bench.harness import cli
from bench.harness.report import Goal, Table, print_goals
from bench.harness.stats import ratios

GOAL = 0.9
RATE = re.compile(r"= ([\d.]+) sessions/s")
TTFT = re.compile(r"p50 ([\d.]+) ms")


def demo(checkpoints: bool, sessions: int) -> tuple[float, float]:
    """One demo run: (sessions/s, time to first token p50 in ms)."""
    args = [sys.executable, "-m", "router.ops.cli", "demo", "--sessions", str(sessions)]
    args += ["--parked-sessions", "0"]
    if not checkpoints:
        args.append("--no-session-checkpoints")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"the demo failed ({out.returncode}):\n{out.stdout[-3000:]}")
    rate, ttft = RATE.search(out.stdout), TTFT.search(out.stdout)
    return float(rate[1]), float(ttft[1]) if ttft else float("nan")


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--sessions", type=int, default=300)
    args = cli.parse(parser)
    runs = {True: [], False: []}
    for _ in range(args.repeats):
        for checkpoints in (False, True):
            runs[checkpoints].append(demo(checkpoints, args.sessions))
    table = Table("run", "checkpoints off (sessions/s, TTFT p50 ms)", "on")
    for i, (off, on) in enumerate(zip(runs[False], runs[True]), 1):
        table.add(i, f"{off[0]:.1f}, {off[1]:.0f}", f"{on[0]:.1f}, {on[1]:.0f}")
    table.print()
    rate = ratios([r[0] for r in runs[True]], [r[0] for r in runs[False]])
    print_goals([Goal("demo sessions/s, checkpoints on / off", rate, GOAL)])


if __name__ == "__main__":
    main()
