"""``HeldOutputs``: the engine's outputs on their way to the gateways, with those of sessions
whose checkpoint is not stored yet held back.

A session is *waiting* from the moment its checkpoint is queued for the store until the store
has it (``stored``); its events and token rows meanwhile go to its ``TurnHolds`` (in order,
bounded by ``hold_s``; a session whose hold was given up is not held again until a checkpoint of
it is stored), unless it is *unheld* (``wait``: its next turn is refused on any other state, so
a failover that loses this one is found then). Every other session's outputs go on at once,
but for one thing: a step whose outputs hold a session back waits whole for the store's next
take, ``STEP_WAIT_S`` at most, so that the turn's end usually reaches the gateway in the same
stream item as the step's other tokens instead of one of its own; outputs dispatched meanwhile
join it, in order. ``idle`` says that nothing is held, waits or is deferred, so that outputs
sent on now keep the engine's order: set at the end of each call here, False from the start of
one that may hold (a release by ``holds`` alone leaves it False until the next call). Used on the
actor's event loop only (``idle`` and ``holds.given_up`` may be read from the engine thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from replica.checkpoints.holds import HOLD_S, TurnHolds
from replica.engine.step_outputs import StepOutputs

STEP_WAIT_S = 0.005  # the longest a step's outputs wait whole for the store's take


class HeldOutputs:
    def __init__(self, send: Callable[[list[StepOutputs]], None], hold_s: float = HOLD_S) -> None:
        """``send``: where outputs go on to (the gateways' outboxes)."""
        self.send = send
        self.holds = TurnHolds(lambda events: send([StepOutputs(events)]), hold_s)
        self.waiting: dict[str, int] = {}  # session id -> number of its checkpoint on its way
        self.unheld: set[str] = set()  # of those, the ones whose outputs go on meanwhile
        self._deferred: list[StepOutputs] = []  # outputs waiting whole for the store's take
        self._timer: asyncio.TimerHandle | None = None
        self.idle = True

    def _none_waits(self) -> bool:
        return len(self.waiting) == len(self.unheld) and not self.holds.holding()

    def _settle(self) -> None:
        self.idle = not self._deferred and self._none_waits()

    def dispatch(self, outputs: list[StepOutputs]) -> None:
        """Send ``outputs`` on, but what belongs to waiting sessions (consumes the records)."""
        self.idle = False
        try:
            if self._deferred:
                self._deferred.extend(outputs)
            elif self._none_waits():
                self.send(outputs)
            elif self._holds_back(outputs):
                self._deferred = list(outputs)
                self._timer = asyncio.get_running_loop().call_later(STEP_WAIT_S, self.flush)
            else:
                self._split(outputs)
        finally:
            self._settle()

    def wait(self, session_id: str, seq: int, hold: bool = True) -> None:
        """The session's checkpoint numbered ``seq`` is on its way; its outputs wait for it
        unless not ``hold`` (its next turn is refused if a failover loses this state)."""
        self.idle = False
        self.waiting[session_id] = seq
        if hold:
            self.unheld.discard(session_id)
        else:
            self.unheld.add(session_id)
        self._settle()

    def stored(self, seq: int) -> list[str]:
        """The store has every checkpoint numbered up to ``seq``: the sessions that waited for
        them (returned) go on, held events first, and the outputs deferred go on (idempotent)."""
        stored = [sid for sid, s in self.waiting.items() if s <= seq]
        for session_id in stored:
            del self.waiting[session_id]
            self.unheld.discard(session_id)
            self.holds.stored(session_id)
        self.flush()  # settles
        return stored

    def release_all(self) -> None:
        """No checkpoint is on its way any more (the store is gone): everything goes on."""
        self.waiting.clear()
        self.unheld.clear()
        self.flush()
        self.holds.release_all()
        self._settle()

    def flush(self) -> None:
        """The deferred outputs go on, but for the sessions still waiting (idempotent)."""
        deferred, self._deferred = self._deferred, []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if deferred:
            self._split(deferred)
        self._settle()

    def _holds_back(self, outputs: list[StepOutputs]) -> bool:
        """Whether a session of ``outputs`` waits (held, and its hold was not given up)."""
        waiting, unheld, given_up = self.waiting, self.unheld, self.holds.given_up
        return any(
            sid in waiting and sid not in unheld and sid not in given_up
            for out in outputs
            for sid in (*(e.session_id for e in out.events), *out.session_ids)
        )

    def _split(self, outputs: list[StepOutputs]) -> None:
        """Hold what belongs to held or waiting sessions, in order; send the rest on."""
        holding, waiting, unheld = self.holds.holding(), self.waiting, self.unheld
        given_up = self.holds.given_up

        def held(sid: str) -> bool:
            return sid in holding or (sid in waiting and sid not in unheld and sid not in given_up)

        for out in outputs:
            now = []
            for event in out.events:
                if held(event.session_id):
                    self.holds.hold(event)
                else:
                    now.append(event)
            out.events = now
            sids = out.session_ids
            kept = [i for i, sid in enumerate(sids) if not held(sid)]
            if len(kept) < len(sids):
                gone = set(range(len(sids))).difference(kept)
                for i in sorted(gone):
                    self.holds.hold(out.row_event(i))
                out.keep_rows(kept)
        self.send([out for out in outputs if out])
