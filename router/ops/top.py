"""`session-router top`: a live per-replica table of the pools, read from the /metrics endpoint.

``parse_table`` reads the exposition of ``router.gateway.metrics`` (series summed by ``replica``,
as the dashboards do, so an extra label never splits a row), ``router.ops.pool_table.render``
draws it, marking a non-zero ``leaked`` count ``<< LEAK``, and ``run_top`` refreshes it every
``interval`` seconds, reporting and retrying when the endpoint cannot be reached.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from typing import TextIO

from prometheus_client.parser import text_string_to_metric_families

from router.ops.pool_table import PoolRow, ReplicaRow, pool_order, render

DEFAULT_METRICS_URL = "http://127.0.0.1:9400/metrics"
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def fetch_metrics(url: str, timeout: float = 5.0) -> str:
    """The exposition text at ``url``; raises OSError (URLError included) when unreachable."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8")


def parse_table(exposition_text: str) -> list[ReplicaRow]:
    """One row per replica that appears in any ``session_router_*`` per-replica series."""
    sums: dict[tuple[str, str, str, str], float] = defaultdict(float)
    maxes: dict[tuple[str, str], float] = {}
    replicas: set[str] = set()
    for family in text_string_to_metric_families(exposition_text):
        for sample in family.samples:
            replica = sample.labels.get("replica")
            if replica is None or not sample.name.startswith("session_router_"):
                continue
            replicas.add(replica)
            name = sample.name.removeprefix("session_router_")
            if name in ("replica_up", "replica_draining", "snapshot_age_seconds"):
                key = (name, replica)
                maxes[key] = max(maxes.get(key, sample.value), sample.value)
            else:
                labels = sample.labels
                sums[(name, replica, labels.get("pool", ""), labels.get("state", ""))] += (
                    sample.value
                )

    def count(name: str, replica: str, pool: str = "", state: str = "") -> int | None:
        key = (name, replica, pool, state)
        return int(sums[key]) if key in sums else None

    rows = []
    for replica in sorted(replicas):
        names = {pool for (name, r, pool, _) in sums if r == replica and name == "pool_slots"}
        order = pool_order(names)
        pools = tuple(
            PoolRow(
                pool,
                *(
                    count("pool_slots", replica, pool, state) or 0
                    for state in ("session_held", "free", "in_use", "cached")
                ),
                count("pool_capacity_slots", replica, pool) or 0,
                count("pool_leaked_slots", replica, pool) or 0,
            )
            for pool in order
        )
        if maxes.get(("replica_up", replica), 1.0) == 0:
            state = "dead"
        elif maxes.get(("replica_draining", replica), 0.0) > 0:
            state = "draining"
        else:
            state = "up"
        rows.append(
            ReplicaRow(
                replica,
                state,
                count("sessions", replica),
                count("sessions_pinned", replica),
                maxes.get(("snapshot_age_seconds", replica)),
                pools,
                count("sessions_parked", replica) if "host_mamba" in names else None,
                count("sessions_moving", replica),
                count("sessions_migrated_total", replica),
            )
        )
    return rows


def run_top(
    url: str,
    interval: float = 1.0,
    iterations: int | None = None,
    out: TextIO | None = None,
    fetch: Callable[[str], str] = fetch_metrics,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Redraw the table every ``interval`` s, ``iterations`` times (None: until interrupted).

    Unreachable endpoints are reported on ``out`` and retried. Returns 0 when the last refresh
    succeeded, 1 when it failed. ``out`` defaults to the current ``sys.stdout``.
    """
    out = sys.stdout if out is None else out
    tty = bool(getattr(out, "isatty", lambda: False)())
    ok, done = False, 0
    try:
        while iterations is None or done < iterations:
            if done:
                sleep(interval)
            done += 1
            stamp = time.strftime("%H:%M:%S")
            try:
                body = f"session-router top  {url}  {stamp}\n{render(parse_table(fetch(url)))}"
                ok = True
            except (OSError, ValueError) as error:
                reason = getattr(error, "reason", error)
                body = (
                    f"{stamp} cannot read {url}: {reason}\n"
                    "is `session-router serve` running with that --metrics-port? "
                    + (f"retrying in {interval:g}s" if iterations != done else "giving up")
                )
                ok = False
            out.write((CLEAR_SCREEN if tty else "") + body + "\n")
            out.flush()
    except KeyboardInterrupt:
        return 0
    return 0 if ok else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `top` flags, for the CLI's subcommand parser."""
    parser.add_argument(
        "--metrics-url",
        default=DEFAULT_METRICS_URL,
        help="the serve process's /metrics endpoint (default: %(default)s)",
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    parser.add_argument("--once", action="store_true", help="print the table once and exit")
