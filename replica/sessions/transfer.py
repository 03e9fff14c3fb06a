"""``StateTransfer``: sessions' whole state out of one replica's pools into a ``SessionStates``
record, and from such a record into another replica's pools.

- ``export(slots)``: idle sessions, resident or parked, in one batch: their live mamba state and
  the KV of their committed positions are gathered with one copy per state kind and tier (GPU,
  then host) into dense CPU tensors (``StateCopier`` writes straight into them), which the record
  carries as raw bytes. Nothing in the pools changes.
- ``import_(record)``: each session gets slots where this replica has room (GPU slots, parking
  idle sessions for them if need be, else host slots: it arrives parked), then the state is
  scattered into them with one copy per state kind and tier, straight from the record. A session
  without room is refused (``PoolExhaustedError``), the others land. If a copy fails, every
  slot the import took is given back before the error propagates.
Bytes are copied, never converted, so an imported session continues bit-identically. A record
of another model (fingerprint), state format or dtype is refused (``IncompatibleStateError``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from replica.api import (
    STATE_FORMAT,
    ContextOverflowError,
    IncompatibleStateError,
    InvalidRequestError,
    ReplicaError,
    SessionMeta,
    SessionStates,
)
from replica.config import PoolConfig
from replica.pools.host_pool import HostSlots
from replica.pools.hybrid_pool import HybridReqToTokenPool, SeqSlots
from replica.pools.state_copy import Places, StateCopier, StateTensors

if TYPE_CHECKING:
    from replica.sessions.table import SessionRecord, SessionTable


class StateTransfer:
    def __init__(
        self, sessions: SessionTable, copier: StateCopier, model: str, pools: PoolConfig
    ) -> None:
        self.sessions = sessions
        self.pool: HybridReqToTokenPool = sessions.pool
        self.copier = copier
        self.model = model
        self.max_context = pools.max_context
        self.state_dtype, self.kv_dtype = pools.state_torch_dtype, pools.kv_torch_dtype
        self.gpu = StateTensors.by_token(self.pool.mamba_pool, self.pool.kv_pool)
        parker = sessions.residency.parker
        self.host = StateTensors.by_token(parker.host.mamba, parker.host.kv) if parker else None
        self.bytes_moved = 0

    # ----- export -------------------------------------------------------------------------------

    def export(
        self,
        slots: Sequence[SessionRecord],
        leases: Mapping[str, float] | None = None,
        kv_from: Mapping[str, int] | None = None,
    ) -> SessionStates:
        """The state of idle sessions ``slots`` (resident ones first, then parked ones), with
        what is left of their stream leases (``leases``: session id -> seconds). ``kv_from``
        (session id -> position) makes a delta of a session: its KV from that position only."""
        resident = [s for s in slots if not s.parked]
        order = resident + [s for s in slots if s.parked]
        starts = [(kv_from or {}).get(s.session_id, 0) for s in order]
        lens = [s.committed_len - start for s, start in zip(order, starts)]
        dense = self.gpu.transient(len(order), sum(lens))
        split = len(resident), sum(lens[: len(resident)])
        at = self._gpu_places(resident, starts[: split[0]])
        self._copy(self.gpu, at, dense, _dense(0, 0, *split))
        if len(order) > len(resident):
            rest = len(order) - split[0], sum(lens) - split[1]
            hosts = [s.host for s in order[split[0] :]]
            ends = [s.committed_len for s in order[split[0] :]]
            parked = self._host_places(hosts, ends, starts[split[0] :])
            self._copy(self.host, parked, dense, _dense(split[0], split[1], *rest))
        leases = leases or {}
        meta = tuple(
            SessionMeta(
                s.session_id,
                s.tenant,
                s.idle_timeout_s,
                s.committed_len,
                s.pending_ids,
                leases.get(s.session_id, 0.0),
                start,
            )
            for s, start in zip(order, starts)
        )
        raw = (t.view(torch.uint8).numpy() for t in dense)
        return SessionStates(
            STATE_FORMAT, self.model, str(self.state_dtype), str(self.kv_dtype), meta, *raw
        )

    # ----- import -------------------------------------------------------------------------------

    def import_(self, record: SessionStates) -> tuple[list[SessionRecord], dict[str, ReplicaError]]:
        """Open the sessions of ``record`` here with their state; returns the records of those
        that landed and, for the others, why not."""
        src = self._tensors_of(record)
        offsets = [0]
        for meta in record.sessions:
            offsets.append(offsets[-1] + meta.committed_len)
        placed: list[tuple[int, SessionMeta, SeqSlots | None, HostSlots | None]] = []
        refused: dict[str, ReplicaError] = {}
        for i, meta in enumerate(record.sessions):
            try:
                self._check_fits(meta)
                seq, host = self.sessions.residency.place_imported(meta.committed_len)
            except ReplicaError as exc:
                refused[meta.session_id] = exc
                continue
            placed.append((i, meta, seq, host))
        try:
            for tier, on_gpu in ((self.gpu, True), (self.host, False)):
                chosen = [p for p in placed if (p[2] is not None) == on_gpu]
                if chosen:
                    at = _record_places([i for i, *_ in chosen], offsets)
                    self._copy(src, at, tier, self._places_of(chosen))
        except BaseException:
            for _, meta, seq, host in placed:
                self._give_back(meta, seq, host)
            raise
        return [self.sessions.adopt(meta, seq, host) for _, meta, seq, host in placed], refused

    def check(self, record: SessionStates) -> None:
        """Refuse a record this replica cannot import (``IncompatibleStateError``)."""
        if record.format != STATE_FORMAT:
            raise IncompatibleStateError(
                f"session state of format {record.format}; this replica reads {STATE_FORMAT}"
            )
        if record.model != self.model:
            raise IncompatibleStateError(
                f"session state of model {record.model} cannot run on this replica's model "
                f"{self.model}; move sessions only between replicas of the same model"
            )
        if (record.state_dtype, record.kv_dtype) != (str(self.state_dtype), str(self.kv_dtype)):
            raise IncompatibleStateError(
                f"session state in {record.state_dtype}/{record.kv_dtype}; this replica keeps "
                f"{self.state_dtype}/{self.kv_dtype}"
            )

    def _tensors_of(self, record: SessionStates) -> StateTensors:
        self.check(record)
        dtypes = (self.state_dtype, self.state_dtype, self.kv_dtype, self.kv_dtype)
        with warnings.catch_warnings():  # records arrive read-only; they are only read
            warnings.simplefilter("ignore", UserWarning)
            tensors = StateTensors(*(_from_raw(a, d) for a, d in zip(_arrays(record), dtypes)))
        deltas = [m.session_id for m in record.sessions if m.kv_from]
        if deltas:
            raise IncompatibleStateError(
                f"the state of {', '.join(deltas)} is a delta checkpoint; only a whole state "
                "(a checkpoint store folds a delta onto its base) can be imported"
            )
        sessions, tokens = len(record.sessions), sum(m.committed_len for m in record.sessions)
        for got, want, n in zip(tensors, self.gpu, (sessions, sessions, tokens, tokens)):
            if got.shape != (want.shape[0], n, *want.shape[2:]):
                raise IncompatibleStateError(
                    f"malformed session state: a tensor of shape {tuple(got.shape)} for "
                    f"{sessions} sessions of {tokens} tokens"
                )
        return tensors

    def _check_fits(self, meta: SessionMeta) -> None:
        if meta.session_id in self.sessions.sessions:
            raise InvalidRequestError(f"session {meta.session_id} is already open here")
        if meta.committed_tokens > self.max_context:
            raise ContextOverflowError(
                f"session {meta.session_id} holds {meta.committed_tokens} tokens; this replica "
                f"takes sessions of at most {self.max_context}"
            )

    def _give_back(self, meta: SessionMeta, seq: SeqSlots | None, host: HostSlots | None) -> None:
        if seq is not None:
            self.pool.free_seq(seq, meta.committed_len)
        else:
            self.sessions.residency.parker.host.free([host])

    # ----- places -------------------------------------------------------------------------------

    def _gpu_places(self, slots: Sequence[SessionRecord], starts: Sequence[int]) -> Places:
        table = self.pool.req_to_token
        rows = [table[s.seq.req_pool_idx, a : s.committed_len] for s, a in zip(slots, starts)]
        return Places(
            torch.tensor([s.seq.mamba_pool_idx for s in slots], dtype=torch.int64),
            torch.cat(rows).to("cpu", torch.int64) if rows else _empty(),
        )

    def _host_places(
        self, host: Sequence[HostSlots], lens: Sequence[int], starts: Sequence[int] | None = None
    ) -> Places:
        """Host slots of ``host`` and their KV positions ``starts[i]..lens[i]-1`` (from 0)."""
        page = self.pool.kv_pool.page_size
        offsets = torch.arange(page, dtype=torch.int64)
        starts = starts or [0] * len(host)
        tokens = [
            (h.kv_pages[:, None] * page + offsets).reshape(-1)[a:n]
            for h, n, a in zip(host, lens, starts)
        ]
        return Places(
            torch.tensor([h.mamba_idx for h in host], dtype=torch.int64),
            torch.cat(tokens) if tokens else _empty(),
        )

    def _places_of(self, placed: list[tuple[int, SessionMeta, Any, Any]]) -> Places:
        if placed[0][2] is not None:
            mamba = [seq.mamba_pool_idx for _, _, seq, _ in placed]
            table = self.pool.req_to_token
            rows = [table[seq.req_pool_idx, : m.committed_len] for _, m, seq, _ in placed]
            return Places(torch.tensor(mamba), torch.cat(rows).to("cpu", torch.int64))
        host = [h for *_, h in placed]
        return self._host_places(host, [m.committed_len for _, m, _, _ in placed])

    def _copy(self, src: StateTensors, at: Places, dst: StateTensors, to: Places) -> None:
        self.bytes_moved += self.copier.copy_state(src, at, dst, to)


def _arrays(record: SessionStates) -> tuple[Any, Any, Any, Any]:
    return record.conv, record.ssm, record.k, record.v


def _from_raw(array: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(array).view(dtype)


def _empty() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


def _dense(first_slot: int, first_token: int, slots: int, tokens: int) -> Places:
    return Places(
        torch.arange(first_slot, first_slot + slots),
        torch.arange(first_token, first_token + tokens),
    )


def _record_places(indices: list[int], offsets: list[int]) -> Places:
    """Where sessions ``indices`` of a record lie in it: their slots and token positions."""
    tokens = [torch.arange(offsets[i], offsets[i + 1]) for i in indices]
    return Places(torch.tensor(indices, dtype=torch.int64), torch.cat(tokens))
