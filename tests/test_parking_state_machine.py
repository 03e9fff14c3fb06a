"""Property-based test of parking at the session layer, against a model written independently of
the code under test.

The machine drives a ``StreamingSession`` with a host tier (real pools, real copies) the way the
scheduler does: open, start a turn (make room: park least recently used idle sessions, restore a
parked one, swap through the host when it is full), fold tokens (each fold writes unique values
into the session's live mamba state and the K/V of the folded positions), end or roll back the
turn, close (also parked sessions and during a turn), time passing (idle timeouts, parked
sessions included), and parking sessions idle for a while. The model predicts, from its own
bookkeeping (who is resident or parked, least recently active first, committed lengths, pages),
whether each open and each turn start succeeds, where each session's state lives and which
sessions are parked to make room; it also remembers every value a session's state must hold.

After every step: every pool (GPU and host) is consistent with 0 leaked, the allocators' free
lists are sound, every session lives where the model says, and every idle session's state —
read from wherever it lives — holds exactly the values the model remembers, bit for bit. After
closing everything, every pool is back at capacity.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from replica.api import PoolExhaustedError, ReleaseReason
from replica.sessions.request import Req
from tests.support.pools import assert_all_free, assert_consistent, make_pools, read_state

MAX_SESSIONS, MAX_PARKED = 3, 4
KV_TOKENS, HOST_KV_TOKENS, MAX_CONTEXT = 96, 64, 64
IDLE_TIMEOUT_S = 60.0


def pages(n: int, page: int) -> int:
    return -(-n // page)


@dataclass
class Sess:
    committed: int = 0
    pending: int = 0
    parked: bool = False
    order: int = 0  # when it was last active (smaller: parked first)
    last: float = 0.0  # clock time of its last activity (idle timeout, parking after idle)
    marker: float = 0.0  # every element of its live mamba state
    kv: dict[int, float] = field(default_factory=dict)  # K/V value of each committed position


@dataclass
class Turn:
    req: Req
    target: int
    marker: float | None = None
    kv: dict[int, float] = field(default_factory=dict)


def make_machine(page: int, track: int):
    class ParkingMachine(RuleBasedStateMachine):
        sids = Bundle("sids")

        def __init__(self) -> None:
            super().__init__()
            self.pool, self.sessions, self.clock = make_pools(
                max_sessions=MAX_SESSIONS,
                max_parked=MAX_PARKED,
                kv_tokens=KV_TOKENS,
                host_kv_tokens=HOST_KV_TOKENS,
                page_size=page,
                track=track,
                max_context=MAX_CONTEXT,
                idle_timeout_s=IDLE_TIMEOUT_S,
            )
            self.model: dict[str, Sess] = {}
            self.turns: dict[str, Turn] = {}
            self.ids = itertools.count(1)
            self.ticks = itertools.count(1)
            self.values = itertools.count(1)

        # ----- the model's arithmetic ---------------------------------------------------------

        def held(self, n: int) -> int:
            return pages(n, page) * page

        def idle_resident(self, keep: str = "") -> list[str]:
            idle = [s for s, m in self.model.items() if not m.parked and s not in self.turns]
            return sorted((s for s in idle if s != keep), key=lambda s: self.model[s].order)

        def gpu_free(self) -> tuple[int, int]:
            resident = [s for s, m in self.model.items() if not m.parked]
            used = sum(self.held(self.model[s].committed) for s in self.idle_resident())
            used += sum(self.held(t.target) for t in self.turns.values())
            return MAX_SESSIONS - len(resident), KV_TOKENS - used

        def host_used(self) -> tuple[int, int]:
            parked = [m for m in self.model.values() if m.parked]
            return len(parked), sum(pages(m.committed, page) for m in parked)

        def host_fits(self, sids: list[str], leaving: list[str] = ()) -> bool:
            n, used = self.host_used()
            more = sum(pages(self.model[s].committed, page) for s in sids)
            less = sum(pages(self.model[s].committed, page) for s in leaving)
            return (
                n + len(sids) - len(leaving) <= MAX_PARKED
                and used + more - less <= HOST_KV_TOKENS // page
            )

        def lru_victims(self, rows: int, kv: int, keep: str = "") -> list[str] | None:
            free_rows, free_kv = self.gpu_free()
            victims = []
            for sid in self.idle_resident(keep):
                if free_rows >= rows and free_kv >= kv:
                    break
                victims.append(sid)
                free_rows += 1
                free_kv += self.held(self.model[sid].committed)
            return victims if free_rows >= rows and free_kv >= kv else None

        def park_in_model(self, sids: list[str]) -> None:
            for sid in sids:
                self.model[sid].parked = True

        # ----- rules -------------------------------------------------------------------------

        @rule(target=sids)
        def open(self):
            sid = f"s{next(self.ids)}"
            free_rows, _ = self.gpu_free()
            victims = [] if free_rows else self.lru_victims(1, 0)
            if victims is not None and (free_rows or self.host_fits(victims)):
                self.park_in_model(victims)
                where = "gpu"
            elif self.host_used()[0] < MAX_PARKED:
                where = "host"
            else:
                with pytest.raises(PoolExhaustedError, match="replica is full"):
                    self.sessions.open(sid)
                return sid
            self.sessions.open(sid)
            self.model[sid] = Sess(
                parked=where == "host", order=next(self.ticks), last=self.clock.now
            )
            return sid

        @rule(sid=sids, n_input=st.integers(0, 20), new=st.integers(0, 8))
        def start_turn(self, sid, n_input, new):
            m = self.model.get(sid)
            if m is None or sid in self.turns:
                return
            target = m.committed + m.pending + n_input + max(0, new - 1)
            if target > MAX_CONTEXT:
                return
            slot = self.sessions.get(sid)
            self.sessions.residency.touch(slot)  # what Engine.submit does
            m.order, m.last = next(self.ticks), self.clock.now
            if m.parked:
                victims = self.lru_victims(1, self.held(target))
                ok = victims is not None and (
                    self.host_fits(victims) or self.host_fits(victims, leaving=[sid])
                )
            else:
                _, free_kv = self.gpu_free()
                need = self.held(target) - self.held(m.committed)
                victims = [] if need <= free_kv else self.lru_victims(0, need, keep=sid)
                ok = victims is not None and self.host_fits(victims)
            assert self.sessions.residency.room_for_turn(slot, target) == ok
            if not ok:
                return
            self.park_in_model(victims)
            m.parked = False
            req = Req(sid, [7] * n_input)
            self.sessions.restore_to_req(req)
            row = req.seq.req_pool_idx
            self.pool.kv_pool.extend(self.pool.req_to_token, row, req.kv_len, target)
            req.kv_len = target
            self.turns[sid] = Turn(req, target)

        @precondition(lambda self: self.turns)
        @rule(data=st.data(), n=st.integers(1, 12))
        def fold(self, data, n):
            sid = data.draw(st.sampled_from(sorted(self.turns)))
            turn = self.turns[sid]
            req = turn.req
            n = min(n, len(req.input_ids) - req.turn_folded, turn.target - req.folded_len)
            if n <= 0:
                return
            marker = float(next(self.values))
            mamba = self.pool.mamba_pool
            mamba.conv_all[:, req.seq.mamba_pool_idx] = marker
            mamba.ssm_all[:, req.seq.mamba_pool_idx] = marker
            kv = self.pool.kv_pool
            for pos in range(req.folded_len, req.folded_len + n):
                value = float(next(self.values))
                slot = int(self.pool.req_to_token[req.seq.req_pool_idx, pos])
                kv.k_all[:, slot] = value
                kv.v_all[:, slot] = -value
                turn.kv[pos] = value
            req.folded_len += n
            turn.marker = marker

        def finish(self, sid: str, commit: bool) -> None:
            turn = self.turns.pop(sid)
            m = self.model[sid]
            req = turn.req
            closing = self.sessions.sessions[sid].close_reason is not None
            if commit or not track:
                self.sessions.save_from_req(req)
                m.pending = len(req.input_ids) - req.turn_folded
                m.committed = req.folded_len
                m.kv.update(turn.kv)
                m.marker = m.marker if turn.marker is None else turn.marker
            else:
                self.sessions.rollback(req)
            m.kv = {p: v for p, v in m.kv.items() if p < m.committed}
            m.order, m.last = next(self.ticks), self.clock.now
            if closing:
                del self.model[sid]

        @precondition(lambda self: self.turns)
        @rule(data=st.data(), commit=st.booleans())
        def end_turn(self, data, commit):
            self.finish(data.draw(st.sampled_from(sorted(self.turns))), commit)

        @rule(sid=sids)
        def close(self, sid):
            was_open = sid in self.model and (
                sid not in self.turns or self.sessions.sessions[sid].close_reason is None
            )
            assert self.sessions.release_session(sid) == was_open
            assert self.sessions.release_session(sid) is False  # idempotent
            if sid in self.turns:  # deferred: the engine cancels the turn
                self.finish(sid, commit=False)
            self.model.pop(sid, None)
            assert sid not in self.sessions.sessions

        @rule(seconds=st.floats(0, 40))
        def time_passes(self, seconds):
            self.clock.now += seconds
            expired = {
                s
                for s, m in self.model.items()
                if s not in self.turns and self.clock.now - m.last > IDLE_TIMEOUT_S
            }
            assert set(self.sessions.idle_expired()) == expired
            for sid in expired:
                self.sessions.release_session(sid, ReleaseReason.IDLE_TIMEOUT)
                del self.model[sid]

        @rule(idle_s=st.sampled_from([0.0, 10.0, 30.0]))
        def park_idle(self, idle_s):
            batch = []
            for sid in self.idle_resident():
                if self.clock.now - self.model[sid].last < idle_s:
                    break
                if not self.host_fits([*batch, sid]):
                    break
                batch.append(sid)
            assert self.sessions.residency.park_idle(idle_s) == len(batch)
            self.park_in_model(batch)

        # ----- checks ------------------------------------------------------------------------

        @invariant()
        def accounted(self):
            running = [t.req for t in self.turns.values()]
            snap = assert_consistent(self.pool, self.sessions, running)
            assert {s for s, m in self.model.items() if m.parked} == set(self.sessions.parked)
            assert set(self.model) == set(self.sessions.sessions)
            assert snap.pool("host_mamba").session_held == len(self.sessions.parked)
            for sid, m in self.model.items():
                if sid in self.turns:
                    continue
                slot = self.sessions.sessions[sid]
                assert (slot.committed_len, len(slot.pending_ids)) == (m.committed, m.pending)
                state = read_state(self.sessions, sid)
                assert torch.all(state["conv"] == m.marker) and torch.all(state["ssm"] == m.marker)
                want = torch.tensor([m.kv[p] for p in range(m.committed)])
                want = want[None, :, None, None].expand_as(state["k"])
                assert torch.equal(state["k"], want), sid
                assert torch.equal(state["v"], -want), sid

        def teardown(self):
            for sid in list(self.sessions.sessions):
                self.sessions.release_session(sid)
            for sid in list(self.turns):
                self.finish(sid, commit=False)
            assert_all_free(self.pool, self.sessions)

    return ParkingMachine


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("track", [0, 1, 2])
def test_parking_state_machine(page_size, track):
    run_state_machine_as_test(make_machine(page_size, track))
