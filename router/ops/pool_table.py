"""The per-replica table of pools that ``top`` and ``demo`` draw, with rich.

One row per (replica, pool): held, free, in use, cached, capacity and leaked slots; a pool with
leaked slots is marked ``<< LEAK`` and the last line sums the leaks. A replica that parks sessions
shows its host tier (``host_mamba``, ``host_kv_tokens``) under its GPU pools, and how many of its
sessions are parked (PARKED; ``-`` where it does not park); a replica that checkpoints sessions
shows its ``checkpoints`` pool last. MOVING is how many sessions are moving off the replica now
(drain, MigrateSession, failover) and MOVED how many have so far. ``rows_from_replicas``
reads AdminService's ``ReplicaInfo`` (the demo); ``router.ops.top`` reads /metrics.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from protos import session_router_pb2 as pb
from replica.api import HOST_POOL_NAMES, POOL_NAMES

COLUMNS = ("REPLICA", "STATE", "SESSIONS", "PARKED", "MOVING", "MOVED", "PINNED", "AGE", "POOL")
NUMBERS = ("HELD", "FREE", "IN_USE", "CACHED", "CAPACITY", "LEAKED")
STATES = {pb.REPLICA_STATE_HEALTHY: "up", pb.REPLICA_STATE_DRAINING: "draining"}


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
    """One replica; None where the source had no value."""

    replica: str
    state: str  # "up", "draining" or "dead"
    sessions: int | None
    pinned: int | None
    snapshot_age_s: float | None
    pools: tuple[PoolRow, ...]
    parked: int | None = None  # None where the replica does not park sessions
    moving: int | None = None  # sessions moving off it now
    moved: int | None = None  # sessions moved off it so far (every reason)

    @property
    def leaked(self) -> int:
        return sum(abs(pool.leaked) for pool in self.pools)


def pool_order(names: Iterable[str]) -> list[str]:
    """The contract's pools first, in its order; any others after them by name."""
    return sorted(names, key=lambda p: (POOL_NAMES.index(p) if p in POOL_NAMES else 99, p))


def rows_from_replicas(replicas: Sequence[pb.ReplicaInfo]) -> list[ReplicaRow]:
    rows = []
    for info in replicas:
        by_name = {p.pool: p for p in info.pools}
        pools = tuple(
            PoolRow(p.pool, p.session_held, p.free, p.in_use, p.cached, p.capacity, p.leaked)
            for p in (by_name[name] for name in pool_order(by_name))
        )
        state = STATES.get(info.state, "dead")
        parks = any(p.pool in HOST_POOL_NAMES for p in pools)
        rows.append(
            ReplicaRow(
                info.replica_id,
                state,
                info.sessions,
                info.sessions_pinned,
                info.snapshot_age_s,
                pools,
                info.sessions_parked if parks else None,
            )
        )
    return rows


def render(rows: Sequence[ReplicaRow], width: int = 150) -> str:
    """The table as text (no colour codes), with a summary line."""
    table = Table(box=None, pad_edge=False, show_edge=False)
    for name in COLUMNS:
        table.add_column(name)
    for name in NUMBERS:
        table.add_column(name, justify="right")
    table.add_column("")

    def show(value: int | None) -> str:
        return "-" if value is None else str(value)

    for row in rows:
        age = "-" if row.snapshot_age_s is None else f"{row.snapshot_age_s:.1f}s"
        head = [
            row.replica,
            row.state,
            show(row.sessions),
            show(row.parked),
            show(row.moving),
            show(row.moved),
            show(row.pinned),
            age,
        ]
        for index, pool in enumerate(row.pools or (None,)):
            cells = head if index == 0 else [""] * len(head)
            if pool is None:
                table.add_row(*cells, *["-"] * (1 + len(NUMBERS)), "")
                continue
            numbers = (pool.session_held, pool.free, pool.in_use, pool.cached, pool.capacity)
            mark = "<< LEAK" if pool.leaked else ""
            table.add_row(*cells, pool.pool, *map(str, numbers), str(pool.leaked), mark)
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, highlight=False).print(table)
    leaked = sum(row.leaked for row in rows)
    dead = sum(row.state == "dead" for row in rows)
    summary = f"{len(rows)} replicas, {dead} dead, " + (
        f"LEAKED SLOTS: {leaked}" if leaked else "no leaked slots"
    )
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    return "\n".join([*lines, summary])
