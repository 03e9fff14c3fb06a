"""``HealthWatch``: the router's own check of its replicas, and the end of dead ones' entries.

Every ``interval_s`` it probes each live replica whose latest snapshot is older than
``stale_after_s`` (a ``ping`` that fails, times out or answers False declares it dead through
``on_dead``), and it forgets a dead replica ``retention_s`` after it died: until then ListReplicas
shows it DEAD and /metrics exports its ``replica_up`` 0 (so ReplicaDown can fire); afterwards its
series leave /metrics altogether (not before its failover has ended). Replicas also die faster
than this: a failed call, a broken output stream or the replica's own report of its engine's
death (``SessionRouter.replica_failed``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from router.call_errors import CallFailure
from router.control.api import ReplicaHealth
from router.control.registry import ReplicaRegistry
from router.control.table import ReplicaEntry

log = logging.getLogger(__name__)


class HealthWatch:
    def __init__(
        self,
        replicas: ReplicaRegistry,
        on_dead: Callable[[str, str], Awaitable[None]],
        stale_after_s: float,
        interval_s: float,
        retention_s: float,
    ) -> None:
        self.replicas = replicas
        self.on_dead = on_dead
        self.stale_after_s = stale_after_s
        self.interval_s = interval_s
        self.retention_s = retention_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.check()

    async def check(self) -> None:
        now = time.monotonic()
        for replica_id, entry in list(self.replicas.items()):
            if entry.health != ReplicaHealth.DEAD:
                if now - entry.reported_at > self.stale_after_s:
                    await self._probe(replica_id, entry, "snapshot stale")
            elif entry.died_at is not None and now - entry.died_at > self.retention_s:
                if entry.failover is not None and not entry.failover.done():
                    continue  # the controller would take it for one whose failover never ran
                if self.replicas.forget_dead(replica_id, entry):
                    log.info("forgot dead replica %s", replica_id)

    async def _probe(self, replica_id: str, entry: ReplicaEntry, why: str) -> None:
        try:
            ok = await asyncio.wait_for(entry.replica.ping(), timeout=self.stale_after_s)
        except Exception as exc:  # noqa: BLE001 - a failed probe is death, whatever its kind
            failure = CallFailure.of("ping", f"replica {replica_id}", exc)
            ok, why = False, f"{why}; ping failed ({failure.kind.value}): {failure.cause}"
            entry.call_errors["ping", "dead"] += 1  # a failed probe fences, whatever its kind
        if not ok:
            await self.on_dead(replica_id, why)
