"""``RoomReport``: why new sessions can (or cannot) be placed, replica by replica, in the terms of
``router.control.placement`` (a RESOURCE_EXHAUSTED open says what to do about it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.control.api import ReplicaHealth, ReplicaView
from router.control.placement import room_of


@dataclass(frozen=True, slots=True)
class RoomReport:
    """Why new sessions can (or cannot) be placed; ``message()`` is for RESOURCE_EXHAUSTED."""

    replicas: int
    with_room: tuple[str, ...]
    draining: tuple[str, ...]
    dead: tuple[str, ...]
    not_ready: tuple[str, ...]  # health unknown, or healthy without a snapshot yet
    short_mamba: tuple[str, ...]  # "r0 (1 free, 2 per session)"
    short_req: tuple[str, ...]
    short_kv: tuple[str, ...]
    short_host: tuple[str, ...] = ()  # replicas that park, with their host tier full

    @property
    def has_room(self) -> bool:
        return bool(self.with_room)

    def message(self) -> str:
        """One line saying why no replica has room and what to do about it."""
        if self.has_room:
            return f"replicas with room: {', '.join(self.with_room)}"
        if self.replicas == 0:
            return "no replicas registered; start replicas (session-router serve --replicas N)"
        if self.not_ready and not (self.short_mamba or self.short_req or self.short_kv):
            return (
                f"no replica ready yet ({len(self.not_ready)} starting, "
                f"{len(self.draining)} draining, {len(self.dead)} dead); retry shortly"
            )
        if not (self.not_ready or self.short_mamba or self.short_req or self.short_kv):
            return (
                f"all replicas draining or dead ({len(self.draining)} draining, "
                f"{len(self.dead)} dead); wait for replacement replicas and retry"
            )
        parts = []
        if self.short_mamba:
            parts.append(f"no free mamba slots: {', '.join(self.short_mamba)}")
        if self.short_req:
            parts.append(f"no free req rows: {', '.join(self.short_req)}")
        if self.short_kv:
            parts.append(f"not enough free KV tokens: {', '.join(self.short_kv)}")
        if self.short_host:
            parts.append(f"host tier full: {', '.join(self.short_host)}")
        return (
            "no replica has room for a new session (" + "; ".join(parts) + "); close idle "
            "sessions, lower --session-idle-timeout-s, raise --max-sessions or "
            "--max-parked-sessions, or add replicas"
        )


def room_report(
    views: Sequence[ReplicaView], reserved: Mapping[str, int] | None = None
) -> RoomReport:
    """Classify every replica; consistent with ``candidates`` (with_room == their ids)."""
    with_room, draining, dead, not_ready = [], [], [], []
    short_mamba, short_req, short_kv, short_host = [], [], [], []
    for view in views:
        if view.health == ReplicaHealth.DEAD:
            dead.append(view.replica_id)
            continue
        if view.health == ReplicaHealth.DRAINING or (view.snapshot and view.snapshot.draining):
            draining.append(view.replica_id)
            continue
        room = room_of(view, reserved)
        if view.health != ReplicaHealth.HEALTHY or room is None:
            not_ready.append(view.replica_id)
            continue
        if room.fits:
            with_room.append(view.replica_id)
        if not room.mamba_ok:
            short_mamba.append(
                f"{room.replica_id} ({room.free_mamba} free, {room.mamba_needed} per session)"
            )
        if not room.req_ok:
            short_req.append(f"{room.replica_id} ({room.free_req} free)")
        if not room.kv_ok:
            short_kv.append(
                f"{room.replica_id} ({room.free_kv_tokens} free, "
                f"{room.kv_tokens_needed} per session)"
            )
        if room.parks and not room.host_ok:
            short_host.append(f"{room.replica_id} ({room.free_host} host slots free)")
    return RoomReport(
        len(views),
        tuple(with_room),
        tuple(draining),
        tuple(dead),
        tuple(not_ready),
        tuple(short_mamba),
        tuple(short_req),
        tuple(short_kv),
        tuple(short_host),
    )
