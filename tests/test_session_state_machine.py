"""Property-based test of the session layer, parking included, against a model of its own
(``tests/support/session_model.py``).

The machine drives a ``SessionTable`` over real pools and a real host tier the way the
scheduler does: open (with the default or a shorter idle timeout; parking the least recently
active idle session when the GPU is full, or born parked), start a turn (restore a parked
session, park others to make room, also while other turns run, swap through a full host tier),
fold tokens (input, then generated ones; each fold writes unique values into the live mamba
state and the K/V of the folded positions), end or roll back a turn, close (idle, parked, or
during a turn: deferred to the turn's end), fork (an idle, parked or running session: whole KV
pages shared, the child born parked or parking others when the GPU is full), double close,
misuse (turns on closed or busy sessions, a second open of one id, forks of closed sessions and
onto an open id), time passing (idle timeouts, parked sessions included) and
parking the sessions idle for a while; with the cache of states at turn boundaries on, states
cached when a turn's input is folded in and when a turn ends, opens with a prefix (starting
from the longest cached state that begins it, the rest pending) and evictions whenever room is
needed, interleaved with all of the above. The model alone decides what fits, what is refused,
where each session lives, which ones are parked to make room and which cached states are
evicted.

After every step: every pool (GPU and host) counts exactly what the model says, in the
allocators' own free counts and in the snapshot, with 0 leaked; the allocators' free lists are
sound; every idle session's state, read from wherever it lives, holds the values the model
remembers, bit for bit, and so does every cached state (in the model's LRU order); the
open/release counters match. After closing everything only cached states hold anything, and once
they are evicted every pool is at capacity. Sizes are drawn per example (page size 1 or 16, 0-2
track buffers, 1-4 GPU sessions, 0-4 parked, KV pools of several sizes, 0, 1 or 4 cached
states); the machine runs for both shapes of recurrent state (Mamba2, gated DeltaNet). A run
with the seed's bug switched on must fail.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
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
    InvalidRequestError,
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
    make_pools,
    read_state,
    snapshot,
)
from tests.support.session_model import ModelSession, SessionModel, Turn

DEFAULT_TIMEOUT_S = 60.0
MAX_CONTEXT = 64


def make_machine(state_model: ModelConfig = TINY_MODEL, failpoints: frozenset[str] = frozenset()):
    class SessionMachine(RuleBasedStateMachine):
        @initialize(
            page=st.sampled_from([1, 16]),
            track=st.integers(0, 2),
            max_sessions=st.integers(1, 4),
            kv_tokens=st.sampled_from([64, 96]),
            max_parked=st.sampled_from([0, 2, 4]),
            host_kv_tokens=st.sampled_from([64, 96]),
            max_cached=st.sampled_from([0, 1, 4, 4]),
        )
        def build(
            self, page, track, max_sessions, kv_tokens, max_parked, host_kv_tokens, max_cached
        ):
            self.pool, self.sessions, self.clock = make_pools(
                max_sessions=max_sessions,
                kv_tokens=kv_tokens,
                page_size=page,
                track=track,
                max_context=MAX_CONTEXT,
                idle_timeout_s=DEFAULT_TIMEOUT_S,
                max_parked=max_parked,
                host_kv_tokens=host_kv_tokens,
                failpoints=failpoints,
                model=state_model,
                max_cached_states=max_cached,
            )
            cap = Capacity(max_sessions, track, kv_tokens, page)
            host_pages = max(1, host_kv_tokens // page)
            self.m = SessionModel(cap, max_parked, host_pages, max_cached=max_cached)
            self.opened, self.released = 0, Counter()
            self.known: list[str] = []  # every id ever opened or refused
            self.ids, self.ticks, self.values = (itertools.count(1) for _ in range(3))

        def forget(self, sid: str, reason: ReleaseReason) -> None:
            del self.m.sessions[sid]
            self.released[reason.value] += 1

        # ----- rules ------------------------------------------------------------------------

        @rule(timeout_s=st.sampled_from([0.0, 5.0, 30.0]))
        def open(self, timeout_s):
            sid = f"s{next(self.ids)}"
            self.known.append(sid)
            placed = self.m.place_new()
            if placed is None:
                with pytest.raises(PoolExhaustedError, match="replica is full"):
                    self.sessions.open(sid, timeout_s)
                return
            victims, born_parked = placed
            self.sessions.open(sid, timeout_s)
            self.m.park(victims)
            self.m.sessions[sid] = ModelSession(
                timeout_s or DEFAULT_TIMEOUT_S, self.clock.now, next(self.ticks), parked=born_parked
            )
            self.opened += 1

        @rule(data=st.data(), extra=st.integers(0, 6))
        def open_with_prefix(self, data, extra):
            """Open with a prefix: a cached key, a session's tokens (or nothing), and ``extra``
            more tokens."""
            keys = {e.key for e in self.m.cache} | {m.tokens for m in self.m.sessions.values()}
            base = data.draw(st.sampled_from(sorted(keys | {()})))
            self.open_from((*base, *([5] * extra))[:MAX_CONTEXT])

        def open_from(self, prefix: tuple[int, ...]) -> None:
            sid = f"s{next(self.ids)}"
            self.known.append(sid)
            placed = self.m.place_new()
            if placed is None:
                with pytest.raises(PoolExhaustedError, match="replica is full"):
                    self.sessions.open(sid, prefix_ids=prefix)
                return
            victims, born_parked = placed
            self.sessions.open(sid, prefix_ids=prefix)
            self.m.park(victims)
            m = self.m.sessions[sid] = ModelSession(
                DEFAULT_TIMEOUT_S, self.clock.now, next(self.ticks), parked=born_parked
            )
            entry = self.m.lookup(prefix) if prefix and not born_parked else None
            page = self.m.cap.page_size
            partial = page if entry is not None and len(entry.key) % page else 0
            if entry is not None and self.m.evict_until(0, partial, keep=entry):
                whole = len(entry.key) // page
                m.pages = entry.pages[:whole] + self.m.fresh_pages(1 if partial else 0)
                m.committed, m.tokens = len(entry.key), entry.key
                m.marker, m.kv = entry.marker, dict(entry.kv)
            elif not born_parked:  # a fresh session holds no KV yet
                m.pages = []
            m.pending_ids = prefix[m.committed :]
            m.pending = len(m.pending_ids)
            assert self.sessions.get(sid).cached_tokens == m.committed
            self.opened += 1

        @precondition(lambda self: self.m.idle())
        @rule(data=st.data(), n_input=st.integers(0, 24), new=st.integers(0, 8))
        def start_turn(self, data, n_input, new):
            self.start(data.draw(st.sampled_from(self.m.idle())), n_input, new)

        def start(self, sid: str, n_input: int, new: int) -> None:
            m = self.m.sessions[sid]
            target = m.committed + m.pending + n_input + max(0, new - 1)
            if target > MAX_CONTEXT:
                return
            slot = self.sessions.get(sid)
            self.sessions.residency.touch(slot)  # what Engine.submit does
            m.order, m.last = next(self.ticks), self.clock.now
            victims = self.m.room_for_turn(sid, target)
            ok = victims is not None
            assert self.sessions.residency.room_for_turn(slot, target) == ok
            if not ok:
                return  # refused for now: the invariant checks that it took nothing
            self.m.park(victims)
            if m.parked:  # restored into fresh pages
                m.pages = self.m.fresh_pages(self.m.cap.pages(m.committed))
            m.parked = False
            m.pages += self.m.fresh_pages(self.m.cap.pages(target) - len(m.pages))
            req = Req(sid, [7] * n_input)
            self.sessions.restore_to_req(req)
            assert tuple(req.input_ids) == (*m.pending_ids, *([7] * n_input))
            self.pool.kv_pool.extend(
                self.pool.req_to_token, req.seq.req_pool_idx, req.kv_len, target
            )
            req.kv_len = target
            m.turn = Turn(req, target, produced=m.pending + n_input, seq=tuple(req.input_ids))

        @precondition(lambda self: any(not m.closing for m in self.m.sessions.values()))
        @rule(data=st.data())
        def fork(self, data):
            """Fork an open session (idle, parked or with a turn running) into a new one."""
            open_ = sorted(s for s, m in self.m.sessions.items() if not m.closing)
            parent = data.draw(st.sampled_from(open_))
            p = self.m.sessions[parent]
            child = f"s{next(self.ids)}"
            self.known.append(child)
            if p.turn is not None and not self.m.cap.track:
                with pytest.raises(TurnRunningError):
                    self.sessions.fork(parent, child)
                return
            placed = self.m.place_fork(parent)
            if placed is None:
                with pytest.raises(PoolExhaustedError, match="no room to fork"):
                    self.sessions.fork(parent, child)
                return
            victims, born_parked = placed
            self.sessions.fork(parent, child)
            self.m.park(victims)
            self.m.sessions[child] = ModelSession(
                p.timeout_s,
                self.clock.now,
                next(self.ticks),
                committed=p.committed,
                pending=p.pending,
                parked=born_parked,
                marker=p.marker,
                kv=dict(p.kv),
                pages=[] if born_parked else self.m.fork_pages(parent),
                tokens=p.tokens,
                pending_ids=p.pending_ids,
            )
            self.opened += 1

        @precondition(lambda self: self.known)
        @rule(data=st.data())
        def misuse(self, data):
            """A turn on a session that is closed, closing or busy; a close of a closed one; a
            second open of an open id."""
            sid = data.draw(st.sampled_from(self.known))
            m = self.m.sessions.get(sid)
            if m is None or m.closing:
                with pytest.raises(SessionNotFoundError):
                    self.sessions.restore_to_req(Req(sid, [1]))
                assert self.sessions.release_session(sid) is False
            elif m.turn is not None:
                with pytest.raises(TurnRunningError):
                    self.sessions.restore_to_req(Req(sid, [1]))
            if m is None or m.closing:
                with pytest.raises(SessionNotFoundError):
                    self.sessions.fork(sid, f"never-{sid}")
            if m is not None:
                with pytest.raises(InvalidRequestError):
                    self.sessions.open(sid)
                if not m.closing and (m.turn is None or self.m.cap.track):
                    with pytest.raises(InvalidRequestError):
                        self.sessions.fork(sid, sid)

        @precondition(lambda self: self.m.running())
        @rule(data=st.data(), n=st.integers(1, 12), sample=st.booleans())
        def fold(self, data, n, sample):
            """Fold ``n`` positions: the turn's input first, then tokens it generated (one more
            sampled token, not folded yet, when ``sample``)."""
            self.fold_turn(data.draw(st.sampled_from(self.m.running())), n, sample)

        def fold_turn(self, sid: str, n: int, sample: bool) -> None:
            turn = self.m.sessions[sid].turn
            req = turn.req
            n = min(n, turn.target - req.folded_len)
            if n <= 0:
                return
            generate = req.turn_folded + n + sample - turn.produced
            if generate > 0:
                req.output_ids.extend([9] * generate)
                turn.produced += generate
                turn.seq += (9,) * generate
            marker = float(next(self.values))
            mamba = self.pool.mamba_pool
            mamba.conv_all[:, req.seq.mamba_pool_idx] = marker
            mamba.ssm_all[:, req.seq.mamba_pool_idx] = marker
            kv = self.pool.kv_pool
            for pos in range(req.folded_len, req.folded_len + n):
                value = float(next(self.values))
                token = int(self.pool.req_to_token[req.seq.req_pool_idx, pos])
                kv.k_all[:, token] = value
                kv.v_all[:, token] = -value
                turn.kv[pos] = value
            req.folded_len += n
            turn.marker = marker

        @precondition(lambda self: any(self.input_folded_turns()))
        @rule(data=st.data())
        def cache_at_input_boundary(self, data):
            """A turn whose input is all folded in, none of its output: its state is cached."""
            self.cache_input_of(data.draw(st.sampled_from(self.input_folded_turns())))

        def cache_input_of(self, sid: str) -> None:
            m = self.m.sessions[sid]
            turn = m.turn
            marker = m.marker if turn.marker is None else turn.marker
            key = (*m.tokens, *turn.req.input_ids)
            self.m.keep(key, m.pages, marker, {**m.kv, **turn.kv})
            self.sessions.input_folded(turn.req)

        def input_folded_turns(self) -> list[str]:
            if not hasattr(self, "m"):
                return []
            running = [(s, self.m.sessions[s].turn.req) for s in self.m.running()]
            return [s for s, req in running if req.turn_folded == len(req.input_ids)]

        def finish(self, sid: str, commit: bool) -> None:
            m = self.m.sessions[sid]
            turn, m.turn = m.turn, None
            req = turn.req
            if commit or not self.m.cap.track:
                folded = req.folded_len - m.committed
                m.pending = turn.produced - folded
                m.committed = req.folded_len
                m.kv.update(turn.kv)
                m.marker = m.marker if turn.marker is None else turn.marker
                m.tokens, m.pending_ids = (*m.tokens, *turn.seq[:folded]), turn.seq[folded:]
                self.m.keep(m.tokens, m.pages, m.marker, m.kv)
                self.sessions.save_from_req(req)
            else:
                self.sessions.rollback(req)
            assert req.seq is None, "the ended turn still owns slots"
            m.kv = {p: v for p, v in m.kv.items() if p < m.committed}
            m.pages = m.pages[: self.m.cap.pages(m.committed)]
            m.order, m.last = next(self.ticks), self.clock.now
            if m.closing:
                self.forget(sid, m.closing)
                assert sid not in self.sessions.sessions

        @precondition(lambda self: self.m.max_cached and self.m.idle())
        @rule(
            data=st.data(),
            n_input=st.integers(1, 20),
            new=st.integers(1, 6),
            extra=st.integers(0, 3),
            close=st.booleans(),
        )
        def turn_then_open_from_it(self, data, n_input, new, extra, close):
            """A whole turn (input folded and cached, tokens generated, committed and cached),
            then (after closing the session, whose pages the cache keeps, when ``close``) a new
            session opened from a prefix that begins with what it folded in."""
            sid = data.draw(st.sampled_from(self.m.idle()))
            m = self.m.sessions[sid]
            self.start(sid, n_input, new)
            if m.turn is None:
                return  # no room for it now
            self.fold_turn(sid, m.pending + n_input, sample=True)
            self.cache_input_of(sid)
            self.fold_turn(sid, new - 1, sample=True)
            self.finish(sid, commit=True)
            if sid in self.m.sessions:
                cut = max(0, len(m.tokens) - data.draw(st.integers(0, 3)))
                if close:
                    self.close_session(sid)
                self.open_from((*m.tokens[:cut], *([5] * extra))[:MAX_CONTEXT])

        @precondition(lambda self: self.m.running())
        @rule(data=st.data(), commit=st.booleans())
        def end_turn(self, data, commit):
            self.finish(data.draw(st.sampled_from(self.m.running())), commit)

        @precondition(lambda self: any(not m.closing for m in self.m.sessions.values()))
        @rule(data=st.data())
        def close(self, data):
            open_ = sorted(s for s, m in self.m.sessions.items() if not m.closing)
            self.close_session(data.draw(st.sampled_from(open_)))

        def close_session(self, sid: str) -> None:
            m = self.m.sessions[sid]
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
            due = {s for s in self.m.idle() if now - self.m.sessions[s].last > self.timeout(s)}
            assert set(self.sessions.idle_expired()) == due
            for sid in due:
                assert self.sessions.release_session(sid, ReleaseReason.IDLE_TIMEOUT)
                self.forget(sid, ReleaseReason.IDLE_TIMEOUT)

        def timeout(self, sid: str) -> float:
            return self.m.sessions[sid].timeout_s

        @precondition(lambda self: self.m.max_parked and self.m.idle_resident())
        @rule(idle_s=st.sampled_from([0.0, 4.0, 10.0]))
        def park_idle(self, idle_s):
            batch = self.m.parked_after_idle(self.clock.now, idle_s)
            assert self.sessions.residency.park_idle(idle_s) == len(batch)
            self.m.park(batch)

        # ----- after every step -------------------------------------------------------------

        @invariant()
        def pools_match_the_model(self):
            if not hasattr(self, "m"):
                return  # before ``build``
            turns = [self.m.sessions[s].turn.req for s in self.m.running()]
            parker = self.sessions.residency.parker
            snap = snapshot(self.pool, self.sessions, turns)
            check_pools(self.pool, snap, self.m.expect(), parker and parker.host)
            assert_consistent(self.pool, self.sessions, turns)
            assert set(self.m.parked()) == set(self.sessions.parked)
            assert set(self.m.sessions) == set(self.sessions.sessions)
            for sid in self.m.idle():
                m, slot = self.m.sessions[sid], self.sessions.sessions[sid]
                assert (slot.committed_len, len(slot.pending_ids)) == (m.committed, m.pending)
                assert (slot.folded_ids, slot.pending_ids) == (m.tokens, m.pending_ids)
                state = read_state(self.sessions, sid)
                assert torch.all(state["conv"] == m.marker) and torch.all(state["ssm"] == m.marker)
                want = torch.tensor([m.kv[p] for p in range(m.committed)])
                want = want[None, :, None, None].expand_as(state["k"])
                assert torch.equal(state["k"], want), sid
                assert torch.equal(state["v"], -want), sid
            assert self.sessions.opened_total == self.opened
            assert +self.sessions.released_total == +self.released
            self.cached_states_match_the_model()

        def cached_states_match_the_model(self):
            cache = self.sessions.cache
            assert [e.key for e in self.m.cache] == list(cache.entries)
            assert cache.evictions_total == self.m.evictions
            mamba, kv = self.pool.mamba_pool, self.pool.kv_pool
            for want in self.m.cache:
                entry = cache.entries[want.key]
                assert torch.all(mamba.conv_all[:, entry.mamba_idx] == want.marker)
                assert torch.all(mamba.ssm_all[:, entry.mamba_idx] == want.marker)
                positions = torch.arange(len(want.key))
                slots = entry.pages[positions // kv.page_size] * kv.page_size
                slots += positions % kv.page_size
                values = torch.tensor([want.kv[p] for p in range(len(want.key))])
                got = kv.k_all[:, slots.to(kv.k_all.device)].to("cpu")
                assert torch.equal(got, values[None, :, None, None].expand_as(got)), want.key

        def teardown(self):
            if not hasattr(self, "m"):
                return
            for sid, m in list(self.m.sessions.items()):
                if not m.closing:
                    self.close_session(sid)
            for sid in self.m.running():
                self.finish(sid, commit=False)
            assert not self.m.sessions
            self.pools_match_the_model()
            self.sessions.cache.clear()
            self.m.evictions += len(self.m.cache)
            self.m.cache.clear()
            self.pools_match_the_model()
            assert all(s.free == s.capacity for s in snapshot(self.pool, self.sessions).pools)

    return SessionMachine


@pytest.mark.parametrize("state", sorted(STATE_MODELS))
def test_session_state_machine(state):
    run_state_machine_as_test(make_machine(STATE_MODELS[state]))


def test_the_machine_catches_a_release_that_leaks_mamba_slots():
    """The seed's bug switched back on: the model's count of free mamba slots disagrees."""
    machine = make_machine(failpoints=frozenset({"leak_mamba_on_release"}))
    expect_failure(machine, "mamba allocator has")
