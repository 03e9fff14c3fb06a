"""``CheckpointChain``: what a ``CheckpointStore`` keeps of one session, a whole state and the
delta checkpoints after it; ``fold``: base + deltas into one whole state.

A replica checkpoints a session's whole state once (its first checkpoint for the store that
follows it) and after that only what a turn changed: the recurrent state (fixed size) and the KV
positions written since the checkpoint before (``SessionMeta.kv_from``). A session's KV below
its committed length never changes (a turn only appends; one that fails is truncated back), so
the base's KV followed by each delta's is the session's KV, and the last delta's recurrent state
is its recurrent state. The store compacts a chain (``fold``) once it holds ``MAX_DELTAS``
deltas, and always before a chain is imported: a replica imports only whole states.
``per_session`` splits a record of several sessions into one record each: a replica exports a
step's checkpoints in one batched copy, and a store keeps each session's apart.

Torch-free (numpy only): the store's process never loads torch.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from replica.api import SessionMeta, SessionStates

MAX_DELTAS = 8  # deltas a chain holds before the store folds them into its base


class BrokenChainError(ValueError):
    """A delta that does not extend the chain it was given to (a bug: the replica sends a delta
    only after the record it extends)."""


@dataclass(slots=True, eq=False)
class CheckpointChain:
    """One session's checkpoint: ``refs[0]`` a whole state, then deltas in order (object refs,
    or the records themselves), with each part's bytes and sequence number in its store (a
    folded whole takes its last part's). ``meta`` is the latest part's."""

    meta: SessionMeta
    refs: list[Any]
    sizes: list[int]
    seqs: list[int]
    folding: asyncio.Lock = field(default_factory=asyncio.Lock)  # one fold at a time

    @classmethod
    def start(cls, meta: SessionMeta, nbytes: int, ref: Any, seq: int) -> CheckpointChain:
        if meta.kv_from:
            raise BrokenChainError(
                f"session {meta.session_id}: a delta from KV position {meta.kv_from} without "
                "the whole state it extends"
            )
        return cls(meta, [ref], [nbytes], [seq])

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    @property
    def whole_meta(self) -> SessionMeta:
        """The session's facts in the whole state the chain folds into."""
        return replace(self.meta, kv_from=0)

    @property
    def deltas(self) -> int:
        return len(self.refs) - 1

    def extend(self, meta: SessionMeta, nbytes: int, ref: Any, seq: int) -> None:
        if meta.kv_from != self.meta.committed_len:
            raise BrokenChainError(
                f"session {meta.session_id}: a delta from KV position {meta.kv_from} after a "
                f"checkpoint of {self.meta.committed_len}"
            )
        self.meta = meta
        self.refs.append(ref)
        self.sizes.append(nbytes)
        self.seqs.append(seq)

    def folded(self, parts: int, ref: Any, nbytes: int) -> None:
        """The first ``parts`` parts were folded into ``ref``: it replaces them."""
        self.refs[:parts] = [ref]
        self.sizes[:parts] = [nbytes]
        self.seqs[:parts] = [self.seqs[parts - 1]]


def fold(records: list[SessionStates]) -> SessionStates:
    """One whole state of a session from its base and deltas (``records``, in order)."""
    base, last = records[0], records[-1]
    for before, after in zip(records, records[1:]):
        (b,), (a,) = before.sessions, after.sessions
        if a.kv_from != b.committed_len or a.session_id != b.session_id:
            raise BrokenChainError(
                f"session {a.session_id}: a delta from {a.kv_from} after {b.committed_len}"
            )
    if base.sessions[0].kv_from:
        raise BrokenChainError(f"session {base.sessions[0].session_id}: no whole state to fold on")
    return replace(
        last,
        sessions=(replace(last.sessions[0], kv_from=0),),
        k=np.concatenate([r.k for r in records], axis=1),
        v=np.concatenate([r.v for r in records], axis=1),
    )


def per_session(record: SessionStates) -> list[SessionStates]:
    """One record for each session of ``record``, in its order, each with arrays of its own (a
    session's checkpoint keeps no other session's bytes alive)."""
    if len(record.sessions) == 1:
        return [record]
    out, at = [], 0
    for i, meta in enumerate(record.sessions):
        end = at + meta.committed_len - meta.kv_from
        out.append(
            replace(
                record,
                sessions=(meta,),
                conv=record.conv[:, i : i + 1].copy(),
                ssm=record.ssm[:, i : i + 1].copy(),
                k=record.k[:, at:end].copy(),
                v=record.v[:, at:end].copy(),
            )
        )
        at = end
    return out
