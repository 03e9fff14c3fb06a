"""Property-based test of the session state machine against the pools' accounting invariant.

Random sequences of open, turn start, token growth, turn end, interrupted turn (rollback), close
(also during a turn), idle timeout, double close and allocations that do not fit. After every
step the snapshot is consistent (leaked == 0 in every pool), idle sessions hold exactly
1 + track-buffer mamba slots each, and a session's mamba state is what its last committed turn
left (or the checkpoint, after a rollback with a track buffer). After closing everything, every
pool is back at full capacity.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from replica.api import PoolExhaustedError, SessionNotFoundError, TurnRunningError
from replica.sessions.request import Req
from tests.support.pools import (
    STATE_MODELS,
    assert_all_free,
    assert_consistent,
    grow,
    make_pools,
)


def make_machine(page_size: int, track: int, model):
    class SessionMachine(RuleBasedStateMachine):
        sids = Bundle("sids")

        def __init__(self) -> None:
            super().__init__()
            self.pool, self.sessions, self.clock = make_pools(
                max_sessions=4,
                kv_tokens=160,
                page_size=page_size,
                track=track,
                max_context=96,
                model=model,
            )
            self.running: dict[str, Req] = {}
            self.marker: dict[str, float] = {}  # the mamba state each idle session must hold
            self.counter = itertools.count(1)

        def _ssm(self, mamba_idx: int) -> float:
            return float(self.pool.mamba_pool.ssm[0][mamba_idx, 0, 0, 0])

        @rule(target=sids)
        def open(self):
            sid = f"s{next(self.counter)}"
            if self.sessions.can_open():
                self.sessions.open(sid)
                self.marker[sid] = 0.0
            else:
                with pytest.raises(PoolExhaustedError):
                    self.sessions.open(sid)
            return sid

        @rule(sid=sids, n_input=st.integers(0, 40))
        def start_turn(self, sid, n_input):
            slot = self.sessions.sessions.get(sid)
            if slot is None or slot.close_reason is not None:
                with pytest.raises(SessionNotFoundError):
                    self.sessions.restore_to_req(Req(sid, [7] * n_input))
                return
            if slot.turn is not None:
                with pytest.raises(TurnRunningError):
                    self.sessions.restore_to_req(Req(sid, [7] * n_input))
                return
            req = Req(sid, [7] * n_input)
            self.sessions.restore_to_req(req)
            self.running[sid] = req

        @precondition(lambda self: self.running)
        @rule(data=st.data(), n=st.integers(1, 30))
        def grow_tokens(self, data, n):
            sid = data.draw(st.sampled_from(sorted(self.running)))
            req = self.running[sid]
            if req.folded_len + n > self.pool.max_context_len:
                return
            if not self.pool.kv_pool.can_extend(req.kv_len, req.folded_len + n):
                free_before = self.pool.kv_pool.free_tokens
                with pytest.raises(PoolExhaustedError):
                    self.pool.kv_pool.extend(
                        self.pool.req_to_token,
                        req.seq.req_pool_idx,
                        req.kv_len,
                        req.kv_len + free_before + 100,
                    )
                assert self.pool.kv_pool.free_tokens == free_before
                return
            grow(self.pool, req, n)
            req.output_ids.extend([9] * max(0, req.turn_folded - len(req.input_ids)))
            self.pool.mamba_pool.ssm[0][req.seq.mamba_pool_idx].fill_(float(next(self.counter)))

        def _finish(self, sid: str, commit: bool) -> None:
            req = self.running.pop(sid)
            mamba_idx = req.seq.mamba_pool_idx
            state_now = self._ssm(mamba_idx)
            if commit or not track:
                self.sessions.save_from_req(req)
                self.marker[sid] = state_now
            else:
                self.sessions.rollback(req)
            assert req.seq is None
            if sid in self.sessions.sessions:
                assert self._ssm(mamba_idx) == self.marker[sid]

        @precondition(lambda self: self.running)
        @rule(data=st.data())
        def end_turn(self, data):
            self._finish(data.draw(st.sampled_from(sorted(self.running))), commit=True)

        @precondition(lambda self: self.running)
        @rule(data=st.data())
        def interrupted_turn(self, data):
            self._finish(data.draw(st.sampled_from(sorted(self.running))), commit=False)

        @rule(sid=sids)
        def close(self, sid):
            was_open = (
                sid in self.sessions.sessions and self.sessions.sessions[sid].close_reason is None
            )
            assert self.sessions.release_session(sid) == was_open
            assert self.sessions.release_session(sid) is False  # double close
            if sid in self.running:  # deferred: the engine aborts the turn
                assert sid in self.sessions.sessions
                self._finish(sid, commit=False)
            assert sid not in self.sessions.sessions

        @rule(seconds=st.floats(0, 120))
        def time_passes(self, seconds):
            self.clock.now += seconds
            expired = self.sessions.idle_expired()
            assert not set(expired) & set(self.running)
            for sid in expired:
                self.sessions.release_session(sid, "idle_timeout")

        @rule(extra=st.integers(1, 3))
        def alloc_that_does_not_fit(self, extra):
            free_rows = self.pool.num_free
            with pytest.raises(PoolExhaustedError):
                self.pool.alloc_seqs(free_rows + extra)
            assert self.pool.num_free == free_rows

        @invariant()
        def accounted(self):
            assert_consistent(self.pool, self.sessions, self.running.values())
            idle = [s for s in self.sessions.sessions.values() if s.turn is None]
            active = {r.seq.req_pool_idx for r in self.running.values()}
            assert self.sessions.session_held_mamba_slots(active) == len(idle) * (1 + track)
            for slot in idle:
                assert self._ssm(slot.seq.mamba_pool_idx) == self.marker[slot.session_id]

        def teardown(self):
            for sid in list(self.sessions.sessions):
                self.sessions.release_session(sid)
            for sid in list(self.running):
                self._finish(sid, commit=False)
            assert_all_free(self.pool, self.sessions)

    return SessionMachine


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("track", [0, 1, 2])
def test_session_state_machine(page_size, track, state):
    machine = make_machine(page_size, track, STATE_MODELS[state])
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    machine.TestCase().runTest()
