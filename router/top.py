"""`session-router top`: a live per-replica table of the pools, read from the /metrics endpoint.

``parse_table`` reads the exposition of ``router.metrics`` (series summed by ``replica``, as the
dashboards do, so an extra label never splits a row), ``render`` draws an aligned table in which a
non-zero ``leaked`` count is marked ``<< LEAK``, and ``run_top`` refreshes it every ``interval``
seconds, reporting and retrying when the endpoint cannot be reached.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from prometheus_client.parser import text_string_to_metric_families

DEFAULT_METRICS_URL = "http://127.0.0.1:9400/metrics"
POOL_ORDER = ("mamba", "kv_tokens", "req")
CLEAR_SCREEN = "\x1b[H\x1b[2J"
COLUMNS = (
    "REPLICA",
    "STATE",
    "SESSIONS",
    "PINNED",
    "AGE",
    "POOL",
    "HELD",
    "FREE",
    "IN_USE",
    "CACHED",
    "CAPACITY",
    "LEAKED",
)


@dataclass(frozen=True, slots=True)
class PoolRow:
    pool: str
    session_held: int
    free: int
    in_use: int
    cached: int
    capacity: int
    leaked: int


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    """One replica as /metrics shows it; None where the endpoint exported no value."""

    replica: str
    state: str  # "up", "draining" or "dead"
    sessions: int | None
    pinned: int | None
    snapshot_age_s: float | None
    pools: tuple[PoolRow, ...]

    @property
    def leaked(self) -> int:
        return sum(abs(pool.leaked) for pool in self.pools)


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
        order = sorted(names, key=lambda p: (POOL_ORDER.index(p) if p in POOL_ORDER else 99, p))
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
            )
        )
    return rows


def render(rows: Sequence[ReplicaRow]) -> str:
    """An aligned table, one line per (replica, pool); leaked slots are marked ``<< LEAK``."""

    def show(value: int | None) -> str:
        return "-" if value is None else str(value)

    lines: list[list[str]] = [list(COLUMNS)]
    marks: list[str] = [""]
    for row in rows:
        age = "-" if row.snapshot_age_s is None else f"{row.snapshot_age_s:.1f}s"
        head = [row.replica, row.state, show(row.sessions), show(row.pinned), age]
        for index, pool in enumerate(row.pools or (None,)):
            cells = head if index == 0 else [""] * len(head)
            if pool is None:
                lines.append(cells + ["-"] * 7)
                marks.append("")
                continue
            lines.append(
                cells
                + [
                    pool.pool,
                    str(pool.session_held),
                    str(pool.free),
                    str(pool.in_use),
                    str(pool.cached),
                    str(pool.capacity),
                    str(pool.leaked),
                ]
            )
            marks.append("  << LEAK" if pool.leaked else "")
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    text = []
    for line, mark in zip(lines, marks):
        left = [cell.ljust(width) for cell, width in zip(line[:6], widths[:6])]
        right = [cell.rjust(width) for cell, width in zip(line[6:], widths[6:])]
        text.append(("  ".join(left + right) + mark).rstrip())
    leaked = sum(row.leaked for row in rows)
    dead = sum(row.state == "dead" for row in rows)
    text.append(
        f"{len(rows)} replicas, {dead} dead, "
        + (f"LEAKED SLOTS: {leaked}" if leaked else "no leaked slots")
    )
    return "\n".join(text)


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `session-router top`; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="session-router top", description="Live per-replica pool table from /metrics."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be positive")
    return run_top(args.metrics_url, args.interval, 1 if args.once else None)


if __name__ == "__main__":
    sys.exit(main())
