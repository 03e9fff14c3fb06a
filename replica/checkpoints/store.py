"""``CheckpointStore``: the Ray actor that keeps one replica's session checkpoints alive after the
replica's death.

The controller starts one per replica, on another node than the replica's when the cluster
has one, and tells it to ``follow`` the replica: the store then pulls the replica's checkpoints,
each item a list of entries (``CheckpointOutbox``), from a socket of its own to the replica
(``ReplicaClient.checkpoint_items``: each item read into the store's memory, on its node), or
where the replica has none, through one long-lived streaming call (``ReplicaActor.
checkpoint_stream``): Ray makes the caller of a streaming call the owner of its items, so each
is the *store's*, and the replica's process can die with the item still readable; on another
node than the replica's the store copies each once into an object of its own, on its node, so
that the replica's node can die too. Either way one item is in flight at a time, and the
replica knows the store has an item when it may send the next: that is when the replica counts
its checkpoints stored (no acknowledgement waits for it). It keeps
the latest checkpoint of each session (its ``CheckpointChain``: a whole state, then the deltas
of the turns after it, folded into one whole state every ``MAX_DELTAS`` deltas, in a thread)
until the replica says the session was released (``CheckpointDrop``), and the sessions that hold
nothing yet (``CheckpointBlank``, until their first checkpoint or their release: what a failover
that no router remembers them for opens again empty), and acknowledges what it
has taken (``checkpoints_acked``, at most every ``ACK_INTERVAL_S``: the replica's accounting
compares its count with what the replica expects). A replica that stops hearing from it (it
stalled) ends the stream; the controller's ``StoreKeeper`` then has it ``follow`` again, from
nothing: the replica sends every session's checkpoint again.

With a ``checkpoint_dir`` (``--checkpoint-dir``) each item is also written there
(``CheckpointFiles``) before the replica counts it stored (it waits for the acknowledgement
then), so a failover whose store died too reads it.

When the replica dies the stream ends; ``checkpoints`` waits for that end (every item the
replica yielded is in), folds each chain into one whole state and answers their refs for the
router's failover, which imports them on live replicas straight from the object store and then
ends this store. The failover first ``fence``s the store, as the replica is declared dead: from
then on the store keeps every checkpoint it holds, whatever the replica says. A replica declared
dead may be alive (stopped, then continued): it goes on releasing its sessions (idle timeouts,
the router's release of a fenced replica's sessions), and a drop that reached the store before
the failover's read would leave the session with no checkpoint to restore.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray

from replica.actor.client import ReplicaClient
from replica.api import SessionMeta, SessionStates
from replica.checkpoints.chain import MAX_DELTAS, BrokenChainError, CheckpointChain, fold
from replica.checkpoints.entries import CheckpointBlank, CheckpointDrop
from replica.checkpoints.files import CheckpointFiles
from replica.checkpoints.outbox import ACK_INTERVAL_S
from replica.checkpoints.released import ReleasedSessions

log = logging.getLogger(__name__)

ACK_WAIT_S = 10.0  # how long a new stream waits for the last one's acknowledgements to land


class CheckpointStore:
    def __init__(self, replica_id: str, checkpoint_dir: str = "") -> None:
        self.replica_id = replica_id
        self.files = CheckpointFiles(checkpoint_dir, replica_id) if checkpoint_dir else None
        self._seq = 0  # the last part's sequence number: increasing across streams
        self.fenced = False  # the replica was declared dead: drops are ignored (``fence``)
        self.kept: set[str] = set()  # sessions released since the fence, their checkpoints kept
        self.saved: dict[str, CheckpointChain] = {}
        self.blank: dict[str, tuple[str, float]] = {}  # session id -> tenant, idle timeout
        self.released = ReleasedSessions()  # kept across streams: the replica's own word
        self.folds = 0  # chains folded into one whole state
        self._folding: set[asyncio.Task] = set()
        self.items = 0
        self.acked = 0
        self.over_socket = False  # whether the stream now followed is the replica's socket
        self._ended: asyncio.Event | None = None
        self._acking: asyncio.Task | None = None
        self._pull: asyncio.Task | None = None

    async def follow(self, replica: Any, replica_node: str) -> None:
        """Start pulling ``replica``'s checkpoints; idempotent while its stream is open. Once the
        stream ended (the replica stopped waiting for this store's acknowledgements), it starts
        over from nothing: the replica sends every session's checkpoint again."""
        if self._pull is None or self._pull.done():
            if self._acking is not None:  # the last stream's acknowledgements land first
                await asyncio.wait([self._acking], timeout=ACK_WAIT_S)
            here = ray.get_runtime_context().get_node_id()
            self._ended = asyncio.Event()
            self._pull = asyncio.get_running_loop().create_task(
                self._follow(replica, copy_here=here != replica_node)
            )

    async def following(self) -> bool:
        """Whether its stream from the replica is open."""
        return self._pull is not None and not self._pull.done()

    async def _follow(self, replica: Any, copy_here: bool) -> None:
        me = ray.get_runtime_context().current_actor
        self.saved.clear()
        self.blank.clear()
        self.items = self.acked = 0
        confirm = self.files is not None  # on the volume before the replica counts it stored
        try:
            client = ReplicaClient(replica)
            stream, self.over_socket = await client.checkpoint_items(
                store=me, confirm_on_ack=confirm
            )
            copy_here = copy_here and not self.over_socket  # a socket's are read into here
            async for entries in stream:
                for item in entries:
                    self._seq = seq = max(self._seq + 1, time.time_ns())
                    if isinstance(item, CheckpointDrop):
                        await self._drop(item, seq)
                    elif isinstance(item, CheckpointBlank):
                        for sid, tenant, idle in item.sessions:
                            self.blank[sid] = (tenant, idle)
                            self.released.forget(sid)
                    else:
                        if confirm:
                            await asyncio.to_thread(self._write, item, seq)
                        self._keep(item, ray.put(item) if copy_here else item, seq)
                    self.items += 1  # only now: an acknowledgement counts what ``saved`` holds
                self._ack(replica)
        except Exception as exc:  # noqa: BLE001 - the replica died: keep what we have
            log.info("checkpoint stream of %s ended: %s", self.replica_id, exc)
        finally:
            self._ended.set()

    async def _drop(self, drop: CheckpointDrop, seq: int) -> None:
        """Free the checkpoints of released sessions, unless fenced (``fence``)."""
        if self.fenced:
            self.kept.update(sid for sid in drop.session_ids if sid in self.saved)
            return
        if self.files is not None:
            await asyncio.to_thread(self._write, drop, seq)
        for session_id in drop.session_ids:
            self.saved.pop(session_id, None)
            self.blank.pop(session_id, None)
        self.released.add(drop.session_ids)

    def _write(self, item: SessionStates | CheckpointDrop, seq: int) -> None:
        try:
            if isinstance(item, CheckpointDrop):
                self.files.drop(item.session_ids)
            else:
                self.files.write(item, seq)
        except OSError:  # the volume failed: the checkpoint is still held here
            log.exception("writing checkpoints of %s to %s", self.replica_id, self.files.dir)

    def _keep(self, record: SessionStates, ref: Any, seq: int) -> None:
        meta = record.sessions[0]
        self.blank.pop(meta.session_id, None)
        self.released.forget(meta.session_id)
        try:
            if meta.kv_from:
                chain = self.saved[meta.session_id]
                chain.extend(meta, record.nbytes, ref, seq)
            else:
                chain = self.saved[meta.session_id] = CheckpointChain.start(
                    meta, record.nbytes, ref, seq
                )
        except (KeyError, BrokenChainError) as exc:
            # never restore a state that is not the session's: hold none (the replica's
            # checkpoints pool shows it, ``leaked`` below 0)
            log.error("checkpoint of %s dropped: %s", meta.session_id, exc)
            self.saved.pop(meta.session_id, None)
            return
        if chain.deltas >= MAX_DELTAS and not chain.folding.locked():
            task = asyncio.get_running_loop().create_task(self._fold(meta.session_id, chain))
            self._folding.add(task)
            task.add_done_callback(self._folding.discard)

    async def _fold(self, session_id: str, chain: CheckpointChain) -> None:
        """Fold ``chain``'s parts so far into one whole state (in a thread); the deltas that
        arrive meanwhile stay after it. A chain replaced or dropped meanwhile is left alone."""
        async with chain.folding:
            if not chain.deltas or self.saved.get(session_id) is not chain:
                return
            try:
                parts, seq = list(chain.refs), chain.seqs[-1]
                records = [await p if isinstance(p, ray.ObjectRef) else p for p in parts]
                whole = await asyncio.to_thread(fold, records)
                del records
                if self.files is not None and self.saved.get(session_id) is chain:
                    await asyncio.to_thread(self.files.write, whole, seq, True)
                if self.saved.get(session_id) is chain:
                    chain.folded(len(parts), ray.put(whole), whole.nbytes)
                    self.folds += 1
            except Exception:  # noqa: BLE001 - the chain stays as it was: base and deltas
                log.exception("folding the checkpoint of %s", session_id)

    def _ack(self, replica: Any) -> None:
        """Acknowledge the entries taken so far: one acknowledgement in flight at a time, and
        unless they confirm what is on the volume (the replica then waits for them), one per
        ``ACK_INTERVAL_S`` at most (they carry counts only: the stream tells the replica what
        the store has)."""
        if self._acking is None or self._acking.done():
            interval_s = ACK_INTERVAL_S if self.files is None else 0.0
            task = self._send_acks(replica, interval_s, self._ended)
            self._acking = asyncio.get_running_loop().create_task(task)

    async def _send_acks(self, replica: Any, interval_s: float, ended: asyncio.Event) -> None:
        """Until every entry taken is acknowledged. One that fails while the replica lives (a
        transient Ray error, a call that raised) is sent again after ``ACK_INTERVAL_S``: the
        last one after a drop is the only news of that drop the replica's accounting gets.
        Stops when the replica died or this stream ended (a new stream counts afresh)."""
        while self.acked < self.items:
            sent = self.acked = self.items
            # what it holds for the replica's open sessions: a checkpoint kept past its
            # session's release (``fence``) is the failover's, not a leak of the replica's
            held = [chain for sid, chain in self.saved.items() if sid not in self.kept]
            held_bytes = sum(chain.nbytes for chain in held)
            try:
                await ReplicaClient(replica).checkpoints_acked(
                    seq=sent, held=len(held), held_bytes=held_bytes
                )
            except ray.exceptions.ActorDiedError:
                return
            except Exception as exc:  # noqa: BLE001 - the replica lives: send it again
                if ended.is_set():
                    return
                log.warning("acknowledging checkpoints to %s failed: %s", self.replica_id, exc)
                if self.acked == sent:
                    self.acked = sent - 1  # at least this one again, with the counts then
                await asyncio.sleep(ACK_INTERVAL_S)
                continue
            if interval_s:
                await asyncio.sleep(interval_s)

    async def fence(self) -> None:
        """The replica was declared dead: keep every checkpoint held now, ignoring the drops
        that come after (idempotent; the failover that reads them ends this store). Those kept
        past their session's release are left out of the acknowledged count: a replica that
        comes back sees its own sessions' checkpoints only, and no leak."""
        if not self.fenced:
            self.fenced = True
            log.warning(
                "%s declared dead: its checkpoints are kept for its failover", self.replica_id
            )

    async def checkpoints(
        self, session_ids: list[str], wait_s: float
    ) -> dict[str, tuple[SessionMeta, list[Any]]]:
        """The latest checkpoints of ``session_ids`` (those it has): meta and [ObjectRef of a
        whole state]. For a failover: waits up to ``wait_s`` for the dead replica's stream to
        end first."""
        if self._ended is not None:
            try:
                await asyncio.wait_for(self._ended.wait(), wait_s)
            except asyncio.TimeoutError:
                log.warning(
                    "checkpoint stream of %s still open after %.1fs", self.replica_id, wait_s
                )
        found = {sid: self.saved[sid] for sid in session_ids if sid in self.saved}
        for sid, chain in found.items():
            await self._fold(sid, chain)
        return {sid: (chain.whole_meta, [as_ref(chain.refs[0])]) for sid, chain in found.items()}

    async def stats(self) -> tuple[int, int]:
        """Checkpoints held, and their bytes."""
        return len(self.saved), sum(chain.nbytes for chain in self.saved.values())

    async def sessions(self) -> dict[str, tuple[str, float | None]]:
        """The sessions it holds a checkpoint of, or knows to hold nothing yet: session id ->
        tenant, and the idle timeout of a blank one (None: it has a checkpoint). What a router
        that restarted during this replica's failover has to restore, or open again empty."""
        held: dict[str, tuple[str, float | None]] = {
            sid: (tenant, idle) for sid, (tenant, idle) in self.blank.items()
        }
        held.update((sid, (chain.meta.tenant, None)) for sid, chain in self.saved.items())
        return held

    async def released_of(self, session_ids: list[str]) -> list[str]:
        """Those of ``session_ids`` the replica released before it was declared dead (their
        drop came before the fence, and nothing of them since): not lost with it."""
        return self.released.among(session_ids)

    async def handed_over(self, session_ids: list[str]) -> None:
        """A failover restored ``session_ids`` elsewhere: their checkpoints here are dropped
        (the fenced store ignores the dead replica's drops), so that a failover that starts
        over (the router restarted meanwhile) restores only those it had not restored yet.
        Idempotent. Their files go too (a failover whose store died reads the files)."""
        for sid in session_ids:
            self.saved.pop(sid, None)
            self.blank.pop(sid, None)
            self.kept.discard(sid)
        if self.files is not None:
            await asyncio.to_thread(self.files.drop, list(session_ids))


def as_ref(part: Any) -> ray.ObjectRef:
    """A reference to a kept part: the failover's target reads it from the object store."""
    return part if isinstance(part, ray.ObjectRef) else ray.put(part)
