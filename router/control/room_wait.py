"""``place_waiting``: a dead replica's sessions placed on live replicas, waiting for room ahead
of new opens (the loop that a failover's restores and its blank reopens share).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from router.control.migration import Migrator
from router.control.opens import Opener


class Landed(NamedTuple):
    """What one round of placing did: the sessions that landed (id -> committed tokens), those
    a target refused for want of room (they wait again), and those targets (set aside until
    room appears)."""

    sessions: dict[str, int]
    full: list[str]
    full_targets: set[str]


async def place_waiting(
    ids: list[str],
    dead: str,
    migrator: Migrator,
    opener: Opener,
    wait_s: float,
    land: Callable[[dict[str, list[str]]], Awaitable[Landed]],
    later: int = 0,
) -> tuple[dict[str, int], list[str]]:
    """Place ``ids`` (sessions of the dead replica ``dead``) in groups that placement chooses
    (target -> session ids), each round handed to ``land``. Sessions that find no room wait for
    it up to ``wait_s``; room for those still to place, and for the ``later`` sessions the
    caller places after these, is claimed ahead of new opens (``Opener.claim_room``, under
    ``dead``; when this call returns the claim is ``later``: the caller's to end). Returns the
    sessions that landed and those that found no room in time."""
    landed: dict[str, int] = {}
    pending, excluded = sorted(ids), {dead}
    deadline = time.monotonic() + wait_s
    try:
        while pending:
            await opener.claim_room(dead, len(pending) + later)
            groups = migrator.assign(pending, None, excluded)
            if not groups:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await opener.wait_for_room(min(1.0, left))
                excluded = {dead}
                continue
            pending = unassigned(pending, groups)  # no room in view for them: they wait
            done = await land(groups)
            landed.update(done.sessions)
            pending += done.full
            excluded |= done.full_targets
    finally:
        await opener.claim_room(dead, later)
    return landed, pending


def unassigned(ids: list[str], groups: dict[str, list[str]]) -> list[str]:
    """Those of ``ids`` that placement gave no target (it ran out of room in view): they wait
    for room with the refused ones, never dropped."""
    assigned = {sid for sids in groups.values() for sid in sids}
    return [sid for sid in ids if sid not in assigned]
