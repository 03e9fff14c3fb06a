"""Failpoints: faults a test or a chaos run switches on, inert unless set.

``SESSION_ROUTER_FAILPOINTS=name[,name...]`` in the environment of ``session-router serve`` is
read once at start-up and handed to every replica in its ``ReplicaConfig``; tests set
``ReplicaConfig.failpoints`` directly. Each failpoint brings back one failure that a detector
exists to catch:

- ``leak_mamba_on_release``: release frees the KV and the row but not the mamba slots (the bug
  this project was built to fix); caught by the strict invariant, /metrics ``leaked`` and alerts.
- ``leak_kv_on_release``: the same for the KV pages.
- ``engine_step_raises``: the next engine step raises outside any turn's error handling, so the
  engine loop dies; caught by dead-replica detection.
- ``drop_snapshots``: the replica stops pushing snapshots; caught by stale-snapshot detection.
- ``leak_checkpoint_on_release``: a released session's checkpoint is not freed in its replica's
  checkpoint store; caught by the ``checkpoints`` pool's ``leaked`` count (/metrics, alerts).
- ``park_copy_fails`` / ``park_host_alloc_fails``: a GPU<->host state copy / host-slot
  allocation of parking raises, once: the first, or the N-th with ``park_copy_fails:N``; the park,
  restore or swap rolls back, the turn that needed it fails, no session loses its state
  (``replica.sessions.parking``).
- ``replica_call_raises``: the replica's first turn submission (``submit_turns``) and its first
  open (``open_sessions``) each raise an ordinary exception inside the actor, once, before
  touching any state (``CallFaults``); the replica stays alive and well, so its callers must
  fail that one call INTERNAL and keep the replica in service (``router.call_errors``).
- ``import_fails`` / ``import_crashes``: the replica's first (or N-th, ``import_fails:N``)
  ``import_sessions`` raises an ordinary exception before it touches any state / ends the
  replica's process once the imported sessions are open in its pools, before it answers (a
  target that dies mid-import). A migration then fails INTERNAL or UNAVAILABLE with the blame on
  the target, and the sessions stay on the source and go on there; a failover imports them on
  another replica (``router.control.migration``, ``router.control.failover``).
- ``import_stalls``: the replica's first (or N-th) ``import_sessions`` holds its answer for
  ``STALL_S`` once the imported sessions are open in its pools (the actor serves meanwhile), so
  a test can declare the target dead mid-import: nothing may be pinned to it when it answers
  (``router.control.moving``); the sessions stay on their source, or a failover tries another.
- ``import_lands_late``: the replica's first (or N-th) ``import_sessions`` waits, before it
  touches any state, until the replica reports to another router than the one that sent the
  move (at most ``LATE_S``): a move cut off by its router's death that would land after the
  restarted router learned this replica's sessions. It is refused (``replica.actor.moves``).
- ``finish_export_fails`` / ``finish_export_crashes``: the first (or N-th) ``finish_export`` of a
  move that landed raises before it touches any state / ends the source's process: the sessions
  are on the target and still on the source. The router keeps exactly one copy: the target's
  if the source is gone, else the source's (the target's is released; ``router.control.landing``).
- ``checkpoint_ack_fails``: the replica's first (or N-th) ``checkpoints_acked`` raises before it
  touches any state, as a transient Ray error would: the store sends that acknowledgement again
  (else the ``checkpoints`` pool would show the counts before it until the next item).
The counted faults ``import_*``, ``finish_export_*`` and ``checkpoint_ack_fails`` may also be
armed on a live replica, for tests and chaos runs, with ``CallFaults.arm`` (through the actor's
``__ray_call__``); each fires once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping

ENV_VAR = "SESSION_ROUTER_FAILPOINTS"
NAMES = (
    "leak_mamba_on_release",
    "leak_kv_on_release",
    "engine_step_raises",
    "drop_snapshots",
    "leak_checkpoint_on_release",
    "park_copy_fails",
    "park_host_alloc_fails",
    "replica_call_raises",
    "import_fails",
    "import_crashes",
    "import_stalls",
    "import_lands_late",
    "finish_export_fails",
    "finish_export_crashes",
    "checkpoint_ack_fails",
)
COUNTED = (
    "import_fails",
    "import_crashes",
    "import_stalls",
    "import_lands_late",
    "finish_export_fails",
    "finish_export_crashes",
    "checkpoint_ack_fails",
)
STALL_S = 8.0  # how long ``import_stalls`` holds its import's answer
LATE_S = 60.0  # how long ``import_lands_late`` waits at most
HOLD_POLL_S = 0.05
CALLS_THAT_RAISE = ("submit_turns", "open_sessions")  # what replica_call_raises arms, once each


def parse(value: str) -> frozenset[str]:
    """The failpoints named in a comma-separated ``value`` (``name`` or ``name:N``); unknown
    names raise ``ValueError``."""
    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    unknown = sorted(n for n in names if n.split(":")[0] not in NAMES or not _count_ok(n))
    if unknown:
        raise ValueError(f"unknown failpoints {unknown} in {ENV_VAR}; known: {', '.join(NAMES)}")
    return names


def _count_ok(name: str) -> bool:
    return ":" not in name or name.split(":", 1)[1].isdigit() and int(name.split(":", 1)[1]) > 0


def occurrence(names: frozenset[str], name: str) -> int | None:
    """Which occurrence of its fault ``name`` fires on (``name:N``: the N-th; ``name``: the
    first); None when it is not set."""
    for entry in names:
        base, _, n = entry.partition(":")
        if base == name:
            return int(n) if n else 1
    return None


def from_env(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    return parse(environ.get(ENV_VAR, ""))


def check(names: frozenset[str]) -> frozenset[str]:
    """``names`` itself when every one is a known failpoint."""
    return parse(",".join(names))


class InjectedCallError(RuntimeError):
    """The exception ``replica_call_raises`` raises: an application error, not a dead actor."""


class CallFaults:
    """The calls still armed to raise once (``replica_call_raises``), and the counted faults of
    ``COUNTED`` still to fire (each once, on its N-th occurrence); empty when none is set.
    Owned by one replica actor, used on its event loop only."""

    def __init__(self, names: frozenset[str]) -> None:
        self._armed = set(CALLS_THAT_RAISE) if "replica_call_raises" in names else set()
        # fault name -> how many more of its occurrences pass before it fires
        self._countdown = {
            name: n - 1 for name in COUNTED if (n := occurrence(names, name)) is not None
        }
        self.stalled = 0  # stalls begun (``stall_if``), for a test to wait on

    def arm(self, name: str, n: int = 1) -> None:
        """Make the counted fault ``name`` fire on its ``n``-th occurrence from now, once."""
        if name not in COUNTED or n < 1:
            raise ValueError(f"{name}:{n} is not a counted failpoint; those are {COUNTED}")
        self._countdown[name] = n - 1

    def fires(self, name: str) -> bool:
        """One occurrence of the counted fault ``name``: whether it fires now (disarming it)."""
        left = self._countdown.get(name)
        if left is None:
            return False
        if left > 0:
            self._countdown[name] = left - 1
            return False
        del self._countdown[name]
        return True

    def raise_if(self, name: str, call: str) -> None:
        """Raise ``InjectedCallError`` in ``call`` if the counted fault ``name`` fires now."""
        if self.fires(name):
            raise InjectedCallError(f"failpoint {name}: {call} raised")

    def crash_if(self, name: str) -> None:
        """End this process at once, as a SIGKILL would, if the counted fault ``name`` fires."""
        if self.fires(name):
            os._exit(1)

    async def stall_if(self, name: str) -> None:
        """Hold the caller ``STALL_S`` if the counted fault ``name`` fires now (the actor goes
        on serving other calls meanwhile)."""
        if self.fires(name):
            self.stalled += 1
            await asyncio.sleep(STALL_S)

    async def hold_if(self, name: str, until: Callable[[], bool], limit_s: float) -> None:
        """Hold the caller until ``until()`` (at most ``limit_s``) if the counted fault ``name``
        fires now (the actor goes on serving other calls meanwhile)."""
        if self.fires(name):
            self.stalled += 1
            deadline = asyncio.get_running_loop().time() + limit_s
            while not until() and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(HOLD_POLL_S)

    def trip(self, call: str) -> None:
        """Raise ``InjectedCallError`` if ``call`` is still armed (disarming it)."""
        if call in self._armed:
            self._armed.discard(call)
            raise InjectedCallError(f"failpoint replica_call_raises: {call} raised")
