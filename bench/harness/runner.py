"""The entry point of benchmarks that run on a local cluster: ``main(__doc__, measure)`` parses
the flags (``cli``), starts the cluster, runs each ``measure`` on it (a measure prints its tables
and returns its goals), prints all the goals and stops the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from bench.harness import cli
from bench.harness.cluster import LocalCluster, local_cluster
from bench.harness.profile import GatewayProfile
from bench.harness.report import Goal, print_goals

Measure = Callable[[LocalCluster, argparse.Namespace], Awaitable[list[Goal]]]


async def run_on_cluster(args: argparse.Namespace, measures: Sequence[Measure]) -> list[Goal]:
    """Runs ``measures`` in order on one local cluster built from ``args``; their goals."""
    profile = GatewayProfile(args.profile_gateway)
    async with local_cluster(profile, **cli.cluster_flags(args)) as cluster:
        goals = []
        for measure in measures:
            goals += await measure(cluster, args)
    profile.report()
    return goals


def main(doc: str, *measures: Measure) -> None:
    """Entry point of a cluster benchmark (or several on one cluster)."""
    args = cli.parse(cli.parser(doc, cluster=True))
    t0 = time.perf_counter()
    goals = asyncio.run(run_on_cluster(args, measures))
    print_goals(goals)
    print(f"\ntotal run time {time.perf_counter() - t0:.0f}s")
