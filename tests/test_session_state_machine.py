"""Property-based test of the session layer against a model of its own.

Random sequences of open (with the default or a shorter idle timeout), turn start, token growth
(also past the KV pool's room), turn end, interrupted turn (rollback), close (also during a turn,
deferred to the turn's end), double close, time passing with idle timeouts, and allocations that do
not fit. The machine keeps its own record of every session (open, idle or running, closing, its KV
positions, when it was last active, its timeout, the mamba state it must hold) and decides from it
alone what must fit, what must be refused and which sessions must expire. After every step the
allocators' free counts and the snapshot's counts equal what the model says, the strict invariant
holds, each idle session holds the state its last committed turn left (or the checkpoint, after a
rollback with a track buffer), and the open/release counters match.

Sizes (page size 1 or 16, 0-2 track buffers, 1-4 sessions, a KV pool of 64 or 160 tokens) are drawn
per example; the machine runs for both shapes of recurrent state (Mamba2, gated DeltaNet). A run
with the seed's bug switched on (``leak_mamba_on_release``) must fail.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from replica.api import (
    PoolExhaustedError,
    ReleaseReason,
    SessionNotFoundError,
    TurnRunningError,
)
from replica.model.config import ModelConfig
from replica.sessions.request import Req
from tests.support.machines import expect_failure
from tests.support.pool_oracle import Capacity, check_pools
from tests.support.pools import (
    STATE_MODELS,
    TINY_MODEL,
    assert_consistent,
    grow,
    make_pools,
    snapshot,
)

DEFAULT_TIMEOUT_S = 60.0
MAX_CONTEXT = 96


@dataclass
class ModelSession:
    """The machine's own record of one session."""

    timeout_s: float
    last_active: float
    committed: int = 0  # KV positions its state covers between turns
    marker: float = 0.0  # the mamba SSM value its state must hold between turns
    turn: Req | None = None
    positions: int = 0  # KV positions the running turn holds
    folded: int = 0  # positions the running turn has folded in
    closing: ReleaseReason | None = None  # closed during its turn: released when it ends


def make_machine(state_model: ModelConfig = TINY_MODEL, failpoints: frozenset[str] = frozenset()):
    class SessionMachine(RuleBasedStateMachine):
        @initialize(
            page_size=st.sampled_from([1, 16]),
            track=st.integers(0, 2),
            max_sessions=st.integers(1, 4),
            kv_tokens=st.sampled_from([64, 160]),
        )
        def build(self, page_size, track, max_sessions, kv_tokens):
            self.cap = Capacity(max_sessions, track, kv_tokens, page_size)
            self.pool, self.sessions, self.clock = make_pools(
                max_sessions=max_sessions,
                kv_tokens=kv_tokens,
                page_size=page_size,
                track=track,
                max_context=MAX_CONTEXT,
                idle_timeout_s=DEFAULT_TIMEOUT_S,
                failpoints=failpoints,
                model=state_model,
            )
            self.model: dict[str, ModelSession] = {}
            self.opened = 0
            self.released: Counter[str] = Counter()
            self.ids = itertools.count(1)
            self.known: list[str] = []  # every id ever opened or refused

        # ----- the model's view -----------------------------------------------------------------

        def idle(self) -> dict[str, ModelSession]:
            return {sid: m for sid, m in self.model.items() if m.turn is None}

        def running(self) -> dict[str, ModelSession]:
            return {sid: m for sid, m in self.model.items() if m.turn is not None}

        def free_pages(self) -> int:
            held = sum(
                self.cap.pages(m.positions if m.turn else m.committed) for m in self.model.values()
            )
            return self.cap.kv_pages - held

        def ssm(self, mamba_idx: int) -> float:
            return float(self.pool.mamba_pool.ssm[0][mamba_idx, 0, 0, 0])

        def forget(self, sid: str, reason: ReleaseReason) -> None:
            del self.model[sid]
            self.released[reason.value] += 1

        # ----- rules ------------------------------------------------------------------------------

        @rule(timeout_s=st.sampled_from([0.0, 5.0, 30.0]))
        def open(self, timeout_s):
            sid = f"s{next(self.ids)}"
            self.known.append(sid)
            if len(self.model) < self.cap.max_sessions:
                self.sessions.open(sid, timeout_s)
                self.model[sid] = ModelSession(timeout_s or DEFAULT_TIMEOUT_S, self.clock.now)
                self.opened += 1
            else:
                with pytest.raises(PoolExhaustedError):
                    self.sessions.open(sid, timeout_s)

        @precondition(lambda self: self.idle())
        @rule(data=st.data(), n_input=st.integers(0, 40))
        def start_turn(self, data, n_input):
            sid = data.draw(st.sampled_from(sorted(self.idle())))
            m = self.model[sid]
            req = Req(sid, [7] * n_input)
            self.sessions.restore_to_req(req)
            m.turn, m.positions, m.folded = req, m.committed, m.committed

        @precondition(lambda self: self.known)
        @rule(data=st.data())
        def misuse(self, data):
            """A turn on a session that is closed, closing or busy; a close of a closed one."""
            sid = data.draw(st.sampled_from(self.known))
            m = self.model.get(sid)
            if m is None or m.closing:
                with pytest.raises(SessionNotFoundError):
                    self.sessions.restore_to_req(Req(sid, [1]))
                assert self.sessions.release_session(sid) is False
            elif m.turn is not None:
                with pytest.raises(TurnRunningError):
                    self.sessions.restore_to_req(Req(sid, [1]))

        @precondition(lambda self: self.running())
        @rule(data=st.data(), n=st.integers(1, 40))
        def grow_tokens(self, data, n):
            sid = data.draw(st.sampled_from(sorted(self.running())))
            m = self.model[sid]
            req, target = m.turn, m.folded + n
            if target > MAX_CONTEXT:
                return
            needed = self.cap.pages(target) - self.cap.pages(m.positions)
            if needed > self.free_pages():
                with pytest.raises(PoolExhaustedError):
                    self.pool.kv_pool.extend(
                        self.pool.req_to_token, req.slots.req_pool_idx, req.kv_len, target
                    )
                return  # the invariant checks that the refused extend took nothing
            grow(self.pool, req, n)
            req.output_ids.extend([9] * max(0, req.turn_folded - len(req.input_ids)))
            m.positions, m.folded = max(m.positions, target), target
            self.pool.mamba_pool.ssm[0][req.slots.mamba_pool_idx].fill_(float(next(self.ids)))

        def finish(self, sid: str, commit: bool) -> None:
            m = self.model[sid]
            req = m.turn
            mamba_idx = req.slots.mamba_pool_idx
            state_now = self.ssm(mamba_idx)
            if commit or not self.cap.track:
                self.sessions.save_from_req(req)
                m.committed, m.marker = m.folded, state_now
            else:
                self.sessions.rollback(req)
            assert req.seq is None, "the ended turn still owns slots"
            m.turn, m.last_active = None, self.clock.now
            if m.closing:
                self.forget(sid, m.closing)
                assert sid not in self.sessions.sessions
            else:
                assert self.ssm(mamba_idx) == m.marker

        @precondition(lambda self: self.running())
        @rule(data=st.data())
        def end_turn(self, data):
            self.finish(data.draw(st.sampled_from(sorted(self.running()))), commit=True)

        @precondition(lambda self: self.running())
        @rule(data=st.data())
        def interrupted_turn(self, data):
            self.finish(data.draw(st.sampled_from(sorted(self.running()))), commit=False)

        @precondition(lambda self: any(not m.closing for m in self.model.values()))
        @rule(data=st.data())
        def close(self, data):
            sid = data.draw(
                st.sampled_from(sorted(s for s, m in self.model.items() if not m.closing))
            )
            self.close_session(sid)

        def close_session(self, sid: str) -> None:
            m = self.model[sid]
            assert self.sessions.release_session(sid) is True
            assert self.sessions.release_session(sid) is False  # idempotent
            if m.turn is not None:
                m.closing = ReleaseReason.CLOSED  # deferred to the turn's end
            else:
                self.forget(sid, ReleaseReason.CLOSED)

        @rule(seconds=st.sampled_from([1.0, 4.0, 8.0, 31.0]))
        def time_passes(self, seconds):
            self.clock.now += seconds
            now = self.clock.now
            due = {
                sid
                for sid, m in self.model.items()
                if m.turn is None and now - m.last_active > m.timeout_s
            }
            assert set(self.sessions.idle_expired()) == due
            for sid in due:
                assert self.sessions.release_session(sid, ReleaseReason.IDLE_TIMEOUT)
                self.forget(sid, ReleaseReason.IDLE_TIMEOUT)

        # ----- after every step -------------------------------------------------------------------

        @invariant()
        def pools_match_the_model(self):
            if not hasattr(self, "model"):
                return  # before ``build``
            running = self.running().values()
            idle = [m for m in self.model.values() if m.turn is None]
            want = self.cap.expect(
                idle=len(idle),
                running=len(running),
                idle_pages=sum(self.cap.pages(m.committed) for m in idle),
                running_pages=sum(self.cap.pages(m.positions) for m in running),
            )
            turns = [m.turn for m in running]
            check_pools(self.pool, snapshot(self.pool, self.sessions, turns), want)
            assert_consistent(self.pool, self.sessions, turns)
            for sid, m in self.model.items():
                if m.turn is None:
                    assert self.ssm(self.sessions.sessions[sid].seq.mamba_pool_idx) == m.marker
            assert self.sessions.opened_total == self.opened
            assert +self.sessions.released_total == +self.released

        def teardown(self):
            if not hasattr(self, "model"):
                return
            for sid, m in list(self.model.items()):
                if not m.closing:
                    self.close_session(sid)
            for sid in list(self.running()):
                self.finish(sid, commit=False)
            assert not self.model
            self.pools_match_the_model()

    return SessionMachine


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
def test_session_state_machine(state):
    run_state_machine_as_test(make_machine(STATE_MODELS[state]))


def test_the_machine_catches_a_release_that_leaks_mamba_slots():
    """The seed's bug switched back on: the model's count of free mamba slots disagrees."""
    machine = make_machine(failpoints=frozenset({"leak_mamba_on_release"}))
    expect_failure(machine, "mamba allocator has")
