"""Churn: 2,000 short sessions through one engine, up to 16 at once, with every way a session and
its turns can end (finish, stop, interrupt, cancel, close mid-turn, idle timeout). The strict
invariant runs whenever the engine goes idle and every few dozen steps; at the end every pool is
back at capacity and nothing leaked. The sessions' clock is the test's: each engine step takes
``STEP_S`` of it, so which sessions expire does not depend on how fast the machine is."""

from __future__ import annotations

import random

from replica.api import FinishReason, SamplingParams, StatusCode
from replica.config import PoolConfig
from tests.support.engine import assert_engine_at_capacity, drain, make_engine
from tests.support.pools import FakeClock

SESSIONS = 2000
CONCURRENCY = 16
LINGER = 8  # sessions left open to expire by idle timeout, at most this many at once
IDLE_TIMEOUT_S = 0.02
STEP_S = 0.01  # the clock time one engine step takes
ACTIONS = ("finish", "finish", "finish", "interrupt", "cancel", "close", "idle")


class Driver:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.engine = make_engine(
            PoolConfig(
                max_sessions=CONCURRENCY + LINGER,
                kv_tokens=2048,
                max_context=128,
                page_size=16,
                mamba_track_buffers=2,
            ),
            max_prefill_chunk=16,
            session_idle_timeout_s=IDLE_TIMEOUT_S,
            clock=self.clock,
        )
        self.opened = 0
        self.active: dict[str, dict] = {}  # session -> its plan; running or between turns
        self.lingering: set[str] = set()  # left to the idle timeout
        self.turn_of: dict[int, str] = {}  # running turn id -> session
        self.ended = {"finished": 0, "interrupted": 0, "cancelled": 0}
        self.checks = 0

    def open_one(self) -> None:
        sid = f"s{self.opened}"
        self.opened += 1
        self.engine.open_session(sid)
        self.active[sid] = {
            "turns": self.rng.choice((1, 1, 2)),
            "action": self.rng.choice(ACTIONS),
            "after": self.rng.randint(0, 3),  # tokens before a mid-turn action
            "seen": 0,
        }
        self.submit(sid)

    def submit(self, sid: str) -> None:
        plan = self.active[sid]
        plan["turns"] -= 1
        plan["seen"] = 0
        ids = [self.rng.randrange(384) for _ in range(self.rng.randint(1, 8))]
        sampling = SamplingParams(
            max_new_tokens=self.rng.randint(0, 5),
            temperature=self.rng.choice((0.0, 1.0)),
            top_p=0.9,
            seed=self.rng.randrange(2**32),
            stop_token_ids=(self.rng.randrange(384),),
        )
        self.turn_of[self.engine.submit(sid, ids, sampling).rid] = sid

    def mid_turn_actions(self) -> None:
        for sid, plan in list(self.active.items()):
            last = plan["turns"] == 0
            if not last or plan["action"] not in ("interrupt", "cancel", "close"):
                continue
            if plan["seen"] < plan["after"]:
                continue
            action = plan["action"]
            plan["action"] = "finish"  # once
            if action == "interrupt":
                self.engine.interrupt(sid)
            elif action == "cancel":
                self.engine.cancel(sid)
            else:
                self.engine.close_session(sid)
                del self.active[sid]

    def on_events(self, events) -> None:
        for event in events:
            sid = self.turn_of.get(event.turn_id)
            assert sid is not None, event
            if sid in self.active:
                self.active[sid]["seen"] += len(event.token_ids)
            if not event.finished:
                continue
            del self.turn_of[event.turn_id]
            if event.error_code is not None:
                assert event.error_code == StatusCode.CANCELLED, event
                self.ended["cancelled"] += 1
            elif event.finish_reason is FinishReason.INTERRUPTED:
                self.ended["interrupted"] += 1
            else:
                self.ended["finished"] += 1
            plan = self.active.get(sid)
            if plan is None:
                continue  # closed mid-turn
            if plan["turns"] > 0:
                self.submit(sid)
            elif plan["action"] == "idle" and len(self.lingering) < LINGER:
                del self.active[sid]
                self.lingering.add(sid)
            else:
                del self.active[sid]
                self.engine.close_session(sid)

    def run(self) -> None:
        engine = self.engine
        steps = 0
        while self.opened < SESSIONS or self.active or self.turn_of:
            # every 200 sessions let the engine run dry, so it goes idle (and checks itself)
            pause = self.opened % 200 == 0 and (self.active or self.turn_of)
            while (
                not pause
                and self.opened < SESSIONS
                and len(self.active) < CONCURRENCY
                and engine.sessions.can_open()
            ):
                self.open_one()
                pause = self.opened % 200 == 0
            self.mid_turn_actions()
            self.on_events(engine.step())
            self.clock.now += STEP_S
            steps += 1
            if steps % 25 == 0:
                engine.check_invariant()
                self.checks += 1
            for sid in engine.release_idle():
                self.lingering.discard(sid)
        self.on_events(drain(engine))
        assert not engine.has_work and not self.turn_of


def test_churn_2000_sessions():
    driver = Driver(seed=0)
    driver.run()
    engine = driver.engine
    assert driver.opened == SESSIONS
    driver.clock.now += IDLE_TIMEOUT_S * 2
    engine.release_idle()
    released = engine.sessions.released_total
    assert engine.sessions.opened_total == SESSIONS
    assert released["closed"] + released["idle_timeout"] == SESSIONS
    assert released["idle_timeout"] > 50 and released["closed"] > 1000
    assert min(driver.ended.values()) > 50, driver.ended
    assert len(engine.sessions) == 0
    assert engine.checker.violations == 0
    assert_engine_at_capacity(engine)
