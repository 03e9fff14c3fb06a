"""Failover: the sessions of a dead replica restored on live ones from their checkpoints."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class FailoverOutcome:
    """What became of a dead replica's sessions: ``restored`` (session id -> the committed
    tokens it continues at, on a live replica) and ``lost`` (their state is gone)."""

    restored: dict[str, int] = field(default_factory=dict)
    lost: tuple[str, ...] = ()
