"""Placement policy: which replica gets a new session. Pure functions of the router's views.

A replica is a *candidate* when it is HEALTHY (not draining, not dead, and its latest snapshot
does not say draining), has a snapshot, and has room for one more session after subtracting the
opens the router has in flight there, which no snapshot counts yet (``reserved[replica_id]``;
every open and close reply carries a fresh snapshot, so nothing else is pending). Room is GPU
room:

- free mamba slots - reserved * mamba_slots_per_session >= mamba_slots_per_session
- free req rows    - reserved                           >= 1
- free KV tokens   - reserved * kv_tokens_per_session  >= kv_tokens_per_session

or host room on a replica that parks sessions (a new session then parks an idle one, or starts
parked itself): free host_mamba slots - reserved >= 1.

Among candidates the best is the one with most adjusted free mamba slots, then most free host slots;
ties go to fewer pinned sessions, then to the smaller replica_id (deterministic). With more than
``p2c_threshold`` candidates, power-of-two choices: two distinct candidates are sampled with ``rng``
and the better one is taken, which spreads load without every router herding onto the same replica.

An open with a prefix of token ids goes first to the candidate whose cached states (the block
hashes of its snapshot, ``replica.prefix_hashes``) hold the longest block-aligned prefix of it
(ties by the order above, no sampling); when no candidate holds any of it, the rules above.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from replica.prefix_hashes import chained_block_hashes
from router.control.api import ReplicaHealth, ReplicaView

_DEFAULT_RNG = random.Random()


@dataclass(frozen=True, slots=True)
class Room:
    """What one replica has left for new sessions, net of sessions reserved since its snapshot."""

    replica_id: str
    free_mamba: int
    free_req: int
    free_kv_tokens: int
    mamba_needed: int
    kv_tokens_needed: int
    sessions_pinned: int
    free_host: int = 0  # sessions the replica can still park, net of the reserved ones
    parks: bool = False  # the replica has a host tier

    @property
    def mamba_ok(self) -> bool:
        return self.free_mamba >= self.mamba_needed

    @property
    def req_ok(self) -> bool:
        return self.free_req >= 1

    @property
    def kv_ok(self) -> bool:
        return self.free_kv_tokens >= self.kv_tokens_needed

    @property
    def host_ok(self) -> bool:
        return self.free_host >= 1

    @property
    def fits(self) -> bool:
        """True when one more session fits on every GPU pool, or in the host tier."""
        return (self.mamba_ok and self.req_ok and self.kv_ok) or self.host_ok

    @property
    def new_sessions(self) -> int:
        """How many new sessions it can still take: those that fit every GPU pool, plus its free
        host slots (each takes a parked session)."""
        gpu = min(
            self.free_mamba // max(1, self.mamba_needed),
            self.free_req,
            self.free_kv_tokens // max(1, self.kv_tokens_needed),
        )
        return max(0, gpu) + self.free_host

    def rank_key(self) -> tuple[int, int, int, str]:
        """Smaller is better: most free mamba, most free host slots, fewest pinned sessions,
        then replica_id."""
        return (-self.free_mamba, -self.free_host, self.sessions_pinned, self.replica_id)


def is_healthy(view: ReplicaView) -> bool:
    """HEALTHY and not marked draining by its own snapshot."""
    draining = view.snapshot is not None and view.snapshot.draining
    return view.health == ReplicaHealth.HEALTHY and not draining


def room_of(view: ReplicaView, reserved: Mapping[str, int] | None = None) -> Room | None:
    """The replica's room net of ``reserved`` sessions; None when it has no snapshot."""
    if view.snapshot is None:
        return None
    held = max(0, (reserved or {}).get(view.replica_id, 0))
    return Room(
        replica_id=view.replica_id,
        free_mamba=view.free_mamba - held * view.mamba_slots_per_session,
        free_req=view.free_req - held,
        free_kv_tokens=view.free_kv_tokens - held * view.kv_tokens_per_session,
        mamba_needed=view.mamba_slots_per_session,
        kv_tokens_needed=view.kv_tokens_per_session,
        sessions_pinned=view.sessions_pinned,
        free_host=max(0, view.free_host_mamba - held),
        parks=view.parks,
    )


def session_room(view: ReplicaView) -> int:
    """``Room.new_sessions`` of a healthy replica; 0 when it is not healthy or has no snapshot."""
    room = room_of(view) if is_healthy(view) else None
    return 0 if room is None else room.new_sessions


def candidates(
    views: Sequence[ReplicaView], reserved: Mapping[str, int] | None = None
) -> list[Room]:
    """Rooms of the healthy replicas that fit one more session, in the order of ``views``."""
    rooms = (room_of(view, reserved) for view in views if is_healthy(view))
    return [room for room in rooms if room is not None and room.fits]


def choose_replica(
    views: Sequence[ReplicaView],
    reserved: Mapping[str, int] | None = None,
    rng: random.Random | None = None,
    p2c_threshold: int = 32,
    prefix_ids: Sequence[int] | None = None,
) -> str | None:
    """The replica_id to place a new session on, or None when no replica is a candidate.

    The result is always a candidate. With ``prefix_ids``, the candidate holding the longest
    cached prefix of them, if any holds one; else up to ``p2c_threshold`` candidates the best
    one is taken (see the module docstring); beyond it the better of two sampled with ``rng``.
    """
    rooms = candidates(views, reserved)
    if not rooms:
        return None
    if prefix_ids:
        by_id = {view.replica_id: view for view in views}
        cached = cached_prefix_tokens([by_id[room.replica_id] for room in rooms], prefix_ids)
        best = max(cached.values(), default=0)
        if best > 0:
            holders = [room for room in rooms if cached[room.replica_id] == best]
            return min(holders, key=Room.rank_key).replica_id
    if len(rooms) > max(p2c_threshold, 1):
        rooms = (rng or _DEFAULT_RNG).sample(rooms, 2)
    return min(rooms, key=Room.rank_key).replica_id


def cached_prefix_tokens(views: Sequence[ReplicaView], prefix_ids: Sequence[int]) -> dict[str, int]:
    """Per replica, the tokens of the longest block-aligned prefix of ``prefix_ids`` that its
    snapshot's cached states hold (0: none, or no snapshot)."""
    hashes_by_block: dict[int, list[int]] = {}  # the prefix's hashes, once per block size
    found = {}
    for view in views:
        cache = view.snapshot.state_cache if view.snapshot is not None else None
        if cache is None or not cache.block_hashes or cache.block_tokens <= 0:
            found[view.replica_id] = 0
            continue
        block = cache.block_tokens
        if block not in hashes_by_block:
            hashes_by_block[block] = chained_block_hashes(prefix_ids, block)
        held = [i for i, h in enumerate(hashes_by_block[block]) if h in cache.block_hashes]
        found[view.replica_id] = (held[-1] + 1) * block if held else 0
    return found
